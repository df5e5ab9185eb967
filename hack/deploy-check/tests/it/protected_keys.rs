//! The chart's admission policy on the real kube-apiserver: `helm install` of the chart (the
//! real helm), then a tenant — a ServiceAccount bound to the built-in `edit` ClusterRole in its
//! namespace, as a namespace's users usually are — tries to change what Tessera decided. It
//! is refused every key only Tessera writes (on create, on update, in a Binding) and every key
//! that decides a bound pod's GPU share, enforcement and queue, each time with a message that
//! names the key; before binding it may change its pod's inputs. The coordinator's and the
//! agent's ServiceAccounts may write them, and the coordinator's Binding carrying the
//! assignment lands. Without the policy the first wait (for a forged pod to be refused) times
//! out, so every part of the test depends on it.

use crate::common;

use common::{AGENT_SA, COORDINATOR_SA, NAMESPACE, apply, wait_crd_established};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tessera_contract::keys;
use tessera_testcluster::pods::{annotation, node_of, pod};
use tessera_testcluster::{Cluster, ClusterOptions, wait_for, wait_service_account};

/// The tenants' namespace.
const TENANT_NS: &str = "tenant";
/// The tenant's ServiceAccount (bound to `edit` in [`TENANT_NS`]).
const TENANT: &str = "alice";
/// The policy the chart names after its release.
const POLICY: &str = "tessera-protected-keys";
/// The node the coordinator binds to (a Binding needs no Node object).
const NODE: &str = "gpu-0";

/// A RoleBinding of ServiceAccount `namespace/name` to ClusterRole `role` in [`TENANT_NS`].
fn role_binding(binding: &str, role: &str, namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": binding, "namespace": TENANT_NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    })
}

/// A GPU pod of the tenant's, for Tessera, asking for half a GPU with the watchdog.
fn tenant_pod(name: &str) -> Pod {
    pod(name)
        .namespace(TENANT_NS)
        .gpus(1)
        .queue("default")
        .annotation(keys::GPU_FRACTION, "0.5")
        .annotation(keys::ISOLATION, "watchdog")
        .build()
}

/// The merge patch that sets (`Some`) or removes (`None`) `key` in the pod's labels or
/// annotations.
fn key_patch(label: bool, key: &str, value: Option<&str>) -> Value {
    let field = if label { "labels" } else { "annotations" };
    json!({"metadata": {field: {key: value}}})
}

/// Patches pod `name` as `client`; the API server's refusal message on failure.
async fn patch(
    client: &kube::Client,
    name: &str,
    body: &Value,
    status: bool,
) -> Result<Pod, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), TENANT_NS);
    let params = PatchParams::default();
    let done = if status {
        api.patch_status(name, &params, &Patch::Merge(body)).await
    } else {
        api.patch(name, &params, &Patch::Merge(body)).await
    };
    done.map_err(|e| e.to_string())
}

/// Creates `pod` as `client` (a dry run when `dry_run`); the refusal message on failure.
async fn create(client: &kube::Client, pod: &Pod, dry_run: bool) -> Result<Pod, String> {
    let params = PostParams {
        dry_run,
        ..PostParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), TENANT_NS)
        .create(&params, pod)
        .await
        .map_err(|e| e.to_string())
}

