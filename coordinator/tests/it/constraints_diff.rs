//! Differential test: Tessera's node filters against kube-scheduler's own filter plugins.
//!
//! Seeded random clusters (nodes with labels, taints, cordons and allocatable resources; bound
//! pods with labels, requests, host ports and anti-affinity; namespaces; volumes) and a pending
//! pod with random tolerations, node selector, node affinity, pod affinity and anti-affinity,
//! topology spread, host ports, requests and claims. Each case goes both ways:
//!
//! - Tessera: the Kubernetes objects through `translate::snapshot` (what the coordinator does
//!   with its watch caches) and `tessera_core::constraints::filter_nodes` (the rules the
//!   cycle applies);
//! - kube-scheduler: `kube-peer filters`, the PreFilter and Filter of NodeUnschedulable,
//!   TaintToleration, NodeAffinity, NodeResourcesFit, NodePorts, InterPodAffinity,
//!   PodTopologySpread and VolumeBinding, built from the pinned Kubernetes release.
//!
//! For every (pod, node) pair the verdicts must agree, and where both reject, Tessera's first
//! failing plugin must be among kube-scheduler's. A disagreement is shrunk (array elements and
//! object fields removed while the disagreement stays) and printed as the case JSON that
//! `kube-peer filters` reads, so it can be replayed by hand.
//!
//! `TESSERA_DIFF_SEED` and `TESSERA_DIFF_CASES` choose other seeds and sizes.
//!
//! Outside the comparison, on purpose: GPUs (kube-scheduler sees them only as an extended
//! resource; Tessera's own GPU fit is tested elsewhere), memory amounts that are not whole MiB
//! (the core counts memory in MiB), and unbound `WaitForFirstConsumer` claims without a
//! provisioner (a documented limit of `translate::volumes`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tessera_coordinator::translate;

const PENDING_UID: &str = "uid-pending";
const ZONES: [&str; 3] = ["z1", "z2", "z3"];
const APPS: [&str; 3] = ["web", "db", "ml"];
const NAMESPACES: [&str; 3] = ["default", "team-a", "team-b"];

/// The oracle process: one JSON case per line in, one answer per line out.
struct Oracle {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Oracle {
    fn start() -> Oracle {
        let bin = tessera_testcluster::kube_peer().unwrap_or_else(|e| panic!("{e}"));
        let mut child = Command::new(bin)
            .arg("filters")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} filters: {e}", bin.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Oracle {
            child,
            stdin,
            stdout,
        }
    }

    /// kube-scheduler's verdicts for each case: per node, the failing plugins. Cases are
    /// written in one batch and answered in order.
    fn ask(&mut self, cases: &[Value]) -> Vec<Value> {
        let mut answers = Vec::with_capacity(cases.len());
        // Small batches: a whole run written before reading would fill both pipes (the
        // oracle blocks writing answers nobody reads while this side blocks writing cases).
        for chunk in cases.chunks(16) {
            let mut batch = Vec::new();
            for c in chunk {
                serde_json::to_writer(&mut batch, c).expect("a JSON value serialises");
                batch.push(b'\n');
            }
            self.stdin
                .write_all(&batch)
                .and_then(|()| self.stdin.flush())
                .expect("writing to kube-peer filters");
            for _ in chunk {
                let mut line = String::new();
                let n = self
                    .stdout
                    .read_line(&mut line)
                    .expect("reading from kube-peer filters");
                assert!(n > 0, "kube-peer filters ended early");
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("kube-peer filters answered {line:?}: {e}"));
                answers.push(v);
            }
        }
        answers
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Per node: `None` where it passes, else the failing plugins (kube-scheduler: all of them;
/// Tessera: the first).
type Verdicts = Vec<(String, Option<BTreeSet<String>>)>;

fn kube_verdicts(case: &Value, answer: &Value) -> Result<Verdicts, String> {
    if let Some(e) = answer.get("error") {
        return Err(format!("kube-peer filters refused the case: {e}"));
    }
    let nodes = answer["nodes"].as_object().ok_or("answer has no nodes")?;
    Ok(node_names(case)
        .into_iter()
        .map(|n| {
            let fails: BTreeSet<String> = nodes[&n]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["plugin"].as_str().map(str::to_string))
                .collect();
            (n, (!fails.is_empty()).then_some(fails))
        })
        .collect())
}

