//! Pod translation: every label, annotation and migration alias of the user contract, the
//! Kubernetes placement constraints field by field (requests as kube-scheduler sums them,
//! tolerations, affinities, spread, ports, gates), and every bad input answered with an error
//! naming the field and the accepted form.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod as KubePod;
use serde_json::{Value, json};
use tessera_contract::keys;
use tessera_coordinator::translate::GroupSource;
use tessera_coordinator::translate::pod::{PodContext, TranslatedPod, translate};
use tessera_core::model::{
    Assignment, GpuShare, HostPort, InclusionPolicy, InputError, Isolation, LabelSelector,
    NamespaceScope, NodeSelectorTerm, PodAffinityTerm, PreferredNodeTerm, Requirement, SelectorOp,
    SpreadConstraint, TaintEffect, Toleration, TolerationOp, WeightedPodTerm,
};

fn ctx() -> PodContext {
    PodContext {
        scheduler_name: "tessera".into(),
        priority_classes: BTreeMap::from([("high".into(), 1000), ("low".into(), 10)]),
        default_priority: 0,
        now: 5000,
    }
}

/// A tessera pod with `labels`, `annotations` and one container `main` with `limits`.
fn pod(labels: Value, annotations: Value, limits: Value) -> KubePod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                     "labels": labels, "annotations": annotations,
                     "creationTimestamp": "2026-01-01T00:00:10Z"},
        "spec": {"schedulerName": "tessera",
                 "containers": [{"name": "main", "resources": {"limits": limits}}]},
    }))
    .expect("valid pod")
}

fn run(p: &KubePod) -> TranslatedPod {
    translate(p, &ctx()).expect("pod is translated")
}

fn annotated(annotations: Value) -> TranslatedPod {
    run(&pod(json!({}), annotations, json!({"nvidia.com/gpu": "1"})))
}

#[test]
fn defaults_for_a_plain_pod() {
    let t = run(&pod(json!({}), json!({}), json!({})));
    let p = &t.pod;
    assert_eq!(p.uid, "u1");
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ns", "p"));
    assert_eq!(p.queue, "default");
    assert!(!t.queue_labelled);
    assert_eq!(p.gpu.count, 0);
    assert_eq!(p.isolation, Isolation::Watchdog);
    assert_eq!(p.priority, 0);
    assert!(p.preemptible);
    assert_eq!(p.group, None);
    assert_eq!(p.gpu_container, "main");
    assert!(p.placement.is_none());
    assert!(!p.terminating && !p.owned_by_other_scheduler);
    assert!(p.input_errors.is_empty());
    assert_eq!(p.created, 1_767_225_610);
}

#[test]
fn gpu_shares_from_annotations_and_aliases() {
    let cases: &[(Value, u32, GpuShare)] = &[
        (json!({}), 1, GpuShare::Whole),
        (
            json!({"tessera.dev/gpu-fraction": "0.25"}),
            1,
            GpuShare::Fraction(250),
        ),
        (json!({"gpu-fraction": "0.5"}), 1, GpuShare::Fraction(500)),
        (
            json!({"tessera.dev/gpu-fraction": "1"}),
            1,
            GpuShare::Fraction(1000),
        ),
        (
            json!({"tessera.dev/gpu-fraction": ".75"}),
            1,
            GpuShare::Fraction(750),
        ),
        (
            json!({"tessera.dev/gpu-memory": "10Gi"}),
            1,
            GpuShare::MemoryMib(10_240),
        ),
        (
            json!({"tessera.dev/gpu-memory": "4096Mi"}),
            1,
            GpuShare::MemoryMib(4096),
        ),
        (
            json!({"tessera.dev/gpu-memory": "4096"}),
            1,
            GpuShare::MemoryMib(4096),
        ),
        (json!({"gpu-memory": "2Gi"}), 1, GpuShare::MemoryMib(2048)),
    ];
    for (annotations, count, share) in cases {
        let t = annotated(annotations.clone());
        assert!(
            t.pod.input_errors.is_empty(),
            "{annotations}: {:?}",
            t.pod.input_errors
        );
        assert_eq!(
            (t.pod.gpu.count, t.pod.gpu.per_gpu),
            (*count, *share),
            "{annotations}"
        );
    }
    // Without nvidia.com/gpu (the KAI convention) a fraction shares one GPU, or
    // gpu-fraction-num-devices of them.
    let t = run(&pod(json!({}), json!({"gpu-fraction": "0.5"}), json!({})));
    assert_eq!(
        (t.pod.gpu.count, t.pod.gpu.per_gpu),
        (1, GpuShare::Fraction(500))
    );
    let t = run(&pod(
        json!({}),
        json!({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}),
        json!({}),
    ));
    assert_eq!(
        (t.pod.gpu.count, t.pod.gpu.per_gpu),
        (2, GpuShare::Fraction(500))
    );
    let t = run(&pod(json!({}), json!({}), json!({"nvidia.com/gpu": "4"})));
    assert_eq!((t.pod.gpu.count, t.pod.gpu.per_gpu), (4, GpuShare::Whole));
}

