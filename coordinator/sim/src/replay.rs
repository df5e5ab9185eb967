//! Time-based replay: jobs arrive, run for their duration once their gang is placed, and leave.
//! Every scheduling decision comes from the real core (`cycle::schedule`): gangs, fair share,
//! reclaim, preemption, consolidation. The driver applies bindings and evictions, advances time
//! to the next arrival or completion, and records queue shares (leaf and parent queues), gang
//! waits with the reason for each cycle a job waited, evictions and completions.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

use tessera_core::cycle::{CycleConfig, EvictionReason, schedule};
use tessera_core::model::{Placement, Pod, Resource, Snapshot};

use super::workload::Loaded;

/// Cycles run at one instant while they keep changing something (evictions free capacity that
/// the next cycle may use).
const MAX_CYCLES_PER_INSTANT: usize = 8;

/// Queue GPU allocation at one instant.
#[derive(Clone, Debug, Serialize)]
pub struct ShareSample {
    /// Seconds since the start.
    pub time: u64,
    /// Allocated GPU per queue, percent of cluster GPU capacity; a parent queue counts what
    /// its descendants hold, as its fair share does.
    pub gpu_pct: BTreeMap<String, f64>,
    /// Fair share of GPU per queue, percent of cluster GPU capacity (as the core computed it).
    pub fair_pct: BTreeMap<String, f64>,
    /// While usage history is on: the factor on each queue's GPU over-quota weight.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub usage_factor: BTreeMap<String, f64>,
}

/// Why a job waited in one scheduling cycle.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaitReason {
    /// Cycle number (counted from 0 over the whole replay; several cycles may run at one
    /// instant).
    pub cycle: usize,
    /// Seconds since the start.
    pub time: u64,
    /// The job's first pod still pending after the cycle.
    pub pod: String,
    /// The core's explanation of that pod: word for word the message the coordinator writes
    /// into the pod's `PodScheduled=False, reason=Unschedulable` condition in a cluster.
    pub message: String,
}

/// One eviction the core decided.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvictionRecord {
    /// Cycle number.
    pub cycle: usize,
    /// Seconds since the start.
    pub time: u64,
    /// Evicted pod.
    pub pod: String,
    /// Why, in words (`reclaim by queue product-serving`).
    pub reason: String,
}

/// Outcome of one job.
#[derive(Clone, Debug, Serialize)]
pub struct JobResult {
    /// Job name.
    pub job: String,
    /// Queue.
    pub queue: String,
    /// Pods (gang size).
    pub min_member: u32,
    /// Arrival time.
    pub arrival: u64,
    /// When its gang was first placed (None = never).
    pub started: Option<u64>,
    /// When it finished (None = unfinished at the end).
    pub finished: Option<u64>,
    /// Times its pods were evicted.
    pub evictions: u32,
    /// Every cycle in which the job had arrived but was not running (before its gang was
    /// placed, or after it fell below its gang size), with the reason.
    pub waits: Vec<WaitReason>,
}

/// The whole replay outcome.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayOutcome {
    /// Workload name.
    pub workload: String,
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: u64,
    /// Scheduling cycles run.
    pub cycles: usize,
    /// Time spent inside the scheduling core, seconds.
    pub wall_seconds: f64,
    /// Simulated seconds until the last event.
    pub makespan: u64,
    /// Queue shares after every event.
    pub shares: Vec<ShareSample>,
    /// Per job.
    pub jobs: Vec<JobResult>,
    /// Bindings made.
    pub bindings: usize,
    /// Evictions made, by reason.
    pub evictions: BTreeMap<String, usize>,
    /// Every eviction, in order.
    pub evicted: Vec<EvictionRecord>,
    /// Parent of each queue that has one (queue → parent), for reports.
    pub parents: BTreeMap<String, String>,
    /// Pending explanations at the end (pod → message).
    pub pending: Vec<(String, String)>,
}

struct JobState {
    started: Option<u64>,
    finished: Option<u64>,
    /// Seconds of run time left; counts down only while the gang is complete.
    remaining: u64,
    evictions: u32,
    waits: Vec<WaitReason>,
}

fn describe(r: &EvictionReason) -> String {
    match r {
        EvictionReason::Reclaim { by_queue } => format!("reclaim by queue {by_queue}"),
        EvictionReason::Preempt { by_pod } => format!("preempted by pod {by_pod}"),
        EvictionReason::Consolidate { moved_to } => {
            format!("consolidate, recreated (a new copy fits on {moved_to})")
        }
        EvictionReason::GangBelowMinMember => "gang below minMember past the grace period".into(),
    }
}

