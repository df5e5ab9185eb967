//! The watchdog (isolation `watchdog`, the default): every interval (500 ms) it reads
//! each GPU's processes from the backend, attributes them to pods through their
//! cgroups, and holds every watchdog-isolated pod to its limits on that GPU:
//!
//! * memory over the limit → an Event and a metric at once; still over after the grace
//!   period (2 s) → SIGKILL the pod's processes on that GPU, with an Event giving the
//!   numbers ([`super::memory`]); in `warn` mode it never kills;
//! * compute, only on a contended GPU (the demands add up to more than 100%) → pods
//!   wanting more than their fair share are duty-cycled toward it by the throttle
//!   thread, each with its own feedback controller ([`super::controller`]). An
//!   uncontended GPU is never throttled.
//!
//! Processes whose cgroup names no pod (host processes, unknown runtimes) are counted as
//! load but never signalled. On its first tick the watchdog resumes every pod process it
//! sees, in case a previous agent was killed while it held some stopped; when it stops
//! (or its thread unwinds) the throttler resumes everything it stopped.
//!
//! The decision logic is pure ([`super::memory`], [`super::controller`]); this module is
//! the I/O around it, and [`Watchdog::tick`] takes the time as an argument.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::cgroup::pod_of_pid;
use super::controller::{Claim, PiController, PiGains, contended, targets};
use super::limits::PodLimit;
use super::memory::{MemoryAction, MemoryGuard, MemoryState, MemoryVerdict};
use super::signals::{Signal, Signaller};
use super::state::{Action, EnforcementBoard, EnforcementState, PodEnforcement};
use super::throttle::{ThrottleGroup, ThrottlePlan, Throttler};
use crate::events::{EventReason, EventSink, PodEvent};
use crate::gpu::{GpuBackend, GpuProcess};
use tessera_contract::Isolation;

/// How long after a pod was told it is throttled on a GPU it is not told again: taking hold
/// again after a dip in demand is the same episode.
const THROTTLE_RETELL: Duration = Duration::from_secs(300);

/// Watchdog settings (`tessera-agent run --watchdog-interval-ms …`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WatchdogConfig {
    /// Time between readings.
    pub interval: Duration,
    /// How long a pod may stay over its memory limit before it is killed.
    pub memory_grace: Duration,
    /// Kill, or only warn.
    pub memory_action: MemoryAction,
    /// The duty-cycling period.
    pub throttle_period: Duration,
    /// Compute controller tuning.
    pub gains: PiGains,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            memory_grace: Duration::from_secs(2),
            memory_action: MemoryAction::Kill,
            throttle_period: Duration::from_millis(50),
            gains: PiGains::default(),
        }
    }
}

/// A throttled pod's duty below this counts as throttled; above it the pod runs freely.
const FULL_DUTY: f64 = 0.995;
/// Demand this many percentage points above the target before throttling starts, so
/// measurement noise around a pod's share does not start and stop it.
const DEAD_BAND: f64 = 1.0;

/// One pod's processes on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodProcesses {
    /// Their PIDs.
    pub pids: Vec<u32>,
    /// Memory, MiB (the processes whose figure NVML gives).
    pub memory_mib: u64,
    /// Whether NVML reported some process's memory unavailable: the pod's memory is
    /// then unknown, and no memory decision is taken on it.
    pub memory_unknown: bool,
    /// SM utilisation, percent (summed, at most 100).
    pub sm_percent: u32,
}

type Key = (String, String);

