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
