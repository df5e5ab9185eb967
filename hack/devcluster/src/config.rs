//! The cluster description file for `tessera-devcluster up --config FILE`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole development cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// Bearer token clients must present; none means no authentication.
    #[serde(default)]
    pub token: Option<String>,
    /// Hollow nodes to start.
    #[serde(default = "default_nodes")]
    pub nodes: Vec<NodeConfig>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            token: None,
            nodes: default_nodes(),
        }
    }
}

/// One hollow node entry (or several, with `replicas`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Node name; with `replicas` > 1 the nodes are `<name>-0`, `<name>-1`, ...
    pub name: String,
    /// How many identical nodes this entry describes.
    #[serde(default = "one")]
    pub replicas: u32,
    /// Extra node labels (topology levels, pools).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// CPU capacity (a Kubernetes quantity).
    #[serde(default = "default_cpu")]
    pub cpu: String,
    /// Memory capacity (a Kubernetes quantity).
    #[serde(default = "default_memory")]
    pub memory: String,
    /// Pod capacity.
    #[serde(default = "default_pods")]
    pub pods: u32,
    /// GPUs of the node, inline.
    #[serde(default)]
    pub gpus: GpuShape,
    /// A simulated GPU shape file (`hack/gpus/*.yaml`, relative to this description); when
    /// set it replaces `gpus`.
    #[serde(default)]
    pub gpu_file: Option<PathBuf>,
    /// Device-plugin directory where a real `tessera-agent` (sim backend) registers for this
    /// node; the hollow node then plays the kubelet's device-plugin calls against it and takes
    /// the node's `nvidia.com/gpu` capacity from it.
    #[serde(default)]
    pub device_plugin_dir: Option<PathBuf>,
    /// Directory in which the hollow kubelet serves the pod-resources API for that agent.
    #[serde(default)]
    pub pod_resources_dir: Option<PathBuf>,
}

impl NodeConfig {
    /// One node with `gpus` and the default CPU, memory and pod capacity.
    pub fn new(name: &str, gpus: GpuShape) -> Self {
        Self {
            name: name.into(),
            replicas: 1,
            labels: BTreeMap::new(),
            cpu: default_cpu(),
            memory: default_memory(),
            pods: default_pods(),
            gpus,
            gpu_file: None,
            device_plugin_dir: None,
            pod_resources_dir: None,
        }
    }
}

/// The GPUs of one node, inline.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuShape {
    /// Number of GPUs.
    pub count: u32,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default = "default_model")]
    pub model: String,
    /// Memory per GPU in MiB.
    #[serde(default = "default_gpu_memory")]
    pub memory_mib: u64,
    /// MIG devices by profile (`3g.20gb` → 2), advertised as `nvidia.com/mig-<profile>`.
    #[serde(default)]
    pub mig: BTreeMap<String, u32>,
}

impl Default for GpuShape {
    fn default() -> Self {
        Self {
            count: 4,
            model: default_model(),
            memory_mib: default_gpu_memory(),
            mig: BTreeMap::new(),
        }
    }
}

fn one() -> u32 {
    1
}
fn default_cpu() -> String {
    "32".into()
}
fn default_memory() -> String {
    "256Gi".into()
}
fn default_pods() -> u32 {
    110
}
fn default_model() -> String {
    "NVIDIA A100-SXM4-80GB".into()
}
fn default_gpu_memory() -> u64 {
    81920
}

fn default_nodes() -> Vec<NodeConfig> {
    (1..=2)
        .map(|i| NodeConfig::new(&format!("gpu-node-{i}"), GpuShape::default()))
        .collect()
}

/// Errors reading the description.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read cluster description {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The YAML does not match the expected shape.
    #[error(
        "cluster description {path} is invalid: {source} (expected: token?, nodes: [{{name, replicas?, labels?, cpu?, memory?, pods?, gpus: {{count, model?, memoryMib?}}}}])"
    )]
    Parse {
        /// The file.
        path: String,
        /// Cause.
        source: serde_yaml_ng::Error,
    },
    /// A GPU shape file could not be used.
    #[error("cluster description {path}: gpuFile {file}: {message}")]
    GpuFile {
        /// The description.
        path: String,
        /// The shape file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// Two nodes share a name.
    #[error("cluster description {path}: node name {name:?} appears twice")]
    DuplicateNode {
        /// The file.
        path: String,
        /// The repeated name.
        name: String,
    },
}

impl ClusterConfig {
    /// Reads and checks a description file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut config: Self =
            serde_yaml_ng::from_str(&text).map_err(|source| ConfigError::Parse {
                path: shown.clone(),
                source,
            })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for node in &mut config.nodes {
            if let Some(file) = &node.gpu_file {
                let file = base.join(file);
                node.gpus = crate::shape::load(&file).map_err(|message| ConfigError::GpuFile {
                    path: shown.clone(),
                    file: file.display().to_string(),
                    message,
                })?;
            }
            if let Some(dir) = &node.device_plugin_dir {
                node.device_plugin_dir = Some(base.join(dir));
            }
            if let Some(dir) = &node.pod_resources_dir {
                node.pod_resources_dir = Some(base.join(dir));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for name in config.node_names() {
            if !seen.insert(name.clone()) {
                return Err(ConfigError::DuplicateNode { path: shown, name });
            }
        }
        Ok(config)
    }

    /// Every node, replicas expanded, with its final name.
    pub fn expanded_nodes(&self) -> Vec<(String, &NodeConfig)> {
        self.nodes
            .iter()
            .flat_map(|node| {
                (0..node.replicas).map(move |i| {
                    let name = if node.replicas == 1 {
                        node.name.clone()
                    } else {
                        format!("{}-{i}", node.name)
                    };
                    (name, node)
                })
            })
            .collect()
    }

    fn node_names(&self) -> Vec<String> {
        self.expanded_nodes().into_iter().map(|(n, _)| n).collect()
    }
}
