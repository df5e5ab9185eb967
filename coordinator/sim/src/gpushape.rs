//! Scheduler nodes from GPU server shapes. The format and its one reader live in
//! `tessera-gpushape` (shared with the node agent's simulated backend); this module only
//! turns a parsed shape into the model's [`Node`].

use tessera_gpushape::{GpuShape, YamlError};

use tessera_core::model::{Gpu, MigInstance, Node};

/// A scheduler node named `name` of shape `shape` (read from `file`, which errors name).
/// Fails when the shape lacks the node's CPU or memory, which the agent does not need but
/// the simulator does.
pub fn node(shape: &GpuShape, file: &str, name: &str) -> Result<Node, YamlError> {
    let (cpu_milli, memory_mib) = shape.node_resources(file)?;
    let islands = shape.islands();
    let mut gpus = Vec::with_capacity(shape.gpus.len());
    for (i, g) in shape.gpus.iter().enumerate() {
        let mig = match &g.mig {
            None => None,
            Some(instances) => {
                let mut out = Vec::with_capacity(instances.len());
                for (k, m) in instances.iter().enumerate() {
                    let compute_milli = m.compute_milli.ok_or_else(|| YamlError::Invalid {
                        file: file.to_string(),
                        field: format!("gpus[{i}].mig[{k}].compute_milli"),
                        message: "missing (the simulator needs the instance's share of the \
                                  GPU's compute in milli-GPU, e.g. 428 for 3 of 7 slices)"
                            .into(),
                    })?;
                    out.push(MigInstance {
                        profile: m.profile.clone(),
                        memory_mib: m.memory_mib,
                        compute_milli,
                    });
                }
                Some(out)
            }
        };
        gpus.push(Gpu {
            nvlink_island: islands[i],
            mig,
            ..Gpu::new(name, i as u32, &g.model, g.memory_mib)
        });
    }
    Ok(Node {
        gpus,
        ..Node::cpu_node(name, cpu_milli, memory_mib)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpushape::bundled_dir;

    #[test]
    fn a_shape_becomes_a_node_with_its_islands_and_mig() {
        let a100 = GpuShape::load(&bundled_dir().join("a100-8x-mig.yaml")).unwrap();
        let n = node(&a100, "a100-8x-mig.yaml", "a0").unwrap();
        assert_eq!(n.gpus[7].mig.as_ref().map(Vec::len), Some(4));
        assert!(n.gpus[6].mig.is_none());
        assert_eq!(n.gpus[0].nvlink_island, n.gpus[1].nvlink_island);
        assert_eq!(n.cpu_milli, 128_000);
    }

    #[test]
    fn a_shape_without_node_resources_is_refused_by_name() {
        let s = GpuShape::parse("s.yaml", "memory_mib: 1\ngpus: []").unwrap();
        let e = node(&s, "s.yaml", "n").unwrap_err().to_string();
        assert!(e.starts_with("s.yaml: cpu_milli: missing"), "{e}");
        let s = GpuShape::parse(
            "s.yaml",
            "cpu_milli: 1\nmemory_mib: 1\ngpus: [{model: A, memory_mib: 8, mig: [{profile: 1g.1gb, memory_mib: 1}]}]",
        )
        .unwrap();
        let e = node(&s, "s.yaml", "n").unwrap_err().to_string();
        assert!(
            e.starts_with("s.yaml: gpus[0].mig[0].compute_milli: missing"),
            "{e}"
        );
    }
}
