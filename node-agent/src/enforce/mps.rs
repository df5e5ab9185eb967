//! MPS isolation: one `nvidia-cuda-mps-control -d` per GPU, each with its own pipe and
//! log directories under `<base>/<gpu-uuid>/{pipe,log}`, started when the first MPS pod
//! is allocated on that GPU, restarted by [`MpsManager::supervise`] if it dies, and told
//! to `quit` once no MPS pod has used the GPU for the idle period.
//!
//! The per-client limits themselves travel in the Allocate response (see
//! [`client_env`]): the MPS server enforces them inside the driver, so nothing in the
//! container can bypass them — but only for a client that really reaches the daemon.
//! What the driver needs for that, as NVIDIA's device plugin arranges it:
//! * the pipe directory *and* the daemon's `/dev/shm`: a client with a private
//!   `/dev/shm` cannot attach and runs without limits, silently. The daemons use the
//!   node-wide host directory `<base>/shm` as their `/dev/shm` (the chart mounts it
//!   there) and every MPS container gets it mounted at `/dev/shm`;
//! * one UID per GPU: the control daemon starts a server with the UID of the first
//!   client and queues clients of any other UID until that server exits, so all MPS pods
//!   sharing a GPU must run as the same user (`runAsUser`);
//! * the memory limit keyed by device ordinal (`0=<N>M`), not UUID: the driver does not
//!   apply UUID keys; an MPS container sees exactly its one GPU, as ordinal 0.
//!
//! Daemons started here live in the agent's container: they count against its memory
//! limit and die when it is replaced. A separate privileged control-daemon container
//! per node (NVIDIA's layout) is the remaining step; see `docs/` for the state.
//!
//! Daemons outlive the agent on purpose: restarting the agent must not cut running
//! pods off their MPS server. A restarted agent adopts the daemons it finds alive.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// The daemon's PID file inside its pipe directory (written by the control daemon).
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// Client variable naming the daemon's pipe directory.
pub const ENV_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// Daemon variable naming its log directory.
pub const ENV_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// Client variable with the device memory limit (`<uuid>=<N>M`).
pub const ENV_MEMORY_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// Client variable with the share of the GPU's threads (percent).
pub const ENV_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// How long the control program may take to daemonise, answer or quit.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// MPS settings (`--mps-control`, `--mps-dir`, `--mps-idle-secs`).
#[derive(Debug, Clone)]
pub struct MpsConfig {
    /// The control program: a path, or a name looked up on `PATH`.
    pub control: PathBuf,
    /// Where each GPU's `pipe` and `log` directories are made.
    pub base_dir: PathBuf,
    /// How long a daemon is kept without MPS pods on its GPU.
    pub idle: Duration,
    /// How often daemons are checked (alive, idle).
    pub check_every: Duration,
}

impl Default for MpsConfig {
    fn default() -> Self {
        Self {
            control: PathBuf::from("nvidia-cuda-mps-control"),
            base_dir: PathBuf::from("/var/run/tessera/mps"),
            idle: Duration::from_secs(300),
            check_every: Duration::from_secs(5),
        }
    }
}

/// Why an MPS daemon could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// The control program does not exist.
    #[error(
        "MPS control program {program:?} not found ({looked}); install the NVIDIA driver utilities \
         on the node or point --mps-control at the program"
    )]
    Missing {
        /// The `--mps-control` value, a path or a name looked up on `PATH`.
        program: String,
        /// Where it was looked for.
        looked: String,
    },
    /// A directory could not be made.
    #[error("cannot create MPS directory {path}: {source}")]
    Dir {
        /// The pipe, log or shared-memory directory that could not be created.
        path: String,
        /// Why creating it failed (no permission, read-only mount).
        source: std::io::Error,
    },
    /// The daemon did not start.
    #[error("starting the MPS control daemon for GPU {gpu} (`{program} -d`) failed: {reason}")]
    Start {
        /// UUID of the GPU the daemon was for.
        gpu: String,
        /// The control program as resolved, the one that was run.
        program: String,
        /// Spawn failure, no daemonising in time, a failing exit status (the log directory has
        /// more), or no live daemon named in the PID file in time.
        reason: String,
    },
}