/// Queue and ancestors (by name), innermost first; a broken parent chain stops the walk.
fn with_ancestors<'a>(q: &'a str, parents: &'a BTreeMap<String, String>) -> Vec<&'a str> {
    let mut out = vec![q];
    let mut cur = q;
    while let Some(p) = parents.get(cur) {
        if out.contains(&p.as_str()) || out.len() > parents.len() {
            break;
        }
        out.push(p);
        cur = p;
    }
    out
}

fn pod_gpu_milli(p: &Pod) -> u64 {
    p.placement.as_ref().map_or(0, |pl| {
        pl.assignment
            .slices()
            .map(|s| u64::from(s.compute_milli))
            .sum()
    })
}

/// Replays a loaded workload through the scheduling core.
pub fn replay(w: &Loaded, config: &CycleConfig) -> ReplayOutcome {
    let gpus: u64 = w.nodes.iter().map(|n| n.gpus.len() as u64).sum();
    let cap = (gpus * 1000).max(1) as f64;
    let mut states: Vec<JobState> = w
        .jobs
        .iter()
        .map(|j| JobState {
            started: None,
            finished: None,
            remaining: j.duration,
            evictions: 0,
            waits: Vec::new(),
        })
        .collect();
    let job_of: HashMap<String, usize> = w
        .jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| j.pods.iter().map(move |p| (p.uid.clone(), i)))
        .collect();
    let mut snap = Snapshot::at(0);
    snap.nodes = w.nodes.clone();
    snap.queues = w.queues.clone();
    let mut next_job = 0;
    let mut now = 0u64;
    let mut shares = Vec::new();
    let mut cycles = 0;
    let mut core = Duration::ZERO;
    let mut bindings = 0;
    let mut evictions: BTreeMap<String, usize> = BTreeMap::new();
    let mut pending = Vec::new();
    let mut evicted = Vec::new();
    let parents: BTreeMap<String, String> = w
        .queues
        .iter()
        .filter_map(|q| q.parent.clone().map(|p| (q.name.clone(), p)))
        .collect();
    loop {
        while next_job < w.jobs.len() && w.jobs[next_job].arrival <= now {
            let j = &w.jobs[next_job];
            snap.pods.extend(j.pods.iter().cloned());
            snap.groups.extend(j.group.iter().cloned());
            next_job += 1;
        }
        snap.now = now;
        let mut fair: BTreeMap<String, f64> = BTreeMap::new();
        let mut factors: BTreeMap<String, f64> = BTreeMap::new();
        for _ in 0..MAX_CYCLES_PER_INSTANT {
            let start = Instant::now();
            let d = schedule(&snap, config);
            core += start.elapsed();
            let cycle = cycles;
            cycles += 1;
            fair = d
                .fair_shares
                .iter()
                .map(|q| {
                    (
                        q.queue.clone(),
                        100.0 * q.fair_share[Resource::Gpu.index()] / cap,
                    )
                })
                .collect();
            factors = d
                .fair_shares
                .iter()
                .filter_map(|q| Some((q.queue.clone(), q.usage_factor?[Resource::Gpu.index()])))
                .collect();
            // The usage history goes on from what the core returned, as the coordinator keeps
            // it from cycle to cycle.
            snap.usage = d.usage.clone();
            pending = d
                .pending
                .iter()
                .map(|p| (p.pod.clone(), p.message.clone()))
                .collect();
            let index: HashMap<String, usize> = snap
                .pods
                .iter()
                .enumerate()
                .map(|(i, p)| (p.uid.clone(), i))
                .collect();
            for e in &d.evictions {
                if let Some(&i) = index.get(&e.pod) {
                    snap.pods[i].placement = None;
                    if let Some(&j) = job_of.get(&e.pod) {
                        states[j].evictions += 1;
                    }
                }
                let kind = format!("{:?}", e.reason);
                let kind = kind.split([' ', '{', '(']).next().unwrap_or("").to_string();
                *evictions.entry(kind).or_insert(0) += 1;
                evicted.push(EvictionRecord {
                    cycle,
                    time: now,
                    pod: e.pod.clone(),
                    reason: describe(&e.reason),
                });
            }
            for b in &d.bindings {
                if let Some(&i) = index.get(&b.pod) {
                    snap.pods[i].placement = Some(Placement {
                        node: b.node.clone(),
                        assignment: b.assignment.clone(),
                    });
                    bindings += 1;
                }
            }
            record_waits(w, &snap, &job_of, &d.pending, cycle, now, &mut states);
            if d.bindings.is_empty() && d.evictions.is_empty() {
                break;
            }
        }
        // Gang state: a job runs while at least min_member of its pods are bound.
        let mut bound_per_job = vec![0u32; w.jobs.len()];
        for p in &snap.pods {
            if p.placement.is_some()
                && let Some(&j) = job_of.get(&p.uid)
            {
                bound_per_job[j] += 1;
            }
        }
        for (j, job) in w.jobs.iter().enumerate() {
            let running = bound_per_job[j] >= job.min_member && states[j].finished.is_none();
            if running && states[j].started.is_none() {
                states[j].started = Some(now);
            }
            if let Some(g) = snap.groups.iter_mut().find(|g| g.name == job.name) {
                let below = states[j].started.is_some() && !running && states[j].finished.is_none();
                g.below_min_member_since = if below {
                    g.below_min_member_since.or(Some(now))
                } else {
                    None
                };
            }
        }
        let mut per_queue: BTreeMap<String, f64> =
            w.queues.iter().map(|q| (q.name.clone(), 0.0)).collect();
        for p in &snap.pods {
            let pct = 100.0 * pod_gpu_milli(p) as f64 / cap;
            for q in with_ancestors(&p.queue, &parents) {
                *per_queue.entry(q.to_string()).or_insert(0.0) += pct;
            }
        }
        shares.push(ShareSample {
            time: now,
            gpu_pct: per_queue,
            fair_pct: fair,
            usage_factor: factors,
        });
        // Next event: an arrival, or the earliest completion of a running job.
        let running: Vec<usize> = (0..w.jobs.len())
            .filter(|&j| states[j].finished.is_none() && bound_per_job[j] >= w.jobs[j].min_member)
            .collect();
        let next_done = running.iter().map(|&j| now + states[j].remaining).min();
        let next_arrival = w.jobs.get(next_job).map(|j| j.arrival);
        let next = match (next_done, next_arrival) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            // Nothing runs and nothing arrives: whatever is pending stays pending.
            (None, None) => break,
        };
        let dt = next - now;
        now = next;
        let mut finished_pods = Vec::new();
        for &j in &running {
            states[j].remaining = states[j].remaining.saturating_sub(dt);
            if states[j].remaining == 0 {
                states[j].finished = Some(now);
                finished_pods.extend(w.jobs[j].pods.iter().map(|p| p.uid.clone()));
            }
        }
        if !finished_pods.is_empty() {
            let done: std::collections::HashSet<String> = finished_pods.into_iter().collect();
            snap.pods.retain(|p| !done.contains(&p.uid));
            let finished_groups: std::collections::HashSet<&str> = w
                .jobs
                .iter()
                .zip(&states)
                .filter(|(_, s)| s.finished.is_some())
                .map(|(j, _)| j.name.as_str())
                .collect();
            snap.groups
                .retain(|g| !finished_groups.contains(g.name.as_str()));
        }
    }
    ReplayOutcome {
        workload: w.name.clone(),
        nodes: w.nodes.len(),
        gpus,
        cycles,
        wall_seconds: core.as_secs_f64(),
        makespan: now,
        shares,
        jobs: w
            .jobs
            .iter()
            .zip(&states)
            .map(|(j, s)| JobResult {
                job: j.name.clone(),
                queue: j.queue.clone(),
                min_member: j.min_member,
                arrival: j.arrival,
                started: s.started,
                finished: s.finished,
                evictions: s.evictions,
                waits: s.waits.clone(),
            })
            .collect(),
        bindings,
        evictions,
        evicted,
        parents,
        pending,
    }
}

/// Records, for every job that has arrived and is not running after a cycle, why its first
/// pending pod waits, in the core's own words.
fn record_waits(
    w: &Loaded,
    snap: &Snapshot,
    job_of: &HashMap<String, usize>,
    pending: &[tessera_core::cycle::PendingExplanation],
    cycle: usize,
    now: u64,
    states: &mut [JobState],
) {
    let mut bound = vec![0u32; w.jobs.len()];
    for p in &snap.pods {
        if p.placement.is_some()
            && let Some(&j) = job_of.get(&p.uid)
        {
            bound[j] += 1;
        }
    }
    let mut first: Vec<Option<&tessera_core::cycle::PendingExplanation>> = vec![None; w.jobs.len()];
    for e in pending {
        if let Some(&j) = job_of.get(&e.pod)
            && first[j].is_none()
        {
            first[j] = Some(e);
        }
    }
    for (j, job) in w.jobs.iter().enumerate() {
        if states[j].finished.is_some() || job.arrival > now || bound[j] >= job.min_member {
            continue;
        }
        if let Some(e) = first[j] {
            states[j].waits.push(WaitReason {
                cycle,
                time: now,
                pod: e.pod.clone(),
                message: e.message.clone(),
            });
        }
    }
}
