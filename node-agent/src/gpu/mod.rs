//! The GPU layer: what the agent needs to know about the node's GPUs, behind one trait
//! with two backends, NVML (real hardware) and a simulated machine read from YAML.
//!
//! Inventory ([`GpuDevice`]) is read once at start; samples ([`GpuSample`]) are polled;
//! XID critical errors arrive through [`GpuBackend::wait_event`], which blocks, so the
//! agent calls it from a dedicated blocking task.

pub mod mig;
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
        /// The NVML function that failed (e.g. `nvmlDeviceGetUUID`).
        call: &'static str,
        /// NVML's error text.
        reason: String,
    },
    /// A simulated machine's shape file could not be read or is invalid (the error names
    /// the file, the line and the field).
    #[error("simulated GPU shape {0}")]
    Shape(#[from] tessera_gpushape::YamlError),
    /// A valid shape the simulated backend cannot run.
    #[error("simulated GPU file {path}: {reason}")]
    SimFile {
        /// The shape file from `--gpu-backend sim:<file.yaml>`, as given.
        path: String,
        /// What is wrong, naming the field and the accepted form.
        reason: String,
    },
    /// No GPU with this UUID.
    #[error("no GPU with uuid {0:?} on this node")]
    UnknownGpu(String),
    /// Agent options that cannot work together.
    #[error("{0}")]
    Config(String),
    /// The `--gpu-backend` value is not understood.
    #[error("invalid --gpu-backend {0:?}: expected `nvml` or `sim:<file.yaml>`")]
    BadSpec(String),
    /// The backend cannot do this (MIG management on a backend without it).
    #[error("the {backend} GPU backend does not support {call}")]
    Unsupported {
        /// What was asked, e.g. `creating MIG instances`.
        call: &'static str,
        /// The backend's kind.
        backend: &'static str,
    },
    /// NVML answered NO_PERMISSION or NOT_SUPPORTED: this datum is unknown for this GPU
    /// (a MIG parent without monitoring privilege, a board without the counter), which
    /// degrades that reading only.
    #[error("NVML query {call}: {why}")]
    Unavailable {
        /// The NVML function whose datum is unknown.
        call: &'static str,
        /// `no permission` or `not supported`, with what to do about it.
        why: String,
    },
    /// NVML answered GPU_IS_LOST: the GPU fell off the bus.
    #[error("NVML query {call}: the GPU is lost (fell off the bus)")]
    Lost {
        /// The NVML function that found the GPU lost.
        call: &'static str,
    },
    /// A MIG operation was refused.
    #[error("MIG on GPU {gpu}: {reason}")]
    Mig {
        /// UUID of the GPU in MIG mode the operation was on.
        gpu: String,
        /// What the driver (or the simulated backend) refused and why.
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
    /// Anything else (IBM NPU).
    Other,
    /// The driver could not say (`NVML_NVLINK_DEVICE_TYPE_UNKNOWN`, or the query failed);
    /// [`resolve_link_peers`] decides from the remote PCI bus id.
    Unknown,
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
    /// Compute slices it holds (of the GPU's [`mig::COMPUTE_SLICES`]); 0 when the driver
    /// did not say.
    #[serde(default)]
    pub compute_slices: u32,
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
    /// Framebuffer memory a process can have: NVML's total less what the driver
    /// reserves (`nvmlMemory_v2_t.reserved`).
    pub memory_total_mib: u64,
    /// Memory the driver reserves for itself (part of NVML's total, never usable).
    #[serde(default)]
    pub memory_reserved_mib: u64,
    /// NUMA node of the GPU's PCIe root, when known.
    pub numa_node: Option<u32>,
    /// PCI bus id (`0000:18:00.0`).
    pub pci_bus_id: String,
    /// Active NVLinks.
    pub nvlinks: Vec<NvLink>,
    /// `Some` when the GPU is in MIG mode: its MIG devices (possibly none yet).
    pub mig: Option<Vec<MigDevice>>,
    /// Data this GPU could not report, each as `what: why` (a MIG parent without
    /// monitoring privilege, a counter the board lacks). The rest of the GPU is served.
    #[serde(default)]
    pub unknown: Vec<String>,
    /// Why the GPU cannot be served at all (lost, inventory query failed); it is then
    /// advertised unhealthy while the rest of the node keeps serving.
    #[serde(default)]
    pub fault: Option<String>,
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
    /// Framebuffer memory it holds, including its CUDA context (NVML counts the context,
    /// a few hundred MiB per process and GPU); `None` when NVML reports it unavailable.
    pub memory_used_mib: Option<u64>,
    /// SM utilisation since the previous reading, percent: 0 when the driver logged no
    /// sample for it since then (NVML logs samples only for processes that ran).
    pub sm_percent: u32,
}

/// A live reading of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    /// Memory in use; `None` when unknown (a MIG parent without monitoring privilege
    /// and no MIG device to read it from).
    pub memory_used_mib: Option<u64>,
    /// GPU utilisation, percent; `None` where NVML does not support it (MIG parents).
    pub utilization_percent: Option<u32>,
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

/// Whether a GPU can be handed out, apart from XIDs: polled, so a GPU comes back
/// once its condition clears.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuCondition {
    /// Reachable, and its NVSwitch fabric (where it has one) is registered.
    Ready,
    /// It fell off the bus (GPU_IS_LOST) or stopped answering.
    Lost(String),
    /// On an NVSwitch system whose fabric manager has not (or not successfully)
    /// registered this GPU: CUDA work on it would fail.
    FabricNotReady(String),
}

