//! Which pod a kubelet request is for, decided by pure functions over one snapshot.
//!
//! The kubelet names no pod in `GetPreferredAllocation` or `Allocate`, so the pod is inferred
//! from what it asks: its size, the GPUs its slots are on and the slot set a preferred answer
//! reserved, oldest pending pod first. Everything here is a function of a [`Snapshot`] (the
//! pending table, the live reservations, the ledger's allocations, the node's GPUs, the time)
//! and the request: no locks, clocks, I/O or gRPC. The plugin takes the snapshot under one
//! ledger acquisition, calls [`allocate`] or [`preferred`], and records the answer before it
//! lets go, so two Allocates never both pass one capacity check.
//!
//! What [`allocate`] guarantees, for any snapshot and request:
//! - **Never another pod's share.** A plan's grants are its owner's own assigned slices (or,
//!   for a container reusing its pod's init-container devices, slices its own pod holds), and
//!   the request's GPUs are exactly the owner's; a request on GPUs no pending pod is assigned
//!   is refused, never answered with some pod's share. Whole free GPUs go only to a pod
//!   without an assignment, or to anyone without a cluster ([`SourceKind::None`]).
//! - **Never over capacity.** With the plans before it in the same request, an assigned plan
//!   fits the GPU's memory and compute (checked sums) and never joins a whole holder; a whole
//!   plan is the GPU's only holder. Holders of the very slots requested do not count: the
//!   kubelet handing a slot out again proves its holder gone.
//! - **A reservation is used by at most one container**: the one it was made for, while it
//!   is pending and not yet allocated; [`preferred`] never reserves a slot another live
//!   reservation holds, and one (pod, container) holds at most one reservation.
//! - **Pods by UID.** Candidates are keyed by pod UID; a pod created again under an old pod's
//!   name is another candidate and inherits no allocation, reservation or held device.
//!
//! What it relies on: requests that look alike (the same size on the same GPUs) cannot be told
//! apart, and go to the oldest pending candidate, as the kubelet admits oldest first. A pod the
//! agent does not know (deleted in the API while its kubelet still admits it, or not announced
//! yet) asking on a known pod's GPUs with that pod's size looks exactly like that pod. Two facts
//! outside the agent keep this from handing a share to the wrong pod: the coordinator binds no
//! second pod with a request size in common on a node until the first is allocated (the
//! same-count rule, `coordinator/src/cluster/plan/`), and keeps that hold for a moment after
//! such a pod is deleted unallocated (`DEPARTED_HOLD`), while its kubelet may still admit it;
//! and it announces each pod on the agent's stream before binding it, so the pod asking is
//! normally in the table. A request that matches nobody is refused with the pending
//! assignments named. After a kubelet restart lost an allocation, its pod is pending again
//! while the hold is lifted, and two pending containers can look alike; they are then told
//! apart by their GPUs only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use tessera_contract::{GpuSlice, Isolation, PodUid};

use crate::assignments::{PendingPod, SourceKind};
use crate::ledger::{Allocation, Grant, Origin, PodRef, usage_of};
use crate::node::parse_slot;
use crate::topology::Topology;

/// How long a preferred-allocation answer stays reserved for its pod.
pub(crate) const RESERVATION_TTL: Duration = Duration::from_secs(60);

/// A slot set a preferred answer steered to one pending container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The slots answered.
    pub(crate) slots: BTreeSet<String>,
    /// The pod they are for.
    pub(crate) uid: PodUid,
    /// Its container.
    pub(crate) container: String,
    /// When they were answered.
    pub(crate) at: Instant,
}

impl Reservation {
    /// Whether it still holds at `now`.
    pub(crate) fn live_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) < RESERVATION_TTL
    }

    /// Whether it is for `container` of the pod with UID `uid`.
    fn is_for(&self, uid: &PodUid, container: &str) -> bool {
        self.uid == *uid && self.container == container
    }
}

/// One GPU as the matcher sees it for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuView {
    /// `GPU-…` UUID.
    pub(crate) uuid: String,
    /// NVML index, for messages.
    pub(crate) index: u32,
    /// Memory a process can have, MiB.
    pub(crate) memory_total_mib: u64,
    /// In MIG mode: handed out only as MIG instances.
    pub(crate) mig_mode: bool,
    /// Advertised as `nvidia.com/gpu` slots.
    pub(crate) slots: bool,
    /// Healthy now.
    pub(crate) healthy: bool,
    /// The fatal XID that made it unhealthy, if one did.
    pub(crate) xid: Option<u64>,
}

