//! Group derivation, queues (and which namespaces may use them), topology, nodes (capacity,
//! taints, readiness), volumes' node affinity, namespaces and whole-snapshot assembly.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Namespace, Node as KubeNode, PersistentVolume, PersistentVolumeClaim, Pod as KubePod,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::scheduling::v1beta1::PodGroup as WorkloadPodGroup;
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};
use tessera_coordinator::crd::{PodGroup, Queue, Topology};
use tessera_coordinator::translate::{self, Inputs};
use tessera_core::model::{
    Gpu, PodGroup as ModelGroup, Requirement, SelectorOp, Taint, TaintEffect,
};

fn kpod(name: &str, meta: Value, spec: Value) -> KubePod {
    let mut m = json!({"name": name, "namespace": "ns", "uid": name,
                       "creationTimestamp": "2026-01-01T00:00:00Z"});
    m.as_object_mut()
        .unwrap()
        .extend(meta.as_object().unwrap().clone());
    let mut s = json!({"schedulerName": "tessera", "containers": [{"name": "main"}]});
    s.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({"metadata": m, "spec": s})).unwrap()
}

fn owned_by(kind: &str, owner: &str) -> Value {
    json!({"ownerReferences": [{"apiVersion": "x/v1", "kind": kind, "name": owner, "uid": owner,
                               "controller": true}]})
}

fn queue(name: &str, spec: Value) -> Queue {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
                                  "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

fn group(name: &str, spec: Value) -> PodGroup {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "PodGroup",
                                  "metadata": {"name": name, "namespace": "ns"}, "spec": spec}),
    )
    .unwrap()
}

fn topology() -> Topology {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "Topology",
        "metadata": {"name": "default"},
        "spec": {"levels": [{"name": "zone", "nodeLabel": "topology.kubernetes.io/zone"},
                            {"name": "rack", "nodeLabel": "topology.tessera.dev/rack"}]}}),
    )
    .unwrap()
}

fn find<'a>(groups: &'a [ModelGroup], name: &str) -> &'a ModelGroup {
    groups
        .iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("no group {name} in {groups:?}"))
}

#[test]
fn groups_from_objects_shorthand_and_owners() {
    let pods = [
        // Two pods of a Job: one implied group of 2.
        kpod("j0", owned_by("Job", "train"), json!({})),
        kpod("j1", owned_by("Job", "train"), json!({})),
        // A PyTorchJob whose pods say min-member 2 of 3 (elastic).
        kpod(
            "t0",
            json!({"annotations": {"tessera.dev/min-member": "2"}, "ownerReferences": owned_by("PyTorchJob", "bert")["ownerReferences"]}),
            json!({}),
        ),
        kpod("t1", owned_by("PyTorchJob", "bert"), json!({})),
        kpod("t2", owned_by("PyTorchJob", "bert"), json!({})),
        // The annotation shorthand with topology.
        kpod(
            "s0",
            json!({"labels": {"tessera.dev/queue": "team-a"},
                          "annotations": {"tessera.dev/pod-group": "short", "tessera.dev/min-member": "2",
                                          "tessera.dev/topology-required": "rack"}}),
            json!({"priority": 50}),
        ),
        kpod(
            "s1",
            json!({"annotations": {"tessera.dev/pod-group": "short"}}),
            json!({"priority": 70}),
        ),
        // Members of an explicit object; the unlabelled one takes the object's queue.
        kpod(
            "e0",
            json!({"annotations": {"tessera.dev/pod-group": "explicit"}}),
            json!({}),
        ),
        kpod(
            "e1",
            json!({"labels": {"tessera.dev/queue": "own"},
                          "annotations": {"tessera.dev/pod-group": "explicit"}}),
            json!({}),
        ),
        // A lone pod and a ReplicaSet's pod: groups of one.
        kpod("lone", json!({}), json!({})),
        kpod("rs", owned_by("ReplicaSet", "web"), json!({})),
    ];
    let explicit = group(
        "explicit",
        json!({"minMember": 2, "maxMember": 4, "queue": "team-b", "priorityClassName": "high",
               "topology": {"required": "zone", "preferred": "topology.tessera.dev/rack"}}),
    );
    let topo = topology();
    let pc: PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": "high"}, "value": 1000})).unwrap();
    let mut inputs = Inputs::new(100, "tessera");
    inputs.pods = pods.iter().collect();
    inputs.pod_groups = vec![&explicit];
    inputs.topologies = vec![&topo];
    inputs.priority_classes = vec![&pc];
    inputs
        .below_min_member_since
        .insert(("ns".into(), "job-train".into()), 42);
    let out = translate::snapshot(&inputs);
    let s = &out.snapshot;
    assert_eq!(s.groups.len(), 4, "{:?}", s.groups);

    let job = find(&s.groups, "job-train");
    assert_eq!((job.min_member, job.max_member), (2, None));
    assert_eq!(job.below_min_member_since, Some(42));
    assert_eq!(job.queue, "default");

    let bert = find(&s.groups, "pytorchjob-bert");
    assert_eq!(bert.min_member, 2);

    let short = find(&s.groups, "short");
    assert_eq!(short.min_member, 2);
    assert_eq!(short.queue, "team-a");
    assert_eq!(short.priority, 70);
    // The level name resolves to the Topology's label key.
    assert_eq!(
        short.topology_required.as_deref(),
        Some("topology.tessera.dev/rack")
    );

    let e = find(&s.groups, "explicit");
    assert_eq!((e.min_member, e.max_member), (2, Some(4)));
    assert_eq!(e.queue, "team-b");
    assert_eq!(e.priority, 1000);
    assert_eq!(
        e.topology_required.as_deref(),
        Some("topology.kubernetes.io/zone")
    );
    assert_eq!(
        e.topology_preferred.as_deref(),
        Some("topology.tessera.dev/rack")
    );
    let pod = |uid: &str| s.pods.iter().find(|p| p.uid == uid).unwrap();
    assert_eq!(pod("e0").queue, "team-b");
    assert_eq!(pod("e1").queue, "own");
    assert_eq!(pod("lone").group, None);
    assert_eq!(pod("rs").group, None);
    assert_eq!(
        s.topology.as_ref().unwrap().levels,
        ["topology.kubernetes.io/zone", "topology.tessera.dev/rack"]
    );
    assert!(out.group_problems.is_empty(), "{:?}", out.group_problems);
}

