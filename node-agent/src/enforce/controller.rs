//! The compute rule of the watchdog as pure logic: when a GPU is contended, what share
//! each pod should get ([`targets`]), and the feedback controller that turns a pod's
//! measured share into the fraction of each throttle period its processes may run
//! ([`PiController`]).
//!
//! # Why this controller is stable
//!
//! Per watchdog tick the plant is, to first order, `measured = D · duty` delayed by one
//! tick (what we measure over a tick is the effect of the duty chosen at its start),
//! where `D ≤ 1` is the pod's unthrottled demand as a fraction of the GPU. With the PI
//! law `I_k = I_{k-1} + ki·e_k`, `duty_k = I_k + kp·e_k`, `e_k = target − measured_k`,
//! the closed loop's characteristic polynomial is
//! `z² + (D(kp + ki) − 1)·z − D·kp`. Jury's conditions give stability exactly when
//! `D·ki > 0`, `D·(2kp + ki) < 2` and `D·kp < 1`. With `kp = 0.2`, `ki = 0.4` the
//! middle one holds for any `D < 2.5`, so every possible demand (`0 < D ≤ 1`) is stable
//! with a wide margin; at `D = 1` the poles are 0.69 and −0.29 (settles in a few ticks,
//! barely oscillates), and smaller demands only converge more slowly.
//!
//! Anti-windup: the integrator is clamped to the actuator's range `[min_duty, 1]`, so
//! a pod that cannot reach its target even when never stopped (or that idles) does not
//! wind the integrator up and overshoot when its load comes back. The loop starts from
//! a feed-forward guess (`target / demand`), so a new throttle lands near the target on
//! its first period.

/// Tuning of the compute controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PiGains {
    /// Proportional gain (duty per unit of share error).
    pub kp: f64,
    /// Integral gain per tick.
    pub ki: f64,
    /// The smallest duty a throttled pod gets, so its processes always make progress
    /// (and keep answering liveness probes).
    pub min_duty: f64,
}

impl Default for PiGains {
    fn default() -> Self {
        Self {
            kp: 0.2,
            ki: 0.4,
            min_duty: 0.05,
        }
    }
}

/// One pod on a contended GPU, in percent of the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// Its compute share.
    pub share: f64,
    /// What it would use if never throttled.
    pub demand: f64,
}

/// What each claim should get out of `capacity` percent: water-filling by share, so a
/// pod that wants less than its fair part keeps all it wants and the rest is split
/// among the others in proportion to their shares (work-conserving). Every target is
/// at most the claim's demand and at least `min(demand, share)` whenever the shares fit
/// in the capacity.
pub fn targets(capacity: f64, claims: &[Claim]) -> Vec<f64> {
    let mut out = vec![f64::NAN; claims.len()];
    let mut left = capacity.max(0.0);
    loop {
        let open: Vec<usize> = (0..claims.len()).filter(|&i| out[i].is_nan()).collect();
        if open.is_empty() {
            break;
        }
        let weights: f64 = open.iter().map(|&i| claims[i].share.max(0.0)).sum();
        let fair = |i: usize| {
            if weights > 0.0 {
                left * claims[i].share.max(0.0) / weights
            } else {
                left / open.len() as f64
            }
        };
        let satisfied: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| claims[i].demand <= fair(i))
            .collect();
        if satisfied.is_empty() {
            for &i in &open {
                out[i] = fair(i);
            }
            break;
        }
        for i in satisfied {
            out[i] = claims[i].demand.max(0.0);
            left -= out[i];
        }
        left = left.max(0.0);
    }
    out
}

/// Whether the GPU is contended: the demands add up to more than the whole GPU.
pub fn contended(total_demand: f64) -> bool {
    total_demand > 100.0
}

/// The feedback controller of one throttled pod on one GPU. Shares are fractions of
/// the GPU (0..=1); the output is the fraction of each throttle period its processes
/// run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PiController {
    gains: PiGains,
    integral: f64,
    duty: f64,
}

impl PiController {
    /// Starts throttling a pod with `demand` toward `target`, from the feed-forward
    /// duty `target / demand`.
    pub fn start(gains: PiGains, target: f64, demand: f64) -> Self {
        let guess = if demand > 0.0 { target / demand } else { 1.0 };
        let duty = guess.clamp(gains.min_duty, 1.0);
        Self {
            gains,
            integral: duty,
            duty,
        }
    }