/// The watchdog's state between ticks.
pub struct Watchdog {
    config: WatchdogConfig,
    backend: Arc<dyn GpuBackend>,
    gpus: Vec<String>,
    proc_root: PathBuf,
    signals: Arc<dyn Signaller>,
    events: Arc<dyn EventSink>,
    board: EnforcementBoard,
    throttler: Throttler,
    memory: HashMap<Key, MemoryGuard>,
    compute: HashMap<Key, PiController>,
    /// When each pod was last told it is throttled on a GPU: a controller that lets go in a
    /// dip of demand and takes hold again is one episode to the pod's owner, not a new Event
    /// each time (the demand figures in the text differ, so the API server would not
    /// aggregate them).
    throttle_told: HashMap<Key, Instant>,
    resumed: bool,
    unknown_seen: HashSet<u32>,
    plan: ThrottlePlan,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.throttler.stop();
        self.board.clear();
    }
}

impl Watchdog {
    /// A watchdog over `gpus` (UUIDs) of `backend`, reading cgroups under `proc_root`;
    /// starts the throttle thread.
    pub fn new(
        config: WatchdogConfig,
        backend: Arc<dyn GpuBackend>,
        gpus: Vec<String>,
        proc_root: impl Into<PathBuf>,
        signals: Arc<dyn Signaller>,
        events: Arc<dyn EventSink>,
        board: EnforcementBoard,
    ) -> Self {
        Self {
            throttler: Throttler::start(config.throttle_period, Arc::clone(&signals)),
            config,
            backend,
            gpus,
            proc_root: proc_root.into(),
            signals,
            events,
            board,
            memory: HashMap::new(),
            compute: HashMap::new(),
            throttle_told: HashMap::new(),
            resumed: false,
            unknown_seen: HashSet::new(),
            plan: ThrottlePlan::new(),
        }
    }

    /// The interval, memory grace and action, throttle period and controller gains in use.
    pub fn config(&self) -> &WatchdogConfig {
        &self.config
    }

    /// The throttle plan decided by the last tick.
    pub fn throttle_plan(&self) -> &ThrottlePlan {
        &self.plan
    }

    /// Groups one GPU's processes by pod UID; the rest is returned as unknown load.
    pub fn attribute(&mut self, processes: &[GpuProcess]) -> (BTreeMap<String, PodProcesses>, u32) {
        let mut pods: BTreeMap<String, PodProcesses> = BTreeMap::new();
        let mut unknown = 0u32;
        for p in processes {
            match pod_of_pid(&self.proc_root, p.pid) {
                Some(pod) => {
                    let group = pods.entry(pod.pod_uid).or_default();
                    group.pids.push(p.pid);
                    match p.memory_used_mib {
                        Some(m) => group.memory_mib += m,
                        None => group.memory_unknown = true,
                    }
                    group.sm_percent = (group.sm_percent + p.sm_percent).min(100);
                }
                None => {
                    unknown = (unknown + p.sm_percent).min(100);
                    if self.unknown_seen.insert(p.pid) {
                        tracing::info!(
                            pid = p.pid,
                            memory_mib = ?p.memory_used_mib,
                            "GPU process belongs to no pod; reported, never acted on"
                        );
                    }
                }
            }
        }
        (pods, unknown)
    }

    /// One reading of every GPU and the actions it calls for, at `now`, against
    /// `limits`.
    pub fn tick(&mut self, now: Instant, limits: &[PodLimit]) {
        let mut plan = ThrottlePlan::new();
        let mut entries = Vec::new();
        let mut live: HashSet<Key> = HashSet::new();
        let mut seen_pids: HashSet<u32> = HashSet::new();
        for i in 0..self.gpus.len() {
            let gpu = self.gpus[i].clone();
            let sample = match self.backend.sample(&gpu) {
                Ok(s) => s,
                Err(error) => {
                    tracing::warn!(%gpu, %error, "cannot read GPU processes; skipping this GPU for now");
                    continue;
                }
            };
            seen_pids.extend(sample.processes.iter().map(|p| p.pid));
            let (pods, unknown) = self.attribute(&sample.processes);
            if !self.resumed {
                for pid in pods.values().flat_map(|g| &g.pids) {
                    let _ = self.signals.send(*pid, Signal::Cont);
                }
            }
            let on_gpu: Vec<&PodLimit> = limits.iter().filter(|l| l.gpu_uuid == gpu).collect();
            self.enforce_gpu(
                now,
                &gpu,
                &pods,
                unknown,
                &on_gpu,
                &mut plan,
                &mut entries,
                &mut live,
            );
        }
        self.resumed = true;
        self.unknown_seen.retain(|pid| seen_pids.contains(pid));
        self.memory.retain(|k, _| live.contains(k));
        self.compute.retain(|k, _| live.contains(k));
        self.throttle_told.retain(|k, at| {
            live.contains(k) && now.saturating_duration_since(*at) < THROTTLE_RETELL
        });
        self.throttler.set(plan.clone());
        self.plan = plan;
        self.board.publish(entries);
    }

