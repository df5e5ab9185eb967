//! The memory rule of the watchdog as pure logic: one [`MemoryGuard`] per pod and GPU
//! turns successive readings (used vs limit, at a given instant) into verdicts. Time is
//! an input, so tests drive it with a fake clock.
//!
//! Over the limit → warn at once; still over after the grace period → kill (or, in
//! `warn` mode, keep warning silently). After a kill the pod gets one grace period for
//! the processes to disappear before a new over-limit reading counts as a new offence
//! (a restarted container is warned again before it is killed again).

use std::time::{Duration, Instant};

/// What the watchdog does to a pod that stays over its memory limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MemoryAction {
    /// SIGKILL its processes on that GPU after the grace period.
    #[default]
    Kill,
    /// Only warn (Event and metric); never kill.
    Warn,
}

impl std::str::FromStr for MemoryAction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kill" => Ok(MemoryAction::Kill),
            "warn" => Ok(MemoryAction::Warn),
            other => Err(format!(
                "--memory-action {other:?}: expected `kill` or `warn`"
            )),
        }
    }
}

/// Where a pod stands with its memory limit on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryState {
    /// Within the limit.
    Ok,
    /// Over the limit since `since`.
    Warned {
        /// First reading over the limit.
        since: Instant,
    },
    /// Its processes were killed at `at`.
    Killed {
        /// When.
        at: Instant,
    },
}

/// What to do after one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryVerdict {
    /// Nothing new.
    Nothing,
    /// Just went over the limit: emit the warning Event.
    Warn,
    /// Over the limit for `over_for` (at least the grace period): kill.
    Kill {
        /// How long it had been over.
        over_for: Duration,
    },
    /// Back within the limit after a warning.
    Recovered,
}

/// The memory state machine of one pod on one GPU.
#[derive(Debug, Clone, Copy)]
pub struct MemoryGuard {
    state: MemoryState,
    grace: Duration,
    action: MemoryAction,
}

impl MemoryGuard {
    /// A guard that kills (or only warns) after `grace`.
    pub fn new(grace: Duration, action: MemoryAction) -> Self {
        Self {
            state: MemoryState::Ok,
            grace,
            action,
        }
    }

    /// Where the pod stands now: within the limit, warned since when, or killed when.
    pub fn state(&self) -> MemoryState {
        self.state
    }

    /// Takes one reading: `used_mib` of `limit_mib` at `now`.
    pub fn observe(&mut self, used_mib: u64, limit_mib: u64, now: Instant) -> MemoryVerdict {
        let over = used_mib > limit_mib;
        match (self.state, over) {
            (MemoryState::Ok, false) => MemoryVerdict::Nothing,
            (MemoryState::Ok, true) => {
                self.state = MemoryState::Warned { since: now };
                MemoryVerdict::Warn
            }
            (MemoryState::Warned { .. }, false) => {
                self.state = MemoryState::Ok;
                MemoryVerdict::Recovered
            }
            (MemoryState::Warned { since }, true) => {
                let over_for = now.saturating_duration_since(since);
                if over_for >= self.grace && self.action == MemoryAction::Kill {
                    self.state = MemoryState::Killed { at: now };
                    MemoryVerdict::Kill { over_for }
                } else {
                    MemoryVerdict::Nothing
                }
            }
            // "Killed" stays visible while the pod has no processes here; a
            // restarted container within its limit is simply fine again.
            (MemoryState::Killed { .. }, false) => {
                if used_mib > 0 {
                    self.state = MemoryState::Ok;
                }
                MemoryVerdict::Nothing
            }
            (MemoryState::Killed { at }, true) => {
                // The driver releases a killed process's memory a little after it
                // dies; only a reading one grace period later is a new offence.
                if now.saturating_duration_since(at) >= self.grace {
                    self.state = MemoryState::Warned { since: now };
                    MemoryVerdict::Warn
                } else {
                    MemoryVerdict::Nothing
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(2);
    const TICK: Duration = Duration::from_millis(500);

    /// Feeds `readings` one tick apart from a fake clock; returns the verdicts.
    fn run(action: MemoryAction, readings: &[u64]) -> Vec<MemoryVerdict> {
        let t0 = Instant::now();
        let mut guard = MemoryGuard::new(GRACE, action);
        readings
            .iter()
            .enumerate()
            .map(|(i, used)| guard.observe(*used, 1000, t0 + TICK * i as u32))
            .collect()
    }

    #[test]
    fn warns_at_once_and_kills_after_the_grace_period() {
        use MemoryVerdict::*;
        let v = run(
            MemoryAction::Kill,
            &[900, 1200, 1200, 1200, 1200, 1200, 1200],
        );
        assert_eq!(
            v,
            vec![
                Nothing,
                Warn,
                Nothing,
                Nothing,
                Nothing,
                Kill { over_for: GRACE },
                Nothing
            ]
        );
    }

    #[test]
    fn at_the_limit_is_within_it_and_dipping_below_resets_the_grace() {
        use MemoryVerdict::*;
        let v = run(
            MemoryAction::Kill,
            &[1000, 1001, 1001, 1001, 999, 1001, 1001, 1001, 1001],
        );
        assert_eq!(v[0], Nothing);
        assert_eq!(v[1], Warn);
        assert_eq!(v[4], Recovered);
        assert_eq!(v[5], Warn, "a new offence starts a new grace period");
        assert!(!v.iter().any(|x| matches!(x, Kill { .. })), "{v:?}");
    }

    #[test]
    fn warn_mode_never_kills() {
        let v = run(MemoryAction::Warn, &[2000; 40]);
        assert_eq!(v[0], MemoryVerdict::Warn);
        assert!(v[1..].iter().all(|x| *x == MemoryVerdict::Nothing), "{v:?}");
    }

    #[test]
    fn after_a_kill_lingering_memory_is_forgiven_then_a_relapse_is_warned_again() {
        let t0 = Instant::now();
        let mut g = MemoryGuard::new(GRACE, MemoryAction::Kill);
        assert_eq!(g.observe(2000, 1000, t0), MemoryVerdict::Warn);
        assert!(matches!(
            g.observe(2000, 1000, t0 + GRACE),
            MemoryVerdict::Kill { .. }
        ));
        let killed = g.state();
        // The driver still shows the memory for a moment: no second kill.
        assert_eq!(
            g.observe(2000, 1000, t0 + GRACE + TICK),
            MemoryVerdict::Nothing
        );
        // Gone: "killed" stays visible.
        assert_eq!(
            g.observe(0, 1000, t0 + GRACE + TICK * 2),
            MemoryVerdict::Nothing
        );
        assert_eq!(g.state(), killed);
        // The restarted container goes over again: warned first, killed later.
        assert_eq!(g.observe(1500, 1000, t0 + GRACE * 3), MemoryVerdict::Warn);
        assert_eq!(
            g.observe(100, 1000, t0 + GRACE * 4),
            MemoryVerdict::Recovered
        );
        assert_eq!(g.state(), MemoryState::Ok);
    }

    #[test]
    fn memory_action_parses_with_a_clear_error() {
        assert_eq!("kill".parse(), Ok(MemoryAction::Kill));
        assert_eq!("warn".parse(), Ok(MemoryAction::Warn));
        let err = "maybe".parse::<MemoryAction>().unwrap_err();
        assert_eq!(err, "--memory-action \"maybe\": expected `kill` or `warn`");
    }
}
