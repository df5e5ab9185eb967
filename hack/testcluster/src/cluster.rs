//! One real control plane per test: `kube-peer cluster up` in a temporary directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binary::kube_peer;

/// What the control plane runs besides etcd and kube-apiserver.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// Run the real kube-scheduler (default scheduler for pods without `schedulerName`).
    pub scheduler: bool,
    /// Run kube-controller-manager with these controllers (`gpu-user` for the set a GPU user
    /// relies on: job, replicaset, deployment, garbage collector, namespace, serviceaccount,
    /// token, pod GC, disruption, root CA publisher).
    pub controllers: Option<String>,
    /// Keep the API server's audit log (see [`Cluster::audit`]).
    pub audit: bool,
    /// Extra kube-apiserver flags, e.g. `--admission-control-config-file=PATH`.
    pub apiserver_args: Vec<String>,
}

/// One completed request, from the API server's own audit log.
#[derive(Clone, Debug)]
pub struct AuditRecord {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// The authenticated user (`system:serviceaccount:NS:NAME` for ServiceAccounts).
    pub user: String,
    /// API group (`""` for core).
    pub group: String,
    /// Resource (`pods`, `leases`, ...).
    pub resource: String,
    /// Subresource (`binding`, `status`, `eviction`, ...).
    pub subresource: Option<String>,
    /// Namespace of the object, if namespaced.
    pub namespace: Option<String>,
    /// Object name, if the request named one.
    pub name: Option<String>,
    /// HTTP status of the answer.
    pub code: u16,
}

/// A running control plane. Dropping it kills it (and, through the parent-death signal, the
/// scheduler and controller-manager it started).
pub struct Cluster {
    dir: tempfile::TempDir,
    child: Child,
    _stdin: ChildStdin,
    server: String,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    server: String,
}

impl Cluster {
    /// Starts a control plane and waits until the API server is ready. Panics with the
    /// component's log if it does not come up: a test cannot run without it.
    pub fn start(options: ClusterOptions) -> Cluster {
        let peer = kube_peer().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("kube-peer-")
            .tempdir()
            .expect("temporary directory");
        let log = dir.path().join("cluster.log");
        let mut cmd = Command::new(peer);
        cmd.args(["cluster", "up", "--exit-with-stdin", "--dir"])
            .arg(dir.path());
        if options.scheduler {
            cmd.arg("--scheduler");
        }
        if options.audit {
            cmd.arg("--audit");
        }
        if let Some(c) = &options.controllers {
            cmd.arg(format!("--controllers={c}"));
        }
        for a in &options.apiserver_args {
            cmd.arg(format!("--apiserver-arg={a}"));
        }
        let (mut child, stdin) = spawn_logged(&mut cmd, &log);
        let state_path = dir.path().join("cluster.json");
        let state: State = wait_started(&mut child, &log, "kube-peer cluster up", || {
            serde_json::from_str(&std::fs::read_to_string(&state_path).ok()?).ok()
        });
        Cluster {
            dir,
            child,
            _stdin: stdin,
            server: state.server,
        }
    }

    /// The cluster directory (certificates, kubeconfigs, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The cluster-admin kubeconfig (user in `system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// A cluster-admin client.
    pub async fn admin(&self) -> kube::Client {
        client_from(&self.admin_kubeconfig()).await
    }