    #[allow(clippy::too_many_arguments)] // one GPU's slice of the tick's state
    fn enforce_gpu(
        &mut self,
        now: Instant,
        gpu: &str,
        pods: &BTreeMap<String, PodProcesses>,
        unknown_sm: u32,
        limits: &[&PodLimit],
        plan: &mut ThrottlePlan,
        entries: &mut Vec<PodEnforcement>,
        live: &mut HashSet<Key>,
    ) {
        let none = PodProcesses::default();
        let enforced: Vec<(&PodLimit, &PodProcesses)> = limits
            .iter()
            .filter(|l| l.isolation == Isolation::Watchdog)
            .map(|l| (*l, pods.get(&l.pod_uid).unwrap_or(&none)))
            .collect();
        // Load the watchdog cannot throttle: unknown processes and pods it does not
        // enforce (or that hold no share of this GPU).
        let fixed: f64 = f64::from(unknown_sm)
            + pods
                .iter()
                .filter(|(uid, _)| !enforced.iter().any(|(l, _)| &l.pod_uid == *uid))
                .map(|(_, g)| f64::from(g.sm_percent))
                .sum::<f64>();

        // Memory first: a pod killed is not throttled.
        for (limit, usage) in &enforced {
            let key = (limit.pod_uid.clone(), gpu.to_owned());
            live.insert(key.clone());
            if usage.memory_unknown {
                // Neither over nor under: keep whatever the guard knew.
                continue;
            }
            let (grace, action) = (self.config.memory_grace, self.config.memory_action);
            let guard = self
                .memory
                .entry(key)
                .or_insert_with(|| MemoryGuard::new(grace, action));
            match guard.observe(usage.memory_mib, limit.memory_mib, now) {
                MemoryVerdict::Warn => {
                    self.board.count(Action::MemoryWarn);
                    let then = match self.config.memory_action {
                        MemoryAction::Kill => format!(
                            "its processes on this GPU are killed if it is still over in {:.1}s",
                            self.config.memory_grace.as_secs_f64()
                        ),
                        MemoryAction::Warn => "the agent only warns (--memory-action warn)".into(),
                    };
                    self.emit(
                        limit,
                        EventReason::GpuMemoryOverLimit,
                        format!(
                            "GPU memory {} MiB is over the limit of {} MiB on GPU {gpu}; {then}",
                            usage.memory_mib, limit.memory_mib
                        ),
                    );
                }
                MemoryVerdict::Kill { over_for } => {
                    self.board.count(Action::MemoryKill);
                    for pid in &usage.pids {
                        if let Err(error) = self.signals.send(*pid, Signal::Kill) {
                            tracing::warn!(pid, %error, "cannot kill a process over its GPU memory limit");
                        }
                    }
                    self.emit(
                        limit,
                        EventReason::GpuMemoryKilled,
                        format!(
                            "killed {} process(es) (pids {}) using {} MiB of GPU {gpu}, over the limit of {} MiB for {:.1}s (grace {:.1}s)",
                            usage.pids.len(),
                            join(&usage.pids),
                            usage.memory_mib,
                            limit.memory_mib,
                            over_for.as_secs_f64(),
                            self.config.memory_grace.as_secs_f64()
                        ),
                    );
                }
                MemoryVerdict::Recovered => {
                    tracing::info!(pod = %limit.pod, %gpu, "back within its GPU memory limit");
                }
                MemoryVerdict::Nothing => {}
            }
        }

        // Compute: only on a contended GPU, only pods wanting more than their target.
        let claimants: Vec<(&PodLimit, &PodProcesses, Claim)> = enforced
            .iter()
            .filter(|(l, u)| {
                // A pod whose processes were killed is not throttled: they are dying.
                let key = (l.pod_uid.clone(), gpu.to_owned());
                let state = self.memory.get(&key).map(MemoryGuard::state);
                !u.pids.is_empty() && !matches!(state, Some(MemoryState::Killed { .. }))
            })
            .map(|(l, u)| {
                let key = (l.pod_uid.clone(), gpu.to_owned());
                let duty = self.compute.get(&key).map_or(1.0, PiController::duty);
                // What it would use unthrottled, estimated from what it used while
                // running `duty` of the time.
                let demand = (f64::from(u.sm_percent) / duty.max(1e-3)).min(100.0);
                let claim = Claim {
                    share: f64::from(l.compute_milli) / 10.0,
                    demand,
                };
                (*l, *u, claim)
            })
            .collect();
        let total = fixed + claimants.iter().map(|(_, _, c)| c.demand).sum::<f64>();
        let mut throttled: HashMap<&str, f64> = HashMap::new();
        let mut controlled: HashSet<&str> = HashSet::new();
        let mut window_start = 0.0_f64;
        if contended(total) {
            let claims: Vec<Claim> = claimants.iter().map(|(_, _, c)| *c).collect();
            let goals = targets(100.0 - fixed, &claims);
            for ((limit, usage, claim), target) in claimants.iter().zip(goals) {
                let key = (limit.pod_uid.clone(), gpu.to_owned());
                if claim.demand <= target + DEAD_BAND {
                    self.compute.remove(&key);
                    continue;
                }
                controlled.insert(limit.pod_uid.as_str());
                let (goal, measured) = (target / 100.0, f64::from(usage.sm_percent) / 100.0);
                let duty = match self.compute.get_mut(&key) {
                    Some(c) => c.update(goal, measured),
                    None => {
                        let c = PiController::start(self.config.gains, goal, claim.demand / 100.0);
                        self.compute.insert(key.clone(), c);
                        self.board.count(Action::Throttle);
                        let told = self.throttle_told.get(&key).copied();
                        if told
                            .is_some_and(|at| now.saturating_duration_since(at) < THROTTLE_RETELL)
                        {
                            c.duty()
                        } else {
                            self.throttle_told.insert(key.clone(), now);
                            self.emit(
                            limit,
                            EventReason::GpuComputeThrottled,
                            format!(
                                "GPU {gpu} is contended (demand {total:.0}%): this pod wants {:.0}% with a compute share of {:.0}%, so its processes are duty-cycled to about {target:.0}% of the GPU",
                                claim.demand, claim.share
                            ),
                            );
                            c.duty()
                        }
                    }
                };
                if duty < FULL_DUTY {
                    plan.insert(
                        format!("{}/{gpu}", limit.pod_uid),
                        ThrottleGroup {
                            pids: usage.pids.clone(),
                            duty,
                            offset: window_start,
                        },
                    );
                    // The next throttled pod of this GPU takes its turn after this one.
                    window_start = (window_start + duty).rem_euclid(1.0);
                    throttled.insert(limit.pod_uid.as_str(), duty);
                }
            }
        }
        // Everyone else on this GPU runs freely and starts afresh if throttled again.
        for (limit, _) in &enforced {
            if !controlled.contains(limit.pod_uid.as_str()) {
                self.compute
                    .remove(&(limit.pod_uid.clone(), gpu.to_owned()));
            }
        }

        for limit in limits {
            let usage = pods.get(&limit.pod_uid).unwrap_or(&none);
            let state = if limit.isolation != Isolation::Watchdog {
                EnforcementState::NotEnforced
            } else {
                let key = (limit.pod_uid.clone(), gpu.to_owned());
                match self.memory.get(&key).map(MemoryGuard::state) {
                    Some(MemoryState::Killed { .. }) => EnforcementState::Killed,
                    Some(MemoryState::Warned { .. }) => EnforcementState::Warned,
                    _ => match throttled.get(limit.pod_uid.as_str()) {
                        Some(duty) => EnforcementState::Throttled {
                            run_percent: (duty * 100.0).round() as u32,
                        },
                        None => EnforcementState::Ok,
                    },
                }
            };
            entries.push(PodEnforcement {
                pod: limit.pod.clone(),
                pod_uid: limit.pod_uid.clone(),
                gpu_uuid: gpu.to_owned(),
                isolation: limit.isolation,
                state,
                memory_limit_mib: limit.memory_mib,
                memory_used_mib: usage.memory_mib,
                share_percent: limit.compute_milli.div_ceil(10),
                used_percent: usage.sm_percent,
                processes: usage.pids.len() as u32,
            });
        }
    }

