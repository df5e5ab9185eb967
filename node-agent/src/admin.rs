//! The admin socket (`/var/run/tessera/agent.sock`, mode 0600) and the reports the
//! `status` and `topology` commands print.
//!
//! Protocol: the client writes one request line (`status`, `topology`, or, with the
//! simulated backend, `inject-xid <gpu-index> <xid>`), the agent answers with one JSON
//! [`Response`] line and closes the connection. Whatever a client sends, the work is
//! bounded: a request line longer than [`MAX_REQUEST_BYTES`] or not sent within
//! [`READ_TIMEOUT`], text that is not UTF-8, and a request the agent does not know are all
//! answered with an error line; at most [`MAX_CONNECTIONS`] are served at once; a failing
//! `accept` (file descriptors exhausted) is retried with backoff, never in a busy loop.

use std::fmt::Write as _;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::enforce::usage::PodMeter;
use crate::gpu::short_uuid;
use crate::gpu::sim::SimBackend;
use crate::node::Node;
use crate::topology::PairLink;

/// The longest request line read, newline included; a longer one is refused unread.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// How long a connection may take to send its request line, and its answer to be taken.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; another is answered that the agent is busy.
pub const MAX_CONNECTIONS: usize = 64;

/// The first and the longest pause after a failed `accept`.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Failures of the admin socket, on either side.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Socket I/O.
    #[error("admin socket {path}: {source}")]
    Io {
        /// The admin socket (`--admin-socket`).
        path: PathBuf,
        /// Why binding, connecting, writing or reading failed; a missing socket usually means
        /// the agent is not running.
        source: std::io::Error,
    },
    /// The agent answered something unreadable.
    #[error("admin socket {path}: unreadable answer: {reason}")]
    Protocol {
        /// The admin socket (`--admin-socket`).
        path: PathBuf,
        /// What the JSON parser refused; usually an agent of another version.
        reason: String,
    },
    /// The agent refused the request.
    #[error("agent: {0}")]
    Refused(String),
}

/// One pod's share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodShare {
    /// `namespace/name`, or `-` while the kubelet has not said which pod it is.
    pub pod: String,
    /// Container name, or `-`.
    pub container: String,
    /// Compute share, percent of the GPU.
    pub share_percent: u32,
    /// Memory limit, MiB.
    pub memory_limit_mib: u64,
    /// Pod UID, as the ledger recorded it (absent while unknown).
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// Measured memory of the pod's processes on this GPU, MiB; `None` when the pod's
    /// UID is unknown (its processes cannot be attributed). Measured per pod: two
    /// containers of one pod on one GPU show the same figure.
    pub memory_used_mib: Option<u64>,
    /// Measured SM utilisation of the pod's processes on this GPU, percent.
    #[serde(default)]
    pub utilization_percent: Option<u32>,
    /// The enforcement state: `ok`, `warned`, `throttled N%` (its processes run N% of
    /// the time), `killed`, or `none` (not enforced).
    pub enforcement: String,
    /// `assigned`, `whole` or `recovered`.
    pub origin: String,
}

/// One GPU in the status report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Model.
    pub model: String,
    /// Memory in use (measured); `None` when the GPU cannot tell.
    pub memory_used_mib: Option<u64>,
    /// Total memory.
    pub memory_total_mib: u64,
    /// Utilisation, percent; `None` where NVML does not support it (MIG parents).
    pub utilization_percent: Option<u32>,
    /// Whether it is handed out.
    pub healthy: bool,
    /// The fatal XID, when unhealthy.
    pub xid: Option<u64>,
    /// MIG profiles when the GPU is in MIG mode.
    pub mig: Option<Vec<String>>,
    /// Slots held (all of them when held whole).
    pub shares_used: u32,
    /// Slots advertised (0 in MIG mode).
    pub shares_total: u32,
    /// Indexes of NVLink peers.
    pub nvlink_peers: Vec<u32>,
    /// Holders.
    pub pods: Vec<PodShare>,
    /// Processes on this GPU that belong to no pod holding a share of it (host
    /// processes, unrecognised cgroups, pods without a share). Never acted on.
    #[serde(default)]
    pub unknown_processes: u32,
    /// Memory those processes hold, MiB.
    #[serde(default)]
    pub unknown_memory_mib: u64,
}

