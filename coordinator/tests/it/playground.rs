//! `hack/playground` as a new user meets it: the README's playground block, run as written
//! (only its directory replaced by a temporary one), on the real kube-apiserver and
//! controllers, kubelet-lite nodes and real `tessera-agent` and `tessera-coordinator`
//! processes. The notebook and the 64-GPU training gang from `examples/` run, the notebook's
//! share shows in `tessera-agent status` and in `kubectl tessera gpus` (the plugin on the
//! playground's PATH, through kubectl's plugin mechanism), `kubectl tessera queues` shows the
//! example tree, a second gang waits with the core's reason, `kubectl tessera why` explains
//! it node by node, and `down` leaves no process behind.

use std::path::{Path, PathBuf};
use std::process::Command;

const README_DIR: &str = "/tmp/tessera-playground";
const MARKER: &str = "<!-- playground-steps:";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shell block after the README's playground marker.
fn readme_steps() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let after = readme
        .split_once(MARKER)
        .expect("README.md has the playground-steps marker")
        .1;
    let block = after
        .split_once("```sh\n")
        .expect("a sh block follows the marker")
        .1;
    block
        .split_once("```")
        .expect("the block is closed")
        .0
        .to_owned()
}

/// The pids `up` recorded (DIR/pids: `name pid` lines).
fn recorded_pids(dir: &Path) -> Vec<(String, u32)> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once(' ')?;
            Some((name.to_owned(), pid.trim().parse().ok()?))
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Runs `hack/playground down` when the test ends, passed or not, so no process outlives it.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if !self.0.join("pids").exists() {
            return;
        }
        let _ = Command::new(repo().join("hack/playground"))
            .args(["down", "--dir"])
            .arg(&self.0)
            .status();
    }
}

#[test]
fn the_readme_playground_steps_run_as_written() {
    let bins = Path::new(env!("CARGO_BIN_EXE_tessera-coordinator"))
        .parent()
        .expect("the binary's directory")
        .to_owned();
    for (bin, package) in [
        ("tessera-agent", "tessera-agent"),
        ("kubectl-tessera", "kubectl-tessera"),
    ] {
        assert!(
            bins.join(bin).exists(),
            "{} has no {bin}: build it first (cargo build -p {package}; cargo test --workspace does)",
            bins.display()
        );
    }
    let kube_peer = tessera_testcluster::kube_peer().unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pg");
    let _down = Down(dir.clone());
    let steps = readme_steps();
    assert!(steps.contains(&format!("hack/playground up --dir {README_DIR}")));
    assert!(steps.contains(&format!("hack/playground down --dir {README_DIR}")));
    let script = steps.replace(README_DIR, &dir.display().to_string());

    // `up` runs as its own command first so the processes it starts can be checked after `down`.
    let (up, rest) = script.split_once('\n').unwrap();
    let run = |text: &str| {
        Command::new("bash")
            .args(["-euo", "pipefail", "-c", text])
            .current_dir(repo())
            .env("TESSERA_BIN_DIR", &bins)
            .env("KUBE_PEER", kube_peer)
            .env_remove("KUBECONFIG")
            .output()
            .expect("bash runs")
    };
    let out = run(up);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "playground up failed:\n{stderr}");
    let started = recorded_pids(&dir);
    // The control plane, and a kubelet and an agent for each of the ten nodes, and the
    // coordinator.
    assert_eq!(started.len(), 1 + 2 * 10 + 1, "{started:?}");
    assert!(started.iter().all(|(_, pid)| alive(*pid)), "{started:?}");
    assert!(dir.join("kubeconfig").exists() && dir.join("l40s-0.sock").exists());

    let out = run(rest);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs = || {
        ["coordinator", "l40s-0-agent"]
            .iter()
            .map(|n| {
                let text =
                    std::fs::read_to_string(dir.join(format!("logs/{n}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!(
                    "--- {n}.log (last lines, newest first)\n{}",
                    tail.join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        out.status.success(),
        "the README steps failed:\n{stdout}\n{stderr}\n{}",
        logs()
    );
    // Every gang member on its own H100 box, the notebook on the L40S box.
    for i in 0..8 {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("llama-pretrain-{i}-"))
                    && l.contains("Running")
                    && l.contains(" h100-")),
            "gang member {i} is not running on an H100 box:\n{stdout}"
        );
    }
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("notebook-alice ") && l.contains("l40s-0")),
        "{stdout}"
    );
    // tessera-agent status: the notebook's quarter of one GPU.
    assert!(
        stdout.contains("default/notebook-alice [jupyter] share  25%"),
        "{stdout}"
    );
    // kubectl tessera gpus: the notebook's quarter of an L40S (the block waits for that
    // node's view; the others may lag it by a report).
    assert!(
        stdout.lines().any(|l| l.starts_with("l40s-0 ")
            && l.contains("default/notebook-alice (jupyter)")
            && l.contains(" 25% ")),
        "{stdout}"
    );
    // kubectl tessera queues: the example tree.
    let lines: Vec<&str> = stdout.lines().collect();
    let research = lines
        .iter()
        .position(|l| l.starts_with("research "))
        .unwrap_or_else(|| panic!("no research queue in:\n{stdout}"));
    assert!(
        lines[research + 1].starts_with("├─ team-a")
            && lines[research + 2].starts_with("└─ team-b"),
        "{stdout}"
    );
    // kubectl tessera why: the waiting gang member, node by node.
    assert!(
        stdout.contains("Pod default/llama-finetune-")
            && stdout.contains("The coordinator says (Unschedulable")
            && stdout.contains("fits once 8 more GPUs are free — held by default/llama-pretrain-"),
        "{stdout}"
    );
    // The waiting gang says why, in the core's words.
    assert!(
        stdout.contains("FailedScheduling")
            && stdout.contains("no topology.tessera.dev/rack domain can hold all its pods"),
        "{stdout}"
    );
    // `down` stopped every process `up` started.
    for (name, pid) in &started {
        assert!(!alive(*pid), "{name} (pid {pid}) still runs after down");
    }
    assert!(!dir.join("pids").exists(), "down leaves no pid file behind");
}
