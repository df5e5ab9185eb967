//! A simulated GPU machine read from a `hack/gpus/*.yaml` shape (format in
//! `hack/gpus/README.md`). Tests and demos drive it at runtime: processes with memory
//! and utilisation come and go, XID faults are injected, and the agent sees them
//! through the same [`GpuBackend`] trait as real hardware.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tessera_gpushape::{Fabric, GpuShape, RemoteType};

use super::{
    GpuBackend, GpuCondition, GpuDevice, GpuError, GpuProcess, GpuSample, LinkPeer, MigDevice,
    NvLink, PcieRelation, UtilizationCursor, UtilizationSample, XidEvent, resolve_link_peers,
    resource_profile,
};
use super::{MigInstance, MigProfile};
use crate::gpu::mig::{Span, fits_at, free_placements};

/// PCIe placement of one simulated GPU.
#[derive(Debug, Clone, Copy)]
struct PciePlace {
    numa: Option<u32>,
    switch: u32,
}

/// Fabric states the simulator models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFabric {
    /// No NVSwitch fabric.
    None,
    /// Registered.
    Completed,
    /// The fabric manager is still registering the GPU.
    InProgress,
    /// The fabric manager has not started.
    NotStarted,
    /// Registration failed.
    Failed,
}

impl From<Fabric> for SimFabric {
    fn from(state: Fabric) -> Self {
        match state {
            Fabric::Completed => SimFabric::Completed,
            Fabric::InProgress => SimFabric::InProgress,
            Fabric::NotStarted => SimFabric::NotStarted,
            Fabric::Failed => SimFabric::Failed,
        }
    }
}

#[derive(Debug, Default)]
struct Live {
    /// Processes per GPU uuid.
    processes: HashMap<String, Vec<GpuProcess>>,
    /// The driver's per-process utilisation log per GPU: a sample for every reading in
    /// which a process ran (idle processes get none), kept like NVML's ring buffer.
    util_log: HashMap<String, VecDeque<UtilizationSample>>,
    /// The last timestamp written to `util_log`.
    util_clock: u64,
    /// GPUs that fell off the bus.
    lost: HashSet<String>,
    /// Fabric state per GPU (absent: none).
    fabric: HashMap<String, SimFabric>,
    /// Pending XID events, oldest first.
    events: VecDeque<XidEvent>,
    /// Processes whose utilisation follows their real CPU use, by PID.
    following: HashMap<u32, CpuFollow>,
}

/// A simulated GPU machine.
#[derive(Debug)]
pub struct SimBackend {
    name: String,
    devices: Vec<GpuDevice>,
    pcie: Vec<PciePlace>,
    live: Mutex<Live>,
    event_ready: Condvar,
    /// MIG instances and slices, built from the shape on first use.
    mig: Mutex<Option<SimMig>>,
    /// GPUs whose driver does not support XID events (their events never arrive).
    no_events: HashSet<String>,
    /// Per-process utilisation timestamps, as the NVML backend keeps them.
    utilization: UtilizationCursor,
    /// The simulated clock of the utilisation log, microseconds.
    started: Instant,
}

/// Samples the simulated driver keeps per GPU (NVML's buffer holds about this many).
const UTIL_LOG_LEN: usize = 128;

/// PCI bus id the simulated NVSwitches report as the far end of switch links.
const SWITCH_PCI_BUS_ID: &str = "0000:e0:00.0";

