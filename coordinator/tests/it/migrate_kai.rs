//! `tessera-coordinator migrate kai`: KAI Scheduler's objects in the shapes KAI publishes
//! (its Queue and PodGroup CRDs, the queue, GPU-sharing and distributed-job examples of its
//! documentation), as tables of input → Tessera object and notes; then the binary against a
//! real API server: KAI's objects read from the cluster, and everything it prints accepted by
//! the API server with Tessera's CRDs and their validation.

use serde_json::{Value, json};
use tessera_coordinator::migrate::kai::{Output, migrate};
use tessera_coordinator::migrate::source;

/// The translation of one YAML document.
fn one(yaml: &str) -> Output {
    let docs = source::parse("test.yaml", yaml).expect("YAML");
    assert_eq!(docs.len(), 1, "{yaml}");
    migrate(&docs).outputs.remove(0)
}

fn spec(out: &Output) -> &Value {
    out.object
        .as_ref()
        .and_then(|o| o.get("spec"))
        .unwrap_or_else(|| panic!("no object: {:?}", out.notes))
}

/// Each of `fragments` is in some note.
fn assert_notes(out: &Output, fragments: &[&str]) {
    for f in fragments {
        assert!(
            out.notes.iter().any(|n| n.contains(f)),
            "{f:?} in no note of {}: {:#?}",
            out.what,
            out.notes
        );
    }
}

const QUEUE_HEAD: &str = "apiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata:\n  name: q\n";

#[test]
fn kai_queues_become_tessera_queues_in_tessera_units() {
    // (KAI spec, Tessera spec, notes that must be there)
    let table: Vec<(&str, Value, Vec<&str>)> = vec![
        // A team queue with CPU and GPU quotas and limits, weights left out.
        (
            "spec:\n  displayName: Research\n  resources:\n    cpu: {quota: 1000, limit: 2000}\n    gpu: {quota: 1, limit: 2}\n",
            json!({"priority": 100,
                   "gpu": {"quota": 1.0, "overQuotaWeight": 1.0, "limit": 2.0},
                   "cpu": {"quota": 1, "overQuotaWeight": 1.0, "limit": 2}}),
            vec![
                "displayName \"Research\" does not carry over",
                "priority not given: written as KAI's default 100",
                "gpu.overQuotaWeight not given",
                "memory: not given",
            ],
        ),
        // A child with a priority and over-quota weights.
        (
            "spec:\n  parentQueue: research\n  priority: 200\n  resources:\n    cpu: {quota: 500, overQuotaWeight: 2, limit: -1}\n    gpu: {quota: 1, overQuotaWeight: 3, limit: -1}\n    memory: {quota: 4096, overQuotaWeight: 1, limit: 8192}\n",
            json!({"parent": "research", "priority": 200,
                   "gpu": {"quota": 1.0, "overQuotaWeight": 3.0, "limit": -1.0},
                   "cpu": {"quota": "500m", "overQuotaWeight": 2.0},
                   "memory": {"quota": "4096M", "overQuotaWeight": 1.0, "limit": "8192M"}}),
            vec![],
        ),
        // Unlimited quota, no limit; and a limit of 0 (nothing beyond the quota).
        (
            "spec:\n  resources:\n    cpu: {quota: -1, overQuotaWeight: 1, limit: -1}\n    gpu: {quota: 2, overQuotaWeight: 1, limit: 0}\n    memory: {quota: 0, overQuotaWeight: 0, limit: -1}\n",
            json!({"priority": 100,
                   "gpu": {"quota": 2.0, "overQuotaWeight": 1.0, "limit": 2.0},
                   "cpu": {"overQuotaWeight": 1.0},
                   "memory": {"overQuotaWeight": 0.0}}),
            vec![
                "cpu.quota -1 (unlimited) has no Tessera counterpart",
                "gpu.limit 0 (KAI: nothing beyond the quota) written as limit = quota",
            ],
        ),
        // Minimum runtimes and a limit below the quota.
        (
            "spec:\n  preemptMinRuntime: 10m\n  reclaimMinRuntime: 1h\n  resources:\n    gpu: {quota: 4, overQuotaWeight: 1, limit: 2}\n",
            json!({"priority": 100,
                   "gpu": {"quota": 4.0, "overQuotaWeight": 1.0, "limit": 4.0}}),
            vec![
                "preemptMinRuntime 10m does not carry over",
                "reclaimMinRuntime 1h does not carry over",
                "gpu.limit 2 is below its quota 4",
            ],
        ),
    ];
    for (kai, want, notes) in table {
        let out = one(&format!("{QUEUE_HEAD}{kai}"));
        assert_eq!(out.what, "Queue q");
        let object = out.object.as_ref().expect("a Queue");
        assert_eq!(object["apiVersion"], "tessera.dev/v1alpha1");
        assert_eq!(object["kind"], "Queue");
        assert_eq!(object["metadata"], json!({"name": "q"}));
        assert_eq!(spec(&out), &want, "{kai}");
        assert_notes(&out, &notes);
    }
}

