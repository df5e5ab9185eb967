//! `tessera-coordinator run` with its log redirected to a file, as a container runtime or a
//! `> coordinator.log` collects it, against a real kube-apiserver (hack/k8s): text logs carry
//! no ANSI escape (colour is for terminals only), and `--log-format json` writes one JSON
//! object per line.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use tessera_testcluster::{Cluster, ClusterOptions, eventually};

/// The coordinator process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_coordinator(kubeconfig: &Path, log: &Path, format: &str) -> Running {
    let file = std::fs::File::create(log).expect("the log file");
    let child = Command::new(env!("CARGO_BIN_EXE_tessera-coordinator"))
        .args([
            "run",
            "--identity",
            "log-test",
            "--lease-namespace",
            "default",
            "--agent-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--agent-auth",
            "none",
            "--log-format",
            format,
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("the coordinator starts");
    Running(child)
}

async fn wait_for_line(log: &Path, text: &str) -> String {
    eventually(&format!("{text:?} in {}", log.display()), || async {
        let logged = std::fs::read_to_string(log).ok()?;
        logged.contains(text).then_some(logged)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_file_has_no_colour_codes_and_json_lines_parse() {
    let cluster = Cluster::start(ClusterOptions::default());
    let kubeconfig = cluster.admin_kubeconfig();
    let dir = tempfile::tempdir().expect("a temporary directory");

    let text_log = dir.path().join("text.log");
    let coordinator = run_coordinator(&kubeconfig, &text_log, "text");
    let logged = wait_for_line(&text_log, "leading: scheduling").await;
    drop(coordinator);
    assert!(
        !logged.contains('\u{1b}'),
        "an ANSI escape in a log written to a file:\n{logged}"
    );
    assert!(logged.contains(" INFO "), "{logged}");

    let json_log = dir.path().join("json.log");
    let coordinator = run_coordinator(&kubeconfig, &json_log, "json");
    wait_for_line(&json_log, "leading: scheduling").await;
    drop(coordinator);
    // Only whole lines: the process was killed, a last line may be cut.
    let logged = std::fs::read_to_string(&json_log).expect("the JSON log");
    let lines: Vec<&str> = logged.lines().filter(|l| l.ends_with('}')).collect();
    assert!(!lines.is_empty(), "{logged}");
    for line in lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            value["level"].is_string() && value["fields"]["message"].is_string(),
            "{line}"
        );
    }
}
