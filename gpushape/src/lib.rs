//! GPU server shapes: the format of `hack/gpus/*.yaml` (documented in `hack/gpus/README.md`)
//! and its only reader.
//!
//! Three programs read these files: the simulator builds cluster nodes from them, the node
//! agent's simulated GPU backend stands in for NVML with them, and the test clusters start
//! agents on them. They read one [`GpuShape`] through [`GpuShape::parse`], so a file one of
//! them accepts is never rejected by another, and every check (ranges, indices, enumerations)
//! is made once, here, with errors that name the file, the line and the field.
//!
//! Each reader takes what it needs: the simulator needs `cpu_milli` and `memory_mib` (see
//! [`GpuShape::node_resources`]); the agent ignores them and uses the driver-behaviour fields
//! (`reserved_mib`, `fabric`, `xid_events`, ...) that the simulator ignores.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

/// Failure to read or validate a shape file, or another YAML input read through
/// [`parse_yaml`] (the simulator's workload files).
#[derive(Debug, Error)]
pub enum YamlError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file as given.
        file: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed, a field has the wrong type or is unknown (the message carries
    /// the line, the column and the field path).
    #[error("{file}: {message}")]
    Parse {
        /// The file as given.
        file: String,
        /// The parser's message, prefixed with the location.
        message: String,
    },
    /// A value is out of its accepted range.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The file as given.
        file: String,
        /// Path of the field, e.g. `gpus[3].memory_mib`.
        field: String,
        /// What is wrong and the accepted form.
        message: String,
    },
}

/// Parses YAML text into `T`, turning errors into [`YamlError::Parse`] with the location.
pub fn parse_yaml<T: for<'de> Deserialize<'de>>(file: &str, text: &str) -> Result<T, YamlError> {
    serde_yaml_ng::from_str(text).map_err(|e| {
        let location = e
            .location()
            .map(|l| format!("line {}, column {}: ", l.line(), l.column()))
            .unwrap_or_default();
        YamlError::Parse {
            file: file.to_string(),
            message: format!("{location}{e}"),
        }
    })
}

/// Reads a file to text, naming it in the error.
pub fn read(path: &Path) -> Result<String, YamlError> {
    std::fs::read_to_string(path).map_err(|source| YamlError::Io {
        file: path.display().to_string(),
        source,
    })
}

/// One GPU server shape.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuShape {
    /// Shape name; by convention the file name without `.yaml`. Readers that have no name
    /// use the file stem or the machine name.
    #[serde(default)]
    pub name: Option<String>,
    /// Free text.
    #[serde(default)]
    pub description: Option<String>,
    /// Allocatable CPU of the node in milli-cores (the simulator requires it).
    #[serde(default)]
    pub cpu_milli: Option<u64>,
    /// Allocatable memory of the node in MiB (the simulator requires it).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// All GPUs share one NVSwitch fabric (one NVLink island).
    #[serde(default)]
    pub nvswitch: bool,
    /// NVLinks per GPU into the switch fabric; `None` means 18, as on H100 SXM.
    #[serde(default)]
    pub nvswitch_links: Option<u32>,
    /// Point-to-point NVLink connections; ignored when `nvswitch` is true.
    #[serde(default)]
    pub nvlinks: Vec<NvLink>,
    /// Whether the driver types the far end of an NVLink.
    #[serde(default)]
    pub nvlink_remote_type: RemoteType,
    /// Whether the agent holds MIG monitoring privilege (the chart grants it); without it a
    /// MIG parent's memory reads as NO_PERMISSION, as NVML does.
    #[serde(default = "yes")]
    pub mig_monitor: bool,
    /// The GPUs in device index order.
    pub gpus: Vec<GpuSpec>,
}

/// One GPU of a shape.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Model name as NVML reports it, shortened (`H100-80GB`); pods select models by it.
    pub model: String,
    /// Framebuffer memory in MiB, including what the driver reserves.
    pub memory_mib: u64,
    /// NUMA node of the GPU's PCIe root.
    #[serde(default)]
    pub numa: u32,
    /// PCI bus id `DDDD:BB:DD.F`; [`GpuShape::pci_bus_id`] gives a derived one when absent.
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    /// A fixed GPU UUID; absent, the agent derives one from the machine and the shape.
    #[serde(default)]
    pub uuid: Option<String>,
    /// PCIe switch the GPU sits behind; GPUs without one sit alone behind their own.
    #[serde(default)]
    pub pcie_switch: Option<u32>,
    /// Memory the driver reserves out of `memory_mib`.
    #[serde(default)]
    pub reserved_mib: u64,
    /// Whether the GPU reports XID events.
    #[serde(default = "yes")]
    pub xid_events: bool,
    /// NVSwitch fabric registration state; absent, `completed` on NVSwitch shapes.
    #[serde(default)]
    pub fabric: Option<Fabric>,
    /// The MIG instances when the GPU is in MIG mode.
    #[serde(default)]
    pub mig: Option<Vec<MigSpec>>,
}

