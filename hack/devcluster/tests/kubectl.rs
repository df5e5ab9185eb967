//! Debian's `kubectl` (package `kubernetes-client`) against the development API server:
//! apply (create, unchanged, configured; built-in and custom kinds), get -o yaml, get --watch
//! on a short request timeout, describe pod with events, delete.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{pod, start};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::{Api, PostParams};
use kube::core::Status;
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use serde_json::json;
use tessera_devcluster::kubeconfig;

fn kubectl_on_path() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kubectl"))
            .find(|candidate| candidate.is_file())
    })
}

async fn kubectl(config: &Path, args: &[&str]) -> Output {
    // A private discovery cache: ports get reused between runs with different CRDs.
    let cache = config.with_file_name("kubectl-cache");
    tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .output()
        .await
        .expect("kubectl runs")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

async fn ok(config: &Path, args: &[&str]) -> String {
    let output = kubectl(config, args).await;
    assert!(
        output.status.success(),
        "kubectl {args:?} failed: {}",
        text(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: queues.tessera.dev
spec:
  group: tessera.dev
  scope: Cluster
  names: {plural: queues, singular: queue, kind: Queue, shortNames: [q]}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

fn manifests(dir: &Path, pod_label: &str, quota: u32) -> (PathBuf, PathBuf) {
    let workload = dir.join("workload.yaml");
    std::fs::write(
        &workload,
        format!(
            r#"apiVersion: v1
kind: Namespace
metadata:
  name: ml
---
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  namespace: ml
  labels: {{app: trainer, tier: "{pod_label}", tessera.dev/queue: team-a}}
  annotations: {{tessera.dev/gpu-fraction: "0.5"}}
spec:
  schedulerName: tessera
  containers:
  - name: main
    image: busybox
    env: [{{name: A, value: "1"}}]
    resources:
      limits: {{nvidia.com/gpu: "1"}}
"#
        ),
    )
    .unwrap();
    let queue = dir.join("queue.yaml");
    std::fs::write(
        &queue,
        format!("apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata:\n  name: team-a\nspec:\n  gpu: {{quota: {quota}}}\n"),
    )
    .unwrap();
    (workload, queue)
}

#[tokio::test]
async fn kubectl_apply_get_watch_describe() {
    if kubectl_on_path().is_none() {
        println!(
            "SKIPPED kubectl_apply_get_watch_describe: kubectl is not on PATH (Debian: apt-get install kubernetes-client)"
        );
        return;
    }
    let (server, client) = start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubeconfig");
    kubeconfig::write(&config, &server.url(), None).unwrap();
    println!("{}", ok(&config, &["version", "--client"]).await);

    let crd = dir.path().join("crd.yaml");
    std::fs::write(&crd, CRD).unwrap();
    assert!(
        ok(&config, &["apply", "-f", crd.to_str().unwrap()])
            .await
            .contains("created")
    );

    let (workload, queue) = manifests(dir.path(), "one", 8);
    let out = ok(&config, &["apply", "-f", workload.to_str().unwrap()]).await;
    assert!(
        out.contains("namespace/ml created") && out.contains("pod/trainer created"),
        "{out}"
    );
    let out = ok(&config, &["apply", "-f", workload.to_str().unwrap()]).await;
    assert!(out.contains("pod/trainer unchanged"), "{out}");
    let (workload, _) = manifests(dir.path(), "two", 8);
    let out = ok(&config, &["apply", "-f", workload.to_str().unwrap()]).await;
    assert!(out.contains("pod/trainer configured"), "{out}");

    assert!(
        ok(&config, &["apply", "-f", queue.to_str().unwrap()])
            .await
            .contains("queue.tessera.dev/team-a created")
    );
    let (_, queue) = manifests(dir.path(), "two", 4);
    assert!(
        ok(&config, &["apply", "-f", queue.to_str().unwrap()])
            .await
            .contains("configured")
    );
    let out = ok(
        &config,
        &["get", "q", "team-a", "-o", "jsonpath={.spec.gpu.quota}"],
    )
    .await;
    assert_eq!(out, "4");

    let yaml = ok(
        &config,
        &["get", "pod", "trainer", "-n", "ml", "-o", "yaml"],
    )
    .await;
    for needle in [
        "name: trainer",
        "tier: two",
        "schedulerName: tessera",
        "nvidia.com/gpu: \"1\"",
        "phase: Pending",
    ] {
        assert!(yaml.contains(needle), "missing {needle:?} in:\n{yaml}");
    }

    // A watch with a short request timeout prints the initial state and later changes, then ends.
    let watch = tokio::spawn({
        let config = config.clone();
        async move {
            kubectl(
                &config,
                &[
                    "get",
                    "pods",
                    "-n",
                    "ml",
                    "--watch",
                    "--request-timeout=3s",
                    "-o",
                    "name",
                ],
            )
            .await
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    pods.create(&PostParams::default(), &pod("late-arrival", json!({})))
        .await
        .unwrap();
    let output = watch.await.unwrap();
    let seen = text(&output);
    assert!(
        seen.contains("pod/trainer") && seen.contains("pod/late-arrival"),
        "{seen}"
    );

    // Bind it and record an event the way the coordinator would; describe shows both.
    let binding =
        json!({"metadata": {"name": "trainer"}, "target": {"kind": "Node", "name": "gpu-node-1"}});
    let _: Status = pods
        .create_subresource("binding", "trainer", &PostParams::default(), &binding)
        .await
        .unwrap();
    let uid = pods.get("trainer").await.unwrap().metadata.uid.unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "ml");
    let event = serde_json::from_value(json!({
        "metadata": {"generateName": "trainer-"},
        "involvedObject": {"kind": "Pod", "namespace": "ml", "name": "trainer", "uid": uid, "apiVersion": "v1"},
        "reason": "Scheduled", "message": "Successfully assigned ml/trainer to gpu-node-1",
        "type": "Normal", "source": {"component": "tessera"}, "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
    }))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();
    // Events recorded through events.k8s.io/v1 (kube-runtime's Recorder) show up too.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "tessera-coordinator".into(),
            instance: None,
        },
    );
    let trainer = pods.get("trainer").await.unwrap();
    recorder
        .publish(
            &RecordedEvent {
                type_: EventType::Warning,
                reason: "GpuFragmented".into(),
                note: Some("recorded through events.k8s.io".into()),
                action: "Scheduling".into(),
                secondary: None,
            },
            &trainer.object_ref(&()),
        )
        .await
        .unwrap();
    let waited = ok(
        &config,
        &[
            "wait",
            "--for=condition=PodScheduled",
            "pod/trainer",
            "-n",
            "ml",
            "--timeout=5s",
        ],
    )
    .await;
    assert!(waited.contains("condition met"), "{waited}");
    let wide = ok(&config, &["get", "pods", "-n", "ml", "-o", "wide"]).await;
    let row = wide
        .lines()
        .find(|l| l.starts_with("trainer"))
        .unwrap_or_else(|| panic!("{wide}"));
    for needle in ["0/1", "Pending", "gpu-node-1"] {
        assert!(
            row.contains(needle),
            "server-side table row lacks {needle:?}: {wide}"
        );
    }
    let described = ok(&config, &["describe", "pod", "trainer", "-n", "ml"]).await;
    for needle in [
        "Name:",
        "trainer",
        "gpu-node-1",
        "Status:",
        "Pending",
        "PodScheduled",
        "Successfully assigned ml/trainer",
    ] {
        assert!(
            described.contains(needle),
            "missing {needle:?} in:\n{described}"
        );
    }

    assert!(
        ok(
            &config,
            &["delete", "pod", "trainer", "-n", "ml", "--wait=false"]
        )
        .await
        .contains("deleted")
    );
    let all = ok(&config, &["get", "all", "-n", "ml"]).await;
    assert!(
        all.contains("late-arrival"),
        "pods are in category all: {all}"
    );
    let missing = kubectl(&config, &["get", "pod", "trainer", "-n", "ml"]).await;
    assert!(!missing.status.success());
    assert!(
        text(&missing).contains("NotFound") || text(&missing).contains("not found"),
        "{}",
        text(&missing)
    );
    server.shutdown().await;
}
