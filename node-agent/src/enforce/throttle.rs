//! Duty-cycling: a dedicated thread that, every period (50 ms by default), lets each
//! throttled group of processes run for its duty fraction of the period, in its own
//! window, and keeps it stopped (SIGSTOP) for the rest (SIGCONT when its window opens).
//!
//! The thread has its own fast timer because the watchdog's tick (500 ms) is far too
//! coarse for this: a process stopped for hundreds of milliseconds at a time would
//! stall its collectives and probes, while 50 ms periods keep the pauses short.
//!
//! Every process the thread stopped is resumed when its group leaves the plan (within
//! one period), when the throttler stops, and when the thread unwinds from a panic:
//! the set of stopped PIDs lives in a guard whose `Drop` sends SIGCONT to all of them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::signals::{Signal, Signaller};

/// One throttled group: the processes of one pod on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleGroup {
    /// Its processes.
    pub pids: Vec<u32>,
    /// Fraction of each period they may run, in `(0, 1]`; 1 means not throttled.
    pub duty: f64,
    /// Where in the period their run window starts, as a fraction of the period.
    /// Throttled pods of one GPU get consecutive windows, so they take turns instead
    /// of all running at the start of each period (on a GPU they would queue behind
    /// each other anyway; taking turns keeps each pod's measured share its own).
    pub offset: f64,
}

/// The throttle plan, keyed by a group name (`<pod uid>/<gpu uuid>`).
pub type ThrottlePlan = BTreeMap<String, ThrottleGroup>;

#[derive(Debug, Default)]
struct Control {
    plan: ThrottlePlan,
    stop: bool,
}

struct Shared {
    control: Mutex<Control>,
    wake: Condvar,
}