/// A MIG instance.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigSpec {
    /// Profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Share of the GPU's compute in milli-GPU (3 of 7 slices = 428); the simulator needs
    /// it, the agent counts slices from the profile as NVML reports them.
    #[serde(default)]
    pub compute_milli: Option<u32>,
    /// A fixed MIG device UUID; absent, the agent derives one.
    #[serde(default)]
    pub uuid: Option<String>,
}

/// An NVLink connection between two GPUs.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLink {
    /// First GPU index.
    pub a: u32,
    /// Second GPU index.
    pub b: u32,
    /// Number of NVLink lanes.
    #[serde(default = "one")]
    pub links: u32,
}

/// What the driver reports as the far end of an NVLink.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteType {
    /// A GPU or a switch, as the link really goes.
    #[default]
    Known,
    /// Unknown, as nvml-wrapper 0.13 always reports it: readers must decide from the remote
    /// bus id.
    Unknown,
}

/// NVSwitch fabric registration states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fabric {
    /// Registered.
    Completed,
    /// The fabric manager is still registering the GPU.
    InProgress,
    /// The fabric manager has not started.
    NotStarted,
    /// Registration failed.
    Failed,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// More GPUs than any server holds; a larger count is a typo.
const MAX_GPUS: usize = 64;

impl GpuShape {
    /// Parses and validates a shape; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<GpuShape, YamlError> {
        let shape: GpuShape = parse_yaml(file, text)?;
        shape.validate(file)?;
        Ok(shape)
    }

    /// Reads, parses and validates a shape file.
    pub fn load(path: &Path) -> Result<GpuShape, YamlError> {
        GpuShape::parse(&path.display().to_string(), &read(path)?)
    }

    fn validate(&self, file: &str) -> Result<(), YamlError> {
        let invalid = |field: String, message: String| YamlError::Invalid {
            file: file.to_string(),
            field,
            message,
        };
        if self.gpus.len() > MAX_GPUS {
            return Err(invalid(
                "gpus".into(),
                format!("{} GPUs (accepted: 0..={MAX_GPUS})", self.gpus.len()),
            ));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if g.model.trim().is_empty() {
                return Err(invalid(
                    format!("gpus[{i}].model"),
                    "empty (expected a model name such as H100-80GB)".into(),
                ));
            }
            if g.memory_mib == 0 {
                return Err(invalid(
                    format!("gpus[{i}].memory_mib"),
                    "0 (expected a positive number of MiB)".into(),
                ));
            }
            if g.reserved_mib >= g.memory_mib {
                return Err(invalid(
                    format!("gpus[{i}].reserved_mib"),
                    format!(
                        "{} (accepted: less than memory_mib, {})",
                        g.reserved_mib, g.memory_mib
                    ),
                ));
            }
            for (k, m) in g.mig.iter().flatten().enumerate() {
                let profile_chars = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '+';
                if m.profile.is_empty() || !m.profile.chars().all(profile_chars) {
                    return Err(invalid(
                        format!("gpus[{i}].mig[{k}].profile"),
                        format!("{:?} (expected a MIG profile such as 1g.5gb)", m.profile),
                    ));
                }
                if let Some(c) = m.compute_milli.filter(|c| !(1..=1000).contains(c)) {
                    return Err(invalid(
                        format!("gpus[{i}].mig[{k}].compute_milli"),
                        format!("{c} (accepted: 1..=1000)"),
                    ));
                }
                if m.memory_mib == 0 || m.memory_mib > g.memory_mib {
                    return Err(invalid(
                        format!("gpus[{i}].mig[{k}].memory_mib"),
                        format!(
                            "{} (accepted: 1..={}, the GPU's memory)",
                            m.memory_mib, g.memory_mib
                        ),
                    ));
                }
            }
        }
        let n = self.gpus.len() as u32;
        for (k, l) in self.nvlinks.iter().enumerate() {
            for (end, g) in [("a", l.a), ("b", l.b)] {
                if g >= n {
                    return Err(invalid(
                        format!("nvlinks[{k}].{end}"),
                        format!("GPU index {g} does not exist (accepted: 0..{n})"),
                    ));
                }
            }
            if l.a == l.b {
                return Err(invalid(
                    format!("nvlinks[{k}]"),
                    format!("a = b = {} (a link joins two different GPUs)", l.a),
                ));
            }
        }
        Ok(())
    }

    /// The node's allocatable CPU (milli-cores) and memory (MiB), which the simulator needs
    /// and the agent does not; the error names the missing field.
    pub fn node_resources(&self, file: &str) -> Result<(u64, u64), YamlError> {
        let missing = |field: &str, form: &str| YamlError::Invalid {
            file: file.to_string(),
            field: field.to_string(),
            message: format!("missing (the simulator needs the node's {form})"),
        };
        let cpu = self
            .cpu_milli
            .ok_or_else(|| missing("cpu_milli", "allocatable CPU in milli-cores"))?;
        let memory = self
            .memory_mib
            .ok_or_else(|| missing("memory_mib", "allocatable memory in MiB"))?;
        Ok((cpu, memory))
    }

    /// GPU `index`'s PCI bus id: the declared one, or one derived from the index so that
    /// links between GPUs without declared ids still resolve.
    pub fn pci_bus_id(&self, index: usize) -> String {
        let declared = self.gpus.get(index).and_then(|g| g.pci_bus_id.clone());
        declared.unwrap_or_else(|| {
            // Bus numbers 0x10, 0x18, ... stay below 0xe0, where the simulated NVSwitches sit.
            format!("0000:{:02x}:00.0", (0x10 + index * 8) % 0xe0)
        })
    }

    /// NVLink island of each GPU: the connected components of the NVLink graph, numbered in
    /// order of their first GPU; all one island with NVSwitch; `None` for GPUs without NVLink.
    pub fn islands(&self) -> Vec<Option<u32>> {
        let n = self.gpus.len();
        if self.nvswitch {
            return vec![Some(0); n];
        }
        fn root(parent: &mut [usize], x: usize) -> usize {
            let mut r = x;
            while parent[r] != r {
                r = parent[r];
            }
            parent[x] = r;
            r
        }
        let mut parent: Vec<usize> = (0..n).collect();
        let mut linked = vec![false; n];
        for l in &self.nvlinks {
            let (a, b) = (l.a as usize, l.b as usize);
            linked[a] = true;
            linked[b] = true;
            let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
            parent[ra.max(rb)] = ra.min(rb);
        }
        let mut roots: Vec<usize> = Vec::new();
        (0..n)
            .map(|g| {
                if !linked[g] {
                    return None;
                }
                let r = root(&mut parent, g);
                let id = roots.iter().position(|&x| x == r).unwrap_or_else(|| {
                    roots.push(r);
                    roots.len() - 1
                });
                Some(id as u32)
            })
            .collect()
    }
}