    fn emit(&self, limit: &PodLimit, reason: EventReason, message: String) {
        self.events.emit(PodEvent {
            pod: limit.pod.clone(),
            pod_uid: limit.pod_uid.clone(),
            reason,
            message,
        });
    }
}

fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

struct Stop {
    flag: Mutex<bool>,
    wake: Condvar,
}

/// The watchdog running on its own thread.
pub struct WatchdogHandle {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

impl WatchdogHandle {
    /// Runs `watchdog` every interval on a dedicated thread (its readings block on
    /// the driver and the file system), asking `limits` for the current limits each
    /// time.
    pub fn spawn(
        mut watchdog: Watchdog,
        limits: impl Fn() -> Vec<PodLimit> + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(Stop {
            flag: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("tessera-watchdog".into())
                .spawn(move || {
                    let interval = watchdog.config.interval;
                    loop {
                        let start = Instant::now();
                        let current = limits();
                        // A bug in one tick must not end enforcement, nor leave
                        // processes stopped: log it and carry on with the next tick.
                        let ticked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            watchdog.tick(start, &current)
                        }));
                        if ticked.is_err() {
                            tracing::error!("watchdog tick panicked; continuing");
                        }
                        let mut stopping = stop.flag.lock();
                        let deadline = start + interval;
                        while !*stopping
                            && !stop.wake.wait_until(&mut stopping, deadline).timed_out()
                        {
                        }
                        if *stopping {
                            break;
                        }
                    }
                    // Dropping the watchdog stops the throttler, which resumes
                    // every process it stopped.
                    drop(watchdog);
                })?
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the watchdog; every process it stopped is running again when this returns.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        *self.stop.flag.lock() = true;
        self.stop.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for WatchdogHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the watchdog over this node's GPUs with the limits and isolation modes its
/// ledger recorded at Allocate, publishing on `node.metrics.enforcement`; `None` (logged)
/// when its thread cannot start, so the agent keeps serving without enforcement.
pub fn start_for_node(
    node: &Arc<crate::node::Node>,
    proc_root: PathBuf,
    config: WatchdogConfig,
    events: Arc<dyn EventSink>,
) -> Option<WatchdogHandle> {
    // MIG parents are left out: MIG is hard isolation already, and their process and
    // memory queries need monitoring privilege.
    let gpus: Vec<String> = node
        .devices()
        .iter()
        .filter(|d| d.mig.is_none())
        .map(|d| d.uuid.clone())
        .collect();
    let watchdog = Watchdog::new(
        config,
        Arc::clone(node.backend()),
        gpus.clone(),
        proc_root,
        Arc::new(super::signals::KernelSignals),
        events,
        node.metrics.enforcement.clone(),
    );
    let node = Arc::clone(node);
    let limits = move || {
        let ids: Vec<&str> = gpus.iter().map(String::as_str).collect();
        super::limits::pod_limits(&node.ledger.lock(), &ids)
    };
    match WatchdogHandle::spawn(watchdog, limits) {
        Ok(handle) => Some(handle),
        Err(error) => {
            tracing::error!(%error, "cannot start the watchdog thread; limits are not enforced");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::signals::RecordedSignals;
    use crate::events::RecordedEvents;
    use crate::gpu::sim::SimBackend;
    use crate::ledger::PodRef;

    const X: &str = "0b7e6f2a-3c4d-4e5f-8a9b-0c1d2e3f4a51";
    const Y: &str = "0b7e6f2a-3c4d-4e5f-8a9b-0c1d2e3f4a52";

    fn fake_proc(root: &std::path::Path, pid: u32, uid: &str) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/kubepods/burstable/pod{uid}/{}\n", "d".repeat(64)),
        )
        .unwrap();
    }

    fn limit(name: &str, uid: &str, gpu: &str, milli: u32) -> PodLimit {
        PodLimit {
            pod: PodRef::new("ml", name),
            pod_uid: uid.into(),
            gpu_uuid: gpu.into(),
            memory_mib: 1000,
            compute_milli: milli,
            isolation: Isolation::Watchdog,
        }
    }

    /// A controller that lets go in a dip of demand and takes hold again is one episode: the
    /// pod is told once, and again only after [`THROTTLE_RETELL`].
    #[test]
    fn a_pod_throttled_again_after_a_dip_is_not_told_again() {
        let shape = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../hack/gpus/l40s-4x-pcie.yaml"
        );
        let sim = Arc::new(SimBackend::from_file(shape).unwrap());
        let gpu = sim.uuid_of(0).unwrap().to_owned();
        let root = tempfile::tempdir().unwrap();
        fake_proc(root.path(), 900_001, X);
        fake_proc(root.path(), 900_002, Y);
        let events = Arc::new(RecordedEvents::default());
        let config = WatchdogConfig::default();
        let mut w = Watchdog::new(
            config,
            sim.clone(),
            vec![gpu.clone()],
            root.path(),
            Arc::new(RecordedSignals::default()),
            events.clone(),
            EnforcementBoard::default(),
        );
        let limits = [limit("x", X, &gpu, 700), limit("y", Y, &gpu, 300)];
        let told = || {
            events
                .events()
                .iter()
                .filter(|e| e.reason == EventReason::GpuComputeThrottled && e.pod_uid == Y)
                .count()
        };
        let t0 = Instant::now();
        let contend = |w: &mut Watchdog, at: Instant| {
            sim.set_process(&gpu, 900_001, 500, 100).unwrap();
            sim.set_process(&gpu, 900_002, 500, 100).unwrap();
            w.tick(at, &limits);
        };
        contend(&mut w, t0);
        assert_eq!(told(), 1);
        // y's demand dips: not contended, the controller lets go.
        sim.set_process(&gpu, 900_002, 500, 5).unwrap();
        w.tick(t0 + config.interval, &limits);
        assert!(!w.throttle_plan().contains_key(&format!("{Y}/{gpu}")));
        // Contended again: throttled, but not told again.
        contend(&mut w, t0 + config.interval * 2);
        assert!(w.throttle_plan().contains_key(&format!("{Y}/{gpu}")));
        assert_eq!(told(), 1);
        // Much later, a new episode is told.
        sim.set_process(&gpu, 900_002, 500, 5).unwrap();
        w.tick(t0 + THROTTLE_RETELL, &limits);
        contend(&mut w, t0 + THROTTLE_RETELL + config.interval);
        assert_eq!(told(), 2);
    }

