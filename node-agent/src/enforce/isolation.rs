//! How a pod's GPU limits are enforced: the `tessera.dev/isolation` annotation.

use serde::{Deserialize, Serialize};
use tessera_proto::tessera::v1 as pb;

/// The pod annotation naming the isolation mode.
pub const ISOLATION_ANNOTATION: &str = "tessera.dev/isolation";

/// How a pod's limits are enforced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The agent's watchdog polls the driver's accounting and acts from outside the
    /// process (the default).
    #[default]
    Watchdog,
    /// An MPS control daemon enforces per-client limits.
    Mps,
    /// A MIG instance isolates the pod in hardware.
    Mig,
    /// Nothing is enforced.
    None,
}

impl Isolation {
    /// Parses the annotation value.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "watchdog" => Ok(Isolation::Watchdog),
            "mps" => Ok(Isolation::Mps),
            "mig" => Ok(Isolation::Mig),
            "none" => Ok(Isolation::None),
            other => Err(format!(
                "{ISOLATION_ANNOTATION}: {other:?} is not an isolation mode; expected one of watchdog, mps, mig, none"
            )),
        }
    }

    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Watchdog => "watchdog",
            Isolation::Mps => "mps",
            Isolation::Mig => "mig",
            Isolation::None => "none",
        }
    }

    /// The wire form.
    pub fn to_proto(self) -> pb::Isolation {
        match self {
            Isolation::Watchdog => pb::Isolation::Watchdog,
            Isolation::Mps => pb::Isolation::Mps,
            Isolation::Mig => pb::Isolation::Mig,
            Isolation::None => pb::Isolation::None,
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
    fn parses_every_mode_and_names_the_accepted_ones() {
        for mode in [
            Isolation::Watchdog,
            Isolation::Mps,
            Isolation::Mig,
            Isolation::None,
        ] {
            assert_eq!(Isolation::parse(mode.as_str()), Ok(mode));
        }
        let err = Isolation::parse("strict").unwrap_err();
        assert!(
            err.starts_with(ISOLATION_ANNOTATION) && err.contains("watchdog, mps, mig, none"),
            "{err}"
        );
    }
}