/// The directories of one GPU's daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsPaths {
    /// Control pipe directory (mounted into client containers).
    pub pipe: PathBuf,
    /// Log directory.
    pub log: PathBuf,
    /// The daemons' shared memory (node-wide), mounted at clients' `/dev/shm`.
    pub shm: PathBuf,
}

/// A daemon the manager looks after.
#[derive(Debug)]
struct Daemon {
    /// Ledger allocation ids of the MPS containers on this GPU.
    clients: BTreeSet<u64>,
    /// Last moment a client was seen (or the daemon was started / adopted).
    last_used: Instant,
    /// Times it was restarted after dying.
    restarts: u32,
}

/// What [`MpsManager::daemons`] reports about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonStatus {
    /// The GPU.
    pub gpu: String,
    /// The daemon's PID when it is alive.
    pub pid: Option<u32>,
    /// MPS containers using it.
    pub clients: usize,
    /// Restarts after it died.
    pub restarts: u32,
}

/// The node's MPS control daemons.
pub struct MpsManager {
    config: MpsConfig,
    daemons: Mutex<BTreeMap<String, Daemon>>,
    /// Serialises starts and stops, so two Allocates never start two daemons on a GPU.
    lifecycle: tokio::sync::Mutex<()>,
}

impl MpsManager {
    /// A manager with `config`; nothing starts until an MPS pod is allocated.
    pub fn new(config: MpsConfig) -> Self {
        Self {
            config,
            daemons: Mutex::new(BTreeMap::new()),
            lifecycle: tokio::sync::Mutex::new(()),
        }
    }

    /// The control program, base directory, idle time and check interval in use.
    pub fn config(&self) -> &MpsConfig {
        &self.config
    }

    /// The directories of GPU `gpu`'s daemon.
    pub fn paths(&self, gpu: &str) -> MpsPaths {
        let root = self.config.base_dir.join(gpu);
        MpsPaths {
            pipe: root.join("pipe"),
            log: root.join("log"),
            shm: self.config.base_dir.join("shm"),
        }
    }

    /// The PID of GPU `gpu`'s daemon, when one is alive.
    pub fn daemon_pid(&self, gpu: &str) -> Option<u32> {
        alive_pid(&self.paths(gpu).pipe)
    }

    /// Makes sure GPU `gpu` has a running daemon (starting it on first use) and returns
    /// its directories. Fast when it already runs.
    pub async fn ensure(&self, gpu: &str) -> Result<MpsPaths, MpsError> {
        let paths = self.paths(gpu);
        if self.daemons.lock().contains_key(gpu) && alive_pid(&paths.pipe).is_some() {
            self.touch(gpu);
            return Ok(paths);
        }
        let _serial = self.lifecycle.lock().await;
        if alive_pid(&paths.pipe).is_none() {
            let pid = self.start(gpu, &paths).await?;
            tracing::info!(gpu, pid, pipe = %paths.pipe.display(), "MPS control daemon started");
        }
        self.touch(gpu);
        Ok(paths)
    }

    /// Records that ledger allocation `allocation` is an MPS client of GPU `gpu`.
    pub fn attach(&self, gpu: &str, allocation: u64) {
        let mut daemons = self.daemons.lock();
        let d = daemons.entry(gpu.to_owned()).or_insert_with(new_daemon);
        d.clients.insert(allocation);
        d.last_used = Instant::now();
    }

    /// Adopts daemons a previous agent left running (they idle out unless clients
    /// attach again).
    pub fn adopt_running(&self) {
        let Ok(entries) = std::fs::read_dir(&self.config.base_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let gpu = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = alive_pid(&self.paths(&gpu).pipe) {
                tracing::info!(gpu, pid, "adopted a running MPS control daemon");
                self.touch(&gpu);
            }
        }
    }

    fn touch(&self, gpu: &str) {
        self.daemons
            .lock()
            .entry(gpu.to_owned())
            .or_insert_with(new_daemon)
            .last_used = Instant::now();
    }

    /// The daemons looked after now.
    pub fn daemons(&self) -> Vec<DaemonStatus> {
        self.daemons
            .lock()
            .iter()
            .map(|(gpu, d)| DaemonStatus {
                gpu: gpu.clone(),
                pid: alive_pid(&self.paths(gpu).pipe),
                clients: d.clients.len(),
                restarts: d.restarts,
            })
            .collect()
    }

