//! The `simulate` entry points for Tessera workloads: the bundled sample (no arguments) and
//! `simulate replay --workload FILE [--explain]`, with the human report, JSON and SVG outputs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use thiserror::Error;

use tessera_core::cycle::CycleConfig;
use tessera_core::usage::UsageDecay;

use super::plot::{Axes, Series, chart_body, line_chart, stacked};
use super::policy::Policy;
use super::replay::{ReplayOutcome, replay};
use super::workload::Workload;
use tessera_gpushape::{YamlError, bundled_dir};

/// Failure of a workload run.
#[derive(Debug, Error)]
pub enum RunError {
    /// The workload or a shape file is bad.
    #[error(transparent)]
    Input(#[from] YamlError),
    /// Replay runs the scheduling core itself; only its policy applies.
    #[error("replay runs the scheduling core: --policy {0} is not available (accepted: tessera)")]
    Policy(Policy),
    /// An output file could not be written.
    #[error("writing {file}: {source}")]
    Output {
        /// The `--json` or `--plot` output path that could not be written.
        file: String,
        /// Why writing failed (missing directory, no permission, full disk).
        #[source]
        source: std::io::Error,
    },
}

/// Path of the bundled sample workload.
pub fn default_workload_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/workloads/sample.yaml")
}

/// The bundled sample, compiled in so `simulate` works away from the repository.
const SAMPLE: &str = include_str!("../../../hack/workloads/sample.yaml");

/// Runs the bundled sample (from `path` when present, else the compiled-in copy) and returns
/// the report.
pub fn run_sample(path: &Path) -> Result<String, RunError> {
    if path.exists() {
        return run_workload(
            path,
            Policy::Tessera,
            &Outputs::default(),
            UsageDecay::default(),
        );
    }
    let w: Workload = tessera_gpushape::parse_yaml("<bundled sample.yaml>", SAMPLE)?;
    let loaded = w.resolve("<bundled sample.yaml>", &bundled_dir())?;
    Ok(human(&replay(&loaded, &CycleConfig::default()), false))
}

/// Where a replay's report goes besides the returned text.
#[derive(Clone, Debug, Default)]
pub struct Outputs<'a> {
    /// Write the numbers as JSON here.
    pub json: Option<&'a Path>,
    /// Write the shares plot as SVG here.
    pub plot: Option<&'a Path>,
    /// Add why each job waited, the evictions and parent queues' shares.
    pub explain: bool,
}

/// Replays a workload file through the scheduling core; writes JSON / SVG when asked and
/// returns the human report (with `explain`, also why each job waited, the evictions and
/// parent queues' shares). With usage history on, the workload is replayed twice, without and
/// with it: the report is the run with it plus what changed for each queue, the plot shows
/// both runs' shares one above the other, and the JSON holds both (`without_usage_history`,
/// `with_usage_history`).
pub fn run_workload(
    path: &Path,
    policy: Policy,
    outputs: &Outputs,
    usage: UsageDecay,
) -> Result<String, RunError> {
    if policy != Policy::Tessera {
        return Err(RunError::Policy(policy));
    }
    let loaded = Workload::load(path, &bundled_dir())?;
    let out = replay(
        &loaded,
        &CycleConfig {
            usage,
            ..CycleConfig::default()
        },
    );
    let plain = usage
        .is_on()
        .then(|| replay(&loaded, &CycleConfig::default()));
    let write = |p: &Path, text: String| {
        std::fs::write(p, text).map_err(|source| RunError::Output {
            file: p.display().to_string(),
            source,
        })
    };
    if let Some(p) = outputs.json {
        // Plain strings, numbers and maps: serialisation cannot fail.
        let text = match &plain {
            None => serde_json::to_string_pretty(&out),
            Some(plain) => serde_json::to_string_pretty(&serde_json::json!({
                "without_usage_history": plain,
                "with_usage_history": out,
            })),
        };
        write(p, text.unwrap_or_default())?;
    }
    if let Some(p) = outputs.plot {
        let svg = match &plain {
            None => shares_svg(&out),
            Some(plain) => stacked(&[
                shares_chart(plain, &format!("GPU share per queue: {}", out.workload)),
                shares_chart(
                    &out,
                    &format!(
                        "With usage history (half-life {} s{})",
                        usage.half_life_seconds,
                        window_text(usage)
                    ),
                ),
            ]),
        };
        write(p, svg)?;
    }
    let mut text = human(&out, outputs.explain);
    if let Some(plain) = &plain {
        compare(&mut text, plain, &out, usage);
    }
    Ok(text)
}

