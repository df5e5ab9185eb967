//! The NVML backend (`nvml-wrapper`). The library is loaded at runtime, so the agent
//! builds and starts on machines without the NVIDIA driver; there [`NvmlBackend::open`]
//! fails with `NVML not available: …`.
//!
//! Read against NVML's header and NVIDIA's device plugin, three rules shape it:
//! * a reading NVML refuses (NO_PERMISSION on a MIG parent without monitoring
//!   privilege, NOT_SUPPORTED on a board without the counter) is unknown for that GPU,
//!   never fatal for the node, and never read as 0;
//! * a GPU that is lost or fails an inventory query is degraded alone
//!   ([`GpuDevice::fault`]);
//! * wrapper calls known to be wrong in nvml-wrapper 0.13 are made through the raw
//!   library: `NvLink::remote_device_type` passes NVML a temporary and always returns
//!   `Unknown`, and `EventSet::wait` drops the MIG instance an XID belongs to.

// The one module that calls C: NVML's raw functions where the wrapper is wrong or silent.
// Each `unsafe` block says what it relies on.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};
use parking_lot::Mutex;

use super::{
    GpuBackend, GpuCondition, GpuDevice, GpuError, GpuProcess, GpuSample, LinkPeer, MigDevice,
    NvLink, PcieRelation, UtilizationCursor, UtilizationSample, XidEvent, resolve_link_peers,
    resource_profile, sysfs_numa_node,
};
use super::{MigInstance, MigProfile};
use nvml_wrapper::error::nvml_try;
use nvml_wrapper_sys::bindings as sys;

/// Most NVLinks any GPU generation has (Hopper: 18).
const MAX_NVLINKS: u32 = sys::NVML_NVLINK_MAX_LINKS;

const MIB: u64 = 1024 * 1024;

/// Readings of one GPU closer together than this share one utilisation window (the
/// driver logs per-process samples about every 170 ms).
const UTILIZATION_REUSE: Duration = Duration::from_millis(250);

/// `gpuInstanceId` of an event that belongs to no MIG instance.
const NO_INSTANCE: u32 = u32::MAX;

/// Real GPUs through NVML.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    /// Created on the first `wait_event`, then reused.
    events: Mutex<Option<EventSet<'static>>>,
    /// GPUs whose XID events could not be registered, with why.
    event_gaps: Mutex<Vec<String>>,
    /// Per-process utilisation timestamps, per GPU.
    utilization: UtilizationCursor,
    /// Where PCI devices' NUMA nodes are read when NVML has none.
    sys_root: PathBuf,
}

/// Maps an NVML error of `call` to the agent's: NO_PERMISSION and NOT_SUPPORTED make the
/// datum unknown, GPU_IS_LOST says the GPU is gone.
fn err(call: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |e| match e {
        NvmlError::NoPermission => GpuError::Unavailable {
            call,
            why: "no permission (on a GPU in MIG mode this needs monitoring privilege: \
                  NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN in the agent's container)"
                .to_owned(),
        },
        NvmlError::NotSupported => GpuError::Unavailable {
            call,
            why: "not supported on this GPU".to_owned(),
        },
        NvmlError::GpuLost => GpuError::Lost { call },
        e => GpuError::Nvml {
            call,
            reason: e.to_string(),
        },
    }
}

/// The value, or `None` with `what: error` noted when NVML cannot give it.
fn known<T>(unknown: &mut Vec<String>, what: &str, r: Result<T, GpuError>) -> Option<T> {
    r.map_err(|e| unknown.push(format!("{what}: {e}"))).ok()
}