#[test]
fn labels_and_other_annotations() {
    let t = run(&pod(
        json!({"tessera.dev/queue": "team-a", "tessera.dev/preemptible": "false"}),
        json!({"tessera.dev/isolation": "mps", "tessera.dev/pod-group": "g1",
               "tessera.dev/min-member": "4", "tessera.dev/topology-required": "rack",
               "tessera.dev/topology-preferred": "block"}),
        json!({}),
    ));
    assert_eq!(t.pod.queue, "team-a");
    assert!(t.queue_labelled);
    assert!(!t.pod.preemptible);
    assert_eq!(t.pod.isolation, Isolation::Mps);
    assert_eq!(t.pod.group.as_deref(), Some("g1"));
    assert_eq!(t.group_source, Some(GroupSource::Annotation("g1".into())));
    assert_eq!(t.pod.min_member, Some(4));
    assert_eq!(t.topology_required.as_deref(), Some("rack"));
    assert_eq!(t.topology_preferred.as_deref(), Some("block"));
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);

    let t = run(&pod(
        json!({"kai.scheduler/queue": "team-b"}),
        json!({"pod-group-name": "g2"}),
        json!({}),
    ));
    assert_eq!(t.pod.queue, "team-b");
    assert_eq!(t.pod.group.as_deref(), Some("g2"));
    // The tessera name wins over the alias.
    let t = run(&pod(
        json!({"tessera.dev/queue": "new", "kai.scheduler/queue": "old"}),
        json!({}),
        json!({}),
    ));
    assert_eq!(t.pod.queue, "new");
    for (mode, want) in [
        ("watchdog", Isolation::Watchdog),
        ("mps", Isolation::Mps),
        ("mig", Isolation::Mig),
        ("none", Isolation::None),
    ] {
        let t = annotated(json!({"tessera.dev/isolation": mode}));
        assert_eq!(t.pod.isolation, want);
    }
}

fn errors_of(t: &TranslatedPod) -> &[InputError] {
    &t.pod.input_errors
}

