//! The agent's view of its node: the GPUs, their topology and health, the advertised
//! device lists, and the ledger. Shared by the device plugins, the XID watcher, the
//! reconciler and the admin socket.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_contract::keys;
use tessera_device_plugin::{Device, DeviceList, Health};

use crate::gpu::{GpuBackend, GpuCondition, GpuDevice, GpuError, XidEvent, resource_profile};
use crate::ledger::{Ledger, LedgerLock};
use crate::topology::Topology;

/// The resource of MIG devices with `profile`, named as NVIDIA's device plugin names it
/// (`1g.10gb+me` → `nvidia.com/mig-1g.10gb.me`).
pub fn mig_resource(profile: &str) -> String {
    format!("{}{}", keys::MIG_RESOURCE_PREFIX, resource_profile(profile))
}

impl NodeOptions {
    /// Refuses combinations that cannot work: MIG instances created during Allocate
    /// (`--mig-create`) exist in no CDI spec, so a CDI name for one would fail at
    /// container creation.
    pub fn validate(&self) -> Result<(), String> {
        if self.cdi && self.mig_slots {
            return Err(
                "--cdi with --mig-create: MIG instances the agent creates during Allocate are in \
                 no CDI spec (nvidia-ctk generates specs for the instances that exist when it \
                 runs), so their CDI names would fail at container creation; use \
                 NVIDIA_VISIBLE_DEVICES (drop --cdi) with --mig-create, or pre-create the \
                 instances and regenerate the CDI spec"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// Settings that shape what is advertised and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeOptions {
    /// Slots per healthy GPU (`sharesPerGpu`).
    pub shares_per_gpu: u32,
    /// Answer Allocate with CDI device names instead of `NVIDIA_VISIBLE_DEVICES`.
    pub cdi: bool,
    /// Also advertise slots on GPUs in MIG mode (`--mig-create`): a MIG pod assigned
    /// such a GPU is admitted on a slot and gets a MIG instance created for it.
    pub mig_slots: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            shares_per_gpu: 10,
            cdi: false,
            mig_slots: false,
        }
    }
}

/// Health of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// Whether the GPU may be handed out.
    pub healthy: bool,
    /// The fatal XID that made it unhealthy.
    pub xid: Option<u64>,
    /// Why it is unhealthy apart from an XID: lost, inventory fault, fabric not ready.
    #[serde(default)]
    pub reason: Option<String>,
}

impl GpuHealth {
    fn from_parts(xid: Option<u64>, reason: Option<String>) -> Self {
        Self {
            healthy: xid.is_none() && reason.is_none(),
            xid,
            reason,
        }
    }
}

/// This agent's GPU node: its GPUs, their topology and health, the advertised device
/// lists and the ledger, shared by every part of the agent.
pub struct Node {
    backend: Arc<dyn GpuBackend>,
    devices: Vec<GpuDevice>,
    topology: Topology,
    options: NodeOptions,
    health: Mutex<HashMap<String, GpuHealth>>,
    /// MIG devices made unhealthy by their own fatal XIDs.
    bad_mig: Mutex<std::collections::HashSet<String>>,
    /// Who holds what; also the checkpoint.
    pub ledger: LedgerLock,
    /// Event metrics (Allocate latency).
    pub metrics: crate::metrics::Metrics,
    /// Bumped on every change of health or of the ledger (for the reporter).
    changed: tokio::sync::watch::Sender<u64>,
    gpu_list: DeviceList,
    mig_lists: BTreeMap<String, DeviceList>,
}

