//! Fuzzing the readers of untrusted input with proptest, bounded so it runs inside `cargo
//! test`: Kubernetes quantities, the Queue, PodGroup and Topology fields `crd::validate`
//! checks (and the queue translation and tenancy rules that read them), and every pod label
//! and annotation `translate::pod` reads. Arbitrary text never panics, and each value is
//! either accepted and in range or refused with a problem naming its field.

use proptest::prelude::*;
use serde_json::{Value, json};
use tessera_contract::Isolation;
use tessera_contract::keys;
use tessera_coordinator::crd::quantity::{self, Round};
use tessera_coordinator::crd::validate::{self, Problem};
use tessera_coordinator::crd::{PodGroup, Queue, Topology};
use tessera_coordinator::translate::pod::{self as pod_translate, PodContext, parse_fraction};
use tessera_coordinator::translate::queue::{Tenancy, translate as translate_queue};
use tessera_core::model::GpuShare;

/// Cases per property: enough to reach the corners the strategies aim at, few enough for
/// every `cargo test` (each case is microseconds).
const CASES: u32 = 512;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        // The seeds of failures are printed; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text a user might write, and text nobody would: any Unicode, numbers with suffixes and
/// exponents, signs, dots, spaces, huge digit runs.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ +-]?[0-9]{0,40}(\\.[0-9]{0,40})?([eE][+-]?[0-9]{1,4}|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)? ?",
        "[-a-zA-Z0-9_./]{0,70}",
        // Near namespace names and label keys, to reach both sides of each rule.
        "[-a-z0-9]{0,66}",
        "([a-z0-9.-]{0,12}/)?[-A-Za-z0-9_.]{0,65}",
        "(watchdog|mps|mig|none|true|false|True| 0\\.5|1|0|-1|1e3|\\.|\\.\\.)",
    ]
}

/// A namespace name as Kubernetes accepts one (the test's own reading of DNS-1123).
fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn problems_at<'a>(problems: &'a [Problem], field: &str) -> Vec<&'a Problem> {
    problems.iter().filter(|p| p.field == field).collect()
}

