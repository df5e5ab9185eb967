//! How a pod's GPU limits are enforced: the value of `tessera.dev/isolation`.

use serde::{Deserialize, Serialize};

/// How the node agent enforces a pod's GPU limits.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The agent's watchdog polls the driver's accounting and acts from outside the
    /// process: kill on memory overrun, duty-cycle throttling (the default).
    #[default]
    Watchdog,
    /// An MPS control daemon enforces per-client limits.
    Mps,
    /// A MIG instance isolates the pod in hardware; only GPUs in MIG mode host it.
    Mig,
    /// Nothing is enforced.
    None,
}

/// A `tessera.dev/isolation` value that names no mode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an isolation mode; expected one of watchdog, mps, mig, none")]
pub struct IsolationError {
    /// The value as written, trimmed, and cut after [`IsolationError::SHOWN`] characters so
    /// that an error about a huge value stays small.
    pub value: String,
}

impl IsolationError {
    /// How many characters of the refused value the error keeps.
    pub const SHOWN: usize = 64;

    fn new(text: &str) -> Self {
        let mut value: String = text.chars().take(Self::SHOWN).collect();
        if value.len() < text.len() {
            value.push('…');
        }
        Self { value }
    }
}

impl Isolation {
    /// Every mode, in the order the error message lists them.
    pub const ALL: [Isolation; 4] = [
        Isolation::Watchdog,
        Isolation::Mps,
        Isolation::Mig,
        Isolation::None,
    ];

    /// Parses the annotation value (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Self, IsolationError> {
        let text = text.trim();
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| IsolationError::new(text))
    }

    /// The `tessera.dev/isolation` value naming this mode, which [`Isolation::parse`] reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Watchdog => "watchdog",
            Isolation::Mps => "mps",
            Isolation::Mig => "mig",
            Isolation::None => "none",
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_mode_its_serde_form_agrees_and_errors_name_the_accepted_ones() {
        for mode in Isolation::ALL {
            assert_eq!(Isolation::parse(mode.as_str()), Ok(mode));
            assert_eq!(Isolation::parse(&format!(" {mode} ")), Ok(mode));
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.as_str()));
        }
        let err = Isolation::parse("strict").unwrap_err().to_string();
        assert!(
            err.starts_with("\"strict\" is not") && err.contains("watchdog, mps, mig, none"),
            "{err}"
        );
        let long = "x".repeat(100_000);
        let err = Isolation::parse(&long).unwrap_err();
        assert_eq!(
            err.value.chars().count(),
            IsolationError::SHOWN + 1,
            "cut short"
        );
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any value: a mode whose name is the trimmed value, or an error that names
            /// the accepted modes.
            #[test]
            fn any_value_is_a_mode_or_refused_naming_the_modes(text in "\\PC{0,64}|[ ]?(watchdog|mps|mig|none)[ ]?") {
                match Isolation::parse(&text) {
                    Ok(mode) => prop_assert_eq!(mode.as_str(), text.trim()),
                    Err(e) => prop_assert!(
                        e.to_string().contains("expected one of watchdog, mps, mig, none")
                    ),
                }
            }
        }
    }
}