impl NvmlBackend {
    /// Loads and initialises NVML.
    pub fn open() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(|e| GpuError::NvmlUnavailable(e.to_string()))?;
        // One NVML handle lives as long as the agent process; leaking it gives the
        // device and event-set handles the `'static` lifetime they borrow from.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        Ok(Self {
            nvml,
            events: Mutex::new(None),
            event_gaps: Mutex::new(Vec::new()),
            utilization: UtilizationCursor::with_reuse(UTILIZATION_REUSE),
            sys_root: PathBuf::from("/sys"),
        })
    }

    fn by_uuid(&self, uuid: &str) -> Result<Device<'static>, GpuError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|_| GpuError::UnknownGpu(uuid.to_owned()))
    }

    /// The remote end's type of `link`, through the raw call (see the module docs).
    fn remote_type(&self, device: &Device<'static>, link: u32) -> LinkPeer {
        let lib = self.nvml.lib();
        let Ok(f) = lib.nvmlDeviceGetNvLinkRemoteDeviceType.as_ref() else {
            return LinkPeer::Unknown;
        };
        let mut kind: sys::nvmlIntNvLinkDeviceType_t =
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        // SAFETY: valid device handle; out-pointer to a live local.
        let code = unsafe { f(unsafe_handle(device), link, &mut kind) };
        if code != sys::nvmlReturn_enum_NVML_SUCCESS {
            return LinkPeer::Unknown;
        }
        match kind {
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => LinkPeer::Gpu,
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => LinkPeer::Switch,
            sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU => LinkPeer::Other,
            _ => LinkPeer::Unknown,
        }
    }

    fn nvlinks(&self, device: &Device<'static>) -> Vec<NvLink> {
        let mut nvlinks = Vec::new();
        for link in 0..MAX_NVLINKS {
            let wrapper = device.link_wrapper_for(link);
            match wrapper.is_active() {
                Ok(true) => {}
                // Past the last link, or no NVLink at all.
                Ok(false) | Err(_) => continue,
            }
            let remote_pci_bus_id = wrapper
                .remote_pci_info()
                .map(|p| p.bus_id)
                .unwrap_or_default();
            nvlinks.push(NvLink {
                link,
                remote_pci_bus_id,
                remote: self.remote_type(device, link),
            });
        }
        nvlinks
    }

    fn is_mig_parent(device: &Device<'static>) -> bool {
        device.mig_mode().map(|m| m.current == 1).unwrap_or(false)
    }

    /// The MIG device handles of a parent in MIG mode (indexes without one skipped).
    fn mig_handles(&self, device: &Device<'static>) -> Result<Vec<Device<'static>>, GpuError> {
        let count = device.mig_device_count().map_err(err("mig_device_count"))?;
        Ok((0..count)
            .filter_map(|i| device.mig_device_by_index(i).ok())
            .collect())
    }

    /// (GPU instance id, compute instance id) of a MIG device handle.
    fn mig_ids(&self, mig: &Device<'static>) -> Result<(u32, u32), GpuError> {
        let lib = self.nvml.lib();
        let gi_of = sym(
            "nvmlDeviceGetGpuInstanceId",
            lib.nvmlDeviceGetGpuInstanceId.as_ref(),
        )?;
        let ci_of = sym(
            "nvmlDeviceGetComputeInstanceId",
            lib.nvmlDeviceGetComputeInstanceId.as_ref(),
        )?;
        let (mut gi, mut ci) = (0u32, 0u32);
        let handle = unsafe_handle(mig);
        // SAFETY: valid MIG device handle and out-pointers to live locals.
        unsafe {
            ret("nvmlDeviceGetGpuInstanceId", gi_of(handle, &mut gi))?;
            ret("nvmlDeviceGetComputeInstanceId", ci_of(handle, &mut ci))?;
        }
        Ok((gi, ci))
    }

    fn describe(&self, index: u32, device: &Device<'static>) -> Result<GpuDevice, GpuError> {
        // Without its UUID a GPU cannot be named to anyone: the caller leaves it out.
        let uuid = device.uuid().map_err(err("nvmlDeviceGetUUID"))?;
        let mut unknown = Vec::new();
        let mut fault = None;
        let pci_bus_id = match device.pci_info() {
            Ok(p) => p.bus_id,
            Err(e) => {
                fault = Some(format!("PCI info: {}", err("nvmlDeviceGetPciInfo")(e)));
                String::new()
            }
        };
        let model = known(
            &mut unknown,
            "name",
            device.name().map_err(err("nvmlDeviceGetName")),
        )
        .unwrap_or_else(|| "unknown".to_owned());
        let mig_mode = Self::is_mig_parent(device);
        let mig = if mig_mode {
            let mut instances = Vec::new();
            for mig in
                known(&mut unknown, "MIG devices", self.mig_handles(device)).unwrap_or_default()
            {
                let name = mig.name().unwrap_or_default();
                let Ok(mig_uuid) = mig.uuid() else { continue };
                // A MIG device's own memory is readable without monitoring privilege.
                let memory = known(
                    &mut unknown,
                    &format!("memory of {mig_uuid}"),
                    mig.memory_info().map_err(err("nvmlDeviceGetMemoryInfo_v2")),
                );
                // Compute slices are an attribute of the MIG device (Ampere and later).
                let compute_slices = mig
                    .attributes()
                    .map_or(0, |a| a.compute_instance_slice_count);
                instances.push(MigDevice {
                    compute_slices,
                    uuid: mig_uuid,
                    profile: resource_profile(mig_profile(&name).unwrap_or("unknown")),
                    memory_total_mib: memory
                        .map_or(0, |m| (m.total - m.reserved.min(m.total)) / MIB),
                });
            }
            Some(instances)
        } else {
            None
        };
        let (memory_total_mib, memory_reserved_mib) = match device.memory_info() {
            Ok(m) => ((m.total - m.reserved.min(m.total)) / MIB, m.reserved / MIB),
            Err(e) => {
                let e = err("nvmlDeviceGetMemoryInfo_v2")(e);
                if matches!(e, GpuError::Lost { .. }) {
                    fault = Some(format!("memory: {e}"));
                }
                unknown.push(format!("memory: {e}"));
                // A MIG parent without privilege: the full-GPU instance's memory is the
                // most any pod can have, else what its MIG devices hold.
                let full = self
                    .gi_profile_info(
                        unsafe_handle(device),
                        sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE,
                    )
                    .ok()
                    .flatten()
                    .map(|p| p.memorySizeMB);
                let devices: u64 = mig.iter().flatten().map(|m| m.memory_total_mib).sum();
                (full.unwrap_or(devices), 0)
            }
        };
        let numa_node = device
            .numa_node_id()
            .ok()
            .or_else(|| sysfs_numa_node(&self.sys_root, &pci_bus_id));
        Ok(GpuDevice {
            index,
            uuid,
            model,
            memory_total_mib,
            memory_reserved_mib,
            numa_node,
            pci_bus_id,
            nvlinks: self.nvlinks(device),
            mig,
            unknown,
            fault,
        })
    }

    fn event_set(&self) -> Result<EventSet<'static>, GpuError> {
        let set = self
            .nvml
            .create_event_set()
            .map_err(err("nvmlEventSetCreate"))?;
        let count = self
            .nvml
            .device_count()
            .map_err(err("nvmlDeviceGetCount"))?;
        let mut gaps = Vec::new();
        for i in 0..count {
            let device = match self.nvml.device_by_index(i) {
                Ok(d) => d,
                Err(e) => {
                    gaps.push(format!("GPU {i}: {}", err("nvmlDeviceGetHandleByIndex")(e)));
                    continue;
                }
            };
            let name = device.uuid().unwrap_or_else(|_| format!("GPU {i}"));
            // Each GPU is registered with the types it supports: one GPU that supports
            // none (or refuses) must not leave the others unwatched.
            let supported = match device.supported_event_types() {
                Ok(t) => t,
                Err(e) => {
                    gaps.push(format!(
                        "{name}: {}",
                        err("nvmlDeviceGetSupportedEventTypes")(e)
                    ));
                    continue;
                }
            };
            if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
                gaps.push(format!("{name}: XID events not supported"));
                continue;
            }
            // The raw call: the wrapper's `register_events` releases the whole set when
            // one GPU refuses, which would leave every GPU unwatched.
            let register = sym(
                "nvmlDeviceRegisterEvents",
                self.nvml.lib().nvmlDeviceRegisterEvents.as_ref(),
            )?;
            // SAFETY: valid device and event-set handles, both alive for the call.
            let code = unsafe {
                register(
                    unsafe_handle(&device),
                    EventTypes::CRITICAL_XID_ERROR.bits(),
                    set.handle(),
                )
            };
            if let Err(e) = nvml_try(code) {
                gaps.push(format!("{name}: {}", err("nvmlDeviceRegisterEvents")(e)));
            }
        }
        for gap in &gaps {
            tracing::warn!("XID events not watched on {gap}");
        }
        *self.event_gaps.lock() = gaps;
        Ok(set)
    }

    /// The MIG device (parent `device`, GPU instance `gi`, compute instance `ci`).
    fn mig_uuid_of(&self, device: &Device<'static>, gi: u32, ci: u32) -> Option<String> {
        self.mig_handles(device).ok()?.into_iter().find_map(|mig| {
            let (g, c) = self.mig_ids(&mig).ok()?;
            (g == gi && (ci == NO_INSTANCE || c == ci)).then(|| mig.uuid().ok())?
        })
    }
}

