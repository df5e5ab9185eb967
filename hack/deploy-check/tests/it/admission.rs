//! The chart's pods against stricter admission than a default cluster has, on the real
//! kube-apiserver configured as such clusters are: Pod Security enforcing `baseline` by
//! default, and critical PriorityClasses admitted outside kube-system only under a quota
//! scoped to them (GKE's rule, through the ResourceQuota plugin's `limitedResources`). The
//! agent (host PID namespace, host paths, `system-node-critical`) and the coordinator
//! (`system-cluster-critical`) are refused in a bare namespace and admitted in the one the
//! plain manifests create, beside the chart's ResourceQuota.

use crate::common;

use std::time::Duration;

use common::{NAMESPACE, apply, repo};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tessera_deploy_check::chart::split_documents;
use tessera_deploy_check::kinds;
use tessera_testcluster::{Cluster, ClusterOptions, wait_for};

const ADMISSION: &str = r#"
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults:
        enforce: baseline
        enforce-version: latest
      exemptions:
        namespaces: [kube-system]
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: [system-node-critical, system-cluster-critical]
"#;

/// The plain manifests, as JSON documents.
fn manifests() -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy/manifests/tessera.yaml")).unwrap();
    split_documents(&text)
        .iter()
        .filter_map(|d| kinds::to_json(d).ok())
        .filter(|d| d.get("kind").is_some())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// A pod with the pod template of the workload `kind` (DaemonSet or Deployment), in
/// `namespace`.
fn pod_of(docs: &[Value], kind: &str, namespace: &str) -> Pod {
    let workload = find(docs, kind)[0];
    let spec = workload["spec"]["template"]["spec"].clone();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("probe-{}", kind.to_lowercase()), "namespace": namespace},
        "spec": spec,
    }))
    .unwrap()
}

/// Creates `pod` as a dry run (admission runs, nothing is stored): the API server's refusal,
/// if any.
async fn admit(client: &kube::Client, pod: &Pod) -> Result<(), String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&params, pod)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_pods_pass_strict_admission_in_their_namespace_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("admission.yaml");
    std::fs::write(&config, ADMISSION).unwrap();
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions {
            controllers: Some("serviceaccount-controller,resourcequota-controller".into()),
            apiserver_args: vec![format!(
                "--admission-control-config-file={}",
                config.display()
            )],
            ..ClusterOptions::default()
        })
    });
    let client = cluster.admin().await;
    let docs = manifests();

    // A bare namespace: the agent breaks baseline Pod Security, and the coordinator (which
    // keeps to it) lacks the quota its critical PriorityClass needs.
    apply(
        &client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bare"}}),
    )
    .await;
    for sa in find(&docs, "ServiceAccount") {
        let mut sa = sa.clone();
        sa["metadata"]["namespace"] = json!("bare");
        apply(&client, &sa).await;
    }
    let agent = pod_of(&docs, "DaemonSet", "bare");
    let refused = admit(&client, &agent).await.expect_err("refused in bare");
    assert!(
        refused.contains("violates PodSecurity \"baseline:latest\"") && refused.contains("hostPID"),
        "{refused}"
    );
    let coordinator = pod_of(&docs, "Deployment", "bare");
    let refused = admit(&client, &coordinator)
        .await
        .expect_err("refused in bare");
    assert!(refused.contains("insufficient quota"), "{refused}");

    // The release namespace as the manifests create it, with the chart's quota: both admitted.
    for kind in ["Namespace", "ServiceAccount", "ResourceQuota"] {
        for doc in find(&docs, kind) {
            apply(&client, doc).await;
        }
    }
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), NAMESPACE);
    wait_for(
        "the quota controller to count the critical-pods quota",
        || async {
            let q = quotas.get("tessera-critical-pods").await.ok()?;
            q.status?.hard.map(drop)
        },
        || async { cluster.logs() },
    )
    .await;
    let agent = pod_of(&docs, "DaemonSet", NAMESPACE);
    let coordinator = pod_of(&docs, "Deployment", NAMESPACE);
    // The ServiceAccount controller may still be creating the namespace's token objects.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match (
            admit(&client, &agent).await,
            admit(&client, &coordinator).await,
        ) {
            (Ok(()), Ok(())) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the chart's pods are refused in {NAMESPACE}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
