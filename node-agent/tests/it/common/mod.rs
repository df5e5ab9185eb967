//! Shared fixtures: an in-process agent on a simulated machine, with a fake kubelet
//! and a fake pod-resources server on real Unix sockets in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tessera_agent::agent::{Agent, AgentConfig};
use tessera_agent::assignments::AssignmentSource;
use tessera_agent::gpu::Backend;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::ledger::PodRef;
use tessera_agent::node::NodeOptions;
use tessera_agent::testing::StaticAssignments;
use tessera_contract::Isolation;
use tessera_contract::{Assignment, ContainerAssignment, GpuSlice};
use tessera_device_plugin::testing::{FakeKubelet, FakePodResources, PluginConnection};

pub(crate) const WAIT: Duration = Duration::from_secs(5);

pub(crate) fn shape(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../hack/gpus")
        .join(file)
}

pub(crate) struct Harness {
    pub dir: TempDir,
    pub kubelet: FakeKubelet,
    pub pod_resources: FakePodResources,
    pub sim: Arc<SimBackend>,
    pub agent: Option<Agent>,
}

impl Harness {
    /// A fake kubelet and pod-resources server, and an agent on `file`.
    pub(crate) async fn start(file: &str, source: Arc<dyn AssignmentSource>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["dp", "pr", "state"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let kubelet = FakeKubelet::start(&dir.path().join("dp")).await.unwrap();
        let pod_resources = FakePodResources::start(&dir.path().join("pr/kubelet.sock"))
            .await
            .unwrap();
        let sim = Arc::new(SimBackend::from_file(shape(file)).unwrap());
        let mut h = Harness {
            dir,
            kubelet,
            pod_resources,
            sim,
            agent: None,
        };
        h.start_agent(source).await;
        h
    }

    pub(crate) fn config(&self, source: Arc<dyn AssignmentSource>) -> AgentConfig {
        AgentConfig {
            node_name: "node-a".into(),
            backend: Backend::Sim(Arc::clone(&self.sim)),
            device_plugin_dir: self.dir.path().join("dp"),
            pod_resources_socket: self.dir.path().join("pr/kubelet.sock"),
            state_dir: self.dir.path().join("state"),
            admin_socket: Some(self.admin_socket()),
            options: NodeOptions::default(),
            source,
            reconcile_every: Duration::from_secs(3600),
            reconcile_grace: Duration::ZERO,
            node_pods: None,
            metrics_addr: None,
            coordinator: None,
            coordinator_token_file: None,
            coordinator_ca_file: None,
            proc_root: self.proc_root(),
            watchdog: None,
            events: Arc::new(tessera_agent::events::LogEvents),
            mps: Default::default(),
            mig: Default::default(),
        }
    }

    /// A fake `/proc` tree under the temp dir (empty until a test writes cgroups).
    pub(crate) fn proc_root(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    /// Makes `pid` look like a process of the container `container_id` of pod `uid`
    /// (cgroup v2, systemd driver, containerd).
    pub(crate) fn fake_pod_process(&self, pid: u32, uid: &str, container_id: &str) {
        let dir = self.proc_root().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container_id}.scope\n",
                uid.replace('-', "_")
            ),
        )
        .unwrap();
    }

    pub(crate) fn admin_socket(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }

    pub(crate) async fn start_agent(&mut self, source: Arc<dyn AssignmentSource>) {
        let agent = Agent::start(self.config(source)).await.unwrap();
        self.agent = Some(agent);
    }

    pub(crate) async fn stop_agent(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.stop().await.unwrap();
        }
    }

    /// Waits until the fake kubelet is connected to a plugin generation other than
    /// `old` (after an agent restart) and returns it.
    pub(crate) async fn new_gpu_plugin(
        &self,
        old: &Arc<PluginConnection>,
    ) -> Arc<PluginConnection> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(p) = self.kubelet.plugin("nvidia.com/gpu")
                && !Arc::ptr_eq(&p, old)
                && p.devices().latest().is_some_and(|d| !d.is_empty())
            {
                return p;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent did not re-register"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Restarts the agent with a configuration `tweak` changes (given the harness
    /// directory), and returns the plugin generation it registers.
    pub(crate) async fn restart_agent_with(
        &mut self,
        source: Arc<dyn AssignmentSource>,
        tweak: impl FnOnce(&mut AgentConfig, &Path),
    ) -> Arc<PluginConnection> {
        let old = self.gpu_plugin().await;
        self.stop_agent().await;
        let mut config = self.config(source);
        tweak(&mut config, self.dir.path());
        self.agent = Some(Agent::start(config).await.unwrap());
        self.new_gpu_plugin(&old).await
    }

    pub(crate) fn agent(&self) -> &Agent {
        self.agent.as_ref().unwrap()
    }

    pub(crate) async fn gpu_plugin(&self) -> Arc<PluginConnection> {
        let plugin = self
            .kubelet
            .wait_for_plugin("nvidia.com/gpu", WAIT)
            .await
            .unwrap();
        plugin
            .devices()
            .wait_until(|d| !d.is_empty(), WAIT)
            .await
            .unwrap();
        plugin
    }

    pub(crate) fn uuid(&self, index: u32) -> String {
        self.sim.uuid_of(index).unwrap().to_owned()
    }

    /// Every healthy slot id the plugin advertises right now.
    pub(crate) async fn available(&self, plugin: &PluginConnection) -> Vec<String> {
        plugin
            .devices()
            .latest()
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.health == "Healthy")
            .map(|d| d.id)
            .collect()
    }
}