/// The name of an `NVML_GPU_FABRIC_STATE_*` value.
fn fabric_state_name(state: u8) -> &'static str {
    match u32::from(state) {
        sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => "not supported",
        sys::NVML_GPU_FABRIC_STATE_NOT_STARTED => "not started",
        sys::NVML_GPU_FABRIC_STATE_IN_PROGRESS => "in progress",
        sys::NVML_GPU_FABRIC_STATE_COMPLETED => "completed",
        _ => "unknown",
    }
}

/// `NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`.
fn mig_profile(name: &str) -> Option<&str> {
    name.rsplit_once("MIG ").map(|(_, p)| p.trim())
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(err("nvmlDeviceGetCount"))?;
        let mut devices = Vec::new();
        for i in 0..count {
            let described = self
                .nvml
                .device_by_index(i)
                .map_err(err("nvmlDeviceGetHandleByIndex"))
                .and_then(|d| self.describe(i, &d));
            match described {
                Ok(d) => devices.push(d),
                // A GPU that cannot even be named is left out, never the whole node.
                Err(error) => tracing::error!(index = i, %error, "GPU left out of the inventory"),
            }
        }
        resolve_link_peers(&mut devices);
        Ok(devices)
    }

    fn pcie_relation(&self, a: &str, b: &str) -> Result<PcieRelation, GpuError> {
        let (a, b) = (self.by_uuid(a)?, self.by_uuid(b)?);
        let level = a
            .topology_common_ancestor(b)
            .map_err(err("nvmlDeviceGetTopologyCommonAncestor"))?;
        Ok(match level {
            TopologyLevel::Internal => PcieRelation::SameBoard,
            TopologyLevel::Single => PcieRelation::SingleSwitch,
            TopologyLevel::Multiple => PcieRelation::MultipleSwitches,
            TopologyLevel::HostBridge => PcieRelation::HostBridge,
            TopologyLevel::Node => PcieRelation::NumaNode,
            TopologyLevel::System => PcieRelation::System,
        })
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        let device = self.by_uuid(uuid)?;
        let to_process = |p: nvml_wrapper::struct_wrappers::device::ProcessInfo| GpuProcess {
            pid: p.pid,
            memory_used_mib: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes / MIB),
                UsedGpuMemory::Unavailable => None,
            },
            sm_percent: 0,
        };
        if Self::is_mig_parent(&device) {
            // The parent's memory and process queries need monitoring privilege and its
            // utilisation is not supported: read its MIG devices instead.
            let mut used = Some(0u64);
            let mut processes = Vec::new();
            for mig in self.mig_handles(&device)? {
                match mig.memory_info() {
                    Ok(m) => used = used.map(|u| u + m.used / MIB),
                    Err(_) => used = None,
                }
                let listed = mig
                    .running_compute_processes()
                    .map_err(err("nvmlDeviceGetComputeRunningProcesses (MIG device)"))?;
                processes.extend(listed.into_iter().map(to_process));
            }
            return Ok(GpuSample {
                memory_used_mib: used,
                utilization_percent: None,
                processes,
            });
        }
        let memory = match device.memory_info() {
            Ok(m) => Some(m.used / MIB),
            Err(e) => match err("nvmlDeviceGetMemoryInfo_v2")(e) {
                GpuError::Unavailable { .. } => None,
                e => return Err(e),
            },
        };
        let utilization = match device.utilization_rates() {
            Ok(u) => Some(u.gpu),
            Err(e) => match err("nvmlDeviceGetUtilizationRates")(e) {
                GpuError::Unavailable { .. } => None,
                e => return Err(e),
            },
        };
        let sm = match self.utilization.recent(uuid) {
            Some(sm) => sm,
            None => {
                // Only samples newer than the last reading count; NOT_FOUND (none
                // since) and NOT_SUPPORTED leave every process at 0.
                let raw = device
                    .process_utilization_stats(self.utilization.since(uuid))
                    .unwrap_or_default();
                let samples: Vec<UtilizationSample> = raw
                    .iter()
                    .map(|s| UtilizationSample {
                        pid: s.pid,
                        timestamp_us: s.timestamp,
                        sm_percent: s.sm_util,
                    })
                    .collect();
                self.utilization.take(uuid, &samples)
            }
        };
        let processes = device
            .running_compute_processes()
            .map_err(err("nvmlDeviceGetComputeRunningProcesses"))?
            .into_iter()
            .map(|p| {
                let mut p = to_process(p);
                p.sm_percent = sm.get(&p.pid).copied().unwrap_or(0);
                p
            })
            .collect();
        Ok(GpuSample {
            memory_used_mib: memory,
            utilization_percent: utilization,
            processes,
        })
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<XidEvent>, GpuError> {
        let mut guard = self.events.lock();
        if guard.is_none() {
            *guard = Some(self.event_set()?);
        }
        let Some(set) = guard.as_ref() else {
            return Ok(None);
        };
        let millis = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        // The raw wait: the wrapper's drops the GPU / compute instance ids.
        let wait = sym(
            "nvmlEventSetWait_v2",
            self.nvml.lib().nvmlEventSetWait_v2.as_ref(),
        )?;
        // SAFETY: plain C struct, zero is a valid bit pattern.
        let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set lives in `guard` for the call; out-pointer to a live local.
        let code = unsafe { wait(set.handle(), &mut data, millis) };
        match nvml_try(code) {
            Ok(()) => {}
            Err(NvmlError::Timeout) => return Ok(None),
            Err(e) => return Err(err("nvmlEventSetWait_v2")(e)),
        }
        // SAFETY: the driver hands back one of its device handles; the leaked `Nvml`
        // outlives it.
        let device = unsafe { Device::new(data.device, self.nvml) };
        let parent = device.uuid().map_err(err("nvmlDeviceGetUUID"))?;
        let uuid = if data.gpuInstanceId != NO_INSTANCE && Self::is_mig_parent(&device) {
            self.mig_uuid_of(&device, data.gpuInstanceId, data.computeInstanceId)
                .unwrap_or(parent)
        } else {
            parent
        };
        // 999 is NVML's "unknown XID", taken as the worst case like any unknown code.
        Ok(Some(XidEvent {
            uuid,
            xid: data.eventData,
        }))
    }

    fn condition(&self, uuid: &str) -> GpuCondition {
        let device = match self.nvml.device_by_uuid(uuid) {
            Ok(d) => d,
            Err(e) => return GpuCondition::Lost(err("nvmlDeviceGetHandleByUUID")(e).to_string()),
        };
        // Any cheap query tells a lost GPU: the driver answers GPU_IS_LOST.
        if let Err(NvmlError::GpuLost) = device.pci_info() {
            return GpuCondition::Lost("NVML answers GPU_IS_LOST".to_owned());
        }
        match self.fabric(&device) {
            Some((state, status)) if state != sys::NVML_GPU_FABRIC_STATE_COMPLETED as u8 => {
                GpuCondition::FabricNotReady(format!(
                    "fabric state {} ({})",
                    fabric_state_name(state),
                    status
                ))
            }
            Some((_, status)) if status != "success" => {
                GpuCondition::FabricNotReady(format!("fabric registration failed: {status}"))
            }
            _ => GpuCondition::Ready,
        }
    }

    fn event_gaps(&self) -> Vec<String> {
        self.event_gaps.lock().clone()
    }

    fn mig_profiles(&self, uuid: &str) -> Result<Vec<MigProfile>, GpuError> {
        let device = self.by_uuid(uuid)?;
        let model = device.name().unwrap_or_default();
        let memory = self.parent_memory_mib(&device);
        let known = crate::gpu::mig::table_for(&model, memory).unwrap_or_default();
        let handle = unsafe_handle(&device);
        let mut out = Vec::new();
        for index in CREATABLE_PROFILES {
            let Some(info) = self.gi_profile_info(handle, index)? else {
                continue;
            };
            let placements = self.possible_placements(handle, info.id)?;
            let Some(size) = placements.first().map(|p| p.size) else {
                continue;
            };
            let name = profile_name(&known, &info);
            out.push(MigProfile {
                id: info.id,
                name,
                compute_slices: info.sliceCount,
                memory_slices: size,
                memory_mib: info.memorySizeMB,
                placements: placements.iter().map(|p| p.start).collect(),
            });
        }
        Ok(out)
    }

    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, GpuError> {
        let device = self.by_uuid(uuid)?;
        let handle = unsafe_handle(&device);
        let model = device.name().unwrap_or_default();
        let memory = self.parent_memory_mib(&device);
        let known = crate::gpu::mig::table_for(&model, memory).unwrap_or_default();
        // MIG devices by (GPU instance, compute instance): their UUIDs and processes.
        let mut mig_devices = Vec::new();
        for mig in self.mig_handles(&device)? {
            let (gi, ci) = self.mig_ids(&mig)?;
            let processes = mig
                .running_compute_processes()
                .map(|p| p.len())
                .unwrap_or(0);
            mig_devices.push((gi, ci, mig.uuid().map_err(err("mig uuid"))?, processes));
        }
        let mut out = Vec::new();
        for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Some(info) = self.gi_profile_info(handle, index)? else {
                continue;
            };
            for gi in self.gpu_instances(handle, &info)? {
                let gi_info = self.gi_info(gi)?;
                let ci = self.compute_instances(gi)?.into_iter().next();
                let ci_id = match ci {
                    Some(ci) => self.ci_id(ci)?,
                    None => u32::MAX,
                };
                let found = mig_devices
                    .iter()
                    .find(|(g, c, _, _)| *g == gi_info.id && *c == ci_id);
                out.push(MigInstance {
                    uuid: found.map(|f| f.2.clone()).unwrap_or_default(),
                    profile: profile_name(&known, &info),
                    profile_id: info.id,
                    gpu_instance_id: gi_info.id,
                    compute_instance_id: ci_id,
                    start: gi_info.placement.start,
                    size: gi_info.placement.size,
                    compute_slices: info.sliceCount,
                    memory_mib: info.memorySizeMB,
                    processes: found.map_or(0, |f| f.3),
                });
            }
        }
        Ok(out)
    }

    fn mig_create(&self, uuid: &str, profile_id: u32, start: u32) -> Result<MigInstance, GpuError> {
        let device = self.by_uuid(uuid)?;
        let handle = unsafe_handle(&device);
        let refuse = |reason: String| GpuError::Mig {
            gpu: uuid.to_owned(),
            reason,
        };
        let mut profile = None;
        for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
            if let Some(info) = self.gi_profile_info(handle, index)?
                && info.id == profile_id
            {
                profile = Some(info);
                break;
            }
        }
        let profile = profile
            .ok_or_else(|| refuse(format!("no GPU-instance profile with id {profile_id}")))?;
        let placement = self
            .possible_placements(handle, profile_id)?
            .into_iter()
            .find(|p| p.start == start)
            .ok_or_else(|| {
                refuse(format!(
                    "profile {profile_id} cannot start at slice {start}"
                ))
            })?;
        let lib = self.nvml.lib();
        let create_gi = sym(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref(),
        )?;
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid device handle, placement and out-pointer to live locals.
        unsafe {
            ret(
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                create_gi(handle, profile_id, &placement, &mut gi),
            )?;
        }
        let made = self.create_full_ci(gi, profile.sliceCount);
        let gi_id = self.gi_info(gi).map(|i| i.id);
        if let Err(error) = made {
            // Leave nothing half-made behind.
            if let Ok(destroy) = sym(
                "nvmlGpuInstanceDestroy",
                lib.nvmlGpuInstanceDestroy.as_ref(),
            ) {
                // SAFETY: `gi` was just created and is not used afterwards.
                let _ = unsafe { destroy(gi) };
            }
            return Err(error);
        }
        let gi_id = gi_id?;
        self.mig_instances(uuid)?
            .into_iter()
            .find(|i| i.gpu_instance_id == gi_id)
            .ok_or_else(|| refuse(format!("GPU instance {gi_id} vanished after creation")))
    }

    fn mig_destroy(&self, uuid: &str, gpu_instance_id: u32) -> Result<(), GpuError> {
        let device = self.by_uuid(uuid)?;
        let handle = unsafe_handle(&device);
        let lib = self.nvml.lib();
        let by_id = sym(
            "nvmlDeviceGetGpuInstanceById",
            lib.nvmlDeviceGetGpuInstanceById.as_ref(),
        )?;
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid device handle and out-pointer to a live local.
        unsafe {
            ret(
                "nvmlDeviceGetGpuInstanceById",
                by_id(handle, gpu_instance_id, &mut gi),
            )?;
        }
        let destroy_ci = sym(
            "nvmlComputeInstanceDestroy",
            lib.nvmlComputeInstanceDestroy.as_ref(),
        )?;
        for ci in self.compute_instances(gi)? {
            // SAFETY: `ci` was just listed by the driver.
            unsafe { ret("nvmlComputeInstanceDestroy", destroy_ci(ci))? };
        }
        let destroy_gi = sym(
            "nvmlGpuInstanceDestroy",
            lib.nvmlGpuInstanceDestroy.as_ref(),
        )?;
        // SAFETY: `gi` was just looked up and is not used afterwards.
        unsafe { ret("nvmlGpuInstanceDestroy", destroy_gi(gi)) }
    }
}

