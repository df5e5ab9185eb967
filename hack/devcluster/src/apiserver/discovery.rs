//! Discovery documents: `/api`, `/apis`, `/apis/<group>`, `/api/v1`, `/apis/<group>/<version>`,
//! `/version`.

use serde_json::{Value, json};

use super::resources::{ALL_VERBS, Registry, ResourceType, Special};

/// Kubernetes version the server claims to be (what kubectl's skew check sees).
pub const SERVER_MINOR: &str = "34";

/// `GET /version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": SERVER_MINOR,
        "gitVersion": format!("v1.{SERVER_MINOR}.0-tessera-devcluster"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_object(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis`: every named group.
pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(group, _)| !group.is_empty())
        .map(|(group, versions)| group_object(group, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let groups = registry.groups();
    let (_, versions) = groups.iter().find(|(g, _)| g == name && !g.is_empty())?;
    let mut obj = group_object(name, versions);
    obj["kind"] = json!("APIGroup");
    obj["apiVersion"] = json!("v1");
    Some(obj)
}

fn resource_entry(rt: &ResourceType) -> Value {
    let verbs: &[&str] = match rt.special {
        Special::TokenReview | Special::SelfSubjectReview => &["create"],
        _ => ALL_VERBS,
    };
    let mut entry = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": verbs,
    });
    if !rt.short_names.is_empty() {
        entry["shortNames"] = json!(rt.short_names);
    }
    if !rt.categories.is_empty() {
        entry["categories"] = json!(rt.categories);
    }
    entry
}

fn sub_entry(rt: &ResourceType, sub: &str, kind: &str, verbs: &[&str]) -> Value {
    json!({
        "name": format!("{}/{sub}", rt.plural),
        "singularName": "",
        "namespaced": rt.namespaced,
        "kind": kind,
        "verbs": verbs,
    })
}

/// `GET /api/v1` or `/apis/<group>/<version>`: an APIResourceList, or `None` if the group
/// version is not served.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.resources(group, version);
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for rt in &types {
        resources.push(resource_entry(rt));
        if rt.status_subresource {
            resources.push(sub_entry(
                rt,
                "status",
                &rt.kind,
                &["get", "patch", "update"],
            ));
        }
        if rt.special == Special::Pod {
            resources.push(sub_entry(rt, "binding", "Binding", &["create"]));
            let mut eviction = sub_entry(rt, "eviction", "Eviction", &["create"]);
            eviction["group"] = json!("policy");
            eviction["version"] = json!("v1");
            resources.push(eviction);
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}
