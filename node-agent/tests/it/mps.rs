//! MPS isolation end to end: a fake kubelet allocates `tessera.dev/isolation: mps` pods
//! over the real device-plugin socket, and a stand-in `nvidia-cuda-mps-control` (a shell
//! script that records what it is asked and daemonises like the real one) plays the
//! MPS control daemon.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{Harness, bind_isolated, share};
use tessera_agent::enforce::mps::{MpsConfig, PID_FILE};
use tessera_agent::ledger::PodRef;
use tessera_agent::testing::StaticAssignments;
use tessera_contract::Isolation;
use tessera_device_plugin::testing::PluginConnection;
use tessera_testcluster::until;
use tonic::Code;

/// Writes the stand-in control program into `dir`; returns it and the file it records to.
fn stand_in(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let record = dir.join("mps-calls.log");
    let program = dir.join("nvidia-cuda-mps-control");
    let script = format!(
        r#"#!/bin/sh
rec='{record}'
echo "run args=[$*] gpu=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$rec"
if [ "$1" = "-d" ]; then
    # Like the real daemon: fork a long-lived process, write its PID file, return.
    sleep 120 </dev/null >/dev/null 2>&1 &
    echo $! > "$CUDA_MPS_PIPE_DIRECTORY/{PID_FILE}"
    exit 0
fi
while read -r cmd; do
    echo "command=$cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$rec"
    if [ "$cmd" = quit ]; then
        kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/{PID_FILE}")"
        exit 0
    fi
done
"#,
        record = record.display()
    );
    std::fs::write(&program, script).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    (program, record)
}

/// An agent on the 4-GPU PCIe shape using `mps`; returns the harness and the kubelet's
/// connection to the (restarted) `nvidia.com/gpu` plugin.
async fn harness(
    source: Arc<StaticAssignments>,
    mps: impl FnOnce(&Path) -> MpsConfig,
) -> (Harness, Arc<PluginConnection>) {
    let mut h = Harness::start("l40s-4x-pcie.yaml", source.clone()).await;
    let plugin = h
        .restart_agent_with(source, |config, dir| config.mps = mps(dir))
        .await;
    (h, plugin)
}

fn mps_pod(source: &StaticAssignments, name: &str, created: u64, gpu: &str, mib: u64, milli: u32) {
    bind_isolated(source, name, created, (gpu, mib, milli), Isolation::Mps);
}