#[test]
fn bad_kai_queues_are_not_translated_and_say_which_field_and_what_is_accepted() {
    for (kai, fragment) in [
        (
            "spec:\n  resources:\n    gpu: {quota: -5}\n",
            "spec.resources.gpu.quota: -5 is not -1 (unlimited) or a number of at least 0",
        ),
        (
            "spec:\n  resources:\n    gpu: {quota: lots}\n",
            "spec.resources.gpu.quota: invalid type",
        ),
        (
            "spec:\n  resources:\n    cpu: {quota: 1, overQuotaWeight: -2}\n",
            "spec.resources.cpu.overQuotaWeight: -2 is not a number of at least 0",
        ),
        (
            "spec:\n  resources:\n    memory: {limit: -3}\n",
            "spec.resources.memory.limit: -3 is not -1 (unlimited) or a number of at least 0",
        ),
        (
            "spec:\n  priority: 99999999999\n",
            "spec.priority: 99999999999 is not a 32-bit whole number",
        ),
    ] {
        let out = one(&format!("{QUEUE_HEAD}{kai}"));
        assert_eq!(out.object, None, "{kai}");
        assert_notes(&out, &["not translated", fragment]);
    }
}

#[test]
fn a_default_queue_that_kai_makes_a_parent_is_flagged() {
    let docs = source::parse(
        "q.yaml",
        "apiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata: {name: default}\nspec:\n  resources:\n    gpu: {quota: -1, overQuotaWeight: 1, limit: -1}\n---\napiVersion: scheduling.run.ai/v2\nkind: Queue\nmetadata: {name: team}\nspec:\n  parentQueue: default\n  resources:\n    gpu: {quota: 1, overQuotaWeight: 1, limit: 1}\n",
    )
    .expect("YAML");
    let m = migrate(&docs);
    assert_notes(&m.outputs[0], &["here default is a parent"]);
    assert!(
        !m.outputs[1].notes.iter().any(|n| n.contains("is a parent")),
        "{:?}",
        m.outputs[1].notes
    );
}

const POD_HEAD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ml\n";

