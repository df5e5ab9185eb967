//! The NVML backend (`nvml-wrapper`). The library is loaded at runtime, so the agent
//! builds and starts on machines without the NVIDIA driver; there [`NvmlBackend::open`]
//! fails with `NVML not available: …`.

use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enum_wrappers::nv_link::IntDeviceType;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};
use parking_lot::Mutex;

use super::{
    GpuBackend, GpuDevice, GpuError, GpuProcess, GpuSample, LinkPeer, MigDevice, NvLink,
    PcieRelation, XidEvent,
};
use super::{MigInstance, MigProfile};
use nvml_wrapper::error::nvml_try;
use nvml_wrapper_sys::bindings as sys;

/// Most NVLinks any GPU generation has (Hopper: 18).
const MAX_NVLINKS: u32 = 18;

const MIB: u64 = 1024 * 1024;

/// Real GPUs through NVML.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    /// Created on the first `wait_event`, then reused.
    events: Mutex<Option<EventSet<'static>>>,
}

fn err(call: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |e| GpuError::Nvml {
        call,
        reason: e.to_string(),
    }
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
        })
    }

    fn by_uuid(&self, uuid: &str) -> Result<Device<'static>, GpuError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|_| GpuError::UnknownGpu(uuid.to_owned()))
    }

    fn describe(&self, device: &Device<'static>) -> Result<GpuDevice, GpuError> {
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
            let remote = match wrapper.remote_device_type(link) {
                Ok(IntDeviceType::Gpu) => LinkPeer::Gpu,
                Ok(IntDeviceType::Switch) => LinkPeer::Switch,
                _ => LinkPeer::Other,
            };
            nvlinks.push(NvLink {
                link,
                remote_pci_bus_id,
                remote,
            });
        }
        let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        let mig = if mig_enabled {
            let count = device.mig_device_count().map_err(err("mig_device_count"))?;
            let mut instances = Vec::new();
            for i in 0..count {
                let Ok(mig) = device.mig_device_by_index(i) else {
                    continue;
                };
                let name = mig.name().unwrap_or_default();
                instances.push(MigDevice {
                    uuid: mig.uuid().map_err(err("mig uuid"))?,
                    profile: mig_profile(&name).unwrap_or("unknown").to_owned(),
                    memory_total_mib: mig.memory_info().map(|m| m.total / MIB).unwrap_or(0),
                });
            }
            Some(instances)
        } else {
            None
        };
        Ok(GpuDevice {
            index: device.index().map_err(err("index"))?,
            uuid: device.uuid().map_err(err("uuid"))?,
            model: device.name().map_err(err("name"))?,
            memory_total_mib: device.memory_info().map_err(err("memory_info"))?.total / MIB,
            numa_node: device.numa_node_id().ok(),
            pci_bus_id: device.pci_info().map_err(err("pci_info"))?.bus_id,
            nvlinks,
            mig,
        })
    }

    fn event_set(&self) -> Result<EventSet<'static>, GpuError> {
        let mut set = self
            .nvml
            .create_event_set()
            .map_err(err("create_event_set"))?;
        let count = self.nvml.device_count().map_err(err("device_count"))?;
        for i in 0..count {
            let device = self
                .nvml
                .device_by_index(i)
                .map_err(err("device_by_index"))?;
            set = device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| GpuError::Nvml {
                    call: "register_events",
                    reason: e.error.to_string(),
                })?;
        }
        Ok(set)
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
        let count = self.nvml.device_count().map_err(err("device_count"))?;
        (0..count)
            .map(|i| {
                let device = self
                    .nvml
                    .device_by_index(i)
                    .map_err(err("device_by_index"))?;
                self.describe(&device)
            })
            .collect()
    }

    fn pcie_relation(&self, a: &str, b: &str) -> Result<PcieRelation, GpuError> {
        let (a, b) = (self.by_uuid(a)?, self.by_uuid(b)?);
        let level = a
            .topology_common_ancestor(b)
            .map_err(err("topology_common_ancestor"))?;
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
        let memory = device.memory_info().map_err(err("memory_info"))?;
        let utilization = device
            .utilization_rates()
            .map_err(err("utilization_rates"))?;
        // Per-process SM utilisation is optional (not on every board); missing means 0.
        let sm = device.process_utilization_stats(None).unwrap_or_default();
        let processes = device
            .running_compute_processes()
            .map_err(err("running_compute_processes"))?
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                memory_used_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => bytes / MIB,
                    UsedGpuMemory::Unavailable => 0,
                },
                sm_percent: sm
                    .iter()
                    .filter(|s| s.pid == p.pid)
                    .max_by_key(|s| s.timestamp)
                    .map_or(0, |s| s.sm_util),
            })
            .collect();
        Ok(GpuSample {
            memory_used_mib: memory.used / MIB,
            utilization_percent: utilization.gpu,
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
        match set.wait(millis) {
            Ok(event) => {
                let uuid = event.device.uuid().map_err(err("uuid"))?;
                let xid = match event.event_data {
                    Some(XidError::Value(x)) => x,
                    // An unknown XID is treated as the worst case.
                    Some(XidError::Unknown) | None => 999,
                };
                Ok(Some(XidEvent { uuid, xid }))
            }
            Err(NvmlError::Timeout) => Ok(None),
            Err(e) => Err(err("event_set.wait")(e)),
        }
    }

    fn mig_profiles(&self, uuid: &str) -> Result<Vec<MigProfile>, GpuError> {
        let device = self.by_uuid(uuid)?;
        let model = device.name().unwrap_or_default();
        let memory = device.memory_info().map(|m| m.total / MIB).unwrap_or(0);
        let known = crate::enforce::mig::profiles::table_for(&model, memory).unwrap_or_default();
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
        let memory = device.memory_info().map(|m| m.total / MIB).unwrap_or(0);
        let known = crate::enforce::mig::profiles::table_for(&model, memory).unwrap_or_default();
        // MIG devices by (GPU instance, compute instance): their UUIDs and processes.
        let mut mig_devices = Vec::new();
        for i in 0..device.mig_device_count().map_err(err("mig_device_count"))? {
            let Ok(mig) = device.mig_device_by_index(i) else {
                continue;
            };
            let mig_handle = unsafe_handle(&mig);
            let (mut gi, mut ci) = (0u32, 0u32);
            let lib = self.nvml.lib();
            let gi_of = sym(
                "nvmlDeviceGetGpuInstanceId",
                lib.nvmlDeviceGetGpuInstanceId.as_ref(),
            )?;
            let ci_of = sym(
                "nvmlDeviceGetComputeInstanceId",
                lib.nvmlDeviceGetComputeInstanceId.as_ref(),
            )?;
            // SAFETY: valid MIG device handle and out-pointers to live locals.
            unsafe {
                ret("nvmlDeviceGetGpuInstanceId", gi_of(mig_handle, &mut gi))?;
                ret("nvmlDeviceGetComputeInstanceId", ci_of(mig_handle, &mut ci))?;
            }
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
