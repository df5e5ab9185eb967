//! The agent behind the kubelet's own device manager: a real `tessera-agent` process is the
//! device plugin of a kubelet-lite node (hack/k8s) on a real kube-apiserver. The kubelet code
//! decides what to ask the plugin (init containers first, device reuse, checkpoint, restart),
//! so these tests see what a real node would do to the agent.

use crate::common;

use std::path::Path;

use common::shape;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::plugin::{ENV_COMPUTE_PERCENT, ENV_MEMORY_LIMIT};
use tessera_contract::keys::ASSIGNMENT as ASSIGNMENT_ANNOTATION;
use tessera_testcluster::pods::{self, PodBuilder};
use tessera_testcluster::{AgentProcess, Cluster, ClusterOptions, GpuNode, LiteNode, NodeOptions};

const SHAPE: &str = "l40s-4x-pcie.yaml";
const NODE: &str = "n1";
const GPU: &str = "nvidia.com/gpu";

/// One cluster, one kubelet-lite node, one agent on the 4×L40S shape.
struct Setup {
    _dir: tempfile::TempDir,
    cluster: Cluster,
    gpu: GpuNode,
    agent: AgentProcess,
    client: kube::Client,
    sim: SimBackend,
}

impl Setup {
    async fn start() -> Setup {
        Setup::start_with(NodeOptions::new(NODE)).await
    }

    async fn start_with(options: NodeOptions) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Cluster::start(ClusterOptions {
            controllers: Some("serviceaccount-controller".into()),
            ..ClusterOptions::default()
        });
        let text = std::fs::read_to_string(shape(SHAPE)).unwrap();
        let gpu = GpuNode::start(&cluster, dir.path(), options, &text);
        // No coordinator here: the test writes the assignments on the pods itself.
        let agent = AgentProcess::start(
            Path::new(env!("CARGO_BIN_EXE_tessera-agent")),
            &gpu,
            &cluster.admin_kubeconfig(),
            [
                "--metrics-addr=none",
                "--coordinator=none",
                "--assignments=kube",
            ],
        );
        let client = cluster.admin().await;
        let sim = SimBackend::from_file(gpu.shape_file()).unwrap();
        let s = Setup {
            _dir: dir,
            cluster,
            gpu,
            agent,
            client,
            sim,
        };
        let nodes: Api<Node> = Api::all(s.client.clone());
        let slots = s
            .wait("the node to advertise the agent's slots", || async {
                let n = nodes.get(NODE).await.ok()?;
                let q = n.status?.allocatable?.get(GPU)?.0.clone();
                (q == "40").then_some(q)
            })
            .await;
        assert_eq!(slots, "40", "4 GPUs × 10 slots");
        tessera_testcluster::wait_service_account(&s.client, "default", "default").await;
        s
    }

    /// The node's kubelet, whose records show what each container was given.
    fn node(&self) -> &LiteNode {
        self.gpu.kubelet()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn uuid(&self, i: u32) -> String {
        self.sim.uuid_of(i).unwrap().to_owned()
    }

    async fn wait<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        tessera_testcluster::wait_for(what, probe, || async {
            format!(
                "agent log:\n{}\nkubelet-lite log:\n{}",
                self.agent.log(),
                self.node().log()
            )
        })
        .await
    }

    /// Creates `pod` and binds it to the node through the Binding subresource, as a scheduler does.
    async fn create_bound(&self, pod: PodBuilder) {
        let pod = pod.build();
        let name = pod.metadata.name.clone().unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": "default"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        });
        let _: serde_json::Value = self
            .pods()
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("binding {name}: {e}"));
    }

    async fn wait_running(&self, name: &str) -> Pod {
        self.wait(&format!("pod {name} to run"), || async {
            let pod = self.pods().get(name).await.ok()?;
            let status = pod.status.clone()?;
            match status.phase.as_deref() {
                Some("Running") => Some(pod),
                Some("Failed") => panic!(
                    "pod {name} failed: {:?} {:?}\nagent log:\n{}\nkubelet-lite log:\n{}",
                    status.reason,
                    status.message,
                    self.agent.log(),
                    self.node().log()
                ),
                _ => None,
            }
        })
        .await
    }
}

fn assignment(container: &str, uuid: &str, memory_mib: u64, compute_milli: u32) -> String {
    json!({"containers": [{"container": container, "gpus": [
        {"uuid": uuid, "memory_mib": memory_mib, "compute_milli": compute_milli}]}]})
    .to_string()
}

