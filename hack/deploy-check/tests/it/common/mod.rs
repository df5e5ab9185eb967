//! Tessera deployed the way the chart deploys it, on real Kubernetes (hack/k8s): a real
//! kube-apiserver; the chart's CRDs, ServiceAccounts, RBAC, PriorityClasses and default Queue
//! from `helm template`, applied as they are (or with a rule removed, to see the API server
//! refuse); the real coordinator in-process with a client that acts as the chart's
//! coordinator ServiceAccount; and per node a kubelet-lite with a real `tessera-agent`
//! process (this crate's `deploy-check-agent` build of node-agent/src/main.rs) acting as the
//! agent ServiceAccount, reporting to the coordinator with a pod-bound token that the
//! coordinator checks with TokenReview, as in a cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use tessera_coordinator::agents::Authenticator;
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use tessera_deploy_check::chart::{self, Release};
use tessera_deploy_check::{kinds, manifests};
use tessera_testcluster::pods::{describe_pods, events_of, pod};
use tessera_testcluster::shapes::A100s;
use tessera_testcluster::{
    AgentProcess, Cluster, ClusterOptions, GpuNode, NodeOptions, free_port, pod_bound_token,
    wait_service_account,
};

pub(crate) use tessera_testcluster::pods::{is_bound, is_running, node_of, slices};
pub(crate) use tessera_testcluster::{apply, scrape, wait_crd_established};

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

/// The repository root, where the chart and the examples live.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Helm chart's directory (`deploy/helm/tessera`), as `helm template` is given it.
pub(crate) fn chart_dir() -> PathBuf {
    repo().join(manifests::CHART_DIR)
}

/// `helm install tessera` of the chart with its default values into the cluster of admin
/// kubeconfig `kubeconfig`, in [`NAMESPACE`] (created), not waiting for the workloads.
pub(crate) fn helm_install(kubeconfig: &Path) -> tessera_testcluster::HelmOutput {
    let chart = chart_dir();
    tokio::task::block_in_place(|| {
        tessera_testcluster::helm(
            &[
                "install",
                "tessera",
                &chart.to_string_lossy(),
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--wait=false",
            ],
            Some(kubeconfig),
        )
    })
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

    /// The simulated machine: `gpus` A100s, NVLink-connected in pairs, in a host big enough
    /// that CPU and memory never decide.
    fn shape_yaml(&self) -> String {
        A100s::new(self.gpus)
            .nvlink_pairs()
            .host(256_000, 2_097_152)
            .yaml()
    }
}

/// What to start.
pub(crate) struct Options {
    /// The GPU nodes to start, each with its own agent process.
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

/// One node: the kubelet-lite and its agent.
pub(crate) struct NodeSlot {
    /// The spec it was started from.
    pub spec: NodeSpec,
    /// The agent (dropped before the kubelet).
    pub agent: AgentProcess,
    /// Where the agent serves `/metrics`.
    pub metrics: SocketAddr,
    /// The kubelet-lite and the agent's directories, held so the node runs as long as the
    /// harness.
    pub(crate) _node: GpuNode,
}

/// A running deployment.
pub(crate) struct Harness {
    /// The running nodes, in the order of [`Options::nodes`].
    pub nodes: Vec<NodeSlot>,
    /// The in-process coordinator acting as the chart's ServiceAccount; `None` once shut down.
    pub coordinator: Option<CoordinatorHandle>,
    /// A cluster-admin client (the test's own requests).
    pub admin: kube::Client,
    /// Scratch space: shapes, state, tokens, logs.
    pub dir: tempfile::TempDir,
    /// The control plane (dropped last).
    pub cluster: Cluster,
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
    /// (Established before anything else), the ServiceAccounts and RBAC, the PriorityClasses,
    /// the default Queue and the admission policy that protects Tessera's keys (so the
    /// components' own writes go through it). The workloads (Deployment, DaemonSet) are left
    /// out: the test runs the components itself.
    async fn install(&self, docs: &[Value]) {
        self.apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        .await;
        let crds: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .collect();
        assert_eq!(crds.len(), 4, "the chart installs four CRDs");
        for crd in &crds {
            self.apply(crd).await;
        }
        for crd in &crds {
            let name = crd["metadata"]["name"].as_str().unwrap_or_default();
            wait_crd_established(&self.admin, name).await;
        }
        wait_service_account(&self.admin, "default", "default").await;
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "PriorityClass",
            "Queue",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            for doc in docs.iter().filter(|d| d["kind"] == kind) {
                self.apply(doc).await;
            }
        }
    }

    /// Creates one object (any kind the server serves) as the admin.
    pub(crate) async fn apply(&self, doc: &Value) -> DynamicObject {
        tessera_testcluster::apply(&self.admin, doc).await
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
        let mut options = NodeOptions::new(&spec.name);
        options.labels = spec.labels.clone();
        options.capacity = BTreeMap::from([
            ("cpu".to_owned(), "256".to_owned()),
            ("memory".to_owned(), "2Ti".to_owned()),
            ("pods".to_owned(), "110".to_owned()),
        ]);
        let node = tokio::task::block_in_place(|| {
            GpuNode::start(&self.cluster, self.dir.path(), options, &spec.shape_yaml())
        });

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
        let token_file = node.dir().join("token");
        std::fs::write(&token_file, token).expect("token file");
        let kubeconfig = tokio::task::block_in_place(|| {
            self.cluster.service_account_kubeconfig(NAMESPACE, AGENT_SA)
        });

        let coordinator = self
            .coordinator()
            .agent_addr()
            .expect("the coordinator serves agents");
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let agent = AgentProcess::start(
            Path::new(env!("CARGO_BIN_EXE_deploy-check-agent")),
            &node,
            &kubeconfig,
            [
                format!("--admin-socket={}", node.dir().join("agent.sock").display()),
                format!("--coordinator=http://{coordinator}"),
                format!("--coordinator-token-file={}", token_file.display()),
                format!("--metrics-addr={metrics}"),
                "--reconcile-interval-secs=1".into(),
                "--no-watchdog".into(),
            ],
        );
        NodeSlot {
            spec: spec.clone(),
            agent,
            metrics,
            _node: node,
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
        events_of(&self.admin, "default", name).await
    }

    /// Pods and their state, the agents' log tails, for failure messages.
    pub(crate) async fn describe(&self) -> String {
        let mut out = describe_pods(&self.admin, "default").await;
        for n in &self.nodes {
            out.push_str(&format!(
                "--- agent of {}:\n{}\n",
                n.spec.name,
                n.agent.log_tail(15)
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

/// A pod for the tessera scheduler in `default`, with one `main` container asking for
/// `gpus` nvidia.com/gpu, in `queue` at `priority_class`, with `annotations` (a JSON object).
pub(crate) fn gpu_pod(
    name: &str,
    queue: &str,
    gpus: u32,
    priority_class: &str,
    annotations: Value,
) -> Pod {
    let mut pod = pod(name)
        .queue(queue)
        .gpus(gpus)
        .priority_class(priority_class);
    for (key, value) in annotations.as_object().into_iter().flatten() {
        pod = pod.annotation(key, value.as_str().expect("annotation values are strings"));
    }
    pod.build()
}