/// GPU-instance profile indexes the agent may create: the plain 1/2/3/4/6/7/8-slice
/// profiles and the two-memory-slice 1g (`REV2`); never the media-extension or graphics
/// variants.
const CREATABLE_PROFILES: [u32; 8] = [
    sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_6_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
];

/// The profile's name: from the table when it is known there (NVIDIA names profiles by
/// nominal size), otherwise from its slices and memory rounded up.
fn profile_name(known: &[MigProfile], info: &sys::nvmlGpuInstanceProfileInfo_t) -> String {
    known
        .iter()
        .find(|p| p.id == info.id)
        .map(|p| p.name.clone())
        .unwrap_or_else(|| {
            format!(
                "{}g.{}gb",
                info.sliceCount,
                info.memorySizeMB.div_ceil(1024)
            )
        })
}

fn unsafe_handle(device: &Device<'static>) -> sys::nvmlDevice_t {
    // SAFETY: the handle is only passed back to NVML while `device` (and the leaked
    // `Nvml`) live.
    unsafe { device.handle() }
}

/// An NVML entry point, or a clear error when the loaded driver lacks it.
fn sym<'a, T, E: std::fmt::Display>(
    call: &'static str,
    found: Result<&'a T, &E>,
) -> Result<&'a T, GpuError> {
    found.map_err(|e| GpuError::Nvml {
        call,
        reason: format!("not in the loaded NVML library: {e}"),
    })
}

