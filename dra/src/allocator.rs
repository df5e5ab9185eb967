//! Finds devices for one or more ResourceClaims on one node, or says why there are none.
//!
//! Feasibility follows upstream's structured allocator (Kubernetes v1.37, every feature on):
//! `ExactCount` and `All` requests; `adminAccess` (the device is not consumed and may already be
//! in use); `matchAttribute` / `distinctAttribute` constraints; `firstAvailable` alternatives
//! tried in order; device taints with `NoSchedule`/`NoExecute` effects unless tolerated;
//! partitionable devices drawing on shared counters; consumable capacity with request policies
//! on devices that allow multiple allocations; at most 32 devices per claim. Invalid pools only
//! matter when nothing can be allocated ([`Refusal::InvalidPools`]); incomplete pools are
//! skipped, and fail a request for `All` devices.
//!
//! The search is a depth-first backtracking over combinations (each request's devices taken in
//! increasing candidate order, as upstream), so whether an answer exists does not depend on
//! the order candidates are tried in. That order prefers, for requests of consumable capacity,
//! devices already shared (keeping untouched GPUs whole), and for partitionable devices those
//! whose counters are already partly consumed (keeping unsplit GPUs whole); otherwise it is
//! the pools' order. The one exception keeps upstream's order: an `All` request in a claim
//! with constraints fails the whole allocation on the first device that breaks a constraint
//! (upstream's rule), so there the order decides the outcome and upstream's is used.
//!
//! Checked against upstream's `structured.NewAllocator` (all features on) on 40,000 seeded
//! random cases (pools with incomplete, stale and invalid slices, taints, shared counters,
//! consumable capacity with each request policy, admin access, `firstAvailable`, constraints,
//! existing allocations): every feasibility verdict agreed.
//!
//! Selectors are evaluated before the search (through the [`SelectorCache`], memoised per
//! device generation), never inside it. A selector error is raised when the search reaches that
//! device (upstream evaluates lazily in the same place), or at once for `All` requests.
//!
//! **Bound:** every device the search tries counts one step; after
//! [`Allocator::with_search_bound`] steps (default [`DEFAULT_SEARCH_BOUND`]) the search stops
//! with [`Refusal::SearchBound`]. The bound is the only place feasibility may differ from
//! upstream (which has no bound but the scheduler's timeout): constraints that make most
//! combinations fail on large nodes can exhaust it.

use std::collections::BTreeMap;
use std::fmt;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::api::{
    AllocationMode, AllocationResult, CapacityRequirements, DeviceAllocationResult,
    DeviceAttribute, DeviceClass, DeviceRequestAllocationResult, DeviceSelector, DeviceToleration,
    ResourceClaim,
};
use crate::capacity::{self, CapacityError};
use crate::pools::{DeviceId, Pool, PoolDevice, PoolState};
use crate::quantity::Quantity;
use crate::selector::{SelectorCache, SelectorError};

/// The most devices one claim may get (`AllocationResultsMaxSize`).
pub const MAX_DEVICES_PER_CLAIM: usize = 32;

/// Default number of device trials one [`Allocator::allocate`] call may make.
pub const DEFAULT_SEARCH_BOUND: u64 = 200_000;

/// What other claims already hold on the node's devices.
#[derive(Debug, Clone, Default)]
pub struct AllocatedState {
    /// Devices allocated whole (not for admin access, not shared).
    pub devices: FxHashSet<DeviceId>,
    /// Devices allocated in shares (with a `shareID`), with the capacity all shares consume.
    pub shared: FxHashMap<DeviceId, BTreeMap<String, Quantity>>,
}

impl AllocatedState {
    /// The state the given claims' allocations make (claims without one are skipped).
    pub fn from_claims<'c>(claims: impl IntoIterator<Item = &'c ResourceClaim>) -> AllocatedState {
        let mut state = AllocatedState::default();
        for claim in claims {
            if let Some(allocation) = &claim.status.allocation {
                state.add(allocation);
            }
        }
        state
    }

    /// Adds one allocation; admin-access devices consume nothing.
    pub fn add(&mut self, allocation: &AllocationResult) {
        for result in &allocation.devices.results {
            if result.admin_access == Some(true) {
                continue;
            }
            let id = DeviceId {
                driver: result.driver.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
            };
            if result.share_id.is_some() {
                let used = self.shared.entry(id).or_default();
                for (name, amount) in &result.consumed_capacity {
                    let entry = used.entry(name.clone()).or_default();
                    *entry = entry.saturating_add(*amount);
                }
            } else {
                self.devices.insert(id);
            }
        }
    }

    fn is_allocated(&self, id: &DeviceId) -> bool {
        self.devices.contains(id) || self.shared.contains_key(id)
    }
}

