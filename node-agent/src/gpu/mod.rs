//! The GPU layer: what the agent needs to know about the node's GPUs, behind one trait
//! with two backends, NVML (real hardware) and a simulated machine read from YAML.
//!
//! Inventory ([`GpuDevice`]) is read once at start; samples ([`GpuSample`]) are polled;
//! XID critical errors arrive through [`GpuBackend::wait_event`], which blocks, so the
//! agent calls it from a dedicated blocking task.

pub mod nvml;
pub mod sim;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Failures of a GPU backend.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The NVIDIA management library could not be loaded or initialised.
    #[error("NVML not available: {0}")]
    NvmlUnavailable(String),
    /// An NVML query failed.
    #[error("NVML query {call} failed: {reason}")]
    Nvml {
        /// The query.
        call: &'static str,
        /// NVML's error text.
        reason: String,
    },
    /// A simulated machine file could not be read or is invalid.
    #[error("simulated GPU file {path}: {reason}")]
    SimFile {
        /// The file.
        path: String,
        /// What is wrong, naming the field and the accepted form.
        reason: String,
    },
    /// No GPU with this UUID.
    #[error("no GPU with uuid {0:?} on this node")]
    UnknownGpu(String),
    /// The `--gpu-backend` value is not understood.
    #[error("invalid --gpu-backend {0:?}: expected `nvml` or `sim:<file.yaml>`")]
    BadSpec(String),
    /// The backend cannot do this (MIG management on a backend without it).
    #[error("the {backend} GPU backend does not support {call}")]
    Unsupported {
        /// The operation.
        call: &'static str,
        /// The backend's kind.
        backend: &'static str,
    },
    /// A MIG operation was refused.
    #[error("MIG on GPU {gpu}: {reason}")]
    Mig {
        /// The parent GPU.
        gpu: String,
        /// Why.
        reason: String,
    },
}

/// What sits at the far end of one NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkPeer {
    /// Another GPU (a direct bridge).
    Gpu,
    /// An NVSwitch: the GPU reaches every other switch-attached GPU through it.
    Switch,
    /// Anything else (IBM NPU, unknown).
    Other,
}

/// One active NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Link number on this GPU.
    pub link: u32,
    /// PCI bus id of the device at the far end.
    pub remote_pci_bus_id: String,
    /// Kind of that device.
    pub remote: LinkPeer,
}

/// How two GPUs reach each other over PCIe: NVML's common-ancestor levels, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PcieRelation {
    /// Same board (multi-GPU cards).
    SameBoard,
    /// Behind one PCIe switch.
    SingleSwitch,
    /// Behind several switches without crossing a host bridge.
    MultipleSwitches,
    /// Same host bridge.
    HostBridge,
    /// Same NUMA node, different host bridges.
    NumaNode,
    /// Across the CPU interconnect.
    System,
}

impl PcieRelation {
    /// The short label `nvidia-smi topo -m` uses.
    pub fn short(self) -> &'static str {
        match self {
            PcieRelation::SameBoard => "BRD",
            PcieRelation::SingleSwitch => "PIX",
            PcieRelation::MultipleSwitches => "PXB",
            PcieRelation::HostBridge => "PHB",
            PcieRelation::NumaNode => "NODE",
            PcieRelation::System => "SYS",
        }
    }
}

/// One MIG device (GPU instance + compute instance) on a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// `MIG-…` UUID, the id the container runtime understands.
    pub uuid: String,
    /// Profile such as `1g.5gb`; the resource is `nvidia.com/mig-<profile>`.
    pub profile: String,
    /// Memory of the instance.
    pub memory_total_mib: u64,
}

/// A GPU-instance profile a GPU in MIG mode supports, as the driver lists it
/// (`nvidia-smi mig -lgip` / `-lgipp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// The driver's profile id (`nvidia-smi mig -cgi <id>`), e.g. 19 for `1g.5gb` on A100.
    pub id: u32,
    /// Profile name such as `1g.5gb`.
    pub name: String,
    /// Compute slices (the `Ng` in the name) out of the GPU's 7.
    pub compute_slices: u32,
    /// Memory slices the instance occupies out of the GPU's 8.
    pub memory_slices: u32,
    /// Memory of an instance.
    pub memory_mib: u64,
    /// First memory slice of every placement the hardware allows.
    pub placements: Vec<u32>,
}

/// A MIG device that exists now: a GPU instance with its (single, full) compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// `MIG-…` UUID (empty when the GPU instance has no compute instance).
    pub uuid: String,
    /// Profile name.
    pub profile: String,
    /// The driver's GPU-instance profile id.
    pub profile_id: u32,
    /// GPU instance id on its GPU.
    pub gpu_instance_id: u32,
    /// Compute instance id inside the GPU instance.
    pub compute_instance_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices occupied.
    pub size: u32,
    /// Compute slices.
    pub compute_slices: u32,
    /// Memory of the instance.
    pub memory_mib: u64,
    /// Compute processes running in it.
    pub processes: usize,
}

/// The static description of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub model: String,
    /// Total framebuffer memory.
    pub memory_total_mib: u64,
    /// NUMA node of the GPU's PCIe root, when known.
    pub numa_node: Option<u32>,
    /// PCI bus id (`0000:18:00.0`).
    pub pci_bus_id: String,
    /// Active NVLinks.
    pub nvlinks: Vec<NvLink>,
    /// `Some` when the GPU is in MIG mode: its MIG devices (possibly none yet).
    pub mig: Option<Vec<MigDevice>>,
}

impl GpuDevice {
    /// The first 8 hex digits of the UUID, for tables.
    pub fn short_uuid(&self) -> &str {
        short_uuid(&self.uuid)
    }
}

