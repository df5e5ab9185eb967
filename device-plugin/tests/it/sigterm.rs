//! SIGTERM stops a real plugin process and removes its socket.
//!
//! The child process is this test binary itself, re-executed to run only
//! `child_plugin_process` with `TESSERA_DP_CHILD_DIR` set; without that variable the
//! child test returns at once, so it is harmless when run as a normal test.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{RESOURCE, SlotProvider, WAIT, config};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tessera_device_plugin::PluginServer;
use tessera_device_plugin::testing::FakeKubelet;

const CHILD_DIR_VAR: &str = "TESSERA_DP_CHILD_DIR";

#[tokio::test]
async fn child_plugin_process() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return;
    };
    let server = PluginServer::new(config(dir.as_ref()), SlotProvider::new());
    server.run_until_signal().await.unwrap();
}

/// Kills the child if the test fails before it exits on its own.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn sigterm_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path()).await.unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sigterm::child_plugin_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_VAR, dir.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);

    let connection = kubelet.wait_for_plugin(RESOURCE, WAIT).await.unwrap();
    let socket = connection.socket_path().to_path_buf();
    assert!(socket.exists());

    let pid = Pid::from_raw(i32::try_from(child.0.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let status = child.0.wait();
        (child, status)
    });
    let (_child, status) = tokio::time::timeout(WAIT, status).await.unwrap().unwrap();
    assert!(status.unwrap().success(), "plugin exits cleanly on SIGTERM");
    assert!(!socket.exists(), "socket removed on SIGTERM");
    connection
        .devices()
        .wait_ended(Duration::from_secs(1))
        .await
        .unwrap();
}
