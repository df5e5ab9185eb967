//! A pod's GPUs per container, as the kubelet's device manager hands them out.
//!
//! The core places a pod's GPUs as one set: as many as the kubelet will take for it (the app
//! containers' sum, or the largest init container's, sidecars on top). The device manager then
//! allocates container by container — init containers first, in order, then the app
//! containers — and gives a container the devices an earlier *non-restartable* init container
//! held before any new one (`devicesToReuse`); a sidecar (an init container with
//! `restartPolicy: Always`) keeps its devices while the pod runs, so they are not reused.
//! [`split`] writes the assignment the same way, so each container's `Allocate` asks for the
//! GPUs its entry names; [`merged`] is the inverse view the core needs: each GPU once.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::requests::is_restartable;
use tessera_contract::pod::{allocation_order, container_gpus};
use tessera_core::model::{Assignment, ContainerAssignment, GpuSlice};

/// Whole GPUs a container asks for, 0 when unreadable (which the pod's translation reports).
fn gpus_of(c: &Container) -> usize {
    container_gpus(c).map_or(0, |n| n as usize)
}

/// `assignment` (the pod's GPUs, as the core placed them) split per container in the
/// device manager's order. Returned unchanged when only one container asks for GPUs (a
/// shared GPU always goes to one container) or when the GPUs do not cover what the containers
/// ask for (the core then placed something else, which is passed through as it is).
pub fn split(spec: &PodSpec, assignment: &Assignment) -> Assignment {
    let asking: Vec<(&Container, bool)> = allocation_order(spec)
        .map(|c| (c.container, c.is_init()))
        .filter(|(c, _)| gpus_of(c) > 0)
        .collect();
    if asking.len() < 2 {
        return assignment.clone();
    }
    let gpus: Vec<GpuSlice> = assignment.slices().cloned().collect();
    let mut fresh = gpus.iter();
    // Devices an earlier non-restartable init container held, reusable by what follows.
    let mut reusable: Vec<GpuSlice> = Vec::new();
    let mut containers = Vec::new();
    for (c, init) in asking {
        let need = gpus_of(c);
        let mut mine: Vec<GpuSlice> = Vec::new();
        while mine.len() < need && !reusable.is_empty() {
            mine.push(reusable.remove(0));
        }
        while mine.len() < need {
            let Some(g) = fresh.next() else {
                return assignment.clone();
            };
            mine.push(g.clone());
        }
        if init && !is_restartable(c) {
            // The next container may take these again; the kubelet frees them once this
            // init container has finished.
            let mut back = mine.clone();
            back.extend(std::mem::take(&mut reusable));
            reusable = back;
        }
        containers.push(ContainerAssignment {
            container: c.name.clone(),
            gpus: mine,
        });
    }
    Assignment { containers }
}

/// Each GPU of `assignment` once (containers that reuse an init container's GPU name it
/// again): what the pod holds, for capacity. Of repeated entries the largest share counts.
pub fn merged(assignment: &Assignment) -> Assignment {
    if assignment.containers.len() < 2 {
        return assignment.clone();
    }
    let mut by_uuid: BTreeMap<&str, GpuSlice> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for s in assignment.slices() {
        match by_uuid.get_mut(s.uuid.as_str()) {
            Some(held) => {
                held.compute_milli = held.compute_milli.max(s.compute_milli);
                held.memory_mib = held.memory_mib.max(s.memory_mib);
            }
            None => {
                order.push(&s.uuid);
                by_uuid.insert(&s.uuid, s.clone());
            }
        }
    }
    let container = assignment
        .containers
        .iter()
        .find(|c| !c.gpus.is_empty())
        .map(|c| c.container.clone())
        .unwrap_or_default();
    Assignment {
        containers: vec![ContainerAssignment {
            container,
            gpus: order
                .into_iter()
                .filter_map(|u| by_uuid.remove(u))
                .collect(),
        }],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn whole(uuid: &str) -> GpuSlice {
        GpuSlice {
            uuid: uuid.into(),
            memory_mib: 81920,
            compute_milli: 1000,
        }
    }

    fn placed(uuids: &[&str]) -> Assignment {
        Assignment {
            containers: vec![ContainerAssignment {
                container: "main".into(),
                gpus: uuids.iter().map(|u| whole(u)).collect(),
            }],
        }
    }

    fn spec(init: serde_json::Value, containers: serde_json::Value) -> PodSpec {
        serde_json::from_value(json!({"initContainers": init, "containers": containers})).unwrap()
    }

    fn c(name: &str, gpus: u32) -> serde_json::Value {
        json!({"name": name, "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}})
    }

    fn names(a: &Assignment) -> Vec<(String, Vec<String>)> {
        a.containers
            .iter()
            .map(|c| {
                (
                    c.container.clone(),
                    c.gpus.iter().map(|g| g.uuid.clone()).collect(),
                )
            })
            .collect()
    }

    fn entry(name: &str, uuids: &[&str]) -> (String, Vec<String>) {
        (name.into(), uuids.iter().map(|u| u.to_string()).collect())
    }

    #[test]
    fn one_gpu_container_keeps_its_assignment() {
        let s = spec(json!([]), json!([c("main", 2), {"name": "log"}]));
        assert_eq!(split(&s, &placed(&["g0", "g1"])), placed(&["g0", "g1"]));
    }

    #[test]
    fn app_containers_get_disjoint_gpus_in_order() {
        let s = spec(json!([]), json!([c("a", 1), c("b", 2)]));
        let out = split(&s, &placed(&["g0", "g1", "g2"]));
        assert_eq!(
            names(&out),
            vec![entry("a", &["g0"]), entry("b", &["g1", "g2"])]
        );
        assert_eq!(
            merged(&out),
            Assignment {
                containers: vec![ContainerAssignment {
                    container: "a".into(),
                    gpus: vec![whole("g0"), whole("g1"), whole("g2")],
                }],
            }
        );
    }

    #[test]
    fn app_containers_reuse_an_init_containers_gpus_first() {
        // The kubelet allocates the init container's device, then hands it to main.
        let s = spec(json!([c("warm", 1)]), json!([c("main", 1)]));
        let out = split(&s, &placed(&["g0"]));
        assert_eq!(
            names(&out),
            vec![entry("warm", &["g0"]), entry("main", &["g0"])]
        );
        assert_eq!(merged(&out).slices().count(), 1, "g0 is held once");
        // An init container larger than the app container: max(2, 1) = 2 GPUs placed.
        let s = spec(json!([c("warm", 2)]), json!([c("main", 1), c("side", 1)]));
        let out = split(&s, &placed(&["g0", "g1"]));
        assert_eq!(
            names(&out),
            vec![
                entry("warm", &["g0", "g1"]),
                entry("main", &["g0"]),
                entry("side", &["g1"])
            ]
        );
    }

    #[test]
    fn a_sidecar_keeps_its_gpu_beside_the_app_containers() {
        let mut side = c("side", 1);
        side["restartPolicy"] = json!("Always");
        let s = spec(json!([side]), json!([c("main", 1)]));
        let out = split(&s, &placed(&["g0", "g1"]));
        assert_eq!(
            names(&out),
            vec![entry("side", &["g0"]), entry("main", &["g1"])]
        );
    }

    #[test]
    fn too_few_gpus_pass_through_unchanged() {
        let s = spec(json!([]), json!([c("a", 1), c("b", 2)]));
        assert_eq!(split(&s, &placed(&["g0"])), placed(&["g0"]));
    }
}