#[test]
fn bad_input_names_the_field_and_the_accepted_form() {
    // (annotations, labels, limits, field, words the message must contain)
    let cases: &[(Value, Value, Value, &str, &[&str])] = &[
        (
            json!({"tessera.dev/gpu-fraction": "1.5"}),
            json!({}),
            json!({"nvidia.com/gpu": "1"}),
            "tessera.dev/gpu-fraction",
            &["\"1.5\" is not a decimal in (0, 1]", "\"0.25\""],
        ),
        (
            json!({"tessera.dev/gpu-fraction": "abc"}),
            json!({}),
            json!({"nvidia.com/gpu": "1"}),
            "tessera.dev/gpu-fraction",
            &["\"abc\"", "(0, 1]"],
        ),
        (
            json!({"tessera.dev/gpu-fraction": "0"}),
            json!({}),
            json!({}),
            "tessera.dev/gpu-fraction",
            &["(0, 1]"],
        ),
        (
            json!({"tessera.dev/gpu-fraction": "-0.5"}),
            json!({}),
            json!({}),
            "tessera.dev/gpu-fraction",
            &["(0, 1]"],
        ),
        (
            json!({"gpu-fraction": "50%"}),
            json!({}),
            json!({}),
            "gpu-fraction",
            &["(0, 1]"],
        ),
        (
            json!({"tessera.dev/gpu-fraction": "0.5", "tessera.dev/gpu-memory": "10Gi"}),
            json!({}),
            json!({}),
            "tessera.dev/gpu-fraction",
            &["both", "tessera.dev/gpu-memory", "only one"],
        ),
        (
            json!({"tessera.dev/gpu-memory": "ten"}),
            json!({}),
            json!({}),
            "tessera.dev/gpu-memory",
            &["\"ten\"", "10Gi", "4096Mi"],
        ),
        (
            json!({"tessera.dev/gpu-memory": "0"}),
            json!({}),
            json!({}),
            "tessera.dev/gpu-memory",
            &["zero", "10Gi"],
        ),
        (
            json!({"gpu-memory": "-1Gi"}),
            json!({}),
            json!({}),
            "gpu-memory",
            &["negative"],
        ),
        (
            json!({"tessera.dev/isolation": "sandbox"}),
            json!({}),
            json!({}),
            "tessera.dev/isolation",
            &["\"sandbox\"", "watchdog, mps, mig, none"],
        ),
        (
            json!({"tessera.dev/min-member": "two", "tessera.dev/pod-group": "g"}),
            json!({}),
            json!({}),
            "tessera.dev/min-member",
            &["\"two\"", "whole number"],
        ),
        (
            json!({"tessera.dev/min-member": "2.5", "tessera.dev/pod-group": "g"}),
            json!({}),
            json!({}),
            "tessera.dev/min-member",
            &["whole number"],
        ),
        (
            json!({"tessera.dev/min-member": "0", "tessera.dev/pod-group": "g"}),
            json!({}),
            json!({}),
            "tessera.dev/min-member",
            &["at least 1"],
        ),
        (
            json!({"tessera.dev/min-member": "3"}),
            json!({}),
            json!({}),
            "tessera.dev/min-member",
            &["no group", "tessera.dev/pod-group"],
        ),
        (
            json!({"tessera.dev/pod-group": " "}),
            json!({}),
            json!({}),
            "tessera.dev/pod-group",
            &["empty"],
        ),
        (
            json!({"tessera.dev/topology-required": ""}),
            json!({}),
            json!({}),
            "tessera.dev/topology-required",
            &["empty", "rack"],
        ),
        (
            json!({}),
            json!({"tessera.dev/preemptible": "maybe"}),
            json!({}),
            "tessera.dev/preemptible",
            &["\"maybe\"", "\"true\" or \"false\""],
        ),
        (
            json!({}),
            json!({"tessera.dev/queue": ""}),
            json!({}),
            "tessera.dev/queue",
            &["empty", "leaf Queue"],
        ),
        (
            json!({}),
            json!({}),
            json!({"nvidia.com/gpu": "1.5"}),
            "spec.containers[0].resources.limits.nvidia.com/gpu",
            &["whole number of GPUs", "tessera.dev/gpu-fraction"],
        ),
        (
            json!({}),
            json!({}),
            json!({"cpu": "lots"}),
            "spec.containers[0].resources.limits.cpu",
            &["\"lots\"", "500m"],
        ),
        (
            json!({}),
            json!({}),
            json!({"memory": "12Q"}),
            "spec.containers[0].resources.limits.memory",
            &["64Gi"],
        ),
        (
            json!({"gpu-fraction-num-devices": "2"}),
            json!({}),
            json!({}),
            "gpu-fraction-num-devices",
            &["without"],
        ),
        (
            json!({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "x"}),
            json!({}),
            json!({}),
            "gpu-fraction-num-devices",
            &["whole number"],
        ),
    ];
    for (annotations, labels, limits, field, words) in cases {
        let t = run(&pod(labels.clone(), annotations.clone(), limits.clone()));
        let errs = errors_of(&t);
        let e = errs.iter().find(|e| e.field == *field).unwrap_or_else(|| {
            panic!("{annotations} {labels} {limits}: no error on {field}: {errs:?}")
        });
        for w in *words {
            assert!(
                e.message.contains(w),
                "{field}: {:?} lacks {w:?}",
                e.message
            );
        }
    }
}

#[test]
fn bad_input_on_a_spec_field_names_it() {
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"schedulerName": "tessera", "priorityClassName": "nope",
                 "containers": [
                     {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                     {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    let t = run(&p);
    let fields: Vec<&str> = t
        .pod
        .input_errors
        .iter()
        .map(|e| e.field.as_str())
        .collect();
    assert_eq!(fields, vec!["spec.priorityClassName"]);
    // Whole GPUs in two containers: the pod takes both, the kubelet gives each its own.
    assert_eq!(t.pod.gpu.count, 2);
    // A GPU share goes to one container: a second one asking is named.
    let mut shared = p.clone();
    shared.metadata.annotations =
        Some([("tessera.dev/gpu-fraction".to_owned(), "0.5".to_owned())].into());
    let t = run(&shared);
    let e = t
        .pod
        .input_errors
        .iter()
        .find(|e| e.field == "spec.containers[1].resources.limits.nvidia.com/gpu")
        .expect("the second container is named");
    assert!(e.message.contains("goes to one container"), "{}", e.message);
}

#[test]
fn init_containers_count_toward_our_pods_whole_gpus() {
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"schedulerName": "tessera",
                 "initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                 "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
    assert_eq!(
        t.pod.gpu.count, 3,
        "the init container's three, reused by main"
    );
}

#[test]
fn priority_and_preemptibility() {
    let with = |spec: Value, labels: Value| {
        let mut s = json!({"schedulerName": "tessera", "containers": [{"name": "c"}]});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        let p: KubePod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": labels}, "spec": s,
        }))
        .unwrap();
        run(&p).pod
    };
    let p = with(json!({"priority": 500}), json!({}));
    assert_eq!((p.priority, p.preemptible), (500, false));
    let p = with(json!({"priorityClassName": "high"}), json!({}));
    assert_eq!((p.priority, p.preemptible), (1000, false));
    let p = with(json!({"priorityClassName": "low"}), json!({}));
    assert_eq!((p.priority, p.preemptible), (10, true));
    // spec.priority (set by admission) wins over the class lookup.
    let p = with(
        json!({"priorityClassName": "high", "priority": 7}),
        json!({}),
    );
    assert_eq!(p.priority, 7);
    let p = with(
        json!({"priority": 500}),
        json!({"tessera.dev/preemptible": "true"}),
    );
    assert!(p.preemptible);
    let p = with(json!({}), json!({"tessera.dev/preemptible": "False"}));
    assert!(!p.preemptible);
    let mut c = ctx();
    c.default_priority = 200;
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p"}, "spec": {"schedulerName": "tessera", "containers": []},
    }))
    .unwrap();
    assert_eq!(translate(&p, &c).unwrap().pod.priority, 200);
}

