//! Pod translation: every label, annotation and migration alias of the user contract, and every
//! bad input answered with an error naming the field and the accepted form.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod as KubePod;
use serde_json::{Value, json};
use tessera_coordinator::model::{Assignment, GpuShare, InputError, Isolation};
use tessera_coordinator::translate::pod::{PodContext, TranslatedPod, translate};
use tessera_coordinator::translate::{GroupSource, keys};

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
    assert!(fields.contains(&"spec.priorityClassName"), "{fields:?}");
    assert!(
        fields.contains(&"spec.containers[1].resources.limits.nvidia.com/gpu"),
        "{fields:?}"
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
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z",
                     "annotations": {"tessera.dev/assignment": assignment.to_string()}},
        "spec": {"schedulerName": "tessera", "nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap();
    let t = run(&p);
    let placement = t.pod.placement.clone().expect("bound");
    assert_eq!(placement.node, "n1");
    let want: Assignment = serde_json::from_value(assignment).unwrap();
    assert_eq!(placement.assignment, want);
    assert!(t.pod.terminating);

    // An unreadable assignment on a bound pod is a warning, not a scheduling error.
    let p: KubePod = serde_json::from_value(json!({
        "metadata": {"name": "p", "annotations": {"tessera.dev/assignment": "{oops"}},
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