fn window_text(usage: UsageDecay) -> String {
    if usage.window_seconds == 0 {
        String::new()
    } else {
        format!(", window {} s", usage.window_seconds)
    }
}

/// GPU-hours each queue held over the replay (from the share samples: a sample's value holds
/// until the next one).
fn gpu_hours(out: &ReplayOutcome, queue: &str) -> f64 {
    let pct_seconds: f64 = out
        .shares
        .windows(2)
        .map(|w| w[0].gpu_pct.get(queue).copied().unwrap_or(0.0) * (w[1].time - w[0].time) as f64)
        .sum();
    pct_seconds / 100.0 * out.gpus as f64 / 3600.0
}

/// Per queue: (mean gang wait, mean completion) of its jobs in seconds, `None` without any.
fn waits(out: &ReplayOutcome, queue: &str) -> (Option<f64>, Option<f64>) {
    let mean = |v: Vec<u64>| (!v.is_empty()).then(|| v.iter().sum::<u64>() as f64 / v.len() as f64);
    let jobs = out.jobs.iter().filter(|j| j.queue == queue);
    (
        mean(
            jobs.clone()
                .filter_map(|j| Some(j.started? - j.arrival))
                .collect(),
        ),
        mean(jobs.filter_map(|j| Some(j.finished? - j.arrival)).collect()),
    )
}

/// A job's family: its name without the `-<k>` a repeat adds.
fn family(job: &str) -> &str {
    match job.rsplit_once('-') {
        Some((base, k)) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => job,
    }
}

/// Mean gang wait (seconds) of the started jobs of a family, with the family's job count.
fn family_wait(out: &ReplayOutcome, fam: &str) -> (usize, Option<f64>) {
    let jobs: Vec<_> = out.jobs.iter().filter(|j| family(&j.job) == fam).collect();
    let waits: Vec<u64> = jobs
        .iter()
        .filter_map(|j| Some(j.started? - j.arrival))
        .collect();
    let mean = (!waits.is_empty()).then(|| waits.iter().sum::<u64>() as f64 / waits.len() as f64);
    (jobs.len(), mean)
}

/// The section saying what usage history changed: each job family whose mean gang wait moved,
/// then per leaf queue the GPU-hours held, mean gang wait and completion and evicted pods,
/// without and with it.
fn compare(s: &mut String, plain: &ReplayOutcome, decayed: &ReplayOutcome, usage: UsageDecay) {
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let _ = writeln!(
        s,
        "\nWhat usage history changed (half-life {} s{}): without -> with",
        usage.half_life_seconds,
        window_text(usage)
    );
    let mut families: Vec<(&str, &str)> = decayed
        .jobs
        .iter()
        .map(|j| (family(&j.job), j.queue.as_str()))
        .collect();
    families.sort();
    families.dedup();
    let mut moved = 0;
    for (fam, queue) in families {
        let (n, before) = family_wait(plain, fam);
        let (_, after) = family_wait(decayed, fam);
        if before != after {
            moved += 1;
            let _ = writeln!(
                s,
                "  {fam} ({queue}, {n} jobs): mean gang wait {} -> {} s",
                fmt(before),
                fmt(after)
            );
        }
    }
    if moved == 0 {
        let _ = writeln!(s, "  no job family waited differently");
    }
    let _ = writeln!(
        s,
        "{:<18}{:>22}{:>22}{:>24}{:>14}",
        "queue", "GPU-hours held", "mean wait s", "mean completion s", "evicted pods"
    );
    let evicted = |o: &ReplayOutcome, q: &str| -> u32 {
        o.jobs
            .iter()
            .filter(|j| j.queue == q)
            .map(|j| j.evictions)
            .sum()
    };
    for q in leaf_queues(decayed) {
        let (w0, c0) = waits(plain, &q);
        let (w1, c1) = waits(decayed, &q);
        let _ = writeln!(
            s,
            "{:<18}{:>22}{:>22}{:>24}{:>14}",
            q,
            format!(
                "{:.1} -> {:.1}",
                gpu_hours(plain, &q),
                gpu_hours(decayed, &q)
            ),
            format!("{} -> {}", fmt(w0), fmt(w1)),
            format!("{} -> {}", fmt(c0), fmt(c1)),
            format!("{} -> {}", evicted(plain, &q), evicted(decayed, &q)),
        );
    }
}

fn leaf_queues(out: &ReplayOutcome) -> Vec<String> {
    let mut qs: Vec<String> = out.jobs.iter().map(|j| j.queue.clone()).collect();
    qs.sort();
    qs.dedup();
    qs
}

