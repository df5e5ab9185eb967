//! The device-plugin implementations: `nvidia.com/gpu` share slots ([`GpuPlugin`]) and
//! `nvidia.com/mig-<profile>` devices ([`MigPlugin`]).
//!
//! The kubelet never says which pod it is allocating for, so the pod is recognised
//! from what it asks: `GetPreferredAllocation` picks the oldest pending pod whose
//! request size matches and whose assigned GPUs have free slots, answers with slots on
//! exactly those GPUs and remembers that slot set; `Allocate` with that slot set is
//! that pod. An `Allocate` without a remembered set is matched by size and by the GPUs
//! its slots are on; a container reusing its pod's init-container devices (the kubelet
//! picks which) is matched by its pod's GPUs. A request matching no assignment gets whole free GPUs when that is
//! allowed (no cluster, or a pending pod without an assignment), and otherwise fails
//! with a message saying why — never some other pod's share.
//!
//! A restarted kubelet asks again for an allocation it was answered but had not yet
//! checkpointed. Allocations made before a (re-)registration for pods that have not started
//! are therefore unconfirmed until pod-resources lists them: one whose pod the kubelet lists
//! without devices for that container was lost, and its container is pending again.
//!
//! Pods with `tessera.dev/isolation: mps` also get their GPU's MPS daemon (started on
//! demand) and its client limits; a pod assigned a GPU in MIG mode (advertised only
//! with `--mig-create`) gets a MIG instance created for it. Both are set up before the
//! allocation is recorded, and undone if it cannot be; the common watchdog path does
//! neither and stays synchronous.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_device_plugin::{DeviceProvider, DeviceWatch, PluginOptions, ProviderError, api};

use crate::assignments::{AssignmentSource, GpuSlice};
use crate::enforce::isolation::Isolation;
use crate::enforce::mig::{MigError, MigManager};
use crate::enforce::mps::{self, MpsManager, MpsPaths};
use crate::gpu::MigInstance;
use crate::ledger::{Allocation, Grant, Origin, PodRef, now_unix_ms};
use crate::node::{GPU_RESOURCE, Node, mig_resource, slot_id};

/// How long GetPreferredAllocation / Allocate wait for the source to deliver a pod the
/// kubelet is already asking about. The kubelet admits one pod at a time, so this bounds
/// how long one pod can hold up the node's admissions; with the coordinator announcing each
/// pod before its Binding is sent, the agent normally knows a pod before its kubelet does.
const WATCH_CATCH_UP: Duration = Duration::from_secs(5);

/// Environment variable listing the container's GPUs.
pub const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Environment variable with the memory limit per GPU (MiB, comma-separated in
/// `NVIDIA_VISIBLE_DEVICES` order).
pub const ENV_MEMORY_LIMIT: &str = "TESSERA_GPU_MEMORY_LIMIT_MIB";
/// Environment variable with the compute share per GPU (percent, same order).
pub const ENV_COMPUTE_PERCENT: &str = "TESSERA_GPU_COMPUTE_PERCENT";

/// How long a preferred-allocation answer stays reserved for its pod.
const RESERVATION_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Reservation {
    slots: BTreeSet<String>,
    pod: PodRef,
    container: String,
    at: Instant,
}

/// The `nvidia.com/gpu` provider.
pub struct GpuPlugin {
    node: Arc<Node>,
    source: Arc<dyn AssignmentSource>,
    reservations: Mutex<Vec<Reservation>>,
    mps: Option<Arc<MpsManager>>,
    mig: Option<Arc<MigManager>>,
    /// The kubelet's pod-resources socket, to settle unconfirmed allocations.
    pod_resources: Option<PathBuf>,
    /// Ledger ids allocated before the latest registration for pods not started yet.
    unconfirmed: Mutex<BTreeSet<u64>>,
}

/// A pending assigned container: its pod, name, assigned GPUs and the pod's creation time.
type Candidate = (PodRef, String, Vec<GpuSlice>, u64);

/// How a container's limits are set up at Allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing beyond the answer (watchdog, none, whole GPUs).
    Plain,
    /// Its GPU's MPS daemon and client limits.
    Mps,
    /// A MIG instance created on each of its (MIG-mode) GPUs.
    Mig,
}

/// What was set up for a container before its allocation is recorded.
enum Prepared {
    /// Nothing.
    Plain,
    /// The GPU and its daemon's directories.
    Mps(String, MpsPaths),
    /// The instances, in grant order.
    Mig(Vec<MigInstance>),
}

/// What one container will get.
struct Plan {
    slots: Vec<String>,
    grants: Vec<Grant>,
    pod: Option<PodRef>,
    container: Option<String>,
    origin: Origin,
    mode: Mode,
}