#[test]
fn unknown_levels_and_bad_groups_are_reported() {
    let bad = group(
        "bad",
        json!({"minMember": 3, "maxMember": 2, "topology": {"required": "row"}}),
    );
    let topo = topology();
    let mut inputs = Inputs::new(0, "tessera");
    inputs.pod_groups = vec![&bad];
    inputs.topologies = vec![&topo];
    let out = translate::snapshot(&inputs);
    let problems = &out.group_problems[&("ns".to_string(), "bad".to_string())];
    let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert!(
        text.iter()
            .any(|t| t.starts_with("spec.maxMember:") && t.contains("below minMember 3")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|t| t.starts_with("spec.topology.required:") && t.contains("zone, rack")),
        "{text:?}"
    );
    // The core still gets a usable group: max clamped to min, the unknown level passed through
    // (the core reports it as an unknown topology level).
    let g = find(&out.snapshot.groups, "bad");
    assert_eq!(g.max_member, Some(3));
    assert_eq!(g.topology_required.as_deref(), Some("row"));
}

#[test]
fn queues_translate_to_accounting_units() {
    let q = queue(
        "team-a",
        json!({"parent": "org", "priority": 3,
               "gpu": {"quota": 2.5, "overQuotaWeight": 2, "limit": 8},
               "cpu": {"quota": "500m", "limit": 32},
               "memory": {"quota": "64Gi", "overQuotaWeight": 0.5, "limit": -1}}),
    );
    let m = translate::queue::translate(&q);
    assert_eq!(m.name, "team-a");
    assert_eq!(m.parent.as_deref(), Some("org"));
    assert_eq!(m.priority, 3);
    assert_eq!(
        (m.gpu.quota, m.gpu.over_quota_weight, m.gpu.limit),
        (2.5, 2.0, 8.0)
    );
    assert_eq!(
        (m.cpu.quota, m.cpu.over_quota_weight, m.cpu.limit),
        (500.0, 1.0, 32_000.0)
    );
    assert_eq!(
        (m.memory.quota, m.memory.over_quota_weight, m.memory.limit),
        (65_536.0, 0.5, -1.0)
    );
    // Unset resources: no quota, weight 1, no limit.
    let m = translate::queue::translate(&queue("x", json!({})));
    assert_eq!(
        (m.gpu.quota, m.gpu.over_quota_weight, m.gpu.limit),
        (0.0, 1.0, -1.0)
    );
    // Malformed values fall back safely (validation reports them).
    let m = translate::queue::translate(&queue(
        "y",
        json!({"gpu": {"quota": -3, "overQuotaWeight": -1, "limit": -7},
               "cpu": {"quota": "lots", "limit": "??"}}),
    ));
    assert_eq!(
        (m.gpu.quota, m.gpu.over_quota_weight, m.gpu.limit),
        (0.0, 0.0, -1.0)
    );
    assert_eq!((m.cpu.quota, m.cpu.limit), (0.0, -1.0));
}

#[test]
fn per_model_quotas_translate_in_gpus_and_bad_entries_read_safely() {
    let m = translate::queue::translate(&queue(
        "team",
        json!({"gpu": {"overQuotaWeight": 2, "models": [
            {"model": "NVIDIA-H100-80GB-HBM3", "quota": 4, "limit": 6},
            {"model": "L40S", "overQuotaWeight": 3},
            {"model": "NVIDIA A100", "quota": 2},
            {"model": "A100", "quota": -1, "overQuotaWeight": -2, "limit": -9}]}}),
    ));
    let got: Vec<(&str, f64, Option<f64>, f64)> = m
        .gpu_models
        .iter()
        .map(|q| (q.model.as_str(), q.quota, q.over_quota_weight, q.limit))
        .collect();
    assert_eq!(
        got,
        [
            ("NVIDIA-H100-80GB-HBM3", 4.0, None, 6.0),
            ("L40S", 0.0, Some(3.0), -1.0),
            // A key the schema refuses names no GPU: left out, never matched by accident.
            ("A100", 0.0, None, -1.0),
        ]
    );
}