/// What the matcher knows of the node: its GPUs and what this agent can set up.
#[derive(Debug)]
pub(crate) struct NodeView<'a> {
    /// Every GPU, in index order.
    pub(crate) gpus: Vec<GpuView>,
    /// Slots per GPU.
    pub(crate) shares_per_gpu: u32,
    /// The link matrix, for whole-GPU sets.
    pub(crate) topology: &'a Topology,
    /// Where assignments come from.
    pub(crate) source: SourceKind,
    /// MPS daemons can be started (`isolation: mps`).
    pub(crate) mps: bool,
    /// MIG instances can be created (`--mig-create`).
    pub(crate) mig_create: bool,
}

impl NodeView<'_> {
    /// The GPU with `uuid`.
    fn gpu(&self, uuid: &str) -> Option<&GpuView> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The advertised GPU slot `slot` belongs to.
    fn slot_gpu(&self, slot: &str) -> Option<&GpuView> {
        let (uuid, k) = parse_slot(slot)?;
        if k >= self.shares_per_gpu {
            return None;
        }
        self.gpus.iter().find(|g| g.slots && g.uuid == uuid)
    }

    /// Memory of GPU `uuid` (0 for an unknown GPU: nothing fits).
    fn memory_total(&self, uuid: &str) -> u64 {
        self.gpu(uuid).map_or(0, |g| g.memory_total_mib)
    }

    fn in_mig_mode(&self, uuid: &str) -> bool {
        self.gpu(uuid).is_some_and(|g| g.mig_mode)
    }
}

/// Everything one decision is a function of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snapshot<'a> {
    /// The node's GPUs and capabilities.
    pub(crate) node: &'a NodeView<'a>,
    /// The source's pending pods, oldest first.
    pub(crate) pending: &'a [PendingPod],
    /// The reservations made so far (expired ones are ignored).
    pub(crate) reservations: &'a [Reservation],
    /// The ledger's allocations.
    pub(crate) allocations: &'a [Allocation],
    /// The time of the request.
    pub(crate) now: Instant,
}

impl Snapshot<'_> {
    fn live_reservations(&self) -> impl Iterator<Item = &Reservation> {
        let now = self.now;
        self.reservations.iter().filter(move |r| r.live_at(now))
    }

    fn holds(&self, uid: &PodUid, container: &str) -> bool {
        self.allocations
            .iter()
            .any(|a| a.pod_uid.as_ref() == Some(uid) && a.container.as_deref() == Some(container))
    }
}

/// A pending container a request can be for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Its pod's UID, what it is recorded under.
    pub(crate) uid: PodUid,
    /// Its pod's namespace and name, for messages.
    pub(crate) pod: PodRef,
    /// The container's name.
    pub(crate) container: String,
    /// Its assigned GPUs (empty for a pod without an assignment).
    pub(crate) gpus: Vec<GpuSlice>,
    /// The pod's `tessera.dev/isolation` when the request came.
    pub(crate) isolation: Isolation,
}

impl Candidate {
    fn is(&self, uid: &PodUid, container: &str) -> bool {
        self.uid == *uid && self.container == container
    }
}

/// How a container's limits are set up at Allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing beyond the answer (watchdog, none, whole GPUs).
    Plain,
    /// Its GPU's MPS daemon and client limits.
    Mps,
    /// A MIG instance created on each of its (MIG-mode) GPUs.
    Mig,
}

/// What one container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The slots the kubelet handed out, in its order.
    pub(crate) slots: Vec<String>,
    /// The share of each GPU, in the order of `slots`.
    pub(crate) grants: Vec<Grant>,
    /// Its pod and container; `None` for whole GPUs without a pod (no cluster).
    pub(crate) owner: Option<Candidate>,
    /// Why it holds them.
    pub(crate) origin: Origin,
    /// What is set up for it.
    pub(crate) mode: Mode,
    /// The isolation recorded with the allocation: what `mode` enforces, fixed from then on.
    pub(crate) isolation: Isolation,
    /// The pod asked for `mig` on GPUs not in MIG mode: its limits are watched instead (the
    /// plugin says so in its log).
    pub(crate) mig_watched: bool,
}