    /// The tick's decisions with a fake clock and recorded signals: unknown processes
    /// are never signalled, contention is shared by share after the load nobody may
    /// throttle, and memory goes warn → kill on schedule.
    #[test]
    fn one_gpu_through_contention_and_a_memory_kill() {
        let shape = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../hack/gpus/l40s-4x-pcie.yaml"
        );
        let sim = Arc::new(SimBackend::from_file(shape).unwrap());
        let gpu = sim.uuid_of(0).unwrap().to_owned();
        let root = tempfile::tempdir().unwrap();
        fake_proc(root.path(), 900_001, X);
        fake_proc(root.path(), 900_002, Y);
        sim.set_process(&gpu, 900_001, 500, 100).unwrap();
        sim.set_process(&gpu, 900_002, 500, 100).unwrap();
        // No cgroup file: unknown, 50% of load, far over any limit.
        sim.set_process(&gpu, 900_003, 50_000, 50).unwrap();
        let signals = Arc::new(RecordedSignals::default());
        let events = Arc::new(RecordedEvents::default());
        let board = EnforcementBoard::default();
        let config = WatchdogConfig::default();
        let mut w = Watchdog::new(
            config,
            sim.clone(),
            vec![gpu.clone()],
            root.path(),
            signals.clone(),
            events.clone(),
            board.clone(),
        );
        let limits = [limit("x", X, &gpu, 700), limit("y", Y, &gpu, 300)];
        let t0 = Instant::now();
        w.tick(t0, &limits);

