//! Device-list changes are broadcast to every open ListAndWatch stream.

use crate::common;

use std::time::Duration;

use common::{RESOURCE, WAIT, start_slot_plugin};
use tessera_device_plugin::testing::FakeKubelet;
use tessera_device_plugin::{Device, Health};

/// Correctness deadline for a change to show up on a stream (not a speed measure:
/// the broadcast is one in-process channel send plus one gRPC message).
const BROADCAST_DEADLINE: Duration = Duration::from_millis(100);

#[tokio::test]
async fn health_change_reaches_two_concurrent_streams_within_100ms() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, devices) = start_slot_plugin(dir.path());
    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    let first = connection.devices();
    let second = connection.open_list_and_watch().await.unwrap();
    for stream in [first, &second] {
        stream.wait_until(|d| d.len() == 8, WAIT).await.unwrap();
    }

    assert!(devices.set_health("gpu1-2", Health::Unhealthy));
    let sick = |d: &[tessera_device_plugin::api::Device]| {
        d.iter()
            .any(|d| d.id == "gpu1-2" && d.health == "Unhealthy")
    };
    let (a, b) = tokio::join!(
        first.wait_until(sick, BROADCAST_DEADLINE),
        second.wait_until(sick, BROADCAST_DEADLINE)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "both streams carry the same full list");
    assert_eq!(a.iter().filter(|d| d.health == "Unhealthy").count(), 1);

    // Recovery travels the same way.
    devices.set_health("gpu1-2", Health::Healthy);
    let healthy =
        |d: &[tessera_device_plugin::api::Device]| d.iter().all(|d| d.health == "Healthy");
    first.wait_until(healthy, BROADCAST_DEADLINE).await.unwrap();
    second
        .wait_until(healthy, BROADCAST_DEADLINE)
        .await
        .unwrap();
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn device_count_changes_are_broadcast() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, devices) = start_slot_plugin(dir.path());
    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    connection
        .devices()
        .wait_until(|d| d.len() == 8, WAIT)
        .await
        .unwrap();

    devices.replace(vec![Device::healthy("gpu0-0"), Device::healthy("gpu0-1")]);
    let list = connection
        .devices()
        .wait_until(|d| d.len() == 2, WAIT)
        .await
        .unwrap();
    assert_eq!(list[1].id, "gpu0-1");
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn streams_end_when_the_plugin_stops() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());
    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    connection
        .devices()
        .wait_until(|d| !d.is_empty(), WAIT)
        .await
        .unwrap();

    plugin.stop().await.unwrap();
    connection.devices().wait_ended(WAIT).await.unwrap();
}
