//! `tessera-devcluster up` as a real process: prints the address, writes a kubeconfig once the
//! server answers, registers the described nodes, and stops cleanly on SIGINT (Ctrl-C).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

#[tokio::test]
async fn up_writes_kubeconfig_registers_nodes_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let description = dir.path().join("cluster.yaml");
    let mig_shape =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpus/a100-8x-mig.yaml");
    std::fs::write(
        &description,
        format!(
            "token: dev-token\nnodes:\n- name: h100\n  replicas: 2\n  labels: {{topology.tessera.dev/rack: r1}}\n  gpus: {{count: 8, model: NVIDIA H100 80GB HBM3, memoryMib: 81559}}\n- name: a100\n  gpuFile: {}\n",
            mig_shape.display()
        ),
    )
    .unwrap();
    let kubeconfig = dir.path().join("kube").join("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-devcluster"))
        .args(["up", "--port", "0", "--config"])
        .arg(&description)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let first_line = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let first = reader.read_line(&mut line).map(|_| line);
        // Keep draining so the child never writes into a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        first
    })
    .await
    .unwrap()
    .unwrap();
    let url = first_line
        .trim()
        .strip_prefix("API server: ")
        .unwrap_or_else(|| panic!("{first_line}"))
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    // The kubeconfig exists once the address is printed and carries the token.
    let kube_config = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kube_config, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), url);
    let client = kube::Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let names: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a100", "h100-0", "h100-1"]);
    let h100 = nodes.get("h100-1").await.unwrap();
    assert_eq!(
        h100.status.unwrap().capacity.unwrap()["nvidia.com/gpu"].0,
        "8"
    );
    assert_eq!(
        h100.metadata.labels.unwrap()["topology.tessera.dev/rack"],
        "r1"
    );

    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "tessera-devcluster did not stop on SIGINT"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn bad_description_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let description = dir.path().join("cluster.yaml");
    std::fs::write(&description, "nodes:\n- name: a\n  gpus: {count: many}\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_tessera-devcluster"))
        .args(["up", "--config"])
        .arg(&description)
        .arg("--kubeconfig")
        .arg(dir.path().join("kc"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("count") && stderr.contains("expected"),
        "{stderr}"
    );
}
