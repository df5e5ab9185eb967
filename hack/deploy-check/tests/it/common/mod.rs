//! Tessera deployed the way the chart deploys it, on real Kubernetes (hack/k8s): a real
//! kube-apiserver; the chart's CRDs, ServiceAccounts, RBAC, PriorityClasses and default Queue
//! from `helm template`, applied as they are (or with a rule removed, to see the API server
//! refuse); the real coordinator in-process with a client that acts as the chart's
//! coordinator ServiceAccount; and per node a kubelet-lite with a real `tessera-agent`
//! process (this crate's `deploy-check-agent` build of node-agent/src/main.rs) acting as the
//! agent ServiceAccount, reporting to the coordinator with a pod-bound token that the
//! coordinator checks with TokenReview, as in a cluster.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tessera_coordinator::agents::Authenticator;
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use tessera_deploy_check::chart::{self, Release};
use tessera_deploy_check::{kinds, manifests};
use tessera_testcluster::{Cluster, ClusterOptions, LiteNode, NodeOptions, pod_bound_token};

/// A correctness bound for every "eventually", not a speed target.
pub(crate) const DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(100);

/// The release namespace of the chart's default render.
pub(crate) const NAMESPACE: &str = "tessera-system";
/// The coordinator's ServiceAccount (the chart's `<release>-coordinator`).
pub(crate) const COORDINATOR_SA: &str = "tessera-coordinator";
/// The agents' ServiceAccount.
pub(crate) const AGENT_SA: &str = "tessera-agent";
/// The agents' ServiceAccount user, as the chart passes it in `--agent-users`.
pub(crate) const AGENT_USER: &str = "system:serviceaccount:tessera-system:tessera-agent";
/// `agent.tokenAudience` in the chart's values: the coordinator accepts only agent tokens
/// issued for it.
pub(crate) const TOKEN_AUDIENCE: &str = "tessera";
/// The Lease the chart's Role lets the coordinator use (values `leaderElection.leaseName`).
pub(crate) const LEASE: &str = "tessera-coordinator";

/// The repository root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart directory.
pub(crate) fn chart_dir() -> PathBuf {
    repo().join(manifests::CHART_DIR)
}

/// `helm template` of the chart with default values (CRDs included), as JSON documents.
pub(crate) fn default_render() -> Vec<Value> {
    render_with(&[])
}

/// The chart rendered with the values files `values` on top of its defaults.
pub(crate) fn render_with(values: &[PathBuf]) -> Vec<Value> {
    let text = chart::template(&chart_dir(), &Release::default(), values, true)
        .unwrap_or_else(|e| panic!("{e}"));
    chart::parse_helm_output(&text)
        .into_iter()
        .map(|r| kinds::to_json(&r.text).expect("helm's YAML parses"))
        .collect()
}

/// Removes `verb` on `resource` from the rules of `kind`/`name` (a ClusterRole or Role) in
/// `docs`, splitting a rule that also grants other resources. Panics if the chart granted no
/// such verb: the test that uses it would then prove nothing.
pub(crate) fn remove_verb(docs: &mut [Value], kind: &str, name: &str, resource: &str, verb: &str) {
    let role = docs
        .iter_mut()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the chart"));
    let rules = role["rules"].as_array_mut().expect("rules");
    let mut out = Vec::new();
    let mut removed = false;
    for rule in rules.drain(..) {
        let resources: Vec<String> =
            serde_json::from_value(rule["resources"].clone()).expect("resources");
        let verbs: Vec<String> = serde_json::from_value(rule["verbs"].clone()).expect("verbs");
        if !resources.iter().any(|r| r == resource) || !verbs.iter().any(|v| v == verb) {
            out.push(rule);
            continue;
        }
        removed = true;
        let others: Vec<&String> = resources.iter().filter(|r| *r != resource).collect();
        if !others.is_empty() {
            let mut rest = rule.clone();
            rest["resources"] = json!(others);
            out.push(rest);
        }
        let kept: Vec<&String> = verbs.iter().filter(|v| *v != verb).collect();
        if !kept.is_empty() {
            let mut this = rule.clone();
            this["resources"] = json!([resource]);
            this["verbs"] = json!(kept);
            out.push(this);
        }
    }
    assert!(removed, "{kind} {name} does not grant {verb} on {resource}");
    *rules = out;
}

/// A kubelet-lite node with a real agent: its name, labels and number of 80 GB A100s.
#[derive(Clone, Debug)]
pub(crate) struct NodeSpec {
    /// Node name.
    pub name: String,
    /// Node labels (topology levels).
    pub labels: BTreeMap<String, String>,
    /// GPU count, NVLink-connected in pairs.
    pub gpus: u32,
}