fn node_names(case: &Value) -> Vec<String> {
    case["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn objects<T: serde::de::DeserializeOwned>(case: &Value, key: &str) -> Result<Vec<T>, String> {
    match case.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("{key}: {e}")),
    }
}

/// Tessera's verdicts: the case's objects as the coordinator's caches hold them, translated
/// and filtered by the core.
fn tessera_verdicts(case: &Value) -> Result<Verdicts, String> {
    let nodes: Vec<Node> = objects(case, "nodes")?;
    let mut pods: Vec<Pod> = objects(case, "pods")?;
    let mut pending: Pod =
        serde_json::from_value(case["pod"].clone()).map_err(|e| format!("pod: {e}"))?;
    pending
        .spec
        .get_or_insert_with(PodSpec::default)
        .scheduler_name = Some("tessera".into());
    pods.push(pending);
    let namespaces: Vec<Namespace> = objects(case, "namespaces")?;
    let pvs: Vec<PersistentVolume> = objects(case, "pvs")?;
    let pvcs: Vec<PersistentVolumeClaim> = objects(case, "pvcs")?;
    let classes: Vec<StorageClass> = objects(case, "storageClasses")?;
    let mut inputs = translate::Inputs::new(1_000, "tessera");
    inputs.nodes = nodes.iter().collect();
    inputs.pods = pods.iter().collect();
    inputs.namespaces = namespaces.iter().collect();
    inputs.volumes = pvs.iter().collect();
    inputs.claims = pvcs.iter().collect();
    inputs.storage_classes = classes.iter().collect();
    let snap = translate::snapshot(&inputs).snapshot;
    let idx = snap
        .pods
        .iter()
        .position(|p| p.uid == PENDING_UID)
        .ok_or("the pending pod was not translated")?;
    let pod = &snap.pods[idx];
    // Unreadable or unsatisfiable claims keep the pod pending as a whole, as VolumeBinding's
    // PreFilter rejects every node.
    let whole_pod = (!pod.input_errors.is_empty()).then(|| {
        let fields: Vec<&str> = pod.input_errors.iter().map(|e| e.field.as_str()).collect();
        assert!(
            fields
                .iter()
                .all(|f| f.contains("volume") || f.contains("claim")),
            "generated pods are valid except for their volumes: {:?}",
            pod.input_errors
        );
        BTreeSet::from(["VolumeBinding".to_string()])
    });
    let filtered = tessera_core::constraints::filter_nodes(&snap, idx);
    Ok(snap
        .nodes
        .iter()
        .zip(filtered)
        .map(|(n, r)| {
            let fails = whole_pod.clone().or_else(|| {
                r.map(|r| {
                    BTreeSet::from([r.kube_plugin().unwrap_or("(not a kube plugin)").to_string()])
                })
            });
            (n.name.clone(), fails)
        })
        .collect())
}

/// The first (node, Tessera, kube-scheduler) disagreement of a case.
fn disagreement(tessera: &Verdicts, kube: &Verdicts) -> Option<String> {
    for ((node, ours), (_, theirs)) in tessera.iter().zip(kube) {
        let agree = match (ours, theirs) {
            (None, None) => true,
            (Some(o), Some(t)) => o.is_subset(t),
            _ => false,
        };
        if !agree {
            return Some(format!(
                "node {node}: Tessera {}, kube-scheduler {}",
                verdict_text(ours),
                verdict_text(theirs)
            ));
        }
    }
    None
}