#[test]
fn requests_sum_containers_with_init_max_and_overhead() {
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"schedulerName": "tessera",
            "nodeSelector": {"gpu": "h100"},
            "overhead": {"cpu": "100m", "memory": "16Mi"},
            "initContainers": [
                {"name": "i1", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}},
                {"name": "i2", "resources": {"requests": {"cpu": "500m", "memory": "8Gi"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi", "nvidia.com/gpu": "2"}}}]},
    }))
    .unwrap();
    let t = run(&p);
    // cpu: max(1 + 1.5, 3) + 0.1; memory: max(2Gi + 1Gi, 8Gi) + 16Mi.
    assert_eq!(t.pod.cpu_milli, 3100);
    assert_eq!(t.pod.memory_mib, 8192 + 16);
    assert_eq!(t.pod.gpu.count, 2);
    assert_eq!(t.pod.gpu_container, "b");
    assert_eq!(
        t.pod.node_selector.get("gpu").map(String::as_str),
        Some("h100")
    );
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
}

#[test]
fn placement_terminating_and_other_schedulers() {
    let assignment = json!({"containers": [{"container": "main",
        "gpus": [{"uuid": "GPU-1", "memory_mib": 40960, "compute_milli": 500}]}]});
    let bound_with = |annotations: serde_json::Value| -> KubePod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": annotations},
            "spec": {"schedulerName": "tessera", "nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    };
    let p = bound_with(json!({"tessera.dev/assignment": assignment.to_string(),
        "tessera.dev/assigned-at": "2026-01-01T00:00:00Z"}));
    let t = run(&p);
    let placement = t.pod.placement.clone().expect("bound");
    assert_eq!(placement.node, "n1");
    let want: Assignment = serde_json::from_value(assignment.clone()).unwrap();
    assert_eq!(placement.assignment, want);
    assert!(t.pod.terminating);

    // The same assignment without the Binding's own timestamp was not written by Tessera's
    // Binding (the pod was created with it): ignored, with a warning naming the key.
    let t = run(&bound_with(
        json!({"tessera.dev/assignment": assignment.to_string()}),
    ));
    assert_eq!(t.pod.placement.unwrap().assignment, Assignment::default());
    assert_eq!(t.warnings[0].field, keys::ASSIGNMENT);
    assert!(
        t.warnings[0]
            .message
            .contains("not written by Tessera's Binding"),
        "{:?}",
        t.warnings
    );

    // An unreadable assignment on a bound pod is a warning, not a scheduling error.
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": {"tessera.dev/assignment": "{oops",
            "tessera.dev/assigned-at": "2026-01-01T00:00:00Z"}},
        "spec": {"schedulerName": "tessera", "nodeName": "n1", "containers": [{"name": "main"}]},
    }))
    .unwrap();
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty());
    assert_eq!(t.warnings[0].field, keys::ASSIGNMENT);
    assert_eq!(t.pod.placement.unwrap().assignment, Assignment::default());

    // Another scheduler's bound pod counts (whole GPUs, no validation of our annotations).
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "other", "annotations": {"tessera.dev/gpu-fraction": "9"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                          "uid": "x", "controller": true}]},
        "spec": {"nodeName": "n2", "containers": [{"name": "c",
                 "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
    }))
    .unwrap();
    let t = run(&p);
    assert!(t.pod.owned_by_other_scheduler);
    assert_eq!((t.pod.gpu.count, t.pod.gpu.per_gpu), (2, GpuShare::Whole));
    assert!(t.pod.input_errors.is_empty());
    assert_eq!(t.pod.group, None);

    // Skipped: another scheduler's unbound pod, and finished pods.
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "x"}, "spec": {"containers": []},
    }))
    .unwrap();
    assert!(translate(&p, &ctx()).is_none());
    for phase in ["Succeeded", "Failed"] {
        let p: KubePod = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"schedulerName": "tessera", "nodeName": "n", "containers": []},
            "status": {"phase": phase},
        }))
        .unwrap();
        assert!(translate(&p, &ctx()).is_none(), "{phase}");
    }
}