/// `tessera-agent status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Node name.
    pub node: String,
    /// GPU backend (`nvml`, `sim`).
    pub backend: String,
    /// Where assignments come from (`none`, `kube`, …).
    pub assignments: String,
    /// GPUs.
    pub gpus: Vec<GpuStatus>,
}

/// `tessera-agent topology --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyReport {
    /// GPU indexes in matrix order.
    pub gpus: Vec<u32>,
    /// Cell labels (`X` on the diagonal).
    pub matrix: Vec<Vec<String>>,
    /// The matrix as printed.
    pub text: String,
}

/// The answer to one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    /// `status`.
    Status(StatusReport),
    /// `topology`.
    Topology(TopologyReport),
    /// A command that only acknowledges.
    Done,
    /// The request was not understood or could not be carried out; the text says why.
    Error(String),
}

/// What the server needs.
pub struct AdminContext {
    /// The agent's node, whose GPUs, ledger and health the answers report.
    pub node: Arc<Node>,
    /// Node name.
    pub node_name: String,
    /// Assignment source kind.
    pub assignments: String,
    /// The simulated backend, for `inject-xid`.
    pub sim: Option<Arc<SimBackend>>,
    /// Attributes GPU processes to pods.
    pub meter: PodMeter,
}

impl AdminContext {
    /// Builds the status report, sampling every GPU now.
    pub fn status(&self) -> StatusReport {
        let node = &self.node;
        let shares = node.options().shares_per_gpu;
        // Sampled and attributed before taking the ledger lock: reading cgroup files
        // must not hold up Allocate.
        let readings: Vec<_> = node
            .devices()
            .iter()
            .map(|d| {
                let sample = node.backend().sample(&d.uuid).unwrap_or_default();
                let usage = self.meter.usage(&sample.processes);
                (sample, usage)
            })
            .collect();
        let ledger = node.ledger.lock();
        let topology = node.topology();
        let gpus = node
            .devices()
            .iter()
            .zip(readings)
            .enumerate()
            .map(|(pos, (d, (sample, mut usage)))| {
                let health = node.health(&d.uuid);
                let mig_uuids: Vec<&str> =
                    d.mig.iter().flatten().map(|m| m.uuid.as_str()).collect();
                let mut pods = Vec::new();
                let mut used = 0;
                for a in ledger.allocations() {
                    for g in a
                        .grants
                        .iter()
                        .filter(|g| g.uuid == d.uuid || mig_uuids.contains(&g.uuid.as_str()))
                    {
                        used += if a.is_whole() { shares } else { 1 };
                        let pod_uid = a.pod_uid.as_ref().map(|u| u.as_str().to_owned());
                        let measured = pod_uid
                            .as_ref()
                            .map(|uid| usage.pods.get(uid).copied().unwrap_or_default());
                        let enforcement = node
                            .metrics
                            .enforcement
                            .state(pod_uid.as_deref(), &g.uuid)
                            .label();
                        pods.push(PodShare {
                            pod: a
                                .pod
                                .as_ref()
                                .map_or_else(|| "-".to_owned(), ToString::to_string),
                            container: a.container.clone().unwrap_or_else(|| "-".to_owned()),
                            share_percent: g.compute_milli.div_ceil(10),
                            memory_limit_mib: g.memory_mib,
                            pod_uid,
                            memory_used_mib: measured.map(|m| m.memory_used_mib),
                            utilization_percent: measured.map(|m| m.sm_percent),
                            enforcement,
                            origin: serde_json::to_value(a.origin)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_owned))
                                .unwrap_or_default(),
                        });
                    }
                }
                // What is left belongs to no holder of this GPU.
                for p in &pods {
                    if let Some(uid) = &p.pod_uid {
                        usage.pods.remove(uid);
                    }
                }
                let unknown = usage.pods.values().fold(usage.unknown, |mut acc, u| {
                    acc.memory_used_mib += u.memory_used_mib;
                    acc.processes += u.processes;
                    acc
                });
                GpuStatus {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    model: d.model.clone(),
                    memory_used_mib: sample.memory_used_mib,
                    memory_total_mib: d.memory_total_mib,
                    utilization_percent: sample.utilization_percent,
                    healthy: health.healthy,
                    xid: health.xid,
                    mig: d
                        .mig
                        .as_ref()
                        .map(|m| m.iter().map(|x| x.profile.clone()).collect()),
                    shares_used: if d.mig.is_some() { 0 } else { used.min(shares) },
                    shares_total: if d.mig.is_some() { 0 } else { shares },
                    nvlink_peers: topology
                        .nvlink_peers(pos)
                        .into_iter()
                        .map(|p| topology.gpus()[p].index)
                        .collect(),
                    pods,
                    unknown_processes: unknown.processes,
                    unknown_memory_mib: unknown.memory_used_mib,
                }
            })
            .collect();
        StatusReport {
            node: self.node_name.clone(),
            backend: node.backend().kind().to_owned(),
            assignments: self.assignments.clone(),
            gpus,
        }
    }

    /// Builds the topology report.
    pub fn topology(&self) -> TopologyReport {
        let t = self.node.topology();
        let matrix = (0..t.len())
            .map(|i| {
                (0..t.len())
                    .map(|j| {
                        if i == j {
                            "X".to_owned()
                        } else {
                            PairLink::label(&t.pair(i, j))
                        }
                    })
                    .collect()
            })
            .collect();
        TopologyReport {
            gpus: t.gpus().iter().map(|g| g.index).collect(),
            matrix,
            text: t.render(),
        }
    }

    fn handle(&self, request: Request) -> Response {
        match request {
            Request::Status => Response::Status(self.status()),
            Request::Topology => Response::Topology(self.topology()),
            Request::InjectXid { gpu, xid } => {
                let Some(sim) = &self.sim else {
                    return Response::Error(
                        "inject-xid needs the simulated GPU backend (--gpu-backend sim:FILE)"
                            .into(),
                    );
                };
                match sim.uuid_of(gpu).map(str::to_owned) {
                    Some(uuid) => match sim.inject_xid(&uuid, xid) {
                        Ok(()) => Response::Done,
                        Err(e) => Response::Error(e.to_string()),
                    },
                    None => Response::Error(format!("no GPU with index {gpu}")),
                }
            }
        }
    }
}

