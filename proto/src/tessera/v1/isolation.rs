//! The wire form of the contract's isolation modes (`tessera_contract::Isolation`): the
//! one mapping, kept beside the generated enum so every mode has a wire value.

use tessera_contract::Isolation;

use super::Isolation as Wire;

impl From<Isolation> for Wire {
    fn from(mode: Isolation) -> Self {
        match mode {
            Isolation::Watchdog => Wire::Watchdog,
            Isolation::Mps => Wire::Mps,
            Isolation::Mig => Wire::Mig,
            Isolation::None => Wire::None,
        }
    }
}
