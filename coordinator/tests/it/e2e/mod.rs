//! End-to-end harness on real Kubernetes (hack/k8s): a real kube-apiserver with etcd,
//! kubelet-lite nodes that admit pods through the kubelet's own device manager, whose device
//! plugin is a real in-process `tessera-agent` on a simulated GPU machine, and one or more real
//! coordinators scheduling for them.
//!
//! Every piece talks to the others over its real interface: the coordinators and agents use
//! the API server over HTTPS, the kubelet's device manager calls the agents over the
//! device-plugin and pod-resources Unix sockets, and the agents report to the coordinators over gRPC through a
//! small TCP forwarder that plays the coordinator Service (it sends new connections to the
//! leader, like a Service whose endpoints are the ready replica).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tempfile::TempDir;
use tessera_agent::agent::{Agent, AgentConfig};
use tessera_agent::coordinator_pods::CoordinatorPods;
use tessera_agent::enforce::watchdog::WatchdogConfig;
use tessera_agent::gpu::Backend;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::node::NodeOptions;
use tessera_agent::plugin::{ENV_COMPUTE_PERCENT, ENV_MEMORY_LIMIT, ENV_VISIBLE_DEVICES};
use tessera_coordinator::agents::Authenticator;
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use tessera_coordinator::crd::{GpuQuota, PodGroup, PodGroupSpec, Queue, QueueSpec};
use tessera_core::model::Assignment;
use tessera_core::usage::UsageDecay;
use tessera_testcluster::shapes::A100s;
use tessera_testcluster::{
    Cluster, ClusterOptions, ContainerRecord, GpuNode, NodeOptions as LiteOptions, PodHistory,
    PodSeen, wait_service_account,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A correctness bound for every "eventually", not a speed target: generous because CI runs
/// several of these clusters at once on two slow cores.
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

/// Namespace every test object lives in.
pub(crate) const NS: &str = "default";

pub(crate) use tessera_testcluster::pods::{
    ASSIGNMENT, CONTAINER, PodBuilder, SCHEDULER, names, node_of, pod, pod_scheduled_false,
    unschedulable_message,
};

/// Eight 80 GB A100s joined by NVLink bridges in pairs (0-1, 2-3, 4-5, 6-7) and nothing else,
/// four per NUMA node, so a two-GPU pod is NVLink-connected only when it lands on a pair.
pub(crate) fn a100_pairs() -> String {
    A100s::new(8)
        .nvlink_pairs()
        .numa_split()
        .host(128_000, 1_048_576)
        .yaml()
}

/// One 80 GB A100: fractional pods placed here must share it.
pub(crate) fn one_a100() -> String {
    A100s::new(1).yaml()
}

/// Two 80 GB A100s, no NVLink: 20 `nvidia.com/gpu` slots at the agent's default 10 per GPU.
pub(crate) fn two_a100() -> String {
    A100s::new(2).yaml()
}

/// What to start.
pub(crate) struct Setup {
    /// Nodes: name and simulated GPU shape (YAML text in the `hack/gpus` format).
    pub nodes: Vec<(String, String)>,
    /// Coordinator replicas (leader-elected).
    pub coordinators: usize,
    /// Seconds a gang may stay below `minMember` before it is evicted whole.
    pub gang_grace_seconds: u64,
    /// Also run the real kube-scheduler, the default scheduler of pods naming none.
    pub kube_scheduler: bool,
    /// Usage history in fair share and how often queues' usage is written to their status
    /// (`None`: off, as by default).
    pub usage_history: Option<(UsageDecay, Duration)>,
    /// Also run the real job controller (Jobs create their pods).
    pub job_controller: bool,
}

impl Setup {
    /// Two 8-GPU NVLink-pair nodes (`node-a`, `node-b`) and one coordinator.
    pub(crate) fn two_nodes() -> Setup {
        Setup {
            nodes: vec![
                ("node-a".into(), a100_pairs()),
                ("node-b".into(), a100_pairs()),
            ],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
            usage_history: None,
            job_controller: false,
        }
    }

    /// One 8-GPU NVLink-pair node (`node-a`) and one coordinator.
    pub(crate) fn one_node() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), a100_pairs())],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
            usage_history: None,
            job_controller: false,
        }
    }

    /// One node (`node-a`) with a single GPU and one coordinator.
    pub(crate) fn one_gpu() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), one_a100())],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
            usage_history: None,
            job_controller: false,
        }
    }

    /// One node (`node-a`) with two GPUs ([`two_a100`]) and one coordinator.
    pub(crate) fn two_gpus() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), two_a100())],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
            usage_history: None,
            job_controller: false,
        }
    }

    /// Also runs the real kube-scheduler.
    pub(crate) fn with_kube_scheduler(mut self) -> Setup {
        self.kube_scheduler = true;
        self
    }

    /// Also runs the real job controller.
    pub(crate) fn with_job_controller(mut self) -> Setup {
        self.job_controller = true;
        self
    }

    /// Sets the number of coordinator replicas.
    pub(crate) fn coordinators(mut self, n: usize) -> Setup {
        self.coordinators = n;
        self
    }
}