/// A request the admin socket understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `status`.
    Status,
    /// `topology`.
    Topology,
    /// `inject-xid <gpu-index> <xid>` (simulated backend only).
    InjectXid {
        /// The GPU's index.
        gpu: u32,
        /// The XID to inject.
        xid: u64,
    },
}

/// The accepted requests, quoted in every refusal.
const REQUESTS: &str = "expected `status`, `topology` or `inject-xid <gpu-index> <xid>`";

/// At most this many characters of a refused request are quoted back.
const QUOTED: usize = 64;

/// Reads one request line (without its newline; surrounding whitespace ignored); the error
/// says what is wrong and what is accepted.
pub fn parse_request(line: &str) -> Result<Request, String> {
    let words: Vec<&str> = line.split_whitespace().take(4).collect();
    match words.as_slice() {
        ["status"] => Ok(Request::Status),
        ["topology"] => Ok(Request::Topology),
        ["inject-xid", gpu, xid] => match (gpu.parse::<u32>(), xid.parse::<u64>()) {
            (Ok(gpu), Ok(xid)) => Ok(Request::InjectXid { gpu, xid }),
            _ => Err("usage: inject-xid <gpu-index> <xid>, both unsigned integers".into()),
        },
        _ => {
            let line = line.trim();
            let mut quoted: String = line.chars().take(QUOTED).collect();
            if quoted.len() < line.len() {
                quoted.push('…');
            }
            Err(format!("unknown request {quoted:?}; {REQUESTS}"))
        }
    }
}

