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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::json;
use tempfile::TempDir;
use tessera_agent::agent::{Agent, AgentConfig};
use tessera_agent::coordinator_pods::CoordinatorPods;
use tessera_agent::gpu::Backend;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::node::NodeOptions;
use tessera_agent::plugin::{ENV_COMPUTE_PERCENT, ENV_MEMORY_LIMIT, ENV_VISIBLE_DEVICES};
use tessera_coordinator::agents::Authenticator;
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use tessera_coordinator::crd::{GpuQuota, PodGroup, PodGroupSpec, Queue, QueueSpec};
use tessera_core::model::Assignment;
use tessera_testcluster::{
    Cluster, ClusterOptions, ContainerRecord, LiteNode, NodeOptions as LiteOptions,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A correctness bound for every "eventually", not a speed target: generous because CI runs
/// several of these clusters at once on two slow cores.
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);
/// How often conditions are polled.
const POLL: Duration = Duration::from_millis(50);

/// Namespace every test object lives in.
pub(crate) const NS: &str = "default";
/// The scheduler name pods ask for.
pub(crate) const SCHEDULER: &str = "tessera";
/// The GPU container of every test pod.
pub(crate) const CONTAINER: &str = "main";

/// Annotation names of the user contract (SPEC.md), spelled out here on purpose: the tests
/// check the contract, not the constants of the code under test.
pub(crate) const FRACTION: &str = "tessera.dev/gpu-fraction";
/// The PodGroup a pod belongs to.
pub(crate) const POD_GROUP: &str = "tessera.dev/pod-group";
/// The leaf queue label.
pub(crate) const QUEUE_LABEL: &str = "tessera.dev/queue";
/// Written by the coordinator: the exact GPUs per container.
pub(crate) const ASSIGNMENT: &str = "tessera.dev/assignment";

/// Eight 80 GB A100s joined by NVLink bridges in pairs (0-1, 2-3, 4-5, 6-7) and nothing else,
/// so a two-GPU pod is NVLink-connected only when it lands on a pair. No `name`: the node
/// name becomes the shape name, which gives each node its own GPU UUIDs.
pub(crate) const A100_PAIRS: &str = r#"
cpu_milli: 128000
memory_mib: 1048576
nvlinks:
  - {a: 0, b: 1, links: 12}
  - {a: 2, b: 3, links: 12}
  - {a: 4, b: 5, links: 12}
  - {a: 6, b: 7, links: 12}
gpus:
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:07:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:0f:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:47:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:4e:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 1, pci_bus_id: "0000:87:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 1, pci_bus_id: "0000:90:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 1, pci_bus_id: "0000:b7:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 1, pci_bus_id: "0000:bd:00.0"}
"#;

/// One 80 GB A100: fractional pods placed here must share it.
pub(crate) const ONE_A100: &str = r#"
cpu_milli: 32000
memory_mib: 262144
gpus:
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:07:00.0"}
"#;

/// Two 80 GB A100s, no NVLink: 20 `nvidia.com/gpu` slots at the agent's default 10 per GPU.
pub(crate) const TWO_A100: &str = r#"
cpu_milli: 64000
memory_mib: 524288
gpus:
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:07:00.0"}
  - {model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: "0000:0f:00.0"}
"#;

/// What to start.
pub(crate) struct Setup {
    /// Nodes: name and simulated GPU shape (YAML text in the `hack/gpus` format).
    pub nodes: Vec<(String, &'static str)>,
    /// Coordinator replicas (leader-elected).
    pub coordinators: usize,
    /// Seconds a gang may stay below `minMember` before it is evicted whole.
    pub gang_grace_seconds: u64,
    /// Also run the real kube-scheduler, the default scheduler of pods naming none.
    pub kube_scheduler: bool,
}

impl Setup {
    /// Two 8-GPU NVLink-pair nodes (`node-a`, `node-b`) and one coordinator.
    pub(crate) fn two_nodes() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), A100_PAIRS), ("node-b".into(), A100_PAIRS)],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
        }
    }

    /// One 8-GPU NVLink-pair node (`node-a`) and one coordinator.
    pub(crate) fn one_node() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), A100_PAIRS)],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
        }
    }

    /// One node (`node-a`) with a single GPU and one coordinator.
    pub(crate) fn one_gpu() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), ONE_A100)],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
        }
    }

    /// One node (`node-a`) with two GPUs ([`TWO_A100`]) and one coordinator.
    pub(crate) fn two_gpus() -> Setup {
        Setup {
            nodes: vec![("node-a".into(), TWO_A100)],
            coordinators: 1,
            gang_grace_seconds: 300,
            kube_scheduler: false,
        }
    }

    /// Also runs the real kube-scheduler.
    pub(crate) fn with_kube_scheduler(mut self) -> Setup {
        self.kube_scheduler = true;
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
    dir: PathBuf,
    kubelet: Option<LiteNode>,
    agent: Option<Agent>,
}

