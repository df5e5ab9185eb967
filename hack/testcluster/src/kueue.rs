//! Kueue in front of a test cluster: `kueue-peer` (hack/kueue), Kueue's own controller with
//! its batch/Job integration and Job webhook, run against a [`Cluster`].

use std::process::{Child, ChildStdin, Command};

use crate::binary::kueue_peer;
use crate::cluster::{Cluster, spawn_logged, tail, wait_started};

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
        let mut cmd = Command::new(peer);
        cmd.arg("--kubeconfig")
            .arg(cluster.admin_kubeconfig())
            .arg("--dir")
            .arg(dir.path())
            .arg("--exit-with-stdin");
        let (mut child, stdin) = spawn_logged(&mut cmd, &log);
        let ready = dir.path().join("ready");
        wait_started(&mut child, &log, "kueue-peer", || {
            ready.exists().then_some(())
        });
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