fn queue(spec: Value) -> Option<Queue> {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
                                  "metadata": {"name": "q"}, "spec": spec}),
    )
    .ok()
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("quota".to_string()),
                    Just("limit".to_string()),
                    Just("overQuotaWeight".to_string()),
                    Just("matchLabels".to_string()),
                    Just("matchExpressions".to_string()),
                    Just("key".to_string()),
                    Just("operator".to_string()),
                    Just("values".to_string()),
                    text(),
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn quantities_parse_or_say_why(s in text()) {
        match quantity::parse(&s) {
            Ok(p) => {
                // Every reading is defined: a number, or None when it does not fit.
                let _ = (p.milli(Round::Up), p.milli(Round::Down), p.mib(Round::Up), p.is_negative());
                prop_assert!(!p.as_f64().is_nan(), "{s:?}");
            }
            Err(e) => {
                let message = e.to_string();
                prop_assert!(message.contains("is not a quantity") && message.contains("64Gi"), "{message}");
            }
        }
    }

    #[test]
    fn queue_quantities_are_read_or_named(cpu in text(), memory in text(), gpu in any::<f64>(), weight in any::<f64>()) {
        let gpu = serde_json::Number::from_f64(gpu).map_or(json!(1), Value::Number);
        let weight = serde_json::Number::from_f64(weight).map_or(json!(1), Value::Number);
        let q = queue(json!({"cpu": {"quota": cpu, "limit": memory},
                             "memory": {"quota": memory, "overQuotaWeight": weight},
                             "gpu": {"quota": gpu, "overQuotaWeight": weight, "limit": gpu}}))
            .expect("strings and numbers are what the fields take");
        let problems = validate::queue(&q);
        for p in &problems {
            prop_assert!(p.field.starts_with("spec.") && !p.message.is_empty(), "{p}");
        }
        let readable = |t: &str| quantity::parse(t).is_ok_and(|p| !p.is_negative());
        prop_assert_eq!(readable(&cpu), problems_at(&problems, "spec.cpu.quota").is_empty(), "cpu {:?}: {:?}", cpu, problems);
        prop_assert_eq!(readable(&memory), problems_at(&problems, "spec.memory.quota").is_empty(), "memory {:?}: {:?}", memory, problems);
        // Whatever was refused, the translation reads a safe value.
        let m = translate_queue(&q);
        for r in [&m.gpu, &m.cpu, &m.memory] {
            prop_assert!(r.quota >= 0.0 && r.over_quota_weight >= 0.0, "{r:?}");
            prop_assert!(r.limit == -1.0 || r.limit >= 0.0, "{r:?}");
        }
    }

    #[test]
    fn queue_namespace_rules_are_read_or_named(
        names in prop::collection::vec(text(), 0..6),
        labels in prop::collection::btree_map(text(), text(), 0..4),
        expressions in prop::collection::vec((text(), text(), prop::collection::vec(text(), 0..3)), 0..4),
        pod_namespace in text(),
    ) {
        let exprs: Vec<Value> = expressions
            .iter()
            .map(|(k, op, values)| json!({"key": k, "operator": op, "values": values}))
            .collect();
        let q = queue(json!({"namespaces": names,
                             "namespaceSelector": {"matchLabels": labels, "matchExpressions": exprs}}))
            .expect("strings are what the fields take");
        let problems = validate::queue(&q);
        for (i, n) in names.iter().enumerate() {
            let first = names.iter().position(|m| m == n) == Some(i);
            let named = !problems_at(&problems, &format!("spec.namespaces[{i}]")).is_empty();
            prop_assert_eq!(named, !(is_dns_label(n) && first), "namespaces[{}] = {:?}: {:?}", i, n, problems);
        }
        for (j, (_, op, values)) in expressions.iter().enumerate() {
            let at = format!("spec.namespaceSelector.matchExpressions[{j}]");
            let known = validate::SELECTOR_OPERATORS.contains(&op.as_str());
            prop_assert_eq!(known, problems_at(&problems, &format!("{at}.operator")).is_empty(), "{:?}: {:?}", op, problems);
            if known {
                let wants = matches!(op.as_str(), "In" | "NotIn");
                let ok = wants != values.is_empty();
                prop_assert_eq!(ok, problems_at(&problems, &format!("{at}.values")).is_empty(), "{} {:?}: {:?}", op, values, problems);
            }
        }
        for p in &problems {
            prop_assert!(p.field.starts_with("spec.namespace"), "{p}");
        }
        // Judging a pod's namespace against the rule never fails, whatever the rule holds.
        let _ = Tenancy::new(&[&q], &[]).refusal("q", &pod_namespace);
    }

    #[test]
    fn any_json_in_a_queue_spec_is_refused_by_serde_or_validated(spec in prop::collection::btree_map(
        prop_oneof![Just("gpu"), Just("cpu"), Just("memory"), Just("namespaces"), Just("namespaceSelector"), Just("parent"), Just("priority")]
            .prop_map(str::to_string),
        json_value(),
        0..5,
    )) {
        let spec: serde_json::Map<String, Value> = spec.into_iter().collect();
        if let Some(q) = queue(Value::Object(spec)) {
            let problems = validate::queue(&q);
            prop_assert!(problems.iter().all(|p| p.field.starts_with("spec.")), "{problems:?}");
            let _ = translate_queue(&q);
            let _ = Tenancy::new(&[&q], &[]).refusal("q", "ns");
        }
    }

    #[test]
    fn pod_group_and_topology_fields_are_read_or_named(
        min in any::<i32>(),
        max in proptest::option::of(any::<i32>()),
        levels in prop::collection::vec((text(), text()), 0..5),
    ) {
        let g: PodGroup = serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"minMember": min, "maxMember": max}}))
            .expect("integers are what the fields take");
        let problems = validate::pod_group(&g, None);
        prop_assert_eq!(min >= 1, problems_at(&problems, "spec.minMember").is_empty(), "{:?}", problems);
        prop_assert_eq!(max.is_none_or(|m| m >= min), problems_at(&problems, "spec.maxMember").is_empty(), "{:?}", problems);

        let t: Topology = serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "Topology", "metadata": {"name": "default"},
            "spec": {"levels": levels.iter().map(|(n, l)| json!({"name": n, "nodeLabel": l})).collect::<Vec<_>>()}}))
            .expect("strings are what the fields take");
        let problems = validate::topology(&t);
        for (i, (name, _)) in levels.iter().enumerate() {
            let first = levels.iter().position(|(n, _)| n == name) == Some(i);
            let fine = !name.trim().is_empty() && first;
            prop_assert_eq!(fine, problems_at(&problems, &format!("spec.levels[{i}].name")).is_empty(), "{:?}: {:?}", name, problems);
        }
    }

    #[test]
    fn pod_labels_and_annotations_are_read_in_range_or_named(
        which in 0usize..PodKey::ALL.len(),
        value in text(),
        extra in prop::collection::btree_map(text(), text(), 0..4),
    ) {
        let key = PodKey::ALL[which];
        let pod = key.pod(&value, &extra);
        let ctx = PodContext { scheduler_name: "tessera".into(), ..PodContext::default() };
        let t = pod_translate::translate(&pod, &ctx).expect("an unbound pod of ours is translated");
        let named = t.pod.input_errors.iter().any(|e| e.field == key.name());
        for e in &t.pod.input_errors {
            prop_assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
        }
        if !named {
            let v = value.trim();
            match key {
                PodKey::Annotation(k) if k == keys::GPU_FRACTION || k == keys::GPU_FRACTION_ALIAS => {
                    prop_assert!(matches!(t.pod.gpu.per_gpu, GpuShare::Fraction(m) if (1..=1000).contains(&m) && parse_fraction(&value) == Some(m)), "{value:?}: {:?}", t.pod.gpu);
                }
                PodKey::Annotation(k) if k == keys::GPU_MEMORY || k == keys::GPU_MEMORY_ALIAS => {
                    prop_assert!(matches!(t.pod.gpu.per_gpu, GpuShare::MemoryMib(m) if m >= 1), "{value:?}: {:?}", t.pod.gpu);
                }
                PodKey::Annotation(k) if k == keys::GPU_FRACTION_NUM_DEVICES_ALIAS => {
                    prop_assert_eq!(Ok(t.pod.gpu.count), v.parse::<u32>(), "{:?}", value);
                    prop_assert!(t.pod.gpu.count >= 1);
                }
                PodKey::Annotation(k) if k == keys::ISOLATION => {
                    prop_assert_eq!(Ok(t.pod.isolation), Isolation::parse(&value), "{:?}", value);
                }
                PodKey::Annotation(k) if k == keys::MIN_MEMBER => {
                    prop_assert!(t.pod.min_member.is_some_and(|n| n >= 1 && Ok(n) == v.parse::<u32>()), "{value:?}: {:?}", t.pod.min_member);
                }
                PodKey::Annotation(k) if k == keys::TOPOLOGY_REQUIRED => {
                    prop_assert_eq!(t.topology_required.as_deref(), Some(v));
                    prop_assert!(!v.is_empty());
                }
                PodKey::Annotation(k) if k == keys::TOPOLOGY_PREFERRED => {
                    prop_assert_eq!(t.topology_preferred.as_deref(), Some(v));
                    prop_assert!(!v.is_empty());
                }
                PodKey::Annotation(_) => {
                    // The group annotations: a group named by the value, never an empty one.
                    prop_assert_eq!(t.pod.group.as_deref(), Some(v));
                    prop_assert!(!v.is_empty());
                }
                PodKey::Label(k) if k == keys::PREEMPTIBLE => {
                    prop_assert!(matches!(v.to_ascii_lowercase().as_str(), "true" | "false"), "{value:?}");
                    prop_assert_eq!(t.pod.preemptible, v.eq_ignore_ascii_case("true"));
                }
                PodKey::Label(_) => {
                    prop_assert_eq!(t.pod.queue.as_str(), v);
                    prop_assert!(!v.is_empty());
                }
            }
        }
    }
}

