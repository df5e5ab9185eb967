//! What enforcement decided, per pod and GPU, for everyone who shows it: the status CLI,
//! the metrics and the occupancy report read the [`EnforcementBoard`] the watchdog
//! publishes after every tick.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use tessera_proto::tessera::v1 as pb;

use crate::ledger::PodRef;
use tessera_contract::Isolation;

/// The enforcement state of one pod on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnforcementState {
    /// Enforced and within its limits.
    Ok,
    /// Over its memory limit; an Event was emitted, a kill follows the grace period
    /// (unless the agent only warns).
    Warned,
    /// Over its compute share on a contended GPU: its processes run `run_percent` of
    /// each throttle period.
    Throttled {
        /// Percent of each period its processes may run.
        run_percent: u32,
    },
    /// Its processes on this GPU were killed for exceeding the memory limit.
    Killed,
    /// Not enforced by the watchdog (isolation `none`, `mps` or `mig`, the pod's
    /// processes cannot be attributed, or the watchdog is off).
    NotEnforced,
}

impl EnforcementState {
    /// The short form `status` prints: `ok`, `warned`, `throttled 30%`, `killed`,
    /// `none` (not enforced).
    pub fn label(self) -> String {
        match self {
            EnforcementState::Ok => "ok".into(),
            EnforcementState::Warned => "warned".into(),
            EnforcementState::Throttled { run_percent } => format!("throttled {run_percent}%"),
            EnforcementState::Killed => "killed".into(),
            EnforcementState::NotEnforced => "none".into(),
        }
    }

    /// The state as reported to the coordinator in occupancy reports (the detail, such as
    /// the run percent, is dropped).
    pub fn to_proto(self) -> pb::EnforcementState {
        match self {
            EnforcementState::Ok => pb::EnforcementState::WithinLimits,
            EnforcementState::Warned => pb::EnforcementState::MemoryWarned,
            EnforcementState::Throttled { .. } => pb::EnforcementState::Throttled,
            EnforcementState::Killed => pb::EnforcementState::MemoryKilled,
            EnforcementState::NotEnforced => pb::EnforcementState::NotEnforced,
        }
    }
}

/// One pod on one GPU as the watchdog last saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodEnforcement {
    /// Namespace and name of the pod, for `status` and Events.
    pub pod: PodRef,
    /// Its UID, which names its cgroups.
    pub pod_uid: String,
    /// UUID of the GPU this entry is about.
    pub gpu_uuid: String,
    /// Its isolation mode.
    pub isolation: Isolation,
    /// What the watchdog last did to or saw of the pod on this GPU.
    pub state: EnforcementState,
    /// Memory limit, MiB.
    pub memory_limit_mib: u64,
    /// Measured memory, MiB.
    pub memory_used_mib: u64,
    /// Compute share, percent of the GPU.
    pub share_percent: u32,
    /// Measured SM utilisation, percent.
    pub used_percent: u32,
    /// Its processes on this GPU.
    pub processes: u32,
}

/// Kinds of enforcement actions, counted for `tessera_agent_enforcement_actions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// A pod went over its memory limit (Event emitted).
    MemoryWarn,
    /// A pod's processes were killed for memory.
    MemoryKill,
    /// A pod started being throttled.
    Throttle,
}

impl Action {
    /// The `action` label value on `tessera_agent_enforcement_actions_total`.
    pub fn label(self) -> &'static str {
        match self {
            Action::MemoryWarn => "memory_warn",
            Action::MemoryKill => "memory_kill",
            Action::Throttle => "throttle",
        }
    }
}

#[derive(Debug, Default)]
struct Board {
    running: bool,
    pods: BTreeMap<(String, String), PodEnforcement>,
    actions: BTreeMap<Action, u64>,
}

/// The shared board: written by the watchdog, read by status, metrics and reports.
#[derive(Debug, Clone, Default)]
pub struct EnforcementBoard {
    inner: Arc<RwLock<Board>>,
}

impl EnforcementBoard {
    /// Replaces the per-pod view (after a tick) and marks the watchdog running.
    pub fn publish(&self, pods: impl IntoIterator<Item = PodEnforcement>) {
        let mut board = self.inner.write();
        board.running = true;
        board.pods = pods
            .into_iter()
            .map(|p| ((p.pod_uid.clone(), p.gpu_uuid.clone()), p))
            .collect();
    }

    /// Marks the watchdog stopped: nothing is enforced any more.
    pub fn clear(&self) {
        let mut board = self.inner.write();
        board.running = false;
        board.pods.clear();
    }

    /// Counts one action.
    pub fn count(&self, action: Action) {
        *self.inner.write().actions.entry(action).or_default() += 1;
    }

    /// Whether a watchdog is publishing.
    pub fn running(&self) -> bool {
        self.inner.read().running
    }

    /// The state of pod `pod_uid` on `gpu_uuid`: [`EnforcementState::NotEnforced`] when
    /// the watchdog does not enforce it (or is not running).
    pub fn state(&self, pod_uid: Option<&str>, gpu_uuid: &str) -> EnforcementState {
        let Some(uid) = pod_uid else {
            return EnforcementState::NotEnforced;
        };
        self.inner
            .read()
            .pods
            .get(&(uid.to_owned(), gpu_uuid.to_owned()))
            .map_or(EnforcementState::NotEnforced, |p| p.state)
    }

    /// Every pod on every GPU, by UID then GPU.
    pub fn pods(&self) -> Vec<PodEnforcement> {
        self.inner.read().pods.values().cloned().collect()
    }

    /// How many of each action so far (every kind listed, zeros included).
    pub fn actions(&self) -> Vec<(Action, u64)> {
        let board = self.inner.read();
        [Action::MemoryWarn, Action::MemoryKill, Action::Throttle]
            .into_iter()
            .map(|a| (a, board.actions.get(&a).copied().unwrap_or(0)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_wire_forms() {
        assert_eq!(
            EnforcementState::Throttled { run_percent: 30 }.label(),
            "throttled 30%"
        );
        assert_eq!(EnforcementState::NotEnforced.label(), "none");
        assert_eq!(
            EnforcementState::Killed.to_proto(),
            pb::EnforcementState::MemoryKilled
        );
    }

    #[test]
    fn board_answers_per_pod_and_gpu() {
        let board = EnforcementBoard::default();
        assert!(!board.running());
        board.publish([PodEnforcement {
            pod: PodRef::new("ml", "a"),
            pod_uid: "u".into(),
            gpu_uuid: "GPU-a".into(),
            isolation: Isolation::Watchdog,
            state: EnforcementState::Warned,
            memory_limit_mib: 1,
            memory_used_mib: 2,
            share_percent: 50,
            used_percent: 10,
            processes: 1,
        }]);
        board.count(Action::MemoryWarn);
        assert!(board.running());
        assert_eq!(board.state(Some("u"), "GPU-a"), EnforcementState::Warned);
        assert_eq!(
            board.state(Some("u"), "GPU-b"),
            EnforcementState::NotEnforced
        );
        assert_eq!(board.state(None, "GPU-a"), EnforcementState::NotEnforced);
        assert_eq!(board.actions()[0], (Action::MemoryWarn, 1));
        board.clear();
        assert!(board.pods().is_empty() && !board.running());
    }
}
