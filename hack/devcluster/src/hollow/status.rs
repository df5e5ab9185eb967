//! The Node and pod-status documents a kubelet would write.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::apiserver::meta::now_rfc3339;

/// The Node object a hollow node registers.
pub fn node_object(
    name: &str,
    labels: &BTreeMap<String, String>,
    capacity: &BTreeMap<String, String>,
    gpu_model: &str,
    gpu_memory_mib: u64,
) -> Value {
    let mut all_labels: BTreeMap<String, String> = BTreeMap::from([
        ("kubernetes.io/hostname".into(), name.into()),
        ("kubernetes.io/os".into(), "linux".into()),
        ("kubernetes.io/arch".into(), "amd64".into()),
        ("type".into(), "hollow".into()),
        ("nvidia.com/gpu.product".into(), gpu_model.replace(' ', "-")),
        ("nvidia.com/gpu.memory".into(), gpu_memory_mib.to_string()),
    ]);
    all_labels.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    let now = now_rfc3339();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "hollow kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name,
                "kernelVersion": "hollow", "osImage": "Tessera hollow node",
                "containerRuntimeVersion": "hollow://1", "kubeletVersion": "v1.34.0-hollow",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    })
}

fn condition(kind: &str, status: bool, now: &str) -> Value {
    json!({"type": kind, "status": if status { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": now})
}

fn container_names(pod: &Value) -> Vec<(String, String)> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    (text("name"), text("image"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Status of a pod whose containers all started.
pub fn running(pod: &Value, pod_ip: &str) -> Value {
    let now = now_rfc3339();
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let statuses: Vec<Value> = container_names(pod)
        .into_iter()
        .map(|(name, image)| {
            json!({
                "name": name, "image": image, "imageID": format!("hollow://{image}"),
                "containerID": format!("hollow://{uid}/{name}"),
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    json!({"status": {
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers", true, &now), condition("Initialized", true, &now),
            condition("Ready", true, &now), condition("ContainersReady", true, &now),
            condition("PodScheduled", true, &now),
        ],
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": now, "containerStatuses": statuses, "qosClass": "BestEffort",
    }})
}

/// Status of a pod whose containers all exited with code 0.
pub fn succeeded(pod: &Value) -> Value {
    let now = now_rfc3339();
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let started = pod
        .pointer("/status/startTime")
        .cloned()
        .unwrap_or(json!(now));
    let statuses: Vec<Value> = container_names(pod)
        .into_iter()
        .map(|(name, image)| json!({
            "name": name, "image": image, "imageID": format!("hollow://{image}"),
            "containerID": format!("hollow://{uid}/{name}"),
            "ready": false, "started": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": now}},
        }))
        .collect();
    let mut conditions = pod
        .pointer("/status/conditions")
        .cloned()
        .unwrap_or(json!([]));
    if let Value::Array(list) = &mut conditions {
        for c in list.iter_mut() {
            if matches!(
                c.get("type").and_then(Value::as_str),
                Some("Ready" | "ContainersReady" | "PodReadyToStartContainers")
            ) {
                c["status"] = json!("False");
                c["reason"] = json!("PodCompleted");
                c["lastTransitionTime"] = json!(now);
            }
        }
    }
    json!({"status": {"phase": "Succeeded", "conditions": conditions, "containerStatuses": statuses}})
}

/// Status of a pod the kubelet refused at admission (e.g. not enough devices).
pub fn rejected(reason: &str, message: &str) -> Value {
    json!({"status": {"phase": "Failed", "reason": reason, "message": message}})
}