/// An init container asking for `gpus` GPUs (the pod builder's app container is `main`).
fn gpu_container(name: &str, gpus: u32) -> serde_json::Value {
    json!({"name": name, "image": "cuda", "resources": {"limits": {GPU: gpus.to_string()}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assigned_pod_gets_exactly_its_gpu_share_through_the_real_device_manager() {
    let s = Setup::start().await;
    // Not GPU 0: an agent answering "the first free GPU" must fail this test.
    let uuid = s.uuid(2);
    s.create_bound(pods::pod("p").fraction("0.5").annotation(
        ASSIGNMENT_ANNOTATION,
        &assignment("main", &uuid, 23034, 500),
    ))
    .await;
    s.wait_running("p").await;
    let record = s
        .node()
        .container("default", "p", "main")
        .expect("p/main started");
    assert_eq!(record.env["NVIDIA_VISIBLE_DEVICES"], uuid, "{record:?}");
    assert_eq!(record.env[ENV_MEMORY_LIMIT], "23034", "{record:?}");
    assert_eq!(record.env[ENV_COMPUTE_PERCENT], "50", "{record:?}");
    let slots = record.devices_of(GPU);
    assert_eq!(slots.len(), 1, "{record:?}");
    assert!(
        slots[0].starts_with(&uuid),
        "the kubelet's slot {slots:?} is not on {uuid}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_container_and_the_app_container_after_it_share_the_gpu_the_kubelet_reuses() {
    let s = Setup::start().await;
    // Another scheduler's pod: no assignment, so the agent gives whole free GPUs. The kubelet
    // allocates the init container first and hands its device to the app container.
    s.create_bound(
        pods::pod("init-then-app")
            .gpus(1)
            .spec_field("schedulerName", json!("default-scheduler"))
            .spec_field("initContainers", json!([gpu_container("fetch", 1)])),
    )
    .await;
    s.wait_running("init-then-app").await;
    let init = s
        .node()
        .container("default", "init-then-app", "fetch")
        .expect("init container started");
    let app = s
        .node()
        .container("default", "init-then-app", "main")
        .expect("app container started");
    assert!(init.init && !app.init);
    assert_eq!(init.devices_of(GPU).len(), 1, "{init:?}");
    assert_eq!(
        init.devices_of(GPU),
        app.devices_of(GPU),
        "the kubelet reuses the init container's device for the app container"
    );
    let gpu = &init.env["NVIDIA_VISIBLE_DEVICES"];
    assert_eq!(
        &app.env["NVIDIA_VISIBLE_DEVICES"], gpu,
        "both containers see one GPU"
    );
    assert!(init.devices_of(GPU)[0].starts_with(gpu.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_keeps_running_pods_devices_and_the_agent_registers_again() {
    let mut s = Setup::start().await;
    let first = s.uuid(1);
    s.create_bound(pods::pod("before").gpus(1).annotation(
        ASSIGNMENT_ANNOTATION,
        &assignment("main", &first, 46068, 1000),
    ))
    .await;
    s.wait_running("before").await;
    let held = s
        .node()
        .container("default", "before", "main")
        .unwrap()
        .devices_of(GPU)
        .to_vec();

    s.gpu.kubelet_mut().restart();
    let nodes: Api<Node> = Api::all(s.client.clone());
    // The restarted device manager knows no plugin until the agent notices the new
    // kubelet.sock and registers again; then capacity comes back.
    s.wait(
        "the agent to register with the restarted kubelet",
        || async {
            let registered = s
                .node()
                .log()
                .contains("Got registration request from device plugin");
            let n = nodes.get(NODE).await.ok()?;
            (registered && n.status?.allocatable?.get(GPU)?.0 == "40").then_some(())
        },
    )
    .await;

    // A second whole-GPU pod for the same GPU must not get the slot the first still holds.
    let second = s.uuid(3);
    s.create_bound(pods::pod("after").gpus(1).annotation(
        ASSIGNMENT_ANNOTATION,
        &assignment("main", &second, 46068, 1000),
    ))
    .await;
    s.wait_running("after").await;
    let after = s.node().container("default", "after", "main").unwrap();
    assert_eq!(after.env["NVIDIA_VISIBLE_DEVICES"], second);
    assert_ne!(
        after.devices_of(GPU),
        held.as_slice(),
        "a held slot was given again"
    );
    let before = s.pods().get("before").await.unwrap();
    assert_eq!(
        before.status.and_then(|st| st.phase).as_deref(),
        Some("Running"),
        "the restart must not disturb a running pod"
    );
    drop(s.cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topology_manager_never_narrows_a_pod_away_from_its_assigned_gpu() {
    // Two NUMA nodes and the strictest policy. Were the slots advertised with their GPUs'
    // NUMA nodes, the Topology Manager would pick NUMA node 0 for any one-slot request and
    // hand the device manager only NUMA-0 slots, so a pod assigned a GPU on NUMA node 1 could
    // never get it. The coordinator places GPUs; the slots carry no NUMA hint.
    let mut options = NodeOptions::new(NODE);
    options.numa_nodes = 2;
    options.topology_policy = "single-numa-node".into();
    let s = Setup::start_with(options).await;
    let uuid = s.uuid(3);
    s.create_bound(pods::pod("numa-1").fraction("0.25").annotation(
        ASSIGNMENT_ANNOTATION,
        &assignment("main", &uuid, 11517, 250),
    ))
    .await;
    s.wait_running("numa-1").await;
    let record = s
        .node()
        .container("default", "numa-1", "main")
        .expect("numa-1/main started");
    assert_eq!(record.env["NVIDIA_VISIBLE_DEVICES"], uuid, "{record:?}");
}