fn verdict_text(v: &Option<BTreeSet<String>>) -> String {
    match v {
        None => "fits".into(),
        Some(p) => format!(
            "rejects ({})",
            p.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Whether `case` still shows a disagreement (a case either side cannot read does not).
fn still_disagrees(oracle: &mut Oracle, case: &Value) -> Option<String> {
    let ours = tessera_verdicts(case).ok()?;
    let answer = oracle.ask(std::slice::from_ref(case)).pop()?;
    let theirs = kube_verdicts(case, &answer).ok()?;
    if ours.len() != theirs.len() {
        return None;
    }
    disagreement(&ours, &theirs)
}

/// Every path to an array element or object field, deepest last.
fn paths(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    match v {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                at.push(PathStep::Index(i));
                out.push(at.clone());
                paths(item, at, out);
                at.pop();
            }
        }
        Value::Object(fields) => {
            for (k, item) in fields {
                at.push(PathStep::Key(k.clone()));
                out.push(at.clone());
                paths(item, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum PathStep {
    Index(usize),
    Key(String),
}

fn without(v: &Value, path: &[PathStep]) -> Option<Value> {
    let mut out = v.clone();
    let (last, parent) = path.split_last()?;
    let mut cur = &mut out;
    for step in parent {
        cur = match step {
            PathStep::Index(i) => cur.get_mut(*i)?,
            PathStep::Key(k) => cur.get_mut(k.as_str())?,
        };
    }
    match (last, cur) {
        (PathStep::Index(i), Value::Array(items)) => {
            items.remove(*i);
        }
        (PathStep::Key(k), Value::Object(fields)) => {
            fields.remove(k);
        }
        _ => return None,
    }
    Some(out)
}

/// Removes what it can from `case` while the disagreement stays.
fn shrink(oracle: &mut Oracle, mut case: Value) -> (Value, String) {
    let why = still_disagrees(oracle, &case).unwrap_or_default();
    loop {
        let mut all = Vec::new();
        paths(&case, &mut Vec::new(), &mut all);
        let mut progressed = false;
        for path in all {
            // The id and the pending pod's identity keep the case answerable.
            let keep = matches!(path.first(), Some(PathStep::Key(k)) if k == "id")
                || (path.len() == 1 && matches!(&path[0], PathStep::Key(k) if k == "pod"));
            if keep {
                continue;
            }
            let Some(smaller) = without(&case, &path) else {
                continue;
            };
            // Only the same disagreement counts: a smaller case that disagrees differently
            // (say, a node stripped of its Ready condition) explains something else.
            if still_disagrees(oracle, &smaller).as_ref() == Some(&why) {
                case = smaller;
                progressed = true;
                break;
            }
        }
        if !progressed {
            return (case, why);
        }
    }
}

// ---- the generator -------------------------------------------------------------------------

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

fn gen_node(rng: &mut ChaCha8Rng, i: usize) -> Value {
    let name = format!("n{i}");
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/hostname".into(), json!(name));
    if rng.random_bool(0.85) {
        labels.insert(
            "topology.kubernetes.io/zone".into(),
            json!(pick(rng, &ZONES)),
        );
    }
    if rng.random_bool(0.5) {
        labels.insert("tier".into(), json!(pick(rng, &["gold", "silver"])));
    }
    if rng.random_bool(0.5) {
        labels.insert("cores".into(), json!(pick(rng, &["4", "8", "16"])));
    }
    let mut taints = Vec::new();
    for (key, value, effect) in [
        ("dedicated", "ml", "NoSchedule"),
        ("dedicated", "web", "NoExecute"),
        ("spot", "", "NoSchedule"),
        ("maintenance", "", "PreferNoSchedule"),
    ] {
        if rng.random_bool(0.1) {
            taints.push(json!({"key": key, "value": value, "effect": effect}));
        }
    }
    let mut alloc = serde_json::Map::new();
    alloc.insert("cpu".into(), json!(pick(rng, &["2", "4", "8", "3500m"])));
    alloc.insert(
        "memory".into(),
        json!(pick(rng, &["4Gi", "8Gi", "16Gi", "6144Mi"])),
    );
    alloc.insert("pods".into(), json!(pick(rng, &["2", "4", "110", "110"])));
    if rng.random_bool(0.5) {
        alloc.insert("example.com/widget".into(), json!(pick(rng, &["1", "2"])));
    }
    if rng.random_bool(0.7) {
        alloc.insert(
            "ephemeral-storage".into(),
            json!(pick(rng, &["10Gi", "20Gi"])),
        );
    }
    let mut spec = json!({});
    if !taints.is_empty() {
        spec["taints"] = json!(taints);
    }
    if rng.random_bool(0.1) {
        spec["unschedulable"] = json!(true);
    }
    json!({
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "allocatable": alloc,
            "capacity": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

fn gen_requests(rng: &mut ChaCha8Rng, extended: bool) -> Value {
    let mut req = serde_json::Map::new();
    if rng.random_bool(0.7) {
        req.insert("cpu".into(), json!(pick(rng, &["500m", "1", "1500m", "2"])));
    }
    if rng.random_bool(0.7) {
        req.insert("memory".into(), json!(pick(rng, &["512Mi", "1Gi", "3Gi"])));
    }
    if extended && rng.random_bool(0.2) {
        req.insert("example.com/widget".into(), json!(pick(rng, &["1", "2"])));
    }
    if extended && rng.random_bool(0.15) {
        req.insert(
            "ephemeral-storage".into(),
            json!(pick(rng, &["5Gi", "15Gi"])),
        );
    }
    json!({ "requests": req })
}

fn gen_ports(rng: &mut ChaCha8Rng) -> Option<Value> {
    rng.random_bool(0.2).then(|| {
        let port = *pick(rng, &[8080, 9090]);
        let mut p = json!({"containerPort": port, "hostPort": port});
        if rng.random_bool(0.3) {
            p["protocol"] = json!("UDP");
        }
        if rng.random_bool(0.2) {
            p["hostIP"] = json!("10.0.0.1");
        }
        json!([p])
    })
}

fn selector(rng: &mut ChaCha8Rng) -> Value {
    if rng.random_bool(0.5) {
        json!({"matchLabels": {"app": pick(rng, &APPS)}})
    } else {
        let op = *pick(rng, &["In", "NotIn", "Exists", "DoesNotExist"]);
        let mut e = json!({"key": "app", "operator": op});
        if matches!(op, "In" | "NotIn") {
            e["values"] = json!([pick(rng, &APPS), pick(rng, &APPS)]);
        }
        json!({"matchExpressions": [e]})
    }
}

fn topology_key(rng: &mut ChaCha8Rng) -> &'static str {
    const KEYS: [&str; 2] = ["kubernetes.io/hostname", "topology.kubernetes.io/zone"];
    KEYS[rng.random_range(0..KEYS.len())]
}

fn pod_term(rng: &mut ChaCha8Rng) -> Value {
    let mut t = json!({"labelSelector": selector(rng), "topologyKey": topology_key(rng)});
    match rng.random_range(0..4) {
        0 => t["namespaces"] = json!([pick(rng, &NAMESPACES)]),
        1 => t["namespaceSelector"] = json!({"matchLabels": {"team": pick(rng, &["a", "b"])}}),
        2 => t["namespaceSelector"] = json!({}),
        _ => {}
    }
    t
}

fn gen_bound_pod(rng: &mut ChaCha8Rng, i: usize, nodes: usize) -> Value {
    let mut container = json!({"name": "c", "image": "i", "resources": gen_requests(rng, true)});
    if let Some(ports) = gen_ports(rng) {
        container["ports"] = ports;
    }
    let mut spec = json!({
        "nodeName": format!("n{}", rng.random_range(0..nodes)),
        "schedulerName": pick(rng, &["default-scheduler", "default-scheduler", "tessera"]),
        "containers": [container],
    });
    if rng.random_bool(0.2) {
        spec["affinity"] = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [pod_term(rng)]}});
    }
    let phase = if rng.random_bool(0.1) {
        "Succeeded"
    } else {
        "Running"
    };
    json!({
        "metadata": {
            "name": format!("p{i}"),
            "namespace": pick(rng, &NAMESPACES),
            "uid": format!("uid-p{i}"),
            "labels": {"app": pick(rng, &APPS)},
        },
        "spec": spec,
        "status": {"phase": phase},
    })
}

fn gen_tolerations(rng: &mut ChaCha8Rng) -> Vec<Value> {
    let mut out = Vec::new();
    let choices = [
        json!({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}),
        json!({"key": "dedicated", "operator": "Equal", "value": "web"}),
        json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
        json!({"key": "spot", "operator": "Exists"}),
        json!({"key": "spot", "value": ""}),
        json!({"operator": "Exists"}),
        json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}),
    ];
    for c in choices {
        if rng.random_bool(0.12) {
            out.push(c);
        }
    }
    out
}

fn node_selector_term(rng: &mut ChaCha8Rng) -> Value {
    let mut exprs = Vec::new();
    for _ in 0..rng.random_range(0..3) {
        let e = match rng.random_range(0..6) {
            0 => {
                json!({"key": "tier", "operator": "In", "values": [pick(rng, &["gold", "silver"])]})
            }
            1 => {
                json!({"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": [pick(rng, &ZONES)]})
            }
            2 => json!({"key": "tier", "operator": pick(rng, &["Exists", "DoesNotExist"])}),
            3 => {
                json!({"key": "cores", "operator": pick(rng, &["Gt", "Lt"]), "values": [pick(rng, &["4", "8"])]})
            }
            4 => {
                json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": [pick(rng, &ZONES), pick(rng, &ZONES)]})
            }
            _ => json!({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n0"]}),
        };
        exprs.push(e);
    }
    let mut term = json!({"matchExpressions": exprs});
    if rng.random_bool(0.15) {
        term["matchFields"] = json!([{"key": "metadata.name", "operator": pick(rng, &["In", "NotIn"]),
            "values": [format!("n{}", rng.random_range(0..4))]}]);
    }
    term
}

fn gen_spread(rng: &mut ChaCha8Rng) -> Value {
    let mut c = json!({
        "maxSkew": rng.random_range(1..3),
        "topologyKey": topology_key(rng),
        "whenUnsatisfiable": pick(rng, &["DoNotSchedule", "DoNotSchedule", "ScheduleAnyway"]),
        "labelSelector": selector(rng),
    });
    if rng.random_bool(0.2) {
        c["minDomains"] = json!(rng.random_range(2..5));
        c["whenUnsatisfiable"] = json!("DoNotSchedule");
    }
    if rng.random_bool(0.2) {
        c["nodeAffinityPolicy"] = json!(pick(rng, &["Honor", "Ignore"]));
    }
    if rng.random_bool(0.2) {
        c["nodeTaintsPolicy"] = json!(pick(rng, &["Honor", "Ignore"]));
    }
    if rng.random_bool(0.1) {
        c["matchLabelKeys"] = json!(["app"]);
    }
    c
}

/// Claims of the pending pod and the volumes behind them, in namespace `ns`.
fn gen_volumes(rng: &mut ChaCha8Rng, ns: &str, case: &mut Value) -> Vec<Value> {
    let mut vols = Vec::new();
    let mut pvs = Vec::new();
    let mut pvcs = Vec::new();
    for (i, (kind, p)) in [
        ("bound", 0.15),
        ("bound", 0.1),
        ("immediate", 0.04),
        ("late", 0.1),
        ("missing", 0.04),
    ]
    .iter()
    .enumerate()
    {
        if !rng.random_bool(*p) {
            continue;
        }
        let claim = format!("claim-{i}");
        vols.push(json!({"name": format!("v{i}"), "persistentVolumeClaim": {"claimName": claim}}));
        match *kind {
            "bound" => {
                let pv = format!("pv-{i}");
                let key = topology_key(rng);
                let values = if key == "kubernetes.io/hostname" {
                    json!([format!("n{}", rng.random_range(0..4))])
                } else {
                    json!([pick(rng, &ZONES)])
                };
                pvs.push(json!({
                    "metadata": {"name": pv},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "fast",
                        "claimRef": {"namespace": ns, "name": claim, "uid": format!("uid-{claim}")},
                        "hostPath": {"path": "/tmp"},
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]}},
                    },
                    "status": {"phase": "Bound"},
                }));
                pvcs.push(json!({
                    "metadata": {"name": claim, "namespace": ns, "uid": format!("uid-{claim}"),
                        "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                        "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}},
                    "status": {"phase": "Bound"},
                }));
            }
            "immediate" | "late" => {
                let class = if *kind == "immediate" { "fast" } else { "late" };
                pvcs.push(json!({
                    "metadata": {"name": claim, "namespace": ns, "uid": format!("uid-{claim}")},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                        "resources": {"requests": {"storage": "1Gi"}}},
                    "status": {"phase": "Pending"},
                }));
            }
            _ => {}
        }
    }
    case["pvs"] = json!(pvs);
    case["pvcs"] = json!(pvcs);
    case["storageClasses"] = json!([
        {"metadata": {"name": "fast"}, "provisioner": "example.com/csi",
         "volumeBindingMode": "Immediate"},
        {"metadata": {"name": "late"}, "provisioner": "example.com/csi",
         "volumeBindingMode": "WaitForFirstConsumer"},
    ]);
    vols
}