/// One per-process utilisation sample as the driver logs it
/// (`nvmlProcessUtilizationSample_t`): only processes that ran get samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtilizationSample {
    /// Host PID.
    pub pid: u32,
    /// CPU timestamp of the sample, microseconds.
    pub timestamp_us: u64,
    /// SM utilisation, percent.
    pub sm_percent: u32,
}

/// Per-GPU bookkeeping for per-process utilisation: NVML returns every sample in its
/// buffer newer than the timestamp it is given, so asking with 0 returns samples of
/// processes that have since gone idle. The newest timestamp seen is kept per GPU and a
/// process without a newer sample counts as 0%.
///
/// Several readers share one backend (watchdog, metrics, reporter) while the driver
/// logs samples at its own rate (about every 170 ms): a reading less than `reuse`
/// after the previous one of the same GPU gets the previous result instead of an empty
/// window.
#[derive(Debug, Default)]
pub struct UtilizationCursor {
    last_seen: parking_lot::Mutex<std::collections::HashMap<String, u64>>,
    reuse: Duration,
    previous: parking_lot::Mutex<std::collections::HashMap<String, UtilizationReading>>,
}

/// When a GPU's per-process utilisation was read, and what it was (PID to percent).
type UtilizationReading = (std::time::Instant, std::collections::HashMap<u32, u32>);

impl UtilizationCursor {
    /// A cursor whose readings within `reuse` of the previous one repeat it.
    pub fn with_reuse(reuse: Duration) -> Self {
        Self {
            reuse,
            ..Self::default()
        }
    }

    /// The previous result for GPU `uuid` when it is less than the reuse window old.
    pub fn recent(&self, uuid: &str) -> Option<std::collections::HashMap<u32, u32>> {
        let previous = self.previous.lock();
        let (at, map) = previous.get(uuid)?;
        (at.elapsed() < self.reuse).then(|| map.clone())
    }

    /// The timestamp to ask GPU `uuid`'s samples after.
    pub fn since(&self, uuid: &str) -> u64 {
        self.last_seen.lock().get(uuid).copied().unwrap_or(0)
    }