/// Reads one request line from `read`: at most [`MAX_REQUEST_BYTES`], within
/// [`READ_TIMEOUT`], UTF-8. Never holds more than the cap in memory, whatever is sent.
pub async fn read_request(read: impl AsyncRead + Unpin) -> Result<String, String> {
    let mut line = Vec::new();
    let cap = MAX_REQUEST_BYTES as u64;
    let mut limited = BufReader::new(read.take(cap + 1));
    match tokio::time::timeout(READ_TIMEOUT, limited.read_until(b'\n', &mut line)).await {
        Err(_) => {
            return Err(format!(
                "no request line within {} s; {REQUESTS}",
                READ_TIMEOUT.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("cannot read the request: {e}")),
        Ok(Ok(_)) => {}
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > MAX_REQUEST_BYTES {
        return Err(format!(
            "request line longer than {MAX_REQUEST_BYTES} bytes; {REQUESTS}"
        ));
    }
    String::from_utf8(line).map_err(|e| {
        format!(
            "request is not UTF-8 text (invalid byte at offset {}); {REQUESTS}",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Answers one connection: reads its request, writes the answer, closes.
async fn answer(stream: UnixStream, ctx: &AdminContext) {
    let (read, mut write) = stream.into_split();
    let response = match read_request(read).await.and_then(|l| parse_request(&l)) {
        Ok(request) => ctx.handle(request),
        Err(reason) => Response::Error(reason),
    };
    send(&mut write, &response).await;
}

async fn send(write: &mut (impl tokio::io::AsyncWrite + Unpin), response: &Response) {
    // Serialising these plain types cannot fail.
    let mut text = serde_json::to_string(response).unwrap_or_default();
    text.push('\n');
    // A client that never reads its answer does not keep the connection open.
    let _ = tokio::time::timeout(READ_TIMEOUT, write.write_all(text.as_bytes())).await;
}

/// Binds the admin socket with mode 0600 (only root, or the agent's user, may talk to it),
/// never visible at `path` with a wider mode: it is bound in a private directory (mode
/// 0700, beside `path` so that the rename stays on one filesystem), given mode 0600 there,
/// then renamed into place. No umask is changed: that would be the whole process's, and
/// other threads create files meanwhile.
pub fn bind(path: &Path) -> Result<UnixListener, AdminError> {
    let io = |source| AdminError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let name = path
        .file_name()
        .map_or_else(|| "admin.sock".into(), |n| n.to_string_lossy().into_owned());
    let private = dir.join(format!(".{name}.{}.binding", std::process::id()));
    // Left behind by an agent that died here: nothing in it is worth keeping.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(io)?;
    let staged = private.join("sock");
    let bound = UnixListener::bind(&staged)
        .and_then(|listener| {
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
            std::fs::rename(&staged, path)?;
            Ok(listener)
        })
        .map_err(io);
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// Serves requests until the task is dropped.
pub async fn serve(listener: UnixListener, ctx: Arc<AdminContext>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut pause = ACCEPT_BACKOFF.0;
    let mut last_error: Option<String> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                pause = ACCEPT_BACKOFF.0;
                last_error = None;
                stream
            }
            Err(error) => {
                // Out of file descriptors (EMFILE, ENFILE) or memory: the pending connection
                // stays queued and accept fails again at once, so wait before retrying.
                let text = error.to_string();
                if last_error.as_deref() == Some(text.as_str()) {
                    tracing::debug!(%error, "admin socket accept failed again");
                } else {
                    tracing::warn!(%error, "admin socket accept failed; retrying with backoff (repeats are logged at debug level)");
                    last_error = Some(text);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
        };
        let ctx = Arc::clone(&ctx);
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    answer(stream, &ctx).await;
                    drop(permit);
                });
            }
            Err(_) => {
                tokio::spawn(async move {
                    let (_, mut write) = stream.into_split();
                    let busy =
                        format!("busy: {MAX_CONNECTIONS} admin requests in progress; try again");
                    send(&mut write, &Response::Error(busy)).await;
                });
            }
        }
    }
}

/// Sends one request to the agent at `path`.
pub async fn request(path: &Path, line: &str) -> Result<Response, AdminError> {
    let io = |source| AdminError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(path).await.map_err(io)?;
    stream
        .write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(io)?;
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .await
        .map_err(io)?;
    let response: Response = serde_json::from_str(&answer).map_err(|e| AdminError::Protocol {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    match response {
        Response::Error(e) => Err(AdminError::Refused(e)),
        other => Ok(other),
    }
}

/// The status report as a table: one row per GPU, one indented row per pod share.
pub fn render_status(report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node {}   gpu backend {}   assignments {}",
        report.node, report.backend, report.assignments
    );
    let _ = writeln!(
        out,
        "{:<4} {:<9} {:<22} {:>17} {:>5} {:<14} {:>7}  NVLINK",
        "GPU", "UUID", "MODEL", "MEMORY MiB", "UTIL", "HEALTH", "SHARES"
    );
    for g in &report.gpus {
        let health = match (g.healthy, g.xid) {
            (true, _) => "healthy".to_owned(),
            (false, Some(x)) => format!("unhealthy:{x}"),
            (false, None) => "unhealthy".to_owned(),
        };
        let shares = match &g.mig {
            Some(_) => "mig".to_owned(),
            None => format!("{}/{}", g.shares_used, g.shares_total),
        };
        let peers = if g.nvlink_peers.is_empty() {
            "-".to_owned()
        } else {
            g.nvlink_peers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let _ = writeln!(
            out,
            "{:<4} {:<9} {:<22} {:>17} {:>4}% {:<14} {:>7}  {}",
            g.index,
            short_uuid(&g.uuid),
            truncate(&g.model, 22),
            format!(
                "{}/{}",
                g.memory_used_mib
                    .map_or_else(|| "-".to_owned(), |m| m.to_string()),
                g.memory_total_mib
            ),
            g.utilization_percent
                .map_or_else(|| "-".to_owned(), |u| u.to_string()),
            health,
            shares,
            peers
        );
        if let Some(profiles) = &g.mig {
            let _ = writeln!(out, "     mig: {}", profiles.join(", "));
        }
        for p in &g.pods {
            let used = p
                .memory_used_mib
                .map_or_else(|| "-".to_owned(), |m| m.to_string());
            let util = p
                .utilization_percent
                .map_or_else(|| "-".to_owned(), |u| format!("{u}%"));
            let _ = writeln!(
                out,
                "     {:<32} share {:>3}%  limit {:>6} MiB  used {:>6} MiB  util {:>4}  enforce {}  ({})",
                truncate(&format!("{} [{}]", p.pod, p.container), 32),
                p.share_percent,
                p.memory_limit_mib,
                used,
                util,
                p.enforcement,
                p.origin
            );
        }
        if g.unknown_processes > 0 {
            let _ = writeln!(
                out,
                "     unknown processes: {} using {} MiB (no pod holding this GPU; not acted on)",
                g.unknown_processes, g.unknown_memory_mib
            );
        }
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_are_read_and_refusals_say_what_is_accepted() {
        assert_eq!(parse_request(" status "), Ok(Request::Status));
        assert_eq!(parse_request("topology"), Ok(Request::Topology));
        assert_eq!(
            parse_request("inject-xid 2 79"),
            Ok(Request::InjectXid { gpu: 2, xid: 79 })
        );
        for bad in ["", "stat", "status now", "inject-xid -1 79", "inject-xid 1"] {
            let err = parse_request(bad).unwrap_err();
            assert!(
                err.contains("inject-xid <gpu-index> <xid>"),
                "{bad:?}: {err}"
            );
        }
        let err = parse_request(&"x".repeat(5000)).unwrap_err();
        assert!(
            err.len() < 300,
            "a refusal quotes a little of the request: {err}"
        );
    }

    fn read(bytes: Vec<u8>) -> Result<String, String> {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(read_request(std::io::Cursor::new(bytes)))
    }

    #[test]
    fn a_line_is_capped_and_must_be_utf8() {
        assert_eq!(read(b"status\n".to_vec()), Ok("status".into()));
        assert_eq!(
            read(b"status".to_vec()),
            Ok("status".into()),
            "EOF ends a line"
        );
        let mut at_cap = vec![b'x'; MAX_REQUEST_BYTES - 1];
        at_cap.push(b'\n');
        assert_eq!(read(at_cap).map(|l| l.len()), Ok(MAX_REQUEST_BYTES - 1));
        let err = read(vec![b'x'; MAX_REQUEST_BYTES + 1]).unwrap_err();
        assert!(
            err.starts_with("request line longer than 4096 bytes"),
            "{err}"
        );
        let err = read(b"sta\xfftus\n".to_vec()).unwrap_err();
        assert!(
            err.starts_with("request is not UTF-8 text (invalid byte at offset 3)"),
            "{err}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any bytes on the socket: a request, or an error that says what is accepted (or
        /// why the line was not read); never a panic.
        #[test]
        fn any_bytes_are_a_request_or_a_clear_refusal(
            bytes in prop::collection::vec(any::<u8>(), 0..600),
            words in "(status|topology|inject-xid)( [0-9]{1,25}){0,3}[ \n]?",
        ) {
            for input in [bytes.clone(), words.into_bytes()] {
                match read(input.clone()).and_then(|l| parse_request(&l)) {
                    Ok(Request::Status | Request::Topology | Request::InjectXid { .. }) => {}
                    Err(e) => prop_assert!(
                        e.contains(REQUESTS) || e.starts_with("usage: inject-xid"),
                        "{input:?}: {e}"
                    ),
                }
            }
        }
    }
}
