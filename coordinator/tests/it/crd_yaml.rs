//! The generated CRDs: `deploy/crds/` is up to date, the schemas carry the server-side checks,
//! and the files are accepted by the real apiextensions server (structural schemas, CEL rules,
//! status subresource), which then serves each kind to kube-rs `Api<T>`.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_coordinator::crd::{self, PodGroup, Queue, Topology};
use tessera_testcluster::{Cluster, ClusterOptions};

const REGENERATE: &str = "cargo run -p tessera-coordinator -- crds --out deploy/crds";

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

#[test]
fn deploy_crds_are_up_to_date() {
    let files = crd::files().expect("CRDs render");
    assert_eq!(files.len(), 4);
    for (name, text) in files {
        let path = crd_dir().join(&name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == text,
            "{} is missing or out of date with the Rust CRD types; regenerate it with `{REGENERATE}`",
            path.display()
        );
    }
    // The printed stream is the four files, in order, as one multi-document YAML.
    let all = crd::all_yaml().unwrap();
    assert_eq!(all.matches("kind: CustomResourceDefinition").count(), 4);
}

#[test]
fn schemas_carry_names_columns_and_server_side_checks() {
    let yaml = crd::all_yaml().unwrap();
    for needle in [
        "name: queues.tessera.dev",
        "name: podgroups.tessera.dev",
        "name: topologies.tessera.dev",
        "scope: Cluster",
        "scope: Namespaced",
        "- tq",
        "- pg",
        "x-kubernetes-int-or-string: true",
        "x-kubernetes-validations",
        "maxMember must be at least minMember",
        "gpu.limit must be -1 (no limit) or at least gpu.quota",
        "x-kubernetes-list-map-keys",
        "jsonPath: .status.fairShare.gpu",
        "jsonPath: .spec.minMember",
        "namespaceSelector",
        "values must list at least one value for operator In or NotIn",
    ] {
        assert!(yaml.contains(needle), "generated CRDs lack {needle:?}");
    }
    // Every CRD is a single served, stored v1alpha1 with a status subresource.
    for (_, c) in crd::all() {
        assert_eq!(c.spec.group, "tessera.dev");
        assert_eq!(c.spec.versions.len(), 1);
        let v = &c.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.served && v.storage);
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }
}

