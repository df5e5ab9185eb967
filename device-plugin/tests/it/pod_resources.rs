//! The fake pod-resources endpoint answers a real client over its socket.

use tessera_device_plugin::testing::{FakePodResources, pod_with_devices};
use tessera_device_plugin::uds;
use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use tonic::Code;

#[tokio::test]
async fn list_and_get_report_the_configured_pods() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakePodResources::start(&dir.path().join("kubelet.sock"))
        .await
        .unwrap();
    fake.set_pods(vec![pod_with_devices(
        "ml",
        "trainer-0",
        "main",
        "nvidia.com/gpu",
        &["GPU-a-0", "GPU-a-1"],
    )]);
    let channel = uds::connect(fake.socket_path().to_path_buf())
        .await
        .unwrap();
    let mut client = PodResourcesListerClient::new(channel);

    let list = client
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let devices = &list.pod_resources[0].containers[0].devices[0];
    assert_eq!(devices.device_ids, ["GPU-a-0", "GPU-a-1"]);

    let get = client
        .get(pr::GetPodResourcesRequest {
            pod_name: "trainer-0".into(),
            pod_namespace: "ml".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(get.pod_resources.unwrap().name, "trainer-0");

    let missing = client
        .get(pr::GetPodResourcesRequest {
            pod_name: "nope".into(),
            pod_namespace: "ml".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(missing.message().contains("ml/nope"));
    fake.stop().await;
}