#[test]
fn owners_imply_groups() {
    let owned = |kind: &str, labels: Value| {
        let p: KubePod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": labels, "ownerReferences": [
                {"apiVersion": "x/v1", "kind": kind, "name": "train", "uid": "o", "controller": true}]},
            "spec": {"schedulerName": "tessera", "containers": []},
        }))
        .unwrap();
        run(&p).pod.group
    };
    assert_eq!(owned("Job", json!({})).as_deref(), Some("job-train"));
    assert_eq!(
        owned("PyTorchJob", json!({})).as_deref(),
        Some("pytorchjob-train")
    );
    assert_eq!(owned("MPIJob", json!({})).as_deref(), Some("mpijob-train"));
    assert_eq!(owned("ReplicaSet", json!({})), None);
    assert_eq!(owned("StatefulSet", json!({})), None);
    // A JobSet's pods are owned by its Jobs; the JobSet label names the top owner.
    assert_eq!(
        owned("Job", json!({"jobset.sigs.k8s.io/jobset-name": "big"})).as_deref(),
        Some("jobset-big")
    );
}

/// A tessera pod with `labels` and the given spec fields (merged over one container `main`).
fn with_spec(labels: Value, spec: Value) -> KubePod {
    let mut s = json!({"schedulerName": "tessera", "containers": [{"name": "main"}]});
    s.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": labels},
        "spec": s,
    }))
    .expect("valid pod")
}

fn req(key: &str, operator: SelectorOp, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

fn first_error(t: &TranslatedPod) -> &InputError {
    t.pod
        .input_errors
        .first()
        .unwrap_or_else(|| panic!("no input error in {:?}", t.pod.constraints))
}

#[test]
fn requests_follow_kube_scheduler_sidecars_pod_level_and_overhead() {
    let p = with_spec(
        json!({}),
        json!({
            "initContainers": [
                // A sidecar: runs alongside everything after it.
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi",
                                            "example.com/nic": "1"}}},
                // Runs alone next to the sidecar: 2 + 0.5 CPU.
                {"name": "setup", "resources": {"requests": {"cpu": "2", "ephemeral-storage": "10Gi"}}},
            ],
            "containers": [
                {"name": "main", "resources": {
                    "requests": {"cpu": "1", "memory": "2Gi", "hugepages-2Mi": "64Mi"},
                    "limits": {"nvidia.com/gpu": "1", "example.com/fpga": "2"}}},
                {"name": "side", "resources": {"requests": {"memory": "512Mi", "cpu": "250m"}}},
            ],
            "overhead": {"cpu": "100m", "memory": "16Mi"},
        }),
    );
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
    // cpu: max(1 + 0.25 + 0.5, 2 + 0.5) + 0.1; memory: 2Gi + 512Mi + 1Gi + 16Mi.
    assert_eq!(t.pod.cpu_milli, 2600);
    assert_eq!(t.pod.memory_mib, 2048 + 512 + 1024 + 16);
    assert_eq!(
        t.pod.constraints.extended,
        BTreeMap::from([
            ("ephemeral-storage".to_string(), 10 << 30),
            ("example.com/fpga".to_string(), 2),
            ("example.com/nic".to_string(), 1),
            ("hugepages-2Mi".to_string(), 64 << 20),
        ]),
        "GPUs, CPU and memory are not extended resources"
    );

    // Pod-level requests replace the containers' sum for CPU and memory (not the rest).
    let p = with_spec(
        json!({}),
        json!({
            "resources": {"requests": {"cpu": "4", "memory": "8Gi"}},
            "containers": [{"name": "main", "resources": {"requests": {
                "cpu": "1", "memory": "1Gi", "ephemeral-storage": "1G"}}}],
        }),
    );
    let t = run(&p);
    assert_eq!((t.pod.cpu_milli, t.pod.memory_mib), (4000, 8192));
    assert_eq!(
        t.pod.constraints.extended["ephemeral-storage"],
        1_000_000_000
    );

    // Amounts are summed exactly and rounded once: two 0.5 MiB containers need 1 MiB.
    let p = with_spec(
        json!({}),
        json!({"containers": [
            {"name": "a", "resources": {"requests": {"memory": "512Ki"}}},
            {"name": "b", "resources": {"requests": {"memory": "512Ki"}}},
        ]}),
    );
    assert_eq!(run(&p).pod.memory_mib, 1);

    for (spec, field) in [
        (
            json!({"containers": [{"name": "main", "resources": {"requests": {"example.com/x": "lots"}}}]}),
            "spec.containers[0].resources.requests.example.com/x",
        ),
        (json!({"overhead": {"cpu": "-1"}}), "spec.overhead.cpu"),
        (
            json!({"initContainers": [{"name": "i", "resources": {"limits": {"memory": "1Qi"}}}]}),
            "spec.initContainers[0].resources.limits.memory",
        ),
    ] {
        let t = run(&with_spec(json!({}), spec.clone()));
        assert_eq!(first_error(&t).field, field, "{spec}");
    }
}