#[test]
fn usage_history_round_trips_through_queue_status() {
    use tessera_core::model::QueueUsage;
    let cases = [
        QueueUsage {
            queue: "team".into(),
            at: 1_767_225_600,
            used: [3_600_500.0, 10_000.0, 2304.0],
            holding: Some([1000.0, 0.0, 0.0]),
        },
        QueueUsage {
            queue: "team".into(),
            at: 0,
            used: [0.0; 3],
            holding: None,
        },
        QueueUsage {
            queue: "team".into(),
            at: 4_102_444_800,
            used: [1.234_567_89e15, 7.0, 0.5],
            holding: None,
        },
    ];
    for u in cases {
        let mut q = queue("team", json!({}));
        q.status = Some(tessera_coordinator::crd::QueueStatus {
            usage: Some(translate::queue::usage_status(&u)),
            ..Default::default()
        });
        // Through JSON, as the API server stores it.
        let q: Queue = serde_json::from_value(serde_json::to_value(&q).unwrap()).unwrap();
        let back = translate::queue::usage_of(&q).expect("usage read back");
        assert_eq!(back.at, u.at);
        assert_eq!(back.holding, None, "the status keeps no holding");
        for k in 0..3 {
            assert!(
                (back.used[k] - u.used[k]).abs() <= 1e-9 * u.used[k].max(1.0),
                "{u:?} -> {back:?}"
            );
        }
    }
    // Unreadable times read as no history.
    let mut q = queue("team", json!({}));
    q.status = Some(tessera_coordinator::crd::QueueStatus {
        usage: Some(tessera_coordinator::crd::QueueUsage {
            updated_at: "yesterday".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(translate::queue::usage_of(&q).is_none());
}

#[test]
fn usage_is_written_when_due_not_every_cycle() {
    use std::time::Duration;
    use tessera_coordinator::cluster::status::usage_due;
    use tessera_coordinator::crd::QueueUsage;
    let at = |t: &str, gpu: f64| QueueUsage {
        gpu_seconds: gpu,
        updated_at: t.into(),
        ..Default::default()
    };
    let minute = Duration::from_secs(60);
    let old = at("2026-01-01T00:00:00Z", 1000.0);
    assert!(usage_due(None, &old, minute), "nothing written yet");
    assert!(!usage_due(
        Some(&old),
        &at("2026-01-01T00:00:30Z", 1050.0),
        minute
    ));
    assert!(usage_due(
        Some(&old),
        &at("2026-01-01T00:01:00Z", 1000.5),
        minute
    ));
    // A move of more than a tenth goes out sooner, but not within a tenth of the interval.
    assert!(usage_due(
        Some(&old),
        &at("2026-01-01T00:00:06Z", 1200.0),
        minute
    ));
    assert!(!usage_due(
        Some(&old),
        &at("2026-01-01T00:00:05Z", 1200.0),
        minute
    ));
    // Tiny amounts do not count as moves.
    let tiny = at("2026-01-01T00:00:00Z", 0.1);
    assert!(!usage_due(
        Some(&tiny),
        &at("2026-01-01T00:00:30Z", 0.9),
        minute
    ));
}

#[test]
fn snapshot_adds_a_default_queue_and_reports_queue_problems() {
    let org = queue("org", json!({}));
    let leaf = queue("leaf", json!({"parent": "org", "gpu": {"quota": -1}}));
    let p = kpod(
        "p",
        json!({"labels": {"tessera.dev/queue": "org"}}),
        json!({}),
    );
    let mut inputs = Inputs::new(0, "tessera");
    inputs.queues = vec![&org, &leaf];
    inputs.pods = vec![&p];
    let out = translate::snapshot(&inputs);
    let names: Vec<&str> = out
        .snapshot
        .queues
        .iter()
        .map(|q| q.name.as_str())
        .collect();
    assert_eq!(names, ["org", "leaf", "default"]);
    assert!(
        out.queue_problems["org"][0]
            .message
            .contains("only leaf queues take pods")
    );
    assert_eq!(out.queue_problems["leaf"][0].field, "spec.gpu.quota");
    // A Queue object named default is used as is.
    let d = queue("default", json!({"gpu": {"quota": 4}}));
    let mut inputs = Inputs::new(0, "tessera");
    inputs.queues = vec![&d];
    let out = translate::snapshot(&inputs);
    assert_eq!(out.snapshot.queues.len(), 1);
    assert_eq!(out.snapshot.queues[0].gpu.quota, 4.0);
}

fn knode(name: &str, spec: Value, ready: &str) -> KubeNode {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"topology.tessera.dev/rack": "r1"}},
        "spec": spec,
        "status": {"allocatable": {"cpu": "31500m", "memory": "256Gi", "nvidia.com/gpu": "40",
                                   "pods": "110", "ephemeral-storage": "100Gi",
                                   "hugepages-2Mi": "1Gi", "example.com/fpga": "2",
                                   "nvidia.com/mig-1g.10gb": "7"},
                   "conditions": [{"type": "Ready", "status": ready}]},
    }))
    .unwrap()
}

fn taint(key: &str, value: &str, effect: TaintEffect) -> Taint {
    Taint {
        key: key.into(),
        value: value.into(),
        effect,
    }
}

#[test]
fn nodes_with_agent_gpus_capacity_and_extended_resources() {
    let gpus = vec![
        Gpu::new("n1", 0, "H100", 81_920),
        Gpu::new("n1", 1, "H100", 81_920),
    ];
    let n = translate::node::translate(&knode("n1", json!({}), "True"), Some(gpus.clone()));
    assert_eq!((n.cpu_milli, n.memory_mib), (31_500, 262_144));
    assert_eq!(n.gpus, gpus);
    assert!(n.schedulable);
    assert_eq!(n.labels["topology.tessera.dev/rack"], "r1");
    assert_eq!(n.constraints.max_pods, Some(110));
    // GPUs (whole and MIG), CPU, memory and pods are not "extended": the core has them.
    assert_eq!(
        n.constraints.extended,
        BTreeMap::from([
            ("ephemeral-storage".to_string(), 100 << 30),
            ("example.com/fpga".to_string(), 2),
            ("hugepages-2Mi".to_string(), 1 << 30),
        ])
    );
    assert!(n.constraints.taints.is_empty());
    let n = translate::node::translate(&knode("n1", json!({}), "True"), None);
    assert!(n.gpus.is_empty());
}

