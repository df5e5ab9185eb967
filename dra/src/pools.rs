//! ResourceSlices assembled into the device pools one node can use.
//!
//! The rules are `GatherPools` of the upstream allocator: a slice counts for a node when its
//! `nodeName`, `allNodes` or `nodeSelector` reaches the node, or (with `perDeviceNodeSelection`)
//! when one of its devices does; slices are grouped by (driver, pool) and only the highest
//! generation among them counts. A pool whose slices for the node are fewer than its
//! `resourceSliceCount` is completed from the other slices of that generation; if a newer
//! generation exists elsewhere the pool is being replaced and is skipped, and if the slices
//! still do not add up it is [`PoolState::Incomplete`] (unusable; a request for "All" devices
//! fails on it). A pool with duplicate device names, duplicate counter sets or devices drawing
//! on unknown counters is [`PoolState::Invalid`], with the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rustc_hash::FxHashMap;

use crate::api::{CounterSet, Device, NodeSelector, NodeSelectorRequirement, ResourceSlice};
use crate::quantity::Quantity;

/// The node being allocated for: what node selectors look at.
#[derive(Debug, Clone, Copy)]
pub struct NodeInfo<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.labels`.
    pub labels: &'a BTreeMap<String, String>,
}

/// A pool: (driver, pool name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    /// The driver.
    pub driver: String,
    /// The pool's name.
    pub pool: String,
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.driver, self.pool)
    }
}

/// A device: driver, pool and device name, as allocation results name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The device's name within the pool.
    pub device: String,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A device the node can use, with where it comes from.
#[derive(Debug, Clone)]
pub struct PoolDevice<'a> {
    /// Its identity.
    pub id: DeviceId,
    /// Its description in the slice.
    pub device: &'a Device,
    /// The pool generation it was published at (selector results are memoised per generation).
    pub generation: i64,
}

/// A pool as one node sees it.
#[derive(Debug, Clone)]
pub struct Pool<'a> {
    /// Its identity.
    pub id: PoolId,
    /// Whether and how it can be used.
    pub state: PoolState<'a>,
}

/// Whether a pool can be allocated from.
#[derive(Debug, Clone)]
pub enum PoolState<'a> {
    /// Complete and valid.
    Usable(UsablePool<'a>),
    /// Some slices of the current generation are missing (the driver is publishing).
    Incomplete,
    /// The slices contradict each other; the reason says how.
    Invalid(String),
}

/// The content of a usable pool.
#[derive(Debug, Clone, Default)]
pub struct UsablePool<'a> {
    /// The generation in use.
    pub generation: i64,
    /// Devices reachable from the node, slices by name, devices in slice order.
    pub devices: Vec<PoolDevice<'a>>,
    /// Devices of the pool the node cannot reach: they still draw on shared counters.
    pub elsewhere: Vec<PoolDevice<'a>>,
    /// Counter sets: name → counter → total.
    pub counter_sets: BTreeMap<String, BTreeMap<String, Quantity>>,
}

/// A slice or device whose node selection cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ResourceSlice {slice:?}: {problem}")]
pub struct PoolsError {
    /// The slice.
    pub slice: String,
    /// What is wrong.
    pub problem: String,
}

/// Assembles the pools `node` can use from every ResourceSlice of the cluster, sorted by
/// driver then pool name (pools with binding conditions last, as upstream).
pub fn assemble<'a>(
    slices: &'a [ResourceSlice],
    node: NodeInfo<'_>,
) -> Result<Vec<Pool<'a>>, PoolsError> {
    let mut for_node: FxHashMap<PoolId, Vec<&'a ResourceSlice>> = FxHashMap::default();
    for slice in slices {
        if !slice_reaches(slice, node)? {
            continue;
        }
        let id = pool_id(slice);
        let group = for_node.entry(id).or_default();
        match group.first().map(|s| s.spec.pool.generation) {
            Some(current) if slice.spec.pool.generation < current => {}
            Some(current) if slice.spec.pool.generation > current => *group = vec![slice],
            _ => group.push(slice),
        }
    }
    let mut pools = Vec::with_capacity(for_node.len());
    for (id, node_slices) in for_node {
        let generation = node_slices[0].spec.pool.generation;
        let expected = node_slices[0].spec.pool.resource_slice_count;
        let node_complete = i64::try_from(node_slices.len()).is_ok_and(|n| n == expected);
        let state = if node_complete {
            build(&node_slices, &node_slices, generation, node)?
        } else {
            let of_pool: Vec<&ResourceSlice> = slices.iter().filter(|s| pool_id(s) == id).collect();
            if of_pool.iter().any(|s| s.spec.pool.generation > generation) {
                // A newer generation exists but reaches this node with nothing: the pool is
                // being replaced and the node's devices in it are gone.
                continue;
            }
            let current: Vec<&ResourceSlice> = of_pool
                .into_iter()
                .filter(|s| s.spec.pool.generation == generation)
                .collect();
            if i64::try_from(current.len()).is_ok_and(|n| n == expected) {
                build(&node_slices, &current, generation, node)?
            } else {
                PoolState::Incomplete
            }
        };
        pools.push(Pool { id, state });
    }
    pools.sort_by(|a, b| {
        (has_binding_conditions(a), &a.id).cmp(&(has_binding_conditions(b), &b.id))
    });
    Ok(pools)
}

fn pool_id(slice: &ResourceSlice) -> PoolId {
    PoolId {
        driver: slice.spec.driver.clone(),
        pool: slice.spec.pool.name.clone(),
    }
}

fn has_binding_conditions(pool: &Pool<'_>) -> bool {
    match &pool.state {
        PoolState::Usable(usable) => usable
            .devices
            .iter()
            .any(|d| d.device.binding_conditions.is_some()),
        _ => false,
    }
}

/// Whether the slice belongs to the node's view at all.
fn slice_reaches(slice: &ResourceSlice, node: NodeInfo<'_>) -> Result<bool, PoolsError> {
    let spec = &slice.spec;
    let node_name = spec.node_name.as_deref().unwrap_or("");
    let all_nodes = spec.all_nodes.unwrap_or(false);
    if !node_name.is_empty() || all_nodes || spec.node_selector.is_some() {
        return reaches(node_name, all_nodes, spec.node_selector.as_ref(), node).map_err(
            |problem| PoolsError {
                slice: slice.metadata.name.clone(),
                problem,
            },
        );
    }
    if spec.per_device_node_selection.unwrap_or(false) {
        for device in &spec.devices {
            if device_reaches(device, node).map_err(|problem| PoolsError {
                slice: slice.metadata.name.clone(),
                problem: format!("device {:?}: {problem}", device.name),
            })? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn device_reaches(device: &Device, node: NodeInfo<'_>) -> Result<bool, String> {
    reaches(
        device.node_name.as_deref().unwrap_or(""),
        device.all_nodes.unwrap_or(false),
        device.node_selector.as_ref(),
        node,
    )
}

fn reaches(
    node_name: &str,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
    node: NodeInfo<'_>,
) -> Result<bool, String> {
    if !node_name.is_empty() {
        return Ok(node_name == node.name);
    }
    if all_nodes {
        return Ok(true);
    }
    match selector {
        Some(selector) => selector_matches(selector, node),
        None => Ok(false),
    }
}

/// `core/v1 NodeSelector` semantics: terms ORed, requirements ANDed, an empty term matches
/// nothing.
fn selector_matches(selector: &NodeSelector, node: NodeInfo<'_>) -> Result<bool, String> {
    for term in &selector.node_selector_terms {
        if term.match_expressions.is_empty() && term.match_fields.is_empty() {
            continue;
        }
        let mut all = true;
        for requirement in &term.match_expressions {
            all &= requirement_matches(
                requirement,
                node.labels.get(&requirement.key).map(String::as_str),
            )?;
        }
        for requirement in &term.match_fields {
            if requirement.key != "metadata.name" {
                return Err(format!(
                    "matchFields key {:?} is not supported: only metadata.name",
                    requirement.key
                ));
            }
            all &= requirement_matches(requirement, Some(node.name))?;
        }
        if all {
            return Ok(true);
        }
    }
    Ok(false)
}

fn requirement_matches(
    requirement: &NodeSelectorRequirement,
    value: Option<&str>,
) -> Result<bool, String> {
    let values = &requirement.values;
    let number = |text: &str| {
        text.parse::<i64>().map_err(|_| {
            format!(
                "node selector {:?} {}: {text:?} is not an integer",
                requirement.key, requirement.operator
            )
        })
    };
    Ok(match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let [bound] = values.as_slice() else {
                return Err(format!(
                    "node selector {:?}: Gt and Lt take exactly one value",
                    requirement.key
                ));
            };
            let bound = number(bound)?;
            match value {
                Some(v) => match v.parse::<i64>() {
                    Ok(v) if requirement.operator == "Gt" => v > bound,
                    Ok(v) => v < bound,
                    Err(_) => false,
                },
                None => false,
            }
        }
        other => {
            return Err(format!(
                "node selector operator {other:?} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
            ));
        }
    })
}

/// Builds a complete pool from the node's slices and all slices of the generation.
fn build<'a>(
    node_slices: &[&'a ResourceSlice],
    current: &[&'a ResourceSlice],
    generation: i64,
    node: NodeInfo<'_>,
) -> Result<PoolState<'a>, PoolsError> {
    let mut node_slices = node_slices.to_vec();
    node_slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let targeted: BTreeSet<&str> = node_slices
        .iter()
        .map(|s| s.metadata.name.as_str())
        .collect();

    let mut names = BTreeSet::new();
    for slice in node_slices
        .iter()
        .filter(|s| s.spec.shared_counters.is_empty())
    {
        for device in &slice.spec.devices {
            if !names.insert(device.name.as_str()) {
                return Ok(PoolState::Invalid(format!(
                    "duplicate device name {}",
                    device.name
                )));
            }
        }
    }

    let mut counter_sets: BTreeMap<String, BTreeMap<String, Quantity>> = BTreeMap::new();
    let counter_slices = node_slices
        .iter()
        .chain(
            current
                .iter()
                .filter(|s| !targeted.contains(s.metadata.name.as_str())),
        )
        .filter(|s| !s.spec.shared_counters.is_empty());
    for slice in counter_slices {
        for CounterSet { name, counters } in &slice.spec.shared_counters {
            if counter_sets.contains_key(name) {
                return Ok(PoolState::Invalid(format!(
                    "duplicate counter set name {name}"
                )));
            }
            counter_sets.insert(
                name.clone(),
                counters.iter().map(|(k, c)| (k.clone(), c.value)).collect(),
            );
        }
    }

    let mut usable = UsablePool {
        generation,
        counter_sets,
        ..UsablePool::default()
    };
    let device_slices_elsewhere = current.iter().filter(|s| {
        !targeted.contains(s.metadata.name.as_str()) && s.spec.shared_counters.is_empty()
    });
    for (slice, on_node) in node_slices
        .iter()
        .filter(|s| s.spec.shared_counters.is_empty())
        .map(|s| (s, true))
        .chain(device_slices_elsewhere.map(|s| (s, false)))
    {
        let per_device = slice.spec.per_device_node_selection.unwrap_or(false);
        for device in &slice.spec.devices {
            for consumption in &device.consumes_counters {
                let Some(set) = usable.counter_sets.get(&consumption.counter_set) else {
                    return Ok(PoolState::Invalid(format!(
                        "counter set {} not found",
                        consumption.counter_set
                    )));
                };
                if let Some(missing) = consumption.counters.keys().find(|c| !set.contains_key(*c)) {
                    return Ok(PoolState::Invalid(format!(
                        "counter {missing} not found in counter set {}",
                        consumption.counter_set
                    )));
                }
            }
            let reachable = on_node
                && (!per_device
                    || device_reaches(device, node).map_err(|problem| PoolsError {
                        slice: slice.metadata.name.clone(),
                        problem: format!("device {:?}: {problem}", device.name),
                    })?);
            let entry = PoolDevice {
                id: DeviceId {
                    driver: slice.spec.driver.clone(),
                    pool: slice.spec.pool.name.clone(),
                    device: device.name.clone(),
                },
                device,
                generation,
            };
            if reachable {
                usable.devices.push(entry);
            } else {
                usable.elsewhere.push(entry);
            }
        }
    }
    Ok(PoolState::Usable(usable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        Counter, DeviceCounterConsumption, NodeSelectorTerm, ResourcePool, ResourceSliceSpec,
    };

    fn slice(
        name: &str,
        pool: &str,
        generation: i64,
        count: i64,
        devices: &[&str],
    ) -> ResourceSlice {
        ResourceSlice {
            metadata: crate::api::ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "gpu.example.com".into(),
                pool: ResourcePool {
                    name: pool.into(),
                    generation,
                    resource_slice_count: count,
                },
                node_name: Some("n1".into()),
                devices: devices
                    .iter()
                    .map(|d| Device {
                        name: (*d).into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }

    fn node(labels: &BTreeMap<String, String>) -> NodeInfo<'_> {
        NodeInfo { name: "n1", labels }
    }

    fn names(pool: &Pool<'_>) -> Vec<String> {
        match &pool.state {
            PoolState::Usable(u) => u.devices.iter().map(|d| d.id.device.clone()).collect(),
            other => panic!("not usable: {other:?}"),
        }
    }

    #[test]
    fn highest_generation_wins() {
        let slices = vec![
            slice("a", "p", 1, 1, &["old"]),
            slice("b", "p", 2, 1, &["new"]),
        ];
        let labels = BTreeMap::new();
        let pools = assemble(&slices, node(&labels)).unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!(names(&pools[0]), vec!["new"]);
    }

    #[test]
    fn missing_slice_makes_the_pool_incomplete() {
        let slices = vec![slice("a", "p", 1, 2, &["g0"])];
        let labels = BTreeMap::new();
        let pools = assemble(&slices, node(&labels)).unwrap();
        assert!(matches!(pools[0].state, PoolState::Incomplete));
    }

    #[test]
    fn slice_for_another_node_completes_the_pool() {
        let mut other = slice("b", "p", 1, 2, &["g1"]);
        other.spec.node_name = Some("n2".into());
        let slices = vec![slice("a", "p", 1, 2, &["g0"]), other];
        let labels = BTreeMap::new();
        let pools = assemble(&slices, node(&labels)).unwrap();
        assert_eq!(names(&pools[0]), vec!["g0"]);
    }

    #[test]
    fn newer_generation_elsewhere_drops_the_pool() {
        let mut other = slice("b", "p", 2, 2, &["g1"]);
        other.spec.node_name = Some("n2".into());
        let slices = vec![slice("a", "p", 1, 2, &["g0"]), other];
        let labels = BTreeMap::new();
        assert!(assemble(&slices, node(&labels)).unwrap().is_empty());
    }

    #[test]
    fn duplicate_device_names_make_the_pool_invalid() {
        let slices = vec![
            slice("a", "p", 1, 2, &["g0"]),
            slice("b", "p", 1, 2, &["g0"]),
        ];
        let labels = BTreeMap::new();
        let pools = assemble(&slices, node(&labels)).unwrap();
        assert!(
            matches!(&pools[0].state, PoolState::Invalid(r) if r.contains("duplicate device name g0"))
        );
    }

    #[test]
    fn unknown_counter_set_makes_the_pool_invalid() {
        let mut s = slice("a", "p", 1, 1, &["g0"]);
        s.spec.devices[0].consumes_counters = vec![DeviceCounterConsumption {
            counter_set: "nope".into(),
            counters: BTreeMap::new(),
        }];
        let slices = vec![s];
        let labels = BTreeMap::new();
        let pools = assemble(&slices, node(&labels)).unwrap();
        assert!(
            matches!(&pools[0].state, PoolState::Invalid(r) if r.contains("counter set nope not found"))
        );
    }

    #[test]
    fn counter_slice_without_node_joins_the_pool() {
        let mut devices = slice("a", "p", 1, 2, &["mig-0"]);
        devices.spec.devices[0].consumes_counters = vec![DeviceCounterConsumption {
            counter_set: "gpu-0".into(),
            counters: [(
                "memory".to_owned(),
                Counter {
                    value: Quantity::from_units(10),
                },
            )]
            .into(),
        }];
        let mut counters = slice("b", "p", 1, 2, &[]);
        counters.spec.node_name = None;
        counters.spec.shared_counters = vec![CounterSet {
            name: "gpu-0".into(),
            counters: [(
                "memory".to_owned(),
                Counter {
                    value: Quantity::from_units(40),
                },
            )]
            .into(),
        }];
        let slices = vec![devices, counters];
        let labels = BTreeMap::new();
        let pools = assemble(&slices, node(&labels)).unwrap();
        let PoolState::Usable(usable) = &pools[0].state else {
            panic!("{:?}", pools[0].state)
        };
        assert_eq!(
            usable.counter_sets["gpu-0"]["memory"],
            Quantity::from_units(40)
        );
    }

    #[test]
    fn node_selector_and_per_device_selection() {
        let mut s = slice("a", "p", 1, 1, &["near", "far"]);
        s.spec.node_name = None;
        s.spec.per_device_node_selection = Some(true);
        s.spec.devices[0].node_selector = Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: vec![NodeSelectorRequirement {
                    key: "zone".into(),
                    operator: "In".into(),
                    values: vec!["a".into()],
                }],
                match_fields: vec![],
            }],
        });
        s.spec.devices[1].node_name = Some("n2".into());
        let slices = vec![s];
        let labels: BTreeMap<String, String> = [("zone".to_owned(), "a".to_owned())].into();
        let pools = assemble(&slices, node(&labels)).unwrap();
        assert_eq!(names(&pools[0]), vec!["near"]);
        let elsewhere = BTreeMap::new();
        assert!(assemble(&slices, node(&elsewhere)).unwrap().is_empty());
    }

    #[test]
    fn bad_operator_is_an_error_naming_the_slice() {
        let mut s = slice("a", "p", 1, 1, &["g"]);
        s.spec.node_name = None;
        s.spec.node_selector = Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: vec![NodeSelectorRequirement {
                    key: "zone".into(),
                    operator: "Near".into(),
                    values: vec![],
                }],
                match_fields: vec![],
            }],
        });
        let slices = vec![s];
        let labels: BTreeMap<String, String> = [("zone".to_owned(), "a".to_owned())].into();
        let err = assemble(&slices, node(&labels)).unwrap_err();
        assert_eq!(err.slice, "a");
        assert!(err.problem.contains("Near"), "{err}");
    }
}
