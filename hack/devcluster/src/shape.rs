//! Reading the simulated GPU shape files of `hack/gpus/` (format in `hack/gpus/README.md`)
//! into the capacity a hollow node advertises.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::config::GpuShape;

/// The node-level view of a shape file: GPUs not in MIG mode count as `nvidia.com/gpu`, MIG
/// instances as `nvidia.com/mig-<profile>`; model and memory come from the first GPU.
///
/// Read loosely (as a YAML tree, accepting `memoryMiB` or `memory_mib`, and `mig` as a list of
/// instances or as `{instances: [...]}`) so the hollow node keeps working while the shared
/// format evolves; only the fields needed for capacity are read.
pub fn load(path: &Path) -> Result<GpuShape, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let doc: Value = serde_yaml_ng::from_str(&text).map_err(|e| format!("invalid YAML: {e}"))?;
    let gpus = doc
        .get("gpus")
        .and_then(Value::as_array)
        .filter(|g| !g.is_empty())
        .ok_or("gpus must list at least one GPU")?;
    let memory = |gpu: &Value| {
        gpu.get("memoryMiB")
            .or_else(|| gpu.get("memory_mib"))
            .and_then(Value::as_u64)
    };
    let mut mig: BTreeMap<String, u32> = BTreeMap::new();
    let mut whole = 0;
    for (i, gpu) in gpus.iter().enumerate() {
        memory(gpu).ok_or_else(|| format!("gpus[{i}]: memoryMiB (or memory_mib) is required"))?;
        let instances = match gpu.get("mig") {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => Some(list.clone()),
            Some(other) => Some(
                other
                    .get("instances")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            ),
        };
        match instances {
            Some(list) => {
                for instance in &list {
                    let profile = instance
                        .get("profile")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("gpus[{i}].mig: every instance needs a profile"))?;
                    *mig.entry(profile.to_string()).or_default() += 1;
                }
            }
            None => whole += 1,
        }
    }
    let first = &gpus[0];
    Ok(GpuShape {
        count: whole,
        model: first
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string(),
        memory_mib: memory(first).unwrap_or(0),
        mig,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shared_shapes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpus");
        let h100 = load(&dir.join("h100-8x-nvswitch.yaml")).unwrap();
        assert_eq!(h100.count, 8);
        assert!(h100.memory_mib > 0);
        assert!(h100.mig.is_empty());
        let a100 = load(&dir.join("a100-8x-mig.yaml")).unwrap();
        assert_eq!(a100.count, 7);
        assert!(!a100.mig.is_empty());
    }
}
