//! GPU node shapes (`hack/gpus/*.yaml`): CPU, memory, GPUs and their interconnect. The format
//! is documented in `hack/gpus/README.md`; the node agent's simulated backend reads the same
//! files.

use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

use crate::model::{Gpu, MigInstance, Node};

/// Failure to read or validate a shape or workload file.
#[derive(Debug, Error)]
pub enum YamlError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or a field has the wrong type (the message carries line, column
    /// and the field path).
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// Parser message with location.
        message: String,
    },
    /// A value is out of its accepted range.
    #[error("{file}: {field}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Path of the field, e.g. `jobs[3].fraction`.
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

/// Reads a file to text.
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
    /// Shape name.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: Option<String>,
    /// Allocatable CPU in milli-cores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    /// All GPUs share one NVSwitch fabric.
    #[serde(default)]
    pub nvswitch: bool,
    /// Point-to-point NVLink connections.
    #[serde(default)]
    pub nvlinks: Vec<NvLink>,
    /// GPUs in device index order.
    pub gpus: Vec<GpuSpec>,
}

/// One GPU of a shape.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Model name.
    pub model: String,
    /// Framebuffer memory in MiB.
    pub memory_mib: u64,
    /// NUMA node.
    #[serde(default)]
    pub numa: u32,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// MIG instances when the GPU is in MIG mode.
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
    /// Compute share in milli-GPU.
    pub compute_milli: u32,
}

/// An NVLink connection between two GPUs.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLink {
    /// First GPU index.
    pub a: u32,
    /// Second GPU index.
    pub b: u32,
    /// Number of lanes.
    #[serde(default = "one")]
    pub links: u32,
}

fn one() -> u32 {
    1
}

impl GpuShape {
    /// Parses and validates a shape.
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
        if self.gpus.len() > 64 {
            return Err(invalid(
                "gpus".into(),
                format!("{} GPUs (accepted: 0..=64)", self.gpus.len()),
            ));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if g.model.trim().is_empty() {
                return Err(invalid(
                    format!("gpus[{i}].model"),
                    "empty (expected e.g. H100-80GB)".into(),
                ));
            }
            if g.memory_mib == 0 {
                return Err(invalid(
                    format!("gpus[{i}].memory_mib"),
                    "0 (expected MiB > 0)".into(),
                ));
            }
            for (k, m) in g.mig.iter().flatten().enumerate() {
                if m.compute_milli == 0 || m.compute_milli > 1000 || m.memory_mib > g.memory_mib {
                    return Err(invalid(
                        format!("gpus[{i}].mig[{k}]"),
                        "compute_milli must be in 1..=1000 and memory_mib at most the GPU's".into(),
                    ));
                }
            }
        }
        let n = self.gpus.len() as u32;
        for (i, l) in self.nvlinks.iter().enumerate() {
            if l.a >= n || l.b >= n || l.a == l.b {
                return Err(invalid(
                    format!("nvlinks[{i}]"),
                    format!(
                        "GPUs {} and {} (accepted: two different indices below {n})",
                        l.a, l.b
                    ),
                ));
            }
        }
        Ok(())
    }

    /// NVLink island of each GPU: connected components of the NVLink graph (all one island
    /// with NVSwitch; `None` for GPUs without NVLink).
    pub fn islands(&self) -> Vec<Option<u32>> {
        let n = self.gpus.len();
        if self.nvswitch {
            return vec![Some(0); n];
        }
        let mut parent: Vec<usize> = (0..n).collect();
        fn find(p: &mut [usize], x: usize) -> usize {
            let mut r = x;
            while p[r] != r {
                r = p[r];
            }
            p[x] = r;
            r
        }
        let mut linked = vec![false; n];
        for l in &self.nvlinks {
            let (a, b) = (l.a as usize, l.b as usize);
            linked[a] = true;
            linked[b] = true;
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            parent[ra.max(rb)] = ra.min(rb);
        }
        let mut ids: Vec<usize> = Vec::new();
        (0..n)
            .map(|g| {
                if !linked[g] {
                    return None;
                }
                let root = find(&mut parent, g);
                let id = ids.iter().position(|&r| r == root).unwrap_or_else(|| {
                    ids.push(root);
                    ids.len() - 1
                });
                Some(id as u32)
            })
            .collect()
    }

    /// A scheduler node of this shape.
    pub fn node(&self, name: &str) -> Node {
        let islands = self.islands();
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| Gpu {
                nvlink_island: islands[i],
                mig: g.mig.as_ref().map(|ms| {
                    ms.iter()
                        .map(|m| MigInstance {
                            profile: m.profile.clone(),
                            memory_mib: m.memory_mib,
                            compute_milli: m.compute_milli,
                        })
                        .collect()
                }),
                ..Gpu::new(name, i as u32, &g.model, g.memory_mib)
            })
            .collect();
        Node {
            gpus,
            ..Node::cpu_node(name, self.cpu_milli, self.memory_mib)
        }
    }
}

/// The repository's `hack/gpus` directory.
pub fn bundled_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/gpus")
}

/// The shapes shipped in `hack/gpus`, compiled in so the binary works away from the repository.
const EMBEDDED: [(&str, &str); 3] = [
    (
        "h100-8x-nvswitch",
        include_str!("../../../../hack/gpus/h100-8x-nvswitch.yaml"),
    ),
    (
        "l40s-4x-pcie",
        include_str!("../../../../hack/gpus/l40s-4x-pcie.yaml"),
    ),
    (
        "a100-8x-mig",
        include_str!("../../../../hack/gpus/a100-8x-mig.yaml"),
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

    #[test]
    fn bundled_shapes_load() {
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
        let node = a100.node("a0");
        assert_eq!(node.gpus[7].mig.as_ref().map(Vec::len), Some(4));
        assert!(node.gpus[6].mig.is_none());
        assert_eq!(node.cpu_milli, 128_000);
    }

    #[test]
    fn bundled_shapes_are_compiled_in() {
        let nowhere = Path::new("/nonexistent");
        let s = load_named(nowhere, "h100-8x-nvswitch").unwrap().unwrap();
        assert_eq!(s.gpus.len(), 8);
        assert!(load_named(nowhere, "nope").is_none());
    }

    #[test]
    fn bad_shapes_name_line_and_field() {
        let text = "name: x\ncpu_milli: 1\nmemory_mib: 1\ngpus:\n  - {model: A, memory_mib: lots, pci_bus_id: p}\n";
        let e = GpuShape::parse("s.yaml", text).unwrap_err().to_string();
        assert!(e.contains("s.yaml: line 5"), "{e}");
        assert!(e.contains("memory_mib"), "{e}");
        let text = "name: x\ncpu_milli: 1\nmemory_mib: 1\ncolour: red\ngpus: []\n";
        let e = GpuShape::parse("s.yaml", text).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("colour"), "{e}");
        let text = "name: x\ncpu_milli: 1\nmemory_mib: 1\nnvlinks: [{a: 0, b: 3}]\n\
                    gpus: [{model: A, memory_mib: 1, pci_bus_id: p}]\n";
        let e = GpuShape::parse("s.yaml", text).unwrap_err().to_string();
        assert!(e.contains("nvlinks[0]"), "{e}");
    }
}
