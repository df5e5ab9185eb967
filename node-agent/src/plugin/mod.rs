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
//! The matching is [`matcher`]'s, pure over one snapshot; this module takes the snapshot and
//! records the answer under one acquisition of the ledger lock ([`GpuPlugin`]'s
//! `under_one_lock`), so two Allocates racing for one GPU never both pass its capacity check.
//!
//! A restarted kubelet asks again for an allocation it was answered but had not yet
//! checkpointed. Allocations made before a (re-)registration for pods that have not started
//! are therefore unconfirmed until pod-resources lists them: one whose pod the kubelet lists
//! without devices for that container was lost, and its container is pending again.
//!
//! Pods with `tessera.dev/isolation: mps` also get their GPU's MPS daemon (started on
//! demand) and its client limits; a pod assigned a GPU in MIG mode (advertised only
//! with `--mig-create`) gets a MIG instance created for it. Both are set up right after the
//! allocation is recorded (which claims the capacity), and the record is dropped again if
//! they cannot be; the common watchdog path does neither and stays synchronous.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_device_plugin::{DeviceProvider, DeviceWatch, PluginOptions, ProviderError, api};

use crate::assignments::{AssignmentSource, SourceKind};
use crate::enforce::mig::MigManager;
use crate::enforce::mps::MpsManager;
use crate::ledger::{Allocation, Ledger, now_unix_ms};
use crate::node::Node;
use enforced::Isolators;
use matcher::{GpuView, NodeView, Plan, PreferredRequest, Refusal, Reservation, Snapshot};
use restart::Unconfirmed;
use tessera_contract::keys::GPU_RESOURCE;

mod enforced;
pub(crate) mod matcher;
mod mig;
mod response;
mod restart;

pub use mig::{MigPlugin, slots_of};

/// How long GetPreferredAllocation / Allocate wait for the source to deliver a pod the
/// kubelet is already asking about. The kubelet admits one pod at a time, so this bounds
/// how long one pod can hold up the node's admissions; with the coordinator announcing each
/// pod before its Binding is sent, the agent normally knows a pod before its kubelet does.
const WATCH_CATCH_UP: Duration = Duration::from_secs(5);

/// How often a request the source cannot own yet looks again.
const CATCH_UP_POLL: Duration = Duration::from_millis(10);