    /// One supervision pass: forgets clients whose allocation is no longer in
    /// `held`, restarts dead daemons that still have clients, and stops daemons idle
    /// for longer than the configured period.
    pub async fn check(&self, held: &BTreeSet<u64>) {
        let now = Instant::now();
        let mut restart = Vec::new();
        let mut stop = Vec::new();
        {
            let mut daemons = self.daemons.lock();
            for (gpu, d) in daemons.iter_mut() {
                d.clients.retain(|id| held.contains(id));
                let alive = alive_pid(&self.paths(gpu).pipe).is_some();
                if !d.clients.is_empty() {
                    d.last_used = now;
                    if !alive {
                        restart.push(gpu.clone());
                    }
                } else if now.duration_since(d.last_used) >= self.config.idle {
                    stop.push((gpu.clone(), alive));
                }
            }
        }
        for gpu in restart {
            let _serial = self.lifecycle.lock().await;
            let paths = self.paths(&gpu);
            if alive_pid(&paths.pipe).is_some() {
                continue;
            }
            match self.start(&gpu, &paths).await {
                Ok(pid) => {
                    let restarts = {
                        let mut daemons = self.daemons.lock();
                        let d = daemons.entry(gpu.clone()).or_insert_with(new_daemon);
                        d.restarts += 1;
                        d.restarts
                    };
                    tracing::warn!(gpu, pid, restarts, "MPS control daemon had died; restarted");
                }
                Err(error) => {
                    tracing::error!(gpu, %error, "MPS control daemon died and cannot be restarted")
                }
            }
        }
        for (gpu, alive) in stop {
            let _serial = self.lifecycle.lock().await;
            // An Allocate may have attached a client meanwhile.
            let still_idle = self.daemons.lock().get(&gpu).is_some_and(|d| {
                d.clients.is_empty() && now.duration_since(d.last_used) >= self.config.idle
            });
            if !still_idle {
                continue;
            }
            if alive {
                self.stop(&gpu).await;
            }
            self.daemons.lock().remove(&gpu);
        }
    }

    /// Runs [`MpsManager::check`] every `check_every` with the allocation ids `held`
    /// returns, until the task is dropped.
    pub async fn supervise(self: Arc<Self>, held: impl Fn() -> BTreeSet<u64> + Send + Sync) {
        let mut tick = tokio::time::interval(self.config.check_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.daemons.lock().is_empty() {
                continue;
            }
            self.check(&held()).await;
        }
    }

