//! The `simulate` entry points for Tessera workloads: the bundled sample (no arguments) and
//! `simulate replay --workload FILE [--explain]`, with the human report, JSON and SVG outputs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use thiserror::Error;

use tessera_core::cycle::CycleConfig;

use super::plot::{Series, line_chart};
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
        return run_workload(path, Policy::Tessera, None, None, false);
    }
    let w: Workload = tessera_gpushape::parse_yaml("<bundled sample.yaml>", SAMPLE)?;
    let loaded = w.resolve("<bundled sample.yaml>", &bundled_dir())?;
    Ok(human(&replay(&loaded, &CycleConfig::default()), false))
}

/// Replays a workload file through the scheduling core; writes JSON / SVG when asked and
/// returns the human report (with `explain`, also why each job waited, the evictions and
/// parent queues' shares).
pub fn run_workload(
    path: &Path,
    policy: Policy,
    json: Option<&Path>,
    plot: Option<&Path>,
    explain: bool,
) -> Result<String, RunError> {
    if policy != Policy::Tessera {
        return Err(RunError::Policy(policy));
    }
    let loaded = Workload::load(path, &bundled_dir())?;
    let out = replay(&loaded, &CycleConfig::default());
    let write = |p: &Path, text: String| {
        std::fs::write(p, text).map_err(|source| RunError::Output {
            file: p.display().to_string(),
            source,
        })
    };
    if let Some(p) = json {
        // Plain strings, numbers and maps: serialisation cannot fail.
        write(p, serde_json::to_string_pretty(&out).unwrap_or_default())?;
    }
    if let Some(p) = plot {
        write(p, shares_svg(&out))?;
    }
    Ok(human(&out, explain))
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
    let queues = leaf_queues(out);
    let series: Vec<Series> = queues
        .iter()
        .map(|q| {
            let mut points = Vec::new();
            let mut prev: Option<f64> = None;
            for s in &out.shares {
                let v = s.gpu_pct.get(q).copied().unwrap_or(0.0);
                if let Some(p) = prev {
                    points.push((s.time as f64, p));
                }
                points.push((s.time as f64, v));
                prev = Some(v);
            }
            Series { label: q, points }
        })
        .collect();
    line_chart(
        &format!("GPU share per queue: {}", out.workload),
        "time (s)",
        "GPU allocated (% of cluster)",
        (0.0, (out.makespan as f64).max(1.0)),
        (0.0, 100.0),
        &series,
    )
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
        let e = run_workload(&default_workload_path(), Policy::Fgd, None, None, false).unwrap_err();
        assert!(e.to_string().contains("accepted: tessera"), "{e}");
    }
}