impl Plan {
    /// `ns/name/container`, or a placeholder for whole GPUs without a pod.
    pub(crate) fn who(&self) -> String {
        match &self.owner {
            Some(o) => format!("{}/{}", o.pod, o.container),
            None => "a container without a pod".to_owned(),
        }
    }

    fn is_for(&self, uid: &PodUid, container: &str) -> bool {
        self.owner.as_ref().is_some_and(|o| o.is(uid, container))
    }
}

/// Why a request gets nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A container request without devices.
    NoDevices,
    /// A device id that is not a slot of an advertised GPU.
    NotASlot {
        /// The id.
        slot: String,
        /// Slots per GPU.
        shares_per_gpu: u32,
    },
    /// A slot of an unhealthy GPU.
    Unhealthy {
        /// The GPU's index.
        index: u32,
        /// Its UUID.
        uuid: String,
        /// The fatal XID, if one made it unhealthy.
        xid: Option<u64>,
    },
    /// Two slots of one GPU in one container request.
    TwoSlotsOfOneGpu {
        /// The GPU.
        uuid: String,
    },
    /// No pending pod is assigned the request's GPUs, and whole GPUs are not allowed.
    NoPendingAssigned {
        /// The request's GPUs.
        gpus: Vec<String>,
        /// Its size.
        size: usize,
        /// The pending assignments of that size, `ns/name/container -> [uuids]`.
        pending: Vec<String>,
    },
    /// Whole GPUs asked on a GPU in MIG mode.
    MigModeWhole {
        /// The GPU.
        uuid: String,
    },
    /// Whole GPUs asked on a GPU that others hold.
    InUse {
        /// The GPU.
        uuid: String,
        /// How many containers hold it.
        others: usize,
    },
    /// A share asked on a GPU a pod without assignment holds whole.
    HeldWhole {
        /// The GPU.
        uuid: String,
    },
    /// A share that does not fit.
    Overcommit {
        /// The GPU.
        uuid: String,
        /// Memory already granted, MiB.
        used_mib: u64,
        /// Memory asked, MiB.
        mib: u64,
        /// The GPU's memory, MiB.
        total_mib: u64,
        /// Compute already granted, milli-GPU.
        used_milli: u32,
        /// Compute asked, milli-GPU.
        milli: u32,
    },
    /// A container assigned GPUs in MIG mode together with GPUs that are not.
    MixedMig {
        /// `ns/name/container`.
        who: String,
        /// The GPUs in MIG mode.
        gpus: Vec<String>,
    },
    /// A container assigned GPUs in MIG mode while instance creation is off.
    MigCreateOff {
        /// `ns/name/container`.
        who: String,
        /// The GPUs in MIG mode.
        gpus: Vec<String>,
    },
    /// An MPS container with other than one GPU.
    MpsGpus {
        /// `ns/name/container`.
        who: String,
        /// How many GPUs it has.
        count: usize,
    },
    /// An MPS container on an agent without MPS support.
    MpsOff {
        /// `ns/name/container`.
        who: String,
    },
}