impl GpuPlugin {
    /// A provider over `node` taking assignments from `source`.
    pub fn new(node: Arc<Node>, source: Arc<dyn AssignmentSource>) -> Self {
        Self {
            node,
            source,
            reservations: Mutex::new(Vec::new()),
            mps: None,
            mig: None,
            pod_resources: None,
            unconfirmed: Mutex::new(BTreeSet::new()),
        }
    }

    /// Settles allocations a restarted kubelet may have lost through `socket` (its
    /// pod-resources API); without it they are kept as they are.
    pub fn with_pod_resources(mut self, socket: PathBuf) -> Self {
        self.pod_resources = Some(socket);
        self
    }

    /// Marks the ledger's allocations for pods that have not started as unconfirmed: the
    /// kubelet about to register may not know them.
    fn mark_unconfirmed(&self) {
        let pending: BTreeSet<PodRef> = self.source.pending().into_iter().map(|p| p.pod).collect();
        let ledger = self.node.ledger.lock();
        let ids: BTreeSet<u64> = ledger
            .allocations()
            .iter()
            .filter(|a| a.resource == GPU_RESOURCE && a.origin == Origin::Assigned)
            .filter(|a| a.pod.as_ref().is_some_and(|p| pending.contains(p)))
            .map(|a| a.id)
            .collect();
        drop(ledger);
        *self.unconfirmed.lock() = ids;
    }

    /// Asks pod-resources about the unconfirmed allocations (only while there are any):
    /// listed with devices → confirmed; the pod listed but that container without devices
    /// → lost by the kubelet, released so that the container is matched again; the pod not
    /// listed yet → still open. A pod that started or left is confirmed by that.
    async fn settle_unconfirmed(&self) {
        if self.unconfirmed.lock().is_empty() {
            return;
        }
        let Some(socket) = &self.pod_resources else {
            self.unconfirmed.lock().clear();
            return;
        };
        let listed = match crate::reconcile::list_containers(socket).await {
            Ok(l) => l,
            Err(error) => {
                tracing::debug!(%error, "cannot settle allocations after a kubelet restart yet");
                return;
            }
        };
        let pending: BTreeSet<PodRef> = self.source.pending().into_iter().map(|p| p.pod).collect();
        let mut unconfirmed = self.unconfirmed.lock();
        let mut ledger = self.node.ledger.lock();
        let mut lost = Vec::new();
        unconfirmed.retain(|id| {
            let Some(a) = ledger.allocations().iter().find(|a| a.id == *id) else {
                return false;
            };
            let (Some(pod), Some(container)) = (&a.pod, &a.container) else {
                return false;
            };
            if !pending.contains(pod) {
                return false;
            }
            match listed.iter().find(|(p, c, _)| p == pod && c == container) {
                Some((_, _, true)) => false,
                Some((_, _, false)) => {
                    lost.push((a.slots.clone(), pod.clone(), container.clone()));
                    false
                }
                // An init container (pod-resources lists app containers only) or a pod
                // the kubelet has not taken in yet: nothing to conclude.
                None => true,
            }
        });
        for (slots, pod, container) in lost {
            if let Err(error) = ledger.remove_holding(&slots) {
                tracing::warn!(%pod, container, %error, "could not release an allocation the kubelet lost");
                continue;
            }
            tracing::info!(%pod, container, ?slots,
                "the restarted kubelet lost this allocation (not checkpointed); the container is pending again");
        }
    }

    /// Serves `isolation: mps` pods through `mps`, and creates MIG instances through
    /// `mig` (present only with `--mig-create`).
    pub fn with_enforcement(
        mut self,
        mps: Option<Arc<MpsManager>>,
        mig: Option<Arc<MigManager>>,
    ) -> Self {
        self.mps = mps;
        self.mig = mig;
        self
    }

    fn live_reservations(&self) -> Vec<Reservation> {
        let mut r = self.reservations.lock();
        r.retain(|x| x.at.elapsed() < RESERVATION_TTL);
        r.clone()
    }

    /// Pending assigned containers wanting `size` slots, oldest pod first, skipping
    /// containers already in the ledger.
    fn assigned_candidates(&self, size: usize) -> Vec<Candidate> {
        let ledger = self.node.ledger.lock();
        self.source
            .pending()
            .into_iter()
            .flat_map(|p| {
                let pod = p.pod.clone();
                p.containers.into_iter().filter_map(move |c| {
                    let gpus = c.gpus?;
                    (c.slots as usize == size)
                        .then(|| (pod.clone(), c.name, gpus, p.created_unix_ms))
                })
            })
            .filter(|(pod, c, _, _)| !ledger.has_container(pod, c))
            .collect()
    }