/// The devices one claim got.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAllocation {
    /// The claim, as `namespace/name`.
    pub claim: String,
    /// One entry per device, in request order.
    pub devices: Vec<AllocatedDevice>,
}

/// One allocated device.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatedDevice {
    /// The request, or `request/subrequest` for a `firstAvailable` alternative.
    pub request: String,
    /// The device.
    pub id: DeviceId,
    /// Allocated for admin access.
    pub admin_access: bool,
    /// The request's tolerations (the API copies them into the result).
    pub tolerations: Vec<DeviceToleration>,
    /// A share of a multi-allocatable device: the result needs a fresh `shareID`.
    pub shared: bool,
    /// Capacity this share consumes.
    pub consumed_capacity: BTreeMap<String, Quantity>,
}

impl ClaimAllocation {
    /// The API's `status.allocation`; `share_id` makes the unique ID of each share (the caller
    /// owns randomness: this crate has none).
    pub fn to_api(&self, mut share_id: impl FnMut() -> String) -> AllocationResult {
        AllocationResult {
            devices: DeviceAllocationResult {
                results: self
                    .devices
                    .iter()
                    .map(|d| DeviceRequestAllocationResult {
                        request: d.request.clone(),
                        driver: d.id.driver.clone(),
                        pool: d.id.pool.clone(),
                        device: d.id.device.clone(),
                        admin_access: d.admin_access.then_some(true),
                        tolerations: d.tolerations.clone(),
                        share_id: d.shared.then(&mut share_id),
                        consumed_capacity: d.consumed_capacity.clone(),
                    })
                    .collect(),
            },
            node_selector: None,
        }
    }
}

/// Why the claims cannot be allocated on this node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The node's devices cannot satisfy the claim as asked.
    #[error("claim {claim}: {reason}")]
    Unsatisfiable {
        /// The claim (`namespace/name`), or several joined by commas.
        claim: String,
        /// Which request or constraint fails, with device counts.
        reason: String,
    },
    /// Nothing could be allocated and some pools are invalid.
    #[error("invalid resource pools were encountered: {}", .pools.join("; "))]
    InvalidPools {
        /// Each invalid pool with its reason.
        pools: Vec<String>,
    },
    /// The claim cannot be allocated anywhere as written, or not on this node now (an `All`
    /// request over an incomplete pool).
    #[error("claim {claim}: {reason}")]
    InvalidClaim {
        /// The claim.
        claim: String,
        /// What is wrong.
        reason: String,
    },
    /// A selector failed to compile or to evaluate.
    #[error("claim {claim}: {error}")]
    Selector {
        /// The claim.
        claim: String,
        /// The expression, the device, and the error.
        error: Box<SelectorError>,
    },
    /// The search tried its bound of devices without an answer.
    #[error(
        "gave up after trying {steps} devices (the allocator's search bound) without finding an allocation"
    )]
    SearchBound {
        /// The bound.
        steps: u64,
    },
}

/// The allocator for one node: its pools, the classes, what is already allocated.
pub struct Allocator<'a> {
    pools: &'a [Pool<'a>],
    classes: FxHashMap<&'a str, &'a DeviceClass>,
    allocated: &'a AllocatedState,
    search_bound: u64,
}

/// One usable device, with what the search needs to know about it.
struct Dev<'a> {
    device: &'a PoolDevice<'a>,
    multi: bool,
    /// (counter slot, amount drawn) for partitionable devices.
    counters: Vec<(usize, Quantity)>,
    /// The counter slots of the device's pool.
    pool_slots: std::ops::Range<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exact(usize),
    All,
}

/// One request, or one alternative of a `firstAvailable` request, ready for the search.
struct Alt<'a> {
    base: &'a str,
    sub: Option<&'a str>,
    class: &'a str,
    mode: Mode,
    admin: bool,
    tolerations: &'a [DeviceToleration],
    capacity: Option<&'a CapacityRequirements>,
    /// ExactCount: devices that match, with a selector error to raise on reaching it.
    candidates: Vec<(usize, Option<SelectorError>)>,
    /// All: every matching device.
    all: Vec<usize>,
    need: usize,
}

struct Request<'a> {
    alts: Vec<Alt<'a>>,
    first_available: bool,
}

enum ConstraintKind {
    Match,
    Distinct,
}