/// One kubelet-lite node and the agent that is its device plugin.
pub(crate) struct NodeSlot {
    /// Node name.
    pub name: String,
    /// The simulated GPUs the agent reads.
    pub sim: Arc<SimBackend>,
    node: GpuNode,
    agent: Option<Agent>,
    /// The running agent's pods, as the coordinator streams them.
    pods: Option<Arc<CoordinatorPods>>,
    /// The watchdog the agent starts with (none by default: no container really runs).
    watchdog: Option<WatchdogConfig>,
}

/// What happens to an agent's state directory while it is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateDamage {
    /// Everything in it is gone (a new node disk, a wiped hostPath).
    Wiped,
    /// Its ledger checkpoint is cut short mid-write (a power cut without fsync).
    Corrupt,
}

/// A running end-to-end cluster.
pub(crate) struct E2e {
    /// Scratch space: sockets, checkpoints.
    pub dir: TempDir,
    cluster: Option<Cluster>,
    /// A cluster-admin client for the API server.
    pub client: kube::Client,
    /// The nodes, in setup order.
    pub nodes: Vec<NodeSlot>,
    coordinators: Arc<Mutex<Vec<Option<CoordinatorHandle>>>>,
    service: SocketAddr,
    service_task: JoinHandle<()>,
    connections: Connections,
    history: PodHistory,
    gang_grace_seconds: u64,
    usage_history: Option<(UsageDecay, Duration)>,
}

/// Logs of every component go to the test's captured output (shown for failing tests);
/// `RUST_LOG` selects, `info` for Tessera's crates by default.
pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,tessera_coordinator=info,tessera_agent=info")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

impl E2e {
    /// Starts the API server, applies the CRDs and the `default` queue (as the Helm chart
    /// does), starts the coordinators, then each node with its agent.
    pub(crate) async fn start(setup: Setup) -> E2e {
        init_tracing();
        let dir = tempfile::tempdir().expect("temporary directory");
        // Pods need their namespace's ServiceAccount, which the real controller creates.
        let cluster = tokio::task::block_in_place(|| {
            Cluster::start(ClusterOptions {
                scheduler: setup.kube_scheduler,
                // The workload controllers too, for tests of pods that controllers own.
                controllers: Some(format!(
                    "serviceaccount-controller,replicaset-controller,deployment-controller,disruption-controller{}",
                    if setup.job_controller {
                        ",job-controller"
                    } else {
                        ""
                    }
                )),
                ..ClusterOptions::default()
            })
        });
        let client = cluster.admin().await;
        wait_service_account(&client, NS, "default").await;
        apply_crds(&client).await;
        let history = PodHistory::start(client.clone(), NS).await;
        let coordinators = Arc::new(Mutex::new(Vec::new()));
        let connections: Connections = Arc::default();
        let (service, service_task) =
            agent_service(Arc::clone(&coordinators), Arc::clone(&connections)).await;
        let mut e2e = E2e {
            dir,
            cluster: Some(cluster),
            client,
            nodes: Vec::new(),
            coordinators,
            service,
            service_task,
            connections,
            history,
            gang_grace_seconds: setup.gang_grace_seconds,
            usage_history: setup.usage_history,
        };
        e2e.create_queue("default", 0.0).await;
        for i in 0..setup.coordinators {
            e2e.start_coordinator(i).await;
        }
        // The first replica leads before any agent connects, so the Service has a target.
        e2e.wait_leader().await;
        let cluster = e2e.cluster.as_ref().expect("the cluster runs");
        let starts = setup
            .nodes
            .iter()
            .map(|(name, shape)| start_node(cluster, e2e.dir.path(), name, shape, service));
        e2e.nodes = futures::future::join_all(starts).await;
        e2e.wait_nodes_ready().await;
        e2e
    }