#[test]
fn taints_cordons_and_readiness() {
    use TaintEffect::*;
    let cases: Vec<(Value, &str, bool, Vec<Taint>)> = vec![
        // Cordoned: unschedulable, no taint added (the core reads `schedulable`).
        (json!({"unschedulable": true}), "True", false, vec![]),
        // Not ready without the lifecycle controller's taint: the taint it would add.
        (
            json!({}),
            "False",
            true,
            vec![taint("node.kubernetes.io/not-ready", "", NoSchedule)],
        ),
        (
            json!({}),
            "Unknown",
            true,
            vec![taint("node.kubernetes.io/unreachable", "", NoSchedule)],
        ),
        // The controller's own taint is kept as it is, nothing added.
        (
            json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}),
            "False",
            true,
            vec![taint("node.kubernetes.io/not-ready", "", NoExecute)],
        ),
        // Every taint, of every effect, reaches the core; no key is special.
        (
            json!({"taints": [
                {"key": "maintenance", "effect": "NoSchedule"},
                {"key": "spot", "value": "yes", "effect": "PreferNoSchedule"},
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"},
                {"key": "bogus", "effect": "Sometimes"},
            ]}),
            "True",
            true,
            vec![
                taint("maintenance", "", NoSchedule),
                taint("spot", "yes", PreferNoSchedule),
                taint("nvidia.com/gpu", "present", NoExecute),
            ],
        ),
    ];
    for (spec, ready, schedulable, taints) in cases {
        let n = translate::node::translate(&knode("n", spec.clone(), ready), None);
        assert_eq!(n.schedulable, schedulable, "{spec} ready={ready}");
        assert_eq!(n.constraints.taints, taints, "{spec} ready={ready}");
    }
    // A node without any Ready condition is unreachable.
    let bare: KubeNode = serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap();
    let n = translate::node::translate(&bare, None);
    assert_eq!(
        n.constraints.taints,
        vec![taint("node.kubernetes.io/unreachable", "", NoSchedule)]
    );
    // kube-scheduler reads a missing `pods` allocatable as 0: such a node takes no pod.
    assert_eq!(n.constraints.max_pods, Some(0));
}

fn claim(name: &str, spec: Value, annotations: Value, extra: Value) -> PersistentVolumeClaim {
    let mut meta = json!({"name": name, "namespace": "ns", "annotations": annotations});
    meta.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    serde_json::from_value(json!({"metadata": meta, "spec": spec})).unwrap()
}

fn bound(name: &str, pv: &str) -> PersistentVolumeClaim {
    claim(
        name,
        json!({"volumeName": pv}),
        json!({"pv.kubernetes.io/bind-completed": "yes"}),
        json!({}),
    )
}

