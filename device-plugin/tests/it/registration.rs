//! Registration with the kubelet: request contents, initial device list, a kubelet
//! that appears late, a rejected registration, stale sockets and several resources.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use common::{RESOURCE, RunningPlugin, SlotProvider, WAIT, config, start_slot_plugin};
use tessera_device_plugin::testing::FakeKubelet;
use tessera_device_plugin::{Backoff, PluginConfig, PluginServer, run_all};

#[tokio::test]
async fn registers_with_version_resource_endpoint_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());

    let registrations = kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    let request = &registrations[0];
    assert_eq!(request.version, "v1beta1");
    assert_eq!(request.resource_name, RESOURCE);
    assert_eq!(request.endpoint, "tessera-example.com_gpu.sock");
    let options = request.options.unwrap();
    assert!(options.pre_start_required);
    assert!(options.get_preferred_allocation_available);

    // The endpoint names a socket the kubelet can dial, and it reports the same options.
    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    assert_eq!(connection.socket_path(), dir.path().join(&request.endpoint));
    assert_eq!(connection.options().await.unwrap(), options);
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn initial_device_list_is_sent_first() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());

    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    let devices = connection
        .devices()
        .wait_until(|d| !d.is_empty(), WAIT)
        .await
        .unwrap();
    let ids: Vec<_> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "gpu0-0", "gpu0-1", "gpu0-2", "gpu0-3", "gpu1-0", "gpu1-1", "gpu1-2", "gpu1-3"
        ]
    );
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    let numa = devices[0].topology.as_ref().unwrap();
    assert_eq!(numa.nodes[0].id, 0);
    assert_eq!(connection.devices().updates(), 1);
    plugin.stop().await.unwrap();
}

#[tokio::test]
async fn kubelet_absent_at_start_then_appearing() {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());

    // The plugin serves before it can register.
    let socket = config(dir.path()).socket_path();
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        socket.exists(),
        "plugin socket is served while the kubelet is absent"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let registrations = kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    assert_eq!(registrations.len(), 1);
    assert_eq!(registrations[0].resource_name, RESOURCE);
    kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    plugin.stop().await.unwrap();
}

/// Log lines written while a test runs (the current-thread runtime keeps every task on the
/// thread the subscriber is set for).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn rejected_registration_is_retried_with_backoff() {
    let logs = Logs::default();
    let writer = logs.clone();
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    kubelet.reject_registrations(Some((tonic::Code::Unavailable, "device manager not ready")));
    let backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(80),
    };
    let server = PluginServer::new(
        config(dir.path()).with_backoff(backoff),
        SlotProvider::new(),
    );
    let plugin = RunningPlugin::start(server);

    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(kubelet.registrations().is_empty());
    kubelet.reject_registrations(None);
    kubelet.wait_for_registrations(1, WAIT).await.unwrap();
    plugin.stop().await.unwrap();
    // Several refusals with one cause: one warning naming it, the repeats at debug level.
    let text = logs.text();
    let warned = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("Register failed"))
        .count();
    let repeated = text
        .lines()
        .filter(|l| l.contains("DEBUG") && l.contains("Register failed again"))
        .count();
    assert_eq!(warned, 1, "{text}");
    assert!(repeated >= 1, "{text}");
    assert!(text.contains("device manager not ready"), "{text}");
}

#[tokio::test]
async fn stale_socket_is_replaced_and_removed_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let socket = config(dir.path()).socket_path();
    // A socket left behind by a crashed predecessor: bound, then abandoned.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());

    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let (plugin, _devices) = start_slot_plugin(dir.path());
    kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    plugin.stop().await.unwrap();
    assert!(!socket.exists(), "socket removed on shutdown");
}

#[tokio::test]
async fn a_regular_file_in_the_way_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let socket = config(dir.path()).socket_path();
    std::fs::write(&socket, b"precious").unwrap();
    let server = PluginServer::new(config(dir.path()), SlotProvider::new());
    let error = server.run(std::future::pending()).await.unwrap_err();
    assert!(error.to_string().contains("not a socket"), "{error}");
    assert_eq!(std::fs::read(&socket).unwrap(), b"precious");
}

#[tokio::test]
async fn several_resources_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let servers = ["example.com/gpu", "example.com/mig-1g.10gb"]
        .into_iter()
        .map(|name| {
            let config = PluginConfig::new(name).unwrap().with_socket_dir(dir.path());
            PluginServer::new(config, SlotProvider::new())
        })
        .collect();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let all = tokio::spawn(run_all(servers, async move {
        let _ = stopped.await;
    }));

    let registrations = kubelet.wait_for_registrations(2, WAIT).await.unwrap();
    let mut names: Vec<_> = registrations
        .iter()
        .map(|r| r.resource_name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["example.com/gpu", "example.com/mig-1g.10gb"]);
    let mig = kubelet
        .wait_for_plugin("example.com/mig-1g.10gb", WAIT)
        .await
        .unwrap();
    mig.devices()
        .wait_until(|d| d.len() == 8, WAIT)
        .await
        .unwrap();

    stop.send(()).unwrap();
    tokio::time::timeout(WAIT, all)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let leftover: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(leftover, ["kubelet.sock"]);
}

#[tokio::test]
async fn a_missing_directory_is_reported_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("device-plugins");
    let server = PluginServer::new(config(&missing), SlotProvider::new());
    let error = server.run(std::future::pending()).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("device-plugins"), "{message}");
    assert!(message.contains("does not exist"), "{message}");
}