    /// Starts coordinator replica `i` (`coordinator-<i>`).
    pub(crate) async fn start_coordinator(&self, i: usize) {
        let mut config = coordinator_config(i, self.gang_grace_seconds);
        if let Some((decay, interval)) = self.usage_history {
            config.cycle.usage = decay;
            config.usage_write_interval = interval;
        }
        let handle = Coordinator::start(self.client.clone(), config)
            .await
            .unwrap_or_else(|e| panic!("coordinator-{i} starts: {e}"));
        let mut all = self.coordinators.lock();
        while all.len() <= i {
            all.push(None);
        }
        all[i] = Some(handle);
    }

    /// Waits until exactly one live replica leads and returns it.
    pub(crate) async fn wait_leader(&self) -> usize {
        self.wait_until("one coordinator to lead", || async {
            let all = self.coordinators.lock();
            let leaders: Vec<usize> = all
                .iter()
                .enumerate()
                .filter(|(_, c)| c.as_ref().is_some_and(|c| c.is_leader()))
                .map(|(i, _)| i)
                .collect();
            (leaders.len() == 1).then(|| leaders[0])
        })
        .await
    }

    /// Kills replica `i` abruptly: its tasks are aborted and its Lease is not released.
    pub(crate) fn kill_coordinator(&self, i: usize) {
        let handle = self.coordinators.lock()[i]
            .take()
            .unwrap_or_else(|| panic!("coordinator-{i} is not running"));
        let addr = handle.agent_addr();
        handle.kill();
        self.connections.lock().retain(|(target, task)| {
            if Some(*target) == addr {
                task.abort();
            }
            Some(*target) != addr
        });
    }

    /// Waits until every node's agent has registered and the node advertises its slots.
    async fn wait_nodes_ready(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for slot in &self.nodes {
            let want = (gpu_count(&slot.sim) * 10).to_string();
            self.wait_until(
                &format!("node {} to advertise {want} GPU slots", slot.name),
                || async {
                    let n = nodes.get(&slot.name).await.ok()?;
                    let q = n.status?.allocatable?.get("nvidia.com/gpu")?.0.clone();
                    (q == want).then_some(())
                },
            )
            .await;
        }
    }

    /// The control plane (kubeconfigs, credentials).
    pub(crate) fn cluster(&self) -> &Cluster {
        self.cluster
            .as_ref()
            .expect("the cluster runs until shutdown")
    }

    /// Pods in the test namespace.
    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates a pod.
    pub(crate) async fn create(&self, pod: PodBuilder) -> Pod {
        let name = pod.name().to_owned();
        self.pods()
            .create(&PostParams::default(), &pod.build())
            .await
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"))
    }

    /// Creates pods in order.
    pub(crate) async fn create_all(&self, pods: impl IntoIterator<Item = PodBuilder>) {
        for pod in pods {
            self.create(pod).await;
        }
    }

    /// Creates a top-level queue with `gpu_quota` deserved GPUs and weight 1.
    pub(crate) async fn create_queue(&self, name: &str, gpu_quota: f64) {
        self.create_queue_under(name, None, gpu_quota).await;
    }

    /// Creates a queue under `parent` (top-level for `None`) with `gpu_quota` deserved GPUs
    /// and weight 1.
    pub(crate) async fn create_queue_under(
        &self,
        name: &str,
        parent: Option<&str>,
        gpu_quota: f64,
    ) {
        let queues: Api<Queue> = Api::all(self.client.clone());
        let queue = Queue::new(
            name,
            QueueSpec {
                parent: parent.map(str::to_owned),
                gpu: Some(GpuQuota {
                    quota: gpu_quota,
                    ..GpuQuota::default()
                }),
                ..QueueSpec::default()
            },
        );
        queues
            .create(&PostParams::default(), &queue)
            .await
            .unwrap_or_else(|e| panic!("creating queue {name}: {e}"));
    }