#[test]
fn tolerations_and_the_implicit_gpu_toleration() {
    let p = with_spec(
        json!({}),
        json!({"tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
            {"key": "spot", "operator": "Exists"},
            {"key": "plain", "value": "v"},
            {"operator": "Exists"},
        ]}),
    );
    let t = run(&p);
    let tol = |key: &str, operator, value: &str, effect| Toleration {
        key: key.into(),
        operator,
        value: value.into(),
        effect,
    };
    assert_eq!(
        t.pod.constraints.tolerations,
        vec![
            tol(
                "dedicated",
                TolerationOp::Equal,
                "x",
                Some(TaintEffect::NoSchedule)
            ),
            tol("spot", TolerationOp::Exists, "", None),
            tol("plain", TolerationOp::Equal, "v", None),
            tol("", TolerationOp::Exists, "", None),
        ]
    );

    // A GPU pod of Tessera's tolerates nvidia.com/gpu taints (NoSchedule and NoExecute).
    let gpu = |t: &TranslatedPod| -> Vec<Option<TaintEffect>> {
        t.pod
            .constraints
            .tolerations
            .iter()
            .filter(|t| t.key == "nvidia.com/gpu" && t.operator == TolerationOp::Exists)
            .map(|t| t.effect)
            .collect()
    };
    let whole = run(&pod(json!({}), json!({}), json!({"nvidia.com/gpu": "1"})));
    assert_eq!(
        gpu(&whole),
        [Some(TaintEffect::NoSchedule), Some(TaintEffect::NoExecute)]
    );
    let fraction = annotated(json!({"tessera.dev/gpu-fraction": "0.5"}));
    assert_eq!(gpu(&fraction).len(), 2);
    let cpu_only = run(&pod(json!({}), json!({}), json!({})));
    assert!(gpu(&cpu_only).is_empty());

    for (t, field) in [
        (
            json!({"key": "k", "operator": "Gt", "value": "3"}),
            "spec.tolerations[0].operator",
        ),
        (
            json!({"key": "k", "effect": "Sometimes"}),
            "spec.tolerations[0].effect",
        ),
    ] {
        let p = with_spec(json!({}), json!({"tolerations": [t.clone()]}));
        let tr = run(&p);
        let e = first_error(&tr);
        assert_eq!(e.field, field, "{t}");
        assert!(e.message.contains("use"), "{e:?}");
    }
}

#[test]
fn node_affinity_required_and_preferred() {
    let p = with_spec(
        json!({}),
        json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "gen", "operator": "Gt", "values": ["3"]},
                    {"key": "spot", "operator": "DoesNotExist"}]},
                {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 20, "preference": {"matchExpressions": [
                    {"key": "disk", "operator": "Exists"}]}},
            ],
        }}}),
    );
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
    let c = &t.pod.constraints;
    let required = c.node_affinity.as_ref().expect("required node affinity");
    assert_eq!(
        required.terms,
        vec![
            NodeSelectorTerm {
                match_expressions: vec![
                    req("zone", SelectorOp::In, &["a", "b"]),
                    req("gen", SelectorOp::Gt, &["3"]),
                    req("spot", SelectorOp::DoesNotExist, &[]),
                ],
                match_fields: vec![],
            },
            NodeSelectorTerm {
                match_expressions: vec![],
                match_fields: vec![req("metadata.name", SelectorOp::NotIn, &["n1"])],
            },
        ]
    );
    assert_eq!(
        c.preferred_node_affinity,
        vec![PreferredNodeTerm {
            weight: 20,
            term: NodeSelectorTerm {
                match_expressions: vec![req("disk", SelectorOp::Exists, &[])],
                match_fields: vec![],
            },
        }]
    );
    assert!(!c.is_plain());
    // No affinity at all: None, and a plain pod.
    let t = run(&pod(json!({}), json!({}), json!({})));
    assert_eq!(t.pod.constraints.node_affinity, None);
    assert!(t.pod.constraints.is_plain());

    let base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]";
    for (term, field) in [
        (
            json!({"matchExpressions": [{"key": "a", "operator": "Near", "values": ["x"]}]}),
            format!("{base}.matchExpressions[0].operator"),
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
            format!("{base}.matchExpressions[0].values"),
        ),
        (
            json!({"matchExpressions": [{"key": "a", "operator": "Lt", "values": ["x"]}]}),
            format!("{base}.matchExpressions[0].values"),
        ),
        (
            json!({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}),
            format!("{base}.matchFields[0].key"),
        ),
        (
            json!({"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}),
            format!("{base}.matchFields[0].operator"),
        ),
    ] {
        let p = with_spec(
            json!({}),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [term.clone()]}}}}),
        );
        let t = run(&p);
        assert_eq!(first_error(&t).field, field, "{term}");
    }
}

