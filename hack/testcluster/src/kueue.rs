//! Kueue in front of a test cluster: `kueue-peer` (hack/kueue), Kueue's own controller with
//! its batch/Job integration and Job webhook, run against a [`Cluster`].

use std::fs::File;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::binary::kueue_peer;
use crate::cluster::{Cluster, tail};

/// A running Kueue controller. Dropping it stops it.
pub struct Kueue {
    dir: tempfile::TempDir,
    child: Child,
    _stdin: ChildStdin,
}

impl Kueue {
    /// Starts Kueue against `cluster` (as its admin) and waits until its CRDs are installed,
    /// its caches synced and its Job webhook registered. Panics with its log if it does not
    /// come up: a test cannot run without it.
    pub fn start(cluster: &Cluster) -> Kueue {
        let peer = kueue_peer().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("kueue-peer-")
            .tempdir()
            .expect("temporary directory");
        let log = dir.path().join("kueue.log");
        let out = File::create(&log).expect("kueue log");
        let mut child = Command::new(peer)
            .arg("--kubeconfig")
            .arg(cluster.admin_kubeconfig())
            .arg("--dir")
            .arg(dir.path())
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", peer.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let ready = dir.path().join("ready");
        let deadline = Instant::now() + Duration::from_secs(180);
        while !ready.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("kueue-peer exited with {status}:\n{}", tail(&log));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("Kueue was not ready within 180 s:\n{}", tail(&log));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Kueue {
            dir,
            child,
            _stdin: stdin,
        }
    }

    /// The last lines of Kueue's log, for a failing test's picture.
    pub fn logs(&self) -> String {
        tail(&self.dir.path().join("kueue.log"))
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
