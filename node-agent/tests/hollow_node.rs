//! End to end on the development cluster: a real `tessera-agent` process is the device
//! plugin of a hollow node, and a pod bound there with a `tessera.dev/assignment` runs with
//! exactly the assigned GPU and share in its container environment.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{gpu_of, shape};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use tessera_agent::assignments::{ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION};
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::plugin::{ENV_COMPUTE_PERCENT, ENV_MEMORY_LIMIT};
use tessera_devcluster::apiserver::{ApiServer, ApiServerConfig};
use tessera_devcluster::config::{GpuShape, NodeConfig};
use tessera_devcluster::hollow::{HollowNode, HollowNodeConfig};
use tessera_devcluster::kubeconfig;

/// A correctness bound for each wait, not a speed target.
const DEADLINE: Duration = Duration::from_secs(15);
const SHAPE: &str = "l40s-4x-pcie.yaml";
const NODE: &str = "n1";

/// The agent process; killed and reaped on drop so a failing test leaves no orphan.
struct AgentProcess {
    child: Child,
    log: PathBuf,
}

impl AgentProcess {
    fn spawn(dir: &Path, kubeconfig: &Path) -> AgentProcess {
        let log = dir.join("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_tessera-agent"))
            .arg("run")
            .args(["--node-name", NODE])
            .arg("--gpu-backend")
            .arg(format!("sim:{}", shape(SHAPE).display()))
            .arg("--device-plugin-dir")
            .arg(dir.join("dp"))
            .arg("--pod-resources-socket")
            .arg(dir.join("pr/kubelet.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--admin-socket")
            .arg(dir.join("admin.sock"))
            .args(["--metrics-addr", "none", "--coordinator", "none"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        AgentProcess { child, log }
    }

    /// The agent's log so far, for failure messages.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_for<T, F, Fut>(what: &str, agent: &AgentProcess, mut probe: F) -> T
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
            "timed out waiting for {what}; agent log:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assigned_pod_runs_on_hollow_node_with_real_agent_and_gets_its_gpu() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["dp", "pr", "state"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let sim = SimBackend::from_file(shape(SHAPE)).unwrap();
    // Not GPU 0: an agent answering "the first free GPU" must fail this test.
    let uuid = sim.uuid_of(2).unwrap().to_owned();

    // The pieces rather than `DevCluster::start`: the cluster waits for the plugin to
    // register, and the agent needs the API server's address first.
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client =
        kube::Client::try_from(kubeconfig::client_config(&server.url(), None).unwrap()).unwrap();
    let kubeconfig_path = dir.path().join("kubeconfig");
    kubeconfig::write(&kubeconfig_path, &server.url(), None).unwrap();

    let mut node = NodeConfig::new(
        NODE,
        GpuShape {
            count: 4,
            model: "L40S".into(),
            memory_mib: 46068,
            ..GpuShape::default()
        },
    );
    node.device_plugin_dir = Some(dir.path().join("dp"));
    node.pod_resources_dir = Some(dir.path().join("pr"));
    let hollow = tokio::spawn(HollowNode::start(
        client.clone(),
        HollowNodeConfig::from_description(NODE, &node),
    ));
    // Start the agent once the hollow kubelet's sockets exist, as on a real node.
    let kubelet_sock = dir.path().join("dp/kubelet.sock");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !kubelet_sock.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hollow node did not serve kubelet.sock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let agent = AgentProcess::spawn(dir.path(), &kubeconfig_path);
    let hollow = match hollow.await.unwrap() {
        Ok(h) => h,
        Err(e) => panic!("hollow node: {e}; agent log:\n{}", agent.log()),
    };

    let nodes: Api<Node> = Api::all(client.clone());
    let capacity = wait_for("the node's nvidia.com/gpu capacity", &agent, || async {
        let n = nodes.get(NODE).await.ok()?;
        let q = n.status?.capacity?.get("nvidia.com/gpu")?.0.clone();
        (q != "0").then_some(q)
    })
    .await;
    // 4 GPUs, 10 slots each (the agent's default --shares-per-gpu).
    assert_eq!(capacity, "40");

    let assignment = serde_json::json!({"containers": [{"container": "main", "gpus": [
        {"uuid": uuid, "memory_mib": 23034, "compute_milli": 500}]}]});
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "annotations": {
            "tessera.dev/gpu-fraction": "0.5",
            ASSIGNMENT_ANNOTATION: assignment.to_string(),
        }},
        "spec": {"schedulerName": "tessera", "containers": [
            {"name": "main", "image": "cuda",
             "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p", "namespace": "default"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    });
    let _: serde_json::Value = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();

    wait_for("the pod to run", &agent, || async {
        let status = pods.get("p").await.ok()?.status?;
        match status.phase.as_deref() {
            Some("Running") => Some(()),
            Some("Failed") => panic!(
                "the pod failed: {:?} {:?}; agent log:\n{}",
                status.reason,
                status.message,
                agent.log()
            ),
            _ => None,
        }
    })
    .await;

    let records = hollow.containers();
    let record = records
        .iter()
        .find(|r| r.pod == "p" && r.container == "main")
        .unwrap_or_else(|| panic!("no container record for p/main: {records:?}"));
    assert_eq!(record.env["NVIDIA_VISIBLE_DEVICES"], uuid, "{record:?}");
    assert_eq!(record.env[ENV_MEMORY_LIMIT], "23034", "{record:?}");
    assert_eq!(record.env[ENV_COMPUTE_PERCENT], "50", "{record:?}");
    assert_eq!(record.device_ids.len(), 1, "{record:?}");
    assert_eq!(gpu_of(&record.device_ids[0]), uuid, "{record:?}");

    wait_for("the agent to mark the pod allocated", &agent, || async {
        let pod = pods.get("p").await.ok()?;
        pod.metadata
            .annotations?
            .contains_key(ALLOCATED_ANNOTATION)
            .then_some(())
    })
    .await;

    drop(agent);
    hollow.shutdown().await;
    server.shutdown().await;
}
