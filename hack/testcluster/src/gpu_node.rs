//! A GPU node as the tests run one: a kubelet-lite and the directories its `tessera-agent`
//! works in (checkpoint, a private `/proc`, the simulated machine's shape file), and the
//! agent as a real process when the test wants the binary rather than the library.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::cluster::Cluster;
use crate::node::{LiteNode, NodeOptions};

/// One kubelet-lite node prepared for an agent on a simulated GPU machine.
pub struct GpuNode {
    name: String,
    dir: PathBuf,
    shape_file: PathBuf,
    kubelet: LiteNode,
}

impl GpuNode {
    /// Writes `shape_yaml` (the `hack/gpus` format) to `<root>/<name>/<name>.yaml`, creates
    /// the agent's `state/` and `proc/` beside it, and starts the node's kubelet-lite, which
    /// serves `kubelet.sock` before any plugin registers (the agent may start at once).
    /// Blocks while the kubelet starts: call it from `block_in_place` in async tests.
    pub fn start(
        cluster: &Cluster,
        root: &Path,
        options: NodeOptions,
        shape_yaml: &str,
    ) -> GpuNode {
        let name = options.name.clone();
        let dir = root.join(&name);
        for sub in ["state", "proc"] {
            std::fs::create_dir_all(dir.join(sub)).expect("node directories");
        }
        let shape_file = dir.join(format!("{name}.yaml"));
        std::fs::write(&shape_file, shape_yaml).expect("shape file");
        let kubelet = LiteNode::start(cluster, options);
        GpuNode {
            name,
            dir,
            shape_file,
            kubelet,
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's scratch directory (its log goes here too).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The simulated machine: `--gpu-backend=sim:<this>`.
    pub fn shape_file(&self) -> &Path {
        &self.shape_file
    }

    /// The agent's checkpoint directory; it survives agent restarts.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The `/proc` the agent reads container processes from: empty, since no container
    /// really runs on a kubelet-lite.
    pub fn proc_root(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// The node's kubelet.
    pub fn kubelet(&self) -> &LiteNode {
        &self.kubelet
    }

    /// The node's kubelet, to stop or restart it.
    pub fn kubelet_mut(&mut self) -> &mut LiteNode {
        &mut self.kubelet
    }
}

/// A `tessera-agent` process on a [`GpuNode`]; killed and reaped on drop so a failing test
/// leaves no orphan.
pub struct AgentProcess {
    child: Child,
    log: PathBuf,
}

impl AgentProcess {
    /// Starts `binary run` for `node` with what every test agent needs (node name, the
    /// simulated backend on the node's shape, the kubelet's sockets, the node's checkpoint
    /// and `/proc`) followed by `args` (coordinator, token, metrics, assignment source...),
    /// with `KUBECONFIG=<kubeconfig>` and its log in `<node dir>/agent.log`.
    pub fn start(
        binary: &Path,
        node: &GpuNode,
        kubeconfig: &Path,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> AgentProcess {
        let log = node.dir().join("agent.log");
        let child = Command::new(binary)
            .arg("run")
            .args(["--node-name", node.name()])
            .arg(format!("--gpu-backend=sim:{}", node.shape_file().display()))
            .arg("--device-plugin-dir")
            .arg(node.kubelet().device_plugin_dir())
            .arg("--pod-resources-socket")
            .arg(node.kubelet().pod_resources_socket())
            .arg("--state-dir")
            .arg(node.state_dir())
            .arg("--proc-root")
            .arg(node.proc_root())
            .args(args.into_iter().map(Into::into))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("agent log"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting the agent of {}: {e}", node.name()));
        AgentProcess { child, log }
    }

    /// The agent's log (stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a process that takes a fixed
/// address and prints no bound one (the agent's `--metrics-addr`).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("bound address").port()
}
