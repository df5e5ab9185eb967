//! A development cluster the way the chart deploys Tessera: the dev API server with one
//! bearer token per component (each standing for the chart's ServiceAccount user, so the
//! request audit log tells who made which call), the real coordinator, hollow nodes, and
//! per node either a real in-process agent (simulated GPUs, its own token) or an inventory
//! fed straight into the coordinator's agent registry (for clusters too big to run an
//! agent per node in a test).
#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::Value;
use tempfile::TempDir;
use tessera_agent::agent::{Agent, AgentConfig};
use tessera_agent::events::KubeEvents;
use tessera_agent::gpu::Backend;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::kube_assignments::KubeAssignments;
use tessera_agent::node::NodeOptions;
use tessera_coordinator::agents::{AgentRegistry, Authenticator};
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use tessera_deploy_check::chart::{Chart, Release};
use tessera_deploy_check::{kinds, manifests};
use tessera_devcluster::apiserver::{ApiServer, ApiServerConfig, ApiServerHandle, Token};
use tessera_devcluster::config::GpuShape;
use tessera_devcluster::hollow::{HollowNode, HollowNodeConfig, HollowNodeHandle};
use tessera_devcluster::kubeconfig;
use tessera_proto::tessera::v1 as pb;

/// A correctness bound for every "eventually", not a speed target.
pub const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

/// The release namespace, as the chart's default render.
pub const NAMESPACE: &str = "tessera-system";
/// The coordinator's ServiceAccount user.
pub const COORDINATOR_USER: &str = "system:serviceaccount:tessera-system:tessera-coordinator";
/// The agents' ServiceAccount user.
pub const AGENT_USER: &str = "system:serviceaccount:tessera-system:tessera-agent";
const ADMIN_TOKEN: &str = "admin-token";
const COORDINATOR_TOKEN: &str = "coordinator-token";
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart rendered with default values, as JSON documents.
pub fn default_render() -> Vec<Value> {
    let chart = Chart::load(&repo().join(manifests::CHART_DIR)).expect("chart loads");
    chart
        .render(&Release::default(), &[])
        .expect("chart renders")
        .into_iter()
        .flat_map(|r| r.documents)
        .map(|d| kinds::to_json(&d).expect("rendered YAML parses"))
        .collect()
}

/// A hollow node: its name, labels and GPUs; `real_agent` runs the real agent for it.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// Node labels (topology levels).
    pub labels: BTreeMap<String, String>,
    /// GPU count.
    pub gpus: u32,
    /// Run a real in-process agent (else the inventory goes into the registry directly).
    pub real_agent: bool,
}

impl NodeSpec {
    /// A node with `gpus` 80 GB GPUs, NVLink-connected in pairs.
    pub fn new(name: &str, gpus: u32, real_agent: bool) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
            gpus,
            real_agent,
        }
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    fn shape_yaml(&self) -> String {
        let mut s = String::from("cpu_milli: 256000\nmemory_mib: 2097152\nnvlinks:\n");
        for i in (0..self.gpus.saturating_sub(1)).step_by(2) {
            s.push_str(&format!("  - {{a: {i}, b: {}, links: 12}}\n", i + 1));
        }
        s.push_str("gpus:\n");
        for i in 0..self.gpus {
            s.push_str(&format!(
                "  - {{model: A100-80GB, memory_mib: 81920, numa: 0, pci_bus_id: \"0000:{:02x}:00.0\"}}\n",
                i + 1
            ));
        }
        s
    }
}

/// A running cluster.
pub struct Cluster {
    /// Temporary directories of the nodes.
    pub dir: TempDir,
    /// The API server.
    pub server: Option<ApiServerHandle>,
    /// An admin client (system:masters).
    pub admin: kube::Client,
    /// The coordinator.
    pub coordinator: Option<CoordinatorHandle>,
    nodes: Vec<HollowNodeHandle>,
    agents: Vec<Agent>,
    /// Open "streams" of registry-fed nodes (kept so the registry sees them connected).
    streams: Vec<tokio::sync::mpsc::Receiver<pb::CoordinatorMessage>>,
    /// Marks pods allocated on registry-fed nodes, as their agent would.
    marker: Option<tokio::task::JoinHandle<()>>,
}

