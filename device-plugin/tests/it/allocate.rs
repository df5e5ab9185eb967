//! Allocate, GetPreferredAllocation and PreStartContainer round trips, and how
//! failures reach the kubelet.

use crate::common;

use common::{RESOURCE, WAIT, start_slot_plugin};
use tessera_device_plugin::testing::FakeKubelet;
use tessera_device_plugin::{Health, api};
use tonic::Code;

#[tokio::test]
async fn allocate_round_trip_and_error_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, devices) = start_slot_plugin(dir.path());
    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();

    let response = connection
        .allocate_one(&["gpu0-1", "gpu1-0"])
        .await
        .unwrap();
    assert_eq!(response.envs["EXAMPLE_DEVICES"], "gpu0-1,gpu1-0");
    let cdi: Vec<_> = response
        .cdi_devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(cdi, ["example.com/gpu=gpu0-1", "example.com/gpu=gpu1-0"]);

    // Two containers in one request get two responses, in order.
    let request = api::AllocateRequest {
        container_requests: vec![
            api::ContainerAllocateRequest {
                devices_ids: vec!["gpu0-0".into()],
            },
            api::ContainerAllocateRequest {
                devices_ids: vec!["gpu1-3".into()],
            },
        ],
    };
    let both = connection.allocate(request).await.unwrap();
    let envs: Vec<_> = both
        .container_responses
        .iter()
        .map(|c| c.envs["EXAMPLE_DEVICES"].as_str())
        .collect();
    assert_eq!(envs, ["gpu0-0", "gpu1-3"]);

    // Unknown ids are named, and nothing reaches the provider.
    let unknown = connection
        .allocate_one(&["gpu0-0", "gpu7-0"])
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert!(
        unknown.message().starts_with(RESOURCE),
        "{}",
        unknown.message()
    );
    assert!(
        unknown.message().contains("\"gpu7-0\""),
        "{}",
        unknown.message()
    );
    assert!(
        !unknown.message().contains("\"gpu0-0\""),
        "{}",
        unknown.message()
    );

    // Provider errors keep their meaning.
    devices.set_health("gpu0-2", Health::Unhealthy);
    let sick = connection.allocate_one(&["gpu0-2"]).await.unwrap_err();
    assert_eq!(sick.code(), Code::FailedPrecondition);
    assert!(sick.message().contains("unhealthy"), "{}", sick.message());
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn preferred_allocation_and_pre_start() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());
    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();

    let preferred = connection
        .preferred_allocation(&["gpu1-1", "gpu0-3", "gpu1-0"], &["gpu1-1"], 2)
        .await
        .unwrap();
    assert_eq!(preferred, ["gpu1-1", "gpu0-3"]);
    let unknown = connection
        .preferred_allocation(&["gpu0-0", "nope"], &[], 1)
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert!(unknown.message().contains("nope"));

    connection.pre_start(&["gpu0-0"]).await.unwrap();
    let empty = connection.pre_start(&[]).await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert!(empty.message().contains("no devices to prepare"));
    plugin.stop().await.unwrap();
}
