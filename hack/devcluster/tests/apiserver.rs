//! The API server through the kube-rs client: list/watch, conflicts, subresources, CRDs,
//! selectors, patches, errors and authentication.

mod common;

use std::time::Duration;

use common::{WAIT, api_code, client_for, pod, start, start_with};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams,
    Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::Status;
use serde_json::{Value, json};
use tessera_devcluster::apiserver::{ApiServerConfig, Token};

async fn next_event<S>(stream: &mut S) -> WatchEvent<Pod>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
{
    loop {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("a watch event before the timeout")
            .expect("stream open")
            .expect("event decodes");
        if !matches!(event, WatchEvent::Bookmark(_)) {
            return event;
        }
    }
}

fn name_of(event: &WatchEvent<Pod>) -> (&'static str, String) {
    let (kind, pod) = match event {
        WatchEvent::Added(p) => ("ADDED", p),
        WatchEvent::Modified(p) => ("MODIFIED", p),
        WatchEvent::Deleted(p) => ("DELETED", p),
        other => panic!("unexpected event {other:?}"),
    };
    (kind, pod.metadata.name.clone().unwrap_or_default())
}

#[tokio::test]
async fn list_watch_resumes_and_answers_gone_beyond_history() {
    let (server, client) = start_with(ApiServerConfig {
        history: 8,
        ..ApiServerConfig::default()
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let list_rv = list.metadata.resource_version.clone().unwrap();

    // Watch from the list's version: only later changes arrive, in order.
    let mut stream = pods
        .watch(&WatchParams::default(), &list_rv)
        .await
        .unwrap()
        .boxed();
    pods.create(&PostParams::default(), &pod("b", json!({})))
        .await
        .unwrap();
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("ADDED", "b".into())
    );
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("MODIFIED", "a".into())
    );
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("DELETED", "b".into())
    );

    // Resuming from the same version replays exactly those changes.
    let mut resumed = pods
        .watch(&WatchParams::default(), &list_rv)
        .await
        .unwrap()
        .boxed();
    let replayed: Vec<_> = [
        next_event(&mut resumed).await,
        next_event(&mut resumed).await,
        next_event(&mut resumed).await,
    ]
    .iter()
    .map(name_of)
    .collect();
    assert_eq!(
        replayed,
        [
            ("ADDED", "b".into()),
            ("MODIFIED", "a".into()),
            ("DELETED", "b".into())
        ]
    );

    // Watching from "0" starts with the current state.
    let mut from_now = pods
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        name_of(&next_event(&mut from_now).await),
        ("ADDED", "a".into())
    );

    // Push the list's version out of the retained history: 410 Gone.
    for i in 0..10 {
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"n": i.to_string()}}})),
        )
        .await
        .unwrap();
    }
    let mut gone = pods
        .watch(&WatchParams::default(), &list_rv)
        .await
        .unwrap()
        .boxed();
    match next_event(&mut gone).await {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410, "{status:?}");
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 error event, got {other:?}"),
    }
    // A version from the future (another server's) is refused the same way.
    let mut future = pods
        .watch(&WatchParams::default(), "999999")
        .await
        .unwrap()
        .boxed();
    match next_event(&mut future).await {
        WatchEvent::Error(status) => assert_eq!(status.code, 410, "{status:?}"),
        other => panic!("expected a 410 error event, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn bookmarks_carry_the_latest_version() {
    let (server, client) = start_with(ApiServerConfig {
        bookmark_interval: Duration::from_millis(100),
        ..ApiServerConfig::default()
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let created = pods
        .create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let mut stream = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let event = tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match event {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test]
async fn kube_runtime_watcher_follows_changes() {
    use kube::runtime::watcher::{Config, Event};
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await
        .unwrap();
    // Both initial-list strategies: list-then-watch and streaming lists (sendInitialEvents).
    for (round, config) in [Config::default(), Config::default().streaming_lists()]
        .into_iter()
        .enumerate()
    {
        let mut events = kube::runtime::watcher(pods.clone(), config).boxed();
        let extra = format!("b{round}");
        let mut seen = Vec::new();
        while !seen.contains(&extra) {
            let event = tokio::time::timeout(WAIT, events.try_next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            match event {
                Event::InitApply(p) | Event::Apply(p) => seen.push(p.metadata.name.unwrap()),
                Event::InitDone => {
                    pods.create(&PostParams::default(), &pod(&extra, json!({})))
                        .await
                        .unwrap();
                }
                _ => {}
            }
        }
        assert_eq!(seen.first().map(String::as_str), Some("a"), "{seen:?}");
        assert_eq!(seen.last(), Some(&extra));
    }
    server.shutdown().await;
}

#[tokio::test]
async fn stale_update_conflicts_and_metadata_is_assigned() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let mut generated = pod("", json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("worker-".into());
    let created = pods
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(
        name.starts_with("worker-") && name.len() == "worker-".len() + 5,
        "{name}"
    );
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref()),
        Some("default-scheduler")
    );

    let mut first = created.clone();
    first.metadata.labels = Some([("v".to_string(), "1".to_string())].into());
    let updated = pods
        .replace(&name, &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );

    let mut stale = created.clone();
    stale.metadata.labels = Some([("v".to_string(), "2".to_string())].into());
    let err = pods
        .replace(&name, &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (409, "Conflict".into()));

    let err = pods
        .create(&PostParams::default(), &updated)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (409, "AlreadyExists".into()));
    let err = pods.get("missing").await.unwrap_err();
    assert_eq!(api_code(&err), (404, "NotFound".into()));
    server.shutdown().await;
}

#[tokio::test]
async fn binding_sets_node_name_and_pod_scheduled_once() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("p", json!({})))
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "p", "annotations": {"tessera.dev/assignment": "{}"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"},
    });
    let status: Status = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    assert_eq!(status.code, 201);
    let bound = pods.get("p").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("node-1"));
    assert_eq!(
        bound
            .metadata
            .annotations
            .unwrap()
            .get("tessera.dev/assignment")
            .map(String::as_str),
        Some("{}")
    );
    let conditions = bound.status.unwrap().conditions.unwrap();
    let scheduled = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(scheduled.status, "True");

    let again = pods
        .create_subresource::<_, Status>("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap_err();
    assert_eq!(api_code(&again), (409, "Conflict".into()));
    server.shutdown().await;
}