    /// Pending containers without an assignment wanting `size` slots, oldest first.
    fn unassigned_candidates(&self, size: usize) -> Vec<(PodRef, String)> {
        let ledger = self.node.ledger.lock();
        self.source
            .pending()
            .into_iter()
            .flat_map(|p| {
                let pod = p.pod.clone();
                p.containers.into_iter().filter_map(move |c| {
                    (c.gpus.is_none() && c.slots as usize == size).then(|| (pod.clone(), c.name))
                })
            })
            .filter(|(pod, c)| !ledger.has_container(pod, c))
            .collect()
    }

    /// Waits (bounded by [`WATCH_CATCH_UP`]) until some pending pod could own a request
    /// of each of `sizes` GPUs. The kubelet and the agent's pod watch see a binding
    /// independently, so the kubelet may ask about a pod the watch has not delivered yet;
    /// answering at once would steer it to whole free GPUs or fail its Allocate.
    async fn await_candidates(&self, sizes: &[usize]) {
        if self.source.kind() == "none" {
            return;
        }
        self.settle_unconfirmed().await;
        let began = Instant::now();
        let deadline = began + WATCH_CATCH_UP;
        for &size in sizes {
            while self.assigned_candidates(size).is_empty()
                && !self.unassigned_pending(size)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.node.metrics.observe_pod_wait(began.elapsed());
    }

    fn unassigned_pending(&self, size: usize) -> bool {
        !self.unassigned_candidates(size).is_empty()
    }

    /// Whole free GPUs are allowed without a cluster, or for a pod without assignment.
    fn whole_allowed(&self, size: usize) -> bool {
        self.source.kind() == "none" || self.unassigned_pending(size)
    }

    fn preferred_one(
        &self,
        req: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, ProviderError> {
        let size = usize::try_from(req.allocation_size).unwrap_or(0);
        // Available slots grouped by their (healthy) GPU.
        let mut by_gpu: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for slot in &req.available_device_i_ds {
            if let Some(d) = self.node.slot_gpu(slot)
                && self.node.health(&d.uuid).healthy
            {
                by_gpu.entry(d.uuid.clone()).or_default().push(slot.clone());
            }
        }
        let must_gpus: BTreeSet<String> = req
            .must_include_device_i_ds
            .iter()
            .filter_map(|s| self.node.slot_gpu(s).map(|d| d.uuid.clone()))
            .collect();
        let reserved: Vec<Reservation> = self.live_reservations();
        // Slots the ledger holds are only offered by a kubelet that lost track of them;
        // never steer a new pod onto them.
        let held: BTreeSet<String> = self
            .node
            .ledger
            .lock()
            .allocations()
            .iter()
            .flat_map(|a| a.slots.iter().cloned())
            .collect();
        let pick = |uuid: &str| -> Option<String> {
            let slots = by_gpu.get(uuid)?;
            slots
                .iter()
                .find(|s| req.must_include_device_i_ds.contains(s))
                .or_else(|| {
                    slots.iter().find(|s| {
                        !held.contains(*s) && !reserved.iter().any(|r| r.slots.contains(*s))
                    })
                })
                .cloned()
        };
        for (pod, container, gpus, _) in self.assigned_candidates(size) {
            let uuids: BTreeSet<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
            if uuids.len() != size || !must_gpus.is_subset(&uuids) {
                continue;
            }
            let slots: Option<Vec<String>> = gpus.iter().map(|g| pick(&g.uuid)).collect();
            if let Some(slots) = slots {
                let mut r = self.reservations.lock();
                r.retain(|x| !(x.pod == pod && x.container == container));
                r.push(Reservation {
                    slots: slots.iter().cloned().collect(),
                    pod,
                    container,
                    at: Instant::now(),
                });
                return Ok(slots);
            }
        }
        // No assignment fits: the best-connected whole free GPUs.
        let topology = self.node.topology();
        let ledger = self.node.ledger.lock();
        let free: Vec<usize> = by_gpu
            .keys()
            .filter(|u| ledger.usage(u).holders == 0)
            // A GPU in MIG mode is only ever handed out as instances.
            .filter(|u| self.node.device(u).is_some_and(|d| d.mig.is_none()))
            .filter(|u| {
                !reserved
                    .iter()
                    .any(|r| r.slots.iter().any(|s| s.starts_with(u.as_str())))
            })
            .filter_map(|u| topology.position(u))
            .collect();
        let must: Vec<usize> = must_gpus
            .iter()
            .filter_map(|u| topology.position(u))
            .collect();
        drop(ledger);
        if let Some(set) = topology.best_set(&free, &must, size) {
            let slots: Option<Vec<String>> = set
                .iter()
                .map(|&i| pick(&topology.gpus()[i].uuid))
                .collect();
            if let Some(slots) = slots {
                return Ok(slots);
            }
        }
        // Nothing sensible: echo must-include plus the first available; Allocate will
        // explain what is wrong.
        let mut out: Vec<String> = req.must_include_device_i_ds.clone();
        for s in &req.available_device_i_ds {
            if out.len() >= size {
                break;
            }
            if !out.contains(s) {
                out.push(s.clone());
            }
        }
        Ok(out)
    }

    /// Decides what the container holding `slots` gets.
    fn plan(&self, slots: &[String], planned: &[Plan]) -> Result<Plan, ProviderError> {
        if slots.is_empty() {
            return Err(ProviderError::InvalidRequest(
                "a container request with no devices".into(),
            ));
        }
        let mut gpus: Vec<String> = Vec::new();
        for slot in slots {
            let d = self.node.slot_gpu(slot).ok_or_else(|| {
                ProviderError::InvalidRequest(format!(
                    "device id {slot:?} is not a slot of a shared GPU (expected <gpu-uuid>-<0..{}>)",
                    self.node.options().shares_per_gpu
                ))
            })?;
            let health = self.node.health(&d.uuid);
            if !health.healthy {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {} ({}) is unhealthy (XID {}); its slots cannot be allocated",
                    d.index,
                    d.uuid,
                    health.xid.unwrap_or(0)
                )));
            }
            if gpus.contains(&d.uuid) {
                return Err(ProviderError::InvalidRequest(format!(
                    "two slots of GPU {} in one container request; each slot must be on a different GPU",
                    d.uuid
                )));
            }
            gpus.push(d.uuid.clone());
        }
        let set: BTreeSet<String> = slots.iter().cloned().collect();
        let gpu_set: BTreeSet<&String> = gpus.iter().collect();
        let taken = |pod: &PodRef, c: &str| {
            planned
                .iter()
                .any(|p| p.pod.as_ref() == Some(pod) && p.container.as_deref() == Some(c))
        };
        let candidates = self.assigned_candidates(slots.len());
        // 1. The pod this exact slot set was reserved for.
        let reserved = self
            .live_reservations()
            .into_iter()
            .find(|r| r.slots == set)
            .and_then(|r| {
                candidates
                    .iter()
                    .find(|(p, c, _, _)| *p == r.pod && *c == r.container && !taken(p, c))
                    .cloned()
            });
        // 2. The oldest pending pod assigned exactly these GPUs.
        let matched = reserved.or_else(|| {
            candidates
                .iter()
                .find(|(p, c, g, _)| {
                    !taken(p, c) && g.iter().map(|s| &s.uuid).collect::<BTreeSet<_>>() == gpu_set
                })
                .cloned()
        });
        // 3. A container reusing the GPUs an init container of its own pod holds: the kubelet
        //    chooses which of those reusable devices it hands on, so the GPUs can differ from
        //    the container's entry while staying within the pod's.
        let matched = matched.or_else(|| self.reusing(&candidates, &gpu_set, &taken));
        if let Some((pod, container, assigned, _)) = matched {
            // Grants in the order of the request's slots.
            let grants = gpus
                .iter()
                .filter_map(|u| assigned.iter().find(|g| &g.uuid == u))
                .map(|g| Grant {
                    uuid: g.uuid.clone(),
                    memory_mib: g.memory_mib,
                    compute_milli: g.compute_milli,
                })
                .collect();
            return Ok(Plan {
                slots: slots.to_vec(),
                grants,
                pod: Some(pod),
                container: Some(container),
                origin: Origin::Assigned,
                mode: Mode::Plain,
            });
        }
        if !self.whole_allowed(slots.len()) {
            let pending: Vec<String> = candidates
                .iter()
                .map(|(p, c, g, _)| {
                    let u: Vec<&str> = g.iter().map(|s| s.uuid.as_str()).collect();
                    format!("{p}/{c} -> [{}]", u.join(", "))
                })
                .collect();
            return Err(ProviderError::FailedPrecondition(format!(
                "no pending pod on this node is assigned GPUs [{}] with {} GPU(s) (pending assignments: {}); \
                 only pods without a Tessera assignment may get whole free GPUs",
                gpus.join(", "),
                slots.len(),
                if pending.is_empty() {
                    "none".to_owned()
                } else {
                    pending.join("; ")
                }
            )));
        }
        // The oldest pod of another scheduler asking for this many GPUs (none without
        // a cluster); the kubelet admits pods oldest first.
        let owner = self
            .unassigned_candidates(slots.len())
            .into_iter()
            .find(|(p, c)| !taken(p, c));
        let ledger = self.node.ledger.lock();
        let mut grants = Vec::new();
        for uuid in &gpus {
            if self.node.device(uuid).is_some_and(|d| d.mig.is_some()) {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {uuid} is in MIG mode: it serves only pods assigned to it with \
                     tessera.dev/isolation: mig, each on a MIG instance of its own"
                )));
            }
            // Holders of the very slots requested are gone (the kubelet re-issued them).
            let others = ledger
                .allocations()
                .iter()
                .filter(|a| a.grants.iter().any(|g| &g.uuid == uuid))
                .filter(|a| !a.slots.iter().any(|s| set.contains(s)))
                .count()
                + planned
                    .iter()
                    .filter(|p| p.grants.iter().any(|g| &g.uuid == uuid))
                    .count();
            if others > 0 {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {uuid} is already in use by {others} container(s); a pod without a Tessera \
                     assignment gets whole free GPUs only"
                )));
            }
            let total = self.node.device(uuid).map_or(0, |d| d.memory_total_mib);
            grants.push(Grant {
                uuid: uuid.clone(),
                memory_mib: total,
                compute_milli: 1000,
            });
        }
        let (pod, container) = owner.map_or((None, None), |(p, c)| (Some(p), Some(c)));
        Ok(Plan {
            slots: slots.to_vec(),
            grants,
            pod,
            container,
            origin: Origin::Whole,
            mode: Mode::Plain,
        })
    }

    /// The candidate among `candidates` whose GPUs `gpus` lie within its own entry plus the
    /// GPUs its pod's containers already hold (an init container's devices, which the
    /// kubelet reuses first and picks among itself): a container may get GPUs other than its
    /// entry names, but never outside its pod's. Returns those slices.
    fn reusing(
        &self,
        candidates: &[Candidate],
        gpus: &BTreeSet<&String>,
        taken: &dyn Fn(&PodRef, &str) -> bool,
    ) -> Option<Candidate> {
        let ledger = self.node.ledger.lock();
        candidates
            .iter()
            .filter(|(p, c, _, _)| !taken(p, c))
            .find_map(|(p, c, own, created)| {
                let mut slices: Vec<GpuSlice> = own.clone();
                let held = ledger
                    .allocations()
                    .iter()
                    .filter(|a| a.pod.as_ref() == Some(p) && a.origin == Origin::Assigned)
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
                let covered = gpus.iter().all(|u| slices.iter().any(|s| &&s.uuid == u));
                (covered && slices.len() > own.len())
                    .then(|| (p.clone(), c.clone(), slices, *created))
            })
    }

    /// How `plan`'s limits are set up: MIG for GPUs in MIG mode, MPS for assigned pods
    /// asking for it, nothing more otherwise.
    fn mode_of(&self, plan: &Plan) -> Result<Mode, ProviderError> {
        let who = || match (&plan.pod, &plan.container) {
            (Some(p), Some(c)) => format!("{p}/{c}"),
            _ => "a container without a pod".to_owned(),
        };
        let on_mig: Vec<&str> = plan
            .grants
            .iter()
            .filter(|g| self.node.device(&g.uuid).is_some_and(|d| d.mig.is_some()))
            .map(|g| g.uuid.as_str())
            .collect();
        if !on_mig.is_empty() {
            if on_mig.len() != plan.grants.len() {
                return Err(ProviderError::FailedPrecondition(format!(
                    "{} is assigned GPUs in MIG mode ({}) together with GPUs that are not; \
                     a container's GPUs must all be MIG instances or none",
                    who(),
                    on_mig.join(", ")
                )));
            }
            if self.mig.is_none() {
                return Err(ProviderError::FailedPrecondition(format!(
                    "{} is assigned GPU {} in MIG mode, but creating MIG instances is off \
                     (start the agent with --mig-create)",
                    who(),
                    on_mig.join(", ")
                )));
            }
            return Ok(Mode::Mig);
        }
        let isolation = match (&plan.pod, plan.origin) {
            (Some(pod), Origin::Assigned) => self.source.isolation(pod).unwrap_or_default(),
            _ => Isolation::Watchdog,
        };
        match isolation {
            Isolation::Mps => {
                if plan.grants.len() != 1 {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "{} has tessera.dev/isolation: mps with {} GPUs; an MPS client reaches the \
                         daemon of one GPU only, so MPS containers get exactly one GPU",
                        who(),
                        plan.grants.len()
                    )));
                }
                if self.mps.is_none() {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "{} has tessera.dev/isolation: mps, but this agent runs without MPS support",
                        who()
                    )));
                }
                Ok(Mode::Mps)
            }
            Isolation::Mig => {
                tracing::warn!(
                    container = %who(),
                    "isolation mig on a GPU not in MIG mode; limits are watched instead"
                );
                Ok(Mode::Plain)
            }
            Isolation::Watchdog | Isolation::None => Ok(Mode::Plain),
        }
    }

    /// Refuses an assignment that would overcommit a GPU or share a whole-held one.
    fn check_capacity(&self, plan: &Plan) -> Result<(), ProviderError> {
        if plan.origin != Origin::Assigned {
            return Ok(());
        }
        let ledger = self.node.ledger.lock();
        for g in &plan.grants {
            let mut usage = crate::ledger::GpuUsage::default();
            for a in ledger.allocations() {
                if a.slots.iter().any(|s| plan.slots.contains(s)) {
                    continue;
                }
                for held in a.grants.iter().filter(|h| h.uuid == g.uuid) {
                    usage.memory_mib += held.memory_mib;
                    usage.compute_milli += held.compute_milli;
                    usage.whole |= a.is_whole();
                }
            }
            let total = self.node.device(&g.uuid).map_or(0, |d| d.memory_total_mib);
            if usage.whole {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {} is held whole by a pod without assignment; cannot add a share to it",
                    g.uuid
                )));
            }
            if usage.memory_mib + g.memory_mib > total
                || usage.compute_milli + g.compute_milli > 1000
            {
                return Err(ProviderError::FailedPrecondition(format!(
                    "assignment would overcommit GPU {}: {} MiB + {} MiB of {} MiB, {} + {} of 1000 milli-GPU",
                    g.uuid,
                    usage.memory_mib,
                    g.memory_mib,
                    total,
                    usage.compute_milli,
                    g.compute_milli
                )));
            }
        }
        Ok(())
    }

    fn response(&self, plan: &Plan, prepared: &Prepared) -> api::ContainerAllocateResponse {
        let cdi = self.node.options().cdi;
        match prepared {
            Prepared::Plain => container_response(cdi, &plan.grants, None),
            Prepared::Mig(instances) => {
                let uuids: Vec<String> = instances.iter().map(|i| i.uuid.clone()).collect();
                container_response(cdi, &plan.grants, Some(&uuids))
            }
            Prepared::Mps(_, paths) => {
                let mut response = container_response(cdi, &plan.grants, None);
                // `mode_of` admits MPS containers with exactly one GPU.
                if let Some(g) = plan.grants.first() {
                    response.envs.extend(mps::client_env(
                        g.memory_mib,
                        g.compute_milli,
                        &paths.pipe,
                    ));
                }
                let pipe = paths.pipe.display().to_string();
                response.mounts.push(api::Mount {
                    container_path: pipe.clone(),
                    host_path: pipe,
                    read_only: false,
                });
                // The daemon's shared memory: without it the client cannot attach and
                // would run with no limits at all.
                response.mounts.push(api::Mount {
                    container_path: "/dev/shm".to_owned(),
                    host_path: paths.shm.display().to_string(),
                    read_only: false,
                });
                response
            }
        }
    }
}