/// A label or annotation of the user contract that pod translation reads.
#[derive(Clone, Copy, Debug)]
enum PodKey {
    Annotation(&'static str),
    Label(&'static str),
}

impl PodKey {
    const ALL: [PodKey; 14] = [
        PodKey::Annotation(keys::GPU_FRACTION),
        PodKey::Annotation(keys::GPU_FRACTION_ALIAS),
        PodKey::Annotation(keys::GPU_MEMORY),
        PodKey::Annotation(keys::GPU_MEMORY_ALIAS),
        PodKey::Annotation(keys::GPU_FRACTION_NUM_DEVICES_ALIAS),
        PodKey::Annotation(keys::ISOLATION),
        PodKey::Annotation(keys::MIN_MEMBER),
        PodKey::Annotation(keys::TOPOLOGY_REQUIRED),
        PodKey::Annotation(keys::TOPOLOGY_PREFERRED),
        PodKey::Annotation(keys::POD_GROUP),
        PodKey::Annotation(keys::POD_GROUP_ALIAS),
        PodKey::Label(keys::QUEUE),
        PodKey::Label(keys::QUEUE_ALIAS),
        PodKey::Label(keys::PREEMPTIBLE),
    ];

    fn name(self) -> &'static str {
        match self {
            PodKey::Annotation(k) | PodKey::Label(k) => k,
        }
    }

    /// An unbound pod of Tessera's asking for one GPU, with this key set to `value` (plus
    /// what the key needs to be read at all: a share for the device count, a group for a gang
    /// size) and `extra` annotations that are not Tessera's.
    fn pod(
        self,
        value: &str,
        extra: &std::collections::BTreeMap<String, String>,
    ) -> k8s_openapi::api::core::v1::Pod {
        let mut annotations: serde_json::Map<String, Value> = extra
            .iter()
            .filter(|(k, _)| {
                !k.starts_with(keys::PREFIX) && !k.contains("gpu") && !k.contains("pod-group")
            })
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        let mut labels = serde_json::Map::new();
        match self {
            PodKey::Annotation(k) => {
                annotations.insert(k.into(), value.into());
                if k == keys::GPU_FRACTION_NUM_DEVICES_ALIAS {
                    annotations.insert(keys::GPU_FRACTION.into(), "0.5".into());
                }
                if k == keys::MIN_MEMBER {
                    annotations.insert(keys::POD_GROUP.into(), "g".into());
                }
            }
            PodKey::Label(k) => {
                labels.insert(k.into(), value.into());
            }
        }
        // The device count alias gives the count itself; the others ask for one GPU.
        let limits = if self.name() == keys::GPU_FRACTION_NUM_DEVICES_ALIAS {
            json!({})
        } else {
            json!({"nvidia.com/gpu": "1"})
        };
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                         "annotations": annotations, "labels": labels},
            "spec": {"schedulerName": "tessera",
                     "containers": [{"name": "main", "resources": {"limits": limits}}]},
        }))
        .expect("a pod")
    }
}
