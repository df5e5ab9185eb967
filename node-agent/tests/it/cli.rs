//! The `tessera-agent` binary: `run` against a fake kubelet, then `status` and
//! `topology` over the admin socket (snapshot-tested), and its refusals.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{AgentProcess, BIN, WAIT, refs, shape};
use tessera_agent::gpu::short_uuid;
use tessera_agent::gpu::sim::SimBackend;
use tessera_device_plugin::testing::FakeKubelet;

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn run_then_status_and_topology_over_the_admin_socket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("dp")).unwrap();
    let kubelet = FakeKubelet::start(&dir.path().join("dp")).await.unwrap();
    let _agent = AgentProcess::spawn(dir.path(), "l40s-4x-pcie.yaml", None);
    let plugin = kubelet
        .wait_for_plugin("nvidia.com/gpu", WAIT)
        .await
        .unwrap();
    let devices = plugin
        .devices()
        .wait_until(|d| d.len() == 40, WAIT)
        .await
        .unwrap();
    let all: Vec<String> = devices.into_iter().map(|d| d.id).collect();
    let pair = plugin
        .preferred_allocation(&refs(&all), &[], 2)
        .await
        .unwrap();
    plugin.allocate_one(&refs(&pair)).await.unwrap();

    let socket = dir.path().join("admin.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let socket = socket.to_str().unwrap();

    let sim = SimBackend::from_file(shape("l40s-4x-pcie.yaml")).unwrap();
    let short: Vec<String> = (0..4)
        .map(|i| short_uuid(sim.uuid_of(i).unwrap()).to_owned())
        .collect();
    let (ok, status, err) = cli(&["status", "--admin-socket", socket]);
    assert!(ok, "{err}");
    let expected = format!(
        "\
node node-a   gpu backend sim   assignments none
GPU  UUID      MODEL                         MEMORY MiB  UTIL HEALTH          SHARES  NVLINK
0    {0}  L40S                             0/46068    0% healthy          10/10  -
     - [-]                            share 100%  limit  46068 MiB  used      - MiB  util    -  enforce none  (whole)
1    {1}  L40S                             0/46068    0% healthy          10/10  -
     - [-]                            share 100%  limit  46068 MiB  used      - MiB  util    -  enforce none  (whole)
2    {2}  L40S                             0/46068    0% healthy           0/10  -
3    {3}  L40S                             0/46068    0% healthy           0/10  -
",
        short[0], short[1], short[2], short[3]
    );
    assert_eq!(status, expected);

    let (ok, json, _) = cli(&["status", "--admin-socket", socket, "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["gpus"][0]["shares_used"], 10);
    assert_eq!(v["gpus"][0]["pods"][0]["memory_limit_mib"], 46068);

    let (ok, topo, _) = cli(&["topology", "--admin-socket", socket]);
    assert!(ok);
    let matrix: Vec<&str> = topo.lines().take(5).collect();
    assert_eq!(
        matrix,
        [
            "         GPU0   GPU1   GPU2   GPU3   NUMA",
            "GPU0        X   NODE    SYS    SYS      0",
            "GPU1     NODE      X    SYS    SYS      0",
            "GPU2      SYS    SYS      X   NODE      1",
            "GPU3      SYS    SYS   NODE      X      1",
        ]
    );

    // XID through the CLI (simulated backend): GPU 2's slots go unhealthy.
    let (ok, _, err) = cli(&[
        "inject-xid",
        "--admin-socket",
        socket,
        "--gpu",
        "2",
        "--xid",
        "79",
    ]);
    assert!(ok, "{err}");
    plugin
        .devices()
        .wait_until(
            |d| d.iter().filter(|x| x.health == "Unhealthy").count() == 10,
            WAIT,
        )
        .await
        .unwrap();
    let (_, status, _) = cli(&["status", "--admin-socket", socket]);
    assert!(status.contains("unhealthy:79"), "{status}");
}

#[test]
fn refusals_are_clear_and_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let base = [
        "run",
        "--node-name",
        "n",
        "--state-dir",
        d,
        "--device-plugin-dir",
        d,
        "--metrics-addr",
        "none",
    ];
    // Without the NVIDIA driver, `nvml` is refused; with one, the agent simply runs
    // (and is stopped here).
    let admin = format!("{d}/a.sock");
    let mut child = Command::new(BIN)
        .args([&base[..], &["--no-kube", "--admin-socket", &admin]].concat())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
        let _ = child.wait();
    } else {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("NVML not available: "),
            "{err}"
        );
    }
    let (ok, _, err) = cli(&[&base[..], &["--no-kube", "--gpu-backend", "cuda"]].concat());
    assert!(
        !ok && err.contains("expected `nvml` or `sim:<file.yaml>`"),
        "{err}"
    );
    // No agent behind the socket.
    let (ok, _, err) = cli(&["status", "--admin-socket", &admin]);
    assert!(!ok && err.contains("admin socket"), "{err}");
}