/// The container's devices and limit variables for `grants`; `devices` replaces the
/// GPU UUIDs in the device list (MIG instance UUIDs, in grant order).
fn container_response(
    cdi: bool,
    grants: &[Grant],
    devices: Option<&[String]>,
) -> api::ContainerAllocateResponse {
    let ids: Vec<String> = match devices {
        Some(d) => d.to_vec(),
        None => grants.iter().map(|g| g.uuid.clone()).collect(),
    };
    let join = |f: &dyn Fn(&Grant) -> String| grants.iter().map(f).collect::<Vec<_>>().join(",");
    let mut envs = HashMap::new();
    envs.insert(
        ENV_MEMORY_LIMIT.to_owned(),
        join(&|g| g.memory_mib.to_string()),
    );
    envs.insert(
        ENV_COMPUTE_PERCENT.to_owned(),
        join(&|g| (g.compute_milli.div_ceil(10)).to_string()),
    );
    let mut response = api::ContainerAllocateResponse::default();
    if cdi {
        response.cdi_devices = ids
            .iter()
            .map(|id| api::CdiDevice {
                name: format!("{GPU_RESOURCE}={id}"),
            })
            .collect();
    } else {
        envs.insert(ENV_VISIBLE_DEVICES.to_owned(), ids.join(","));
    }
    response.envs = envs;
    response
}