impl Node {
    /// Reads the inventory from `backend` and builds the advertised lists.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        ledger: Ledger,
        options: NodeOptions,
    ) -> Result<Self, GpuError> {
        options.validate().map_err(GpuError::Config)?;
        let devices = backend.devices()?;
        let topology = Topology::discover(backend.as_ref(), &devices)?;
        let health = devices
            .iter()
            .map(|d| {
                let reason = d
                    .fault
                    .clone()
                    .or_else(|| unready(backend.condition(&d.uuid)));
                if let Some(reason) = &reason {
                    tracing::warn!(gpu = %d.uuid, index = d.index, %reason, "GPU starts unhealthy");
                }
                (d.uuid.clone(), GpuHealth::from_parts(None, reason))
            })
            .collect();
        let mut mig: BTreeMap<String, Vec<Device>> = BTreeMap::new();
        for d in &devices {
            for m in d.mig.iter().flatten() {
                let mut dev = Device::healthy(m.uuid.clone());
                if d.fault.is_some() {
                    dev.health = Health::Unhealthy;
                }
                dev.numa_node = d.numa_node.map(i64::from);
                mig.entry(m.profile.clone()).or_default().push(dev);
            }
        }
        let node = Self {
            gpu_list: DeviceList::new(Vec::new()),
            mig_lists: mig
                .into_iter()
                .map(|(profile, list)| (profile, DeviceList::new(list)))
                .collect(),
            backend,
            devices,
            topology,
            options,
            health: Mutex::new(health),
            bad_mig: Mutex::new(Default::default()),
            ledger: LedgerLock::new(ledger),
            metrics: crate::metrics::Metrics::default(),
            changed: tokio::sync::watch::Sender::new(0),
        };
        node.gpu_list.replace(node.slot_devices());
        Ok(node)
    }

    fn slot_devices(&self) -> Vec<Device> {
        let health = self.health.lock();
        self.slot_gpus()
            .flat_map(|d| {
                let healthy = health.get(&d.uuid).is_none_or(|h| h.healthy);
                (0..self.options.shares_per_gpu).map(move |k| Device {
                    id: slot_id(&d.uuid, k),
                    health: if healthy {
                        Health::Healthy
                    } else {
                        Health::Unhealthy
                    },
                    // No NUMA hint: the coordinator chose the GPU, and a Topology Manager
                    // policy would otherwise narrow the kubelet's choice to one NUMA node's
                    // slots, which need not hold that GPU (for a one-slot request it always
                    // picks NUMA node 0).
                    numa_node: None,
                })
            })
            .collect()
    }

    /// Frees the shares of the pod with UID `uid`, which left the node (deleted or
    /// finished); a pod created again under its name keeps its own.
    pub fn release_departed(&self, uid: &tessera_contract::PodUid) {
        let released = self.ledger.lock().release_pod(uid);
        match released {
            Ok(gone) if !gone.is_empty() => {
                self.bump();
                let pod = gone
                    .iter()
                    .find_map(|a| a.pod.as_ref().map(ToString::to_string));
                tracing::info!(%uid, pod = pod.as_deref().unwrap_or("-"), released = gone.len(),
                    "pod left; its GPU shares are free");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "releasing a departed pod's shares failed"),
        }
    }

    /// Says that health or the ledger changed.
    pub fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// A receiver woken by every [`Node::bump`].
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The GPU backend (NVML or simulated) the node reads and manages its GPUs through.
    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    /// Every GPU, in index order.
    pub fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    /// GPUs shared as `nvidia.com/gpu` slots (those not in MIG mode).
    pub fn shareable(&self) -> impl Iterator<Item = &GpuDevice> {
        self.devices.iter().filter(|d| d.mig.is_none())
    }

    /// GPUs advertised as `nvidia.com/gpu` slots: the shareable ones, and those in MIG
    /// mode when [`NodeOptions::mig_slots`] is set.
    pub fn slot_gpus(&self) -> impl Iterator<Item = &GpuDevice> {
        let mig_slots = self.options.mig_slots;
        self.devices
            .iter()
            .filter(move |d| d.mig.is_none() || mig_slots)
    }

    /// The link matrix over all GPUs (positions = `devices()` order).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Options.
    pub fn options(&self) -> NodeOptions {
        self.options
    }

    /// The `nvidia.com/gpu` slot list.
    pub fn gpu_list(&self) -> &DeviceList {
        &self.gpu_list
    }

    /// MIG device lists by profile.
    pub fn mig_lists(&self) -> &BTreeMap<String, DeviceList> {
        &self.mig_lists
    }

    /// The GPU with `uuid`.
    pub fn device(&self, uuid: &str) -> Option<&GpuDevice> {
        self.devices.iter().find(|d| d.uuid == uuid)
    }

    /// The shareable GPU a slot id belongs to.
    pub fn slot_gpu(&self, slot: &str) -> Option<&GpuDevice> {
        let (uuid, k) = parse_slot(slot)?;
        (k < self.options.shares_per_gpu)
            .then(|| self.slot_gpus().find(|d| d.uuid == uuid))
            .flatten()
    }

    /// The GPU owning MIG device `mig_uuid`, and the MIG device.
    pub fn mig_device(&self, mig_uuid: &str) -> Option<(&GpuDevice, &crate::gpu::MigDevice)> {
        self.devices.iter().find_map(|d| {
            d.mig
                .iter()
                .flatten()
                .find(|m| m.uuid == mig_uuid)
                .map(|m| (d, m))
        })
    }

    /// Health of GPU `uuid` (unknown GPUs count as unhealthy).
    pub fn health(&self, uuid: &str) -> GpuHealth {
        self.health.lock().get(uuid).cloned().unwrap_or_default()
    }

    /// Asks the backend for every GPU's condition (lost, fabric) and applies changes:
    /// a GPU goes unhealthy while its condition holds and comes back when it clears
    /// (unless a fatal XID or an inventory fault keeps it down). Returns whether
    /// anything changed.
    pub fn refresh_conditions(&self) -> bool {
        let mut changed = false;
        for d in &self.devices {
            let reason = d
                .fault
                .clone()
                .or_else(|| unready(self.backend.condition(&d.uuid)));
            let now = {
                let mut health = self.health.lock();
                let entry = health.entry(d.uuid.clone()).or_default();
                if entry.reason == reason
                    && entry.healthy == (entry.xid.is_none() && reason.is_none())
                {
                    continue;
                }
                *entry = GpuHealth::from_parts(entry.xid, reason);
                entry.clone()
            };
            match &now.reason {
                Some(reason) => {
                    tracing::warn!(gpu = %d.uuid, index = d.index, %reason, "GPU marked unhealthy")
                }
                None => {
                    tracing::info!(gpu = %d.uuid, index = d.index, healthy = now.healthy, "GPU condition cleared")
                }
            }
            self.set_gpu_health(d, now.healthy);
            changed = true;
        }
        if changed {
            self.bump();
        }
        changed
    }

    fn set_gpu_health(&self, gpu: &GpuDevice, healthy: bool) {
        let state = if healthy {
            Health::Healthy
        } else {
            Health::Unhealthy
        };
        let prefix = format!("{}-", gpu.uuid);
        self.gpu_list
            .set_health_where(|id| id.starts_with(&prefix), state);
        let bad_mig = self.bad_mig.lock();
        for m in gpu.mig.iter().flatten() {
            if let Some(list) = self.mig_lists.get(&m.profile) {
                let own = if bad_mig.contains(&m.uuid) {
                    Health::Unhealthy
                } else {
                    state
                };
                list.set_health(&m.uuid, own);
            }
        }
    }

    /// Applies an XID event: a fatal one on a GPU makes it and all its slots and MIG
    /// devices unhealthy at once; a fatal one in a MIG instance makes that instance
    /// unhealthy, not its GPU (the driver isolates MIG instances). Returns whether
    /// anything changed.
    pub fn on_xid(&self, event: &XidEvent) -> bool {
        if !event.is_fatal() {
            tracing::info!(gpu = %event.uuid, xid = event.xid, "application XID; GPU stays healthy");
            return false;
        }
        let gpu = match self.device(&event.uuid) {
            Some(d) => d,
            None => match self.mig_device(&event.uuid) {
                Some((d, m)) => {
                    if !self.bad_mig.lock().insert(m.uuid.clone()) {
                        return false;
                    }
                    tracing::warn!(gpu = %d.uuid, mig = %m.uuid, xid = event.xid, "fatal XID in a MIG instance: that instance marked unhealthy");
                    if let Some(list) = self.mig_lists.get(&m.profile) {
                        list.set_health(&m.uuid, Health::Unhealthy);
                    }
                    self.bump();
                    return true;
                }
                None => {
                    tracing::warn!(gpu = %event.uuid, xid = event.xid, "XID on an unknown device");
                    return false;
                }
            },
        };
        {
            let mut health = self.health.lock();
            let entry = health.entry(gpu.uuid.clone()).or_default();
            if entry.xid.is_some() {
                return false;
            }
            *entry = GpuHealth::from_parts(Some(event.xid), entry.reason.clone());
        }
        tracing::warn!(gpu = %gpu.uuid, index = gpu.index, xid = event.xid, "fatal XID: GPU marked unhealthy");
        self.set_gpu_health(gpu, false);
        self.bump();
        true
    }

    /// Health of MIG device `mig_uuid`: its GPU's, and its own XIDs.
    pub fn mig_healthy(&self, mig_uuid: &str) -> bool {
        let Some((gpu, _)) = self.mig_device(mig_uuid) else {
            return false;
        };
        self.health(&gpu.uuid).healthy && !self.bad_mig.lock().contains(mig_uuid)
    }
}

/// The reason a condition keeps a GPU from being handed out.
fn unready(condition: GpuCondition) -> Option<String> {
    match condition {
        GpuCondition::Ready => None,
        GpuCondition::Lost(why) => Some(format!("lost: {why}")),
        GpuCondition::FabricNotReady(why) => Some(format!("NVSwitch fabric not ready: {why}")),
    }
}

/// Slot `k` of GPU `uuid`.
pub fn slot_id(uuid: &str, k: u32) -> String {
    format!("{uuid}-{k}")
}

/// The GPU UUID and the index of slot id `slot` (`<gpu-uuid>-<k>`, as [`slot_id`] writes it);
/// `None` for any other text. Whether the GPU and the index exist is the caller's to check.
pub fn parse_slot(slot: &str) -> Option<(&str, u32)> {
    let (uuid, k) = slot.rsplit_once('-')?;
    Some((uuid, k.parse().ok()?))
}