impl Refusal {
    /// Whether the request itself is malformed (as opposed to not allowed now).
    pub(crate) fn is_invalid_request(&self) -> bool {
        matches!(
            self,
            Refusal::NoDevices | Refusal::NotASlot { .. } | Refusal::TwoSlotsOfOneGpu { .. }
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoDevices => write!(f, "a container request with no devices"),
            Refusal::NotASlot {
                slot,
                shares_per_gpu,
            } => write!(
                f,
                "device id {slot:?} is not a slot of a shared GPU (expected <gpu-uuid>-<0..{shares_per_gpu}>)"
            ),
            Refusal::Unhealthy { index, uuid, xid } => write!(
                f,
                "GPU {index} ({uuid}) is unhealthy (XID {}); its slots cannot be allocated",
                xid.unwrap_or(0)
            ),
            Refusal::TwoSlotsOfOneGpu { uuid } => write!(
                f,
                "two slots of GPU {uuid} in one container request; each slot must be on a different GPU"
            ),
            Refusal::NoPendingAssigned {
                gpus,
                size,
                pending,
            } => write!(
                f,
                "no pending pod on this node is assigned GPUs [{}] with {size} GPU(s) (pending assignments: {}); \
                 only pods without a Tessera assignment may get whole free GPUs",
                gpus.join(", "),
                if pending.is_empty() {
                    "none".to_owned()
                } else {
                    pending.join("; ")
                }
            ),
            Refusal::MigModeWhole { uuid } => write!(
                f,
                "GPU {uuid} is in MIG mode: it serves only pods assigned to it with \
                 tessera.dev/isolation: mig, each on a MIG instance of its own"
            ),
            Refusal::InUse { uuid, others } => write!(
                f,
                "GPU {uuid} is already in use by {others} container(s); a pod without a Tessera \
                 assignment gets whole free GPUs only"
            ),
            Refusal::HeldWhole { uuid } => write!(
                f,
                "GPU {uuid} is held whole by a pod without assignment; cannot add a share to it"
            ),
            Refusal::Overcommit {
                uuid,
                used_mib,
                mib,
                total_mib,
                used_milli,
                milli,
            } => write!(
                f,
                "assignment would overcommit GPU {uuid}: {used_mib} MiB + {mib} MiB of {total_mib} MiB, \
                 {used_milli} + {milli} of 1000 milli-GPU"
            ),
            Refusal::MixedMig { who, gpus } => write!(
                f,
                "{who} is assigned GPUs in MIG mode ({}) together with GPUs that are not; \
                 a container's GPUs must all be MIG instances or none",
                gpus.join(", ")
            ),
            Refusal::MigCreateOff { who, gpus } => write!(
                f,
                "{who} is assigned GPU {} in MIG mode, but creating MIG instances is off \
                 (start the agent with --mig-create)",
                gpus.join(", ")
            ),
            Refusal::MpsGpus { who, count } => write!(
                f,
                "{who} has tessera.dev/isolation: mps with {count} GPUs; an MPS client reaches the \
                 daemon of one GPU only, so MPS containers get exactly one GPU"
            ),
            Refusal::MpsOff { who } => write!(
                f,
                "{who} has tessera.dev/isolation: mps, but this agent runs without MPS support"
            ),
        }
    }
}

/// Pending containers wanting `size` slots, assigned ones (`assigned`) or those without an
/// assignment, oldest pod first, skipping containers the ledger already holds.
pub(crate) fn candidates(snap: &Snapshot<'_>, size: usize, assigned: bool) -> Vec<Candidate> {
    snap.pending
        .iter()
        .flat_map(|p| {
            p.containers
                .iter()
                .filter(move |c| c.slots as usize == size && c.gpus.is_some() == assigned)
                .map(move |c| Candidate {
                    uid: p.uid.clone(),
                    pod: p.pod.clone(),
                    container: c.name.clone(),
                    gpus: c.gpus.clone().unwrap_or_default(),
                    isolation: p.isolation,
                })
        })
        .filter(|c| !snap.holds(&c.uid, &c.container))
        .collect()
}

/// Whether a request of each of `sizes` GPUs could be for some pending pod now. The kubelet
/// and the source see a binding independently, so the kubelet may ask about a pod the source
/// has not delivered yet; the plugin waits (bounded) while this is false rather than steer
/// the pod to whole free GPUs or refuse it. Without a cluster there is nothing to wait for.
pub(crate) fn ready(snap: &Snapshot<'_>, sizes: &[usize]) -> bool {
    snap.node.source == SourceKind::None
        || sizes.iter().all(|&size| {
            !candidates(snap, size, true).is_empty() || !candidates(snap, size, false).is_empty()
        })
}

/// Whole free GPUs are allowed without a cluster, or for a pending pod without assignment.
fn whole_allowed(snap: &Snapshot<'_>, size: usize) -> bool {
    snap.node.source == SourceKind::None || !candidates(snap, size, false).is_empty()
}

/// Takes `answers`' reservations into `reservations`: each replaces its container's earlier
/// one, so a container holds at most one.
pub(crate) fn reserve(reservations: &mut Vec<Reservation>, answers: &[Preference]) {
    for r in answers.iter().filter_map(|a| a.reservation.as_ref()) {
        reservations.retain(|x| !x.is_for(&r.uid, &r.container));
        reservations.push(r.clone());
    }
}