    /// Creates a PodGroup.
    pub(crate) async fn create_pod_group(
        &self,
        name: &str,
        min_member: i32,
        max_member: Option<i32>,
        queue: Option<&str>,
    ) {
        let groups: Api<PodGroup> = Api::namespaced(self.client.clone(), NS);
        let group = PodGroup::new(
            name,
            PodGroupSpec {
                min_member,
                max_member,
                queue: queue.map(str::to_owned),
                ..PodGroupSpec::default()
            },
        );
        groups
            .create(&PostParams::default(), &group)
            .await
            .unwrap_or_else(|e| panic!("creating PodGroup {name}: {e}"));
    }

    /// Polls `probe` until it answers, failing the test with a picture of the cluster after
    /// [`DEADLINE`].
    pub(crate) async fn wait_until<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        tessera_testcluster::wait_for(what, probe, || self.describe()).await
    }

    /// Waits until every pod in `names` runs (bound, admitted by its hollow kubelet, which
    /// means its agent allocated it); fails at once if one of them failed.
    pub(crate) async fn wait_running(&self, names: &[String]) -> Vec<Pod> {
        let what = format!("pods {names:?} to run");
        self.wait_until(&what, || async {
            let mut out = Vec::new();
            for name in names {
                let pod = self.pods().get(name).await.ok()?;
                let status = pod.status.clone().unwrap_or_default();
                if status.phase.as_deref() == Some("Failed") {
                    panic!(
                        "pod {name} failed: {:?}: {:?}\n{}",
                        status.reason,
                        status.message,
                        self.describe().await
                    );
                }
                if status.phase.as_deref() != Some("Running") {
                    return None;
                }
                out.push(pod);
            }
            Some(out)
        })
        .await
    }

    /// Waits until `name` carries `PodScheduled=False, reason=Unschedulable` and returns
    /// its message.
    pub(crate) async fn wait_unschedulable(&self, name: &str) -> String {
        self.wait_until(
            &format!("pod {name} to be marked Unschedulable"),
            || async {
                let pod = self.pods().get(name).await.ok()?;
                unschedulable_message(&pod)
            },
        )
        .await
    }

    /// Pod `name` as the API server has it now; fails the test if it does not exist.
    pub(crate) async fn pod(&self, name: &str) -> Pod {
        self.pods()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading pod {name}: {e}"))
    }

    /// Events about pod `name`: (reason, message).
    pub(crate) async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        tessera_testcluster::pods::events_of(&self.client, NS, name).await
    }

    /// Every container any kubelet (any incarnation) started, with what its device
    /// plugin gave it, and the node it ran on.
    pub(crate) fn containers(&self) -> Vec<(String, ContainerRecord)> {
        self.nodes
            .iter()
            .flat_map(|slot| {
                let all = slot.node.kubelet().containers();
                all.into_iter().map(|r| (slot.name.clone(), r))
            })
            .collect()
    }

    /// The one container record of pod `name` (fails when the pod's container was started
    /// more than once or never).
    pub(crate) fn container_of(&self, name: &str) -> (String, ContainerRecord) {
        let mut found: Vec<(String, ContainerRecord)> = self
            .containers()
            .into_iter()
            .filter(|(_, r)| r.pod == name && r.container == CONTAINER)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "pod {name}'s container must have been started exactly once: {found:#?}"
        );
        found.remove(0)
    }

    /// Checks that pod `pod` runs on the node its binding names with exactly the GPUs,
    /// memory and compute of its `tessera.dev/assignment`, and returns the assignment.
    pub(crate) fn assert_got_assignment(&self, pod: &Pod) -> Assignment {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let assignment = assignment_of(pod);
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let (node, record) = self.container_of(&name);
        assert_eq!(
            node, bound,
            "pod {name} ran on another node than it was bound to"
        );
        let wanted = assignment
            .containers
            .iter()
            .find(|c| c.container == CONTAINER)
            .unwrap_or_else(|| panic!("pod {name}: assignment has no {CONTAINER}: {assignment:?}"));
        assert_record_matches(&record, &wanted.gpus);
        for slice in &wanted.gpus {
            assert!(
                self.slot(&node).sim.devices_index(&slice.uuid) != u32::MAX,
                "pod {name}: assigned GPU {} is not a GPU of {node}",
                slice.uuid
            );
        }
        assignment
    }

    /// The node slot named `name`.
    pub(crate) fn slot(&self, name: &str) -> &NodeSlot {
        self.nodes
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    fn slot_mut(&mut self, name: &str) -> &mut NodeSlot {
        self.nodes
            .iter_mut()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// No agent made the kubelet wait out its bound for a pod it did not know yet: the
    /// coordinator announces each pod on the stream before its Binding is sent, so the agent
    /// knows it before the kubelet can ask (a wait there would hold up the node's serial
    /// admissions for up to 5 s). Judged on the agents' own histogram: every wait is in a
    /// bucket below the bound, whatever its length on this machine.
    pub(crate) fn assert_no_admission_waited_out(&self) {
        for slot in &self.nodes {
            let Some(agent) = &slot.agent else { continue };
            let text = agent.node().metrics.render(agent.node());
            // Requests counted in buckets whose bound is under 5 s, and all of them.
            let mut below = 0;
            let mut total = 0;
            for line in text.lines() {
                let Some(rest) = line.strip_prefix("tessera_agent_pod_wait_seconds_bucket{le=\"")
                else {
                    continue;
                };
                let (le, count) = rest.split_once("\"} ").unwrap_or_default();
                let count: u64 = count.trim().parse().unwrap_or(0);
                match le.parse::<f64>() {
                    Ok(le) if le < 5.0 => below = below.max(count),
                    _ => total = total.max(count),
                }
            }
            assert_eq!(
                below,
                total,
                "the agent of {} waited out its bound for {} of {total} requests:\n{text}",
                slot.name,
                total - below
            );
        }
    }

    /// The agent of `node`.
    pub(crate) fn agent(&self, node: &str) -> &Agent {
        self.slot(node)
            .agent
            .as_ref()
            .unwrap_or_else(|| panic!("the agent of {node} is not running"))
    }

    /// Stops the agent of `node` (its plugin socket goes away, its checkpoint stays) and
    /// starts a new one on the same directories, as a DaemonSet pod restart does.
    pub(crate) async fn restart_agent(&mut self, node: &str) {
        self.restart_agent_with(node, None).await;
    }

    /// [`E2e::restart_agent`], the new agent reading another simulated machine (`shape`, YAML
    /// in the `hack/gpus` format): the node's GPUs change.
    pub(crate) async fn restart_agent_as(&mut self, node: &str, shape: &str) {
        self.restart_agent_with(node, Some(shape)).await;
    }

    async fn restart_agent_with(&mut self, node: &str, shape: Option<&str>) {
        self.stop_agent(node).await;
        let service = self.service;
        let slot = self.slot_mut(node);
        if let Some(shape) = shape {
            slot.sim = Arc::new(SimBackend::from_yaml(shape, node).expect("GPU shape parses"));
        }
        start_agent(slot, service).await;
    }

    /// Damages the state directory of the agent of `node`, which must be stopped.
    pub(crate) fn damage_agent_state(&self, node: &str, damage: StateDamage) {
        let slot = self.slot(node);
        assert!(slot.agent.is_none(), "the agent of {node} is running");
        let dir = slot.node.state_dir();
        match damage {
            StateDamage::Wiped => {
                std::fs::remove_dir_all(&dir).expect("removing the agent's state directory");
                std::fs::create_dir_all(&dir).expect("an empty state directory");
            }
            StateDamage::Corrupt => std::fs::write(
                dir.join(tessera_agent::ledger::CHECKPOINT_FILE),
                "{\"next_id\": 4, \"allocations\": [{\"id\": 1, \"resource\": \"nvidia.com/gp",
            )
            .expect("writing a cut-short checkpoint"),
        }
    }

    /// The pods the running agent of `node` has from the coordinator's stream.
    pub(crate) fn agent_pods(&self, node: &str) -> Arc<CoordinatorPods> {
        self.slot(node)
            .pods
            .clone()
            .unwrap_or_else(|| panic!("the agent of {node} is not running"))
    }

    /// Runs the agent of `node` with `watchdog` from its next start on.
    pub(crate) fn set_agent_watchdog(&mut self, node: &str, watchdog: Option<WatchdogConfig>) {
        self.slot_mut(node).watchdog = watchdog;
    }

    /// The `/proc` the agent of `node` attributes GPU processes through.
    pub(crate) fn agent_proc_root(&self, node: &str) -> std::path::PathBuf {
        self.slot(node).node.proc_root()
    }

    /// Stops the agent of `node`: its plugin socket and its stream to the coordinator go away,
    /// its checkpoint stays.
    pub(crate) async fn stop_agent(&mut self, node: &str) {
        let slot = self.slot_mut(node);
        slot.pods = None;
        if let Some(agent) = slot.agent.take() {
            agent
                .stop()
                .await
                .unwrap_or_else(|e| panic!("stopping the agent of {node}: {e}"));
        }
    }

    /// Starts the agent of `node` again on the same directories (checkpoint, sockets).
    pub(crate) async fn start_agent(&mut self, node: &str) {
        let service = self.service;
        let slot = self.slot_mut(node);
        assert!(slot.agent.is_none(), "the agent of {node} is running");
        start_agent(slot, service).await;
    }

    /// Restarts the kubelet of `node`: the process stops (the device manager removes its
    /// sockets) and starts again on the same directory (the agent must notice the new
    /// `kubelet.sock` and register again); it lists its pods afresh and keeps what it had
    /// admitted, from the device manager's checkpoint.
    pub(crate) async fn restart_kubelet(&mut self, node: &str) {
        let slot = self.slot_mut(node);
        tokio::task::block_in_place(|| slot.node.kubelet_mut().restart());
    }

    /// Waits until the kubelet of `node` has the agent's GPU slots again (its pod-resources
    /// API lists them as allocatable): after a kubelet restart, pods it admits before then
    /// fail with "no healthy devices present", as on a real node.
    pub(crate) async fn wait_kubelet_has_the_agents_devices(&self, node: &str) {
        use tessera_proto::podresources::v1 as pr;
        let socket = self.slot(node).node.kubelet().pod_resources_socket();
        self.wait_until("the kubelet to list the agent's GPU slots again", || {
            let socket = socket.clone();
            async move {
                let channel = tessera_device_plugin::uds::connect(socket).await.ok()?;
                let response =
                    pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
                        .await
                        .ok()?
                        .into_inner();
                response
                    .devices
                    .iter()
                    .any(|d| d.resource_name == "nvidia.com/gpu" && !d.device_ids.is_empty())
                    .then_some(())
            }
        })
        .await;
    }

    /// Everything the pod watch saw, in order.
    pub(crate) fn history(&self) -> Vec<PodSeen> {
        self.history.seen()
    }

    /// Waits until the pod watch has seen a pod change that `seen` accepts (polled often, so
    /// that the caller can act "in the middle" of what the coordinator is doing).
    pub(crate) async fn wait_seen(&self, what: &str, seen: impl Fn(&PodSeen) -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !self.history.any(&seen) {
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {DEADLINE:?} waiting for {what}\n{}",
                    self.describe().await
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Checks the binding history: no pod ever moved to another node, and no pod's
    /// assignment changed once it was bound.
    pub(crate) fn assert_bound_at_most_once(&self) {
        self.history.assert_bound_at_most_once();
    }

    /// Checks that every pod of `names` was bound with its assignment in the same write.
    pub(crate) fn assert_bound_with_assignment_in_one_write(&self, names: &[String]) {
        self.history
            .assert_bound_with_assignment_in_one_write(names);
    }

    /// A picture of the cluster for failure messages.
    pub(crate) async fn describe(&self) -> String {
        let mut out = String::new();
        let leaders: Vec<String> = self
            .coordinators
            .lock()
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                None => format!("coordinator-{i}: gone"),
                Some(c) if c.is_leader() => format!("coordinator-{i}: leader"),
                Some(_) => format!("coordinator-{i}: standby"),
            })
            .collect();
        let _ = writeln!(out, "{}", leaders.join(", "));
        out.push_str(&tessera_testcluster::pods::describe_pods(&self.client, NS).await);
        for (node, r) in self.containers() {
            let _ = writeln!(
                out,
                "  container {}/{} on {node}: {:?}",
                r.pod, r.container, r.env
            );
        }
        // What each kubelet admitted or refused, and why: the other half of an agent's story.
        for slot in &self.nodes {
            let _ = writeln!(
                out,
                "  kubelet {} (last lines):\n{}",
                slot.name,
                slot.node.kubelet().log()
            );
        }
        out
    }

    /// Stops everything: coordinators, agents, kubelets, then the API server.
    pub(crate) async fn shutdown(mut self) {
        let handles: Vec<CoordinatorHandle> =
            self.coordinators.lock().drain(..).flatten().collect();
        for handle in handles {
            handle.shutdown().await;
        }
        self.service_task.abort();
        for slot in &mut self.nodes {
            if let Some(agent) = slot.agent.take() {
                let _ = agent.stop().await;
            }
            tokio::task::block_in_place(|| slot.node.kubelet_mut().stop());
        }
        drop(self.cluster.take());
    }
}

/// The test configuration of replica `i`: short lease and cycle so failover and scheduling
/// take well under a second of idle time each.
fn coordinator_config(i: usize, gang_grace_seconds: u64) -> CoordinatorConfig {
    let defaults = CoordinatorConfig::default();
    CoordinatorConfig {
        scheduler_name: SCHEDULER.into(),
        identity: format!("coordinator-{i}"),
        lease: LeaseConfig {
            namespace: NS.into(),
            name: "tessera-coordinator".into(),
            duration: Duration::from_secs(3),
            renew_every: Duration::from_millis(500),
        },
        agent_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        authenticator: Authenticator::Disabled,
        agent_timeout: Duration::from_secs(15),
        cycle_interval: Duration::from_millis(100),
        cycle: tessera_core::cycle::CycleConfig {
            gang_grace_seconds,
            ..defaults.cycle.clone()
        },
        ..defaults
    }
}

/// Applies Tessera's CRDs and waits until they are served.
pub(crate) async fn apply_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, crd) in tessera_coordinator::crd::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    }
    // The default queue and the tests' objects are created right after: only once served.
    for (_, crd) in tessera_coordinator::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        tessera_testcluster::wait_crd_established(client, &name).await;
    }
}