fn pid_in(pipe: &Path) -> Option<u32> {
    std::fs::read_to_string(pipe.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

fn kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

fn lines(record: &Path, needle: &str) -> usize {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[tokio::test]
async fn one_daemon_per_gpu_started_on_demand_restarted_and_stopped_when_idle() {
    let source = Arc::new(StaticAssignments::new());
    let bin = tempfile::tempdir().unwrap();
    let (program, record) = stand_in(bin.path());
    let base = bin.path().join("mps");
    let (h, plugin) = harness(source.clone(), |_| MpsConfig {
        control: program.clone(),
        base_dir: base.clone(),
        idle: Duration::from_secs(1),
        check_every: Duration::from_millis(100),
    })
    .await;
    let (g0, g1, g2) = (h.uuid(0), h.uuid(1), h.uuid(2));
    let pipe = |g: &str| base.join(g).join("pipe");
    let log = |g: &str| base.join(g).join("log");
    assert_eq!(lines(&record, "run"), 0, "no daemon before an MPS pod");

    // First MPS pod on GPU 0: its daemon starts, with its own directories.
    mps_pod(&source, "a", 1, &g0, 8192, 250);
    let a = plugin.allocate_one(&[&format!("{g0}-0")]).await.unwrap();
    assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], g0);
    assert_eq!(
        a.envs["CUDA_MPS_PIPE_DIRECTORY"],
        pipe(&g0).display().to_string()
    );
    assert_eq!(
        a.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=8192M",
        "keyed by device ordinal: the driver ignores UUID keys"
    );
    assert_eq!(a.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(a.envs["TESSERA_GPU_MEMORY_LIMIT_MIB"], "8192");
    assert_eq!(a.mounts.len(), 2);
    assert_eq!(a.mounts[0].host_path, pipe(&g0).display().to_string());
    assert_eq!(a.mounts[0].container_path, a.mounts[0].host_path);
    assert!(!a.mounts[0].read_only);
    // The daemons' shared memory at the client's /dev/shm: with a private one the
    // client cannot reach the daemon and runs unlimited.
    assert_eq!(a.mounts[1].container_path, "/dev/shm");
    assert_eq!(
        a.mounts[1].host_path,
        base.join("shm").display().to_string()
    );
    assert!(base.join("shm").is_dir());
    let started = format!(
        "run args=[-d] gpu={g0} pipe={} log={}",
        pipe(&g0).display(),
        log(&g0).display()
    );
    assert_eq!(lines(&record, &started), 1, "{started}");
    assert!(log(&g0).is_dir());
    let first = pid_in(&pipe(&g0)).unwrap();
    assert!(alive(first));

    // A second MPS pod on the same GPU shares the daemon.
    mps_pod(&source, "b", 2, &g0, 4096, 100);
    let b = plugin.allocate_one(&[&format!("{g0}-1")]).await.unwrap();
    assert_eq!(b.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=4096M");
    assert_eq!(b.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "10");
    assert_eq!(lines(&record, "run args=[-d]"), 1);

    // Another GPU gets a daemon of its own.
    mps_pod(&source, "c", 3, &g1, 2048, 500);
    let c = plugin.allocate_one(&[&format!("{g1}-0")]).await.unwrap();
    assert_eq!(
        c.envs["CUDA_MPS_PIPE_DIRECTORY"],
        pipe(&g1).display().to_string()
    );
    assert_eq!(lines(&record, &format!("run args=[-d] gpu={g1} ")), 1);
    assert_ne!(pid_in(&pipe(&g1)), Some(first));

    // A watchdog pod gets no MPS variables and starts nothing.
    source.bind(
        PodRef::new("ml", "d"),
        4,
        &[("main", 1)],
        Some(share(&g2, 1024, 100)),
    );
    let d = plugin.allocate_one(&[&format!("{g2}-0")]).await.unwrap();
    assert!(!d.envs.contains_key("CUDA_MPS_PIPE_DIRECTORY"));
    assert!(d.mounts.is_empty());
    assert_eq!(lines(&record, "run args=[-d]"), 2);

    // A daemon that dies while its pods run is restarted.
    kill(first);
    until("GPU 0's daemon is restarted", || {
        pid_in(&pipe(&g0)).is_some_and(|p| p != first && alive(p))
    })
    .await;
    assert_eq!(lines(&record, &started), 2);

    // Both MPS pods on GPU 0 leave: after the idle period its daemon is told to quit;
    // GPU 1's daemon (pod c still there) keeps running.
    let second = pid_in(&pipe(&g0)).unwrap();
    {
        let ledger = &h.agent().node().ledger;
        let mut ledger = ledger.lock();
        ledger
            .remove_holding(&[format!("{g0}-0"), format!("{g0}-1")])
            .unwrap();
    }
    let quit = format!("command=quit pipe={}", pipe(&g0).display());
    until("GPU 0's idle daemon is told to quit", || {
        lines(&record, &quit) == 1
    })
    .await;
    until("GPU 0's daemon exits", || !alive(second)).await;
    let g1_pid = pid_in(&pipe(&g1)).unwrap();
    assert!(alive(g1_pid));
    assert_eq!(lines(&record, "command=quit"), 1);

    // A new MPS pod on GPU 0 starts a fresh daemon.
    mps_pod(&source, "e", 5, &g0, 1024, 100);
    plugin.allocate_one(&[&format!("{g0}-2")]).await.unwrap();
    assert_eq!(lines(&record, &started), 3);

    for g in [&g0, &g1] {
        if let Some(pid) = pid_in(&pipe(g)) {
            kill(pid);
        }
    }
}

#[tokio::test]
async fn missing_control_program_fails_mps_allocate_with_a_clear_message() {
    let source = Arc::new(StaticAssignments::new());
    let (h, plugin) = harness(source.clone(), |dir| MpsConfig {
        control: dir.join("no-such-dir/nvidia-cuda-mps-control"),
        base_dir: dir.join("mps"),
        ..MpsConfig::default()
    })
    .await;
    let g0 = h.uuid(0);
    mps_pod(&source, "a", 1, &g0, 8192, 250);
    let err = plugin
        .allocate_one(&[&format!("{g0}-0")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("no-such-dir/nvidia-cuda-mps-control")
            && err.message().contains("not found")
            && err.message().contains("--mps-control"),
        "{}",
        err.message()
    );
    assert!(h.agent().node().ledger.lock().allocations().is_empty());

    // Other pods are unaffected.
    source.bind(
        PodRef::new("ml", "w"),
        2,
        &[("main", 1)],
        Some(share(&h.uuid(3), 1024, 100)),
    );
    plugin
        .allocate_one(&[&format!("{}-1", h.uuid(3))])
        .await
        .unwrap();

    // An MPS container may not span GPUs: it could reach only one daemon.
    let g1 = h.uuid(1);
    let pod = PodRef::new("ml", "multi");
    source.bind(
        pod.clone(),
        3,
        &[("main", 2)],
        Some(tessera_contract::Assignment {
            containers: vec![tessera_contract::ContainerAssignment {
                container: "main".into(),
                gpus: [&g0, &g1]
                    .iter()
                    .map(|g| tessera_contract::GpuSlice {
                        uuid: (*g).clone(),
                        memory_mib: 1024,
                        compute_milli: 100,
                    })
                    .collect(),
            }],
        }),
    );
    source.set_isolation(pod, Isolation::Mps);
    let err = plugin
        .allocate_one(&[&format!("{g0}-2"), &format!("{g1}-2")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("exactly one GPU"),
        "{}",
        err.message()
    );
}