fn gen_pending(rng: &mut ChaCha8Rng, case: &mut Value) -> Value {
    let ns = *pick(rng, &NAMESPACES);
    let mut container = json!({"name": "c", "image": "i", "resources": gen_requests(rng, true)});
    if let Some(ports) = gen_ports(rng) {
        container["ports"] = ports;
    }
    let mut spec = json!({"containers": [container]});
    if rng.random_bool(0.15) {
        spec["initContainers"] = json!([{"name": "init", "image": "i",
            "resources": gen_requests(rng, false)}]);
    }
    let tolerations = gen_tolerations(rng);
    if !tolerations.is_empty() {
        spec["tolerations"] = json!(tolerations);
    }
    if rng.random_bool(0.1) {
        spec["nodeSelector"] = json!({"tier": pick(rng, &["gold", "silver"])});
    }
    let mut affinity = json!({});
    if rng.random_bool(0.3) {
        let terms: Vec<Value> = (0..rng.random_range(1..3))
            .map(|_| node_selector_term(rng))
            .collect();
        affinity["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": terms}});
    }
    if rng.random_bool(0.25) {
        affinity["podAffinity"] =
            json!({"requiredDuringSchedulingIgnoredDuringExecution": [pod_term(rng)]});
    }
    if rng.random_bool(0.25) {
        affinity["podAntiAffinity"] =
            json!({"requiredDuringSchedulingIgnoredDuringExecution": [pod_term(rng)]});
    }
    if affinity.as_object().is_some_and(|a| !a.is_empty()) {
        spec["affinity"] = affinity;
    }
    if rng.random_bool(0.3) {
        let spread: Vec<Value> = (0..rng.random_range(1..3))
            .map(|_| gen_spread(rng))
            .collect();
        spec["topologySpreadConstraints"] = json!(spread);
    }
    let vols = gen_volumes(rng, ns, case);
    if !vols.is_empty() {
        spec["volumes"] = json!(vols);
    }
    json!({
        "metadata": {"name": "pending", "namespace": ns, "uid": PENDING_UID,
            "labels": {"app": pick(rng, &APPS)}},
        "spec": spec,
    })
}