#[tonic::async_trait]
impl DeviceProvider for GpuPlugin {
    fn devices(&self) -> DeviceWatch {
        self.node.gpu_list().watch()
    }

    fn options(&self) -> PluginOptions {
        PluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }

    fn registering(&self) {
        self.mark_unconfirmed();
    }

    async fn preferred_allocation(
        &self,
        request: api::PreferredAllocationRequest,
    ) -> Result<api::PreferredAllocationResponse, ProviderError> {
        let sizes: Vec<usize> = request
            .container_requests
            .iter()
            .map(|r| usize::try_from(r.allocation_size).unwrap_or(0))
            .collect();
        self.await_candidates(&sizes).await;
        let mut container_responses = Vec::new();
        for req in &request.container_requests {
            container_responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: self.preferred_one(req)?,
            });
        }
        Ok(api::PreferredAllocationResponse {
            container_responses,
        })
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let sizes: Vec<usize> = request
            .container_requests
            .iter()
            .map(|r| r.devices_ids.len())
            .collect();
        self.await_candidates(&sizes).await;
        let started = Instant::now();
        let result = match self.plan_request(&request) {
            Ok(plans) if plans.iter().all(|p| p.mode == Mode::Plain) => self.commit(&plans, &[]),
            Ok(plans) => self.allocate_enforced(&plans).await,
            Err(e) => Err(e),
        };
        self.node.metrics.observe_allocate(started.elapsed());
        if result.is_ok() {
            self.node.bump();
        }
        result
    }
}