#[tokio::test]
async fn eviction_deletes_the_pod() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let created = pods
        .create(&PostParams::default(), &pod("victim", json!({})))
        .await
        .unwrap();
    let mut stream = pods
        .watch(
            &WatchParams::default(),
            created.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    pods.evict("victim", &EvictParams::default()).await.unwrap();
    assert_eq!(
        name_of(&next_event(&mut stream).await),
        ("DELETED", "victim".into())
    );
    assert_eq!(api_code(&pods.get("victim").await.unwrap_err()).0, 404);
    assert_eq!(
        api_code(
            &pods
                .evict("victim", &EvictParams::default())
                .await
                .unwrap_err()
        )
        .0,
        404
    );
    server.shutdown().await;
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() {
    let (server, client) = start().await;
    let nodes: Api<Node> = Api::all(client);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"capacity": {"nvidia.com/gpu": "4"}},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    // A main-resource patch cannot change status...
    let patched = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({
            "metadata": {"labels": {"a": "b"}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.status.unwrap().capacity.unwrap()["nvidia.com/gpu"].0,
        "4"
    );
    // ...and a status patch changes nothing else.
    let patched = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({
            "metadata": {"labels": {"c": "d"}}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.status.unwrap().capacity.unwrap()["nvidia.com/gpu"].0,
        "8"
    );
    assert!(!patched.metadata.labels.unwrap().contains_key("c"));
    server.shutdown().await;
}

fn crd(plural: &str, kind: &str, scope: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.tessera.dev")},
        "spec": {
            "group": "tessera.dev", "scope": scope,
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "shortNames": [&plural[..2]]},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}}}],
        },
    })
}