#[test]
fn volumes_give_pending_pods_node_affinity_or_a_reason() {
    let local: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-local"},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}}},
    }))
    .unwrap();
    let by_name: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-fields"},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}},
    }))
    .unwrap();
    let anywhere: PersistentVolume =
        serde_json::from_value(json!({"metadata": {"name": "pv-any"}, "spec": {}})).unwrap();
    let wffc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "local"}, "provisioner": "x",
        "volumeBindingMode": "WaitForFirstConsumer"}))
    .unwrap();
    let immediate: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "fast"}, "provisioner": "x", "volumeBindingMode": "Immediate"}))
    .unwrap();
    let claims = [
        bound("c-local", "pv-local"),
        bound("c-fields", "pv-fields"),
        bound("c-any", "pv-any"),
        bound("c-gone", "pv-missing"),
        claim(
            "c-wait",
            json!({"storageClassName": "local"}),
            json!({}),
            json!({}),
        ),
        claim(
            "c-imm",
            json!({"storageClassName": "fast"}),
            json!({}),
            json!({}),
        ),
        claim("c-noclass", json!({}), json!({}), json!({})),
        // Names its volume, but the PV controller has not completed the binding.
        claim(
            "c-prebound",
            json!({"volumeName": "pv-any"}),
            json!({}),
            json!({}),
        ),
        claim(
            "c-dying",
            json!({"volumeName": "pv-any"}),
            json!({"pv.kubernetes.io/bind-completed": "yes"}),
            json!({"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}),
        ),
        claim(
            "p-scratch",
            json!({"storageClassName": "local"}),
            json!({}),
            json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                        "uid": "p", "controller": true}]}),
        ),
    ];
    let volumes = [&local, &by_name, &anywhere];
    let classes = [&wffc, &immediate];
    let run = |volume: Value| {
        let p = kpod("p", json!({}), json!({"volumes": [volume]}));
        let mut inputs = Inputs::new(0, "tessera");
        inputs.pods = vec![&p];
        inputs.claims = claims.iter().collect();
        inputs.volumes = volumes.to_vec();
        inputs.storage_classes = classes.to_vec();
        translate::snapshot(&inputs).snapshot.pods.remove(0)
    };
    let pvc = |name: &str| json!({"name": "data", "persistentVolumeClaim": {"claimName": name}});

    let p = run(pvc("c-local"));
    assert!(p.input_errors.is_empty(), "{:?}", p.input_errors);
    let affinity = &p.constraints.volume_node_affinity;
    assert_eq!(affinity.len(), 1);
    assert_eq!(
        affinity[0].terms[0].match_expressions,
        vec![Requirement {
            key: "kubernetes.io/hostname".into(),
            operator: SelectorOp::In,
            values: vec!["n2".into()],
        }]
    );
    // kube-scheduler checks a volume's affinity against node labels only: a name
    // requirement sees "", so `In [n2]` holds for no node.
    let p = run(pvc("c-fields"));
    assert_eq!(
        p.constraints.volume_node_affinity[0].terms[0].match_fields,
        vec![Requirement {
            key: "metadata.name".into(),
            operator: SelectorOp::In,
            values: vec![String::new()],
        }]
    );
    // No affinity on the volume, and a waiting claim: no constraint, no error.
    for name in ["c-any", "c-wait"] {
        let p = run(pvc(name));
        assert!(p.input_errors.is_empty(), "{name}: {:?}", p.input_errors);
        assert!(p.constraints.volume_node_affinity.is_empty(), "{name}");
    }
    let p = run(json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}));
    assert!(p.input_errors.is_empty(), "{:?}", p.input_errors);

    let reasons = [
        (pvc("nope"), "persistentvolumeclaim \"nope\" not found"),
        (
            pvc("c-imm"),
            "pod has unbound immediate PersistentVolumeClaims",
        ),
        (
            pvc("c-noclass"),
            "pod has unbound immediate PersistentVolumeClaims",
        ),
        (
            pvc("c-prebound"),
            "pod has unbound immediate PersistentVolumeClaims",
        ),
        (pvc("c-dying"), "is being deleted"),
        (
            pvc("c-gone"),
            "persistentvolume \"pv-missing\", which does not exist",
        ),
        (
            json!({"name": "other", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
            "ephemeral volume controller",
        ),
    ];
    for (volume, want) in reasons {
        let p = run(volume.clone());
        let e = p
            .input_errors
            .first()
            .unwrap_or_else(|| panic!("{volume}: no error"));
        assert!(e.field.starts_with("spec.volumes[0]."), "{e:?}");
        assert!(e.message.contains(want), "{volume}: {e:?}");
    }

    // A bound pod is not checked again (binding is a scheduling-time check).
    let p = kpod(
        "q",
        json!({}),
        json!({"nodeName": "n1", "volumes": [pvc("nope")]}),
    );
    let mut inputs = Inputs::new(0, "tessera");
    inputs.pods = vec![&p];
    let q = translate::snapshot(&inputs).snapshot.pods.remove(0);
    assert!(q.input_errors.is_empty());
}

#[test]
fn namespaces_labels_reach_the_snapshot() {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team-a", "labels": {"tier": "gold"}}}))
            .unwrap();
    let mut inputs = Inputs::new(0, "tessera");
    inputs.namespaces = vec![&ns];
    let s = translate::snapshot(&inputs).snapshot;
    assert_eq!(
        s.namespaces,
        BTreeMap::from([(
            "team-a".to_string(),
            BTreeMap::from([("tier".to_string(), "gold".to_string())])
        )])
    );
}

#[test]
fn snapshot_is_sorted_and_joins_agent_gpus() {
    let late = kpod(
        "late",
        json!({"creationTimestamp": "2026-01-01T00:01:00Z"}),
        json!({}),
    );
    let early = kpod(
        "early",
        json!({"creationTimestamp": "2026-01-01T00:00:01Z"}),
        json!({}),
    );
    let done = serde_json::from_value::<KubePod>(json!({
        "metadata": {"name": "done"}, "spec": {"schedulerName": "tessera", "containers": []},
        "status": {"phase": "Succeeded"}}))
    .unwrap();
    let n1 = knode("n1", json!({}), "True");
    let n2 = knode("n2", json!({}), "True");
    let mut inputs = Inputs::new(7, "tessera");
    inputs.pods = vec![&late, &early, &done];
    inputs.nodes = vec![&n1, &n2];
    inputs.agent_gpus = BTreeMap::from([("n1".to_string(), vec![Gpu::new("n1", 0, "T4", 15_360)])]);
    let out = translate::snapshot(&inputs);
    let s = &out.snapshot;
    assert_eq!(s.now, 7);
    let uids: Vec<&str> = s.pods.iter().map(|p| p.uid.as_str()).collect();
    assert_eq!(uids, ["early", "late"]);
    assert_eq!(s.nodes[0].gpus.len(), 1);
    assert!(s.nodes[1].gpus.is_empty());
    assert!(s.topology.is_none());
}

#[test]
fn a_named_podgroup_that_does_not_exist_holds_its_pods() {
    // The pods may reach the cache before their PodGroup: without the object or a
    // min-member shorthand there is no gang size, and guessing one from the pods present
    // would start the gang part way.
    let pods = [
        kpod(
            "m0",
            json!({"annotations": {"tessera.dev/pod-group": "later"}}),
            json!({}),
        ),
        kpod(
            "m1",
            json!({"annotations": {"tessera.dev/pod-group": "later"}}),
            json!({}),
        ),
    ];
    let mut inputs = Inputs::new(100, "tessera");
    inputs.pods = pods.iter().collect();
    let out = translate::snapshot(&inputs);
    for p in &out.snapshot.pods {
        let e = p
            .input_errors
            .iter()
            .find(|e| e.field == "tessera.dev/pod-group")
            .unwrap_or_else(|| panic!("{} waits: {:?}", p.uid, p.input_errors));
        assert!(
            e.message.contains("PodGroup ns/later does not exist")
                && e.message.contains("tessera.dev/min-member"),
            "{}",
            e.message
        );
    }
    // Once the object exists, nothing is reported.
    let later = group("later", json!({"minMember": 2}));
    inputs.pod_groups = vec![&later];
    let out = translate::snapshot(&inputs);
    assert!(out.snapshot.pods.iter().all(|p| p.input_errors.is_empty()));
}

fn workload_group(name: &str, spec: Value) -> WorkloadPodGroup {
    serde_json::from_value(
        json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                                  "metadata": {"name": name, "namespace": "ns"}, "spec": spec}),
    )
    .unwrap()
}

/// `spec.schedulingGroup` naming `group`, merged into a pod's spec.
fn in_group(group: &str) -> Value {
    json!({"schedulingGroup": {"podGroupName": group}})
}

