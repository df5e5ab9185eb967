//! Hollow nodes: registration, the pod lifecycle (Running, Succeeded after the simulated
//! duration, admission failure), and the kubelet's device-plugin calls over a real socket.

mod common;

use std::time::Duration;

use common::{WAIT, pod, start};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::core::Status;
use serde_json::json;
use tessera_devcluster::config::GpuShape;
use tessera_devcluster::hollow::{HollowNode, HollowNodeConfig, SIM_DURATION_ANNOTATION};
use tessera_device_plugin::{
    Device, DeviceList, DeviceProvider, DeviceWatch, PluginConfig, PluginOptions, PluginServer,
    ProviderError, api,
};
use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;

fn node_config(name: &str, gpus: u32) -> HollowNodeConfig {
    HollowNodeConfig {
        name: name.into(),
        labels: [("topology.tessera.dev/rack".to_string(), "r1".to_string())].into(),
        cpu: "16".into(),
        memory: "64Gi".into(),
        pods: 110,
        gpus: GpuShape {
            count: gpus,
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81559,
            mig: Default::default(),
        },
        device_plugin_dir: None,
        device_plugin_timeout: WAIT,
        pod_resources_dir: None,
    }
}

fn gpu_pod(name: &str, gpus: u32, duration: Option<&str>) -> Pod {
    let mut p = pod(name, json!({}));
    let mut value = serde_json::to_value(&p).unwrap();
    value["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": gpus.to_string()}});
    if let Some(d) = duration {
        value["metadata"]["annotations"] = json!({SIM_DURATION_ANNOTATION: d});
    }
    p = serde_json::from_value(value).unwrap();
    p
}