/// The repository's `hack/gpus` directory.
pub fn bundled_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus")
}

/// The shapes shipped in `hack/gpus`, compiled in so binaries work away from the repository.
const EMBEDDED: [(&str, &str); 3] = [
    (
        "h100-8x-nvswitch",
        include_str!("../../hack/gpus/h100-8x-nvswitch.yaml"),
    ),
    (
        "l40s-4x-pcie",
        include_str!("../../hack/gpus/l40s-4x-pcie.yaml"),
    ),
    (
        "a100-8x-mig",
        include_str!("../../hack/gpus/a100-8x-mig.yaml"),
    ),
];

/// Loads shape `name` from `dir`, falling back to the compiled-in copy of a bundled shape
/// when the file is not there. `None` when neither exists.
pub fn load_named(dir: &Path, name: &str) -> Option<Result<GpuShape, YamlError>> {
    let path = dir.join(format!("{name}.yaml"));
    if path.exists() {
        return Some(GpuShape::load(&path));
    }
    EMBEDDED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, text)| GpuShape::parse(&format!("<bundled {n}.yaml>"), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        GpuShape::parse("s.yaml", text).unwrap_err().to_string()
    }

    #[test]
    fn bundled_shapes_load_with_their_islands() {
        let dir = bundled_dir();
        let h100 = GpuShape::load(&dir.join("h100-8x-nvswitch.yaml")).unwrap();
        assert_eq!(h100.gpus.len(), 8);
        assert_eq!(h100.islands(), vec![Some(0); 8]);
        let l40s = GpuShape::load(&dir.join("l40s-4x-pcie.yaml")).unwrap();
        assert_eq!(l40s.islands(), vec![None; 4]);
        assert_eq!(l40s.gpus[2].numa, 1);
        let a100 = GpuShape::load(&dir.join("a100-8x-mig.yaml")).unwrap();
        let isl = a100.islands();
        assert_eq!(isl[0], isl[1]);
        assert_ne!(isl[1], isl[2]);
        assert_eq!(a100.gpus[7].mig.as_ref().map(Vec::len), Some(4));
        assert_eq!(a100.node_resources("a").unwrap().0, 128_000);
    }

    #[test]
    fn bundled_shapes_are_compiled_in() {
        let nowhere = Path::new("/nonexistent");
        let s = load_named(nowhere, "h100-8x-nvswitch").unwrap().unwrap();
        assert_eq!(s.gpus.len(), 8);
        assert!(load_named(nowhere, "nope").is_none());
        for (name, _) in EMBEDDED {
            let on_disk = GpuShape::load(&bundled_dir().join(format!("{name}.yaml"))).unwrap();
            assert_eq!(load_named(nowhere, name).unwrap().unwrap(), on_disk);
        }
    }

    #[test]
    fn agent_only_fields_have_the_drivers_defaults() {
        let s = GpuShape::parse("s.yaml", "gpus: [{model: X, memory_mib: 10}]").unwrap();
        let g = &s.gpus[0];
        assert!(s.mig_monitor && g.xid_events);
        assert_eq!(
            (g.reserved_mib, g.fabric, s.nvlink_remote_type),
            (0, None, RemoteType::Known)
        );
        assert_eq!(s.pci_bus_id(0), "0000:10:00.0");
        let s = GpuShape::parse(
            "s.yaml",
            "nvlink_remote_type: unknown\ngpus: [{model: X, memory_mib: 10, fabric: in-progress}]",
        )
        .unwrap();
        assert_eq!(s.gpus[0].fabric, Some(Fabric::InProgress));
        assert_eq!(s.nvlink_remote_type, RemoteType::Unknown);
    }

    #[test]
    fn the_simulator_names_what_it_misses() {
        let s = GpuShape::parse("s.yaml", "cpu_milli: 1\ngpus: []").unwrap();
        let e = s.node_resources("s.yaml").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml: memory_mib: missing"), "{e}");
    }

    #[test]
    fn bad_shapes_name_file_line_and_field() {
        let e = err("cpu_milli: 1\nmemory_mib: 1\ngpus:\n  - {model: A, memory_mib: lots}\n");
        assert!(
            e.contains("s.yaml: line 4") && e.contains("memory_mib"),
            "{e}"
        );
        let e = err("colour: red\ngpus: []\n");
        assert!(e.contains("line 1") && e.contains("colour"), "{e}");
        let e = err("gpus: [{model: A, memory_mib: 1, fabric: on}]");
        assert!(e.contains("fabric") && e.contains("in-progress"), "{e}");
        let e = err("nvlinks: [{a: 0, b: 3}]\ngpus: [{model: A, memory_mib: 1}]\n");
        assert_eq!(
            e,
            "s.yaml: nvlinks[0].b: GPU index 3 does not exist (accepted: 0..1)"
        );
        let e = err("nvlinks: [{a: 0, b: 0}]\ngpus: [{model: A, memory_mib: 1}]\n");
        assert!(e.starts_with("s.yaml: nvlinks[0]: a = b = 0"), "{e}");
        let e = err("gpus: [{model: A, memory_mib: 0}]");
        assert!(e.starts_with("s.yaml: gpus[0].memory_mib: 0"), "{e}");
        let e = err("gpus: [{model: A, memory_mib: 8, reserved_mib: 8}]");
        assert!(e.starts_with("s.yaml: gpus[0].reserved_mib"), "{e}");
        let e = err("gpus: [{model: ' ', memory_mib: 8}]");
        assert!(e.starts_with("s.yaml: gpus[0].model"), "{e}");
        let mig = |m: &str| err(&format!("gpus: [{{model: A, memory_mib: 8, mig: [{m}]}}]"));
        let e = mig("{profile: 'a b', memory_mib: 1, compute_milli: 1}");
        assert!(e.starts_with("s.yaml: gpus[0].mig[0].profile"), "{e}");
        let e = mig("{profile: 1g.1gb, memory_mib: 1, compute_milli: 1001}");
        assert!(e.starts_with("s.yaml: gpus[0].mig[0].compute_milli"), "{e}");
        let e = mig("{profile: 1g.1gb, memory_mib: 9, compute_milli: 1}");
        assert!(e.starts_with("s.yaml: gpus[0].mig[0].memory_mib"), "{e}");
    }
}