impl SimBackend {
    /// Reads a shape file; the machine is named after the file's stem.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, GpuError> {
        let path = path.as_ref();
        let shape = GpuShape::load(path)?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sim".to_owned());
        Self::from_shape(&shape, &stem).map_err(|reason| GpuError::SimFile {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Parses a shape from YAML text for machine `machine`, which is also the name when
    /// the file has none.
    pub fn from_yaml(text: &str, machine: &str) -> Result<Self, String> {
        let shape =
            GpuShape::parse(&format!("<shape of {machine}>"), text).map_err(|e| e.to_string())?;
        Self::from_shape(&shape, machine)
    }

    /// A simulated machine `machine` of shape `file`. GPU UUIDs derive from the machine
    /// and the shape, so two machines built from one shape have GPUs of their own, as real
    /// machines do.
    pub fn from_shape(file: &GpuShape, machine: &str) -> Result<Self, String> {
        let name = file.name.clone().unwrap_or_else(|| machine.to_owned());
        let unknown_links = file.nvlink_remote_type == RemoteType::Unknown;
        let mig_monitor = file.mig_monitor;
        let mut no_events = HashSet::new();
        let mut fabric = HashMap::new();
        if file.gpus.is_empty() {
            return Err("gpus: the simulated backend needs at least one GPU".to_owned());
        }
        let mut devices = Vec::with_capacity(file.gpus.len());
        let mut pcie = Vec::with_capacity(file.gpus.len());
        for (pos, gpu) in file.gpus.iter().enumerate() {
            let pos = pos as u32;
            let uuid = gpu
                .uuid
                .clone()
                .unwrap_or_else(|| derived_uuid("GPU", &format!("{machine}/{name}/{pos}")));
            let reserved = gpu.reserved_mib;
            if !gpu.xid_events {
                no_events.insert(uuid.clone());
            }
            let state = match gpu.fabric {
                None if file.nvswitch => SimFabric::Completed,
                None => SimFabric::None,
                Some(state) => state.into(),
            };
            if state != SimFabric::None {
                fabric.insert(uuid.clone(), state);
            }
            let mig = match &gpu.mig {
                None => None,
                Some(mig) => {
                    let mut instances = Vec::new();
                    for (k, inst) in mig.iter().enumerate() {
                        instances.push(MigDevice {
                            uuid: inst
                                .uuid
                                .clone()
                                .unwrap_or_else(|| derived_uuid("MIG", &format!("{uuid}/{k}"))),
                            // As the NVML backend names it from the device name.
                            profile: resource_profile(&inst.profile),
                            memory_total_mib: inst.memory_mib,
                            compute_slices: crate::gpu::mig::compute_slices_of(&inst.profile),
                        });
                    }
                    Some(instances)
                }
            };
            let mut unknown = Vec::new();
            let mut memory_total_mib = gpu.memory_mib - reserved;
            let mut memory_reserved_mib = reserved;
            if mig.is_some() && !mig_monitor {
                // NVML: a MIG parent's memory needs monitoring privilege. The agent
                // falls back on the full-GPU instance's memory.
                unknown.push(
                    "memory: NVML query nvmlDeviceGetMemoryInfo_v2: no permission (on a GPU in MIG mode this needs monitoring privilege: NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN in the agent's container)".to_owned()
                );
                memory_total_mib = crate::gpu::mig::table_for(&gpu.model, gpu.memory_mib)
                    .and_then(|t| t.iter().map(|p| p.memory_mib).max())
                    .unwrap_or(gpu.memory_mib - reserved);
                memory_reserved_mib = 0;
            }
            devices.push(GpuDevice {
                index: pos,
                uuid,
                model: gpu.model.clone(),
                memory_total_mib,
                memory_reserved_mib,
                numa_node: Some(gpu.numa),
                pci_bus_id: file.pci_bus_id(pos as usize),
                nvlinks: Vec::new(),
                mig,
                unknown,
                fault: None,
            });
            pcie.push(PciePlace {
                numa: Some(gpu.numa),
                // A GPU without a declared switch sits alone behind its own.
                switch: gpu.pcie_switch.unwrap_or(10_000 + pos),
            });
        }
        for link in &file.nvlinks {
            // The shared reader checked both ends exist and differ.
            let (a, b) = (link.a, link.b);
            for (from, to) in [(a, b), (b, a)] {
                let remote = devices[to as usize].pci_bus_id.clone();
                let links = &mut devices[from as usize].nvlinks;
                for _ in 0..link.links {
                    let n = links.len() as u32;
                    links.push(NvLink {
                        link: n,
                        remote_pci_bus_id: remote.clone(),
                        remote: if unknown_links {
                            LinkPeer::Unknown
                        } else {
                            LinkPeer::Gpu
                        },
                    });
                }
            }
        }
        if file.nvswitch {
            let per_gpu = file.nvswitch_links.unwrap_or(18);
            for device in &mut devices {
                // Switch links replace direct bridges, as on real NVSwitch systems.
                device.nvlinks.clear();
                for _ in 0..per_gpu {
                    let n = device.nvlinks.len() as u32;
                    device.nvlinks.push(NvLink {
                        link: n,
                        remote_pci_bus_id: SWITCH_PCI_BUS_ID.to_owned(),
                        remote: if unknown_links {
                            LinkPeer::Unknown
                        } else {
                            LinkPeer::Switch
                        },
                    });
                }
            }
        }
        Ok(Self {
            name,
            devices,
            pcie,
            live: Mutex::new(Live {
                fabric,
                ..Live::default()
            }),
            event_ready: Condvar::new(),
            mig: Mutex::new(None),
            no_events,
            utilization: UtilizationCursor::default(),
            started: Instant::now(),
        })
    }

    /// The shape's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// UUID of the GPU with `index`.
    pub fn uuid_of(&self, index: u32) -> Option<&str> {
        self.devices.get(index as usize).map(|d| d.uuid.as_str())
    }

    /// Index of the GPU with `uuid` (`u32::MAX` when there is none; for tests).
    pub fn devices_index(&self, uuid: &str) -> u32 {
        self.check(uuid).map_or(u32::MAX, |i| i as u32)
    }

    fn check(&self, uuid: &str) -> Result<usize, GpuError> {
        self.devices
            .iter()
            .position(|d| d.uuid == uuid)
            .ok_or_else(|| GpuError::UnknownGpu(uuid.to_owned()))
    }

    /// Starts or updates process `pid` on GPU `uuid`.
    pub fn set_process(
        &self,
        uuid: &str,
        pid: u32,
        memory_used_mib: u64,
        sm_percent: u32,
    ) -> Result<(), GpuError> {
        self.check(uuid)?;
        let mut live = self.live.lock();
        live.following.remove(&pid);
        let list = live.processes.entry(uuid.to_owned()).or_default();
        let process = GpuProcess {
            pid,
            memory_used_mib: Some(memory_used_mib),
            sm_percent: sm_percent.min(100),
        };
        match list.iter_mut().find(|p| p.pid == pid) {
            Some(existing) => *existing = process,
            None => list.push(process),
        }
        Ok(())
    }

    /// Ends process `pid` on GPU `uuid`.
    pub fn remove_process(&self, uuid: &str, pid: u32) -> Result<(), GpuError> {
        self.check(uuid)?;
        let mut live = self.live.lock();
        live.following.remove(&pid);
        if let Some(list) = live.processes.get_mut(uuid) {
            list.retain(|p| p.pid != pid);
        }
        Ok(())
    }

    /// Starts (or updates) real process `pid` on GPU `uuid` holding `memory_used_mib`,
    /// with an SM utilisation that follows the process's real demand for a CPU between
    /// samples (the share of time it was runnable, from `/proc/<pid>/schedstat`, or its
    /// CPU time from `/proc/<pid>/stat`): a busy loop reads 100%, a sleeping or
    /// SIGSTOPped process 0. It leaves the GPU when the real process exits.
    pub fn set_process_cpu_following(
        &self,
        uuid: &str,
        pid: u32,
        memory_used_mib: u64,
    ) -> Result<(), GpuError> {
        let keep = self.live.lock().following.remove(&pid);
        let sm = keep.as_ref().map_or(0, |f| f.percent);
        self.set_process(uuid, pid, memory_used_mib, sm)?;
        self.live
            .lock()
            .following
            .insert(pid, keep.unwrap_or_default());
        Ok(())
    }

    /// Reports XID `xid` on GPU or MIG device `uuid`, as the driver would: an XID in a
    /// MIG instance names that instance; a GPU without XID event support delivers
    /// nothing.
    pub fn inject_xid(&self, uuid: &str, xid: u64) -> Result<(), GpuError> {
        let parent = match self.check(uuid) {
            Ok(i) => self.devices[i].uuid.clone(),
            Err(e) => match self.mig_parent_of(uuid) {
                Some(parent) => parent,
                None => return Err(e),
            },
        };
        if self.no_events.contains(&parent) {
            return Ok(());
        }
        self.live.lock().events.push_back(XidEvent {
            uuid: uuid.to_owned(),
            xid,
        });
        self.event_ready.notify_all();
        Ok(())
    }

    /// The GPU a MIG device (from the shape or created since) belongs to.
    fn mig_parent_of(&self, mig_uuid: &str) -> Option<String> {
        if let Some(d) = self
            .devices
            .iter()
            .find(|d| d.mig.iter().flatten().any(|m| m.uuid == mig_uuid))
        {
            return Some(d.uuid.clone());
        }
        let guard = self.mig.lock();
        guard.as_ref()?.gpus.iter().find_map(|(gpu, state)| {
            state
                .instances
                .iter()
                .any(|i| i.uuid == mig_uuid)
                .then(|| gpu.clone())
        })
    }

    /// Makes GPU `uuid` fall off the bus (`true`) or come back: every query on it then
    /// answers GPU_IS_LOST, as NVML does.
    pub fn set_lost(&self, uuid: &str, lost: bool) -> Result<(), GpuError> {
        self.check(uuid)?;
        let mut live = self.live.lock();
        if lost {
            live.lost.insert(uuid.to_owned());
        } else {
            live.lost.remove(uuid);
        }
        Ok(())
    }

    /// Sets the NVSwitch fabric state of GPU `uuid`.
    pub fn set_fabric(&self, uuid: &str, state: SimFabric) -> Result<(), GpuError> {
        self.check(uuid)?;
        let mut live = self.live.lock();
        if state == SimFabric::None {
            live.fabric.remove(uuid);
        } else {
            live.fabric.insert(uuid.to_owned(), state);
        }
        Ok(())
    }

    fn lost(&self, uuid: &str, call: &'static str) -> Result<(), GpuError> {
        if self.live.lock().lost.contains(uuid) {
            return Err(GpuError::Lost { call });
        }
        Ok(())
    }
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        let mut devices = self.devices.clone();
        let live = self.live.lock();
        for d in &mut devices {
            if live.lost.contains(&d.uuid) {
                d.fault = Some(
                    "memory: NVML query nvmlDeviceGetMemoryInfo_v2: the GPU is lost (fell off the bus)"
                        .to_owned(),
                );
            }
        }
        drop(live);
        // As the NVML backend does for links the driver cannot type.
        resolve_link_peers(&mut devices);
        Ok(devices)
    }

    fn pcie_relation(&self, a: &str, b: &str) -> Result<PcieRelation, GpuError> {
        self.lost(a, "nvmlDeviceGetTopologyCommonAncestor")?;
        self.lost(b, "nvmlDeviceGetTopologyCommonAncestor")?;
        let (a, b) = (self.pcie[self.check(a)?], self.pcie[self.check(b)?]);
        Ok(if a.switch == b.switch {
            PcieRelation::SingleSwitch
        } else if a.numa.is_some() && a.numa == b.numa {
            PcieRelation::NumaNode
        } else {
            PcieRelation::System
        })
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        let index = self.check(uuid)?;
        self.lost(uuid, "nvmlDeviceGetMemoryInfo_v2")?;
        let mig_parent = self.devices[index].mig.is_some();
        let mut live = self.live.lock();
        follow_cpu(&mut live, uuid);
        let processes = live.processes.get(uuid).cloned().unwrap_or_default();
        // The driver logs a utilisation sample for each process that ran since its last
        // one; idle processes get none.
        let now_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        // Strictly increasing, as the driver's timestamps are between readings.
        let stamp = now_us.max(live.util_clock + 1);
        live.util_clock = stamp;
        let log = live.util_log.entry(uuid.to_owned()).or_default();
        for p in processes.iter().filter(|p| p.sm_percent > 0) {
            log.push_back(UtilizationSample {
                pid: p.pid,
                timestamp_us: stamp,
                sm_percent: p.sm_percent,
            });
        }
        while log.len() > UTIL_LOG_LEN {
            log.pop_front();
        }
        // What nvmlDeviceGetProcessUtilization returns for the agent's last timestamp.
        let since = self.utilization.since(uuid);
        let returned: Vec<UtilizationSample> = log
            .iter()
            .copied()
            .filter(|s| s.timestamp_us > since)
            .collect();
        drop(live);
        let sm = self.utilization.take(uuid, &returned);
        let processes: Vec<GpuProcess> = processes
            .into_iter()
            .map(|p| GpuProcess {
                sm_percent: sm.get(&p.pid).copied().unwrap_or(0),
                ..p
            })
            .collect();
        let utilization: u32 = processes.iter().map(|p| p.sm_percent).sum::<u32>().min(100);
        Ok(GpuSample {
            memory_used_mib: processes
                .iter()
                .map(|p| p.memory_used_mib)
                .sum::<Option<u64>>(),
            // NVML: utilisation is NOT_SUPPORTED on a GPU in MIG mode.
            utilization_percent: (!mig_parent).then_some(utilization),
            processes,
        })
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<XidEvent>, GpuError> {
        let mut live = self.live.lock();
        if live.events.is_empty() {
            self.event_ready.wait_for(&mut live, timeout);
        }
        Ok(live.events.pop_front())
    }

    fn condition(&self, uuid: &str) -> GpuCondition {
        let live = self.live.lock();
        if live.lost.contains(uuid) {
            return GpuCondition::Lost("NVML answers GPU_IS_LOST".to_owned());
        }
        match live.fabric.get(uuid) {
            Some(SimFabric::InProgress) => {
                GpuCondition::FabricNotReady("fabric state in progress (success)".to_owned())
            }
            Some(SimFabric::NotStarted) => {
                GpuCondition::FabricNotReady("fabric state not started (success)".to_owned())
            }
            Some(SimFabric::Failed) => {
                GpuCondition::FabricNotReady("fabric registration failed: Unknown Error".to_owned())
            }
            _ => GpuCondition::Ready,
        }
    }

    fn event_gaps(&self) -> Vec<String> {
        self.devices
            .iter()
            .filter(|d| self.no_events.contains(&d.uuid))
            .map(|d| format!("{}: XID events not supported", d.uuid))
            .collect()
    }

    fn mig_profiles(&self, uuid: &str) -> Result<Vec<MigProfile>, GpuError> {
        self.with_mig(uuid, |gpu, _| Ok(gpu.table.clone()))
    }

    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, GpuError> {
        self.with_mig(uuid, |gpu, busy| {
            Ok(gpu
                .instances
                .iter()
                .map(|i| MigInstance {
                    processes: busy.get(&i.uuid).copied().unwrap_or(0),
                    ..i.clone()
                })
                .collect())
        })
    }

    fn mig_create(&self, uuid: &str, profile_id: u32, start: u32) -> Result<MigInstance, GpuError> {
        self.with_mig(uuid, |gpu, _| gpu.create(uuid, profile_id, start))
    }

    fn mig_destroy(&self, uuid: &str, gpu_instance_id: u32) -> Result<(), GpuError> {
        self.with_mig(uuid, |gpu, busy| gpu.destroy(uuid, gpu_instance_id, busy))
    }
}

/// The simulated MIG state: per GPU in MIG mode its profile table and instances, and
/// how many processes run in each MIG device (driven by tests).
#[derive(Debug, Default)]
struct SimMig {
    gpus: HashMap<String, SimMigGpu>,
    busy: HashMap<String, usize>,
}

#[derive(Debug)]
struct SimMigGpu {
    table: Vec<MigProfile>,
    instances: Vec<MigInstance>,
    /// Bumped on every creation so re-created instances get fresh UUIDs.
    created: u32,
}

impl SimMigGpu {
    /// The shape's instances of `device`, placed as the planner would have placed them.
    fn from_device(device: &GpuDevice) -> Self {
        let table =
            crate::gpu::mig::table_for(&device.model, device.memory_total_mib).unwrap_or_default();
        let mut gpu = SimMigGpu {
            table,
            instances: Vec::new(),
            created: 0,
        };
        for (k, m) in device.mig.iter().flatten().enumerate() {
            let profile = gpu.table.iter().find(|p| p.name == m.profile).cloned();
            let occupied: Vec<Span> = gpu.instances.iter().map(Span::from).collect();
            // The shape file names no placement: the highest free one, which keeps slice 0
            // (where the large profiles must start) free, as an operator laying out a GPU would.
            let start = profile
                .as_ref()
                .and_then(|p| free_placements(&occupied, p).last().copied());
            // An instance the table does not know (or that does not fit) occupies no
            // slices: the shape file is the authority on what exists.
            let (id, size, compute, start) = match (&profile, start) {
                (Some(p), Some(start)) => (p.id, p.memory_slices, p.compute_slices, start),
                _ => (u32::MAX, 0, 0, 0),
            };
            gpu.instances.push(MigInstance {
                uuid: m.uuid.clone(),
                profile: m.profile.clone(),
                profile_id: id,
                gpu_instance_id: k as u32 + 1,
                compute_instance_id: 0,
                start,
                size,
                compute_slices: compute,
                memory_mib: m.memory_total_mib,
                processes: 0,
            });
        }
        gpu
    }

    fn create(&mut self, uuid: &str, profile_id: u32, start: u32) -> Result<MigInstance, GpuError> {
        let refuse = |reason: String| GpuError::Mig {
            gpu: uuid.to_owned(),
            reason,
        };
        let profile = self
            .table
            .iter()
            .find(|p| p.id == profile_id)
            .cloned()
            .ok_or_else(|| refuse(format!("no GPU-instance profile with id {profile_id}")))?;
        let occupied: Vec<Span> = self.instances.iter().map(Span::from).collect();
        if !fits_at(&occupied, &profile, start) {
            return Err(refuse(format!(
                "no room for {} at memory slice {start} (insufficient resources)",
                profile.name
            )));
        }
        self.created += 1;
        let gi = (1..)
            .find(|id| !self.instances.iter().any(|i| i.gpu_instance_id == *id))
            .unwrap_or(u32::MAX);
        let instance = MigInstance {
            uuid: derived_uuid("MIG", &format!("{uuid}/gi{gi}/{}", self.created)),
            profile: profile.name.clone(),
            profile_id,
            gpu_instance_id: gi,
            compute_instance_id: 0,
            start,
            size: profile.memory_slices,
            compute_slices: profile.compute_slices,
            memory_mib: profile.memory_mib,
            processes: 0,
        };
        self.instances.push(instance.clone());
        Ok(instance)
    }

    fn destroy(
        &mut self,
        uuid: &str,
        gpu_instance_id: u32,
        busy: &HashMap<String, usize>,
    ) -> Result<(), GpuError> {
        let refuse = |reason: String| GpuError::Mig {
            gpu: uuid.to_owned(),
            reason,
        };
        let pos = self
            .instances
            .iter()
            .position(|i| i.gpu_instance_id == gpu_instance_id)
            .ok_or_else(|| refuse(format!("no GPU instance {gpu_instance_id}")))?;
        let processes = busy.get(&self.instances[pos].uuid).copied().unwrap_or(0);
        if processes > 0 {
            // As the driver does: an instance in use cannot be destroyed.
            return Err(refuse(format!(
                "GPU instance {gpu_instance_id} is in use by {processes} process(es)"
            )));
        }
        self.instances.remove(pos);
        Ok(())
    }
}

impl SimBackend {
    /// Runs `f` on the MIG state of GPU `uuid`, which must be in MIG mode.
    fn with_mig<T>(
        &self,
        uuid: &str,
        f: impl FnOnce(&mut SimMigGpu, &HashMap<String, usize>) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        let index = self.check(uuid)?;
        let mut guard = self.mig.lock();
        let state = guard.get_or_insert_with(|| self.initial_mig());
        let SimMig { gpus, busy } = state;
        match gpus.get_mut(uuid) {
            Some(gpu) => f(gpu, busy),
            None => Err(GpuError::Mig {
                gpu: uuid.to_owned(),
                reason: format!("GPU {index} is not in MIG mode"),
            }),
        }
    }

    fn initial_mig(&self) -> SimMig {
        SimMig {
            gpus: self
                .devices
                .iter()
                .filter(|d| d.mig.is_some())
                .map(|d| (d.uuid.clone(), SimMigGpu::from_device(d)))
                .collect(),
            busy: HashMap::new(),
        }
    }

    /// Says that `count` compute processes run in MIG device `mig_uuid` (tests).
    pub fn set_mig_processes(&self, mig_uuid: &str, count: usize) {
        let mut guard = self.mig.lock();
        let state = guard.get_or_insert_with(|| self.initial_mig());
        state.busy.insert(mig_uuid.to_owned(), count);
    }
}

/// CPU-following state of one simulated process.
#[derive(Debug, Default, Clone, Copy)]
struct CpuFollow {
    /// When and at how many nanoseconds of demand the utilisation was last computed.
    last: Option<(Instant, u64)>,
    /// The utilisation computed then, percent.
    percent: u32,
}

/// Shortest window a utilisation is computed over, so it is not mostly rounding.
const CPU_WINDOW: Duration = Duration::from_millis(100);

/// Updates the utilisation of GPU `uuid`'s CPU-following processes and drops those
/// whose real process is gone.
fn follow_cpu(live: &mut Live, uuid: &str) {
    let Live {
        processes,
        following,
        ..
    } = live;
    let Some(list) = processes.get_mut(uuid) else {
        return;
    };
    let now = Instant::now();
    list.retain_mut(|p| {
        let Some(follow) = following.get_mut(&p.pid) else {
            return true;
        };
        let Some(demand_ns) = cpu_demand_ns(p.pid) else {
            following.remove(&p.pid);
            return false;
        };
        match follow.last {
            None => follow.last = Some((now, demand_ns)),
            Some((at, before)) => {
                let elapsed = now.duration_since(at);
                if elapsed >= CPU_WINDOW {
                    let busy = demand_ns.saturating_sub(before) as f64;
                    follow.percent =
                        ((busy * 100.0 / elapsed.as_nanos().max(1) as f64).round() as u32).min(100);
                    follow.last = Some((now, demand_ns));
                }
            }
        }
        p.sm_percent = follow.percent;
        true
    });
}

/// How long a live process has wanted a CPU, in nanoseconds; `None` when it is gone
/// or a zombie. Preferably the time it was runnable (on a CPU or waiting for one, from
/// `/proc/<pid>/schedstat`): like a GPU's busy time it counts what the process asks
/// for, and does not drop when other work on the test machine competes for the CPUs,
/// while a stopped process is not runnable at all. Without schedstat, its CPU time.
fn cpu_demand_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: count after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is the state (stat field 3); utime and stime are fields 14 and 15.
    if matches!(fields.first(), Some(&("Z" | "X" | "x"))) {
        return None;
    }
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/schedstat")) {
        let mut it = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(run)), Some(Some(wait))) = (it.next(), it.next()) {
            return Some(run + wait);
        }
    }
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux ABI: one tick is 10 ms.
    Some((utime + stime) * 10_000_000)
}