#[test]
fn kai_pods_get_tessera_names_and_the_gpu_limit_a_fraction_needs() {
    // (KAI pod after its name, the Tessera pod's metadata and spec as expected, notes)
    let table: Vec<(&str, Value, Value, Vec<&str>)> = vec![
        // A half GPU, no nvidia.com/gpu limit: the first container gets one.
        (
            "  labels: {kai.scheduler/queue: team-a}\n  annotations: {gpu-fraction: \"0.5\"}\nspec:\n  schedulerName: kai-scheduler\n  containers:\n  - {name: main, image: cuda}\n",
            json!({"name": "p", "namespace": "ml",
                   "labels": {"tessera.dev/queue": "team-a"},
                   "annotations": {"tessera.dev/gpu-fraction": "0.5"}}),
            json!({"schedulerName": "tessera", "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            vec![
                "schedulerName kai-scheduler → tessera",
                "label kai.scheduler/queue → tessera.dev/queue",
                "annotation gpu-fraction → tessera.dev/gpu-fraction",
                "container main: nvidia.com/gpu: \"1\" added",
            ],
        ),
        // Memory in MiB, for the container KAI's annotation names, on two devices.
        (
            "  annotations: {gpu-memory: \"2000\", gpu-fraction-container-name: worker, gpu-fraction-num-devices: \"2\"}\nspec:\n  schedulerName: kai-scheduler\n  containers:\n  - {name: sidecar, image: busybox}\n  - {name: worker, image: cuda}\n",
            json!({"name": "p", "namespace": "ml",
                   "annotations": {"tessera.dev/gpu-memory": "2000Mi"}}),
            json!({"schedulerName": "tessera", "containers": [
                {"name": "sidecar", "image": "busybox"},
                {"name": "worker", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}),
            vec![
                "annotation gpu-memory → tessera.dev/gpu-memory",
                "container worker: nvidia.com/gpu: \"2\" added",
            ],
        ),
        // A whole-GPU pod with KAI's priority label and a pod group annotation; its limit stays.
        (
            "  labels: {kai.scheduler/queue: team-a, priorityClassName: train}\n  annotations: {pod-group-name: pg-1}\nspec:\n  schedulerName: kai-scheduler\n  containers:\n  - name: main\n    resources: {limits: {nvidia.com/gpu: \"1\"}}\n",
            json!({"name": "p", "namespace": "ml",
                   "labels": {"tessera.dev/queue": "team-a"},
                   "annotations": {"tessera.dev/pod-group": "pg-1"}}),
            json!({"schedulerName": "tessera", "priorityClassName": "train", "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
            vec![
                "label priorityClassName \"train\" → spec.priorityClassName",
                "annotation pod-group-name → tessera.dev/pod-group",
            ],
        ),
    ];
    for (kai, meta, want, notes) in table {
        let out = one(&format!("{POD_HEAD}{kai}"));
        assert_eq!(out.what, "Pod ml/p");
        let object = out.object.as_ref().expect("a Pod");
        assert_eq!(object["metadata"], meta, "{kai}");
        assert_eq!(object["spec"], want, "{kai}");
        assert_notes(&out, &notes);
    }
}

#[test]
fn a_distributed_jobs_templates_are_rewritten_and_its_kai_pod_group_is_left_to_the_owner() {
    let docs = source::parse(
        "job.yaml",
        r#"
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: dist
  namespace: ml
  labels: {kai.scheduler/queue: team-a}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          schedulerName: kai-scheduler
          containers:
          - name: pytorch
            resources: {limits: {nvidia.com/gpu: "1"}}
    Worker:
      replicas: 2
      template:
        spec:
          schedulerName: kai-scheduler
          containers:
          - name: pytorch
            resources: {limits: {nvidia.com/gpu: "1"}}
---
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata:
  name: pg-dist-1234
  namespace: ml
  ownerReferences:
  - {apiVersion: kubeflow.org/v1, kind: PyTorchJob, name: dist, uid: u, controller: true}
spec:
  minMember: 3
  queue: team-a
  priorityClassName: train
"#,
    )
    .expect("YAML");
    let m = migrate(&docs);
    let job = &m.outputs[0];
    let object = job.object.as_ref().expect("the job");
    assert_eq!(
        object["metadata"]["labels"],
        json!({"tessera.dev/queue": "team-a"})
    );
    for role in ["Master", "Worker"] {
        let template = &object["spec"]["pytorchReplicaSpecs"][role]["template"];
        assert_eq!(template["spec"]["schedulerName"], "tessera", "{role}");
        assert_eq!(
            template["metadata"]["labels"],
            json!({"tessera.dev/queue": "team-a"}),
            "{role}: the owner's queue reaches the pods"
        );
    }
    assert_notes(
        job,
        &[
            "spec.pytorchReplicaSpecs.Worker.template: schedulerName kai-scheduler → tessera",
            "the PyTorchJob's pods form one gang without any object",
        ],
    );
    let group = &m.outputs[1];
    assert_eq!(group.what, "PodGroup ml/pg-dist-1234");
    assert_eq!(group.object, None);
    assert_notes(
        group,
        &["made by KAI's pod grouper for PyTorchJob dist: not written"],
    );
}

#[test]
fn kai_pod_groups_become_tessera_pod_groups() {
    // (KAI spec, Tessera spec, notes)
    let table: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "spec:\n  minMember: 3\n  queue: team-a\n  priorityClassName: train\n  preemptibility: non-preemptible\n  topologyConstraint:\n    topology: cluster-topology\n    requiredTopologyLevel: topology/rack\n    preferredTopologyLevel: kubernetes.io/hostname\n",
            json!({"minMember": 3, "queue": "team-a", "priorityClassName": "train",
                   "topology": {"required": "topology/rack", "preferred": "kubernetes.io/hostname"}}),
            vec![
                "preemptibility non-preemptible: label the group's pods tessera.dev/preemptible: \"false\"",
                "topology \"cluster-topology\": Tessera uses one Topology object",
                "topology level \"topology/rack\" is KAI's node label",
            ],
        ),
        // Subgroups: the leaves' minMember summed; KAI's documentation spells the field
        // `subgroups`, its CRD `subGroups`.
        (
            "spec:\n  queue: team-a\n  subgroups:\n  - {name: ab}\n  - {name: a, minMember: 1, parent: ab}\n  - {name: b, minMember: 2, parent: ab}\n  - {name: c, minMember: 3}\n",
            json!({"minMember": 6, "queue": "team-a"}),
            vec![
                "subGroups [\"ab\", \"a\", \"b\", \"c\"] do not carry over",
                "minMember is 6",
            ],
        ),
        (
            "spec:\n  minMember: 2\n  backoffLimit: 3\n  markUnschedulable: true\n",
            json!({"minMember": 2}),
            vec![
                "backoffLimit does not carry over",
                "markUnschedulable does not carry over",
            ],
        ),
    ];
    for (kai, want, notes) in table {
        let out = one(&format!(
            "apiVersion: scheduling.run.ai/v2alpha2\nkind: PodGroup\nmetadata:\n  name: g\n  namespace: ml\n{kai}"
        ));
        assert_eq!(out.what, "PodGroup ml/g");
        let object = out.object.as_ref().expect("a PodGroup");
        assert_eq!(object["kind"], "PodGroup");
        assert_eq!(object["apiVersion"], "tessera.dev/v1alpha1");
        assert_eq!(spec(&out), &want, "{kai}");
        assert_notes(&out, &notes);
    }
    for (kai, fragment) in [
        (
            "spec:\n  minMember: 0\n",
            "spec.minMember: 0 is not a whole number of at least 1",
        ),
        (
            "spec:\n  preemptibility: sometimes\n",
            "spec.preemptibility: \"sometimes\" is not \"preemptible\" or \"non-preemptible\"",
        ),
    ] {
        let out = one(&format!(
            "apiVersion: scheduling.run.ai/v2alpha2\nkind: PodGroup\nmetadata:\n  name: g\n  namespace: ml\n{kai}"
        ));
        assert_eq!(out.object, None);
        assert_notes(&out, &[fragment]);
    }
}

#[test]
fn other_documents_pass_unchanged_and_the_output_is_commented_yaml() {
    let docs = source::parse(
        "x.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: scheduling.run.ai/v2\n  kind: Queue\n  metadata: {name: q}\n  spec: {resources: {gpu: {quota: 1, overQuotaWeight: 1, limit: -1}}}\n- apiVersion: scheduling.run.ai/v1alpha2\n  kind: BindRequest\n  metadata: {name: b}\n",
    )
    .expect("YAML");
    assert_eq!(
        docs.iter().map(|d| d.origin.as_str()).collect::<Vec<_>>(),
        ["x.yaml#1", "x.yaml#3.items[0]", "x.yaml#3.items[1]"]
    );
    let m = migrate(&docs);
    assert_eq!(m.outputs[0].object.as_ref(), Some(&docs[0].value));
    assert_notes(&m.outputs[0], &["nothing of KAI's in it: unchanged"]);
    assert_notes(
        &m.outputs[2],
        &["KAI's BindRequest has no Tessera counterpart"],
    );
    let text = m.to_yaml().expect("YAML");
    assert!(text.starts_with("# tessera-coordinator migrate kai: 3 KAI document(s) read, 2 Tessera object(s) written."), "{text}");
    // The text parses back to exactly the objects written.
    let back = source::parse("out.yaml", &text).expect("the output is YAML");
    let written: Vec<&Value> = m.outputs.iter().filter_map(|o| o.object.as_ref()).collect();
    assert_eq!(back.iter().map(|d| &d.value).collect::<Vec<_>>(), written);
}

#[test]
fn a_directory_is_read_file_by_file_in_name_order() {
    let dir = tempfile::tempdir().expect("temporary directory");
    for (name, text) in [
        ("b.yml", "kind: ConfigMap\nmetadata: {name: b}\n"),
        (
            "a.yaml",
            "kind: ConfigMap\nmetadata: {name: a}\n---\nkind: ConfigMap\nmetadata: {name: a2}\n",
        ),
        ("notes.txt", "not read"),
    ] {
        std::fs::write(dir.path().join(name), text).expect("writing");
    }
    let docs = source::read_file(dir.path()).expect("the directory");
    let names: Vec<&str> = docs
        .iter()
        .filter_map(|d| d.value["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "a2", "b"]);
}

#[test]
fn unreadable_input_names_the_file_and_document() {
    let e = source::parse("bad.yaml", "a: 1\n---\n: [\n").unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("bad.yaml, document 2: not YAML"), "{text}");
}

/// The binary reads KAI's objects from a real API server (KAI's CRDs modelled with open
/// schemas: what is read is what KAI's users wrote) and everything it prints is accepted by
/// the API server with Tessera's CRDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_kai_reads_a_cluster_and_prints_what_the_api_server_accepts() {
    use tessera_testcluster::{Cluster, ClusterOptions, apply, wait_crd_established};
    // Pods need their namespace's ServiceAccount, which its controller creates.
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions {
            controllers: Some("serviceaccount-controller".into()),
            ..ClusterOptions::default()
        })
    });
    let client = cluster.admin().await;
    crate::e2e::apply_crds(&client).await;
    for (plural, kind, version, scope) in [
        ("queues", "Queue", "v2", "Cluster"),
        ("podgroups", "PodGroup", "v2alpha2", "Namespaced"),
    ] {
        apply(
            &client,
            &json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.scheduling.run.ai")},
                "spec": {"group": "scheduling.run.ai", "scope": scope,
                         "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                         "versions": [{"name": version, "served": true, "storage": true,
                                       "schema": {"openAPIV3Schema": {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": true}}}]},
            }),
        )
        .await;
        wait_crd_established(&client, &format!("{plural}.scheduling.run.ai")).await;
    }
    let objects = [
        json!({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "org"},
               "spec": {"resources": {"gpu": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
                                      "cpu": {"quota": -1, "overQuotaWeight": 1, "limit": -1},
                                      "memory": {"quota": -1, "overQuotaWeight": 1, "limit": -1}}}}),
        json!({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "team-a"},
               "spec": {"parentQueue": "org", "priority": 150,
                        "resources": {"gpu": {"quota": 2, "overQuotaWeight": 2, "limit": 4},
                                      "cpu": {"quota": 8000, "overQuotaWeight": 1, "limit": -1},
                                      "memory": {"quota": 32000, "overQuotaWeight": 1, "limit": 0}}}}),
        json!({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
               "metadata": {"name": "train", "namespace": "default"},
               "spec": {"minMember": 2, "queue": "team-a",
                        "topologyConstraint": {"requiredTopologyLevel": "topology/rack"}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "half", "namespace": "default",
                   "labels": {"kai.scheduler/queue": "team-a"}, "annotations": {"gpu-fraction": "0.5"}},
               "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "cuda"}]}}),
    ];
    tessera_testcluster::wait_service_account(&client, "default", "default").await;
    for o in &objects {
        apply(&client, o).await;
    }

    let kubeconfig = cluster.admin_kubeconfig();
    let output = tokio::task::block_in_place(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tessera-coordinator"))
            .args(["migrate", "kai", "--kubeconfig"])
            .arg(&kubeconfig)
            .output()
            .expect("running tessera-coordinator")
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = source::parse("stdout", &stdout).expect("the output is YAML");
    let kinds: Vec<(String, String)> = printed
        .iter()
        .map(|d| {
            (
                d.value["kind"].as_str().unwrap_or("").to_owned(),
                d.value["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("Queue".to_owned(), "org".to_owned()),
            ("Queue".to_owned(), "team-a".to_owned()),
            ("PodGroup".to_owned(), "train".to_owned()),
        ],
        "{stdout}"
    );
    // The running pod is explained, not printed.
    assert!(
        stdout.contains("# Pod default/half (from cluster)")
            && stdout.contains("container main: nvidia.com/gpu: \"1\" added")
            && stdout.contains("a running object is not rewritten"),
        "{stdout}"
    );
    let team = &printed[1].value["spec"];
    assert_eq!(
        team["gpu"],
        json!({"quota": 2.0, "overQuotaWeight": 2.0, "limit": 4.0})
    );
    assert_eq!(team["cpu"]["quota"], json!(8));
    assert_eq!(team["memory"]["limit"], json!("32000M"));
    // The API server (Tessera's CRDs, their schemas and CEL rules) takes every object.
    for d in &printed {
        apply(&client, &d.value).await;
    }
}