#[test]
fn workload_api_pod_groups_as_kube_scheduler_reads_them() {
    let pc: PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": "urgent"}, "value": 900})).unwrap();
    let pods = [
        // A gang of two; the queue label of one member is the group's.
        kpod("g0", json!({}), in_group("gang")),
        kpod(
            "g1",
            json!({"labels": {"tessera.dev/queue": "team-a"}}),
            in_group("gang"),
        ),
        // The Workload API's group wins over the Job owner's.
        kpod("j0", owned_by("Job", "train"), in_group("from-job")),
        // Basic: no gang.
        kpod("b0", json!({}), in_group("basic")),
        // The PodGroup object is not there (yet).
        kpod("m0", json!({}), in_group("missing")),
        // In two groups at once.
        kpod(
            "c0",
            json!({"annotations": {"tessera.dev/pod-group": "tessera-side"}}),
            in_group("gang-c"),
        ),
        // A Tessera group of the same name as a Workload API group stays apart.
        kpod(
            "t0",
            json!({"annotations": {"tessera.dev/pod-group": "gang"}}),
            json!({}),
        ),
        // An annotation cannot reach into the Workload API's names.
        kpod(
            "s0",
            json!({"annotations": {"tessera.dev/pod-group": "scheduling.k8s.io/gang"}}),
            json!({}),
        ),
    ];
    let objects = [
        workload_group(
            "gang",
            json!({"schedulingPolicy": {"gang": {"minCount": 2}}, "priorityClassName": "urgent",
                   "schedulingConstraints": {"topology": [{"key": "topology.tessera.dev/rack"}]}}),
        ),
        workload_group(
            "from-job",
            json!({"schedulingPolicy": {"gang": {"minCount": 1}}, "priority": 7}),
        ),
        workload_group("basic", json!({"schedulingPolicy": {"basic": {}}})),
        workload_group(
            "gang-c",
            json!({"schedulingPolicy": {"gang": {"minCount": 1}}}),
        ),
    ];
    let topo = topology();
    let mut inputs = Inputs::new(100, "tessera");
    inputs.pods = pods.iter().collect();
    inputs.workload_pod_groups = objects.iter().collect();
    inputs.priority_classes = vec![&pc];
    inputs.topologies = vec![&topo];
    let out = translate::snapshot(&inputs);
    let s = &out.snapshot;
    let pod = |uid: &str| {
        s.pods
            .iter()
            .find(|p| p.uid == uid)
            .unwrap_or_else(|| panic!("no pod {uid}"))
    };

    let gang = find(&s.groups, "scheduling.k8s.io/gang");
    assert_eq!(
        (gang.min_member, gang.queue.as_str(), gang.priority),
        (2, "team-a", 900)
    );
    assert_eq!(
        gang.topology_required.as_deref(),
        Some("topology.tessera.dev/rack")
    );
    for uid in ["g0", "g1"] {
        assert_eq!(pod(uid).group.as_deref(), Some("scheduling.k8s.io/gang"));
        assert_eq!(pod(uid).queue, "team-a", "{uid} takes the group's queue");
        assert!(
            pod(uid).input_errors.is_empty(),
            "{:?}",
            pod(uid).input_errors
        );
    }
    let job = find(&s.groups, "scheduling.k8s.io/from-job");
    assert_eq!((job.min_member, job.priority), (1, 7));
    assert_eq!(
        pod("j0").group.as_deref(),
        Some("scheduling.k8s.io/from-job")
    );
    assert!(!s.groups.iter().any(|g| g.name == "job-train"));

    assert_eq!(
        pod("b0").group,
        None,
        "a basic group's pod is placed on its own"
    );
    assert!(!s.groups.iter().any(|g| g.name.ends_with("/basic")));

    let missing = &pod("m0").input_errors;
    assert!(
        missing
            .iter()
            .any(|e| e.field == "spec.schedulingGroup.podGroupName"
                && e.message
                    .contains("PodGroup ns/missing (scheduling.k8s.io/v1beta1) does not exist")),
        "{missing:?}"
    );

    let both = &pod("c0").input_errors;
    assert!(
        both.iter()
            .any(|e| e.field == "spec.schedulingGroup.podGroupName"
                && e.message.contains("scheduling.k8s.io PodGroup ns/gang-c")
                && e.message
                    .contains("Tessera PodGroup ns/tessera-side (tessera.dev/pod-group)")),
        "{both:?}"
    );

    assert_eq!(pod("t0").group.as_deref(), Some("gang"));
    assert_eq!(find(&s.groups, "gang").min_member, 1);
    let slash = &pod("s0").input_errors;
    assert!(
        slash
            .iter()
            .any(|e| e.field == "tessera.dev/pod-group" && e.message.contains("no \"/\"")),
        "{slash:?}"
    );
    assert_eq!(pod("s0").group, None);
}