/// Open connections through the agent Service: the replica each goes to, and its task.
type Connections = Arc<Mutex<Vec<(SocketAddr, tokio::task::AbortHandle)>>>;

/// The coordinator Service agents connect to: each new connection goes to the leading
/// replica (else any live one). [`E2e::kill_coordinator`] cuts the connections to the killed
/// replica, as the death of its process would.
async fn agent_service(
    coordinators: Arc<Mutex<Vec<Option<CoordinatorHandle>>>>,
    connections: Connections,
) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("binding the agent service");
    let addr = listener.local_addr().expect("service address");
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            let targets: Vec<SocketAddr> = {
                let all = coordinators.lock();
                let live: Vec<&CoordinatorHandle> = all.iter().flatten().collect();
                let mut t: Vec<SocketAddr> = live
                    .iter()
                    .filter(|c| c.is_leader())
                    .filter_map(|c| c.agent_addr())
                    .collect();
                t.extend(
                    live.iter()
                        .filter(|c| !c.is_leader())
                        .filter_map(|c| c.agent_addr()),
                );
                t
            };
            for target in targets {
                let Ok(mut outbound) = TcpStream::connect(target).await else {
                    continue;
                };
                let relay = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                let mut open = connections.lock();
                open.retain(|(_, task)| !task.is_finished());
                open.push((target, relay.abort_handle()));
                break;
            }
        }
    });
    (addr, task)
}