/// `fraction` of GPU `uuid` (memory `memory_mib`) for container `main`.
pub(crate) fn share(uuid: &str, memory_mib: u64, compute_milli: u32) -> Assignment {
    Assignment {
        containers: vec![ContainerAssignment {
            container: "main".into(),
            gpus: vec![GpuSlice {
                uuid: uuid.into(),
                memory_mib,
                compute_milli,
            }],
        }],
    }
}

/// Binds pod `ml/name` (container `main`, one slot) to a share of `gpu` in `isolation`.
pub(crate) fn bind_isolated(
    source: &StaticAssignments,
    name: &str,
    created: u64,
    share_of: (&str, u64, u32),
    isolation: Isolation,
) {
    let pod = PodRef::new("ml", name);
    let (gpu, memory_mib, compute_milli) = share_of;
    source.bind(
        pod.clone(),
        created,
        &[("main", 1)],
        Some(share(gpu, memory_mib, compute_milli)),
    );
    source.set_isolation(pod, isolation);
}

/// The GPU uuid a slot id belongs to.
pub(crate) fn gpu_of(slot: &str) -> &str {
    slot.rsplit_once('-').unwrap().0
}

pub(crate) fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The `tessera-agent` binary.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_tessera-agent");

/// `tessera-agent run` as a child process, killed (and reaped) when dropped.
pub(crate) struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl AgentProcess {
    /// Runs the agent binary without a cluster on the GPU shape `file`, its sockets and
    /// state under `dir` (device plugins in `dir/dp`, admin socket `dir/admin.sock`), its
    /// open files limited to `nofile` when given (the shell's `ulimit`, which then `exec`s
    /// the agent, so the child is the agent itself).
    pub(crate) fn spawn(dir: &Path, file: &str, nofile: Option<u32>) -> Self {
        let mut command = match nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        Self::args(&mut command, dir, file, "none");
        command.stderr(Stdio::null());
        Self::start(command)
    }

    /// The agent binary's command line as [`AgentProcess::spawn`] runs it, reporting to
    /// `coordinator` (`host:port`, or `none`); stdout and stderr are the caller's to set.
    pub(crate) fn command(dir: &Path, file: &str, coordinator: &str) -> Command {
        let mut command = Command::new(BIN);
        Self::args(&mut command, dir, file, coordinator);
        command
    }

    /// Starts `command` (from [`AgentProcess::command`]), its stdout discarded.
    pub(crate) fn start(mut command: Command) -> Self {
        Self(command.stdout(Stdio::null()).spawn().unwrap())
    }

    fn args(command: &mut Command, dir: &Path, file: &str, coordinator: &str) {
        std::fs::create_dir_all(dir.join("dp")).unwrap();
        command
            .args(["run", "--node-name", "node-a", "--no-kube"])
            .args(["--coordinator", coordinator, "--metrics-addr", "none"])
            .arg("--gpu-backend")
            .arg(format!("sim:{}", shape(file).display()))
            .arg("--device-plugin-dir")
            .arg(dir.join("dp"))
            .arg("--pod-resources-socket")
            .arg(dir.join("pr.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--admin-socket")
            .arg(dir.join("admin.sock"));
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// `(state, utime + stime in clock ticks)` from the real `/proc/<pid>/stat`.
pub(crate) fn proc_stat(pid: u32) -> (char, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let state = fields[0].chars().next().unwrap();
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (state, ticks)
}