fn ret(call: &'static str, code: sys::nvmlReturn_t) -> Result<(), GpuError> {
    nvml_try(code).map_err(err(call))
}

impl NvmlBackend {
    /// NVML's total memory of a GPU (the profile tables key on it); on a MIG parent
    /// without monitoring privilege, the full-GPU instance's.
    fn parent_memory_mib(&self, device: &Device<'static>) -> u64 {
        device
            .memory_info()
            .map(|m| m.total / MIB)
            .unwrap_or_else(|_| {
                self.gi_profile_info(
                    unsafe_handle(device),
                    sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE,
                )
                .ok()
                .flatten()
                .map_or(0, |p| p.memorySizeMB)
            })
    }

    /// NVSwitch fabric registration of a GPU as (state, status text); `None` where the
    /// GPU has no fabric or the driver lacks the call.
    fn fabric(&self, device: &Device<'static>) -> Option<(u8, String)> {
        let f = self.nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref().ok()?;
        // SAFETY: plain C struct, zero is a valid bit pattern.
        let mut info: sys::nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
        // NVML_STRUCT_VERSION(GpuFabricInfo, 3), as nvml.h defines it.
        info.version = (std::mem::size_of::<sys::nvmlGpuFabricInfoV_t>() | (3 << 24)) as u32;
        // SAFETY: valid device handle; out-pointer to a live local.
        let code = unsafe { f(unsafe_handle(device), &mut info) };
        if code != sys::nvmlReturn_enum_NVML_SUCCESS
            || u32::from(info.state) == sys::NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        {
            return None;
        }
        let status = match nvml_try(info.status) {
            Ok(()) => "success".to_owned(),
            Err(e) => e.to_string(),
        };
        Some((info.state, status))
    }

