//! Server-side printing: `meta.k8s.io/v1` Tables for pods and nodes, which kubectl asks for
//! (`Accept: application/json;as=Table;…`) to show STATUS, NODE and friends in `kubectl get`.
//! Other kinds fall back to kubectl's own NAME/AGE printing.

use serde_json::{Value, json};

use super::meta::{field_string, meta_str};
use super::resources::{ResourceType, Special};

/// Whether the Accept header asks for a Table.
pub fn wanted(accept: &str) -> bool {
    accept.contains("as=Table") && accept.contains("g=meta.k8s.io")
}

/// Whether this kind has a server-side table.
pub fn supported(rt: &ResourceType) -> bool {
    rt.special == Special::Pod || (rt.group.is_empty() && rt.plural == "nodes")
}

fn column(name: &str, priority: u8, description: &str) -> Value {
    json!({"name": name, "type": "string", "format": if name == "Name" { "name" } else { "" }, "description": description, "priority": priority})
}

fn columns(rt: &ResourceType) -> Vec<Value> {
    if rt.special == Special::Pod {
        vec![
            column("Name", 0, "Name of the pod"),
            column("Ready", 0, "Ready containers / containers"),
            column("Status", 0, "Phase or reason"),
            column("Restarts", 0, "Container restarts"),
            column("Age", 0, "Time since creation"),
            column("IP", 1, "Pod IP"),
            column("Node", 1, "Node the pod is bound to"),
            column("Nominated Node", 1, "Nominated node"),
            column("Readiness Gates", 1, "Readiness gates"),
        ]
    } else {
        vec![
            column("Name", 0, "Name of the node"),
            column("Status", 0, "Ready condition"),
            column("Roles", 0, "Node roles"),
            column("Age", 0, "Time since creation"),
            column("Version", 0, "Kubelet version"),
            column("GPUs", 1, "nvidia.com/gpu capacity"),
            column("GPU Model", 1, "nvidia.com/gpu.product label"),
        ]
    }
}

/// Kubernetes-style short age ("45s", "12m", "5h", "3d").
pub fn human_age(created: &str) -> String {
    let Ok(ts) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn cells(rt: &ResourceType, obj: &Value) -> Vec<Value> {
    let name = meta_str(obj, "name");
    let age = human_age(meta_str(obj, "creationTimestamp"));
    let or_none = |s: String| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s
        }
    };
    if rt.special == Special::Pod {
        let containers = obj
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let statuses = obj
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array);
        let ready = statuses.map_or(0, |s| s.iter().filter(|c| c["ready"] == true).count());
        let restarts: i64 = statuses.map_or(0, |s| {
            s.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
        });
        let reason = field_string(obj, "status.reason");
        let phase = field_string(obj, "status.phase");
        let status = if !reason.is_empty() {
            reason
        } else if obj.pointer("/metadata/deletionTimestamp").is_some() {
            "Terminating".into()
        } else if phase == "Succeeded" {
            "Completed".into()
        } else {
            phase
        };
        vec![
            json!(name),
            json!(format!("{ready}/{containers}")),
            json!(status),
            json!(restarts),
            json!(age),
            json!(or_none(field_string(obj, "status.podIP"))),
            json!(or_none(field_string(obj, "spec.nodeName"))),
            json!("<none>"),
            json!("<none>"),
        ]
    } else {
        let ready = obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| {
                if c["status"] == "True" {
                    "Ready"
                } else {
                    "NotReady"
                }
            })
            .unwrap_or("Unknown");
        let gpus = obj
            .pointer("/status/capacity/nvidia.com~1gpu")
            .map(|v| v.as_str().map_or(v.to_string(), str::to_string));
        let model = obj
            .pointer("/metadata/labels/nvidia.com~1gpu.product")
            .and_then(Value::as_str);
        vec![
            json!(name),
            json!(ready),
            json!("<none>"),
            json!(age),
            json!(field_string(obj, "status.nodeInfo.kubeletVersion")),
            json!(gpus.unwrap_or_else(|| "0".into())),
            json!(model.unwrap_or("<none>")),
        ]
    }
}

/// The Table for `objects` (already presented with kind/apiVersion). `full_objects` embeds each
/// object (`includeObject=Object`); otherwise rows carry PartialObjectMetadata.
pub fn table(rt: &ResourceType, objects: &[Value], rv: u64, full_objects: bool) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let object = if full_objects {
                obj.clone()
            } else {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
            };
            json!({"cells": cells(rt, obj), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns(rt),
        "rows": rows,
    })
}