/// Environment variable listing the container's GPUs.
pub const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Environment variable with the memory limit per GPU (MiB, comma-separated in
/// `NVIDIA_VISIBLE_DEVICES` order).
pub const ENV_MEMORY_LIMIT: &str = "TESSERA_GPU_MEMORY_LIMIT_MIB";
/// Environment variable with the compute share per GPU (percent, same order).
pub const ENV_COMPUTE_PERCENT: &str = "TESSERA_GPU_COMPUTE_PERCENT";

/// The `nvidia.com/gpu` provider.
pub struct GpuPlugin {
    node: Arc<Node>,
    source: Arc<dyn AssignmentSource>,
    /// Slot sets preferred answers steered to pending containers. Locked only inside the
    /// ledger's lock (in that order), in `under_one_lock`.
    reservations: Mutex<Vec<Reservation>>,
    isolators: Isolators,
    /// The kubelet's pod-resources socket, to settle unconfirmed allocations.
    pod_resources: Option<PathBuf>,
    /// Allocations a restarted kubelet may have lost.
    unconfirmed: Unconfirmed,
}

impl From<Refusal> for ProviderError {
    fn from(refusal: Refusal) -> Self {
        if refusal.is_invalid_request() {
            ProviderError::InvalidRequest(refusal.to_string())
        } else {
            ProviderError::FailedPrecondition(refusal.to_string())
        }
    }
}

impl GpuPlugin {
    /// A provider over `node` taking assignments from `source`.
    pub fn new(node: Arc<Node>, source: Arc<dyn AssignmentSource>) -> Self {
        Self {
            node,
            source,
            reservations: Mutex::new(Vec::new()),
            isolators: Isolators::default(),
            pod_resources: None,
            unconfirmed: Unconfirmed::default(),
        }
    }

    /// Settles allocations a restarted kubelet may have lost through `socket` (its
    /// pod-resources API); without it they are kept as they are.
    pub fn with_pod_resources(mut self, socket: PathBuf) -> Self {
        self.pod_resources = Some(socket);
        self
    }

    /// Serves `isolation: mps` pods through `mps`, and creates MIG instances through
    /// `mig` (present only with `--mig-create`).
    pub fn with_enforcement(
        mut self,
        mps: Option<Arc<MpsManager>>,
        mig: Option<Arc<MigManager>>,
    ) -> Self {
        self.isolators = Isolators { mps, mig };
        self
    }

    /// The node as the matcher sees it now: its GPUs with their health, and what this agent
    /// can set up.
    fn view(&self) -> NodeView<'_> {
        let node = &self.node;
        NodeView {
            gpus: node
                .devices()
                .iter()
                .map(|d| {
                    let health = node.health(&d.uuid);
                    GpuView {
                        uuid: d.uuid.clone(),
                        index: d.index,
                        memory_total_mib: d.memory_total_mib,
                        mig_mode: d.mig.is_some(),
                        slots: node.slot_gpus().any(|s| s.uuid == d.uuid),
                        healthy: health.healthy,
                        xid: health.xid,
                    }
                })
                .collect(),
            shares_per_gpu: node.options().shares_per_gpu,
            topology: node.topology(),
            source: self.source.kind(),
            mps: self.isolators.mps.is_some(),
            mig_create: self.isolators.mig.is_some(),
        }
    }

    /// Decides and records a request of `sizes` under one acquisition of the ledger lock:
    /// the snapshot (pending pods, reservations, the ledger, the node, the time) is taken,
    /// `decide` (pure) is called on it and `record` writes its outcome to the ledger and the
    /// reservations before the lock is let go. While no pending pod could own a request of
    /// each size ([`matcher::ready`]) it looks again, each look one acquisition that decides
    /// nothing, for at most [`WATCH_CATCH_UP`]: the kubelet and the source see a binding
    /// independently. Returns the outcome and how long it waited for the source.
    async fn under_one_lock<D, T>(
        &self,
        sizes: &[usize],
        decide: impl Fn(&Snapshot<'_>) -> D,
        mut record: impl FnMut(D, &mut Ledger, &mut Vec<Reservation>) -> T,
    ) -> (T, Duration) {
        let kind = self.source.kind();
        if kind != SourceKind::None {
            let pending = || self.source.pending();
            self.unconfirmed
                .settle(&self.node, self.pod_resources.as_deref(), pending)
                .await;
        }
        let began = Instant::now();
        let deadline = began + WATCH_CATCH_UP;
        loop {
            let pending = self.source.pending();
            let view = self.view();
            let outcome = {
                let mut ledger = self.node.ledger.lock();
                let mut reservations = self.reservations.lock();
                let now = Instant::now();
                reservations.retain(|r| r.live_at(now));
                let snapshot = Snapshot {
                    node: &view,
                    pending: &pending,
                    reservations: &reservations,
                    allocations: ledger.allocations(),
                    now,
                };
                if matcher::ready(&snapshot, sizes) || now >= deadline {
                    let decision = decide(&snapshot);
                    Some(record(decision, &mut ledger, &mut reservations))
                } else {
                    None
                }
            };
            if let Some(outcome) = outcome {
                let waited = began.elapsed();
                if kind != SourceKind::None {
                    self.node.metrics.observe_pod_wait(waited);
                }
                return (outcome, waited);
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }

    /// Sets up the MPS daemons and MIG instances `plans` (recorded as `ids`) need and
    /// answers; when that fails, the records are dropped and what was created destroyed.
    async fn finish(
        &self,
        plans: &[Plan],
        ids: &[u64],
    ) -> Result<api::AllocateResponse, ProviderError> {
        let cdi = self.node.options().cdi;
        let mut made: Vec<String> = Vec::new();
        let mut container_responses = Vec::new();
        for (plan, &id) in plans.iter().zip(ids) {
            match self
                .isolators
                .prepare(&self.node, plan, id, &mut made)
                .await
            {
                Ok(prepared) => {
                    self.isolators.attach(&prepared, id);
                    container_responses.push(response::response(cdi, plan, &prepared));
                }
                Err(error) => {
                    let dropped = self.node.ledger.lock().remove(ids);
                    if let Err(e) = dropped {
                        tracing::warn!(error = %e, "could not drop the records of a failed Allocate");
                    }
                    self.isolators.abandon(made).await;
                    return Err(error);
                }
            }
        }
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

/// Records `plans` in `ledger` (releasing the previous holders of their slots) and returns
/// their allocation ids; when one cannot be recorded, none is.
fn record(ledger: &mut Ledger, plans: &[Plan]) -> Result<Vec<u64>, ProviderError> {
    let mut ids = Vec::new();
    for plan in plans {
        let recorded = ledger.remove_holding(&plan.slots).and_then(|gone| {
            for old in gone {
                tracing::info!(id = old.id, pod = ?old.pod, uid = ?old.pod_uid,
                    "slots handed out again; previous holder released");
            }
            ledger.insert(Allocation {
                id: 0,
                resource: GPU_RESOURCE.to_owned(),
                slots: plan.slots.clone(),
                grants: plan.grants.clone(),
                pod: plan.owner.as_ref().map(|o| o.pod.clone()),
                pod_uid: plan.owner.as_ref().map(|o| o.uid.clone()),
                container: plan.owner.as_ref().map(|o| o.container.clone()),
                isolation: plan.isolation,
                origin: plan.origin,
                at_unix_ms: now_unix_ms(),
            })
        });
        match recorded {
            Ok(id) => ids.push(id),
            Err(error) => {
                let _ = ledger.remove(&ids);
                return Err(ProviderError::Unavailable(error.to_string()));
            }
        }
    }
    Ok(ids)
}

/// Says what each of `plans` got.
fn log_allocated(plans: &[Plan]) {
    for plan in plans {
        if plan.mig_watched {
            tracing::warn!(container = %plan.who(),
                "isolation mig on a GPU not in MIG mode; limits are watched instead");
        }
        match &plan.owner {
            Some(o) => tracing::info!(pod = %o.pod, uid = %o.uid, container = o.container,
                slots = ?plan.slots, origin = ?plan.origin, isolation = %plan.isolation, "allocated"),
            None => tracing::info!(slots = ?plan.slots, "allocated whole GPUs"),
        }
    }
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
        self.unconfirmed.mark(&self.node, &self.source.pending());
    }

    async fn preferred_allocation(
        &self,
        request: api::PreferredAllocationRequest,
    ) -> Result<api::PreferredAllocationResponse, ProviderError> {
        let requests: Vec<PreferredRequest<'_>> = request
            .container_requests
            .iter()
            .map(|r| PreferredRequest {
                size: usize::try_from(r.allocation_size).unwrap_or(0),
                available: &r.available_device_i_ds,
                must_include: &r.must_include_device_i_ds,
            })
            .collect();
        let sizes: Vec<usize> = requests.iter().map(|r| r.size).collect();
        let (answers, _) = self
            .under_one_lock(
                &sizes,
                |snapshot| matcher::preferred(snapshot, &requests),
                |answers, _, reservations| {
                    matcher::reserve(reservations, &answers);
                    answers
                },
            )
            .await;
        Ok(api::PreferredAllocationResponse {
            container_responses: answers
                .into_iter()
                .map(|a| api::ContainerPreferredAllocationResponse {
                    device_i_ds: a.slots,
                })
                .collect(),
        })
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let began = Instant::now();
        let requests: Vec<Vec<String>> = request
            .container_requests
            .into_iter()
            .map(|r| r.devices_ids)
            .collect();
        let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
        let (recorded, waited) = self
            .under_one_lock(
                &sizes,
                |snapshot| matcher::allocate(snapshot, &requests),
                |decision, ledger, reservations| {
                    let plans = decision?;
                    let ids = record(ledger, &plans)?;
                    matcher::release(reservations, &plans);
                    Ok::<_, ProviderError>((plans, ids))
                },
            )
            .await;
        let result = match recorded {
            Ok((plans, ids)) => {
                log_allocated(&plans);
                self.finish(&plans, &ids).await
            }
            Err(error) => Err(error),
        };
        self.node
            .metrics
            .observe_allocate(began.elapsed().saturating_sub(waited));
        if result.is_ok() {
            self.node.bump();
        }
        result
    }
}

#[cfg(test)]
mod tests;
