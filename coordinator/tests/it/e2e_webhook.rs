//! Coexistence with kube-scheduler on the real kube-apiserver: the chart's
//! MutatingWebhookConfiguration (rendered by the real helm, its CEL match conditions evaluated
//! by the real API server) sends default-scheduler GPU pods to the coordinator's webhook over
//! TLS, which routes them to Tessera. A Deployment of 20 one-GPU pods against a node with two
//! GPUs (the agent advertises 20 slots) then runs two pods on whole GPUs and leaves 18
//! Pending with Tessera's reason; none fails admission, the ReplicaSet creates no pod beyond
//! its 20, and the coordinator's accounting matches the node's.

use crate::e2e;

use crate::tls;

use std::collections::BTreeSet;
use std::path::Path;

use e2e::{E2e, NS, Setup, assignment_of, unschedulable_message};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde::Deserialize;
use serde_json::json;
use tessera_coordinator::webhook::{WebhookConfig, WebhookHandle};

/// The chart's MutatingWebhookConfiguration, as the real helm renders it, pointed at `url`
/// (the test's coordinator is a process here, not behind the chart's Service).
fn chart_webhook(url: &str, ca_pem: &str) -> MutatingWebhookConfiguration {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tessera");
    let chart = chart.to_string_lossy();
    let out = tessera_testcluster::helm(
        &[
            "template",
            "tessera",
            &chart,
            "--namespace",
            "tessera-system",
            "--show-only",
            "templates/webhook.yaml",
        ],
        None,
    );
    assert!(out.success, "helm template: {}", out.stderr);
    let mut config: MutatingWebhookConfiguration =
        serde_yaml_ng::Deserializer::from_str(&out.stdout)
            .filter_map(|doc| {
                let value = serde_yaml_ng::Value::deserialize(doc).ok()?;
                (value.get("kind")?.as_str()? == "MutatingWebhookConfiguration")
                    .then(|| serde_yaml_ng::from_value(value).unwrap())
            })
            .next()
            .expect("the chart renders a MutatingWebhookConfiguration");
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config = WebhookClientConfig {
            url: Some(url.to_owned()),
            ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
            service: None,
        };
    }
    config
}

fn gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
    }))
    .unwrap()
}

/// `replicas` one-GPU pods labelled `app: <name>`, naming no scheduler.
fn deployment(name: &str, replicas: u32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "cuda",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            },
        },
    }))
    .unwrap()
}