#[tokio::test]
async fn crds_serve_custom_resources_with_status() {
    let (server, client) = start().await;
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    let queue_res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tessera.dev", "v1alpha1", "Queue"),
        "queues",
    );
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &queue_res);
    assert_eq!(
        api_code(&queues.list(&ListParams::default()).await.unwrap_err()).0,
        404
    );

    for (plural, kind, scope) in [
        ("queues", "Queue", "Cluster"),
        ("podgroups", "PodGroup", "Namespaced"),
    ] {
        let obj: DynamicObject = serde_json::from_value(crd(plural, kind, scope)).unwrap();
        let created = crds.create(&PostParams::default(), &obj).await.unwrap();
        let conditions = created.data["status"]["conditions"]
            .as_array()
            .unwrap()
            .clone();
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        );
    }
    let resources = client
        .list_api_group_resources("tessera.dev/v1alpha1")
        .await
        .unwrap();
    let names: Vec<_> = resources
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r.namespaced))
        .collect();
    assert!(
        names.contains(&("queues", false)) && names.contains(&("podgroups", true)),
        "{names:?}"
    );
    assert!(names.contains(&("queues/status", false)), "{names:?}");

    let queue: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {"parent": "root", "gpu": {"quota": 8}},
        "status": {"ignored": true},
    }))
    .unwrap();
    let created = queues.create(&PostParams::default(), &queue).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );
    assert_eq!(created.metadata.generation, Some(1));
    let with_status = queues
        .patch_status(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocated": {"gpu": 2}}})),
        )
        .await
        .unwrap();
    assert_eq!(with_status.data["status"]["allocated"]["gpu"], 2);
    assert_eq!(
        with_status.metadata.generation,
        Some(1),
        "status writes keep the generation"
    );
    let respec = queues
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"gpu": {"quota": 4}}, "status": null})),
        )
        .await
        .unwrap();
    assert_eq!(respec.metadata.generation, Some(2));
    assert_eq!(
        respec.data["status"]["allocated"]["gpu"], 2,
        "main-resource writes keep status"
    );
    let strategic = queues
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&strategic).0, 415);

    let pg_res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("tessera.dev", "v1alpha1", "PodGroup"),
        "podgroups",
    );
    let groups: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &pg_res);
    let group: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "g1"}, "spec": {"minMember": 2},
    }))
    .unwrap();
    groups.create(&PostParams::default(), &group).await.unwrap();
    let all_groups: Api<DynamicObject> = Api::all_with(client.clone(), &pg_res);
    assert_eq!(
        all_groups
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Deleting the CRD stops serving the kind and removes its objects.
    crds.delete("queues.tessera.dev", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_code(&queues.get("team-a").await.unwrap_err()).0, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn field_and_label_selectors_filter_lists_and_watches() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    for (name, app, node, scheduler) in [
        ("a", "web", "n1", "tessera"),
        ("b", "db", "n2", "tessera"),
        ("c", "web", "", "default-scheduler"),
    ] {
        let mut p = pod(name, json!({"app": app}));
        let spec = p.spec.as_mut().unwrap();
        spec.scheduler_name = Some(scheduler.into());
        if !node.is_empty() {
            spec.node_name = Some(node.into());
        }
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    pods.patch_status(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };
    let cases = [
        (ListParams::default().fields("spec.nodeName=n1"), vec!["a"]),
        (ListParams::default().fields("spec.nodeName="), vec!["c"]),
        (
            ListParams::default().fields("spec.schedulerName=tessera,status.phase!=Running"),
            vec!["a"],
        ),
        (ListParams::default().fields("metadata.name==b"), vec!["b"]),
        (
            ListParams::default().fields("metadata.namespace=default"),
            vec!["a", "b", "c"],
        ),
        (
            ListParams::default().fields("status.phase=Running"),
            vec!["b"],
        ),
        (ListParams::default().labels("app=web"), vec!["a", "c"]),
        (ListParams::default().labels("app!=web"), vec!["b"]),
        (ListParams::default().labels("app in (db,cache)"), vec!["b"]),
        (
            ListParams::default().labels("app notin (db)"),
            vec!["a", "c"],
        ),
        (ListParams::default().labels("app"), vec!["a", "b", "c"]),
        (ListParams::default().labels("!app"), vec![]),
        (
            ListParams::default()
                .labels("app=web")
                .fields("spec.nodeName=n1"),
            vec!["a"],
        ),
    ];
    for (params, expected) in cases {
        let got = names(pods.list(&params).await.unwrap());
        assert_eq!(
            got, expected,
            "{:?} {:?}",
            params.field_selector, params.label_selector
        );
    }
    let bad = pods
        .list(&ListParams::default().labels("app in web"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&bad), (400, "BadRequest".into()));

    // A field-selector watch sees a pod appear when it starts matching (binding).
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut on_n2 = pods
        .watch(&WatchParams::default().fields("spec.nodeName=n2"), &rv)
        .await
        .unwrap()
        .boxed();
    let binding = json!({"metadata": {"name": "c"}, "target": {"kind": "Node", "name": "n2"}});
    let _: Status = pods
        .create_subresource("binding", "c", &PostParams::default(), &binding)
        .await
        .unwrap();
    assert_eq!(
        name_of(&next_event(&mut on_n2).await),
        ("ADDED", "c".into())
    );
    server.shutdown().await;
}

#[tokio::test]
async fn merge_strategic_and_json_patches() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(
        &PostParams::default(),
        &pod("p", json!({"keep": "1", "drop": "1"})),
    )
    .await
    .unwrap();
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"},
        {"type": "Ready", "status": "False"}]}})),
    )
    .await
    .unwrap();

    let merged = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"drop": null, "new": "1"}}})),
        )
        .await
        .unwrap();
    let labels = merged.metadata.labels.unwrap();
    assert_eq!(labels.keys().collect::<Vec<_>>(), ["keep", "new"]);

    let strategic = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "message": "still no GPU"}]}})),
        )
        .await
        .unwrap();
    let conditions = strategic.status.unwrap().conditions.unwrap();
    assert_eq!(conditions.len(), 2, "merged by type, not replaced");
    let scheduled = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(scheduled.message.as_deref(), Some("still no GPU"));
    assert_eq!(scheduled.reason.as_deref(), Some("Unschedulable"));

    let annotations = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"annotations": {"tessera.dev/assigned-at": "now"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        annotations.metadata.annotations.unwrap()["tessera.dev/assigned-at"],
        "now"
    );

    let ops = json!([
        {"op": "test", "path": "/metadata/labels/keep", "value": "1"},
        {"op": "add", "path": "/metadata/annotations/tessera.dev~1allocated", "value": "true"},
        {"op": "remove", "path": "/metadata/labels/new"},
    ]);
    let patched: Pod = raw_patch(&pods, "p", "application/json-patch+json", &ops).await;
    assert_eq!(
        patched.metadata.annotations.unwrap()["tessera.dev/allocated"],
        "true"
    );
    assert!(!patched.metadata.labels.unwrap().contains_key("new"));

    // A patch carrying a stale resourceVersion conflicts.
    let stale = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&stale).0, 409);
    server.shutdown().await;
}