/// Drops from `reservations` those `plans` used up: each planned container's own, and any
/// holding a slot now allocated (the kubelet hands a slot to one container), so no
/// reservation serves a second container.
pub(crate) fn release(reservations: &mut Vec<Reservation>, plans: &[Plan]) {
    reservations.retain(|r| {
        !plans
            .iter()
            .any(|p| p.is_for(&r.uid, &r.container) || p.slots.iter().any(|s| r.slots.contains(s)))
    });
}

/// One container of a `GetPreferredAllocation` request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreferredRequest<'a> {
    /// How many slots it needs.
    pub(crate) size: usize,
    /// The slots the kubelet may give.
    pub(crate) available: &'a [String],
    /// The slots it must include (devices an init container held).
    pub(crate) must_include: &'a [String],
}

/// The answer for one container of a `GetPreferredAllocation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Preference {
    /// The slots to prefer.
    pub(crate) slots: Vec<String>,
    /// The reservation to record: the slots are a pending container's assigned GPUs.
    pub(crate) reservation: Option<Reservation>,
}

/// The preferred slots for each of `requests`: the oldest pending container of that size whose
/// assigned GPUs have free slots (reserved for it), else the best-connected whole free GPUs,
/// else must-include plus the first available (the Allocate then explains what is wrong).
/// A container is reserved at most once per call, and no two reservations share a slot.
pub(crate) fn preferred(snap: &Snapshot<'_>, requests: &[PreferredRequest<'_>]) -> Vec<Preference> {
    let mut made: Vec<Reservation> = Vec::new();
    let mut out = Vec::new();
    for req in requests {
        let answer = preferred_one(snap, req, &made);
        if let Some(r) = &answer.reservation {
            made.retain(|m| !m.is_for(&r.uid, &r.container));
            made.push(r.clone());
        }
        out.push(answer);
    }
    out
}

fn preferred_one(
    snap: &Snapshot<'_>,
    req: &PreferredRequest<'_>,
    made: &[Reservation],
) -> Preference {
    let node = snap.node;
    let size = req.size;
    // Available slots grouped by their (healthy) GPU.
    let mut by_gpu: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for slot in req.available {
        if let Some(g) = node.slot_gpu(slot)
            && g.healthy
        {
            by_gpu.entry(g.uuid.as_str()).or_default().push(slot);
        }
    }
    let must_gpus: BTreeSet<&str> = req
        .must_include
        .iter()
        .filter_map(|s| node.slot_gpu(s).map(|g| g.uuid.as_str()))
        .collect();
    // Reserved by an earlier answer or by this one.
    let reserved = |slot: &str| {
        snap.live_reservations()
            .chain(made.iter())
            .any(|r| r.slots.contains(slot))
    };
    // Slots the ledger holds are only offered by a kubelet that lost track of them; never
    // steer a new pod onto them.
    let held: BTreeSet<&str> = snap
        .allocations
        .iter()
        .flat_map(|a| a.slots.iter().map(String::as_str))
        .collect();
    let pick = |uuid: &str| -> Option<String> {
        let slots = by_gpu.get(uuid)?;
        slots
            .iter()
            .find(|s| req.must_include.contains(s))
            .or_else(|| {
                slots
                    .iter()
                    .find(|s| !held.contains(s.as_str()) && !reserved(s))
            })
            .map(|s| (*s).clone())
    };
    for c in candidates(snap, size, true) {
        if made.iter().any(|m| m.is_for(&c.uid, &c.container)) {
            continue;
        }
        let uuids: BTreeSet<&str> = c.gpus.iter().map(|g| g.uuid.as_str()).collect();
        if uuids.len() != size || !must_gpus.is_subset(&uuids) {
            continue;
        }
        let slots: Option<Vec<String>> = c.gpus.iter().map(|g| pick(&g.uuid)).collect();
        if let Some(slots) = slots {
            return Preference {
                reservation: Some(Reservation {
                    slots: slots.iter().cloned().collect(),
                    uid: c.uid,
                    container: c.container,
                    at: snap.now,
                }),
                slots,
            };
        }
    }
    // No assignment fits: the best-connected whole free GPUs.
    let topology = node.topology;
    let any_reserved_on = |uuid: &str| {
        snap.live_reservations()
            .chain(made.iter())
            .flat_map(|r| r.slots.iter())
            .any(|s| parse_slot(s).is_some_and(|(u, _)| u == uuid))
    };
    let free: Vec<usize> = by_gpu
        .keys()
        .filter(|u| usage_of(snap.allocations, u, &[]).holders == 0)
        // A GPU in MIG mode is only ever handed out as instances.
        .filter(|u| node.gpu(u).is_some_and(|g| !g.mig_mode))
        .filter(|u| !any_reserved_on(u))
        .filter_map(|u| topology.position(u))
        .collect();
    let must: Vec<usize> = must_gpus
        .iter()
        .filter_map(|u| topology.position(u))
        .collect();
    if let Some(set) = topology.best_set(&free, &must, size) {
        let slots: Option<Vec<String>> = set
            .iter()
            .map(|&i| pick(&topology.gpus()[i].uuid))
            .collect();
        if let Some(slots) = slots {
            return Preference {
                slots,
                reservation: None,
            };
        }
    }
    // Nothing sensible: echo must-include plus the first available; Allocate will explain
    // what is wrong.
    let mut slots: Vec<String> = req.must_include.to_vec();
    for s in req.available {
        if slots.len() >= size {
            break;
        }
        if !slots.contains(s) {
            slots.push(s.clone());
        }
    }
    Preference {
        slots,
        reservation: None,
    }
}

