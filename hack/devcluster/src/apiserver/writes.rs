//! Writes: create (with the pod defaults upstream's registry and admission apply), update and
//! patch (with the status-subresource rules), and pod binding.

use std::sync::Arc;

use axum::http::{HeaderMap, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::Shared;
use super::error::{ApiError, success_status};
use super::handlers::{created, ok, parse_json};
use super::meta::{self, ensure_map, metadata_mut};
use super::patch::{self, ACCEPTED_PATCH_TYPES, PatchKind};
use super::resources::{ResourceType, Special};
use super::respond::present;
use super::selectors::Selectors;

/// One request's resource context.
pub(super) struct Ctx<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) rt: &'a Arc<ResourceType>,
    pub(super) version: &'a str,
    pub(super) ns: &'a str,
}

impl Ctx<'_> {
    fn check_kind(&self, obj: &Value) -> Result<(), ApiError> {
        match obj.get("kind").and_then(Value::as_str) {
            Some(kind) if kind != self.rt.kind => Err(ApiError::bad_request(format!(
                "the body's kind {kind:?} does not match the resource {:?} (kind {:?})",
                self.rt.plural, self.rt.kind
            ))),
            _ => Ok(()),
        }
    }

    pub(super) fn create(&self, mut obj: Value) -> Result<Value, ApiError> {
        self.check_kind(&obj)?;
        let body_ns = meta::meta_str(&obj, "namespace");
        if self.rt.namespaced && !body_ns.is_empty() && body_ns != self.ns {
            return Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({})",
                self.ns
            )));
        }
        if self.rt.special == Special::Pod {
            self.default_pod(&mut obj)?;
        } else if self.rt.custom && self.rt.status_subresource {
            ensure_map(&mut obj).remove("status");
        }
        ensure_map(&mut obj).insert(
            "apiVersion".into(),
            json!(self.rt.api_version(self.version)),
        );
        if !self.rt.custom {
            normalize_quantities(&mut obj);
        }
        let stored = self.shared.store.create(self.rt, self.ns, obj)?;
        Ok(present(self.rt, self.version, stored))
    }

    /// What the pod registry strategy and the Priority admission plugin do on create.
    fn default_pod(&self, pod: &mut Value) -> Result<(), ApiError> {
        let priority = self.pod_priority(pod)?;
        let spec = ensure_map(ensure_map(pod).entry("spec").or_insert(Value::Null));
        spec.entry("schedulerName")
            .or_insert(json!("default-scheduler"));
        spec.entry("restartPolicy").or_insert(json!("Always"));
        spec.entry("terminationGracePeriodSeconds")
            .or_insert(json!(30));
        spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
        spec.insert("priority".into(), json!(priority));
        ensure_map(pod).insert("status".into(), json!({"phase": "Pending"}));
        Ok(())
    }

    fn pod_priority(&self, pod: &Value) -> Result<i64, ApiError> {
        let store = &self.shared.store;
        let Some(classes) = store.lookup("scheduling.k8s.io", "v1", "priorityclasses") else {
            return Ok(0);
        };
        let value = |pc: &Value| pc.get("value").and_then(Value::as_i64).unwrap_or(0);
        match pod
            .pointer("/spec/priorityClassName")
            .and_then(Value::as_str)
        {
            Some(name) if !name.is_empty() => store
                .get(&classes, "", name)
                .map(|pc| value(&pc))
                .map_err(|_| {
                    ApiError::forbidden(format!(
                        "pods is forbidden: no PriorityClass with name {name} was found"
                    ))
                }),
            _ => {
                let (all, _) = store.list(&classes, None, &Selectors::default());
                Ok(all
                    .iter()
                    .find(|pc| pc.get("globalDefault").and_then(Value::as_bool) == Some(true))
                    .map_or(0, value))
            }
        }
    }

    /// PUT: the main resource keeps its status when status is a subresource, and the status
    /// subresource changes only status.
    pub(super) fn replace(
        &self,
        name: &str,
        new: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        self.check_kind(&new)?;
        let separate_status = self.rt.status_subresource;
        let custom = self.rt.custom;
        let stored = self
            .shared
            .store
            .update(self.rt, self.ns, name, |current| {
                let mut next = split_status(current, new, separate_status, status_only);
                if !custom {
                    normalize_quantities(&mut next);
                }
                Ok(next)
            })?;
        Ok(present(self.rt, self.version, stored))
    }

    pub(super) fn patch(
        &self,
        name: &str,
        headers: &HeaderMap,
        body: &[u8],
        status_only: bool,
    ) -> Result<Response, ApiError> {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let kind = PatchKind::from_content_type(content_type)
            .ok_or_else(|| ApiError::unsupported_media_type(content_type, ACCEPTED_PATCH_TYPES))?;
        if kind == PatchKind::Strategic && self.rt.custom {
            return Err(ApiError::unsupported_media_type(
                content_type,
                "application/merge-patch+json, application/json-patch+json, application/apply-patch+yaml (strategic merge patch is not supported for custom resources)",
            ));
        }
        let patch_doc: Value = if kind == PatchKind::Apply {
            serde_yaml_ng::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!("the apply patch is not valid YAML or JSON: {e}"))
            })?
        } else {
            parse_json(body)?
        };
        // Server-side apply creates the object when it does not exist yet.
        if kind == PatchKind::Apply
            && !status_only
            && let Err(err) = self.shared.store.get(self.rt, self.ns, name)
        {
            if err.code != 404 {
                return Err(err);
            }
            let mut obj = patch_doc;
            metadata_mut(&mut obj).insert("name".into(), json!(name));
            return self.create(obj).map(created);
        }
        let separate_status = self.rt.status_subresource;
        let custom = self.rt.custom;
        let stored = self
            .shared
            .store
            .update(self.rt, self.ns, name, |current| {
                let mut patched = current.clone();
                patch::apply(kind, &mut patched, &patch_doc).map_err(ApiError::bad_request)?;
                let mut next = split_status(current, patched, separate_status, status_only);
                if !custom {
                    normalize_quantities(&mut next);
                }
                Ok(next)
            })?;
        Ok(ok(present(self.rt, self.version, stored)))
    }

    /// `pods/binding`: sets spec.nodeName once, copies the Binding's annotations, and records
    /// PodScheduled=True.
    pub(super) fn bind(&self, name: &str, binding: Value) -> Result<Response, ApiError> {
        let node = binding
            .pointer("/target/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::invalid("Binding is invalid: target.name: Required value"))?
            .to_string();
        let annotations = binding.pointer("/metadata/annotations").cloned();
        self.shared
            .store
            .update(self.rt, self.ns, name, |current| {
                let assigned = current
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !assigned.is_empty() {
                    return Err(ApiError::conflict(
                        "",
                        "pods/binding",
                        name,
                        &format!("pod {name} is already assigned to node {assigned:?}"),
                    ));
                }
                let mut pod = current.clone();
                ensure_map(ensure_map(&mut pod).entry("spec").or_insert(Value::Null))
                    .insert("nodeName".into(), json!(node));
                if let Some(Value::Object(extra)) = &annotations {
                    let md = metadata_mut(&mut pod);
                    let existing = ensure_map(md.entry("annotations").or_insert(Value::Null));
                    existing.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                set_condition(
                    &mut pod,
                    json!({
                        "type": "PodScheduled", "status": "True", "lastProbeTime": null,
                        "lastTransitionTime": meta::now_rfc3339(),
                    }),
                );
                Ok(pod)
            })?;
        Ok(created(success_status(201)))
    }
}

/// Combines `current` and `incoming` by the status-subresource rules.
fn split_status(
    current: &Value,
    incoming: Value,
    separate_status: bool,
    status_only: bool,
) -> Value {
    if status_only {
        let mut next = current.clone();
        let rv = meta::meta_str(&incoming, "resourceVersion").to_string();
        let map = ensure_map(&mut next);
        match incoming.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
        metadata_mut(&mut next).insert("resourceVersion".into(), json!(rv));
        return next;
    }
    let mut next = incoming;
    if separate_status {
        let map = ensure_map(&mut next);
        match current.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
    }
    next
}

/// Replaces the pod condition of the same type, or appends it.
fn set_condition(pod: &mut Value, condition: Value) {
    let status = ensure_map(ensure_map(pod).entry("status").or_insert(Value::Null));
    let conditions = status.entry("conditions").or_insert(json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Value::Array(list) = conditions {
        list.retain(|c| c.get("type") != condition.get("type"));
        list.push(condition);
    }
}

/// Writes resource quantities as strings, as the real server's typed storage does (`1` →
/// `"1"`), so typed clients (k8s-openapi `Quantity`) can read them back.
fn normalize_quantities(obj: &mut Value) {
    fn stringify(map: Option<&mut Value>) {
        if let Some(Value::Object(map)) = map {
            for value in map.values_mut() {
                if let Value::Number(n) = value {
                    *value = Value::String(n.to_string());
                }
            }
        }
    }
    for list in ["/spec/containers", "/spec/initContainers"] {
        if let Some(Value::Array(containers)) = obj.pointer_mut(list) {
            for c in containers {
                stringify(c.pointer_mut("/resources/limits"));
                stringify(c.pointer_mut("/resources/requests"));
            }
        }
    }
    for map in [
        "/spec/overhead",
        "/status/capacity",
        "/status/allocatable",
        "/spec/hard",
        "/status/hard",
    ] {
        stringify(obj.pointer_mut(map));
    }
}
