//! A pod's effective resource request, computed the way kube-scheduler's NodeResourcesFit
//! computes it (`resourcehelper.PodRequests` of k8s.io/component-helpers):
//!
//! - app containers and restartable ("sidecar") init containers are summed;
//! - each ordinary init container runs alone with the sidecars started before it, so the
//!   pod needs at least `that init container + the sidecars before it`, for each resource;
//! - pod-level `spec.resources.requests` (CPU, memory, hugepages) replace the container sum;
//! - `spec.overhead` is added last.
//!
//! A container's request falls back to its limit, as the API server defaults it. Amounts are
//! summed exactly in thousandths of the base unit and rounded up once at the end, as
//! kube-scheduler sums `Quantity` values before reading them. Requests recorded in a running
//! pod's status (in-place resize) are not read: the spec is what the pod asked for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_contract::keys;

use crate::crd::quantity::{self, Round};
use tessera_core::model::InputError;

/// Per resource name: thousandths of the resource's base unit (milli-cores for `cpu`,
/// milli-bytes for `memory`, milli-counts for extended resources).
pub type MilliAmounts = BTreeMap<String, u64>;

/// The pod's effective request per resource (see the module doc); malformed quantities are
/// reported in `errors` (naming the field) and count as 0.
pub fn pod_requests(spec: &PodSpec, errors: &mut Vec<InputError>) -> MilliAmounts {
    let mut total = MilliAmounts::new();
    for (i, c) in spec.containers.iter().enumerate() {
        add(&mut total, &container_requests("containers", i, c, errors));
    }
    let mut sidecars = MilliAmounts::new();
    let mut init_peak = MilliAmounts::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let own = container_requests("initContainers", i, c, errors);
        if is_restartable(c) {
            // A sidecar keeps running next to the app containers and later init containers.
            add(&mut total, &own);
            add(&mut sidecars, &own);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut while_running = own;
            add(&mut while_running, &sidecars);
            max_into(&mut init_peak, &while_running);
        }
    }
    max_into(&mut total, &init_peak);

    if let Some(pod_level) = spec.resources.as_ref() {
        let requests = pod_level.requests.as_ref();
        let limits = pod_level.limits.as_ref();
        let names: Vec<&String> = requests
            .into_iter()
            .chain(limits)
            .flat_map(|m| m.keys())
            .filter(|n| is_pod_level_resource(n))
            .collect();
        for name in names {
            let (which, q) = match requests.and_then(|m| m.get(name)) {
                Some(q) => ("requests", q),
                None => match limits.and_then(|m| m.get(name)) {
                    Some(q) => ("limits", q),
                    None => continue,
                },
            };
            let field = format!("spec.resources.{which}.{name}");
            if let Some(v) = milli_of(q, &field, errors) {
                total.insert(name.clone(), v);
            }
        }
    }
    if let Some(overhead) = &spec.overhead {
        for (name, q) in overhead {
            let field = format!("spec.overhead.{name}");
            if let Some(v) = milli_of(q, &field, errors) {
                let slot = total.entry(name.clone()).or_default();
                *slot = slot.saturating_add(v);
            }
        }
    }
    total
}

/// Resources a pod-level `spec.resources` may set (the PodLevelResources feature).
fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// Whether `c` is a sidecar: an init container with `restartPolicy: Always`.
pub fn is_restartable(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// One container's requests, each falling back to the limit of the same resource.
fn container_requests(
    kind: &str,
    i: usize,
    c: &Container,
    errors: &mut Vec<InputError>,
) -> MilliAmounts {
    let mut out = MilliAmounts::new();
    let Some(r) = c.resources.as_ref() else {
        return out;
    };
    if let Some(requests) = &r.requests {
        for (name, q) in requests {
            let field = format!("spec.{kind}[{i}].resources.requests.{name}");
            if let Some(v) = milli_of(q, &field, errors) {
                out.insert(name.clone(), v);
            }
        }
    }
    if let Some(limits) = &r.limits {
        for (name, q) in limits {
            // A request that is written (even unreadably) wins over the limit.
            if r.requests.as_ref().is_some_and(|m| m.contains_key(name)) {
                continue;
            }
            let field = format!("spec.{kind}[{i}].resources.limits.{name}");
            if let Some(v) = milli_of(q, &field, errors) {
                out.insert(name.clone(), v);
            }
        }
    }
    out
}

/// `q` in thousandths of its unit, rounded up; `None` (and an error on `field`) when it is
/// not a quantity, is negative or is too large.
fn milli_of(q: &Quantity, field: &str, errors: &mut Vec<InputError>) -> Option<u64> {
    let why = match quantity::parse(&q.0) {
        Err(e) => e.to_string(),
        Ok(p) if p.is_negative() => format!("{:?} is negative; give 0 or more", q.0),
        Ok(p) => match p.milli(Round::Up) {
            Some(v) => return Some(v.max(0) as u64),
            None => format!("{:?} is too large", q.0),
        },
    };
    errors.push(InputError {
        field: field.to_string(),
        message: why,
    });
    None
}

fn add(into: &mut MilliAmounts, other: &MilliAmounts) {
    for (name, v) in other {
        let slot = into.entry(name.clone()).or_default();
        *slot = slot.saturating_add(*v);
    }
}

fn max_into(into: &mut MilliAmounts, other: &MilliAmounts) {
    for (name, v) in other {
        let slot = into.entry(name.clone()).or_default();
        *slot = (*slot).max(*v);
    }
}

/// Thousandths rounded up to whole base units.
pub fn whole(milli: u64) -> u64 {
    milli.div_ceil(1000)
}

/// Milli-bytes rounded up to MiB.
pub fn mib(milli_bytes: u64) -> u64 {
    whole(milli_bytes).div_ceil(1 << 20)
}

/// Whether kube-scheduler's NodeResourcesFit compares `name` beyond CPU, memory and pod
/// count, and Tessera's core does not already account it as a GPU: `ephemeral-storage`,
/// hugepages, attachable volumes, and every domain-prefixed resource (extended resources
/// and `kubernetes.io/` prefixed native ones) except `nvidia.com/gpu` and `nvidia.com/mig-*`.
pub fn is_extended(name: &str) -> bool {
    if name == keys::GPU_RESOURCE || name.starts_with(keys::MIG_RESOURCE_PREFIX) {
        return false;
    }
    name == "ephemeral-storage"
        || name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || (name.contains('/') && !name.starts_with("requests."))
}
