//! The `tessera.dev/assignment` annotation: per container, the GPUs the coordinator chose
//! and the memory / compute share on each. The coordinator writes it with the Binding (and
//! streams it to the node's agent); the agent answers the kubelet's Allocate from it.

use serde::{Deserialize, Serialize};

/// One GPU (or a share of one) given to a container.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuSlice {
    /// Device UUID (`GPU-…`, or `MIG-…` for a MIG instance).
    pub uuid: String,
    /// Memory limit on this GPU in MiB (0..=[`MAX_MEMORY_MIB`]).
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

/// The largest memory limit one GPU slice may carry: 16 TiB in MiB, far above any GPU
/// made, and low enough that adding up every slice a node can hold never overflows a `u64`.
pub const MAX_MEMORY_MIB: u64 = 16 * 1024 * 1024;

/// The accepted form, quoted in every parse error.
const FORM: &str = r#"{"containers":[{"container":NAME,"gpus":[{"uuid":UUID,"memory_mib":0..=16777216,"compute_milli":1..=1000}]}]}"#;

/// An assignment annotation neither side may act on. The message leaves out the
/// annotation's name, which the caller puts before it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentError {
    /// Not JSON of the accepted form.
    #[error("{message}; expected {FORM}")]
    Json {
        /// The JSON parser's complaint, after the path of the field it is about
        /// (`containers[0].gpus[0].memory_mib: invalid value: …`) when there is one.
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
    /// A memory limit larger than any GPU.
    #[error(
        "container {container:?} GPU {uuid}: memory_mib {memory_mib} is outside 0..={MAX_MEMORY_MIB} (at most 16 TiB per GPU, in MiB)"
    )]
    Memory {
        /// Name of the container whose entry carries the limit.
        container: String,
        /// UUID of the GPU the limit is for.
        uuid: String,
        /// The limit as written.
        memory_mib: u64,
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

    /// Parses the annotation text and checks what the agent relies on: every compute share
    /// in 1..=1000 and every memory limit in 0..=[`MAX_MEMORY_MIB`], so sums over a node's
    /// slices stay far from overflow. Numbers that are not unsigned integers of their
    /// type (negative, fractional, too large) are refused by the JSON reader with the field.
    pub fn from_json(text: &str) -> Result<Assignment, AssignmentError> {
        let json = |message: String| AssignmentError::Json { message };
        let mut reader = serde_json::Deserializer::from_str(text);
        let a: Assignment =
            serde_path_to_error::deserialize(&mut reader).map_err(|e| json(e.to_string()))?;
        reader.end().map_err(|e| json(e.to_string()))?;
        for c in &a.containers {
            for g in &c.gpus {
                if !(1..=1000).contains(&g.compute_milli) {
                    return Err(AssignmentError::ComputeShare {
                        container: c.container.clone(),
                        uuid: g.uuid.clone(),
                        compute_milli: g.compute_milli,
                    });
                }
                if g.memory_mib > MAX_MEMORY_MIB {
                    return Err(AssignmentError::Memory {
                        container: c.container.clone(),
                        uuid: g.uuid.clone(),
                        memory_mib: g.memory_mib,
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

    #[test]
    fn memory_beyond_any_gpu_is_refused_naming_the_field_and_the_bound() {
        let text = |mib: &str| {
            format!(
                r#"{{"containers":[{{"container":"c","gpus":[{{"uuid":"GPU-a","memory_mib":{mib},"compute_milli":500}}]}}]}}"#
            )
        };
        assert!(Assignment::from_json(&text(&MAX_MEMORY_MIB.to_string())).is_ok());
        let err = Assignment::from_json(&text(&u64::MAX.to_string()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory_mib 18446744073709551615 is outside 0..=16777216")
                && err.contains("16 TiB"),
            "{err}"
        );
        // Not an unsigned integer: the reader names the field's type and the accepted form.
        for bad in ["-1", "1.5", "18446744073709551616"] {
            let err = Assignment::from_json(&text(bad)).unwrap_err().to_string();
            assert!(err.contains("expected {\"containers\""), "{bad}: {err}");
        }
    }

    mod fuzz {
        //! Any text, and JSON of the right shape with any numbers in it: never a panic,
        //! and either an assignment within range or an error naming the field.

        use super::*;
        use proptest::prelude::*;

        /// A JSON number or something else where a number belongs.
        fn number() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u64..=2000).prop_map(|n| n.to_string()),
                any::<u64>().prop_map(|n| n.to_string()),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<f64>().prop_map(|f| format!("{f:?}")),
                Just("18446744073709551616".to_owned()),
                Just("1e400".to_owned()),
                Just("null".to_owned()),
                Just("\"500\"".to_owned()),
                (MAX_MEMORY_MIB - 2..MAX_MEMORY_MIB + 2).prop_map(|n| n.to_string()),
            ]
        }

        fn slice() -> impl Strategy<Value = String> {
            ("[ -~]{0,12}", number(), number()).prop_map(|(uuid, mib, milli)| {
                format!(
                    r#"{{"uuid":{},"memory_mib":{mib},"compute_milli":{milli}}}"#,
                    serde_json::Value::String(uuid)
                )
            })
        }

        fn assignment() -> impl Strategy<Value = String> {
            prop::collection::vec(("[ -~]{0,8}", prop::collection::vec(slice(), 0..4)), 0..4)
                .prop_map(|containers| {
                    let containers: Vec<String> = containers
                        .into_iter()
                        .map(|(name, gpus)| {
                            format!(
                                r#"{{"container":{},"gpus":[{}]}}"#,
                                serde_json::Value::String(name),
                                gpus.join(",")
                            )
                        })
                        .collect();
                    format!(r#"{{"containers":[{}]}}"#, containers.join(","))
                })
        }

        fn within_range(a: &Assignment) -> bool {
            a.slices()
                .all(|g| (1..=1000).contains(&g.compute_milli) && g.memory_mib <= MAX_MEMORY_MIB)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn any_text_is_read_or_refused(text in "\\PC{0,200}") {
                if let Ok(a) = Assignment::from_json(&text) {
                    prop_assert!(within_range(&a));
                }
            }

            #[test]
            fn numbers_are_range_checked_and_refusals_name_the_field(text in assignment()) {
                match Assignment::from_json(&text) {
                    Ok(a) => prop_assert!(within_range(&a), "{text}"),
                    Err(AssignmentError::Json { message }) => {
                        // The path names the field whose value was refused.
                        prop_assert!(
                            message.contains("memory_mib") || message.contains("compute_milli"),
                            "{text}: {message}"
                        );
                    }
                    Err(AssignmentError::ComputeShare { compute_milli, .. }) => {
                        prop_assert!(!(1..=1000).contains(&compute_milli));
                    }
                    Err(AssignmentError::Memory { memory_mib, .. }) => {
                        prop_assert!(memory_mib > MAX_MEMORY_MIB);
                    }
                }
            }
        }
    }
}