    /// GPU-instance profile `index` of a device; `None` when the device has no such profile.
    fn gi_profile_info(
        &self,
        handle: sys::nvmlDevice_t,
        index: u32,
    ) -> Result<Option<sys::nvmlGpuInstanceProfileInfo_t>, GpuError> {
        let lib = self.nvml.lib();
        let f = sym(
            "nvmlDeviceGetGpuInstanceProfileInfo",
            lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref(),
        )?;
        // SAFETY: plain C struct, zero is a valid bit pattern; valid handle.
        let mut info: sys::nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let code = unsafe { f(handle, index, &mut info) };
        Ok((code == sys::nvmlReturn_enum_NVML_SUCCESS && info.instanceCount > 0).then_some(info))
    }

    fn possible_placements(
        &self,
        handle: sys::nvmlDevice_t,
        profile_id: u32,
    ) -> Result<Vec<sys::nvmlGpuInstancePlacement_t>, GpuError> {
        const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let lib = self.nvml.lib();
        let f = sym(
            CALL,
            lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref(),
        )?;
        let mut count: u32 = 0;
        // SAFETY: a null buffer asks for the count only.
        unsafe {
            ret(
                CALL,
                f(handle, profile_id, std::ptr::null_mut(), &mut count),
            )?
        };
        let mut placements =
            vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        // SAFETY: the buffer holds `count` entries.
        unsafe {
            ret(
                CALL,
                f(handle, profile_id, placements.as_mut_ptr(), &mut count),
            )?
        };
        placements.truncate(count as usize);
        Ok(placements)
    }

