//! The device-plugin implementations: `nvidia.com/gpu` share slots ([`GpuPlugin`]) and
//! `nvidia.com/mig-<profile>` devices ([`MigPlugin`]).
//!
//! The kubelet never says which pod it is allocating for, so the pod is recognised
//! from what it asks: `GetPreferredAllocation` picks the oldest pending pod whose
//! request size matches and whose assigned GPUs have free slots, answers with slots on
//! exactly those GPUs and remembers that slot set; `Allocate` with that slot set is
//! that pod. An `Allocate` without a remembered set is matched by size and by the GPUs
//! its slots are on. A request matching no assignment gets whole free GPUs when that is
//! allowed (no cluster, or a pending pod without an assignment), and otherwise fails
//! with a message saying why — never some other pod's share.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_device_plugin::{DeviceProvider, DeviceWatch, PluginOptions, ProviderError, api};

use crate::assignments::{AssignmentSource, GpuSlice};
use crate::ledger::{Allocation, Grant, Origin, PodRef, now_unix_ms};
use crate::node::{GPU_RESOURCE, Node, mig_resource, slot_id};

/// How long GetPreferredAllocation / Allocate wait for the pod watch to deliver a pod
/// the kubelet is already asking about.
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
}

/// What one container will get.
struct Plan {
    slots: Vec<String>,
    grants: Vec<Grant>,
    pod: Option<PodRef>,
    container: Option<String>,
    origin: Origin,
}

impl GpuPlugin {
    /// A provider over `node` taking assignments from `source`.
    pub fn new(node: Arc<Node>, source: Arc<dyn AssignmentSource>) -> Self {
        Self {
            node,
            source,
            reservations: Mutex::new(Vec::new()),
        }
    }

    fn live_reservations(&self) -> Vec<Reservation> {
        let mut r = self.reservations.lock();
        r.retain(|x| x.at.elapsed() < RESERVATION_TTL);
        r.clone()
    }

    /// Pending assigned containers wanting `size` slots, oldest pod first, skipping
    /// containers already in the ledger.
    fn assigned_candidates(&self, size: usize) -> Vec<(PodRef, String, Vec<GpuSlice>, u64)> {
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
        let deadline = Instant::now() + WATCH_CATCH_UP;
        for &size in sizes {
            while self.assigned_candidates(size).is_empty()
                && !self.unassigned_pending(size)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
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
        })
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

    fn response(&self, plan: &Plan) -> api::ContainerAllocateResponse {
        container_response(self.node.options().cdi, &plan.grants)
    }
}

/// The container's devices and limit variables for `grants`.
fn container_response(cdi: bool, grants: &[Grant]) -> api::ContainerAllocateResponse {
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
        response.cdi_devices = grants
            .iter()
            .map(|g| api::CdiDevice {
                name: format!("{GPU_RESOURCE}={}", g.uuid),
            })
            .collect();
    } else {
        envs.insert(ENV_VISIBLE_DEVICES.to_owned(), join(&|g| g.uuid.clone()));
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
        let result = self.allocate_inner(request);
        self.node.metrics.observe_allocate(started.elapsed());
        if result.is_ok() {
            self.node.bump();
        }
        result
    }
}

impl GpuPlugin {
    fn allocate_inner(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let mut plans: Vec<Plan> = Vec::new();
        for req in &request.container_requests {
            let plan = self.plan(&req.devices_ids, &plans)?;
            self.check_capacity(&plan)?;
            plans.push(plan);
        }
        let mut container_responses = Vec::new();
        {
            let mut ledger = self.node.ledger.lock();
            for plan in &plans {
                for old in ledger
                    .remove_holding(&plan.slots)
                    .map_err(|e| ProviderError::Internal(e.to_string()))?
                {
                    tracing::info!(id = old.id, pod = ?old.pod, "slots handed out again; previous holder released");
                }
                ledger
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
                container_responses.push(self.response(plan));
            }
        }
        let mut reservations = self.reservations.lock();
        for plan in &plans {
            if let (Some(pod), Some(container)) = (&plan.pod, &plan.container) {
                reservations.retain(|r| !(r.pod == *pod && r.container == *container));
                self.source.mark_allocated(pod, container);
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
                if !self.node.health(&gpu.uuid).healthy {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "MIG device {id} is on unhealthy GPU {}",
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
            responses.push(container_response(self.node.options().cdi, &grants));
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