    /// Takes the samples NVML returned for `since(uuid)` and gives each PID's newest
    /// utilisation; advances the cursor.
    pub fn take(
        &self,
        uuid: &str,
        samples: &[UtilizationSample],
    ) -> std::collections::HashMap<u32, u32> {
        let mut last = self.last_seen.lock();
        let since = last.get(uuid).copied().unwrap_or(0);
        let mut newest: std::collections::HashMap<u32, (u64, u32)> = Default::default();
        for s in samples.iter().filter(|s| s.timestamp_us > since) {
            let e = newest.entry(s.pid).or_insert((0, 0));
            if s.timestamp_us >= e.0 {
                *e = (s.timestamp_us, s.sm_percent.min(100));
            }
        }
        if let Some(max) = samples.iter().map(|s| s.timestamp_us).max() {
            let entry = last.entry(uuid.to_owned()).or_insert(0);
            *entry = (*entry).max(max);
        } else {
            last.entry(uuid.to_owned()).or_insert(0);
        }
        drop(last);
        let result: std::collections::HashMap<u32, u32> =
            newest.into_iter().map(|(pid, (_, sm))| (pid, sm)).collect();
        if !self.reuse.is_zero() {
            self.previous
                .lock()
                .insert(uuid.to_owned(), (std::time::Instant::now(), result.clone()));
        }
        result
    }
}

/// A PCI bus id in sysfs form (`0000:18:00.0`, lower case): NVML writes the domain
/// with 8 digits (`00000000:18:00.0`) and upper case, `nvidia-smi` and sysfs with 4.
pub fn canonical_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => {
            let domain = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{domain:04x}:{rest}")
        }
        // No domain at all (`18:00.0`).
        _ if lower.contains(':') => format!("0000:{lower}"),
        _ => lower,
    }
}

/// Decides links the driver could not type from their remote PCI bus id: one of this
/// node's GPUs → a direct bridge, anything else → an NVSwitch (the only other NVLink
/// endpoint on x86 systems). A link without a remote bus id stays [`LinkPeer::Other`].
pub fn resolve_link_peers(devices: &mut [GpuDevice]) {
    let gpus: std::collections::HashSet<String> = devices
        .iter()
        .map(|d| canonical_bus_id(&d.pci_bus_id))
        .collect();
    for device in devices.iter_mut() {
        for link in &mut device.nvlinks {
            if link.remote != LinkPeer::Unknown {
                continue;
            }
            let remote = canonical_bus_id(&link.remote_pci_bus_id);
            link.remote = if link.remote_pci_bus_id.trim().is_empty() {
                LinkPeer::Other
            } else if gpus.contains(&remote) {
                LinkPeer::Gpu
            } else {
                LinkPeer::Switch
            };
        }
    }
}

/// The resource-name form of a MIG profile: NVIDIA's device plugin names the
/// media-extension profiles `1g.10gb+me` as `mig-1g.10gb.me` (`+` is not allowed in a
/// resource name).
pub fn resource_profile(profile: &str) -> String {
    profile.replace('+', ".")
}

/// The NUMA node sysfs gives the PCI device `bus_id` under `sys_root` (normally
/// `/sys`): NVML has none on x86 HGX boards, and the kubelet's Topology Manager aligns
/// by it. `-1` (no NUMA affinity) and an unreadable file are `None`.
pub fn sysfs_numa_node(sys_root: &std::path::Path, bus_id: &str) -> Option<u32> {
    let path = sys_root
        .join("bus/pci/devices")
        .join(canonical_bus_id(bus_id))
        .join("numa_node");
    let text = std::fs::read_to_string(path).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
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

    /// Whether GPU `uuid` can be handed out now (reachable, fabric registered).
    fn condition(&self, uuid: &str) -> GpuCondition {
        let _ = uuid;
        GpuCondition::Ready
    }

    /// Per-device XID registration as it happened: GPUs whose events could not be
    /// registered (unsupported), each with the reason. Empty before the first wait.
    fn event_gaps(&self) -> Vec<String> {
        Vec::new()
    }

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
