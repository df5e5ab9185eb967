//! Parses a YAML document into the Kubernetes type its `apiVersion`/`kind` name (k8s-openapi)
//! and serialises it back: a field present in the YAML but lost on the way back is one the
//! type does not have (a typo or a misplaced key), which Kubernetes would drop silently or
//! refuse. That is the deny-unknown-fields check k8s-openapi's lenient deserialisers lack.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a document was checked as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Parsed into a known type and round-tripped without loss.
    Typed {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
    },
    /// A kind this module has no type for (custom resources); the caller checks it.
    Unknown {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
    },
}

/// YAML text of one document into JSON (the form the types deserialise from).
pub fn to_json(doc: &str) -> Result<Value, String> {
    serde_yaml_ng::from_str::<Value>(doc).map_err(|e| format!("not valid YAML: {e}"))
}

/// The first place where `original` has something `back` lost or changed, as a path.
/// Nulls in the original count as absent; numbers compare by value.
pub fn lost_field(original: &Value, back: &Value, path: &str) -> Option<String> {
    match (original, back) {
        (Value::Null, _) => None,
        (Value::Object(o), Value::Object(b)) => o.iter().find_map(|(k, v)| {
            let p = format!("{path}.{k}");
            match b.get(k) {
                Some(bv) => lost_field(v, bv, &p),
                None if v.is_null() => None,
                None => Some(p),
            }
        }),
        (Value::Array(o), Value::Array(b)) => {
            if o.len() != b.len() {
                return Some(format!(
                    "{path} (list length {} became {})",
                    o.len(),
                    b.len()
                ));
            }
            o.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (ov, bv))| lost_field(ov, bv, &format!("{path}[{i}]")))
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        // A quantity written as a string ("512") that a type stores as a number.
        (Value::String(x), Value::Number(y)) if x.parse::<f64>().ok() == y.as_f64() => None,
        (o, b) if o == b => None,
        (o, b) => Some(format!("{path} ({o} became {b})")),
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    match lost_field(doc, &back, "") {
        None => Ok(()),
        Some(path) => Err(format!(
            "field {path} is not part of this kind (misspelt or misplaced)"
        )),
    }
}

/// The Prometheus Operator's ServiceMonitor, the parts the chart uses (no k8s-openapi type).
mod service_monitor {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub(super) struct ServiceMonitor {
        api_version: String,
        kind: String,
        metadata: ObjectMeta,
        spec: Spec,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Spec {
        selector: LabelSelector,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace_selector: Option<NamespaceSelector>,
        endpoints: Vec<Endpoint>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_label: Option<String>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct NamespaceSelector {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        match_names: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        any: Option<bool>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Endpoint {
        port: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interval: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scrape_timeout: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scheme: Option<String>,
    }
}

/// Checks one document (as JSON).
pub fn check(doc: &Value) -> Result<Checked, String> {
    use k8s_openapi::api::admissionregistration::v1 as admission;
    use k8s_openapi::api::{apps, batch, core, policy, rbac, scheduling};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    let api_version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or("missing apiVersion")?
        .to_string();
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("missing kind")?
        .to_string();
    let result = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => round_trip::<core::v1::Namespace>(doc),
        ("v1", "Pod") => round_trip::<core::v1::Pod>(doc),
        ("v1", "Service") => round_trip::<core::v1::Service>(doc),
        ("v1", "ServiceAccount") => round_trip::<core::v1::ServiceAccount>(doc),
        ("v1", "ConfigMap") => round_trip::<core::v1::ConfigMap>(doc),
        ("v1", "Node") => round_trip::<core::v1::Node>(doc),
        ("v1", "ResourceQuota") => round_trip::<core::v1::ResourceQuota>(doc),
        ("v1", "Secret") => round_trip::<core::v1::Secret>(doc),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            round_trip::<admission::MutatingWebhookConfiguration>(doc)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<admission::ValidatingAdmissionPolicy>(doc)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<admission::ValidatingAdmissionPolicyBinding>(doc)
        }
        ("apps/v1", "Deployment") => round_trip::<apps::v1::Deployment>(doc),
        ("apps/v1", "DaemonSet") => round_trip::<apps::v1::DaemonSet>(doc),
        ("apps/v1", "StatefulSet") => round_trip::<apps::v1::StatefulSet>(doc),
        ("batch/v1", "Job") => round_trip::<batch::v1::Job>(doc),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<policy::v1::PodDisruptionBudget>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac::v1::ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<rbac::v1::ClusterRoleBinding>(doc)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac::v1::Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac::v1::RoleBinding>(doc),
        ("scheduling.k8s.io/v1", "PriorityClass") => {
            round_trip::<scheduling::v1::PriorityClass>(doc)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            round_trip::<apiext::CustomResourceDefinition>(doc)
        }
        ("monitoring.coreos.com/v1", "ServiceMonitor") => {
            round_trip::<service_monitor::ServiceMonitor>(doc)
        }
        _ => return Ok(Checked::Unknown { api_version, kind }),
    };
    result
        .map(|()| Checked::Typed {
            api_version: api_version.clone(),
            kind: kind.clone(),
        })
        .map_err(|e| format!("{api_version} {kind}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(yaml: &str) -> Value {
        to_json(yaml).unwrap()
    }

    #[test]
    fn a_valid_deployment_round_trips() {
        let d = doc(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers:\n        - name: c\n          image: i\n          ports: [{containerPort: 9090, name: metrics}]\n          resources: {limits: {cpu: 500m}}\n",
        );
        assert!(
            matches!(check(&d), Ok(Checked::Typed { .. })),
            "{:?}",
            check(&d)
        );
    }

    #[test]
    fn a_misplaced_field_is_named() {
        let d = doc(
            "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 1}]\n  selectr: {a: b}\n",
        );
        let e = check(&d).unwrap_err();
        assert!(e.contains(".spec.selectr"), "{e}");
        let d = doc(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x, annotation: {a: b}}\nspec: {containers: [{name: c}]}\n",
        );
        let e = check(&d).unwrap_err();
        assert!(e.contains(".metadata.annotation"), "{e}");
    }

    #[test]
    fn wrong_types_are_refused() {
        let d = doc(
            "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: nine}]}\n",
        );
        assert!(check(&d).is_err());
    }

    #[test]
    fn custom_kinds_are_left_to_the_caller() {
        let d = doc("apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: q}\n");
        assert_eq!(
            check(&d).unwrap(),
            Checked::Unknown {
                api_version: "tessera.dev/v1alpha1".into(),
                kind: "Queue".into()
            }
        );
    }

    #[test]
    fn service_monitor_is_strict() {
        let d = doc(
            "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m}\nspec:\n  selector: {matchLabels: {a: b}}\n  endpoints: [{port: metrics, intervl: 30s}]\n",
        );
        assert!(check(&d).is_err());
    }
}