/// Every snapshot translated with a memo of earlier passes equals one translated afresh, as
/// pods change, come and go, and the context (priority classes, `now`) moves.
#[test]
fn the_pod_memo_gives_what_a_fresh_translation_gives() {
    let versioned = |name: &str, rv: &str, meta: Value, spec: Value| {
        let mut p = kpod(name, meta, spec);
        p.metadata.resource_version = Some(rv.into());
        p
    };
    let gpu = json!({"containers": [{"name": "main",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
    let mut pods = vec![
        versioned(
            "a",
            "1",
            json!({"labels": {"tessera.dev/queue": "q1"}}),
            gpu.clone(),
        ),
        versioned("b", "1", json!({}), json!({"priorityClassName": "high"})),
        versioned(
            "c",
            "1",
            json!({"annotations": {"tessera.dev/gpu-fraction": "0.5"}}),
            json!({"nodeName": "n1"}),
        ),
    ];
    // Without a creation time: created "now", which moves.
    let mut undated = versioned("d", "1", json!({}), gpu.clone());
    undated.metadata.creation_timestamp = None;
    pods.push(undated);
    let high: PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": "high"}, "value": 1000})).unwrap();
    let higher: PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": "high"}, "value": 5000})).unwrap();

    let mut memo = translate::PodMemo::default();
    let mut check = |pods: &[KubePod], class: &PriorityClass, now: u64| {
        let mut inputs = Inputs::new(now, "tessera");
        inputs.pods = pods.iter().collect();
        inputs.priority_classes = vec![class];
        let fresh = translate::snapshot(&inputs);
        let memoized = translate::snapshot_with(&inputs, &mut memo);
        assert_eq!(format!("{memoized:?}"), format!("{fresh:?}"));
    };
    check(&pods, &high, 100);
    check(&pods, &high, 200);
    // A pod changed (a new resourceVersion), one gone, one new.
    pods[0] = versioned(
        "a",
        "2",
        json!({"labels": {"tessera.dev/queue": "q2"}}),
        json!({"nodeName": "n2"}),
    );
    pods.remove(2);
    pods.push(versioned("e", "1", json!({}), gpu));
    check(&pods, &high, 300);
    // The same pods, but their priority class's value moved.
    check(&pods, &higher, 300);
    assert_eq!(
        memo.len(),
        3,
        "the undated pod is not remembered, the gone one forgotten"
    );
}

/// A namespace `name` with `labels` and the name label the API server gives every namespace.
fn namespace(name: &str, labels: Value) -> Namespace {
    let mut l = json!({"kubernetes.io/metadata.name": name});
    l.as_object_mut()
        .unwrap()
        .extend(labels.as_object().unwrap().clone());
    serde_json::from_value(json!({"metadata": {"name": name, "labels": l}})).unwrap()
}

/// Why the queue rules refuse pods of `namespace` in `queue_name`, judged on `queues` and
/// `namespaces`; `None` when admitted.
fn refusal(
    queues: &[&Queue],
    namespaces: &[&Namespace],
    queue_name: &str,
    ns: &str,
) -> Option<String> {
    translate::queue::Tenancy::new(queues, namespaces).refusal(queue_name, ns)
}

#[test]
fn queues_admit_the_namespaces_they_name_or_select() {
    let team_a = namespace("team-a", json!({"team": "ml", "tier": "gold"}));
    let team_b = namespace("team-b", json!({"team": "web"}));
    let other = namespace("other", json!({}));
    let namespaces = [&team_a, &team_b, &other];
    // (spec, namespaces admitted among team-a, team-b, other)
    let cases: &[(Value, [bool; 3])] = &[
        (json!({}), [true, true, true]),
        (json!({"namespaces": ["team-a"]}), [true, false, false]),
        (json!({"namespaces": []}), [false, false, false]),
        (json!({"namespaceSelector": {}}), [true, true, true]),
        (
            json!({"namespaceSelector": {"matchLabels": {"team": "ml"}}}),
            [true, false, false],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}}),
            [true, true, false],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["ml"]}]}}),
            [false, true, true],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}}),
            [false, true, true],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["other"]}]}}),
            [false, false, true],
        ),
        // The list or the selector.
        (
            json!({"namespaces": ["other"], "namespaceSelector": {"matchLabels": {"team": "web"}}}),
            [false, true, true],
        ),
        // Both conditions of one selector.
        (
            json!({"namespaceSelector": {"matchLabels": {"team": "ml"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["silver"]}]}}),
            [false, false, false],
        ),
        // A selector Kubernetes could not parse matches nothing.
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Gt", "values": ["1"]}]}}),
            [false, false, false],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
            [false, false, false],
        ),
    ];
    for (spec, want) in cases {
        let q = queue("gpu", spec.clone());
        for (ns, admitted) in ["team-a", "team-b", "other"].iter().zip(want) {
            let why = refusal(&[&q], &namespaces, "gpu", ns);
            assert_eq!(why.is_none(), *admitted, "{spec} for {ns}: {why:?}");
            if let Some(why) = why {
                assert!(
                    why.contains("queue \"gpu\"") && why.contains(&format!("namespace \"{ns}\"")),
                    "{why}"
                );
            }
        }
    }
    // A namespace the cache has not seen is judged by its name label alone.
    let q = queue(
        "gpu",
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "new"}}}),
    );
    assert_eq!(refusal(&[&q], &[], "gpu", "new"), None);
    assert!(refusal(&[&q], &[], "gpu", "newer").is_some());
    // Queues without an object (the implicit default, or an unknown queue, which the core
    // reports) refuse no one here.
    assert_eq!(refusal(&[&q], &namespaces, "default", "other"), None);
    // The message says what the queue admits.
    let q = queue(
        "gpu",
        json!({"namespaces": ["team-a", "team-c"], "namespaceSelector": {"matchLabels": {"team": "ml"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["bronze", "tin"]}]}}),
    );
    let why = refusal(&[&q], &namespaces, "gpu", "other").unwrap();
    assert!(
        why.contains(
            "namespaces [team-a, team-c] or namespaces matching \"team=ml,tier notin (bronze,tin)\""
        ),
        "{why}"
    );
    let closed = queue("gpu", json!({"namespaces": []}));
    let why = refusal(&[&closed], &namespaces, "gpu", "team-a").unwrap();
    assert!(why.contains("it admits no namespace"), "{why}");
}