async fn start_node(
    cluster: &Cluster,
    root: &Path,
    name: &str,
    shape: &str,
    service: SocketAddr,
) -> NodeSlot {
    let sim = Arc::new(SimBackend::from_yaml(shape, name).expect("GPU shape parses"));
    let mut options = LiteOptions::new(name);
    options.capacity = BTreeMap::from([
        ("cpu".to_owned(), "64".to_owned()),
        ("memory".to_owned(), "512Gi".to_owned()),
    ]);
    let node = tokio::task::block_in_place(|| GpuNode::start(cluster, root, options, shape));
    let mut slot = NodeSlot {
        name: name.into(),
        sim,
        node,
        agent: None,
        pods: None,
        watchdog: None,
    };
    start_agent(&mut slot, service).await;
    slot
}

/// Starts the agent of `slot` (its checkpoint and sockets where the last one left them).
async fn start_agent(slot: &mut NodeSlot, service: SocketAddr) {
    let kubelet = slot.node.kubelet();
    // As in the chart: the node's pods come over the coordinator stream, not from the API.
    let source = Arc::new(CoordinatorPods::new());
    let config = AgentConfig {
        node_name: slot.name.clone(),
        backend: Backend::Sim(Arc::clone(&slot.sim)),
        device_plugin_dir: kubelet.device_plugin_dir(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        state_dir: slot.node.state_dir(),
        admin_socket: None,
        options: NodeOptions::default(),
        source: source.clone(),
        node_pods: Some(Arc::clone(&source)),
        reconcile_every: Duration::from_secs(1),
        reconcile_grace: Duration::from_secs(30),
        metrics_addr: None,
        coordinator: Some(format!("http://{service}")),
        coordinator_token_file: None,
        coordinator_ca_file: None,
        proc_root: slot.node.proc_root(),
        watchdog: slot.watchdog,
        events: Arc::new(tessera_agent::events::LogEvents),
        mps: Default::default(),
        mig: Default::default(),
    };
    let agent = Agent::start(config)
        .await
        .unwrap_or_else(|e| panic!("the agent of {} starts: {e}", slot.name));
    slot.agent = Some(agent);
    slot.pods = Some(source);
}

/// Number of GPUs of a simulated machine.
pub(crate) fn gpu_count(sim: &SimBackend) -> u32 {
    (0..).take_while(|&i| sim.uuid_of(i).is_some()).count() as u32
}

/// The pod's `tessera.dev/assignment`, parsed.
pub(crate) fn assignment_of(pod: &Pod) -> Assignment {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let text = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ASSIGNMENT))
        .unwrap_or_else(|| panic!("pod {name} has no {ASSIGNMENT}"));
    Assignment::from_json(text).unwrap_or_else(|e| panic!("pod {name}: bad {ASSIGNMENT}: {e}"))
}

