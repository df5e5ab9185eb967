//! Usage history: each queue's resource-seconds, decayed with a half-life, and the factor by
//! which it scales the queue's over-quota weight.
//!
//! A queue's record ([`QueueUsage`]) holds `U`, its decayed resource-seconds as of a time
//! `t`. Advancing it to `now` while the queue holds `a` gives
//! `U·d + a·τ·(1−d)` with `d = 2^(−(now−t)/h)` and `τ = h/ln 2` (the mean life): every past
//! second counts one half per half-life `h` since. A queue that held `a` forever reaches
//! `a·τ`, so `r = U / (τ·S)`, with `S` the queue's nominal share (its fair share were every
//! queue to ask for the whole cluster), reads as "the recent average of what the queue held,
//! in multiples of its share". The over-quota weight is multiplied by `2^(−r)`, the classic
//! fair-share factor of Slurm: a queue that held exactly its share weighs half, one that held
//! nothing recently its full weight, so queues that used their shares equally keep the plain
//! split, and a heavy recent user yields the over-quota part to light ones. Deserved quotas
//! are granted before the weights are read, so the history never takes them.
//!
//! With a window `w`, usage is forgotten at every multiple of `w` seconds of logical time (a
//! tumbling window, as a budget period). Pure: the caller passes the records in the snapshot
//! and keeps what the cycle returns.

use serde::{Deserialize, Serialize};

use crate::fairshare::Share;
use crate::model::QueueUsage;

/// A ratio above this weighs as this (the factor is then below 1e-9 anyway).
const MAX_RATIO: f64 = 30.0;

/// Below this an amount is treated as zero.
const EPS: f64 = 1e-9;

/// How usage history weighs in fair share. The default (half-life 0) is off: fair share
/// looks only at the present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageDecay {
    /// Seconds after which a second of use counts half; 0 turns usage history off.
    pub half_life_seconds: u64,
    /// Usage is forgotten at every multiple of this many seconds of logical time; 0 = never.
    pub window_seconds: u64,
}

impl UsageDecay {
    /// Whether usage history is on.
    pub fn is_on(&self) -> bool {
        self.half_life_seconds > 0
    }

    /// The mean life `τ = h / ln 2` in seconds: what one unit held forever adds up to.
    pub fn mean_life(&self) -> f64 {
        self.half_life_seconds as f64 / std::f64::consts::LN_2
    }

    /// The decayed resource-seconds of a queue at `now`, from its last record `prev` (none:
    /// nothing recorded yet, so nothing used), the queue holding what `prev` says it held
    /// since (or `holding_now` where the record does not say). A record from the future (a
    /// clock that went back) is taken as of `now`.
    pub fn advance(&self, prev: Option<&QueueUsage>, holding_now: [f64; 3], now: u64) -> [f64; 3] {
        let Some(prev) = prev.filter(|_| self.is_on()) else {
            return [0.0; 3];
        };
        let rate = prev.holding.unwrap_or(holding_now);
        let mut used = prev.used.map(clean);
        let mut start = prev.at.min(now);
        if self.window_seconds > 0 {
            let window_start = now - now % self.window_seconds;
            if start < window_start {
                used = [0.0; 3];
                start = window_start;
            }
        }
        let elapsed = (now - start) as f64;
        let d = (-elapsed / self.half_life_seconds as f64).exp2();
        let tau = self.mean_life();
        std::array::from_fn(|k| clean(used[k] * d + clean(rate[k]) * tau * (1.0 - d)))
    }

    /// Each queue's over-quota weight factor per resource: `2^(−r)` with `r = used / (τ ×
    /// nominal fair share)` (see the module doc); 1 where the nominal share is zero or the
    /// history is off.
    pub fn weight_factors(&self, used: &[[f64; 3]], nominal: &[Share]) -> Vec<[f64; 3]> {
        let tau = self.mean_life();
        used.iter()
            .zip(nominal)
            .map(|(u, s)| {
                std::array::from_fn(|k| {
                    let share = s.fair[k] * tau;
                    if !self.is_on() || share <= EPS {
                        return 1.0;
                    }
                    (-(u[k] / share).min(MAX_RATIO)).exp2()
                })
            })
            .collect()
    }
}

/// A finite, non-negative amount (anything else reads as nothing).
fn clean(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(at: u64, used: f64, holding: Option<f64>) -> QueueUsage {
        QueueUsage {
            queue: "q".into(),
            at,
            used: [used, 0.0, 0.0],
            holding: holding.map(|h| [h, 0.0, 0.0]),
        }
    }

    const HOUR: UsageDecay = UsageDecay {
        half_life_seconds: 3600,
        window_seconds: 0,
    };

    #[test]
    fn usage_halves_per_half_life_and_accrues_what_is_held() {
        let u = HOUR.advance(Some(&rec(0, 1000.0, Some(0.0))), [0.0; 3], 3600);
        assert!((u[0] - 500.0).abs() < 1e-9, "{u:?}");
        // Holding 1000 milli-GPU for one half-life adds half of what holding it forever would.
        let u = HOUR.advance(Some(&rec(0, 0.0, Some(1000.0))), [0.0; 3], 3600);
        assert!(
            (u[0] - 0.5 * 1000.0 * HOUR.mean_life()).abs() < 1e-6,
            "{u:?}"
        );
        // Without a recorded holding, the snapshot's counts.
        let u = HOUR.advance(Some(&rec(0, 0.0, None)), [1000.0, 0.0, 0.0], 3600);
        assert!(
            (u[0] - 0.5 * 1000.0 * HOUR.mean_life()).abs() < 1e-6,
            "{u:?}"
        );
    }

    #[test]
    fn a_window_forgets_at_its_boundary_and_off_means_nothing_accrues() {
        let w = UsageDecay {
            window_seconds: 1000,
            ..HOUR
        };
        let u = w.advance(Some(&rec(900, 5e6, Some(0.0))), [0.0; 3], 1100);
        assert_eq!(u, [0.0; 3]);
        let u = w.advance(Some(&rec(900, 5e6, Some(0.0))), [0.0; 3], 999);
        assert!(u[0] > 0.0);
        let off = UsageDecay::default();
        assert_eq!(
            off.advance(Some(&rec(0, 5.0, Some(9.0))), [9.0; 3], 100),
            [0.0; 3]
        );
        assert_eq!(HOUR.advance(None, [9.0; 3], 100), [0.0; 3]);
        // A record from the future, or garbage, advances nothing and breaks nothing.
        let u = HOUR.advance(Some(&rec(500, 7.0, Some(1.0))), [0.0; 3], 100);
        assert_eq!(u[0], 7.0);
        let u = HOUR.advance(Some(&rec(0, f64::NAN, Some(-1.0))), [0.0; 3], 100);
        assert_eq!(u, [0.0; 3]);
    }

    #[test]
    fn the_factor_is_one_half_at_the_share_and_one_without_history() {
        let nominal = Share {
            fair: [4000.0, 0.0, 0.0],
            ..Share::default()
        };
        let at_share = [4000.0 * HOUR.mean_life(), 5.0, 0.0];
        let f = HOUR.weight_factors(&[at_share, [0.0; 3]], &[nominal, nominal]);
        assert!((f[0][0] - 0.5).abs() < 1e-12, "{f:?}");
        assert_eq!(f[0][1], 1.0, "no nominal share: no factor");
        assert_eq!(f[1], [1.0; 3]);
    }
}
