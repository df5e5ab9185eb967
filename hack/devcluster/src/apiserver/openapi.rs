//! A minimal OpenAPI v3 surface: the index and per-group-version documents that list each
//! kind's PATCH operation with the `fieldValidation` parameter. That is what kubectl checks
//! before sending objects with server-side field validation, so `kubectl apply` works without
//! `--validate=false`. No schemas are served: kubectl then builds patches from its built-in
//! types (strategic merge) or, for custom resources, as JSON merge patches.

use serde_json::{Map, Value, json};

use super::resources::Registry;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `GET /openapi/v3`.
pub fn index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let path = gv_path(&group, &version);
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/<api/v1 | apis/<group>/<version>>`, or `None` when not served.
pub fn group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.resources(group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for rt in types {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if rt.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("{prefix}/{}/{{name}}", rt.plural)
        };
        paths.insert(path, json!({
            "patch": {
                "operationId": format!("patch{}", rt.kind),
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": rt.kind},
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{}.0", super::discovery::SERVER_MINOR)},
        "paths": paths,
        "components": {},
    }))
}