#[test]
fn inter_pod_terms_namespaces_selectors_and_label_keys() {
    let p = with_spec(
        json!({"app": "web", "rev": "7"}),
        json!({"affinity": {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                // Neither namespaces nor a selector: the pod's own namespace.
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"},
                // A namespace selector, no label selector: no pod matches.
                {"namespaceSelector": {}, "topologyKey": "zone"},
            ]},
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchExpressions": [
                        {"key": "app", "operator": "In", "values": ["web"]},
                        // Already merged by the API server: not added twice.
                        {"key": "rev", "operator": "In", "values": ["7"]}]},
                     "matchLabelKeys": ["rev", "absent"], "mismatchLabelKeys": ["app"],
                     "namespaces": ["other"], "topologyKey": "kubernetes.io/hostname"},
                ],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 5, "podAffinityTerm": {"labelSelector": {},
                     "namespaces": ["a"], "namespaceSelector": {"matchLabels": {"t": "x"}},
                     "topologyKey": "zone"}},
                ],
            },
        }}),
    );
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
    let c = &t.pod.constraints;
    assert_eq!(c.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(
        c.pod_affinity,
        vec![
            PodAffinityTerm {
                selector: Some(LabelSelector {
                    requirements: vec![req("app", SelectorOp::In, &["db"])],
                }),
                namespaces: NamespaceScope {
                    names: vec!["ns".into()],
                    selector: None,
                },
                topology_key: "zone".into(),
            },
            PodAffinityTerm {
                selector: None,
                namespaces: NamespaceScope {
                    names: vec![],
                    selector: Some(LabelSelector::default()),
                },
                topology_key: "zone".into(),
            },
        ]
    );
    assert_eq!(
        c.pod_anti_affinity,
        vec![PodAffinityTerm {
            selector: Some(LabelSelector {
                requirements: vec![
                    req("app", SelectorOp::In, &["web"]),
                    req("rev", SelectorOp::In, &["7"]),
                    req("app", SelectorOp::NotIn, &["web"]),
                ],
            }),
            namespaces: NamespaceScope {
                names: vec!["other".into()],
                selector: None,
            },
            topology_key: "kubernetes.io/hostname".into(),
        }]
    );
    assert_eq!(
        c.preferred_pod_anti_affinity,
        vec![WeightedPodTerm {
            weight: 5,
            term: PodAffinityTerm {
                selector: Some(LabelSelector::default()),
                namespaces: NamespaceScope {
                    names: vec!["a".into()],
                    selector: Some(LabelSelector {
                        requirements: vec![req("t", SelectorOp::In, &["x"])],
                    }),
                },
                topology_key: "zone".into(),
            },
        }]
    );

    let p = with_spec(
        json!({}),
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
             "topologyKey": "zone"}]}}}),
    );
    let t = run(&p);
    assert_eq!(
        first_error(&t).field,
        "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator"
    );
}