/// A PATCH through a raw request, so the test does not depend on kube's `jsonpatch` feature.
async fn raw_patch(pods: &Api<Pod>, name: &str, content_type: &str, body: &Value) -> Pod {
    let request = axum::http::Request::builder()
        .method("PATCH")
        .uri(format!("/api/v1/namespaces/default/pods/{name}"))
        .header("content-type", content_type)
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    pods.clone()
        .into_client()
        .request::<Pod>(request)
        .await
        .unwrap()
}

#[tokio::test]
async fn namespaces_exist_and_deleting_one_removes_its_objects() {
    let (server, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<_> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    for ns in ["default", "kube-system"] {
        assert!(names.iter().any(|n| n == ns), "{names:?}");
    }
    let in_missing: Api<Pod> = Api::namespaced(client.clone(), "nope");
    let err = in_missing
        .create(&PostParams::default(), &pod("p", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (404, "NotFound".into()));

    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let team: Api<Pod> = Api::namespaced(client.clone(), "team");
    team.create(&PostParams::default(), &pod("p", json!({})))
        .await
        .unwrap();
    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_code(&team.get("p").await.unwrap_err()).0, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn bearer_tokens_authenticate_and_token_review_answers() {
    let token = Token {
        token: "s3cret".into(),
        user: "alice".into(),
        groups: vec!["devs".into()],
        extra: Default::default(),
    };
    let (server, anonymous) = start_with(ApiServerConfig {
        tokens: vec![token],
        require_auth: true,
        ..ApiServerConfig::default()
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(anonymous);
    assert_eq!(
        api_code(&pods.list(&ListParams::default()).await.unwrap_err()),
        (401, "Unauthorized".into())
    );
    let client = client_for(&server, Some("s3cret"));
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.list(&ListParams::default()).await.unwrap();

    let reviews: Api<DynamicObject> = Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("authentication.k8s.io", "v1", "TokenReview"),
            "tokenreviews",
        ),
    );
    for (candidate, expected) in [("s3cret", true), ("wrong", false)] {
        let review: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {}, "spec": {"token": candidate}}))
        .unwrap();
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .unwrap();
        assert_eq!(answer.data["status"]["authenticated"], expected);
        if expected {
            assert_eq!(answer.data["status"]["user"]["username"], "alice");
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (server, client) = start().await;
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::default_namespaced(client);
    let cm = serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["tessera.dev/cleanup"]}, "data": {"a": "b"}})).unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    maps.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = maps.get("held").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    maps.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_code(&maps.get("held").await.unwrap_err()).0, 404);
    server.shutdown().await;
}