/// Checks what the device plugin gave a container against its assignment: the same GPUs,
/// each with the assigned memory limit and compute share, and the kubelet's slots on exactly
/// those GPUs. `Allocate` lists GPUs in slot order, so both sides are compared as sets.
pub(crate) fn assert_record_matches(
    record: &ContainerRecord,
    wanted: &[tessera_core::model::GpuSlice],
) {
    let list = |key: &str| -> Vec<String> {
        record
            .env
            .get(key)
            .unwrap_or_else(|| {
                panic!(
                    "{}/{}: no {key} in {:?}",
                    record.pod, record.container, record.env
                )
            })
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    let (uuids, memory, compute) = (
        list(ENV_VISIBLE_DEVICES),
        list(ENV_MEMORY_LIMIT),
        list(ENV_COMPUTE_PERCENT),
    );
    let mut got: Vec<(String, String, String)> = uuids
        .into_iter()
        .zip(memory)
        .zip(compute)
        .map(|((u, m), c)| (u, m, c))
        .collect();
    got.sort();
    let mut want: Vec<(String, String, String)> = wanted
        .iter()
        .map(|s| {
            (
                s.uuid.clone(),
                s.memory_mib.to_string(),
                s.compute_milli.div_ceil(10).to_string(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(
        got, want,
        "{}/{} got (GPU, MiB, %) {got:?} but was assigned {want:?}",
        record.pod, record.container
    );
    let device_ids = record.devices_of("nvidia.com/gpu");
    let slot_gpus: BTreeSet<&str> = device_ids
        .iter()
        .map(|id| id.rsplit_once('-').map_or(id.as_str(), |(gpu, _)| gpu))
        .collect();
    let assigned: BTreeSet<&str> = wanted.iter().map(|s| s.uuid.as_str()).collect();
    assert_eq!(
        (device_ids.len(), &slot_gpus),
        (wanted.len(), &assigned),
        "{}/{}: the kubelet's slots {:?} are not one per assigned GPU",
        record.pod,
        record.container,
        device_ids
    );
}