    /// Starts the daemon of `gpu` and waits until its PID file names a live process.
    async fn start(&self, gpu: &str, paths: &MpsPaths) -> Result<u32, MpsError> {
        let program = resolve(&self.config.control)?;
        for dir in [&paths.pipe, &paths.log, &paths.shm] {
            std::fs::create_dir_all(dir).map_err(|source| MpsError::Dir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        // A stale file from a dead daemon would be taken for the new one.
        let _ = std::fs::remove_file(paths.pipe.join(PID_FILE));
        let fail = |reason: String| MpsError::Start {
            gpu: gpu.to_owned(),
            program: program.display().to_string(),
            reason,
        };
        let mut child = self
            .command(&program, gpu, paths)
            .arg("-d")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| fail(e.to_string()))?;
        let status: ExitStatus = tokio::time::timeout(COMMAND_TIMEOUT, child.wait())
            .await
            .map_err(|_| fail(format!("did not daemonise within {COMMAND_TIMEOUT:?}")))?
            .map_err(|e| fail(e.to_string()))?;
        if !status.success() {
            return Err(fail(format!(
                "exited with {status}; see {}",
                paths.log.join("control.log").display()
            )));
        }
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            if let Some(pid) = alive_pid(&paths.pipe) {
                return Ok(pid);
            }
            if Instant::now() >= deadline {
                return Err(fail(format!(
                    "no live daemon named in {} after {COMMAND_TIMEOUT:?}",
                    paths.pipe.join(PID_FILE).display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `quit` to GPU `gpu`'s daemon through the control program and waits for it
    /// to go.
    async fn stop(&self, gpu: &str) {
        let paths = self.paths(gpu);
        let pid = alive_pid(&paths.pipe);
        let sent = async {
            let program = resolve(&self.config.control).map_err(|e| e.to_string())?;
            let mut child = self
                .command(&program, gpu, &paths)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin
                    .write_all(b"quit\n")
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tokio::time::timeout(COMMAND_TIMEOUT, child.wait())
                .await
                .map_err(|_| "the control program did not exit".to_owned())?
                .map_err(|e| e.to_string())
        }
        .await;
        if let Err(error) = sent {
            tracing::warn!(gpu, %error, "could not tell the MPS control daemon to quit");
            return;
        }
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while alive_pid(&paths.pipe).is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match alive_pid(&paths.pipe) {
            None => tracing::info!(gpu, pid, "idle MPS control daemon stopped"),
            Some(pid) => tracing::warn!(gpu, pid, "MPS control daemon still runs after quit"),
        }
    }

    fn command(&self, program: &Path, gpu: &str, paths: &MpsPaths) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("CUDA_VISIBLE_DEVICES", gpu)
            .env(ENV_PIPE_DIRECTORY, &paths.pipe)
            .env(ENV_LOG_DIRECTORY, &paths.log)
            .kill_on_drop(false);
        cmd
    }
}

fn new_daemon() -> Daemon {
    Daemon {
        clients: BTreeSet::new(),
        last_used: Instant::now(),
        restarts: 0,
    }
}

/// The client variables for a container limited to `memory_mib` and `compute_milli` of
/// its one GPU, whose daemon pipes are in `pipe`. The memory limit is keyed by device
/// ordinal 0 (the container's only GPU): the driver ignores UUID keys.
pub fn client_env(memory_mib: u64, compute_milli: u32, pipe: &Path) -> HashMap<String, String> {
    HashMap::from([
        (ENV_PIPE_DIRECTORY.to_owned(), pipe.display().to_string()),
        (ENV_MEMORY_LIMIT.to_owned(), format!("0={memory_mib}M")),
        (
            ENV_THREAD_PERCENTAGE.to_owned(),
            compute_milli.div_ceil(10).clamp(1, 100).to_string(),
        ),
    ])
}

/// The program to run for `control`: a path is taken as is, a bare name is looked up
/// on `PATH`.
fn resolve(control: &Path) -> Result<PathBuf, MpsError> {
    let missing = |looked: String| MpsError::Missing {
        program: control.display().to_string(),
        looked,
    };
    if control.components().count() > 1 {
        return if control.is_file() {
            Ok(control.to_path_buf())
        } else {
            Err(missing("no such file".to_owned()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(control))
        .find(|p| p.is_file())
        .ok_or_else(|| missing(format!("searched PATH={}", path.to_string_lossy())))
}

/// The PID in `pipe`'s PID file when that process is alive (a zombie is dead).
fn alive_pid(pipe: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pipe.join(PID_FILE)).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the parenthesised command name, which may contain spaces.
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    (!matches!(state, 'Z' | 'X')).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_env_has_the_three_limits() {
        let env = client_env(8192, 333, Path::new("/run/mps/GPU-a/pipe"));
        assert_eq!(env[ENV_PIPE_DIRECTORY], "/run/mps/GPU-a/pipe");
        // By ordinal: the driver does not apply limits keyed by UUID.
        assert_eq!(env[ENV_MEMORY_LIMIT], "0=8192M");
        assert_eq!(env[ENV_THREAD_PERCENTAGE], "34");
    }

    #[test]
    fn missing_program_names_it_and_the_flag() {
        let err = resolve(Path::new("/nonexistent/nvidia-cuda-mps-control"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"/nonexistent/nvidia-cuda-mps-control\" not found")
                && err.contains("--mps-control"),
            "{err}"
        );
        let err = resolve(Path::new("tessera-no-such-mps-control"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("searched PATH="), "{err}");
    }

    #[test]
    fn own_process_is_alive_and_garbage_is_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(PID_FILE),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(alive_pid(dir.path()), Some(std::process::id()));
        std::fs::write(dir.path().join(PID_FILE), "not a pid").unwrap();
        assert_eq!(alive_pid(dir.path()), None);
    }
}