        // A fresh watchdog resumes every pod process once, in case its predecessor
        // died with some stopped.
        let sent = signals.sent();
        assert!(sent.contains(&(900_001, Signal::Cont)) && sent.contains(&(900_002, Signal::Cont)));
        // 50% is taken by the unknown process: x and y split the other 50 by 70/30.
        let plan = w.throttle_plan();
        let duty = |uid: &str| plan[&format!("{uid}/{gpu}")].duty;
        assert!((duty(X) - 0.35).abs() < 1e-6, "{plan:?}");
        assert!((duty(Y) - 0.15).abs() < 1e-6, "{plan:?}");
        assert_eq!(
            board.state(Some(X), &gpu),
            EnforcementState::Throttled { run_percent: 35 }
        );
        let throttle_events = events
            .events()
            .iter()
            .filter(|e| e.reason == EventReason::GpuComputeThrottled)
            .count();
        assert_eq!(throttle_events, 2);

        // x goes over its memory limit: warned at once, killed after the grace period.
        sim.set_process(&gpu, 900_001, 1500, 35).unwrap();
        w.tick(t0 + config.interval, &limits);
        assert_eq!(board.state(Some(X), &gpu), EnforcementState::Warned);
        w.tick(t0 + config.interval + config.memory_grace / 2, &limits);
        assert!(!signals.sent().contains(&(900_001, Signal::Kill)));
        w.tick(t0 + config.interval + config.memory_grace, &limits);
        assert!(signals.sent().contains(&(900_001, Signal::Kill)));
        assert_eq!(board.state(Some(X), &gpu), EnforcementState::Killed);
        assert!(!w.throttle_plan().contains_key(&format!("{X}/{gpu}")));
        let reasons: Vec<EventReason> = events.events().iter().map(|e| e.reason).collect();
        assert_eq!(
            &reasons[2..],
            &[
                EventReason::GpuMemoryOverLimit,
                EventReason::GpuMemoryKilled
            ]
        );

        // y leaves (no more limits): it is dropped from the plan.
        w.tick(t0 + config.interval * 8, &limits[..1]);
        assert!(w.throttle_plan().is_empty(), "{:?}", w.throttle_plan());
        drop(w);
        // Never a signal for the unknown process, and the board is cleared on stop.
        assert!(signals.sent().iter().all(|(pid, _)| *pid != 900_003));
        assert!(!board.running());
    }
}