impl NodeSpec {
    /// A node with `gpus` GPUs.
    pub(crate) fn new(name: &str, gpus: u32) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
            gpus,
        }
    }

    /// Adds a label.
    pub(crate) fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The simulated machine in the hack/gpus format; no `name`, so the file name (the node
    /// name) gives each node its own GPU UUIDs.
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

/// What to start.
pub(crate) struct Options {
    /// The nodes.
    pub nodes: Vec<NodeSpec>,
    /// kube-controller-manager controllers (`serviceaccount-controller` at least: pods
    /// need their namespace's ServiceAccount).
    pub controllers: String,
    /// Changes to the rendered documents before they are applied (e.g. [`remove_verb`]).
    pub edit: fn(&mut Vec<Value>),
}

impl Options {
    /// `nodes`, the ServiceAccount controller only, the chart as rendered.
    pub(crate) fn new(nodes: Vec<NodeSpec>) -> Self {
        Self {
            nodes,
            controllers: "serviceaccount-controller".into(),
            edit: |_| {},
        }
    }
}

/// The agent process; killed and reaped on drop so a failing test leaves no orphan.
pub(crate) struct AgentProcess {
    child: Child,
    log: PathBuf,
    /// Where its `/metrics` is served.
    pub metrics: SocketAddr,
}

impl AgentProcess {
    /// The agent's log (stderr) so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One node: the kubelet-lite and its agent.
pub(crate) struct NodeSlot {
    /// The spec it was started from.
    pub spec: NodeSpec,
    /// The agent (dropped before the kubelet).
    pub agent: AgentProcess,
    /// The kubelet-lite, held so the node runs as long as the harness.
    pub(crate) _kubelet: LiteNode,
}

/// A running deployment.
pub(crate) struct Harness {
    /// The nodes.
    pub nodes: Vec<NodeSlot>,
    /// The coordinator.
    pub coordinator: Option<CoordinatorHandle>,
    /// A cluster-admin client (the test's own requests).
    pub admin: kube::Client,
    /// Scratch space: shapes, state, tokens, logs.
    pub dir: tempfile::TempDir,
    /// The control plane (dropped last).
    pub cluster: Cluster,
}

/// A free TCP port on 127.0.0.1 (the agent prints no bound address, so it gets a fixed one).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("bound address").port()
}

impl Harness {
    /// Starts the control plane, applies the chart, starts the coordinator as its
    /// ServiceAccount and waits until it leads, then each node with its agent.
    pub(crate) async fn start(options: Options) -> Harness {
        let dir = tempfile::tempdir().expect("temporary directory");
        let cluster = tokio::task::block_in_place(|| {
            Cluster::start(ClusterOptions {
                controllers: Some(options.controllers.clone()),
                ..ClusterOptions::default()
            })
        });
        let admin = cluster.admin().await;
        let mut docs = default_render();
        (options.edit)(&mut docs);
        let mut h = Harness {
            nodes: Vec::new(),
            coordinator: None,
            admin,
            dir,
            cluster,
        };
        h.install(&docs).await;
        h.start_coordinator().await;
        for spec in &options.nodes {
            let slot = h.start_node(spec).await;
            h.nodes.push(slot);
        }
        for slot in &h.nodes {
            h.wait_slots(slot).await;
        }
        h
    }

    /// What `helm install` creates that the components need: the namespace, the CRDs
    /// (Established before anything else), the ServiceAccounts and RBAC, the PriorityClasses
    /// and the default Queue. The workloads (Deployment, DaemonSet) are left out: the test
    /// runs the components itself.
    async fn install(&self, docs: &[Value]) {
        self.apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        .await;
        let crds: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .collect();
        assert_eq!(crds.len(), 3, "the chart installs three CRDs");
        for crd in &crds {
            self.apply(crd).await;
        }
        for crd in &crds {
            let name = crd["metadata"]["name"].as_str().unwrap_or_default();
            wait_crd_established(&self.admin, name).await;
        }
        self.wait_until("the default ServiceAccount", || async {
            let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                Api::namespaced(self.admin.clone(), "default");
            sas.get("default").await.ok().map(|_| ())
        })
        .await;
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "PriorityClass",
            "Queue",
        ] {
            for doc in docs.iter().filter(|d| d["kind"] == kind) {
                self.apply(doc).await;
            }
        }
    }

    /// Creates one object (any kind the server serves) as the admin.
    pub(crate) async fn apply(&self, doc: &Value) -> DynamicObject {
        apply(&self.admin, doc).await
    }

    async fn start_coordinator(&mut self) {
        let client = self
            .cluster
            .service_account(NAMESPACE, COORDINATOR_SA)
            .await;
        let defaults = CoordinatorConfig::default();
        let config = CoordinatorConfig {
            scheduler_name: "tessera".into(),
            identity: "tessera-coordinator-0".into(),
            lease: LeaseConfig {
                namespace: NAMESPACE.into(),
                name: LEASE.into(),
                duration: Duration::from_secs(15),
                renew_every: Duration::from_millis(500),
            },
            agent_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            // The chart's `--agent-auth=tokenreview --agent-users=<agent ServiceAccount>
            // --agent-token-audience=tessera`.
            authenticator: Authenticator::token_review(client.clone(), vec![AGENT_USER.into()])
                .with_audience(Some(TOKEN_AUDIENCE.into())),
            agent_timeout: Duration::from_secs(30),
            cycle_interval: Duration::from_millis(200),
            ..defaults
        };
        let handle = Coordinator::start(client, config)
            .await
            .expect("coordinator starts");
        self.coordinator = Some(handle);
        self.wait_until("the coordinator to lead", || {
            let leads = self.coordinator.as_ref().is_some_and(|c| c.is_leader());
            async move { leads.then_some(()) }
        })
        .await;
    }

    /// The coordinator's handle.
    pub(crate) fn coordinator(&self) -> &CoordinatorHandle {
        self.coordinator.as_ref().expect("the coordinator runs")
    }

    async fn start_node(&self, spec: &NodeSpec) -> NodeSlot {
        let dir = self.dir.path().join(&spec.name);
        for sub in ["state", "proc"] {
            std::fs::create_dir_all(dir.join(sub)).expect("node directories");
        }
        let shape = dir.join(format!("{}.yaml", spec.name));
        std::fs::write(&shape, spec.shape_yaml()).expect("shape file");
        let mut options = NodeOptions::new(&spec.name);
        options.labels = spec.labels.clone();
        options.capacity = BTreeMap::from([
            ("cpu".to_owned(), "256".to_owned()),
            ("memory".to_owned(), "2Ti".to_owned()),
            ("pods".to_owned(), "110".to_owned()),
        ]);
        let kubelet = tokio::task::block_in_place(|| LiteNode::start(&self.cluster, options));

        // The DaemonSet pod's token: the agent ServiceAccount's, bound to a pod on this node,
        // so the coordinator's TokenReview learns the node.
        let pod_name = format!("tessera-agent-{}", spec.name);
        let agent_pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": NAMESPACE},
            "spec": {"nodeName": spec.name, "serviceAccountName": AGENT_SA,
                     "containers": [{"name": "agent", "image": "tessera-agent"}]},
        }))
        .expect("agent pod");
        Api::<Pod>::namespaced(self.admin.clone(), NAMESPACE)
            .create(&PostParams::default(), &agent_pod)
            .await
            .unwrap_or_else(|e| panic!("agent pod on {}: {e}", spec.name));
        // The chart's projected coordinator token (audience agent.tokenAudience).
        let token = pod_bound_token(
            &self.admin,
            NAMESPACE,
            AGENT_SA,
            &pod_name,
            &[TOKEN_AUDIENCE],
        )
        .await;
        let token_file = dir.join("token");
        std::fs::write(&token_file, token).expect("token file");
        let kubeconfig = tokio::task::block_in_place(|| {
            self.cluster.service_account_kubeconfig(NAMESPACE, AGENT_SA)
        });

        let coordinator = self
            .coordinator()
            .agent_addr()
            .expect("the coordinator serves agents");
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = dir.join("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_deploy-check-agent"))
            .arg("run")
            .args(["--node-name", &spec.name])
            .arg(format!("--gpu-backend=sim:{}", shape.display()))
            .arg("--device-plugin-dir")
            .arg(kubelet.device_plugin_dir())
            .arg("--pod-resources-socket")
            .arg(kubelet.pod_resources_socket())
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--admin-socket")
            .arg(dir.join("agent.sock"))
            .arg("--proc-root")
            .arg(dir.join("proc"))
            .arg(format!("--coordinator=http://{coordinator}"))
            .arg("--coordinator-token-file")
            .arg(&token_file)
            .arg(format!("--metrics-addr={metrics}"))
            .args(["--reconcile-interval-secs", "1", "--no-watchdog"])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("agent log"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting the agent of {}: {e}", spec.name));
        NodeSlot {
            spec: spec.clone(),
            agent: AgentProcess {
                child,
                log,
                metrics,
            },
            _kubelet: kubelet,
        }
    }

    /// Waits until the node advertises its agent's slots (10 per GPU).
    async fn wait_slots(&self, slot: &NodeSlot) {
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let want = (slot.spec.gpus * 10).to_string();
        self.wait_until(
            &format!("node {} to advertise {want} GPU slots", slot.spec.name),
            || async {
                let n = nodes.get(&slot.spec.name).await.ok()?;
                let q = n.status?.allocatable?.get("nvidia.com/gpu")?.0.clone();
                (q == want).then_some(())
            },
        )
        .await;
    }

    /// The node slot named `name`.
    pub(crate) fn node(&self, name: &str) -> &NodeSlot {
        self.nodes
            .iter()
            .find(|n| n.spec.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Polls `probe` until it answers, or fails after [`DEADLINE`] with a picture of the
    /// cluster and the agents' logs.
    pub(crate) async fn wait_until<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        tessera_testcluster::wait_for(what, probe, || self.describe()).await
    }

    /// All pods in `namespace`.
    pub(crate) async fn pods(&self, namespace: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), namespace);
        api.list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Pod `name` in `default`, if it exists.
    pub(crate) async fn pod(&self, name: &str) -> Option<Pod> {
        Api::<Pod>::namespaced(self.admin.clone(), "default")
            .get(name)
            .await
            .ok()
    }

    /// Events about pod `default/name`: (reason, message).
    pub(crate) async fn events_of(&self, name: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), "default");
        events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Pods and their state, the agents' log tails, for failure messages.
    pub(crate) async fn describe(&self) -> String {
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
        for n in &self.nodes {
            let log = n.agent.log();
            let lines: Vec<&str> = log.lines().collect();
            out.push_str(&format!(
                "--- agent of {}:\n{}\n",
                n.spec.name,
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    /// Stops the coordinator; the rest stops on drop.
    pub(crate) async fn shutdown(mut self) {
        if let Some(c) = self.coordinator.take() {
            c.shutdown().await;
        }
    }
}

/// Creates one object (any kind the server serves) with `client`, retrying while its kind is
/// not yet discoverable (a CRD that was just Established).
pub(crate) async fn apply(client: &kube::Client, doc: &Value) -> DynamicObject {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let (resource, caps) = loop {
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => break found,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "discovering {api_version} {kind}: {e}"
            ),
        }
        tokio::time::sleep(POLL).await;
    };
    let api: Api<DynamicObject> = match caps.scope {
        kube::discovery::Scope::Namespaced => {
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {kind} {:?}: {e}", doc["metadata"]["name"]))
}

/// Waits until CRD `name` has condition Established=True.
pub(crate) async fn wait_crd_established(client: &kube::Client, name: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let established = crds.get(name).await.ok().is_some_and(|c| {
            c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CRD {name} was not Established"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `GET /metrics` from `addr` over plain HTTP/1.0: the body.
pub(crate) async fn scrape(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP response from {addr}: {text:?}"));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{addr}/metrics: {head}"
    );
    body.to_owned()
}

/// A pod for the tessera scheduler in `default`, with one `main` container asking for
/// `gpus` nvidia.com/gpu.
pub(crate) fn gpu_pod(
    name: &str,
    queue: &str,
    gpus: u32,
    priority_class: &str,
    annotations: Value,
) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"tessera.dev/queue": queue},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "tessera",
            "priorityClassName": priority_class,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
            }],
        },
    }))
    .expect("pod object")
}

/// Whether the pod is bound to a node.
pub(crate) fn is_bound(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
}

/// Whether the pod runs: its kubelet admitted it, which needs its agent's Allocate.
pub(crate) fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// `(uuid, memory MiB, compute milli)` of each GPU in the pod's `tessera.dev/assignment`.
pub(crate) fn slices(pod: &Pod) -> Vec<(String, u64, u64)> {
    let text = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("tessera.dev/assignment"))
        .unwrap_or_else(|| panic!("{:?} has no assignment", pod.metadata.name));
    let a: Value = serde_json::from_str(text).expect("assignment JSON");
    a["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .flat_map(|c| c["gpus"].as_array().cloned().unwrap_or_default())
        .map(|g| {
            (
                g["uuid"].as_str().unwrap_or_default().to_owned(),
                g["memory_mib"].as_u64().unwrap_or(0),
                g["compute_milli"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// The node a pod is bound to.
pub(crate) fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}