/// Applies the files in deploy/crds, then creates, lists and status-patches one object of each
/// kind through typed `Api<T>`.
#[tokio::test]
async fn crds_are_accepted_by_the_real_apiextensions_server() {
    let server = Cluster::start(ClusterOptions::default());
    let client = server.admin().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [
        "queues.yaml",
        "podgroups.yaml",
        "topologies.yaml",
        "gpunodes.yaml",
    ] {
        let text = std::fs::read_to_string(crd_dir().join(name)).expect("CRD file exists");
        let obj: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("CRD parses");
        crds.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{name} applies: {e}"));
    }
    // The server accepts a CRD whose schema is structural and then marks it Established; a
    // non-structural schema would show NonStructuralSchema instead and never serve.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for name in [
        "queues.tessera.dev",
        "podgroups.tessera.dev",
        "topologies.tessera.dev",
        "gpunodes.tessera.dev",
    ] {
        loop {
            let crd = crds.get(name).await.expect("CRD exists");
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            assert!(
                !conditions
                    .iter()
                    .any(|c| c.type_ == "NonStructuralSchema" && c.status == "True"),
                "{name}: the server found the schema not structural: {conditions:?}"
            );
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never became Established: {conditions:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let queues: Api<Queue> = Api::all(client.clone());
    while queues.list(&ListParams::default()).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "queues never became servable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let q: Queue = serde_yaml_ng::from_str(
        r#"
apiVersion: tessera.dev/v1alpha1
kind: Queue
metadata: {name: team-a}
spec:
  parent: org
  priority: 1
  gpu:
    quota: 2.5
    overQuotaWeight: 2
    limit: -1
    models:
      - {model: NVIDIA-H100-80GB-HBM3, quota: 1, limit: 2}
      - {model: L40S, overQuotaWeight: 3}
  cpu: {quota: 32, limit: "64"}
  memory: {quota: 64Gi, overQuotaWeight: 1, limit: -1}
  namespaces: [team-a, team-b]
  namespaceSelector:
    matchLabels: {example.com/team: ml}
    matchExpressions:
      - {key: tier, operator: In, values: [gold]}
      - {key: retired, operator: DoesNotExist}
"#,
    )
    .expect("example queue parses");
    queues.create(&PostParams::default(), &q).await.unwrap();
    let listed = queues.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].spec, q.spec);
    let translated = tessera_coordinator::translate::queue::translate(&listed.items[0]);
    assert_eq!(translated.gpu_models.len(), 2);
    assert_eq!(translated.gpu_models[0].model, "NVIDIA-H100-80GB-HBM3");
    assert_eq!(translated.gpu_models[1].over_quota_weight, Some(3.0));
    let status = json!({"status": {
        "allocated": {"gpu": 1.5, "cpu": "4", "memory": "16Gi"},
        "fairShare": {"gpu": 2.5, "cpu": "32", "memory": "64Gi"},
        "gpuModels": [{"model": "L40S", "allocated": 1, "requested": 2, "fairShare": 1.5}],
        "usage": {"gpuSeconds": 3600.5, "cpuSeconds": 10, "memoryGiBSeconds": 2.25,
                  "updatedAt": "2026-01-01T00:00:00Z"},
        "conditions": [{"type": "Valid", "status": "True", "reason": "Valid", "message": ""}]}});
    let patched = queues
        .patch_status("team-a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // The usage history comes back from the server as the core's record, to the unit.
    let usage = tessera_coordinator::translate::queue::usage_of(&patched).expect("usage");
    assert_eq!(usage.at, 1_767_225_600);
    assert_eq!(usage.used, [3_600_500.0, 10_000.0, 2304.0]);
    let st = patched.status.expect("status");
    assert_eq!(st.fair_share.map(|f| f.gpu), Some(2.5));
    assert_eq!(st.gpu_models[0].fair_share, 1.5);
    assert_eq!(st.conditions[0].type_, "Valid");

    // Namespace rules the server refuses, each with the form it accepts.
    for (spec, words) in [
        (
            json!({"namespaces": ["Team_A"]}),
            &["spec.namespaces[0]", "should match", "[a-z0-9]"][..],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]}}),
            &[
                "operator",
                "Unsupported value: \"Gt\"",
                "\"In\", \"NotIn\", \"Exists\", \"DoesNotExist\"",
            ][..],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}),
            &["values must list at least one value for operator In or NotIn"][..],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["x"]}]}}),
            &["none for Exists or DoesNotExist"][..],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a b", "operator": "Exists"}]}}),
            &["matchExpressions[0].key", "should match"][..],
        ),
        // GPU model keys: the form nvidia.com/gpu.product spells, once each.
        (
            json!({"gpu": {"models": [{"model": "NVIDIA H100 80GB HBM3", "quota": 1}]}}),
            &[
                "spec.gpu.models[0].model",
                "must be a GPU model as nvidia.com/gpu.product spells it",
                "e.g. NVIDIA-H100-80GB-HBM3",
            ][..],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S"}, {"model": "-H100"}]}}),
            &["spec.gpu.models[1].model", "letters, digits"][..],
        ),
        (
            json!({"gpu": {"models": [{"model": "x".repeat(64)}]}}),
            &["spec.gpu.models[0].model", "63"][..],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S"}, {"model": "L40S", "quota": 2}]}}),
            &["spec.gpu.models[1]", "Duplicate value"][..],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S", "quota": 4, "limit": 2}]}}),
            &["gpu.models[].limit must be -1 (no limit) or at least the model's quota"][..],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S", "quota": -1}]}}),
            &["spec.gpu.models[0].quota", "greater than or equal to 0"][..],
        ),
    ] {
        let bad: Queue = serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": "bad"}, "spec": spec,
        }))
        .expect("the bad queue parses");
        let refused = queues
            .create(&PostParams::default(), &bad)
            .await
            .expect_err(&format!("{spec} must be refused by the server"))
            .to_string();
        for w in words {
            assert!(refused.contains(w), "{spec}: {w:?} not in {refused}");
        }
    }

    let groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let g: PodGroup = serde_yaml_ng::from_str(
        r#"
apiVersion: tessera.dev/v1alpha1
kind: PodGroup
metadata: {name: train, namespace: default}
spec: {minMember: 4, maxMember: 8, queue: team-a, topology: {required: rack}}
"#,
    )
    .expect("example group parses");
    groups.create(&PostParams::default(), &g).await.unwrap();
    let listed = groups.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].spec.min_member, 4);
    let patched = groups
        .patch_status(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "scheduled": 4, "running": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().running, 4);

    // The status subresource splits the object: a status write leaves the spec alone.
    let spec_via_status = groups
        .patch_status(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minMember": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(
        spec_via_status.spec.min_member, 4,
        "the status subresource changed the spec"
    );

    // The CEL rule in the schema is enforced by the server, with its message.
    let bad: PodGroup = serde_yaml_ng::from_str(
        r#"
apiVersion: tessera.dev/v1alpha1
kind: PodGroup
metadata: {name: bad, namespace: default}
spec: {minMember: 4, maxMember: 2}
"#,
    )
    .expect("bad group parses");
    let refused = groups
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("maxMember < minMember must be refused by the server");
    assert!(
        refused
            .to_string()
            .contains("maxMember must be at least minMember"),
        "{refused}"
    );

    let topologies: Api<Topology> = Api::all(client.clone());
    let t: Topology = serde_yaml_ng::from_str(
        r#"
apiVersion: tessera.dev/v1alpha1
kind: Topology
metadata: {name: default}
spec:
  levels:
    - {name: zone, nodeLabel: topology.kubernetes.io/zone}
    - {name: rack, nodeLabel: topology.tessera.dev/rack}
    - {name: host, nodeLabel: kubernetes.io/hostname}
"#,
    )
    .expect("example topology parses");
    topologies.create(&PostParams::default(), &t).await.unwrap();
    let listed = topologies.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].spec.levels[1].name, "rack");
    drop(server);
}
