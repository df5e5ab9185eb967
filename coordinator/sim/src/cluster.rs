//! The simulator's static inputs: nodes with their tie-break order, GPU model ids, and pods
//! reduced to the resource shape that placement sees.

use std::collections::HashMap;

use tessera_core::placement::frag::{ModelSet, TaskShape};

use super::openb::{NodePrefix, OpenbNode, OpenbPod};

/// Maps GPU model names to the small integer ids used in [`ModelSet`] bitmasks.
#[derive(Clone, Debug, Default)]
pub struct ModelTable {
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl ModelTable {
    /// The id of a model name, allocating a new one for an unseen name. Names past the 64th
    /// share the last id (no trace has that many models).
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len().min(63) as u32;
        if self.names.len() < 64 {
            self.names.push(name.to_string());
        }
        self.ids.insert(name.to_string(), id);
        id
    }

    /// The id of a known model name.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The name of a model id.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("?", String::as_str)
    }

    /// The acceptable-model set of a `|`-separated spec (empty = any). Models that no node has
    /// get no bit, so a spec naming only those matches nothing.
    pub fn spec(&self, spec: &str) -> ModelSet {
        if spec.trim().is_empty() {
            return ModelSet::ANY;
        }
        let mut bits = 0u64;
        for m in spec.split('|').map(str::trim).filter(|m| !m.is_empty()) {
            if let Some(id) = self.get(m) {
                bits |= 1u64 << id;
            }
        }
        ModelSet(bits)
    }
}

/// A node of the simulated cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimNode {
    /// Node name.
    pub name: String,
    /// CPU capacity in milli-cores.
    pub cpu_milli: u64,
    /// Memory capacity in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (each 1000 milli).
    pub gpus: u32,
    /// GPU model id.
    pub model: u32,
    /// Tie-break key: among equal scores the node with the smallest key wins.
    pub tie_key: String,
}

/// A pod as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimPod {
    /// Pod name.
    pub name: String,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// CPU and GPU request.
    pub shape: TaskShape,
}

/// The nodes of a simulated cluster and the model names they use.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// The nodes, in input order.
    pub nodes: Vec<SimNode>,
    /// Model names.
    pub models: ModelTable,
}

impl Cluster {
    /// Builds the cluster from openb nodes. The tie key of each node is its prefixed name from
    /// `prefixes` when given (nodes missing there keep their plain name), else the plain name.
    pub fn from_openb(nodes: &[OpenbNode], prefixes: Option<&[NodePrefix]>) -> Cluster {
        let mut models = ModelTable::default();
        let by_node: HashMap<&str, &str> = prefixes
            .unwrap_or(&[])
            .iter()
            .map(|p| (p.node.as_str(), p.prefixed_name.as_str()))
            .collect();
        let nodes = nodes
            .iter()
            .map(|n| SimNode {
                name: n.name.clone(),
                cpu_milli: n.cpu_milli,
                memory_mib: n.memory_mib,
                gpus: n.gpus,
                model: if n.gpus > 0 {
                    models.intern(&n.model)
                } else {
                    0
                },
                tie_key: by_node
                    .get(n.name.as_str())
                    .map_or_else(|| n.name.clone(), |p| p.to_string()),
            })
            .collect();
        Cluster { nodes, models }
    }

    /// Replaces the tie keys by `PPPP-<name>` from a permutation of `0..nodes` applied to the
    /// nodes sorted by name (the published renaming step).
    pub fn apply_permutation(&mut self, perm: &[usize]) {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by(|&a, &b| self.nodes[a].name.cmp(&self.nodes[b].name));
        for (i, &n) in order.iter().enumerate() {
            let p = perm.get(i).copied().unwrap_or(i);
            self.nodes[n].tie_key = format!("{p:04}-{}", self.nodes[n].name);
        }
    }

    /// Total GPU capacity in milli-GPU.
    pub fn gpu_milli(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum()
    }

    /// Total number of GPUs.
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }

    /// Total CPU in milli-cores.
    pub fn cpu_milli(&self) -> u64 {
        self.nodes.iter().map(|n| n.cpu_milli).sum()
    }

    /// Total memory in MiB.
    pub fn memory_mib(&self) -> u64 {
        self.nodes.iter().map(|n| n.memory_mib).sum()
    }

    /// Converts an openb pod into the placement view, using this cluster's model ids.
    pub fn pod(&self, p: &OpenbPod) -> SimPod {
        SimPod {
            name: p.name.clone(),
            memory_mib: p.memory_mib,
            shape: TaskShape {
                cpu_milli: p.cpu_milli,
                gpu_milli: if p.num_gpu == 0 { 0 } else { p.gpu_milli },
                gpu_count: if p.gpu_milli == 0 { 0 } else { p.num_gpu },
                models: self.models.spec(&p.gpu_spec),
            },
        }
    }
}