fn gen_case(rng: &mut ChaCha8Rng, id: usize) -> Value {
    let nodes = rng.random_range(2..7);
    let mut case = json!({
        "id": id,
        "nodes": (0..nodes).map(|i| gen_node(rng, i)).collect::<Vec<_>>(),
        "pods": (0..rng.random_range(0..9)).map(|i| gen_bound_pod(rng, i, nodes)).collect::<Vec<_>>(),
        "namespaces": [
            {"metadata": {"name": "default"}},
            {"metadata": {"name": "team-a", "labels": {"team": "a"}}},
            {"metadata": {"name": "team-b", "labels": {"team": "b"}}},
        ],
    });
    let pod = gen_pending(rng, &mut case);
    case["pod"] = pod;
    case
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn node_filters_agree_with_kube_scheduler_plugins() {
    let seed = env_or("TESSERA_DIFF_SEED", 14);
    let count = env_or("TESSERA_DIFF_CASES", 10_000) as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cases: Vec<Value> = (0..count).map(|i| gen_case(&mut rng, i)).collect();
    let mut oracle = Oracle::start();
    let answers = oracle.ask(&cases);

    let mut pairs = 0;
    let mut rejected = 0;
    let mut by_plugin = std::collections::BTreeMap::<String, usize>::new();
    for (case, answer) in cases.iter().zip(&answers) {
        let theirs = kube_verdicts(case, answer).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let ours = tessera_verdicts(case).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(
            ours.len(),
            theirs.len(),
            "node count differs for case {case}"
        );
        pairs += ours.len();
        for (_, v) in &theirs {
            if let Some(plugins) = v {
                rejected += 1;
                for p in plugins {
                    *by_plugin.entry(p.clone()).or_default() += 1;
                }
            }
        }
        if let Some(why) = disagreement(&ours, &theirs) {
            let (minimal, _) = shrink(&mut oracle, case.clone());
            let answer = oracle.ask(std::slice::from_ref(&minimal)).pop();
            panic!(
                "Tessera and kube-scheduler disagree (seed {seed}, case {}): {why}\n\
                 minimal case, as `kube-peer filters` reads it:\n{}\n\
                 kube-scheduler's answer to it:\n{}",
                case["id"],
                serde_json::to_string(&minimal).unwrap_or_default(),
                answer.unwrap_or_default()
            );
        }
    }
    eprintln!(
        "{pairs} (pod, node) pairs in {count} cases agree; kube-scheduler rejected {rejected}: {by_plugin:?}"
    );
    assert!(pairs >= 10_000, "only {pairs} pairs compared");
    // Every compared plugin must have rejected something, or the generator tests nothing.
    for plugin in [
        "NodeUnschedulable",
        "TaintToleration",
        "NodeAffinity",
        "NodeResourcesFit",
        "NodePorts",
        "InterPodAffinity",
        "PodTopologySpread",
        "VolumeBinding",
    ] {
        assert!(
            by_plugin.get(plugin).copied().unwrap_or(0) > 0,
            "no case made {plugin} reject a node: {by_plugin:?}"
        );
    }
}