/// A stable UUID-shaped id from `seed` (FNV-1a, twice with different offsets).
fn derived_uuid(prefix: &str, seed: &str) -> String {
    let hash = |offset: u64| {
        seed.bytes().fold(offset, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (hi, lo) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(file: &str) -> SimBackend {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/gpus/");
        SimBackend::from_file(format!("{path}{file}")).unwrap()
    }

    #[test]
    fn h100_shape_has_switch_links_on_every_gpu() {
        let sim = shape("h100-8x-nvswitch.yaml");
        let devices = sim.devices().unwrap();
        assert_eq!(devices.len(), 8);
        assert!(devices.iter().all(
            |d| d.nvlinks.len() == 18 && d.nvlinks.iter().all(|l| l.remote == LinkPeer::Switch)
        ));
        assert_eq!(devices[0].memory_total_mib, 81559);
        assert_eq!(devices[0].uuid.len(), 40);
    }

    #[test]
    fn a100_shape_has_pairs_and_one_mig_gpu() {
        let sim = shape("a100-8x-mig.yaml");
        let devices = sim.devices().unwrap();
        assert_eq!(devices[0].nvlinks.len(), 12);
        assert_eq!(
            devices[0].nvlinks[0].remote_pci_bus_id,
            devices[1].pci_bus_id
        );
        let mig = devices[7].mig.as_ref().unwrap();
        assert_eq!(mig.len(), 4);
        assert_eq!(mig[0].profile, "3g.20gb");
        assert!(mig[0].uuid.starts_with("MIG-"));
        assert!(devices[..7].iter().all(|d| d.mig.is_none()));
    }

    #[test]
    fn l40s_pcie_relations_follow_numa() {
        let sim = shape("l40s-4x-pcie.yaml");
        let u = |i| sim.uuid_of(i).unwrap().to_owned();
        assert_eq!(
            sim.pcie_relation(&u(0), &u(1)).unwrap(),
            PcieRelation::NumaNode
        );
        assert_eq!(
            sim.pcie_relation(&u(0), &u(2)).unwrap(),
            PcieRelation::System
        );
    }

    #[test]
    fn processes_drive_samples_and_xids_queue() {
        let sim = shape("l40s-4x-pcie.yaml");
        let uuid = sim.uuid_of(1).unwrap().to_owned();
        sim.set_process(&uuid, 42, 1000, 30).unwrap();
        sim.set_process(&uuid, 43, 500, 90).unwrap();
        let s = sim.sample(&uuid).unwrap();
        assert_eq!(
            (s.memory_used_mib, s.utilization_percent),
            (Some(1500), Some(100))
        );
        sim.remove_process(&uuid, 43).unwrap();
        assert_eq!(sim.sample(&uuid).unwrap().memory_used_mib, Some(1000));
        assert_eq!(sim.wait_event(Duration::from_millis(1)).unwrap(), None);
        sim.inject_xid(&uuid, 79).unwrap();
        let ev = sim.wait_event(Duration::from_millis(1)).unwrap().unwrap();
        assert_eq!((ev.uuid.as_str(), ev.xid), (uuid.as_str(), 79));
        assert!(sim.inject_xid("GPU-nope", 79).is_err());
    }

    #[test]
    fn cpu_following_processes_track_real_cpu_and_leave_when_they_exit() {
        let sim = shape("l40s-4x-pcie.yaml");
        let uuid = sim.uuid_of(0).unwrap().to_owned();
        /// Killed on drop, so a failing test leaves no busy loop behind.
        struct Reaped(std::process::Child);
        impl Drop for Reaped {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let spawn = |cmd: &str, args: &[&str]| {
            Reaped(
                std::process::Command::new(cmd)
                    .args(args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        };
        let mut busy = spawn("sh", &["-c", "while :; do :; done"]);
        let mut idle = spawn("sleep", &["30"]);
        let (busy_pid, idle_pid) = (busy.0.id(), idle.0.id());
        sim.set_process_cpu_following(&uuid, busy_pid, 100).unwrap();
        sim.set_process_cpu_following(&uuid, idle_pid, 200).unwrap();
        sim.sample(&uuid).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let util = |s: &GpuSample, pid: u32| {
            s.processes
                .iter()
                .find(|p| p.pid == pid)
                .map(|p| p.sm_percent)
        };
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let s = sim.sample(&uuid).unwrap();
            assert_eq!(s.memory_used_mib, Some(300));
            // A sleeper may still be finishing its exec in the first window; it must
            // never look like real work.
            assert!(util(&s, idle_pid).is_some_and(|u| u <= 5), "{s:?}");
            // Any share of a core: the machine may be busy with other work.
            if util(&s, busy_pid).unwrap() > 5 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the busy loop never showed up: {s:?}"
            );
        }
        busy.0.kill().unwrap();
        busy.0.wait().unwrap();
        idle.0.kill().unwrap();
        // Not reaped yet: a zombie counts as gone too.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sim.sample(&uuid).unwrap().processes.is_empty() {
            assert!(Instant::now() < deadline, "the exited processes stayed");
            std::thread::sleep(Duration::from_millis(10));
        }
        idle.0.wait().unwrap();
    }

    #[test]
    fn bad_files_name_the_field() {
        let err = SimBackend::from_yaml(
            "gpus: [{model: X, memory_mib: 1}]\nnvlinks: [{a: 0, b: 3, links: 2}]",
            "t",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "<shape of t>: nvlinks[0].b: GPU index 3 does not exist (accepted: 0..1)"
        );
        let err = SimBackend::from_yaml("gpus: [{model: X, memory_mib: 0}]", "t").unwrap_err();
        assert!(err.starts_with("<shape of t>: gpus[0].memory_mib"), "{err}");
        let err = SimBackend::from_yaml("gpus: [{model: X}]", "t").unwrap_err();
        assert!(err.contains("memory_mib"), "{err}");
        let err = SimBackend::from_yaml("gpus: []", "t").unwrap_err();
        assert!(err.starts_with("gpus: "), "{err}");
        let err = SimBackend::from_file("/nonexistent/x.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/x.yaml"), "{err}");
    }
}
