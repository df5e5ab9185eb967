//! The chart's RBAC against the API calls the code really makes: the coordinator and a real
//! agent run against the dev API server, each with its own ServiceAccount's token, through
//! the main paths (bind, gang, reclaim by eviction, pod and CRD status, events, the leader
//! Lease, TokenReview of the agent's token). The server's audit log records every request;
//! each must be allowed by the rules the chart binds to that ServiceAccount.

mod common;

use std::collections::BTreeSet;

use common::{AGENT_USER, COORDINATOR_USER, Cluster, NAMESPACE, NodeSpec, default_render};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tessera_deploy_check::rbac::{Request, grants_for_service_account};
use tessera_devcluster::apiserver::audit::AuditRecord;

fn pod(name: &str, queue: &str, gpus: u32, priority_class: &str, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"tessera.dev/queue": queue},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "tessera",
            "priorityClassName": priority_class,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
            }],
        },
    }))
    .expect("pod object")
}

fn request(r: &AuditRecord) -> Request {
    Request {
        verb: r.verb.clone(),
        api_group: r.api_group.clone(),
        resource: r.resource.clone(),
        subresource: r.subresource.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    }
}

fn bound(pods: &[Pod], name: &str) -> bool {
    pods.iter().any(|p| {
        p.metadata.name.as_deref() == Some(name)
            && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_covers_every_request() {
    let cluster = Cluster::start(&[NodeSpec::new("gpu-0", 4, true)]).await;
    // The harness records from the start, so the watches, the Lease creation and the
    // agent's TokenReview are in the log too.
    let audit = cluster.server().audit();
    let admin = cluster.admin.clone();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");

    // Two queues: team-a borrows the whole node, team-b (which deserves it) then reclaims.
    for (name, quota) in [("team-a", 0), ("team-b", 4)] {
        cluster
            .apply(&json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"gpu": {"quota": quota, "overQuotaWeight": 1, "limit": -1}},
            }))
            .await;
    }
    cluster
        .apply(&json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "Topology",
            "metadata": {"name": "default"},
            "spec": {"levels": [{"name": "hostname", "nodeLabel": "kubernetes.io/hostname"}]},
        }))
        .await;

    // Borrowers: preemptible (tessera-training, priority 50), bound and allocated by the agent.
    let borrowers: Vec<String> = (0..4).map(|i| format!("borrow-{i}")).collect();
    for name in &borrowers {
        pods.create(
            &PostParams::default(),
            &pod(name, "team-a", 1, "tessera-training", json!({})),
        )
        .await
        .expect("pod created");
    }
    cluster
        .wait_until("the borrowers are bound and allocated", || {
            let cluster = &cluster;
            let borrowers = &borrowers;
            async move {
                let all = cluster.pods("default").await;
                let done = borrowers.iter().all(|b| {
                    all.iter().any(|p| {
                        p.metadata.name.as_ref() == Some(b)
                            && p.metadata
                                .annotations
                                .as_ref()
                                .is_some_and(|a| a.contains_key("tessera.dev/allocated"))
                    })
                });
                done.then_some(())
            }
        })
        .await;

    // Bad input: a pending pod with an Unschedulable condition and an Event.
    pods.create(
        &PostParams::default(),
        &pod(
            "bad-fraction",
            "team-a",
            1,
            "tessera-notebook",
            json!({"tessera.dev/gpu-fraction": "1.5"}),
        ),
    )
    .await
    .expect("pod created");

    // A gang of team-b that only fits by reclaiming two of team-a's GPUs.
    cluster
        .apply(&json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "gang", "namespace": "default"},
            "spec": {"minMember": 2, "queue": "team-b"},
        }))
        .await;
    for name in ["gang-0", "gang-1"] {
        pods.create(
            &PostParams::default(),
            &pod(
                name,
                "team-b",
                1,
                "tessera-inference",
                json!({"tessera.dev/pod-group": "gang"}),
            ),
        )
        .await
        .expect("pod created");
    }
    cluster
        .wait_until("the gang is bound after reclaim", || {
            let cluster = &cluster;
            async move {
                let all = cluster.pods("default").await;
                (bound(&all, "gang-0") && bound(&all, "gang-1")).then_some(())
            }
        })
        .await;
    // Let the status writers and a few lease renewals run.
    cluster
        .wait_until("the coordinator wrote pod and queue status", || {
            let audit = audit.clone();
            async move {
                let records = audit.records();
                let did = |verb: &str, resource: &str, sub: Option<&str>| {
                    records.iter().any(|r| {
                        r.user == COORDINATOR_USER
                            && r.verb == verb
                            && r.resource == resource
                            && r.subresource.as_deref() == sub
                    })
                };
                (did("patch", "pods", Some("status"))
                    && did("patch", "queues", Some("status"))
                    && did("update", "leases", None))
                .then_some(())
            }
        })
        .await;
    audit.disable();
    let records = audit.records();
    cluster.shutdown().await;

    let docs = default_render();
    let mut missing = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (user, sa) in [
        (COORDINATOR_USER, "tessera-coordinator"),
        (AGENT_USER, "tessera-agent"),
    ] {
        let grants = grants_for_service_account(&docs, NAMESPACE, sa);
        let mut requests = Vec::new();
        for r in records.iter().filter(|r| r.user == user) {
            // Discovery and /version are allowed to every authenticated user
            // (system:discovery, system:basic-user), not by the chart.
            if r.resource.is_empty() {
                continue;
            }
            let req = request(r);
            if !grants.allows(&req) {
                missing.insert(format!("{sa}: {req} (HTTP {}, {})", r.status, r.path));
            }
            seen.insert(format!(
                "{sa}: {} {}/{}{}",
                req.verb,
                req.api_group,
                req.resource,
                req.subresource
                    .as_ref()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default()
            ));
            requests.push(req);
        }
        for unused in grants.unused(&requests) {
            eprintln!("not exercised by this test: {sa}: {unused}");
        }
    }
    eprintln!(
        "requests seen:\n  {}",
        seen.iter().cloned().collect::<Vec<_>>().join("\n  ")
    );
    assert!(
        missing.is_empty(),
        "the chart's RBAC does not allow:\n  {}",
        missing.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    // The paths this test claims to drive really ran.
    for want in [
        "tessera-coordinator: watch /pods",
        "tessera-coordinator: create /pods/binding",
        "tessera-coordinator: create /pods/eviction",
        "tessera-coordinator: patch /pods/status",
        "tessera-coordinator: create /events",
        "tessera-coordinator: patch tessera.dev/queues/status",
        "tessera-coordinator: update coordination.k8s.io/leases",
        "tessera-coordinator: create authentication.k8s.io/tokenreviews",
        "tessera-agent: watch /pods",
        "tessera-agent: patch /pods",
    ] {
        assert!(
            seen.contains(want),
            "{want} was not observed; seen: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_log_records_requests_in_rbac_terms() {
    let cluster = Cluster::start(&[]).await;
    let audit = cluster.server().audit();
    audit.disable();
    audit.clear();
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod("before", "default", 1, "tessera-notebook", json!({})),
    )
    .await
    .expect("pod created");
    assert!(audit.records().is_empty(), "off until enabled");
    audit.enable();
    pods.create(
        &PostParams::default(),
        &pod("p", "default", 1, "tessera-notebook", json!({})),
    )
    .await
    .expect("pod created");
    let _ = pods.get("p").await.expect("get");
    let _ = pods.get("missing").await.expect_err("404");
    let binding: k8s_openapi::api::core::v1::Binding = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": "n1"},
    }))
    .expect("binding");
    pods.create_subresource::<_, Value>("binding", "p", &PostParams::default(), &binding)
        .await
        .expect("bound");
    cluster
        .wait_until("a request of the coordinator (a lease renewal)", || {
            let audit = audit.clone();
            async move {
                audit
                    .records()
                    .iter()
                    .any(|r| r.user == COORDINATOR_USER)
                    .then_some(())
            }
        })
        .await;
    audit.disable();
    let _ = pods.get("p").await;
    // The coordinator runs too; only the test's own (admin) requests are checked here.
    #[allow(clippy::type_complexity)]
    let got: Vec<(String, String, Option<String>, Option<String>, u16)> = audit
        .records()
        .into_iter()
        .filter(|r| r.user == "admin")
        .map(|r| (r.verb, r.resource, r.subresource, r.name, r.status / 100))
        .collect();
    assert_eq!(
        got,
        vec![
            ("create".into(), "pods".into(), None, None, 2),
            ("get".into(), "pods".into(), None, Some("p".into()), 2),
            ("get".into(), "pods".into(), None, Some("missing".into()), 4),
            (
                "create".into(),
                "pods".into(),
                Some("binding".into()),
                Some("p".into()),
                2
            ),
        ]
    );
    cluster.shutdown().await;
}