/// One row per instant at which a cell changed: each queue's GPU share and fair share, and,
/// with `total`, the sum over `queues`.
fn share_table(s: &mut String, out: &ReplayOutcome, queues: &[String], total: bool) {
    let _ = write!(s, "{:>8}", "time s");
    for q in queues {
        let _ = write!(s, "{q:>20}");
    }
    if total {
        let _ = write!(s, "{:>10}", "total");
    }
    let _ = writeln!(s);
    let mut last: Option<Vec<String>> = None;
    for sample in &out.shares {
        let cells: Vec<String> = queues
            .iter()
            .map(|q| {
                let a = sample.gpu_pct.get(q).copied().unwrap_or(0.0);
                let f = sample.fair_pct.get(q).copied().unwrap_or(0.0);
                format!("{a:.1} [{f:.1}]")
            })
            .collect();
        if last.as_ref() == Some(&cells) {
            continue;
        }
        let _ = write!(s, "{:>8}", sample.time);
        for c in &cells {
            let _ = write!(s, "{c:>20}");
        }
        if total {
            let sum: f64 = queues.iter().filter_map(|q| sample.gpu_pct.get(q)).sum();
            let _ = write!(s, "{sum:>10.1}");
        }
        let _ = writeln!(s);
        last = Some(cells);
    }
}

/// The `--explain` part: parent queues' shares, every eviction, and for every job that waited
/// the reason at each cycle (consecutive cycles with the same reason on one line).
fn explain(s: &mut String, out: &ReplayOutcome) {
    let mut parents: Vec<String> = out.parents.values().cloned().collect();
    parents.sort();
    parents.dedup();
    if !parents.is_empty() {
        let _ = writeln!(
            s,
            "\nParent queues over time (what their children hold, % of cluster GPUs; fair share in brackets):"
        );
        share_table(s, out, &parents, false);
    }
    let _ = writeln!(s, "\nEvictions:");
    if out.evicted.is_empty() {
        let _ = writeln!(s, "  none");
    }
    for e in &out.evicted {
        let _ = writeln!(
            s,
            "  {:>6} s  cycle {:>4}  {}: {}",
            e.time, e.cycle, e.pod, e.reason
        );
    }
    let _ = writeln!(
        s,
        "\nWhy jobs waited (the pod's Unschedulable message, word for word as in a cluster):"
    );
    let waited: Vec<_> = out.jobs.iter().filter(|j| !j.waits.is_empty()).collect();
    if waited.is_empty() {
        let _ = writeln!(s, "  no job waited");
    }
    for j in waited {
        let started = j
            .started
            .map_or("never started".into(), |t| format!("started {t}"));
        let _ = writeln!(
            s,
            "  {} ({}), arrived {}, {}:",
            j.job, j.queue, j.arrival, started
        );
        let mut i = 0;
        while i < j.waits.len() {
            let first = &j.waits[i];
            let mut k = i;
            while k + 1 < j.waits.len()
                && j.waits[k + 1].message == first.message
                && j.waits[k + 1].pod == first.pod
            {
                k += 1;
            }
            let last = &j.waits[k];
            let span = if first.time == last.time {
                format!("{} s", first.time)
            } else {
                format!("{}-{} s", first.time, last.time)
            };
            let when = if first.cycle == last.cycle {
                format!("{span}, cycle {}", first.cycle)
            } else {
                format!(
                    "{span}, cycles {}-{} ({} cycles)",
                    first.cycle,
                    last.cycle,
                    k - i + 1
                )
            };
            let _ = writeln!(s, "    {when}: {}: {}", first.pod, first.message);
            i = k + 1;
        }
    }
}