    /// The duty in force.
    pub fn duty(&self) -> f64 {
        self.duty
    }

    /// One tick: `measured` over the last tick against `target`; returns the new duty.
    pub fn update(&mut self, target: f64, measured: f64) -> f64 {
        let g = self.gains;
        let error = target - measured;
        // Clamping the integrator to what the actuator can do is the anti-windup.
        self.integral = (self.integral + g.ki * error).clamp(g.min_duty, 1.0);
        self.duty = (self.integral + g.kp * error).clamp(g.min_duty, 1.0);
        self.duty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn water_filling_gives_shares_and_redistributes_slack() {
        let t = targets(
            100.0,
            &[
                Claim {
                    share: 70.0,
                    demand: 100.0,
                },
                Claim {
                    share: 30.0,
                    demand: 100.0,
                },
            ],
        );
        assert!(close(t[0], 70.0) && close(t[1], 30.0), "{t:?}");
        // A pod using less than its share keeps it all; the rest goes to the others.
        let t = targets(
            100.0,
            &[
                Claim {
                    share: 50.0,
                    demand: 10.0,
                },
                Claim {
                    share: 25.0,
                    demand: 100.0,
                },
                Claim {
                    share: 25.0,
                    demand: 100.0,
                },
            ],
        );
        assert!(
            close(t[0], 10.0) && close(t[1], 45.0) && close(t[2], 45.0),
            "{t:?}"
        );
        // Capacity taken by processes that cannot be throttled is shared out by share.
        let t = targets(
            50.0,
            &[
                Claim {
                    share: 60.0,
                    demand: 100.0,
                },
                Claim {
                    share: 20.0,
                    demand: 100.0,
                },
            ],
        );
        assert!(close(t[0], 37.5) && close(t[1], 12.5), "{t:?}");
        assert!(targets(100.0, &[]).is_empty());
        assert!(contended(100.5) && !contended(100.0));
    }

    /// The plant of the stability argument: measured = demand · duty, one tick late.
    fn simulate(demand: f64, target: f64, ticks: usize) -> Vec<f64> {
        let mut c = PiController::start(PiGains::default(), target, demand * 0.5);
        let mut duty = c.duty();
        (0..ticks)
            .map(|_| {
                let measured = demand * duty;
                duty = c.update(target, measured);
                measured
            })
            .collect()
    }

    #[test]
    fn converges_to_the_target_for_any_demand() {
        for demand in [1.0, 0.8, 0.5, 0.35] {
            let m = simulate(demand, 0.3, 40);
            let last = *m.last().unwrap();
            assert!((last - 0.3).abs() < 0.005, "demand {demand}: {m:?}");
            // Well damped: starting from a feed-forward guess twice too high, the error
            // shrinks tick after tick instead of swinging around the target.
            let errors: Vec<f64> = m.iter().map(|x| (x - 0.3).abs()).collect();
            assert!(
                errors.windows(2).all(|w| w[1] <= w[0] + 0.005),
                "demand {demand}: {m:?}"
            );
        }
    }

    #[test]
    fn a_pod_that_cannot_reach_its_target_does_not_wind_up() {
        let gains = PiGains::default();
        let mut c = PiController::start(gains, 0.7, 1.0);
        // It idles (measures nothing) for a long time: duty saturates at 1, no further.
        for _ in 0..100 {
            c.update(0.7, 0.0);
        }
        assert!(close(c.duty(), 1.0));
        // Load returns at full demand: within a few ticks it is back near the target,
        // instead of spending many ticks unwinding a huge integral.
        let mut duty = c.duty();
        let mut seen = Vec::new();
        for _ in 0..8 {
            let measured = duty;
            duty = c.update(0.7, measured);
            seen.push(measured);
        }
        assert!((seen[7] - 0.7).abs() < 0.02, "{seen:?}");
    }

    #[test]
    fn duty_never_leaves_its_range() {
        let gains = PiGains::default();
        let mut c = PiController::start(gains, 0.01, 1.0);
        assert!(close(c.duty(), gains.min_duty));
        for _ in 0..50 {
            let d = c.update(0.01, 1.0);
            assert!((gains.min_duty..=1.0).contains(&d));
        }
        assert!(close(PiController::start(gains, 0.5, 0.0).duty(), 1.0));
    }
}
