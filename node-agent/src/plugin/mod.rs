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

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_device_plugin::{DeviceProvider, DeviceWatch, PluginOptions, ProviderError, api};

use crate::assignments::AssignmentSource;
use crate::enforce::mig::{MigError, MigManager};
use crate::enforce::mps::{self, MpsManager, MpsPaths};
use crate::gpu::MigInstance;
use crate::ledger::{Grant, Origin, PodRef, PodUid};
use crate::node::Node;
use tessera_contract::GpuSlice;
use tessera_contract::Isolation;

mod enforced;
mod matching;
mod mig;
mod response;
mod restart;

pub use mig::{MigPlugin, slots_of};

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
    uid: PodUid,
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

/// A pending container an Allocate can be for.
#[derive(Debug, Clone)]
struct Candidate {
    /// Its pod's UID, what it is recorded under.
    uid: PodUid,
    /// Its pod's namespace and name, for messages.
    pod: PodRef,
    /// The container's name.
    container: String,
    /// Its assigned GPUs (empty for a pod without an assignment).
    gpus: Vec<GpuSlice>,
    /// The pod's `tessera.dev/isolation` when the request came.
    isolation: Isolation,
}

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
    /// Its pod and container; `None` for whole GPUs without a pod (no cluster).
    owner: Option<Candidate>,
    origin: Origin,
    mode: Mode,
    /// The isolation recorded with the allocation: what `mode` enforces, fixed from then on.
    isolation: Isolation,
}

impl Plan {
    /// `ns/name/container`, or a placeholder for whole GPUs without a pod.
    fn who(&self) -> String {
        match &self.owner {
            Some(o) => format!("{}/{}", o.pod, o.container),
            None => "a container without a pod".to_owned(),
        }
    }

    fn is_for(&self, uid: &PodUid, container: &str) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| o.uid == *uid && o.container == container)
    }
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
            plan.isolation = recorded_isolation(plan.mode, plan.isolation);
            plans.push(plan);
        }
        Ok(plans)
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