/// The scheduler a pod created now in `namespace` would get (a dry run: admission runs,
/// nothing is stored).
async fn routed_scheduler(client: &kube::Client, namespace: &str, pod: &Pod) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let created = pods.create(&params, pod).await.expect("dry-run create");
    created
        .spec
        .and_then(|s| s.scheduler_name)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_scheduler_gpu_pods_are_routed_and_none_fails_admission() {
    let e2e = E2e::start(Setup::two_gpus().with_kube_scheduler()).await;
    let ca = tls::write_pair(e2e.dir.path());
    let webhook = WebhookHandle::start(WebhookConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert_file: e2e.dir.path().join("tls.crt"),
        key_file: e2e.dir.path().join("tls.key"),
        scheduler_name: "tessera".into(),
        reload_every: std::time::Duration::from_secs(10),
    })
    .await
    .expect("the webhook starts");
    let url = format!("https://{}/mutate-pods", webhook.addr());
    let configs: Api<MutatingWebhookConfiguration> = Api::all(e2e.client.clone());
    configs
        .create(&PostParams::default(), &chart_webhook(&url, &ca))
        .await
        .expect("the API server accepts the chart's webhook configuration");

    // The API server picks the configuration up within a moment: a dry run shows when.
    let probe = gpu_pod("probe", 1);
    e2e.wait_until("the webhook to route a GPU pod", || async {
        (routed_scheduler(&e2e.client, NS, &probe).await == "tessera").then_some(())
    })
    .await;
    // Not sent, or kept: a pod without GPUs, another scheduler's, and any pod in a namespace
    // that opted out.
    let mut cpu = gpu_pod("cpu", 0);
    cpu.spec.as_mut().unwrap().containers[0].resources = None;
    assert_eq!(
        routed_scheduler(&e2e.client, NS, &cpu).await,
        "default-scheduler"
    );
    let mut volcano = gpu_pod("volcano", 1);
    volcano.spec.as_mut().unwrap().scheduler_name = Some("volcano".into());
    assert_eq!(routed_scheduler(&e2e.client, NS, &volcano).await, "volcano");
    let opted_out: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "legacy", "labels": {"tessera.dev/webhook": "disabled"}},
    }))
    .unwrap();
    Api::<Namespace>::all(e2e.client.clone())
        .create(&PostParams::default(), &opted_out)
        .await
        .unwrap();
    e2e.wait_until("the legacy namespace's ServiceAccount", || async {
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(e2e.client.clone(), "legacy")
            .get("default")
            .await
            .ok()
    })
    .await;
    assert_eq!(
        routed_scheduler(&e2e.client, "legacy", &probe).await,
        "default-scheduler"
    );

    // What the webhook prevents, shown in the namespace that opted out: kube-scheduler
    // admits three one-GPU pods onto the 20 slots; the agent hands out its two GPUs whole and
    // the third pod fails admission (and its ReplicaSet would recreate it forever).
    let legacy: Api<Deployment> = Api::namespaced(e2e.client.clone(), "legacy");
    legacy
        .create(&PostParams::default(), &deployment("unrouted", 3))
        .await
        .unwrap();
    let legacy_pods: Api<Pod> = Api::namespaced(e2e.client.clone(), "legacy");
    let failed = e2e
        .wait_until("an unrouted pod to fail admission", || async {
            let pods = legacy_pods.list(&ListParams::default()).await.ok()?.items;
            pods.into_iter().find_map(|p| {
                let status = p.status?;
                (status.phase.as_deref() == Some("Failed"))
                    .then(|| status.reason.unwrap_or_default())
            })
        })
        .await;
    assert_eq!(failed, "UnexpectedAdmissionError");
    legacy
        .patch(
            "unrouted",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    // Only once the ReplicaSet has seen the scale-down does it stop replacing failed pods: a
    // delete before that can miss a replacement made meanwhile.
    let sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(e2e.client.clone(), "legacy");
    e2e.wait_until(
        "the unrouted ReplicaSet to observe zero replicas",
        || async {
            let all = sets.list(&ListParams::default()).await.ok()?.items;
            (!all.is_empty()
                && all.iter().all(|rs| {
                    rs.spec.replicas == Some(0)
                        && rs.status.as_ref().and_then(|s| s.observed_generation)
                            == rs.metadata.generation
                }))
            .then_some(())
        },
    )
    .await;
    // A ReplicaSet leaves its failed pods behind (pod GC collects them much later).
    legacy_pods
        .delete_collection(
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &ListParams::default(),
        )
        .await
        .unwrap();
    e2e.wait_until("the unrouted pods to be gone", || async {
        legacy_pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;

    // The scenario: 20 × 1 GPU from a Deployment that names no scheduler.
    Api::<Deployment>::namespaced(e2e.client.clone(), NS)
        .create(&PostParams::default(), &deployment("foreign", 20))
        .await
        .unwrap();
    let list = ListParams::default().labels("app=foreign");
    let (running, pending) = e2e
        .wait_until("2 foreign pods running and 18 unschedulable", || async {
            let pods = e2e.pods().list(&list).await.ok()?.items;
            let running: Vec<Pod> = pods
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .cloned()
                .collect();
            let pending: Vec<String> = pods.iter().filter_map(unschedulable_message).collect();
            (running.len() == 2 && pending.len() == 18).then_some((running, pending))
        })
        .await;
    // Each running pod got its own whole GPU from Tessera.
    let gpus: BTreeSet<String> = running
        .iter()
        .flat_map(|p| {
            assert_eq!(
                p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
                Some("tessera")
            );
            assignment_of(p)
                .slices()
                .map(|s| {
                    assert_eq!(s.compute_milli, 1000, "a whole GPU");
                    s.uuid.clone()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(gpus.len(), 2, "two distinct GPUs: {gpus:?}");
    // The 18 others wait for a GPU, in Tessera's words.
    // The coordinator counts the node's two GPUs as taken, as the node says.
    assert!(
        pending
            .iter()
            .all(|m| m.starts_with("0/1 nodes are available: 1 node(s) had no free GPU.")),
        "{pending:?}"
    );

    // Nothing churns: no pod failed admission and the ReplicaSet made no replacement.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let history = e2e.history();
    let created: BTreeSet<&str> = history
        .iter()
        .filter(|s| s.name.starts_with("foreign-"))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        created.len(),
        20,
        "the ReplicaSet replaced pods: {created:?}"
    );
    assert!(
        !history
            .iter()
            .any(|s| s.name.starts_with("foreign-") && s.phase.as_deref() == Some("Failed")),
        "a foreign pod failed"
    );
    for pod in e2e.pods().list(&list).await.unwrap().items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let events = e2e.events_of(&name).await;
        assert!(
            !events
                .iter()
                .any(|(reason, _)| reason == "UnexpectedAdmissionError"),
            "{name}: {events:?}"
        );
    }
    webhook.stop().await;
    e2e.shutdown().await;
}