async fn bind(pods: &Api<Pod>, name: &str, node: &str) {
    let binding = json!({"metadata": {"name": name}, "target": {"kind": "Node", "name": node}});
    let _: Status = pods
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn wait_phase(pods: &Api<Pod>, name: &str, phase: &str) -> Pod {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let p = pods.get(name).await.unwrap();
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod {name} never reached {phase}: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn hollow_node_runs_pods_to_completion_and_rejects_oversized_ones() {
    let (server, client) = start().await;
    let node = HollowNode::start(client.clone(), node_config("hollow-1", 2))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let registered = nodes.get("hollow-1").await.unwrap();
    let status = registered.status.unwrap();
    assert_eq!(status.capacity.unwrap()["nvidia.com/gpu"].0, "2");
    assert!(
        status
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    let labels = registered.metadata.labels.unwrap();
    assert_eq!(labels["topology.tessera.dev/rack"], "r1");
    assert_eq!(labels["kubernetes.io/hostname"], "hollow-1");

    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &gpu_pod("short", 1, Some("0.3")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &gpu_pod("forever", 1, None))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &gpu_pod("too-big", 3, None))
        .await
        .unwrap();
    bind(&pods, "short", "hollow-1").await;
    let running = wait_phase(&pods, "short", "Running").await;
    let status = running.status.unwrap();
    assert!(status.pod_ip.is_some());
    assert!(status.container_statuses.unwrap()[0].ready);
    wait_phase(&pods, "short", "Succeeded").await;

    bind(&pods, "forever", "hollow-1").await;
    wait_phase(&pods, "forever", "Running").await;
    bind(&pods, "too-big", "hollow-1").await;
    let failed = wait_phase(&pods, "too-big", "Failed").await.status.unwrap();
    assert_eq!(failed.reason.as_deref(), Some("OutOfnvidia.com/gpu"));
    assert!(
        failed
            .message
            .unwrap()
            .contains("requested: 3, used: 1, capacity: 2")
    );
    assert!(
        node.containers().is_empty(),
        "no device plugin, nothing recorded"
    );
    node.shutdown().await;
    server.shutdown().await;
}

/// A device plugin standing in for tessera-agent (issue 4) over the real device-plugin socket:
/// two GPUs with two share slots each; it steers every allocation to GPU-b's slots, the way
/// the agent steers to the coordinator's assignment, and answers with that GPU's
/// NVIDIA_VISIBLE_DEVICES.
struct TwoGpuPlugin {
    devices: DeviceList,
}

#[tonic::async_trait]
impl DeviceProvider for TwoGpuPlugin {
    fn devices(&self) -> DeviceWatch {
        self.devices.watch()
    }

    fn options(&self) -> PluginOptions {
        PluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }

    async fn preferred_allocation(
        &self,
        request: api::PreferredAllocationRequest,
    ) -> Result<api::PreferredAllocationResponse, ProviderError> {
        let container_responses = request
            .container_requests
            .into_iter()
            .map(|c| api::ContainerPreferredAllocationResponse {
                device_i_ds: c
                    .available_device_i_ds
                    .into_iter()
                    .filter(|id| id.starts_with("GPU-b"))
                    .take(c.allocation_size as usize)
                    .collect(),
            })
            .collect();
        Ok(api::PreferredAllocationResponse {
            container_responses,
        })
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let container_responses = request
            .container_requests
            .into_iter()
            .map(|c| {
                let mut gpus: Vec<String> = c
                    .devices_ids
                    .iter()
                    .map(|id| id[..id.rfind('-').unwrap_or(id.len())].to_string())
                    .collect();
                gpus.dedup();
                api::ContainerAllocateResponse {
                    envs: [("NVIDIA_VISIBLE_DEVICES".to_string(), gpus.join(","))].into(),
                    ..Default::default()
                }
            })
            .collect();
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

#[tokio::test]
async fn hollow_node_calls_the_device_plugin_per_container() {
    let (server, client) = start().await;
    let dir = tempfile::tempdir().unwrap();
    let devices = DeviceList::new(
        ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1"]
            .into_iter()
            .map(Device::healthy)
            .collect(),
    );
    let plugin = PluginServer::new(
        PluginConfig::new("nvidia.com/gpu")
            .unwrap()
            .with_socket_dir(dir.path()),
        TwoGpuPlugin { devices },
    );
    let (stop_plugin, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin_task = tokio::spawn(plugin.run(async move {
        let _ = stopped.await;
    }));

    // Two pods already bound before the node starts are admitted oldest first (the kubelet's
    // order), whatever their names.
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for name in ["zz-older", "aa-newer"] {
        pods.create(&PostParams::default(), &gpu_pod(name, 1, None))
            .await
            .unwrap();
        bind(&pods, name, "hollow-dp").await;
        if name == "zz-older" {
            // creationTimestamp has one-second resolution.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }

    let mut config = node_config("hollow-dp", 0);
    config.device_plugin_dir = Some(dir.path().to_path_buf());
    let pod_resources_dir = tempfile::tempdir().unwrap();
    config.pod_resources_dir = Some(pod_resources_dir.path().to_path_buf());
    let node = HollowNode::start(client.clone(), config).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let capacity = nodes
        .get("hollow-dp")
        .await
        .unwrap()
        .status
        .unwrap()
        .capacity
        .unwrap();
    assert_eq!(
        capacity["nvidia.com/gpu"].0, "4",
        "capacity comes from the plugin's healthy slots"
    );

    wait_phase(&pods, "aa-newer", "Running").await;
    let early: Vec<String> = node.containers().iter().map(|r| r.pod.clone()).collect();
    assert_eq!(early, ["zz-older", "aa-newer"]);
    // Free their slots again.
    pods.delete("zz-older", &Default::default()).await.unwrap();
    pods.delete("aa-newer", &Default::default()).await.unwrap();

    let mut two = serde_json::to_value(gpu_pod("two-containers", 1, None)).unwrap();
    let second = json!({"name": "sidecar", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}});
    value_push(&mut two["spec"]["containers"], second);
    let two: Pod = serde_json::from_value(two).unwrap();
    pods.create(&PostParams::default(), &two).await.unwrap();
    bind(&pods, "two-containers", "hollow-dp").await;
    wait_phase(&pods, "two-containers", "Running").await;

    let records: Vec<_> = node
        .containers()
        .into_iter()
        .filter(|r| r.pod == "two-containers")
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0].container, "main");
    assert_eq!(records[1].container, "sidecar");
    for record in &records {
        assert_eq!(record.env["NVIDIA_VISIBLE_DEVICES"], "GPU-b", "{record:?}");
        assert_eq!(record.device_ids.len(), 1);
    }
    assert_ne!(
        records[0].device_ids, records[1].device_ids,
        "slots are not handed out twice"
    );

    // The pod-resources API reports the same holdings, as the kubelet's does.
    let channel =
        tessera_device_plugin::uds::connect(pod_resources_dir.path().join("kubelet.sock"))
            .await
            .unwrap();
    let mut lister = PodResourcesListerClient::new(channel);
    let listed = lister
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    let two = listed.iter().find(|p| p.name == "two-containers").unwrap();
    let held: Vec<(String, Vec<String>)> = two
        .containers
        .iter()
        .map(|c| (c.name.clone(), c.devices[0].device_ids.clone()))
        .collect();
    assert_eq!(
        held,
        records
            .iter()
            .map(|r| (r.container.clone(), r.device_ids.clone()))
            .collect::<Vec<_>>()
    );
    let allocatable = lister
        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocatable.devices[0].device_ids.len(), 4);

    // GPU-b's slots are taken: the next pod gets what the kubelet has left (GPU-a).
    pods.create(&PostParams::default(), &gpu_pod("third", 1, None))
        .await
        .unwrap();
    bind(&pods, "third", "hollow-dp").await;
    wait_phase(&pods, "third", "Running").await;
    let third = node
        .containers()
        .into_iter()
        .find(|r| r.pod == "third")
        .unwrap();
    assert_eq!(third.env["NVIDIA_VISIBLE_DEVICES"], "GPU-a");

    // A kubelet restart: the plugin registers again, the running pods are neither
    // allocated again nor forgotten (the checkpoint), and the next pod gets the one slot
    // left rather than one a running container holds.
    let before = node.containers();
    node.restart_kubelet().await.unwrap();
    assert_eq!(
        node.containers(),
        before,
        "running pods were allocated again"
    );
    let channel =
        tessera_device_plugin::uds::connect(pod_resources_dir.path().join("kubelet.sock"))
            .await
            .unwrap();
    let listed = PodResourcesListerClient::new(channel)
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    let mut names: Vec<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["third", "two-containers"]);
    pods.create(&PostParams::default(), &gpu_pod("after-restart", 1, None))
        .await
        .unwrap();
    bind(&pods, "after-restart", "hollow-dp").await;
    wait_phase(&pods, "after-restart", "Running").await;
    let held: Vec<String> = node
        .containers()
        .into_iter()
        .flat_map(|r| {
            if r.pod == "zz-older" || r.pod == "aa-newer" {
                vec![]
            } else {
                r.device_ids
            }
        })
        .collect();
    let distinct: std::collections::BTreeSet<&String> = held.iter().collect();
    assert_eq!(
        distinct.len(),
        4,
        "a held slot was handed out again: {held:?}"
    );

    node.shutdown().await;
    let _ = stop_plugin.send(());
    let _ = plugin_task.await;
    server.shutdown().await;
}

fn value_push(list: &mut serde_json::Value, item: serde_json::Value) {
    if let serde_json::Value::Array(items) = list {
        items.push(item);
    }
}

#[tokio::test]
async fn dev_cluster_starts_server_and_nodes_in_one_call() {
    use tessera_devcluster::cluster::DevCluster;
    use tessera_devcluster::config::{ClusterConfig, NodeConfig};
    let config = ClusterConfig {
        token: Some("t0ken".into()),
        nodes: vec![NodeConfig::new(
            "solo",
            GpuShape {
                count: 1,
                ..GpuShape::default()
            },
        )],
    };
    let cluster = DevCluster::start(&config, 0).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(cluster.client());
    pods.create(&PostParams::default(), &gpu_pod("job", 1, Some("0.2")))
        .await
        .unwrap();
    bind(&pods, "job", "solo").await;
    wait_phase(&pods, "job", "Succeeded").await;
    assert!(cluster.node("solo").is_some());
    let dir = tempfile::tempdir().unwrap();
    cluster.write_kubeconfig(&dir.path().join("kc")).unwrap();
    let written = std::fs::read_to_string(dir.path().join("kc")).unwrap();
    assert!(written.contains(&cluster.url()) && written.contains("t0ken"));
    cluster.shutdown().await;
}