/// What each container of an `Allocate` gets (`requests`: each container's device ids), or
/// why none of them gets anything. Plans later in the request see the earlier ones: a
/// container is planned once, and capacity counts them.
pub(crate) fn allocate(
    snap: &Snapshot<'_>,
    requests: &[Vec<String>],
) -> Result<Vec<Plan>, Refusal> {
    let mut plans: Vec<Plan> = Vec::new();
    for slots in requests {
        let mut plan = plan_one(snap, slots, &plans)?;
        check_capacity(snap, &plan, &plans)?;
        let (mode, mig_watched) = mode_of(snap.node, &plan)?;
        plan.mode = mode;
        plan.mig_watched = mig_watched;
        plan.isolation = recorded_isolation(mode, plan.isolation);
        plans.push(plan);
    }
    Ok(plans)
}

/// Decides what the container holding `slots` gets, in order: the container this exact slot
/// set was reserved for, the oldest candidate assigned exactly these GPUs, a container reusing
/// its own pod's init-container GPUs, and otherwise whole free GPUs when allowed.
fn plan_one(snap: &Snapshot<'_>, slots: &[String], planned: &[Plan]) -> Result<Plan, Refusal> {
    let node = snap.node;
    if slots.is_empty() {
        return Err(Refusal::NoDevices);
    }
    let mut gpus: Vec<String> = Vec::new();
    for slot in slots {
        let g = node.slot_gpu(slot).ok_or_else(|| Refusal::NotASlot {
            slot: slot.clone(),
            shares_per_gpu: node.shares_per_gpu,
        })?;
        if !g.healthy {
            return Err(Refusal::Unhealthy {
                index: g.index,
                uuid: g.uuid.clone(),
                xid: g.xid,
            });
        }
        if gpus.contains(&g.uuid) {
            return Err(Refusal::TwoSlotsOfOneGpu {
                uuid: g.uuid.clone(),
            });
        }
        gpus.push(g.uuid.clone());
    }
    let set: BTreeSet<&String> = slots.iter().collect();
    let gpu_set: BTreeSet<&str> = gpus.iter().map(String::as_str).collect();
    let taken = |c: &Candidate| planned.iter().any(|p| p.is_for(&c.uid, &c.container));
    let assigned = candidates(snap, slots.len(), true);
    // 1. The container this exact slot set was reserved for.
    let reserved = snap
        .live_reservations()
        .find(|r| r.slots.iter().collect::<BTreeSet<_>>() == set)
        .and_then(|r| {
            assigned
                .iter()
                .find(|c| c.is(&r.uid, &r.container) && !taken(c))
        })
        .cloned();
    // 2. The oldest pending container assigned exactly these GPUs.
    let matched = reserved.or_else(|| {
        assigned
            .iter()
            .find(|c| {
                !taken(c)
                    && c.gpus
                        .iter()
                        .map(|s| s.uuid.as_str())
                        .collect::<BTreeSet<_>>()
                        == gpu_set
            })
            .cloned()
    });
    // 3. A container reusing the GPUs an init container of its own pod holds: the kubelet
    //    chooses which of those reusable devices it hands on, so the GPUs can differ from the
    //    container's entry while staying within the pod's.
    let matched = matched.or_else(|| reusing(snap, &assigned, &gpu_set, &taken));
    if let Some(owner) = matched {
        // Grants in the order of the request's slots.
        let grants = gpus
            .iter()
            .filter_map(|u| owner.gpus.iter().find(|g| &g.uuid == u))
            .map(|g| Grant {
                uuid: g.uuid.clone(),
                memory_mib: g.memory_mib,
                compute_milli: g.compute_milli,
            })
            .collect();
        return Ok(Plan {
            slots: slots.to_vec(),
            grants,
            isolation: owner.isolation,
            owner: Some(owner),
            origin: Origin::Assigned,
            mode: Mode::Plain,
            mig_watched: false,
        });
    }
    if !whole_allowed(snap, slots.len()) {
        let pending = assigned
            .iter()
            .map(|c| {
                let u: Vec<&str> = c.gpus.iter().map(|s| s.uuid.as_str()).collect();
                format!("{}/{} -> [{}]", c.pod, c.container, u.join(", "))
            })
            .collect();
        return Err(Refusal::NoPendingAssigned {
            gpus,
            size: slots.len(),
            pending,
        });
    }
    // The oldest pod of another scheduler asking for this many GPUs (none without a
    // cluster); the kubelet admits pods oldest first.
    let owner = candidates(snap, slots.len(), false)
        .into_iter()
        .find(|c| !taken(c));
    let mut grants = Vec::new();
    for uuid in &gpus {
        if node.in_mig_mode(uuid) {
            return Err(Refusal::MigModeWhole { uuid: uuid.clone() });
        }
        // Holders of the very slots requested are gone (the kubelet re-issued them).
        let others = usage_of(snap.allocations, uuid, slots).holders
            + planned
                .iter()
                .filter(|p| p.grants.iter().any(|g| &g.uuid == uuid))
                .count();
        if others > 0 {
            return Err(Refusal::InUse {
                uuid: uuid.clone(),
                others,
            });
        }
        grants.push(Grant {
            uuid: uuid.clone(),
            memory_mib: node.memory_total(uuid),
            compute_milli: 1000,
        });
    }
    Ok(Plan {
        slots: slots.to_vec(),
        grants,
        isolation: owner.as_ref().map_or(Isolation::Watchdog, |o| o.isolation),
        owner,
        origin: Origin::Whole,
        mode: Mode::Plain,
        mig_watched: false,
    })
}

