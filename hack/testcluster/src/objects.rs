//! Creating arbitrary objects the way `kubectl create -f` does, and waiting for what the
//! control plane's controllers create.

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;

use crate::{DEADLINE, eventually};

/// How often discovery is asked again for a kind a CRD has just added.
const POLL: Duration = Duration::from_millis(100);

/// Creates one object of any kind the server serves (its `apiVersion`/`kind` decide the
/// endpoint; a namespaced one without a namespace goes to `default`), retrying discovery
/// while the kind is not served yet, as for a CRD that was just Established. Panics with the
/// server's answer when the create is refused.
pub async fn apply(client: &kube::Client, doc: &Value) -> DynamicObject {
    let api_version = doc["apiVersion"]
        .as_str()
        .expect("the object has an apiVersion");
    let kind = doc["kind"].as_str().expect("the object has a kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let (resource, caps) = loop {
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => break found,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "discovering {api_version} {kind}: {e}"
            ),
        }
        tokio::time::sleep(POLL).await;
    };
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {kind} {:?}: {e}", doc["metadata"]["name"]))
}

/// Waits until CRD `name` has condition `Established=True` and its objects are served: the
/// condition comes first and the API server installs the resource's handler a moment later
/// (on a loaded machine, long enough for a create in between to get `404 page not found`), so
/// the wait ends only once a list of the resource answers.
pub async fn wait_crd_established(client: &kube::Client, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = eventually(&format!("CRD {name} to be Established"), || async {
        let crd = crds.get(name).await.ok()?;
        crd.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(crd)
    })
    .await;
    let spec = &crd.spec;
    let Some(version) = spec.versions.iter().find(|v| v.served) else {
        return;
    };
    let gvk = GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind);
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, &spec.names.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    eventually(&format!("CRD {name}'s objects to be served"), || async {
        api.list(&kube::api::ListParams::default().limit(1))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

/// Waits for ServiceAccount `namespace/name`: the serviceaccount controller creates each
/// namespace's `default`, and the ServiceAccount admission plugin refuses pods until it
/// exists.
pub async fn wait_service_account(client: &kube::Client, namespace: &str, name: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("ServiceAccount {namespace}/{name}"), || async {
        sas.get(name).await.ok().map(|_| ())
    })
    .await;
}
