//! kubelet-lite nodes: the kubelet's device manager, Topology Manager and admission in one
//! process per node, under the node's own `system:node:<name>` identity.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::binary::kube_peer;
use crate::cluster::{Cluster, tail};

/// How a node is registered.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Node name.
    pub name: String,
    /// Node labels (besides `kubernetes.io/hostname`, `os`, `arch`).
    pub labels: BTreeMap<String, String>,
    /// Taints to register with, as `key[=value]:Effect`.
    pub taints: Vec<String>,
    /// Static capacity besides the device plugins' (`cpu`, `memory`, `pods`, ...).
    pub capacity: BTreeMap<String, String>,
    /// NUMA nodes the Topology Manager sees.
    pub numa_nodes: u32,
    /// Topology Manager policy: `none`, `best-effort`, `restricted`, `single-numa-node`.
    pub topology_policy: String,
}

impl NodeOptions {
    /// A node named `name` with the kubelet's defaults (one NUMA node, policy `none`).
    pub fn new(name: &str) -> NodeOptions {
        NodeOptions {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            capacity: BTreeMap::new(),
            numa_nodes: 1,
            topology_policy: "none".into(),
        }
    }
}

/// What the device manager gave one container, as kubelet-lite recorded it.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// Container name.
    pub container: String,
    /// An init container.
    pub init: bool,
    /// Environment from the device plugins' Allocate answers.
    pub env: BTreeMap<String, String>,
    /// Device nodes (`host:container:permissions`).
    #[serde(default)]
    pub devices: Option<Vec<String>>,
    /// Mounts (`host:container`).
    #[serde(default)]
    pub mounts: Option<Vec<String>>,
    /// Runtime annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// CDI device names.
    #[serde(default)]
    pub cdi_devices: Option<Vec<String>>,
    /// Device IDs the device manager allocated, by resource name.
    #[serde(default)]
    pub device_ids: BTreeMap<String, Vec<String>>,
}

impl ContainerRecord {
    /// The device IDs allocated for `resource` (empty when none).
    pub fn devices_of(&self, resource: &str) -> &[String] {
        self.device_ids.get(resource).map_or(&[], Vec::as_slice)
    }
}

/// A running kubelet-lite.
pub struct LiteNode {
    options: NodeOptions,
    cluster_dir: PathBuf,
    root: PathBuf,
    child: Option<(Child, ChildStdin)>,
    incarnation: u32,
}

impl LiteNode {
    /// Starts node `options.name` against `cluster`; its state lives under the cluster directory.
    pub fn start(cluster: &Cluster, options: NodeOptions) -> LiteNode {
        let root = cluster.dir().join("nodes").join(&options.name);
        std::fs::create_dir_all(&root).expect("node directory");
        let mut node = LiteNode {
            options,
            cluster_dir: cluster.dir().to_owned(),
            root,
            child: None,
            incarnation: 0,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let peer = kube_peer().unwrap_or_else(|e| panic!("{e}"));
        self.incarnation += 1;
        let log = self.log_path();
        let out = File::create(&log).expect("node log");
        let o = &self.options;
        let mut cmd = Command::new(peer);
        cmd.args(["node", "--exit-with-stdin", "--name", &o.name, "--root"])
            .arg(&self.root)
            .arg("--cluster-dir")
            .arg(&self.cluster_dir)
            .arg(format!("--numa-nodes={}", o.numa_nodes))
            .arg(format!("--topology-manager-policy={}", o.topology_policy));
        if !o.labels.is_empty() {
            cmd.arg(format!("--labels={}", join(&o.labels)));
        }
        if !o.capacity.is_empty() {
            cmd.arg(format!("--capacity={}", join(&o.capacity)));
        }
        for t in &o.taints {
            cmd.arg(format!("--taint={t}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting kubelet-lite {}: {e}", o.name));
        let stdin = child.stdin.take().expect("piped stdin");
        // Ready when it serves kubelet.sock (the device manager's registration socket).
        let sock = self.device_plugin_dir().join("kubelet.sock");
        let deadline = std::time::Instant::now() + crate::DEADLINE;
        while !sock.exists() || !self.log().contains("ready") {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "kubelet-lite {} exited with {status}:\n{}",
                    o.name,
                    self.log()
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "kubelet-lite {} did not start:\n{}",
                o.name,
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.child = Some((child, stdin));
    }

    fn log_path(&self) -> PathBuf {
        self.root.join(format!("kubelet-{}.log", self.incarnation))
    }

    /// This incarnation's log.
    pub fn log(&self) -> String {
        tail(&self.log_path())
    }

    /// Node name.
    pub fn name(&self) -> &str {
        &self.options.name
    }

    /// The device-plugin directory (`--device-plugin-dir` of an agent on this node).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.root.join("device-plugins")
    }

    /// The pod-resources socket (`--pod-resources-socket` of an agent on this node).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root.join("pod-resources/kubelet.sock")
    }

    /// The node's state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every container this node started (any incarnation), in file-name order.
    pub fn containers(&self) -> Vec<ContainerRecord> {
        let mut out = Vec::new();
        let Ok(dir) = std::fs::read_dir(self.root.join("containers")) else {
            return out;
        };
        let mut paths: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if let Ok(text) = std::fs::read_to_string(&p)
                && let Ok(r) = serde_json::from_str(&text)
            {
                out.push(r);
            }
        }
        out
    }

    /// What container `container` of pod `namespace/pod` was given, if it started.
    pub fn container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Option<ContainerRecord> {
        self.containers()
            .into_iter()
            .find(|c| c.namespace == namespace && c.pod == pod && c.container == container)
    }

    /// Stops the node as a kubelet stops (SIGTERM): the device manager removes its socket,
    /// the checkpoint stays.
    pub fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            // SIGTERM (not SIGKILL) so the device manager runs its shutdown; `kill` keeps this
            // crate free of unsafe signal calls.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// A kubelet restart: stop, then start again on the same state directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for LiteNode {
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn join(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
