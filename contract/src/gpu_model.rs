//! The key that names a GPU model in a Queue's per-model quotas (`spec.gpu.models[].model`).
//!
//! A GPU's key is its model as the node's agent reports it (NVML's product name, e.g.
//! `NVIDIA H100 80GB HBM3`) with every character a Kubernetes label value cannot hold
//! replaced by `-`, the form NVIDIA's GPU feature discovery writes into the node label
//! `nvidia.com/gpu.product` (`NVIDIA-H100-80GB-HBM3`). The label itself is not read: it
//! is one value per node (the agent reports each GPU), and feature discovery decorates it
//! under sharing and MIG strategies (`…-SHARED`, `…-MIG-1g.10gb`), which would split one
//! model into several keys. Keys compare exactly (case included), as label values do.

/// Longest key: a label value's limit.
pub const MAX_KEY_LEN: usize = 63;

/// The accepted form of a key, as a regular expression (a label value that is not empty).
pub const KEY_PATTERN: &str = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// The accepted form in words, for error messages.
pub const KEY_FORM: &str = "a GPU model as nvidia.com/gpu.product spells it: 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, e.g. NVIDIA-H100-80GB-HBM3";

/// The key of a GPU model name as an agent reports it: characters outside `[A-Za-z0-9_.-]`
/// become `-`, leading and trailing characters that are not letters or digits are dropped,
/// and the result is cut to [`MAX_KEY_LEN`] (then trimmed again). A name of nothing usable
/// gives an empty key, which no Queue can name.
pub fn key_of(model: &str) -> String {
    let mapped: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut = &trimmed[..trimmed.len().min(MAX_KEY_LEN)];
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Whether `key` has the accepted form ([`KEY_PATTERN`]).
pub fn is_valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    !b.is_empty()
        && b.len() <= MAX_KEY_LEN
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nvml_names_become_the_feature_discovery_label_value() {
        for (nvml, key) in [
            ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
            ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
            ("NVIDIA L40S", "NVIDIA-L40S"),
            ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"),
            ("H100-80GB", "H100-80GB"),
            ("  NVIDIA (rev a1) ", "NVIDIA--rev-a1"),
            ("", ""),
            ("***", ""),
        ] {
            assert_eq!(key_of(nvml), key, "{nvml:?}");
        }
        let long = "NVIDIA ".repeat(20);
        let k = key_of(&long);
        assert!(k.len() <= MAX_KEY_LEN && is_valid_key(&k), "{k}");
    }

    #[test]
    fn the_accepted_form_is_a_label_value() {
        for ok in ["NVIDIA-H100-80GB-HBM3", "L40S", "a", "A100_40GB.v2"] {
            assert!(is_valid_key(ok), "{ok}");
        }
        for bad in [
            "",
            "NVIDIA H100",
            "-H100",
            "H100-",
            "nvidia.com/H100",
            &"x".repeat(64),
        ] {
            assert!(!is_valid_key(bad), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn a_key_is_valid_or_empty_and_keys_are_fixed_points(name in "\\PC{0,100}") {
            let k = key_of(&name);
            prop_assert!(k.is_empty() || is_valid_key(&k), "{name:?} -> {k:?}");
            prop_assert_eq!(key_of(&k), k.clone());
        }
    }
}