struct Constraint<'a> {
    requests: &'a [String],
    attribute: &'a str,
    kind: ConstraintKind,
}

impl Constraint<'_> {
    fn applies(&self, base: &str, sub: Option<&str>) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| {
                r == base
                    || sub.is_some_and(|s| {
                        r.len() == base.len() + 1 + s.len() && *r == format!("{base}/{s}")
                    })
            })
    }
}

struct Claim<'a> {
    key: String,
    requests: Vec<Request<'a>>,
    constraints: Vec<Constraint<'a>>,
}

enum Stop {
    /// The claim would exceed [`MAX_DEVICES_PER_CLAIM`] (caught by `firstAvailable`).
    MaxSize,
    Bound,
    Fail(Box<Refusal>),
}

impl<'a> Allocator<'a> {
    /// An allocator over `pools` (from [`crate::pools::assemble`]) with `classes` and what is
    /// already allocated.
    pub fn new(
        pools: &'a [Pool<'a>],
        classes: &'a [DeviceClass],
        allocated: &'a AllocatedState,
    ) -> Allocator<'a> {
        Allocator {
            pools,
            classes: classes
                .iter()
                .map(|c| (c.metadata.name.as_str(), c))
                .collect(),
            allocated,
            search_bound: DEFAULT_SEARCH_BOUND,
        }
    }

    /// Caps the devices one call may try (see the module's doc).
    pub fn with_search_bound(mut self, steps: u64) -> Allocator<'a> {
        self.search_bound = steps;
        self
    }

    /// Allocates all `claims` together (all or none), each claim's devices in request order.
    pub fn allocate(
        &self,
        claims: &'a [ResourceClaim],
        selectors: &mut SelectorCache,
    ) -> Result<Vec<ClaimAllocation>, Refusal> {
        let (devs, available, totals) = self.devices();
        let split: Vec<bool> = available.iter().zip(&totals).map(|(a, t)| a < t).collect();
        let mut prepared = claims
            .iter()
            .map(|claim| self.prepare(claim, &devs, selectors))
            .collect::<Result<Vec<Claim<'a>>, _>>()?;
        // An `All` request under a constraint fails hard on the first device that breaks it
        // (as upstream), so which combinations are tried first decides the outcome: keep
        // upstream's order then.
        let order_matters = prepared.iter().any(|c| {
            !c.constraints.is_empty()
                && c.requests
                    .iter()
                    .flat_map(|r| &r.alts)
                    .any(|a| a.mode == Mode::All)
        });
        if !order_matters {
            for alt in prepared
                .iter_mut()
                .flat_map(|c| &mut c.requests)
                .flat_map(|r| &mut r.alts)
            {
                let wants_share = alt.capacity.is_some_and(|c| !c.requests.is_empty());
                alt.candidates.sort_by_key(|(index, _)| {
                    let dev = &devs[*index];
                    let shared_already =
                        dev.multi && self.allocated.shared.contains_key(&dev.device.id);
                    let split_already = dev.counters.iter().any(|(slot, _)| split[*slot]);
                    (
                        wants_share && !shared_already,
                        !dev.counters.is_empty() && !split_already,
                    )
                });
            }
        }
        let mut search = Search {
            devs: &devs,
            claims: &prepared,
            allocated: self.allocated,
            available: &available,
            exclusive: vec![Vec::new(); devs.len()],
            shares: vec![0; devs.len()],
            share_used: vec![BTreeMap::new(); devs.len()],
            counters_used: vec![Quantity::ZERO; available.len()],
            stacks: prepared
                .iter()
                .map(|c| vec![Vec::new(); c.constraints.len()])
                .collect(),
            results: vec![Vec::new(); prepared.len()],
            steps: 0,
            bound: self.search_bound,
        };
        match search.claims_from(0, 0) {
            Ok(true) => Ok(prepared
                .iter()
                .zip(search.results)
                .map(|(claim, devices)| ClaimAllocation {
                    claim: claim.key.clone(),
                    devices,
                })
                .collect()),
            Ok(false) => Err(self.explain(&prepared, &devs)),
            Err(Stop::Bound) => Err(Refusal::SearchBound {
                steps: self.search_bound,
            }),
            Err(Stop::MaxSize) => Err(Refusal::Unsatisfiable {
                claim: prepared.first().map(|c| c.key.clone()).unwrap_or_default(),
                reason: format!("the requests need more than {MAX_DEVICES_PER_CLAIM} devices"),
            }),
            Err(Stop::Fail(refusal)) => Err(*refusal),
        }
    }

    /// The usable devices in pool order, and each counter slot's availability after what is
    /// already allocated.
    fn devices(&self) -> (Vec<Dev<'a>>, Vec<Quantity>, Vec<Quantity>) {
        let mut devs = Vec::new();
        let mut available = Vec::new();
        let mut totals = Vec::new();
        for pool in self.pools {
            let PoolState::Usable(usable) = &pool.state else {
                continue;
            };
            let start = available.len();
            let mut slots: FxHashMap<(&str, &str), usize> = FxHashMap::default();
            for (set, counters) in &usable.counter_sets {
                for (name, total) in counters {
                    slots.insert((set.as_str(), name.as_str()), available.len());
                    available.push(*total);
                }
            }
            let draws = |device: &PoolDevice<'_>| -> Vec<(usize, Quantity)> {
                device
                    .device
                    .consumes_counters
                    .iter()
                    .flat_map(|c| {
                        c.counters
                            .iter()
                            // Pool assembly proved every counter exists.
                            .filter_map(|(name, amount)| {
                                slots
                                    .get(&(c.counter_set.as_str(), name.as_str()))
                                    .map(|s| (*s, amount.value))
                            })
                    })
                    .collect()
            };
            for device in usable.devices.iter().chain(&usable.elsewhere) {
                if self.allocated.is_allocated(&device.id) {
                    for (slot, amount) in draws(device) {
                        available[slot] = available[slot].saturating_sub(amount);
                    }
                }
            }
            let range = start..available.len();
            totals.extend(
                usable
                    .counter_sets
                    .values()
                    .flat_map(|c| c.values())
                    .copied(),
            );
            for device in &usable.devices {
                devs.push(Dev {
                    device,
                    multi: device.device.allow_multiple_allocations.unwrap_or(false),
                    counters: draws(device),
                    pool_slots: range.clone(),
                });
            }
        }
        (devs, available, totals)
    }

    fn prepare(
        &self,
        claim: &'a ResourceClaim,
        devs: &[Dev<'a>],
        selectors: &mut SelectorCache,
    ) -> Result<Claim<'a>, Refusal> {
        let key = format!("{}/{}", claim.metadata.namespace, claim.metadata.name);
        let invalid = |reason: String| Refusal::InvalidClaim {
            claim: key.clone(),
            reason,
        };
        let mut requests = Vec::new();
        let mut min_devices = 0usize;
        for request in &claim.spec.devices.requests {
            let mut alts = Vec::new();
            match (&request.exactly, request.first_available.as_slice()) {
                (Some(exact), []) => alts.push(self.alternative(
                    &key,
                    AltSpec {
                        base: &request.name,
                        sub: None,
                        class: &exact.device_class_name,
                        selectors: &exact.selectors,
                        mode: exact.allocation_mode.unwrap_or_default(),
                        count: exact.count,
                        admin: exact.admin_access.unwrap_or(false),
                        tolerations: &exact.tolerations,
                        capacity: exact.capacity.as_ref(),
                    },
                    devs,
                    selectors,
                )?),
                (None, subs) if !subs.is_empty() => {
                    for sub in subs {
                        alts.push(self.alternative(
                            &key,
                            AltSpec {
                                base: &request.name,
                                sub: Some(&sub.name),
                                class: &sub.device_class_name,
                                selectors: &sub.selectors,
                                mode: sub.allocation_mode.unwrap_or_default(),
                                count: sub.count,
                                admin: false,
                                tolerations: &sub.tolerations,
                                capacity: sub.capacity.as_ref(),
                            },
                            devs,
                            selectors,
                        )?);
                    }
                }
                _ => {
                    return Err(invalid(format!(
                        "request {}: set exactly one of `exactly` or a non-empty `firstAvailable`",
                        request.name
                    )));
                }
            }
            let least = alts.iter().map(|a| a.need).min().unwrap_or(0);
            if least > MAX_DEVICES_PER_CLAIM - min_devices {
                return Err(invalid(format!(
                    "request {}: adding {least} devices exceeds the claim limit of {MAX_DEVICES_PER_CLAIM}, with {min_devices} already accounted for",
                    request.name
                )));
            }
            min_devices += least;
            requests.push(Request {
                first_available: request.exactly.is_none(),
                alts,
            });
        }
        let mut constraints = Vec::new();
        for (i, constraint) in claim.spec.devices.constraints.iter().enumerate() {
            let (attribute, kind) = match (
                &constraint.match_attribute,
                &constraint.distinct_attribute,
            ) {
                (Some(a), None) => (a.as_str(), ConstraintKind::Match),
                (None, Some(a)) => (a.as_str(), ConstraintKind::Distinct),
                _ => {
                    return Err(invalid(format!(
                        "constraint #{i}: set exactly one of `matchAttribute` or `distinctAttribute`"
                    )));
                }
            };
            constraints.push(Constraint {
                requests: &constraint.requests,
                attribute,
                kind,
            });
        }
        Ok(Claim {
            key,
            requests,
            constraints,
        })
    }

    fn alternative(
        &self,
        key: &str,
        spec: AltSpec<'a>,
        devs: &[Dev<'a>],
        selectors: &mut SelectorCache,
    ) -> Result<Alt<'a>, Refusal> {
        let name = match spec.sub {
            Some(sub) => format!("{}/{sub}", spec.base),
            None => spec.base.to_owned(),
        };
        let invalid = |reason: String| Refusal::InvalidClaim {
            claim: key.to_owned(),
            reason: format!("request {name}: {reason}"),
        };
        if spec.class.is_empty() {
            return Err(invalid("missing device class name".to_owned()));
        }
        let class = self
            .classes
            .get(spec.class)
            .ok_or_else(|| invalid(format!("device class {} not found", spec.class)))?;
        let mut expressions = Vec::new();
        for (origin, list) in [
            ("class", class.spec.selectors.as_slice()),
            ("request", spec.selectors),
        ] {
            for (i, selector) in list.iter().enumerate() {
                let expression = selector_expression(selector).ok_or_else(|| {
                    invalid(format!("{origin} selector #{i}: CEL expression empty"))
                })?;
                selectors
                    .compile(expression)
                    .map_err(|error| Refusal::Selector {
                        claim: key.to_owned(),
                        error: Box::new(error),
                    })?;
                expressions.push(expression);
            }
        }
        let matches =
            |selectors: &mut SelectorCache, dev: &Dev<'_>| -> Result<bool, SelectorError> {
                for expression in &expressions {
                    if !selectors.matches(expression, dev.device)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            };
        let mut alt = Alt {
            base: spec.base,
            sub: spec.sub,
            class: spec.class,
            mode: Mode::All,
            admin: spec.admin,
            tolerations: spec.tolerations,
            capacity: spec.capacity,
            candidates: Vec::new(),
            all: Vec::new(),
            need: 0,
        };
        match spec.mode {
            AllocationMode::All => {
                for pool in self.pools {
                    match &pool.state {
                        PoolState::Incomplete => {
                            return Err(invalid(format!(
                                "asks for all devices, but resource pool {} is currently being updated",
                                pool.id
                            )));
                        }
                        PoolState::Invalid(_) => {
                            return Err(invalid(format!(
                                "asks for all devices, but resource pool {} is currently invalid",
                                pool.id
                            )));
                        }
                        PoolState::Usable(_) => {}
                    }
                }
                for (index, dev) in devs.iter().enumerate() {
                    let selected = matches(selectors, dev).map_err(|error| Refusal::Selector {
                        claim: key.to_owned(),
                        error: Box::new(error),
                    })?;
                    if !selected {
                        continue;
                    }
                    // Only the device's own capacity decides here: what others use makes
                    // the request fail later rather than shrink "all".
                    let fits = capacity::fits(spec.capacity, &dev.device.device.capacity, None)
                        .map_err(|e| {
                            invalid(format!(
                                "checking capacity for device {}: {e}",
                                dev.device.id
                            ))
                        })?;
                    if fits {
                        alt.all.push(index);
                    }
                }
                alt.need = alt.all.len();
            }
            AllocationMode::ExactCount => {
                let count = spec.count.unwrap_or(1);
                let need = usize::try_from(count)
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| invalid(format!("count {count} must be at least 1")))?;
                alt.mode = Mode::Exact(need);
                alt.need = need;
                for (index, dev) in devs.iter().enumerate() {
                    // A device allocated elsewhere is never evaluated (as upstream), so its
                    // selector errors cannot fail this claim.
                    if !spec.admin && self.allocated.devices.contains(&dev.device.id) {
                        continue;
                    }
                    match matches(selectors, dev) {
                        Ok(false) => {}
                        Ok(true) if taint_prevents(dev, spec.tolerations) => {}
                        Ok(true) => alt.candidates.push((index, None)),
                        Err(error) => alt.candidates.push((index, Some(error))),
                    }
                }
            }
        }
        Ok(alt)
    }

    /// Why the search found nothing: invalid pools first (as upstream), then the first request
    /// with too few matching devices, else the combination.
    fn explain(&self, claims: &[Claim<'a>], devs: &[Dev<'a>]) -> Refusal {
        let invalid: Vec<String> = self
            .pools
            .iter()
            .filter_map(|p| match &p.state {
                PoolState::Invalid(reason) => Some(format!("{}: {reason}", p.id)),
                _ => None,
            })
            .collect();
        if !invalid.is_empty() {
            return Refusal::InvalidPools { pools: invalid };
        }
        for claim in claims {
            for request in &claim.requests {
                let shortfalls: Vec<String> = request
                    .alts
                    .iter()
                    .filter_map(|alt| {
                        let name = match alt.sub {
                            Some(sub) => format!("{}/{sub}", alt.base),
                            None => alt.base.to_owned(),
                        };
                        match alt.mode {
                            Mode::All if alt.all.is_empty() => Some(format!(
                                "request {name}: asks for all devices of class {}, and none on the node matches",
                                alt.class
                            )),
                            Mode::Exact(need) if alt.candidates.len() < need => Some(format!(
                                "request {name}: {} free device(s) of class {} match its selectors and tolerate their taints, {need} needed (of {} devices on the node)",
                                alt.candidates.len(),
                                alt.class,
                                devs.len()
                            )),
                            _ => None,
                        }
                    })
                    .collect();
                if shortfalls.len() == request.alts.len() {
                    return Refusal::Unsatisfiable {
                        claim: claim.key.clone(),
                        reason: shortfalls.join("; "),
                    };
                }
            }
        }
        let names: Vec<&str> = claims.iter().map(|c| c.key.as_str()).collect();
        let constraints = claims.iter().any(|c| !c.constraints.is_empty());
        Refusal::Unsatisfiable {
            claim: names.join(", "),
            reason: format!(
                "enough devices match each request, but no combination of them is free together{}",
                if constraints {
                    " and satisfies the claims' constraints, shared counters and capacity"
                } else {
                    " within the shared counters and capacity"
                }
            ),
        }
    }
}

