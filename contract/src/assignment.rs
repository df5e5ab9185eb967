//! The `tessera.dev/assignment` annotation: per container, the GPUs the coordinator chose
//! and the memory / compute share on each. The coordinator writes it with the Binding (and
//! streams it to the node's agent); the agent answers the kubelet's Allocate from it.

use serde::{Deserialize, Serialize};

/// One GPU (or a share of one) given to a container.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuSlice {
    /// Device UUID (`GPU-…`, or `MIG-…` for a MIG instance).
    pub uuid: String,
    /// Memory limit on this GPU in MiB.
    pub memory_mib: u64,
    /// Compute share on this GPU in milli-GPU (1..=1000; 1000 = whole).
    pub compute_milli: u32,
}

/// The GPUs of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAssignment {
    /// Container name.
    pub container: String,
    /// Its GPUs with memory and compute share.
    pub gpus: Vec<GpuSlice>,
}

/// The exact GPU assignment of a pod: the value of `tessera.dev/assignment`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Per container, in the device manager's allocation order.
    pub containers: Vec<ContainerAssignment>,
}

/// The accepted form, quoted in every parse error.
const FORM: &str = r#"{"containers":[{"container":NAME,"gpus":[{"uuid":UUID,"memory_mib":N,"compute_milli":1..1000}]}]}"#;

/// An assignment annotation neither side may act on. The message leaves out the
/// annotation's name, which the caller puts before it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    /// Not JSON of the accepted form.
    #[error("{message}; expected {FORM}")]
    Json {
        /// The JSON parser's complaint.
        message: String,
    },
    /// A compute share that no GPU can give.
    #[error(
        "container {container:?} GPU {uuid}: compute_milli {compute_milli} is outside 1..=1000"
    )]
    ComputeShare {
        /// Name of the container whose entry carries the share.
        container: String,
        /// UUID of the GPU the share is for.
        uuid: String,
        /// The share as written.
        compute_milli: u32,
    },
}

impl Assignment {
    /// All GPU slices of all containers.
    pub fn slices(&self) -> impl Iterator<Item = &GpuSlice> {
        self.containers.iter().flat_map(|c| c.gpus.iter())
    }

    /// The annotation text (compact JSON).
    pub fn to_json(&self) -> String {
        // Serialising plain strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses the annotation text and checks what the agent relies on (every compute share
    /// in 1..=1000).
    pub fn from_json(text: &str) -> Result<Assignment, AssignmentError> {
        let a: Assignment = serde_json::from_str(text).map_err(|e| AssignmentError::Json {
            message: e.to_string(),
        })?;
        for c in &a.containers {
            for g in &c.gpus {
                if !(1..=1000).contains(&g.compute_milli) {
                    return Err(AssignmentError::ComputeShare {
                        container: c.container.clone(),
                        uuid: g.uuid.clone(),
                        compute_milli: g.compute_milli,
                    });
                }
            }
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_the_written_form() {
        let text = r#"{"containers":[{"container":"main","gpus":[{"uuid":"GPU-a","memory_mib":20480,"compute_milli":500}]}]}"#;
        let a = Assignment::from_json(text).unwrap();
        assert_eq!(a.containers[0].gpus[0].compute_milli, 500);
        assert_eq!(a.slices().count(), 1);
        assert_eq!(a.to_json(), text);
    }

    #[test]
    fn errors_name_the_annotation_and_the_accepted_form() {
        let err = Assignment::from_json("{}x").unwrap_err().to_string();
        assert!(err.contains("expected {\"containers\""), "{err}");
        for share in [0, 1500] {
            let text = format!(
                r#"{{"containers":[{{"container":"c","gpus":[{{"uuid":"GPU-a","memory_mib":1,"compute_milli":{share}}}]}}]}}"#
            );
            let err = Assignment::from_json(&text).unwrap_err().to_string();
            assert!(
                err.contains(&format!("compute_milli {share} is outside 1..=1000")),
                "{err}"
            );
        }
    }
}
