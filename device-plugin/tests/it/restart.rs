//! A kubelet restart is noticed and the plugin serves and registers again.

use crate::common;

use std::time::Duration;

use common::{RESOURCE, WAIT, start_slot_plugin};
use tessera_device_plugin::testing::FakeKubelet;

/// Correctness deadline from the new kubelet socket appearing to a new registration:
/// one 200 ms poll plus a re-serve and a Register call.
const REREGISTER_DEADLINE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn kubelet_restart_reregisters_within_one_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());
    kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();

    for _ in 0..2 {
        kubelet.restart().await.unwrap();
        let registrations = kubelet
            .wait_for_registrations(1, REREGISTER_DEADLINE)
            .await
            .unwrap();
        assert_eq!(registrations[0].resource_name, RESOURCE);
        // The new registration points at a socket that serves again.
        let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
        connection
            .devices()
            .wait_until(|d| d.len() == 8, WAIT)
            .await
            .unwrap();
        connection.allocate_one(&["gpu0-0"]).await.unwrap();
    }
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn recreated_kubelet_socket_alone_triggers_reregistration() {
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());
    kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();

    kubelet.restart_keeping_plugin_sockets().await.unwrap();
    kubelet
        .wait_for_registrations(1, REREGISTER_DEADLINE)
        .await
        .unwrap();
    kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn deleted_plugin_socket_is_served_again() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());
    let first = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();

    std::fs::remove_file(first.socket_path()).unwrap();
    // The plugin notices, binds a new socket and registers again with the same kubelet.
    kubelet
        .wait_for_registrations(2, REREGISTER_DEADLINE)
        .await
        .unwrap();
    assert!(first.socket_path().exists());
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn new_kubelet_cuts_a_long_backoff_short() {
    let dir = tempfile::tempdir().unwrap();
    // A dead kubelet's socket: present, nobody listening, so Register fails.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("kubelet.sock")).unwrap());
    let backoff = tessera_device_plugin::Backoff {
        initial: Duration::from_secs(30),
        max: Duration::from_secs(30),
    };
    let server = tessera_device_plugin::PluginServer::new(
        common::config(dir.path()).with_backoff(backoff),
        common::SlotProvider::new(),
    );
    let plugin = common::RunningPlugin::start(server);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    kubelet
        .wait_for_registrations(1, REREGISTER_DEADLINE)
        .await
        .unwrap();
    plugin.stop().await.unwrap();
}