    fn gpu_instances(
        &self,
        handle: sys::nvmlDevice_t,
        info: &sys::nvmlGpuInstanceProfileInfo_t,
    ) -> Result<Vec<sys::nvmlGpuInstance_t>, GpuError> {
        const CALL: &str = "nvmlDeviceGetGpuInstances";
        let lib = self.nvml.lib();
        let f = sym(CALL, lib.nvmlDeviceGetGpuInstances.as_ref())?;
        let mut list = vec![std::ptr::null_mut(); info.instanceCount.max(1) as usize];
        let mut count: u32 = 0;
        // SAFETY: the buffer holds the profile's maximum instance count.
        unsafe { ret(CALL, f(handle, info.id, list.as_mut_ptr(), &mut count))? };
        list.truncate(count as usize);
        Ok(list)
    }

    fn gi_info(&self, gi: sys::nvmlGpuInstance_t) -> Result<sys::nvmlGpuInstanceInfo_t, GpuError> {
        const CALL: &str = "nvmlGpuInstanceGetInfo";
        let f = sym(CALL, self.nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        // SAFETY: plain C struct; `gi` comes from the driver.
        let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        unsafe { ret(CALL, f(gi, &mut info))? };
        Ok(info)
    }

    /// Compute-instance profiles of `gi` that exist on this driver.
    fn ci_profiles(
        &self,
        gi: sys::nvmlGpuInstance_t,
    ) -> Result<Vec<sys::nvmlComputeInstanceProfileInfo_t>, GpuError> {
        const CALL: &str = "nvmlGpuInstanceGetComputeInstanceProfileInfo";
        let f = sym(
            CALL,
            self.nvml
                .lib()
                .nvmlGpuInstanceGetComputeInstanceProfileInfo
                .as_ref(),
        )?;
        let mut out = Vec::new();
        for index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            // SAFETY: plain C struct; `gi` comes from the driver.
            let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let code = unsafe {
                f(
                    gi,
                    index,
                    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                )
            };
            if code == sys::nvmlReturn_enum_NVML_SUCCESS {
                out.push(info);
            }
        }
        Ok(out)
    }