/// `GPU-1a2b3c4d-…` → `1a2b3c4d`.
pub fn short_uuid(uuid: &str) -> &str {
    let rest = uuid
        .strip_prefix("GPU-")
        .or_else(|| uuid.strip_prefix("MIG-"))
        .unwrap_or(uuid);
    rest.get(..8).unwrap_or(rest)
}

/// One process using a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Host PID.
    pub pid: u32,
    /// Framebuffer memory it holds.
    pub memory_used_mib: u64,
    /// SM utilisation over the last sample period, percent.
    pub sm_percent: u32,
}

/// A live reading of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    /// Memory in use.
    pub memory_used_mib: u64,
    /// GPU utilisation, percent.
    pub utilization_percent: u32,
    /// Compute processes.
    pub processes: Vec<GpuProcess>,
}

/// An XID error reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidEvent {
    /// The GPU (or MIG device) it happened on.
    pub uuid: String,
    /// The XID code.
    pub xid: u64,
}

impl XidEvent {
    /// Whether the GPU must stop being handed out. XIDs caused by the application
    /// (13 graphics engine exception, 31 MMU fault, 43 GPU stopped processing, 45
    /// preemptive cleanup, 68 video processor exception, 109 context switch timeout)
    /// leave the GPU usable, as in NVIDIA's own device plugin; all others do not.
    pub fn is_fatal(&self) -> bool {
        !matches!(self.xid, 13 | 31 | 43 | 45 | 68 | 109)
    }
}

/// A source of GPU facts.
pub trait GpuBackend: Send + Sync + 'static {
    /// `nvml` or `sim`.
    fn kind(&self) -> &'static str;

    /// All GPUs, in index order.
    fn devices(&self) -> Result<Vec<GpuDevice>, GpuError>;

    /// The PCIe relation between two GPUs.
    fn pcie_relation(&self, a: &str, b: &str) -> Result<PcieRelation, GpuError>;

    /// A live reading of one GPU.
    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError>;

    /// Blocks up to `timeout` for the next XID event; `Ok(None)` when none came.
    fn wait_event(&self, timeout: Duration) -> Result<Option<XidEvent>, GpuError>;

    /// The GPU-instance profiles GPU `uuid` (in MIG mode) supports, with their placements.
    fn mig_profiles(&self, uuid: &str) -> Result<Vec<MigProfile>, GpuError> {
        let _ = uuid;
        Err(GpuError::Unsupported {
            call: "listing MIG profiles",
            backend: self.kind(),
        })
    }

    /// The MIG devices that exist on GPU `uuid`, with their placements and process counts.
    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, GpuError> {
        let _ = uuid;
        Err(GpuError::Unsupported {
            call: "listing MIG instances",
            backend: self.kind(),
        })
    }

    /// Creates a GPU instance of profile `profile_id` at memory slice `start` on GPU
    /// `uuid`, and one compute instance spanning it. Never changes the MIG mode.
    fn mig_create(&self, uuid: &str, profile_id: u32, start: u32) -> Result<MigInstance, GpuError> {
        let _ = (uuid, profile_id, start);
        Err(GpuError::Unsupported {
            call: "creating MIG instances",
            backend: self.kind(),
        })
    }

    /// Destroys GPU instance `gpu_instance_id` of GPU `uuid` and its compute instances.
    fn mig_destroy(&self, uuid: &str, gpu_instance_id: u32) -> Result<(), GpuError> {
        let _ = (uuid, gpu_instance_id);
        Err(GpuError::Unsupported {
            call: "destroying MIG instances",
            backend: self.kind(),
        })
    }
}

/// The backend chosen by `--gpu-backend`.
#[derive(Clone)]
pub enum Backend {
    /// Real GPUs.
    Nvml(Arc<nvml::NvmlBackend>),
    /// A simulated machine.
    Sim(Arc<sim::SimBackend>),
}

impl Backend {
    /// Opens `nvml` or `sim:<file>`.
    pub fn open(spec: &str) -> Result<Self, GpuError> {
        if spec == "nvml" {
            return Ok(Backend::Nvml(Arc::new(nvml::NvmlBackend::open()?)));
        }
        match spec.strip_prefix("sim:") {
            Some(path) if !path.is_empty() => {
                Ok(Backend::Sim(Arc::new(sim::SimBackend::from_file(path)?)))
            }
            _ => Err(GpuError::BadSpec(spec.to_owned())),
        }
    }

    /// The backend as a trait object.
    pub fn as_dyn(&self) -> Arc<dyn GpuBackend> {
        match self {
            Backend::Nvml(b) => b.clone(),
            Backend::Sim(b) => b.clone(),
        }
    }

    /// The simulated backend, when that is the one in use.
    pub fn sim(&self) -> Option<&Arc<sim::SimBackend>> {
        match self {
            Backend::Sim(b) => Some(b),
            Backend::Nvml(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_are_not_fatal() {
        let ev = |xid| XidEvent {
            uuid: "GPU-x".into(),
            xid,
        };
        assert!(!ev(13).is_fatal());
        assert!(!ev(43).is_fatal());
        assert!(ev(79).is_fatal());
        assert!(ev(48).is_fatal());
    }

    #[test]
    fn short_uuid_strips_prefix() {
        assert_eq!(short_uuid("GPU-1a2b3c4d-0000"), "1a2b3c4d");
        assert_eq!(short_uuid("abc"), "abc");
    }

    #[test]
    fn bad_backend_spec_names_accepted_form() {
        let err = Backend::open("cuda").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("invalid --gpu-backend \"cuda\": expected `nvml` or `sim:<file.yaml>`")
        );
    }
}