struct AltSpec<'a> {
    base: &'a str,
    sub: Option<&'a str>,
    class: &'a str,
    selectors: &'a [DeviceSelector],
    mode: AllocationMode,
    count: Option<i64>,
    admin: bool,
    tolerations: &'a [DeviceToleration],
    capacity: Option<&'a CapacityRequirements>,
}

fn selector_expression(selector: &DeviceSelector) -> Option<&str> {
    selector
        .cel
        .as_ref()
        .map(|c| c.expression.as_str())
        .filter(|e| !e.is_empty())
}

fn taint_prevents(dev: &Dev<'_>, tolerations: &[DeviceToleration]) -> bool {
    dev.device
        .device
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .any(|taint| !tolerations.iter().any(|t| t.tolerates(taint)))
}

/// `lookupAttribute`: the name as written, else `driver/id` as the driver's own `id`.
fn lookup_attribute<'d>(device: &'d PoolDevice<'_>, name: &str) -> Option<&'d DeviceAttribute> {
    let attributes = &device.device.attributes;
    if let Some(value) = attributes.get(name) {
        return Some(value);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != device.id.driver {
        return None;
    }
    attributes.get(id)
}

/// What one device addition changed, to take back.
struct Undo {
    dev: usize,
    claim: usize,
    counters: bool,
    constraints: Vec<usize>,
    exclusive: bool,
    share: Option<BTreeMap<String, Quantity>>,
    result: bool,
}

struct Search<'s, 'a> {
    devs: &'s [Dev<'a>],
    claims: &'s [Claim<'a>],
    allocated: &'s AllocatedState,
    available: &'s [Quantity],
    /// Per device: the claims (of this call) holding it whole.
    exclusive: Vec<Vec<usize>>,
    /// Per device: shares given out in this call, and the capacity they consume.
    shares: Vec<u32>,
    share_used: Vec<BTreeMap<String, Quantity>>,
    counters_used: Vec<Quantity>,
    /// Per claim, per constraint: the attribute values of the devices it covers so far.
    stacks: Vec<Vec<Vec<&'a DeviceAttribute>>>,
    results: Vec<Vec<AllocatedDevice>>,
    steps: u64,
    bound: u64,
}