    fn compute_instances(
        &self,
        gi: sys::nvmlGpuInstance_t,
    ) -> Result<Vec<sys::nvmlComputeInstance_t>, GpuError> {
        const CALL: &str = "nvmlGpuInstanceGetComputeInstances";
        let f = sym(
            CALL,
            self.nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref(),
        )?;
        let mut out = Vec::new();
        for profile in self.ci_profiles(gi)? {
            let mut list = vec![std::ptr::null_mut(); profile.instanceCount.max(1) as usize];
            let mut count: u32 = 0;
            // SAFETY: the buffer holds the profile's maximum instance count.
            unsafe { ret(CALL, f(gi, profile.id, list.as_mut_ptr(), &mut count))? };
            list.truncate(count as usize);
            out.extend(list);
        }
        Ok(out)
    }

    fn ci_id(&self, ci: sys::nvmlComputeInstance_t) -> Result<u32, GpuError> {
        const CALL: &str = "nvmlComputeInstanceGetInfo_v2";
        let f = sym(CALL, self.nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
        // SAFETY: plain C struct; `ci` comes from the driver.
        let mut info: sys::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        unsafe { ret(CALL, f(ci, &mut info))? };
        Ok(info.id)
    }

    /// Creates one compute instance spanning all `slices` of `gi`.
    fn create_full_ci(&self, gi: sys::nvmlGpuInstance_t, slices: u32) -> Result<(), GpuError> {
        const CALL: &str = "nvmlGpuInstanceCreateComputeInstance";
        let f = sym(
            CALL,
            self.nvml
                .lib()
                .nvmlGpuInstanceCreateComputeInstance
                .as_ref(),
        )?;
        let profile = self
            .ci_profiles(gi)?
            .into_iter()
            .find(|p| p.sliceCount == slices)
            .ok_or_else(|| GpuError::Nvml {
                call: CALL,
                reason: format!("no compute-instance profile spans {slices} slices"),
            })?;
        let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` comes from the driver; out-pointer to a live local.
        unsafe { ret(CALL, f(gi, profile.id, &mut ci)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profile_from_device_name() {
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb"),
            Some("1g.5gb")
        );
        assert_eq!(mig_profile("NVIDIA H100"), None);
    }

    #[test]
    fn open_without_driver_says_nvml_not_available() {
        // CI machines have no NVIDIA driver; on a GPU machine this opens fine.
        if let Err(e) = NvmlBackend::open() {
            assert!(e.to_string().starts_with("NVML not available: "), "{e}");
        }
    }
}