/// The human-readable replay report; `explain` adds [`explain`]'s sections.
pub fn human(out: &ReplayOutcome, explain_waits: bool) -> String {
    let mut s = String::new();
    let pods: u32 = out.jobs.iter().map(|j| j.min_member).sum();
    let queues = leaf_queues(out);
    let _ = writeln!(
        s,
        "Workload {}: {} nodes, {} GPUs; {} jobs in {} queues (gang pods: {pods}).",
        out.workload,
        out.nodes,
        out.gpus,
        out.jobs.len(),
        queues.len()
    );
    let ev: Vec<String> = out
        .evictions
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        s,
        "Scheduling core: {} cycles, {:.1} ms; {} bindings; evictions: {}. Simulated time: {} s.",
        out.cycles,
        out.wall_seconds * 1000.0,
        out.bindings,
        if ev.is_empty() {
            "none".to_string()
        } else {
            ev.join(", ")
        },
        out.makespan
    );
    let _ = writeln!(
        s,
        "\nGPU share per queue over time (% of cluster GPUs; fair share in brackets):"
    );
    share_table(&mut s, out, &queues, true);
    let _ = writeln!(s, "\nJobs (seconds):");
    let _ = writeln!(
        s,
        "{:<22}{:<17}{:>5}{:>9}{:>9}{:>7}{:>10}{:>12}{:>8}",
        "job", "queue", "pods", "arrival", "started", "wait", "finished", "completion", "evicted"
    );
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for j in &out.jobs {
        let _ = writeln!(
            s,
            "{:<22}{:<17}{:>5}{:>9}{:>9}{:>7}{:>10}{:>12}{:>8}",
            j.job,
            j.queue,
            j.min_member,
            j.arrival,
            opt(j.started),
            opt(j.started.map(|t| t - j.arrival)),
            opt(j.finished),
            opt(j.finished.map(|t| t - j.arrival)),
            j.evictions
        );
    }
    let _ = writeln!(
        s,
        "\nPer queue: mean gang wait / mean completion time (finished jobs):"
    );
    let mut per: BTreeMap<&str, (u64, u64, u64, u64)> = BTreeMap::new();
    for j in &out.jobs {
        let e = per.entry(j.queue.as_str()).or_default();
        if let Some(st) = j.started {
            e.0 += st - j.arrival;
            e.1 += 1;
        }
        if let Some(f) = j.finished {
            e.2 += f - j.arrival;
            e.3 += 1;
        }
    }
    let width = per.keys().map(|q| q.len()).max().unwrap_or(0);
    for (q, (w, nw, c, nc)) in per {
        let mean = |a: u64, n: u64| {
            if n == 0 {
                "-".into()
            } else {
                format!("{:.0}", a as f64 / n as f64)
            }
        };
        let _ = writeln!(
            s,
            "  {q:<width$} wait {:>6} s   completion {:>6} s",
            mean(w, nw),
            mean(c, nc)
        );
    }
    if !out.pending.is_empty() {
        let _ = writeln!(s, "\nStill pending at the end:");
        for (pod, msg) in out.pending.iter().take(10) {
            let _ = writeln!(s, "  {pod}: {msg}");
        }
    }
    if explain_waits {
        explain(&mut s, out);
    }
    s
}

/// Queue GPU shares over time as step curves.
pub fn shares_svg(out: &ReplayOutcome) -> String {
    let points = share_points(out);
    line_chart(
        &format!("GPU share per queue: {}", out.workload),
        "time (s)",
        "GPU allocated (% of cluster)",
        (0.0, (out.makespan as f64).max(1.0)),
        (0.0, 100.0),
        &series_of(&points),
    )
}

/// [`shares_svg`]'s chart without the document root, titled `title` (for stacking).
fn shares_chart(out: &ReplayOutcome, title: &str) -> String {
    let points = share_points(out);
    chart_body(
        &Axes {
            title,
            x_label: "time (s)",
            y_label: "GPU allocated (% of cluster)",
            x_range: (0.0, (out.makespan as f64).max(1.0)),
            y_range: (0.0, 100.0),
        },
        &series_of(&points),
    )
}

/// Each leaf queue's GPU share as a step curve.
fn share_points(out: &ReplayOutcome) -> Vec<(String, Vec<(f64, f64)>)> {
    leaf_queues(out)
        .into_iter()
        .map(|q| {
            let mut points = Vec::new();
            let mut prev: Option<f64> = None;
            for s in &out.shares {
                let v = s.gpu_pct.get(&q).copied().unwrap_or(0.0);
                if let Some(p) = prev {
                    points.push((s.time as f64, p));
                }
                points.push((s.time as f64, v));
                prev = Some(v);
            }
            (q, points)
        })
        .collect()
}

fn series_of(points: &[(String, Vec<(f64, f64)>)]) -> Vec<Series<'_>> {
    points
        .iter()
        .map(|(q, p)| Series {
            label: q,
            points: p.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_runs_from_the_compiled_in_copy() {
        let text = run_sample(Path::new("/nonexistent/sample.yaml")).unwrap();
        assert!(text.contains("Workload sample"), "{text}");
        assert!(text.contains("llm-pretrain"), "{text}");
    }

    #[test]
    fn replay_accepts_only_the_core_policy() {
        let e = run_workload(
            &default_workload_path(),
            Policy::Fgd,
            &Outputs::default(),
            UsageDecay::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("accepted: tessera"), "{e}");
    }
}
