//! The `simulate` command line, run as a real process: the bundled sample, fill over small CSV
//! files with JSON and SVG output, replay, and errors on bad input.

use std::path::Path;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera-coordinator"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn simulate_without_arguments_runs_the_sample() {
    let o = run(&["simulate"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Workload sample"), "{out}");
    assert!(out.contains("GPU share per queue over time"), "{out}");
    assert!(out.contains("llm-pretrain"), "{out}");
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
                     n0,32000,65536,4,T4\nn1,32000,65536,2,T4\nn2,16000,65536,1,P100\n";

fn pods_csv() -> String {
    let mut s = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for i in 0..30 {
        let (n, m) = match i % 5 {
            0 => (0, 0),
            1 => (1, 1000),
            2 => (2, 1000),
            _ => (1, 200 + 100 * (i % 4)),
        };
        s.push_str(&format!(
            "p{i:02},{},{},{n},{m},\n",
            1000 + 500 * (i % 3),
            1024
        ));
    }
    s
}

#[test]
fn fill_writes_json_and_svg_for_all_policies() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = write(dir.path(), "nodes.csv", NODES);
    let pods = write(dir.path(), "pods.csv", &pods_csv());
    let json = dir.path().join("out.json");
    let svg = dir.path().join("out.svg");
    let o = run(&[
        "simulate",
        "fill",
        "--openb-nodes",
        &nodes,
        "--openb-pods",
        &pods,
        "--policy",
        "all",
        "--seed",
        "3",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("GPU milli allocated (end) %"), "{out}");
    assert!(out.contains("q2_lack_gpu"), "{out}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let policies = doc["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 7);
    for p in policies {
        for key in [
            "policy",
            "placed",
            "failed",
            "wall_seconds",
            "gpu_milli_alloc_ratio",
            "curve",
        ] {
            assert!(p.get(key).is_some(), "missing {key} in {p}");
        }
        let curve = p["curve"].as_array().unwrap();
        assert!(!curve.is_empty());
        assert!(curve[0]["arrived_pct"].is_u64() && curve[0]["alloc_pct"].is_f64());
        let last = curve.last().unwrap()["arrived_pct"].as_u64().unwrap();
        // Tuning stops at the first clone that would pass 130%, so a tiny trace may end early.
        assert!((100..=131).contains(&last), "curve ends at {last}");
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tessera") && svg.contains("polyline"));
}

#[test]
fn fill_seed_range_reports_means() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = write(dir.path(), "nodes.csv", NODES);
    let pods = write(dir.path(), "pods.csv", &pods_csv());
    let args = [
        "simulate",
        "fill",
        "--openb-nodes",
        &nodes,
        "--openb-pods",
        &pods,
    ];
    let o = bin()
        .args(args)
        .args(["--seeds", "1-3", "--policy", "fgd,tessera"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("mean of 3 generated orders"), "{out}");
    let again = bin()
        .args(args)
        .args(["--seeds", "1-3", "--policy", "fgd,tessera"])
        .output()
        .unwrap();
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("wall") && !l.contains("VmHWM"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        strip(&out),
        strip(&text(&again).0),
        "same seeds, same numbers"
    );
}

#[test]
fn fill_rejects_bad_input_with_location() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = write(dir.path(), "nodes.csv", NODES);
    let pods = write(
        dir.path(),
        "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\np1,x,1,1,1\n",
    );
    let o = run(&[
        "simulate",
        "fill",
        "--openb-nodes",
        &nodes,
        "--openb-pods",
        &pods,
    ]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("line 3, column `cpu_milli`"), "{err}");
    let o = run(&[
        "simulate",
        "fill",
        "--openb-nodes",
        &nodes,
        "--openb-pods",
        &pods,
        "--policy",
        "magic",
    ]);
    assert!(text(&o).1.contains("unknown policy `magic`"));
}

#[test]
fn replay_writes_outputs_and_rejects_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let w = write(
        dir.path(),
        "w.yaml",
        "nodes:\n  - {shape: l40s-4x-pcie, count: 2}\nqueues:\n  - {name: a, gpu: {quota: 4}}\n  - {name: b, gpu: {quota: 4}}\n\
         jobs:\n  - {name: x, queue: a, duration: 100, replicas: 2, gpus: 2}\n  - {name: y, queue: b, arrival: 10, duration: 50, gpus: 1, fraction: 0.5, repeat: 3, every: 5}\n",
    );
    let json = dir.path().join("r.json");
    let svg = dir.path().join("r.svg");
    let o = run(&[
        "simulate",
        "replay",
        "--workload",
        &w,
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("y-2"), "{out}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4);
    assert!(
        jobs.iter().all(|j| j["finished"].is_u64()),
        "every job finishes: {jobs:?}"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let bad = write(
        dir.path(),
        "bad.yaml",
        "nodes: []\njobs:\n  - {name: z, duration: 10, gpus: 1, fraction: 2}\n",
    );
    let o = run(&["simulate", "replay", "--workload", &bad]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("jobs[0] (z).fraction"), "{err}");
}

#[test]
fn replay_with_usage_history_runs_without_it_too_and_says_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let svg = dir.path().join("r.svg");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/workloads/sample.yaml");
    let o = run(&[
        "simulate",
        "replay",
        "--workload",
        sample.to_str().unwrap(),
        "--usage-half-life-secs",
        "1800",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("What usage history changed (half-life 1800 s): without -> with"),
        "{out}"
    );
    assert!(
        out.contains("nightly (product-batch, 24 jobs): mean gang wait"),
        "{out}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for run in ["without_usage_history", "with_usage_history"] {
        assert!(doc[run]["jobs"].is_array(), "{run}");
    }
    assert!(
        doc["with_usage_history"]["shares"][1]["usage_factor"]["research"].is_f64(),
        "the factors are in the JSON"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.contains("With usage history (half-life 1800 s)"),
        "{plot}"
    );
    assert!(
        plot.matches("<g transform").count() >= 2,
        "both runs stacked"
    );
    // A window without a half-life would do nothing: refused, saying what to give.
    let o = run(&[
        "simulate",
        "replay",
        "--workload",
        sample.to_str().unwrap(),
        "--usage-window-secs",
        "600",
    ]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("--usage-window-secs 600") && err.contains("--usage-half-life-secs"),
        "{err}"
    );
}

#[test]
fn replay_explain_says_why_each_job_waited_and_what_parents_hold() {
    let dir = tempfile::tempdir().unwrap();
    // x (not preemptible) fills the node; y waits for it to finish.
    let w = write(
        dir.path(),
        "w.yaml",
        "nodes:\n  - {shape: l40s-4x-pcie, count: 1}\nqueues:\n  - {name: org, gpu: {quota: 4}}\n  - {name: a, parent: org, gpu: {quota: 2}}\n  - {name: b, parent: org, gpu: {quota: 2}}\n\
         jobs:\n  - {name: x, queue: a, duration: 100, replicas: 4, gpus: 1, priority: 150}\n  - {name: y, queue: b, arrival: 10, duration: 50, gpus: 2}\n",
    );
    let json = dir.path().join("r.json");
    let o = run(&[
        "simulate",
        "replay",
        "--workload",
        &w,
        "--explain",
        "--json",
        json.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Why jobs waited"), "{out}");
    assert!(out.contains("  y (b), arrived 10, started 100:"), "{out}");
    assert!(out.contains("Parent queues over time"), "{out}");
    // Nothing can be evicted (x is not preemptible), so the nodes are the whole reason.
    let reason = "0/1 nodes are available: 1 node(s) had fewer than 2 free GPUs.";
    assert!(
        out.contains(&format!("10 s, cycle 2: y-0: {reason}")),
        "{out}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let y = doc["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "y")
        .unwrap();
    let waits = y["waits"].as_array().unwrap();
    assert_eq!(waits[0]["time"], 10, "{waits:?}");
    assert!(
        waits
            .iter()
            .all(|w| w["message"].as_str().unwrap().starts_with(reason))
    );
    for s in doc["shares"].as_array().unwrap() {
        let pct = &s["gpu_pct"];
        let (org, a, b) = (
            pct["org"].as_f64().unwrap(),
            pct["a"].as_f64().unwrap(),
            pct["b"].as_f64().unwrap(),
        );
        assert!((org - a - b).abs() < 1e-9, "{s}");
    }
    // Without --explain the report stays short.
    let o = run(&["simulate", "replay", "--workload", &w]);
    assert!(!text(&o).0.contains("Why jobs waited"));
}