/// A pod as a watch saw it at one moment, in resourceVersion order.
#[derive(Clone, Debug)]
pub(crate) struct PodSeen {
    /// Pod name.
    pub name: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `tessera.dev/assignment`.
    pub assignment: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// This was the deletion.
    pub deleted: bool,
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
    history: Arc<Mutex<Vec<PodSeen>>>,
    history_task: JoinHandle<()>,
    gang_grace_seconds: u64,
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
                controllers: Some(
                    "serviceaccount-controller,replicaset-controller,deployment-controller,disruption-controller"
                        .into(),
                ),
                ..ClusterOptions::default()
            })
        });
        let client = cluster.admin().await;
        wait_default_service_account(&client).await;
        apply_crds(&client).await;
        let (history, history_task) = record_pods(client.clone()).await;
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
            history_task,
            gang_grace_seconds: setup.gang_grace_seconds,
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
        let config = coordinator_config(i, self.gang_grace_seconds);
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

    /// Pods in the test namespace.
    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates a pod.
    pub(crate) async fn create(&self, pod: PodBuilder) -> Pod {
        let name = pod.name.clone();
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
        let queues: Api<Queue> = Api::all(self.client.clone());
        let queue = Queue::new(
            name,
            QueueSpec {
                gpu: Some(GpuQuota {
                    quota: gpu_quota,
                    over_quota_weight: 1.0,
                    limit: -1.0,
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

    /// The pod now.
    pub(crate) async fn pod(&self, name: &str) -> Pod {
        self.pods()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading pod {name}: {e}"))
    }

    /// Events about pod `name`: (reason, message).
    pub(crate) async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        let list = events
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing events: {e}"));
        list.items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Every container any kubelet (any incarnation) started, with what its device
    /// plugin gave it, and the node it ran on.
    pub(crate) fn containers(&self) -> Vec<(String, ContainerRecord)> {
        self.nodes
            .iter()
            .flat_map(|slot| {
                let all = slot.kubelet.as_ref().map(LiteNode::containers);
                all.into_iter().flatten().map(|r| (slot.name.clone(), r))
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
        let service = self.service;
        let slot = self.slot_mut(node);
        if let Some(agent) = slot.agent.take() {
            agent
                .stop()
                .await
                .unwrap_or_else(|e| panic!("stopping the agent of {node}: {e}"));
        }
        slot.agent = Some(start_agent(slot, service).await);
    }

    /// Stops the agent of `node`: its plugin socket and its stream to the coordinator go away,
    /// its checkpoint stays.
    pub(crate) async fn stop_agent(&mut self, node: &str) {
        let slot = self.slot_mut(node);
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
        slot.agent = Some(start_agent(slot, service).await);
    }

    /// Restarts the kubelet of `node`: the process stops (the device manager removes its
    /// sockets) and starts again on the same directory (the agent must notice the new
    /// `kubelet.sock` and register again); it lists its pods afresh and keeps what it had
    /// admitted, from the device manager's checkpoint.
    pub(crate) async fn restart_kubelet(&mut self, node: &str) {
        let slot = self.slot_mut(node);
        let kubelet = slot.kubelet.as_mut().expect("the kubelet runs");
        tokio::task::block_in_place(|| kubelet.restart());
    }

    /// Waits until the kubelet of `node` has the agent's GPU slots again (its pod-resources
    /// API lists them as allocatable): after a kubelet restart, pods it admits before then
    /// fail with "no healthy devices present", as on a real node.
    pub(crate) async fn wait_kubelet_has_the_agents_devices(&self, node: &str) {
        use tessera_proto::podresources::v1 as pr;
        let socket = self
            .slot(node)
            .kubelet
            .as_ref()
            .expect("the kubelet runs")
            .pod_resources_socket();
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
        self.history.lock().clone()
    }

    /// Waits until the pod watch has seen a pod change that `seen` accepts (polled often, so
    /// that the caller can act "in the middle" of what the coordinator is doing).
    pub(crate) async fn wait_seen(&self, what: &str, seen: impl Fn(&PodSeen) -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !self.history.lock().iter().any(&seen) {
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
    /// assignment changed once it was bound (the agent allocates from the annotation, so a
    /// changed one means two decisions for one pod).
    pub(crate) fn assert_bound_at_most_once(&self) {
        let mut bound: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
        for seen in self.history() {
            if seen.deleted {
                bound.remove(&seen.name);
                continue;
            }
            let Some(node) = &seen.node else { continue };
            match bound.get(&seen.name) {
                None => {
                    bound.insert(seen.name.clone(), (node.clone(), seen.assignment.clone()));
                }
                Some((first_node, first_assignment)) => {
                    assert_eq!(
                        first_node, node,
                        "pod {} was bound to {first_node} and later to {node}",
                        seen.name
                    );
                    assert_eq!(
                        first_assignment, &seen.assignment,
                        "pod {}'s assignment changed after it was bound to {node}",
                        seen.name
                    );
                }
            }
        }
    }

    /// Checks that every pod of `names` was bound, and that none was ever seen bound without
    /// its assignment or with an assignment before it was bound: the Binding carries the
    /// assignment onto the pod in the same write.
    pub(crate) fn assert_bound_with_assignment_in_one_write(&self, names: &[String]) {
        let history = self.history();
        for name in names {
            let seen: Vec<_> = history.iter().filter(|s| &s.name == name).collect();
            assert!(
                seen.iter().any(|s| s.node.is_some()),
                "{name} was never bound"
            );
            for s in seen {
                assert_eq!(
                    s.node.is_some(),
                    s.assignment.is_some(),
                    "{name} was seen with node {:?} and assignment {:?}",
                    s.node,
                    s.assignment
                );
            }
        }
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
        match self.pods().list(&ListParams::default()).await {
            Ok(list) => {
                for pod in list.items {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                    let status = pod.status.clone().unwrap_or_default();
                    let condition = unschedulable_message(&pod).unwrap_or_default();
                    let assignment = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(ASSIGNMENT).cloned())
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "  pod {name}: node={node:?} phase={:?} {} {} unschedulable={condition:?} assignment={assignment}",
                        status.phase,
                        status.reason.unwrap_or_default(),
                        status.message.unwrap_or_default(),
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(out, "  (pods could not be listed: {e})");
            }
        }
        for (node, r) in self.containers() {
            let _ = writeln!(
                out,
                "  container {}/{} on {node}: {:?}",
                r.pod, r.container, r.env
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
            if let Some(mut kubelet) = slot.kubelet.take() {
                tokio::task::block_in_place(|| kubelet.stop());
            }
        }
        self.history_task.abort();
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

async fn apply_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, crd) in tessera_coordinator::crd::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
    }
}

/// Records every pod change in the namespace, in the order the API server made them.
/// Returns once the watch has listed: a pod created after that is seen from its creation
/// on, in resourceVersion order (an initial list would show it in name order instead).
async fn record_pods(client: kube::Client) -> (Arc<Mutex<Vec<PodSeen>>>, JoinHandle<()>) {
    let history = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&history);
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let mut listed_tx = Some(listed_tx);
    let task = tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, NS);
        let stream = watcher(pods, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let (pod, deleted) = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                Ok(watcher::Event::Delete(p)) => (p, true),
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(_) => {
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            sink.lock().push(PodSeen {
                name: pod.metadata.name.clone().unwrap_or_default(),
                node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                assignment: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ASSIGNMENT).cloned()),
                phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
                deleted,
            });
        }
    });
    tokio::time::timeout(DEADLINE, listed)
        .await
        .expect("the pod watch listed in time")
        .expect("the pod watch task runs");
    (history, task)
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
    let dir = root.join(name);
    for sub in ["state", "proc"] {
        std::fs::create_dir_all(dir.join(sub)).expect("node directories");
    }
    let sim = Arc::new(SimBackend::from_yaml(shape, name).expect("GPU shape parses"));
    let mut options = LiteOptions::new(name);
    options.capacity = BTreeMap::from([
        ("cpu".to_owned(), "64".to_owned()),
        ("memory".to_owned(), "512Gi".to_owned()),
    ]);
    // The kubelet serves kubelet.sock before any plugin registers; the agent starts after.
    let kubelet = tokio::task::block_in_place(|| LiteNode::start(cluster, options));
    let mut slot = NodeSlot {
        name: name.into(),
        sim,
        dir,
        kubelet: Some(kubelet),
        agent: None,
    };
    slot.agent = Some(start_agent(&slot, service).await);
    slot
}

/// Waits for the `default` ServiceAccount of the test namespace (created by the
/// serviceaccount controller; the ServiceAccount admission plugin refuses pods without it).
async fn wait_default_service_account(client: &kube::Client) {
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), NS);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while sas.get("default").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the serviceaccount controller did not create {NS}/default"
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn start_agent(slot: &NodeSlot, service: SocketAddr) -> Agent {
    let kubelet = slot.kubelet.as_ref().expect("the node's kubelet runs");
    // As in the chart: the node's pods come over the coordinator stream, not from the API.
    let source = Arc::new(CoordinatorPods::new());
    let config = AgentConfig {
        node_name: slot.name.clone(),
        backend: Backend::Sim(Arc::clone(&slot.sim)),
        device_plugin_dir: kubelet.device_plugin_dir(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        state_dir: slot.dir.join("state"),
        admin_socket: None,
        options: NodeOptions::default(),
        source: source.clone(),
        node_pods: Some(source),
        reconcile_every: Duration::from_secs(1),
        reconcile_grace: Duration::from_secs(30),
        metrics_addr: None,
        coordinator: Some(format!("http://{service}")),
        coordinator_token_file: None,
        coordinator_ca_file: None,
        proc_root: slot.dir.join("proc"),
        watchdog: None,
        events: Arc::new(tessera_agent::events::LogEvents),
        mps: Default::default(),
        mig: Default::default(),
    };
    Agent::start(config)
        .await
        .unwrap_or_else(|e| panic!("the agent of {} starts: {e}", slot.name))
}

/// A test pod.
#[derive(Clone, Debug)]
pub(crate) struct PodBuilder {
    name: String,
    gpus: u32,
    annotations: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    spec: serde_json::Map<String, serde_json::Value>,
}

/// A pod `name` for the tessera scheduler with one container and no GPU yet.
pub(crate) fn pod(name: &str) -> PodBuilder {
    PodBuilder {
        name: name.into(),
        gpus: 0,
        annotations: BTreeMap::new(),
        labels: BTreeMap::new(),
        spec: serde_json::Map::new(),
    }
}

impl PodBuilder {
    /// `nvidia.com/gpu: n`.
    pub(crate) fn gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }

    /// One GPU, with `tessera.dev/gpu-fraction: <fraction>`.
    pub(crate) fn fraction(self, fraction: &str) -> Self {
        self.gpus(1).annotation(FRACTION, fraction)
    }

    /// Member of PodGroup `group`.
    pub(crate) fn group(self, group: &str) -> Self {
        self.annotation(POD_GROUP, group)
    }

    /// In leaf queue `queue`.
    pub(crate) fn queue(self, queue: &str) -> Self {
        self.label(QUEUE_LABEL, queue)
    }

    /// Adds an annotation.
    pub(crate) fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Adds a label.
    pub(crate) fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets a field of the pod's spec as the API spells it (`affinity`, `tolerations`,
    /// `schedulingGates`, `topologySpreadConstraints`, ...).
    pub(crate) fn spec_field(mut self, key: &str, value: serde_json::Value) -> Self {
        self.spec.insert(key.into(), value);
        self
    }

    /// The pod object.
    pub(crate) fn build(&self) -> Pod {
        let mut resources = json!({"requests": {"cpu": "100m", "memory": "128Mi"}});
        if self.gpus > 0 {
            resources["limits"] = json!({"nvidia.com/gpu": self.gpus.to_string()});
        }
        let mut spec = json!({
            "schedulerName": SCHEDULER,
            "containers": [{"name": CONTAINER, "image": "cuda", "resources": resources}],
        });
        if let Some(fields) = spec.as_object_mut() {
            fields.extend(self.spec.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": self.name, "namespace": NS,
                "annotations": self.annotations, "labels": self.labels,
            },
            "spec": spec,
        }))
        .expect("a valid pod")
    }
}

/// Number of GPUs of a simulated machine.
pub(crate) fn gpu_count(sim: &SimBackend) -> u32 {
    (0..).take_while(|&i| sim.uuid_of(i).is_some()).count() as u32
}

/// `prefix-0` .. `prefix-{n-1}`.
pub(crate) fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
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

/// The node a pod is bound to.
pub(crate) fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// The message of a `PodScheduled=False, reason=Unschedulable` condition.
pub(crate) fn unschedulable_message(pod: &Pod) -> Option<String> {
    pod_scheduled_false(pod, "Unschedulable")
}

/// The message of a `PodScheduled=False` condition with `reason`.
pub(crate) fn pod_scheduled_false(pod: &Pod, reason: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some(reason)
        })
        .map(|c| c.message.clone().unwrap_or_default())
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