/// The duty-cycling thread.
pub struct Throttler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Throttler {
    /// Starts the thread with `period`, signalling through `signals`.
    pub fn start(period: Duration, signals: Arc<dyn Signaller>) -> Self {
        let shared = Arc::new(Shared {
            control: Mutex::new(Control::default()),
            wake: Condvar::new(),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("tessera-throttle".into())
                .spawn(move || run(&shared, period, signals))
        };
        let thread = match thread {
            Ok(t) => Some(t),
            Err(error) => {
                // Without the thread nothing is ever stopped, which is safe: pods
                // just are not throttled.
                tracing::error!(%error, "cannot start the throttle thread; compute shares are not enforced");
                None
            }
        };
        Self { shared, thread }
    }

    /// Replaces the plan; groups that left it are resumed within one period.
    pub fn set(&self, plan: ThrottlePlan) {
        self.shared.control.lock().plan = plan;
    }

    /// Stops the thread; every process it stopped is resumed before this returns.
    pub fn stop(&mut self) {
        self.shared.control.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Throttler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The PIDs this thread holds stopped; all resumed on drop (normal exit or unwinding).
struct Stopped {
    pids: BTreeSet<u32>,
    signals: Arc<dyn Signaller>,
}

impl Stopped {
    fn resume_all(&mut self) {
        for pid in std::mem::take(&mut self.pids) {
            if let Err(error) = self.signals.send(pid, Signal::Cont) {
                tracing::warn!(pid, %error, "cannot resume a throttled process");
            }
        }
    }

    fn resume(&mut self, pid: u32) {
        if self.pids.remove(&pid)
            && let Err(error) = self.signals.send(pid, Signal::Cont)
        {
            tracing::warn!(pid, %error, "cannot resume a throttled process");
        }
    }

    fn stop(&mut self, pid: u32) {
        if self.pids.contains(&pid) {
            return;
        }
        match self.signals.send(pid, Signal::Stop) {
            Ok(()) => {
                self.pids.insert(pid);
            }
            Err(error) => tracing::debug!(pid, %error, "cannot pause a throttled process"),
        }
    }

    /// Runs (`run`) or stops `pids`, signalling only those whose state changes.
    fn set(&mut self, pids: &[u32], run: bool) {
        for &pid in pids {
            if run {
                self.resume(pid);
            } else {
                self.stop(pid);
            }
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.resume_all();
    }
}

fn run(shared: &Shared, period: Duration, signals: Arc<dyn Signaller>) {
    let mut stopped = Stopped {
        pids: BTreeSet::new(),
        signals,
    };
    loop {
        let start = Instant::now();
        let groups: Vec<ThrottleGroup> = {
            let control = shared.control.lock();
            if control.stop {
                break;
            }
            control
                .plan
                .values()
                .filter(|g| g.duty < 1.0 && !g.pids.is_empty())
                .cloned()
                .collect()
        };
        // Whoever left the plan runs again for good.
        let planned: BTreeSet<u32> = groups.iter().flat_map(|g| g.pids.iter().copied()).collect();
        let gone: Vec<u32> = stopped.pids.difference(&planned).copied().collect();
        for pid in gone {
            stopped.resume(pid);
        }
        // Each group runs in its window [offset, offset + duty) of the period
        // (wrapping around its end): set the state at the start, then switch at the
        // window's edges.
        let mut switches: Vec<(f64, bool, &[u32])> = Vec::new();
        for g in &groups {
            let (offset, duty) = (g.offset.rem_euclid(1.0), g.duty.clamp(0.0, 1.0));
            let end = (offset + duty).rem_euclid(1.0);
            let running_at_start = offset == 0.0 || offset + duty > 1.0;
            stopped.set(&g.pids, running_at_start);
            if offset > 0.0 {
                switches.push((offset, true, &g.pids));
            }
            if end > 0.0 {
                switches.push((end, false, &g.pids));
            }
        }
        switches.sort_by(|x, y| x.0.total_cmp(&y.0));
        for (at, run, pids) in switches {
            if wait_until(shared, start + period.mul_f64(at)) {
                return;
            }
            stopped.set(pids, run);
        }
        if wait_until(shared, start + period) {
            return;
        }
    }
}

/// Sleeps until `deadline`; true when the throttler is stopping.
fn wait_until(shared: &Shared, deadline: Instant) -> bool {
    let mut control = shared.control.lock();
    while !control.stop {
        if shared.wake.wait_until(&mut control, deadline).timed_out() {
            break;
        }
    }
    control.stop
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::signals::RecordedSignals;

    #[test]
    fn cycles_throttled_groups_and_resumes_everything_on_stop() {
        let signals = Arc::new(RecordedSignals::default());
        let mut t = Throttler::start(Duration::from_millis(10), signals.clone());
        let mut plan = ThrottlePlan::new();
        plan.insert(
            "a".into(),
            ThrottleGroup {
                pids: vec![101, 102],
                duty: 0.5,
                offset: 0.25,
            },
        );
        plan.insert(
            "b".into(),
            ThrottleGroup {
                pids: vec![201],
                duty: 1.0,
                offset: 0.0,
            },
        );
        t.set(plan);
        let deadline = Instant::now() + Duration::from_secs(20);
        while signals
            .sent()
            .iter()
            .filter(|(p, s)| *p == 101 && *s == Signal::Stop)
            .count()
            < 3
        {
            assert!(Instant::now() < deadline, "never cycled");
            std::thread::sleep(Duration::from_millis(5));
        }
        t.stop();
        let sent = signals.sent();
        assert!(
            sent.iter().all(|(p, _)| *p != 201),
            "unthrottled group signalled"
        );
        for pid in [101, 102] {
            let last = sent.iter().rev().find(|(p, _)| *p == pid).map(|x| x.1);
            assert_eq!(last, Some(Signal::Cont), "{pid} left stopped: {sent:?}");
        }
    }

    #[test]
    fn a_group_leaving_the_plan_is_resumed_and_left_alone() {
        let signals = Arc::new(RecordedSignals::default());
        let t = Throttler::start(Duration::from_millis(10), signals.clone());
        let mut plan = ThrottlePlan::new();
        plan.insert(
            "a".into(),
            ThrottleGroup {
                pids: vec![7],
                duty: 0.2,
                offset: 0.9,
            },
        );
        t.set(plan);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !signals.sent().contains(&(7, Signal::Stop)) {
            assert!(Instant::now() < deadline, "never stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
        t.set(ThrottlePlan::new());
        // Soon the last word on pid 7 is SIGCONT, and nothing follows it.
        loop {
            let before = signals.sent().len();
            std::thread::sleep(Duration::from_millis(30));
            let sent = signals.sent();
            if sent.len() == before && sent.last() == Some(&(7, Signal::Cont)) {
                break;
            }
            assert!(Instant::now() < deadline, "never resumed: {sent:?}");
        }
        drop(t);
    }
}
