//! Which pod and container a process belongs to, read from `<proc_root>/<pid>/cgroup`.
//!
//! NVML reports host PIDs. The agent's DaemonSet runs with `hostPID: true`, so
//! `/proc/<pid>` inside the agent's container is the host's process, and reading its
//! `cgroup` file directly is right. (Without `hostPID` the PIDs would name other
//! processes or none, so every process would come out unknown, never misattributed.)
//! When the agent runs in its own cgroup namespace the paths it reads start with
//! `/../..`; only the kubelet's components inside the path matter, so that is fine.
//!
//! Accepted shapes, cgroup v1 (`N:controller:/path`) and v2 (`0::/path`):
//!
//! * systemd driver: `…/kubepods[-<qos>]-pod<uid with _ for ->.slice/<runtime>-<id>.scope`
//!   where `<runtime>` is `cri-containerd`, `crio` or `docker`;
//! * cgroupfs driver: `/kubepods[/<qos>]/pod<uid>/<id>` (optionally `crio-<id>` or
//!   `docker-<id>`), `<qos>` being `burstable` or `besteffort` (guaranteed pods sit
//!   directly under `kubepods`).
//!
//! Anything else (host processes, conmon, unknown runtimes) gives `None`: such a
//! process is reported as unknown and never acted on.

use std::path::Path;

/// The pod and container a process runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// Pod UID in its canonical dashed form (`0b7e…-…`).
    pub pod_uid: String,
    /// Container ID (64 hex digits) as the runtime names it.
    pub container_id: String,
}

/// Reads `<proc_root>/<pid>/cgroup` and finds the pod; `None` when the process is gone,
/// unreadable or not in a recognised pod cgroup.
pub fn pod_of_pid(proc_root: &Path, pid: u32) -> Option<PodCgroup> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    parse_cgroup_file(&text)
}

/// The pod of the first line of a `/proc/<pid>/cgroup` file that names one.
pub fn parse_cgroup_file(text: &str) -> Option<PodCgroup> {
    text.lines().find_map(|line| {
        // `hierarchy-id:controllers:path`; the path may itself contain `:`.
        let mut fields = line.splitn(3, ':');
        let (_, _, path) = (fields.next()?, fields.next()?, fields.next()?);
        parse_cgroup_path(path)
    })
}

/// The pod of one cgroup path, if it has the shape of a kubelet container cgroup.
pub fn parse_cgroup_path(path: &str) -> Option<PodCgroup> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // Only paths under the kubelet's hierarchy count, so a host service that happens
    // to be called `pod…` is never taken for a pod.
    let kube = parts.iter().position(|p| p.starts_with("kubepods"))?;
    let (at, pod_uid) = parts
        .iter()
        .enumerate()
        .skip(kube)
        .find_map(|(i, p)| pod_uid_of(p).map(|uid| (i, uid)))?;
    let container_id = container_id_of(parts.get(at + 1)?)?;
    Some(PodCgroup {
        pod_uid,
        container_id,
    })
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_>.slice` (systemd).
fn pod_uid_of(part: &str) -> Option<String> {
    let raw = match part.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
        None => part.strip_prefix("pod")?.to_owned(),
    };
    is_uid(&raw).then_some(raw)
}

/// `<runtime>-<id>.scope` (systemd) or `[<runtime>-]<id>` (cgroupfs).
fn container_id_of(part: &str) -> Option<String> {
    let part = part.strip_suffix(".scope").unwrap_or(part);
    let id = ["cri-containerd-", "crio-", "docker-"]
        .iter()
        .find_map(|prefix| part.strip_prefix(prefix))
        .unwrap_or(part);
    let ok = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| id.to_ascii_lowercase())
}

/// 8-4-4-4-12 hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b7e6f2a-3c4d-4e5f-8a9b-0c1d2e3f4a5b";
    const UID_: &str = "0b7e6f2a_3c4d_4e5f_8a9b_0c1d2e3f4a5b";
    const ID: &str = "4f6c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7";

    #[test]
    fn recognised_shapes() {
        let cases = [
            // cgroup v2, systemd driver, containerd / CRI-O / Docker.
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"
            ),
            format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{ID}.scope"),
            // Seen from inside the agent's own cgroup namespace.
            format!(
                "0::/../../kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
            // cgroup v1, cgroupfs driver, every QoS class.
            format!("12:memory:/kubepods/burstable/pod{UID}/{ID}"),
            format!("4:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{ID}"),
            format!("7:devices:/kubepods/pod{UID}/{ID}"),
            format!("3:pids:/kubepods/burstable/pod{UID}/crio-{ID}"),
            // cgroup v1, systemd driver.
            format!(
                "9:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
        ];
        for line in &cases {
            assert_eq!(
                parse_cgroup_file(line),
                Some(PodCgroup {
                    pod_uid: UID.into(),
                    container_id: ID.into()
                }),
                "{line}"
            );
        }
    }

    #[test]
    fn unknown_shapes_are_none() {
        let cases = [
            "0::/".to_owned(),
            "0::/user.slice/user-1000.slice/session-2.scope".to_owned(),
            "0::/system.slice/containerd.service".to_owned(),
            // A pod-looking name outside the kubelet's hierarchy.
            format!("0::/system.slice/pod{UID}/{ID}"),
            // The pod cgroup itself, no container below it.
            format!("0::/kubepods.slice/kubepods-pod{UID_}.slice"),
            // conmon, not the container.
            format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope"),
            // Malformed UID and ID.
            format!("0::/kubepods/burstable/pod1234/{ID}"),
            format!("0::/kubepods/burstable/pod{UID}/abc"),
            "garbage".to_owned(),
            String::new(),
        ];
        for line in &cases {
            assert_eq!(parse_cgroup_file(line), None, "{line}");
        }
    }

    #[test]
    fn v1_file_with_unrelated_first_lines() {
        let text = format!(
            "13:rdma:/\n12:memory:/kubepods/burstable/pod{UID}/{ID}\n0::/system.slice/containerd.service\n"
        );
        assert_eq!(
            parse_cgroup_file(&text).map(|p| p.pod_uid),
            Some(UID.into())
        );
    }

    #[test]
    fn reads_a_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        let pid_dir = dir.path().join("4242");
        std::fs::create_dir_all(&pid_dir).unwrap();
        std::fs::write(
            pid_dir.join("cgroup"),
            format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n"),
        )
        .unwrap();
        let found = pod_of_pid(dir.path(), 4242).unwrap();
        assert_eq!(found.pod_uid, UID);
        assert_eq!(found.container_id, ID);
        assert_eq!(pod_of_pid(dir.path(), 4243), None, "a vanished process");
    }
}