#[tokio::test]
async fn metadata_only_lists_and_watches() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod("m", json!({"app": "x"})))
        .await
        .unwrap();
    let list = pods.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.labels.as_ref().unwrap()["app"], "x");
    let metadata: Api<kube::core::PartialObjectMeta<Pod>> =
        Api::default_namespaced(pods.clone().into_client());
    let mut events =
        kube::runtime::watcher(metadata, kube::runtime::watcher::Config::default()).boxed();
    let first = tokio::time::timeout(WAIT, async {
        loop {
            if let kube::runtime::watcher::Event::InitApply(meta) =
                events.try_next().await.unwrap().unwrap()
            {
                return meta;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("m"));
    server.shutdown().await;
}

#[tokio::test]
async fn concurrent_writers_are_seen_once_each_in_resource_version_order() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = pods
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let pods = pods.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    pods.create(
                        &PostParams::default(),
                        &pod(&format!("w{w}-{i}"), json!({})),
                    )
                    .await
                    .unwrap();
                }
            })
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut last_rv = 0u64;
    while seen.len() < 100 {
        let WatchEvent::Added(p) = next_event(&mut stream).await else {
            panic!("only creations happen");
        };
        let rv: u64 = p.metadata.resource_version.unwrap().parse().unwrap();
        assert!(
            rv > last_rv,
            "resourceVersions increase: {rv} after {last_rv}"
        );
        last_rv = rv;
        assert!(seen.insert(p.metadata.name.unwrap()), "no duplicates");
    }
    for w in writers {
        w.await.unwrap();
    }
    server.shutdown().await;
}