#[test]
fn spread_constraints_defaults_policies_and_match_label_keys() {
    let p = with_spec(
        json!({"app": "web", "pod-template-hash": "abc"}),
        json!({"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "web"}},
             "matchLabelKeys": ["pod-template-hash", "absent"]},
            {"maxSkew": 3, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
             "minDomains": 2, "nodeAffinityPolicy": "Ignore", "nodeTaintsPolicy": "Honor"},
        ]}),
    );
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
    assert_eq!(
        t.pod.constraints.spread,
        vec![
            SpreadConstraint {
                max_skew: 1,
                topology_key: "kubernetes.io/hostname".into(),
                hard: true,
                selector: Some(LabelSelector {
                    requirements: vec![
                        req("app", SelectorOp::In, &["web"]),
                        req("pod-template-hash", SelectorOp::In, &["abc"]),
                    ],
                }),
                min_domains: None,
                node_affinity_policy: InclusionPolicy::Honor,
                node_taints_policy: InclusionPolicy::Ignore,
            },
            SpreadConstraint {
                max_skew: 3,
                topology_key: "zone".into(),
                hard: false,
                selector: None,
                min_domains: Some(2),
                node_affinity_policy: InclusionPolicy::Ignore,
                node_taints_policy: InclusionPolicy::Honor,
            },
        ]
    );
    for (c, field) in [
        (
            json!({"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "Maybe"}),
            "spec.topologySpreadConstraints[0].whenUnsatisfiable",
        ),
        (
            json!({"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}),
            "spec.topologySpreadConstraints[0].maxSkew",
        ),
        (
            json!({"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule",
                   "nodeTaintsPolicy": "Sometimes"}),
            "spec.topologySpreadConstraints[0].nodeTaintsPolicy",
        ),
    ] {
        let p = with_spec(json!({}), json!({"topologySpreadConstraints": [c.clone()]}));
        let t = run(&p);
        assert_eq!(first_error(&t).field, field, "{c}");
        assert!(t.pod.constraints.spread.is_empty());
    }
}

#[test]
fn host_ports_gates_and_deleted_pending_pods() {
    let p = with_spec(
        json!({}),
        json!({
            "initContainers": [
                {"name": "once", "ports": [{"containerPort": 1, "hostPort": 1111}]},
                {"name": "proxy", "restartPolicy": "Always",
                 "ports": [{"containerPort": 15001, "hostPort": 15001, "protocol": "UDP"}]},
            ],
            "containers": [{"name": "main", "ports": [
                {"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"},
                {"containerPort": 81},
            ]}],
            "schedulingGates": [{"name": "example.com/quota"}, {"name": "b"}],
        }),
    );
    let t = run(&p);
    assert!(t.pod.input_errors.is_empty(), "{:?}", t.pod.input_errors);
    let port = |protocol: &str, ip: &str, port| HostPort {
        protocol: protocol.into(),
        ip: ip.into(),
        port,
    };
    assert_eq!(
        t.pod.constraints.host_ports,
        vec![port("UDP", "0.0.0.0", 15001), port("TCP", "10.0.0.1", 8080)],
        "ordinary init containers do not hold their ports"
    );
    assert_eq!(
        t.pod.constraints.scheduling_gates,
        ["example.com/quota", "b"]
    );

    let p = with_spec(
        json!({}),
        json!({"containers": [{"name": "main", "ports": [{"containerPort": 1, "hostPort": 70000}]}]}),
    );
    assert_eq!(
        first_error(&run(&p)).field,
        "spec.containers[0].ports[0].hostPort"
    );

    // A pending pod being deleted is not scheduled (nor counted: it holds nothing).
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"schedulerName": "tessera", "containers": [{"name": "main"}]},
    }))
    .unwrap();
    assert!(translate(&p, &ctx()).is_none());
}

#[test]
fn other_schedulers_bound_pods_carry_their_constraints_unvalidated() {
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "o", "namespace": "ns", "labels": {"app": "db"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c",
            "ports": [{"containerPort": 5432, "hostPort": 5432}],
            "resources": {"requests": {"example.com/x": "bad"}}}],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"}]}},
        },
    }))
    .unwrap();
    let t = run(&p);
    assert!(t.pod.owned_by_other_scheduler);
    assert!(t.pod.input_errors.is_empty());
    let c = &t.pod.constraints;
    assert_eq!(c.labels.get("app").map(String::as_str), Some("db"));
    assert_eq!(c.host_ports.len(), 1);
    assert_eq!(c.pod_anti_affinity.len(), 1);
    // Not ours: no implicit GPU toleration either.
    assert!(c.tolerations.is_empty());
}

#[test]
fn other_schedulers_pods_hold_the_gpus_the_kubelet_gives_them() {
    // The kubelet's device manager: app containers' sum, or the largest init container's
    // (whose devices the app containers reuse), sidecars on top.
    let gpus = |n: u32| json!({"limits": {"nvidia.com/gpu": n.to_string()}});
    let cases = [
        // Two app containers with GPUs: both count.
        (
            json!([{"name": "a", "resources": gpus(1)}, {"name": "b", "resources": gpus(2)}]),
            json!([]),
            3,
        ),
        // A larger init container: its GPUs, reused by the app container.
        (
            json!([{"name": "a", "resources": gpus(1)}]),
            json!([{"name": "warm", "resources": gpus(3)}]),
            3,
        ),
        // A sidecar keeps its GPU beside the app container's.
        (
            json!([{"name": "a", "resources": gpus(1)}]),
            json!([{"name": "side", "restartPolicy": "Always", "resources": gpus(1)}]),
            2,
        ),
    ];
    for (containers, init, want) in cases {
        let p: KubePod = serde_json::from_value(json!({
            "metadata": {"name": "o", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": containers, "initContainers": init},
        }))
        .unwrap();
        let t = run(&p);
        assert!(t.pod.owned_by_other_scheduler);
        assert_eq!(t.pod.gpu.count, want, "{containers} / {init}");
    }
}