impl GpuPlugin {
    fn plan_request(&self, request: &api::AllocateRequest) -> Result<Vec<Plan>, ProviderError> {
        let mut plans: Vec<Plan> = Vec::new();
        for req in &request.container_requests {
            let mut plan = self.plan(&req.devices_ids, &plans)?;
            self.check_capacity(&plan)?;
            plan.mode = self.mode_of(&plan)?;
            plans.push(plan);
        }
        Ok(plans)
    }

    /// Sets up MPS daemons and MIG instances for `plans`, then records them; whatever
    /// was created is removed again when the allocation fails.
    async fn allocate_enforced(
        &self,
        plans: &[Plan],
    ) -> Result<api::AllocateResponse, ProviderError> {
        let mut prepared = Vec::new();
        let mut made: Vec<String> = Vec::new();
        let mut outcome = Ok(());
        for plan in plans {
            match self.prepare(plan, &mut made).await {
                Ok(p) => prepared.push(p),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // Other Allocates may have run while this one waited.
        let outcome =
            outcome.and_then(|()| plans.iter().try_for_each(|plan| self.check_capacity(plan)));
        let result = outcome.and_then(|()| self.commit(plans, &prepared));
        if result.is_err() {
            self.abandon(made).await;
        }
        result
    }

    async fn prepare(
        &self,
        plan: &Plan,
        made: &mut Vec<String>,
    ) -> Result<Prepared, ProviderError> {
        match plan.mode {
            Mode::Plain => Ok(Prepared::Plain),
            Mode::Mps => {
                let (Some(mps), Some(g)) = (&self.mps, plan.grants.first()) else {
                    return Err(ProviderError::Internal(
                        "MPS plan without an MPS manager or a GPU".into(),
                    ));
                };
                let paths = mps
                    .ensure(&g.uuid)
                    .await
                    .map_err(|e| ProviderError::FailedPrecondition(e.to_string()))?;
                Ok(Prepared::Mps(g.uuid.clone(), paths))
            }
            Mode::Mig => {
                let Some(mig) = &self.mig else {
                    return Err(ProviderError::Internal(
                        "MIG plan without a MIG manager".into(),
                    ));
                };
                let mut instances = Vec::new();
                for g in &plan.grants {
                    let Some(device) = self.node.device(&g.uuid).cloned() else {
                        return Err(ProviderError::Internal(format!("GPU {} vanished", g.uuid)));
                    };
                    let (mig, grant, slots) = (Arc::clone(mig), g.clone(), plan.slots.clone());
                    let created = tokio::task::spawn_blocking(move || {
                        mig.create_for(&device, grant.memory_mib, grant.compute_milli, &slots)
                    })
                    .await
                    .map_err(|e| ProviderError::Internal(e.to_string()))?;
                    let instance = created.map_err(|e| match e {
                        MigError::Gpu(_) => ProviderError::Unavailable(e.to_string()),
                        _ => ProviderError::FailedPrecondition(e.to_string()),
                    })?;
                    made.push(instance.uuid.clone());
                    instances.push(instance);
                }
                Ok(Prepared::Mig(instances))
            }
        }
    }

    /// Destroys the MIG instances an Allocate made before it failed.
    async fn abandon(&self, made: Vec<String>) {
        let Some(mig) = self.mig.clone() else {
            return;
        };
        if made.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for uuid in made {
                mig.abandon(&uuid);
            }
        })
        .await;
    }