    /// A kubeconfig acting as ServiceAccount `namespace/name` (created if missing), so the
    /// holder has exactly the RBAC bound to that account.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let out = self
            .dir
            .path()
            .join(format!("sa-{namespace}-{name}.kubeconfig"));
        self.kube_peer(&[
            "--service-account",
            &format!("{namespace}/{name}"),
            "--out",
            &out.to_string_lossy(),
        ]);
        out
    }

    /// A client acting as ServiceAccount `namespace/name`.
    pub async fn service_account(&self, namespace: &str, name: &str) -> kube::Client {
        client_from(&self.service_account_kubeconfig(namespace, name)).await
    }

    /// A bound token for `namespace/name` with the given audiences (the API server's when empty).
    pub fn token(&self, namespace: &str, name: &str, audiences: &[&str]) -> String {
        let mut args = vec![
            "--service-account".to_owned(),
            format!("{namespace}/{name}"),
        ];
        for a in audiences {
            args.push(format!("--audience={a}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.kube_peer(&args).trim().to_owned()
    }

    fn kube_peer(&self, args: &[&str]) -> String {
        let peer = kube_peer().unwrap_or_else(|e| panic!("{e}"));
        let out = Command::new(peer)
            .args(["cluster", "credentials", "--dir"])
            .arg(self.dir.path())
            .args(args)
            .output()
            .expect("running kube-peer cluster credentials");
        assert!(
            out.status.success(),
            "kube-peer cluster credentials {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every request the API server has completed so far (needs [`ClusterOptions::audit`]).
    ///
    /// The API server rotates its log every 100 MB (lumberjack's default, which
    /// `--audit-log-maxsize=0` keeps), leaving `audit-<timestamp>.log` beside `audit.log`:
    /// those are read first, oldest first (the timestamps sort as text), so a long benchmark
    /// counts every request, not those of the last 100 MB.
    pub fn audit(&self) -> Vec<AuditRecord> {
        let mut rotated: Vec<std::path::PathBuf> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
            })
            .collect();
        rotated.sort();
        rotated.push(self.dir.path().join("audit.log"));
        rotated
            .iter()
            .flat_map(|p| audit_records(&std::fs::read_to_string(p).unwrap_or_default()))
            .collect()
    }

    /// The last lines of the control plane's logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = tail(&self.dir.path().join("cluster.log"));
        for name in ["kube-scheduler.log", "kube-controller-manager.log"] {
            let p = self.dir.path().join(name);
            if p.exists() {
                s.push_str(&format!("\n--- {name}\n{}", tail(&p)));
            }
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client from a kubeconfig file.
pub(crate) async fn client_from(path: &Path) -> kube::Client {
    let kc =
        Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", path.display()));
    kube::Client::try_from(config).expect("client")
}

/// The audit records in `text`, one JSON object per line; lines of another shape are skipped.
fn audit_records(text: &str) -> Vec<AuditRecord> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|e| {
            let obj = e.get("objectRef")?;
            let s = |v: &serde_json::Value, k: &str| {
                v.get(k).and_then(|x| x.as_str()).map(str::to_owned)
            };
            Some(AuditRecord {
                verb: s(&e, "verb")?,
                user: e
                    .get("user")
                    .and_then(|u| s(u, "username"))
                    .unwrap_or_default(),
                group: s(obj, "apiGroup").unwrap_or_default(),
                resource: s(obj, "resource").unwrap_or_default(),
                subresource: s(obj, "subresource"),
                namespace: s(obj, "namespace"),
                name: s(obj, "name"),
                code: e
                    .get("responseStatus")
                    .and_then(|r| r.get("code"))
                    .and_then(|c| c.as_u64())
                    .unwrap_or(0) as u16,
            })
        })
        .collect()
}

/// Starts `cmd` with its output in `log` and its standard input a pipe the caller holds: a
/// peer started with `--exit-with-stdin` stops when the pipe closes.
pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path) -> (Child, ChildStdin) {
    let out = File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(out.try_clone().expect("log handle"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {:?}: {e}", cmd.get_program()));
    let stdin = child.stdin.take().expect("piped stdin");
    (child, stdin)
}

/// Waits until `ready` answers for the peer process `child` (logging to `log`), for up to
/// 180 s; panics with the log's tail if the peer exits or the time runs out (a test cannot run
/// without its peer).
pub(crate) fn wait_started<T>(
    child: &mut Child,
    log: &Path,
    what: &str,
    mut ready: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(answer) = ready() {
            return answer;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited with {status}:\n{}", tail(log));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} was not ready within 180 s:\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last 60 lines of a log file.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A token for ServiceAccount `namespace/service_account` bound to pod `namespace/pod`, as
/// the kubelet projects it into that pod: the API server adds the pod's node to the token
/// (`authentication.kubernetes.io/node-name` in TokenReview's extra), which is how a
/// DaemonSet pod proves which node it runs on. The ServiceAccount and the pod must exist.
pub async fn pod_bound_token(
    client: &kube::Client,
    namespace: &str,
    service_account: &str,
    pod: &str,
    audiences: &[&str],
) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use kube::api::{Api, PostParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let uid = pods
        .get(pod)
        .await
        .unwrap_or_else(|e| panic!("pod {namespace}/{pod}: {e}"))
        .metadata
        .uid
        .expect("a stored pod has a uid");
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {
            "audiences": audiences,
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
        },
    }))
    .expect("a valid TokenRequest");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let out: TokenRequest = sas
        .create_subresource("token", service_account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| {
            panic!("token for {namespace}/{service_account} bound to pod {pod}: {e}")
        });
    out.status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer carries the token")
}