/// Binds pod `name` to [`NODE`] as `client`, with `annotations` on the Binding.
async fn bind(client: &kube::Client, name: &str, annotations: Value) -> Result<(), String> {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": TENANT_NS, "annotations": annotations},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    });
    Api::<Pod>::namespaced(client.clone(), TENANT_NS)
        .create_subresource::<_, Value>("binding", name, &PostParams::default(), &binding)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Asserts that `result` is the policy's refusal and that its message names `key`.
fn assert_refused_naming<T: std::fmt::Debug>(result: Result<T, String>, key: &str, what: &str) {
    let message = result.expect_err(&format!("{what}: refused"));
    assert!(
        message.contains(POLICY) && message.contains(key),
        "{what}: the refusal names the policy and {key}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_change_what_tessera_decided() {
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions {
            // `edit` is an aggregated ClusterRole: the aggregation controller fills in its
            // rules.
            controllers: Some(
                "serviceaccount-controller,clusterrole-aggregation-controller".into(),
            ),
            ..ClusterOptions::default()
        })
    });
    let admin = cluster.admin().await;
    let install = common::helm_install(&cluster.admin_kubeconfig());
    assert!(
        install.success,
        "helm install failed:\n{}\n{}",
        install.stdout, install.stderr
    );
    wait_crd_established(&admin, "queues.tessera.dev").await;

    apply(
        &admin,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT_NS}}),
    )
    .await;
    wait_service_account(&admin, TENANT_NS, "default").await;
    // The tenant edits its namespace; the test lets Tessera's accounts do the same there, so
    // RBAC allows every write below and only admission decides.
    for (binding, namespace, name) in [
        ("tenant-edit", TENANT_NS, TENANT),
        ("coordinator-edit", NAMESPACE, COORDINATOR_SA),
        ("agent-edit", NAMESPACE, AGENT_SA),
    ] {
        apply(&admin, &role_binding(binding, "edit", namespace, name)).await;
    }
    // `edit` has no pods/status; a tenant granted it is held to the same keys.
    apply(
        &admin,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "pod-status-writer"},
            "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
                      {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}],
        }),
    )
    .await;
    apply(
        &admin,
        &role_binding("tenant-status", "pod-status-writer", TENANT_NS, TENANT),
    )
    .await;
    let tenant = cluster.service_account(TENANT_NS, TENANT).await;
    let coordinator = cluster.service_account(NAMESPACE, COORDINATOR_SA).await;
    let agent = cluster.service_account(NAMESPACE, AGENT_SA).await;

    // A pod created with spec.nodeName and a forged assignment, which an agent would honour:
    // refused once the API server has loaded the policy.
    let forged = {
        let mut p = tenant_pod("forged");
        p.spec.as_mut().expect("a spec").node_name = Some(NODE.into());
        p.metadata.annotations.get_or_insert_default().insert(
            keys::ASSIGNMENT.into(),
            r#"{"main":[{"uuid":"GPU-0","memory_mib":81920,"compute_milli":1000}]}"#.into(),
        );
        p
    };
    let last = std::cell::RefCell::new(String::new());
    let refusal = wait_for(
        "the admission policy to refuse a forged assignment",
        || async {
            match create(&tenant, &forged, true).await {
                Err(message) if message.contains(POLICY) => Some(message),
                other => {
                    *last.borrow_mut() = format!("{:?}", other.map(|_| "admitted"));
                    None
                }
            }
        },
        || async { format!("the last answer: {}", last.borrow()) },
    )
    .await;
    assert!(refusal.contains(keys::ASSIGNMENT), "{refusal}");
    let mut allocated = tenant_pod("pre-allocated");
    allocated
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::ALLOCATED.into(), "true".into());
    assert_refused_naming(
        create(&tenant, &allocated, false).await,
        keys::ALLOCATED,
        "a pod created with tessera.dev/allocated",
    );

    // Before binding, the pod's inputs are the tenant's to change; the keys only Tessera
    // writes are not.
    create(&tenant, &tenant_pod("job"), false)
        .await
        .expect("the tenant creates its pod");
    for (label, key, value) in [
        (false, keys::GPU_FRACTION, "0.25"),
        (false, keys::ISOLATION, "mps"),
        (true, keys::QUEUE, "research"),
        (true, keys::QUEUE, "default"),
    ] {
        patch(&tenant, "job", &key_patch(label, key, Some(value)), false)
            .await
            .unwrap_or_else(|e| panic!("{key}={value} on the unbound pod: {e}"));
    }
    assert_refused_naming(
        patch(
            &tenant,
            "job",
            &key_patch(false, keys::ASSIGNMENT, Some("{}")),
            false,
        )
        .await,
        keys::ASSIGNMENT,
        "an assignment on the unbound pod",
    );
    // Nor may the tenant bind its pod with an assignment of its own making.
    assert_refused_naming(
        bind(&tenant, "job", json!({keys::ASSIGNMENT: "{}"})).await,
        keys::ASSIGNMENT,
        "a tenant's Binding with an assignment",
    );

    // The coordinator binds: the assignment travels in its Binding and lands on the pod.
    let assignment = r#"{"main":[{"uuid":"GPU-0","memory_mib":40960,"compute_milli":250}]}"#;
    bind(
        &coordinator,
        "job",
        json!({keys::ASSIGNMENT: assignment, keys::ASSIGNED_AT: "2030-01-01T00:00:00Z"}),
    )
    .await
    .expect("the coordinator's Binding lands");
    let bound = Api::<Pod>::namespaced(admin.clone(), TENANT_NS)
        .get("job")
        .await
        .expect("the pod");
    assert_eq!(node_of(&bound).as_deref(), Some(NODE));
    assert_eq!(annotation(&bound, keys::ASSIGNMENT), Some(assignment));

    // Once bound, every protected change by the tenant is refused, naming the key.
    let changes: &[(bool, &str, Option<&str>)] = &[
        (false, keys::ISOLATION, Some("none")),
        (false, keys::ISOLATION, None),
        (false, keys::ASSIGNMENT, Some(r#"{"main":[]}"#)),
        (false, keys::ASSIGNMENT, None),
        (false, keys::ASSIGNED_AT, Some("2020-01-01T00:00:00Z")),
        (false, keys::ALLOCATED, Some("true")),
        (false, keys::GPU_FRACTION, Some("1")),
        (false, keys::GPU_FRACTION, None),
        (false, keys::GPU_FRACTION_ALIAS, Some("1")),
        (false, keys::GPU_MEMORY, Some("80Gi")),
        (false, keys::GPU_MEMORY_ALIAS, Some("80Gi")),
        (false, keys::GPU_FRACTION_NUM_DEVICES_ALIAS, Some("2")),
        (true, keys::QUEUE, Some("other")),
        (true, keys::QUEUE, None),
        (true, keys::QUEUE_ALIAS, Some("other")),
    ];
    for &(label, key, value) in changes {
        let body = key_patch(label, key, value);
        assert_refused_naming(
            patch(&tenant, "job", &body, false).await,
            key,
            &format!("{key}={value:?} on the bound pod"),
        );
    }
    // Through the status subresource too (it can carry metadata).
    assert_refused_naming(
        patch(
            &tenant,
            "job",
            &key_patch(false, keys::ISOLATION, Some("none")),
            true,
        )
        .await,
        keys::ISOLATION,
        "isolation through pods/status",
    );
    // Other keys stay the tenant's.
    patch(
        &tenant,
        "job",
        &key_patch(false, "example.com/owner", Some("alice")),
        false,
    )
    .await
    .expect("an annotation of the tenant's own on the bound pod");
    let now = Api::<Pod>::namespaced(admin.clone(), TENANT_NS)
        .get("job")
        .await
        .expect("the pod");
    assert_eq!(annotation(&now, keys::ISOLATION), Some("mps"));
    assert_eq!(annotation(&now, keys::GPU_FRACTION), Some("0.25"));
    assert_eq!(annotation(&now, keys::ASSIGNMENT), Some(assignment));

    // Tessera's own identities may write them.
    for (who, client, label, key, value) in [
        ("agent", &agent, false, keys::ALLOCATED, "true"),
        (
            "coordinator",
            &coordinator,
            false,
            keys::ISOLATION,
            "watchdog",
        ),
        ("coordinator", &coordinator, true, keys::QUEUE, "other"),
    ] {
        patch(client, "job", &key_patch(label, key, Some(value)), false)
            .await
            .unwrap_or_else(|e| panic!("the {who} writes {key} on the bound pod: {e}"));
    }
    create(&agent, &forged, true)
        .await
        .expect("the agent's identity may create a pod carrying an assignment");
}