#[test]
fn a_leaf_admits_only_namespaces_every_queue_above_it_admits() {
    let a = namespace("a", json!({"team": "x"}));
    let b = namespace("b", json!({}));
    let c = namespace("c", json!({"team": "x"}));
    let namespaces = [&a, &b, &c];
    let org = queue("org", json!({"namespaces": ["a", "b"]}));
    let mid = queue("mid", json!({"parent": "org"}));
    let leaf = queue(
        "leaf",
        json!({"parent": "mid", "namespaceSelector": {"matchLabels": {"team": "x"}}}),
    );
    let open_leaf = queue("open", json!({"parent": "mid"}));
    let queues = [&org, &mid, &leaf, &open_leaf];
    // a: admitted by the leaf's selector and by org's list.
    assert_eq!(refusal(&queues, &namespaces, "leaf", "a"), None);
    // b: org admits it, the leaf does not: the leaf's own rule is named.
    let why = refusal(&queues, &namespaces, "leaf", "b").unwrap();
    assert!(
        why.contains("(it admits namespaces matching \"team=x\")"),
        "{why}"
    );
    // c: the leaf admits it, org does not: the ancestor is named.
    let why = refusal(&queues, &namespaces, "leaf", "c").unwrap();
    assert!(
        why.contains("queue \"leaf\" does not admit pods of namespace \"c\"")
            && why.contains("its ancestor queue \"org\" admits only namespaces [a, b]"),
        "{why}"
    );
    // A leaf with no rule of its own inherits its ancestors'.
    assert_eq!(refusal(&queues, &namespaces, "open", "b"), None);
    assert!(refusal(&queues, &namespaces, "open", "c").is_some());
    // A parent cycle (reported by validation) ends the walk.
    let x = queue("x", json!({"parent": "y"}));
    let y = queue("y", json!({"parent": "x"}));
    assert_eq!(refusal(&[&x, &y], &namespaces, "x", "a"), None);
}

#[test]
fn pending_pods_of_a_refused_namespace_wait_with_the_queue_and_namespace_named() {
    let ns = namespace("ns", json!({}));
    let q = queue("gpu", json!({"namespaces": ["team-a"]}));
    let labelled = json!({"labels": {"tessera.dev/queue": "gpu"}});
    let pending = kpod("pending", labelled.clone(), json!({}));
    let bound = kpod("bound", labelled.clone(), json!({"nodeName": "n1"}));
    let foreign = kpod(
        "foreign",
        labelled,
        json!({"schedulerName": "default-scheduler", "nodeName": "n1"}),
    );
    // No label: the PodGroup's queue applies, and is judged.
    let member = kpod(
        "member",
        json!({"annotations": {"tessera.dev/pod-group": "g"}}),
        json!({}),
    );
    let g = group("g", json!({"minMember": 1, "queue": "gpu"}));
    let mut inputs = Inputs::new(0, "tessera");
    inputs.queues = vec![&q];
    inputs.namespaces = vec![&ns];
    inputs.pods = vec![&pending, &bound, &foreign, &member];
    inputs.pod_groups = vec![&g];
    let out = translate::snapshot(&inputs);
    let errors = |name: &str| {
        out.snapshot
            .pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
            .input_errors
            .clone()
    };
    for name in ["pending", "member"] {
        let e = errors(name);
        assert_eq!(e.len(), 1, "{name}: {e:?}");
        assert_eq!(e[0].field, "tessera.dev/queue");
        assert!(
            e[0].message
                .contains("queue \"gpu\" does not admit pods of namespace \"ns\""),
            "{name}: {}",
            e[0].message
        );
    }
    // Pods already bound keep running and are charged as before; other schedulers' pods are
    // only counted.
    assert!(errors("bound").is_empty());
    assert!(errors("foreign").is_empty());
    // Admitted: nothing to say.
    let open = queue("gpu", json!({"namespaces": ["team-a", "ns"]}));
    inputs.queues = vec![&open];
    let out = translate::snapshot(&inputs);
    assert!(out.snapshot.pods.iter().all(|p| p.input_errors.is_empty()));
}

/// The queue rules are judged on each pass, not remembered with a pod's translation: a rule or
/// a namespace's labels that change while the pods do not change the verdict, memo or not.
#[test]
fn the_pod_memo_follows_queue_namespace_rules() {
    let mut p = kpod(
        "p",
        json!({"labels": {"tessera.dev/queue": "gpu"}}),
        json!({}),
    );
    p.metadata.resource_version = Some("1".into());
    let plain = namespace("ns", json!({}));
    let ml = namespace("ns", json!({"team": "ml"}));
    let open = queue("gpu", json!({}));
    let closed = queue(
        "gpu",
        json!({"namespaceSelector": {"matchLabels": {"team": "ml"}}}),
    );
    let mut memo = translate::PodMemo::default();
    let mut check = |q: &Queue, ns: &Namespace| -> usize {
        let mut inputs = Inputs::new(100, "tessera");
        inputs.pods = vec![&p];
        inputs.queues = vec![q];
        inputs.namespaces = vec![ns];
        let fresh = translate::snapshot(&inputs);
        let memoized = translate::snapshot_with(&inputs, &mut memo);
        assert_eq!(format!("{memoized:?}"), format!("{fresh:?}"));
        memoized.snapshot.pods[0].input_errors.len()
    };
    assert_eq!(check(&open, &plain), 0);
    assert_eq!(check(&closed, &plain), 1, "the queue closed: refused");
    assert_eq!(check(&closed, &ml), 0, "the namespace labelled: admitted");
    assert_eq!(check(&closed, &plain), 1, "the label taken away: refused");
    assert_eq!(check(&open, &plain), 0, "the queue open again");
    assert_eq!(memo.len(), 1);
}
