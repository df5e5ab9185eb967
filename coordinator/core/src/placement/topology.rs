//! Topology domains: nodes grouped by the value of each topology level's label.

use std::collections::BTreeMap;

use crate::model::Node;

/// Label every node implicitly carries with its own name.
pub(super) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The domains of one topology level: the nodes sharing each value of one node label (a
/// rack, a zone).
#[derive(Clone, Debug, Default)]
pub struct LevelDomains {
    /// Label key.
    pub key: String,
    /// Domain names (label values), sorted.
    pub names: Vec<String>,
    /// Node indices of each domain, ascending.
    pub members: Vec<Vec<u32>>,
    /// Domain of each node (`None` when the node lacks the label).
    pub of_node: Vec<Option<u32>>,
}

/// All topology levels of a cycle.
#[derive(Clone, Debug, Default)]
pub struct Domains {
    /// Levels, coarse to fine.
    pub levels: Vec<LevelDomains>,
}

impl Domains {
    /// Groups `nodes` by each level's label.
    pub fn build(levels: &[String], nodes: &[Node]) -> Domains {
        let levels = levels
            .iter()
            .map(|key| {
                let mut by_value: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
                let mut value_of = Vec::with_capacity(nodes.len());
                for (i, n) in nodes.iter().enumerate() {
                    let v = n
                        .labels
                        .get(key)
                        .map(String::as_str)
                        .or_else(|| (key == HOSTNAME_LABEL).then_some(n.name.as_str()));
                    if let Some(v) = v {
                        by_value.entry(v).or_default().push(i as u32);
                    }
                    value_of.push(v);
                }
                let names: Vec<String> = by_value.keys().map(|s| s.to_string()).collect();
                let ids: BTreeMap<&str, u32> = by_value
                    .keys()
                    .enumerate()
                    .map(|(i, k)| (*k, i as u32))
                    .collect();
                let of_node = value_of
                    .iter()
                    .map(|v| v.and_then(|v| ids.get(v).copied()))
                    .collect();
                LevelDomains {
                    key: key.clone(),
                    names,
                    members: by_value.into_values().collect(),
                    of_node,
                }
            })
            .collect();
        Domains { levels }
    }

    /// Index of the level with label key `key`.
    pub fn level(&self, key: &str) -> Option<usize> {
        self.levels.iter().position(|l| l.key == key)
    }
}