impl<'a> Search<'_, 'a> {
    fn tick(&mut self) -> Result<(), Stop> {
        self.steps += 1;
        if self.steps > self.bound {
            Err(Stop::Bound)
        } else {
            Ok(())
        }
    }

    /// Allocates request `r` of claim `c` onwards.
    fn claims_from(&mut self, c: usize, r: usize) -> Result<bool, Stop> {
        let Some(claim) = self.claims.get(c) else {
            return Ok(true);
        };
        let Some(request) = claim.requests.get(r) else {
            return match self.claims_from(c + 1, 0) {
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        };
        if !request.first_available {
            return self.fill(c, r, 0, 0, 0);
        }
        let mut all_too_big = true;
        for alt in 0..request.alts.len() {
            match self.fill(c, r, alt, 0, 0) {
                Err(Stop::MaxSize) => continue,
                Ok(false) => all_too_big = false,
                other => return other,
            }
        }
        if all_too_big {
            Err(Stop::MaxSize)
        } else {
            Ok(false)
        }
    }

    /// Places device number `k` of alternative `alt`, trying candidates from `from` on.
    fn fill(&mut self, c: usize, r: usize, a: usize, k: usize, from: usize) -> Result<bool, Stop> {
        let claims = self.claims;
        let alt = &claims[c].requests[r].alts[a];
        if alt.mode == Mode::All && alt.all.is_empty() {
            return Ok(false);
        }
        if k >= alt.need {
            return self.claims_from(c, r + 1);
        }
        if alt.need - k > MAX_DEVICES_PER_CLAIM.saturating_sub(self.results[c].len()) {
            return Err(Stop::MaxSize);
        }
        if alt.mode == Mode::All {
            let dev = alt.all[k];
            self.tick()?;
            let Some(undo) = self.add(c, alt, dev, true)? else {
                return Ok(false);
            };
            let outcome = self.fill(c, r, a, k + 1, 0);
            if !matches!(outcome, Ok(true)) {
                self.undo(undo);
            }
            return outcome;
        }
        for pos in from..alt.candidates.len() {
            let (dev, error) = &alt.candidates[pos];
            let dev = *dev;
            self.tick()?;
            if alt.admin && self.exclusive[dev].contains(&c) {
                continue;
            }
            if !alt.admin && self.in_use(dev) {
                continue;
            }
            if let Some(error) = error {
                return Err(Stop::Fail(Box::new(Refusal::Selector {
                    claim: claims[c].key.clone(),
                    error: Box::new(error.clone()),
                })));
            }
            if !self.capacity_fits(c, alt, dev)? {
                continue;
            }
            let Some(undo) = self.add(c, alt, dev, false)? else {
                continue;
            };
            match self.fill(c, r, a, k + 1, pos + 1) {
                Ok(true) => return Ok(true),
                Ok(false) => self.undo(undo),
                Err(stop) => {
                    self.undo(undo);
                    return Err(stop);
                }
            }
        }
        Ok(false)
    }

    fn in_use(&self, dev: usize) -> bool {
        self.allocated.devices.contains(&self.devs[dev].device.id)
            || !self.exclusive[dev].is_empty()
    }

    fn capacity_in_use(&self, dev: usize) -> bool {
        self.allocated
            .shared
            .contains_key(&self.devs[dev].device.id)
            || self.shares[dev] > 0
    }

    fn capacity_fits(&self, c: usize, alt: &Alt<'a>, dev: usize) -> Result<bool, Stop> {
        let device = self.devs[dev].device;
        let capacities = &device.device.capacity;
        if capacities.is_empty() {
            return Ok(alt.capacity.is_none_or(|r| r.requests.is_empty()));
        }
        let mut used = self
            .allocated
            .shared
            .get(&device.id)
            .cloned()
            .unwrap_or_default();
        for (name, amount) in &self.share_used[dev] {
            let entry = used.entry(name.clone()).or_default();
            *entry = entry.saturating_add(*amount);
        }
        capacity::fits(alt.capacity, capacities, Some(&used))
            .map_err(|e| self.capacity_error(c, alt, dev, e))
    }

    fn capacity_error(&self, c: usize, alt: &Alt<'a>, dev: usize, error: CapacityError) -> Stop {
        Stop::Fail(Box::new(Refusal::InvalidClaim {
            claim: self.claims[c].key.clone(),
            reason: format!(
                "request {}: checking capacity for device {}: {error}",
                alt.base, self.devs[dev].device.id
            ),
        }))
    }

    /// `allocateDevice`: takes the device for the request unless something forbids it.
    fn add(
        &mut self,
        c: usize,
        alt: &Alt<'a>,
        dev: usize,
        must: bool,
    ) -> Result<Option<Undo>, Stop> {
        let devs = self.devs;
        let d = &devs[dev];
        if !d.multi && alt.admin && self.exclusive[dev].contains(&c) {
            return Ok(None);
        }
        if !alt.admin && self.in_use(dev) {
            return Ok(None);
        }
        let mut undo = Undo {
            dev,
            claim: c,
            counters: false,
            constraints: Vec::new(),
            exclusive: false,
            share: None,
            result: false,
        };
        let skip_counters = d.multi && self.capacity_in_use(dev);
        if !skip_counters && !d.counters.is_empty() {
            for (slot, amount) in &d.counters {
                self.counters_used[*slot] = self.counters_used[*slot].saturating_add(*amount);
            }
            undo.counters = true;
            // As upstream: every counter of the pool must stay within what is available.
            if d.pool_slots
                .clone()
                .any(|slot| self.available[slot] < self.counters_used[slot])
            {
                self.undo(undo);
                return Ok(None);
            }
        }
        if taint_prevents(d, alt.tolerations) {
            self.undo(undo);
            return Ok(None);
        }
        let claims = self.claims;
        for (i, constraint) in claims[c].constraints.iter().enumerate() {
            if !constraint.applies(alt.base, alt.sub) {
                continue;
            }
            let stack = &self.stacks[c][i];
            let admitted = match lookup_attribute(d.device, constraint.attribute) {
                None => false,
                Some(value) => match constraint.kind {
                    ConstraintKind::Match => stack.first().is_none_or(|first| *first == value),
                    ConstraintKind::Distinct => !stack.contains(&value),
                },
            };
            if !admitted {
                self.undo(undo);
                if must {
                    return Err(Stop::Fail(Box::new(Refusal::Unsatisfiable {
                        claim: claims[c].key.clone(),
                        reason: format!(
                            "request {}: cannot add device {} because constraint on {} would not be satisfied",
                            alt.base, d.device.id, constraint.attribute
                        ),
                    })));
                }
                return Ok(None);
            }
            // `admitted` implies the attribute exists.
            if let Some(value) = lookup_attribute(d.device, constraint.attribute) {
                self.stacks[c][i].push(value);
            }
            undo.constraints.push(i);
        }
        if !d.multi {
            self.exclusive[dev].push(c);
            undo.exclusive = true;
        }
        match self.capacity_fits(c, alt, dev) {
            Ok(true) => {}
            Ok(false) => {
                self.undo(undo);
                return Ok(None);
            }
            Err(stop) => {
                self.undo(undo);
                return Err(stop);
            }
        }
        let mut consumed = BTreeMap::new();
        if d.multi {
            consumed = match capacity::consumption(alt.capacity, &d.device.device.capacity) {
                Ok(consumed) => consumed,
                Err(e) => {
                    let stop = self.capacity_error(c, alt, dev, e);
                    self.undo(undo);
                    return Err(stop);
                }
            };
            for (name, amount) in &consumed {
                let entry = self.share_used[dev].entry(name.clone()).or_default();
                *entry = entry.saturating_add(*amount);
            }
            self.shares[dev] += 1;
            undo.share = Some(consumed.clone());
        }
        self.results[c].push(AllocatedDevice {
            request: match alt.sub {
                Some(sub) => format!("{}/{sub}", alt.base),
                None => alt.base.to_owned(),
            },
            id: d.device.id.clone(),
            admin_access: alt.admin,
            tolerations: alt.tolerations.to_vec(),
            shared: d.multi,
            consumed_capacity: consumed,
        });
        undo.result = true;
        Ok(Some(undo))
    }

    fn undo(&mut self, undo: Undo) {
        let Undo {
            dev,
            claim,
            counters,
            constraints,
            exclusive,
            share,
            result,
        } = undo;
        if result {
            self.results[claim].pop();
        }
        if let Some(consumed) = share {
            for (name, amount) in consumed {
                if let Some(entry) = self.share_used[dev].get_mut(&name) {
                    *entry = entry.saturating_sub(amount);
                }
            }
            self.shares[dev] -= 1;
        }
        if exclusive {
            self.exclusive[dev].retain(|c| *c != claim);
        }
        for i in constraints.into_iter().rev() {
            self.stacks[claim][i].pop();
        }
        if counters {
            for (slot, amount) in &self.devs[dev].counters {
                self.counters_used[*slot] = self.counters_used[*slot].saturating_sub(*amount);
            }
        }
    }
}

impl fmt::Debug for Allocator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocator")
            .field("pools", &self.pools.len())
            .field("classes", &self.classes.len())
            .field("search_bound", &self.search_bound)
            .finish()
    }
}

#[cfg(test)]
mod tests;