/// The candidate among `candidates` whose GPUs `gpus` lie within its own entry plus the GPUs
/// its pod's containers already hold (an init container's devices, which the kubelet reuses
/// first and picks among itself): a container may get GPUs other than its entry names, but
/// never outside its pod's. Returns it with those slices.
fn reusing(
    snap: &Snapshot<'_>,
    candidates: &[Candidate],
    gpus: &BTreeSet<&str>,
    taken: &dyn Fn(&Candidate) -> bool,
) -> Option<Candidate> {
    candidates.iter().filter(|c| !taken(c)).find_map(|c| {
        let own = &c.gpus;
        let mut slices: Vec<GpuSlice> = own.clone();
        let held = snap
            .allocations
            .iter()
            .filter(|a| a.pod_uid.as_ref() == Some(&c.uid) && a.origin == Origin::Assigned)
            .flat_map(|a| a.grants.iter());
        for g in held {
            if !slices.iter().any(|x| x.uuid == g.uuid) {
                slices.push(GpuSlice {
                    uuid: g.uuid.clone(),
                    memory_mib: g.memory_mib,
                    compute_milli: g.compute_milli,
                });
            }
        }
        let covered = gpus.iter().all(|u| slices.iter().any(|s| s.uuid == *u));
        (covered && slices.len() > own.len()).then(|| Candidate {
            gpus: slices,
            ..c.clone()
        })
    })
}