    /// Records `plans` in the ledger and answers; `prepared` (empty on the plain path)
    /// holds what was set up for each plan.
    fn commit(
        &self,
        plans: &[Plan],
        prepared: &[Prepared],
    ) -> Result<api::AllocateResponse, ProviderError> {
        let mut container_responses = Vec::new();
        let mut ids = Vec::new();
        {
            let mut ledger = self.node.ledger.lock();
            for (k, plan) in plans.iter().enumerate() {
                for old in ledger
                    .remove_holding(&plan.slots)
                    .map_err(|e| ProviderError::Internal(e.to_string()))?
                {
                    tracing::info!(id = old.id, pod = ?old.pod, "slots handed out again; previous holder released");
                }
                let id = ledger
                    .insert(Allocation {
                        id: 0,
                        resource: GPU_RESOURCE.to_owned(),
                        slots: plan.slots.clone(),
                        grants: plan.grants.clone(),
                        pod: plan.pod.clone(),
                        container: plan.container.clone(),
                        origin: plan.origin,
                        at_unix_ms: now_unix_ms(),
                    })
                    .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
                let prepared = prepared.get(k).unwrap_or(&Prepared::Plain);
                container_responses.push(self.response(plan, prepared));
                ids.push(id);
            }
        }
        for (id, prepared) in ids.into_iter().zip(prepared) {
            match prepared {
                Prepared::Plain => {}
                Prepared::Mps(gpu, _) => {
                    if let Some(mps) = &self.mps {
                        mps.attach(gpu, id);
                    }
                }
                Prepared::Mig(instances) => {
                    if let Some(mig) = &self.mig {
                        for i in instances {
                            mig.bind(&i.uuid, id);
                        }
                    }
                }
            }
        }
        let mut reservations = self.reservations.lock();
        for plan in plans {
            if let (Some(pod), Some(container)) = (&plan.pod, &plan.container) {
                reservations.retain(|r| !(r.pod == *pod && r.container == *container));
                tracing::info!(pod = %pod, container, slots = ?plan.slots, origin = ?plan.origin, "allocated");
            } else {
                tracing::info!(slots = ?plan.slots, "allocated whole GPUs");
            }
        }
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

/// The `nvidia.com/mig-<profile>` provider for one profile.
pub struct MigPlugin {
    node: Arc<Node>,
    profile: String,
}

impl MigPlugin {
    /// A provider for `profile` on `node`.
    pub fn new(node: Arc<Node>, profile: impl Into<String>) -> Self {
        Self {
            node,
            profile: profile.into(),
        }
    }
}

#[tonic::async_trait]
impl DeviceProvider for MigPlugin {
    fn devices(&self) -> DeviceWatch {
        match self.node.mig_lists().get(&self.profile) {
            Some(list) => list.watch(),
            // The server is only built for profiles that exist.
            None => tessera_device_plugin::DeviceList::new(Vec::new()).watch(),
        }
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let resource = mig_resource(&self.profile);
        let mut responses = Vec::new();
        let mut ledger = self.node.ledger.lock();
        for req in &request.container_requests {
            let mut grants = Vec::new();
            for id in &req.devices_ids {
                let (gpu, mig) = self.node.mig_device(id).ok_or_else(|| {
                    ProviderError::InvalidRequest(format!(
                        "{id:?} is not a MIG device of this node"
                    ))
                })?;
                if !self.node.mig_healthy(id) {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "MIG device {id} (GPU {}) is unhealthy",
                        gpu.uuid
                    )));
                }
                grants.push(Grant {
                    uuid: mig.uuid.clone(),
                    memory_mib: mig.memory_total_mib,
                    compute_milli: 1000,
                });
            }
            ledger
                .remove_holding(&req.devices_ids)
                .and_then(|_| {
                    ledger.insert(Allocation {
                        id: 0,
                        resource: resource.clone(),
                        slots: req.devices_ids.clone(),
                        grants: grants.clone(),
                        pod: None,
                        container: None,
                        origin: Origin::Whole,
                        at_unix_ms: now_unix_ms(),
                    })
                })
                .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
            responses.push(container_response(self.node.options().cdi, &grants, None));
        }
        drop(ledger);
        self.node.bump();
        Ok(api::AllocateResponse {
            container_responses: responses,
        })
    }
}

/// All slot ids of GPU `uuid` (for tests and tools).
pub fn slots_of(node: &Node, uuid: &str) -> Vec<String> {
    (0..node.options().shares_per_gpu)
        .map(|k| slot_id(uuid, k))
        .collect()
}