#[test]
fn probe_reads_the_backend_without_an_agent() {
    let sim = format!("sim:{}", shape("a100-8x-mig.yaml").display());
    let (ok, out, err) = cli(&["probe", "--gpu-backend", &sim, "--json"]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["backend"], "sim");
    assert_eq!(report["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(report["failures"], serde_json::json!([]));
    let mig = report["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| !g["mig_profiles"].is_null())
        .expect("a GPU in MIG mode");
    assert!(!mig["mig_profiles"].as_array().unwrap().is_empty());

    let (ok, out, err) = cli(&["probe", "--gpu-backend", &sim, "--events-secs", "0.05"]);
    assert!(ok, "{err}");
    assert!(out.contains("XID events in"), "{out}");
    assert!(out.contains("all backend calls succeeded"), "{out}");

    let (ok, _, err) = cli(&["probe", "--gpu-backend", &sim, "--events-secs=-1"]);
    assert!(!ok);
    assert!(err.contains("--events-secs"), "{err}");
}

#[test]
fn json_logs_are_one_object_per_line_in_the_coordinators_layout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("dp")).unwrap();
    // No kubelet socket: the agent starts, logs that it waits for it, and keeps running.
    let mut child = Command::new(BIN)
        .args(["run", "--log-format", "json", "--node-name", "node-a"])
        .args([
            "--no-kube",
            "--coordinator",
            "none",
            "--metrics-addr",
            "none",
        ])
        .arg("--gpu-backend")
        .arg(format!("sim:{}", shape("l40s-4x-pcie.yaml").display()))
        .arg("--device-plugin-dir")
        .arg(dir.path().join("dp"))
        .arg("--pod-resources-socket")
        .arg(dir.path().join("pr.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--admin-socket")
        .arg(dir.path().join("admin.sock"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{line}"
        );
        assert!(
            v["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{line}"
        );
    }
}

/// `tessera-agent run` with its log redirected to a file (as a container runtime collects it),
/// before any coordinator answers: the text log carries no ANSI escape (colour is for
/// terminals only) and says once what it waits for; `--log-format json` writes one JSON object
/// per line.
#[tokio::test]
async fn a_log_file_has_no_colour_codes_and_json_lines_parse() {
    let dir = tempfile::tempdir().unwrap();
    // A coordinator address nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    for format in ["text", "json"] {
        let run = dir.path().join(format);
        std::fs::create_dir_all(run.join("dp")).unwrap();
        let log = run.join("agent.log");
        let mut command = AgentProcess::command(&run, "l40s-4x-pcie.yaml", &closed.to_string());
        command
            .args(["--coordinator-token-file", "none", "--log-format", format])
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stderr(std::fs::File::create(&log).unwrap());
        let agent = AgentProcess::start(command);
        let deadline = std::time::Instant::now() + WAIT * 4;
        let logged = loop {
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            if logged.contains("waiting for the coordinator") {
                break logged;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no word about the coordinator in the {format} log:\n{logged}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        drop(agent);
        assert!(
            !logged.contains('\u{1b}'),
            "an ANSI escape in a {format} log written to a file:\n{logged}"
        );
        if format == "json" {
            for line in logged.lines().filter(|l| l.ends_with('}')) {
                let value: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                assert!(value["level"].is_string(), "{line}");
            }
        }
    }
}