/// Refuses an assigned plan that would overcommit a GPU or share a whole-held one, counting
/// the ledger (less the holders of the very slots requested) and the plans before it in the
/// request. The sums are checked: no value in an assignment or the checkpoint can wrap them
/// around to look as if they fit.
fn check_capacity(snap: &Snapshot<'_>, plan: &Plan, planned: &[Plan]) -> Result<(), Refusal> {
    if plan.origin != Origin::Assigned {
        return Ok(());
    }
    for g in &plan.grants {
        let mut usage = usage_of(snap.allocations, &g.uuid, &plan.slots);
        for p in planned {
            for earlier in p.grants.iter().filter(|e| e.uuid == g.uuid) {
                usage.memory_mib = usage.memory_mib.saturating_add(earlier.memory_mib);
                usage.compute_milli = usage.compute_milli.saturating_add(earlier.compute_milli);
                usage.whole |= p.origin == Origin::Whole;
            }
        }
        let total = snap.node.memory_total(&g.uuid);
        if usage.whole {
            return Err(Refusal::HeldWhole {
                uuid: g.uuid.clone(),
            });
        }
        let memory_fits = usage
            .memory_mib
            .checked_add(g.memory_mib)
            .is_some_and(|m| m <= total);
        let compute_fits = usage
            .compute_milli
            .checked_add(g.compute_milli)
            .is_some_and(|c| c <= 1000);
        if !memory_fits || !compute_fits {
            return Err(Refusal::Overcommit {
                uuid: g.uuid.clone(),
                used_mib: usage.memory_mib,
                mib: g.memory_mib,
                total_mib: total,
                used_milli: usage.compute_milli,
                milli: g.compute_milli,
            });
        }
    }
    Ok(())
}

/// How `plan`'s limits are set up: MIG for GPUs in MIG mode, MPS for assigned pods asking for
/// it, nothing more otherwise; and whether a pod asking for MIG on GPUs not in MIG mode is
/// watched instead.
fn mode_of(node: &NodeView<'_>, plan: &Plan) -> Result<(Mode, bool), Refusal> {
    let on_mig: Vec<String> = plan
        .grants
        .iter()
        .filter(|g| node.in_mig_mode(&g.uuid))
        .map(|g| g.uuid.clone())
        .collect();
    if !on_mig.is_empty() {
        if on_mig.len() != plan.grants.len() {
            return Err(Refusal::MixedMig {
                who: plan.who(),
                gpus: on_mig,
            });
        }
        if !node.mig_create {
            return Err(Refusal::MigCreateOff {
                who: plan.who(),
                gpus: on_mig,
            });
        }
        return Ok((Mode::Mig, false));
    }
    // Whole GPUs need no MPS daemon: nobody shares them.
    let isolation = match plan.origin {
        Origin::Assigned => plan.isolation,
        _ => Isolation::Watchdog,
    };
    match isolation {
        Isolation::Mps => {
            if plan.grants.len() != 1 {
                return Err(Refusal::MpsGpus {
                    who: plan.who(),
                    count: plan.grants.len(),
                });
            }
            if !node.mps {
                return Err(Refusal::MpsOff { who: plan.who() });
            }
            Ok((Mode::Mps, false))
        }
        Isolation::Mig => Ok((Mode::Plain, true)),
        Isolation::Watchdog | Isolation::None => Ok((Mode::Plain, false)),
    }
}

/// The isolation an allocation is recorded with: what its mode enforces. `requested` is the
/// pod's `tessera.dev/isolation` when it was allocated; a plain allocation is watched by the
/// watchdog unless the pod asked for no enforcement (a pod asking for MIG on a GPU not in MIG
/// mode is watched instead, as the warning at Allocate says).
fn recorded_isolation(mode: Mode, requested: Isolation) -> Isolation {
    match mode {
        Mode::Mps => Isolation::Mps,
        Mode::Mig => Isolation::Mig,
        Mode::Plain if requested == Isolation::None => Isolation::None,
        Mode::Plain => Isolation::Watchdog,
    }
}

#[cfg(test)]
mod tests;