fn agent_token(node: &str) -> String {
    format!("agent-token-{node}")
}

fn client(server: &ApiServerHandle, token: &str) -> kube::Client {
    kube::Client::try_from(
        kubeconfig::client_config(&server.url(), Some(token)).expect("client config"),
    )
    .expect("client")
}

impl Cluster {
    /// Starts everything; the chart's CRDs, PriorityClasses and default Queue are applied
    /// first (as `helm install` would), then the coordinator, then the nodes.
    pub async fn start(nodes: &[NodeSpec]) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut tokens = vec![
            Token {
                token: ADMIN_TOKEN.into(),
                user: "admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                extra: BTreeMap::new(),
            },
            Token {
                token: COORDINATOR_TOKEN.into(),
                user: COORDINATOR_USER.into(),
                groups: vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                ],
                extra: BTreeMap::new(),
            },
        ];
        for n in nodes {
            tokens.push(Token {
                token: agent_token(&n.name),
                user: AGENT_USER.into(),
                groups: vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                ],
                extra: BTreeMap::from([(NODE_NAME_EXTRA.to_string(), vec![n.name.clone()])]),
            });
        }
        let server = ApiServer::start(ApiServerConfig {
            tokens,
            require_auth: true,
            ..ApiServerConfig::default()
        })
        .await
        .expect("API server starts");
        // Record from the first request on: tests filter by user.
        server.audit().enable();
        let admin = client(&server, ADMIN_TOKEN);
        let mut cluster = Cluster {
            dir,
            admin: admin.clone(),
            server: Some(server),
            coordinator: None,
            nodes: Vec::new(),
            agents: Vec::new(),
            streams: Vec::new(),
            marker: None,
        };
        cluster.install().await;
        cluster.start_coordinator(nodes).await;
        for n in nodes {
            cluster.start_node(n).await;
        }
        let fed: Vec<String> = nodes
            .iter()
            .filter(|n| !n.real_agent)
            .map(|n| n.name.clone())
            .collect();
        if !fed.is_empty() {
            cluster.marker = Some(tokio::spawn(mark_allocated(admin, fed)));
        }
        cluster
    }

    /// The API server.
    pub fn server(&self) -> &ApiServerHandle {
        self.server.as_ref().expect("server runs until shutdown")
    }

    /// What `helm install` puts in before the workloads: the namespace, the CRDs, then the
    /// chart's cluster objects the coordinator reads (PriorityClasses, the default Queue).
    async fn install(&self) {
        let namespaces: Api<Namespace> = Api::all(self.admin.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}
        }))
        .expect("namespace object");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
        for (_, crd) in tessera_coordinator::crd::all() {
            let doc = serde_json::to_value(crd).expect("CRD serialises");
            self.apply(&doc).await;
        }
        for doc in default_render() {
            if matches!(doc["kind"].as_str(), Some("PriorityClass" | "Queue")) {
                self.apply(&doc).await;
            }
        }
    }

    /// Creates one object (any kind the server serves) as the admin.
    pub async fn apply(&self, doc: &Value) -> DynamicObject {
        let api_version = doc["apiVersion"].as_str().expect("apiVersion");
        let kind = doc["kind"].as_str().expect("kind");
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.admin, &gvk)
            .await
            .unwrap_or_else(|e| panic!("discovering {api_version} {kind}: {e}"));
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => {
                let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
                Api::namespaced_with(self.admin.clone(), ns, &resource)
            }
            kube::discovery::Scope::Cluster => Api::all_with(self.admin.clone(), &resource),
        };
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {kind} {:?}: {e}", doc["metadata"]["name"]))
    }

    async fn start_coordinator(&mut self, nodes: &[NodeSpec]) {
        let coordinator_client = client(self.server(), COORDINATOR_TOKEN);
        let registry = AgentRegistry::new();
        // Registry-fed nodes: the inventory their agent would send on connect.
        for n in nodes.iter().filter(|n| !n.real_agent) {
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            registry
                .connect(&inventory(n), 1, tx)
                .unwrap_or_else(|e| panic!("inventory of {}: {e}", n.name));
            self.streams.push(rx);
        }
        let defaults = CoordinatorConfig::default();
        let config = CoordinatorConfig {
            scheduler_name: "tessera".into(),
            identity: "tessera-coordinator-0".into(),
            lease: LeaseConfig {
                namespace: NAMESPACE.into(),
                name: "tessera-coordinator".into(),
                duration: Duration::from_secs(15),
                renew_every: Duration::from_millis(500),
            },
            agent_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            authenticator: Authenticator::token_review(
                coordinator_client.clone(),
                vec![AGENT_USER.into()],
            ),
            // Registry-fed nodes never send heartbeats.
            agent_timeout: Duration::from_secs(3600),
            cycle_interval: Duration::from_millis(200),
            registry: Some(registry),
            ..defaults
        };
        let handle = Coordinator::start(coordinator_client, config)
            .await
            .expect("coordinator starts");
        self.coordinator = Some(handle);
        self.wait_until("the coordinator leads", || {
            let leads = self.coordinator.as_ref().is_some_and(|c| c.is_leader());
            async move { leads.then_some(()) }
        })
        .await;
    }

    async fn start_node(&mut self, n: &NodeSpec) {
        let dir = self.dir.path().join(&n.name);
        for sub in ["dp", "pr", "state", "proc"] {
            std::fs::create_dir_all(dir.join(sub)).expect("node directories");
        }
        let node_client = client(self.server(), &agent_token(&n.name));
        let hollow_config = HollowNodeConfig {
            name: n.name.clone(),
            labels: n.labels.clone(),
            cpu: "256".into(),
            memory: "2Ti".into(),
            pods: 110,
            gpus: GpuShape {
                // Without a device plugin the hollow kubelet admits against this count; a
                // real agent advertises `shares_per_gpu` (10) slots per GPU.
                count: if n.real_agent { n.gpus } else { n.gpus * 10 },
                model: "A100-80GB".into(),
                memory_mib: 81920,
                mig: BTreeMap::new(),
            },
            device_plugin_dir: n.real_agent.then(|| dir.join("dp")),
            device_plugin_timeout: DEADLINE,
            pod_resources_dir: n.real_agent.then(|| dir.join("pr")),
        };
        if !n.real_agent {
            let hollow = HollowNode::start(self.admin.clone(), hollow_config)
                .await
                .unwrap_or_else(|e| panic!("hollow node {}: {e}", n.name));
            self.nodes.push(hollow);
            return;
        }
        // The hollow kubelet waits for its device plugin; the agent needs kubelet.sock.
        let hollow = tokio::spawn(HollowNode::start(self.admin.clone(), hollow_config));
        let kubelet_sock = dir.join("dp/kubelet.sock");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !kubelet_sock.exists() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no kubelet.sock for {}",
                n.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let token_file = dir.join("token");
        std::fs::write(&token_file, agent_token(&n.name)).expect("token file");
        let source = KubeAssignments::start(node_client.clone(), &n.name);
        assert!(
            source.wait_synced(DEADLINE).await,
            "agent of {} lists its pods",
            n.name
        );
        let coordinator = self
            .coordinator
            .as_ref()
            .and_then(CoordinatorHandle::agent_addr)
            .expect("coordinator agent address");
        let sim = SimBackend::from_yaml(&n.shape_yaml(), &n.name).expect("GPU shape parses");
        let config = AgentConfig {
            node_name: n.name.clone(),
            backend: Backend::Sim(Arc::new(sim)),
            device_plugin_dir: dir.join("dp"),
            pod_resources_socket: dir.join("pr/kubelet.sock"),
            state_dir: dir.join("state"),
            admin_socket: None,
            options: NodeOptions::default(),
            source: Arc::new(source),
            reconcile_every: Duration::from_secs(1),
            reconcile_grace: Duration::from_secs(30),
            metrics_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            coordinator: Some(format!("http://{coordinator}")),
            coordinator_token_file: Some(token_file),
            proc_root: dir.join("proc"),
            watchdog: None,
            events: Arc::new(KubeEvents::new(node_client, &n.name)),
            mps: Default::default(),
            mig: Default::default(),
        };
        let agent = Agent::start(config)
            .await
            .unwrap_or_else(|e| panic!("agent of {} starts: {e}", n.name));
        self.agents.push(agent);
        let hollow = hollow
            .await
            .expect("hollow node task")
            .unwrap_or_else(|e| panic!("hollow node {}: {e}", n.name));
        self.nodes.push(hollow);
    }

    /// Polls `probe` until it answers, or fails after [`DEADLINE`].
    pub async fn wait_until<T, F, Fut>(&self, what: &str, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(v) = probe().await {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.describe().await
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// All pods in `namespace`.
    pub async fn pods(&self, namespace: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Pods and their state, for failure messages.
    pub async fn describe(&self) -> String {
        let mut out = String::new();
        for pod in self.pods("default").await {
            let status = pod.status.clone().unwrap_or_default();
            let cond = status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")
                .map(|c| {
                    format!(
                        "{} {}",
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "  {} node={:?} phase={:?} {cond}\n",
                pod.metadata.name.unwrap_or_default(),
                pod.spec.and_then(|s| s.node_name),
                status.phase,
            ));
        }
        out
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        if let Some(marker) = self.marker.take() {
            marker.abort();
        }
        if let Some(c) = self.coordinator.take() {
            c.shutdown().await;
        }
        for agent in std::mem::take(&mut self.agents) {
            let _ = agent.stop().await;
        }
        for node in std::mem::take(&mut self.nodes) {
            node.shutdown().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

/// What a registry-fed node's agent would do after the kubelet's Allocate: mark each pod
/// bound there `tessera.dev/allocated` (the coordinator waits for that mark before binding a
/// second pod with the same slot count to the node).
async fn mark_allocated(admin: kube::Client, nodes: Vec<String>) {
    let pods: Api<Pod> = Api::all(admin.clone());
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for pod in list.items {
                let on_fed_node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some_and(|n| nodes.contains(n));
                let marked = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("tessera.dev/allocated"));
                if !on_fed_node || marked {
                    continue;
                }
                let api: Api<Pod> = Api::namespaced(
                    admin.clone(),
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                );
                let patch = serde_json::json!({
                    "metadata": {"annotations": {"tessera.dev/allocated": "1"}}
                });
                let _ = api
                    .patch(
                        pod.metadata.name.as_deref().unwrap_or_default(),
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The inventory an agent on `n` would send.
fn inventory(n: &NodeSpec) -> pb::NodeInventory {
    let gpus: Vec<pb::Gpu> = (0..n.gpus)
        .map(|i| pb::Gpu {
            uuid: format!("GPU-{}-{i}", n.name),
            index: i,
            model: "A100-80GB".into(),
            memory_mib: 81920,
            numa_node: 0,
            pci_bus_id: format!("00000000:{:02x}:00.0", i + 1),
            ..Default::default()
        })
        .collect();
    let links = (0..n.gpus.saturating_sub(1))
        .step_by(2)
        .map(|i| pb::GpuLink {
            gpu_a: format!("GPU-{}-{i}", n.name),
            gpu_b: format!("GPU-{}-{}", n.name, i + 1),
            nvlink_count: 12,
            ..Default::default()
        })
        .collect();
    pb::NodeInventory {
        node_name: n.name.clone(),
        agent_version: "test".into(),
        gpus,
        links: Some(pb::LinkMatrix { links }),
        shares_per_gpu: 10,
    }
}
