//! Validation of Queue, PodGroup and Topology objects: each problem names the field and the
//! accepted form.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use tessera_coordinator::crd::validate::{self, Problem};
use tessera_coordinator::crd::{PodGroup, Queue, Topology};

fn queue(name: &str, spec: Value) -> Queue {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "Queue",
                                  "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

fn group(spec: Value) -> PodGroup {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "PodGroup",
                                  "metadata": {"name": "g", "namespace": "ns"}, "spec": spec}),
    )
    .unwrap()
}

fn topology(levels: Value) -> Topology {
    serde_json::from_value(
        json!({"apiVersion": "tessera.dev/v1alpha1", "kind": "Topology",
                                  "metadata": {"name": "default"}, "spec": {"levels": levels}}),
    )
    .unwrap()
}

fn has(problems: &[Problem], field: &str, words: &[&str]) -> bool {
    problems
        .iter()
        .any(|p| p.field == field && words.iter().all(|w| p.message.contains(w)))
}

#[test]
fn queue_fields() {
    // (spec, field, words)
    let cases: &[(Value, &str, &[&str])] = &[
        (
            json!({"gpu": {"quota": -1}}),
            "spec.gpu.quota",
            &["negative", "0 or more"],
        ),
        (
            json!({"gpu": {"overQuotaWeight": -2}}),
            "spec.gpu.overQuotaWeight",
            &["negative"],
        ),
        (
            json!({"gpu": {"quota": 4, "limit": 2}}),
            "spec.gpu.limit",
            &["below the quota", "-1"],
        ),
        (
            json!({"gpu": {"limit": -3}}),
            "spec.gpu.limit",
            &["-1 for no limit"],
        ),
        (
            json!({"cpu": {"quota": "-2"}}),
            "spec.cpu.quota",
            &["negative", "500m"],
        ),
        (
            json!({"cpu": {"quota": "lots"}}),
            "spec.cpu.quota",
            &["\"lots\"", "500m"],
        ),
        (
            json!({"memory": {"quota": "64Gi", "limit": "32Gi"}}),
            "spec.memory.limit",
            &["below the quota"],
        ),
        (
            json!({"memory": {"limit": "1Qi"}}),
            "spec.memory.limit",
            &["64Gi"],
        ),
        (
            json!({"memory": {"overQuotaWeight": -1}}),
            "spec.memory.overQuotaWeight",
            &["negative"],
        ),
        (json!({"parent": "q"}), "spec.parent", &["own parent"]),
        (
            json!({"namespaces": ["team-a", "Team_B"]}),
            "spec.namespaces[1]",
            &["\"Team_B\"", "lower-case", "team-a"],
        ),
        (
            json!({"namespaces": [""]}),
            "spec.namespaces[0]",
            &["empty", "namespace name"],
        ),
        (
            json!({"namespaces": ["-a"]}),
            "spec.namespaces[0]",
            &["start and end"],
        ),
        (
            json!({"namespaces": ["a", "b", "a"]}),
            "spec.namespaces[2]",
            &["twice"],
        ),
        (
            json!({"namespaces": ["x".repeat(64)]}),
            "spec.namespaces[0]",
            &["63"],
        ),
        (
            json!({"namespaceSelector": {"matchLabels": {"bad key": "x"}}}),
            "spec.namespaceSelector.matchLabels[\"bad key\"]",
            &["key", "label key", "example.com/team"],
        ),
        (
            json!({"namespaceSelector": {"matchLabels": {"Example.com/team": "x"}}}),
            "spec.namespaceSelector.matchLabels[\"Example.com/team\"]",
            &["key", "lower-case"],
        ),
        (
            json!({"namespaceSelector": {"matchLabels": {"team": "not ok"}}}),
            "spec.namespaceSelector.matchLabels[\"team\"]",
            &["value \"not ok\"", "label value"],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Gt", "values": ["1"]}]}}),
            "spec.namespaceSelector.matchExpressions[0].operator",
            &["\"Gt\"", "In, NotIn, Exists, DoesNotExist"],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
            "spec.namespaceSelector.matchExpressions[0].values",
            &["empty", "at least one value"],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["x"]}]}}),
            "spec.namespaceSelector.matchExpressions[0].values",
            &["takes no values"],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team/", "operator": "Exists"}]}}),
            "spec.namespaceSelector.matchExpressions[0].key",
            &["empty name"],
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["ok", "-no"]}]}}),
            "spec.namespaceSelector.matchExpressions[0].values[1]",
            &["\"-no\"", "label value"],
        ),
        (
            json!({"gpu": {"models": [{"model": "NVIDIA H100"}]}}),
            "spec.gpu.models[0].model",
            &[
                "\"NVIDIA H100\"",
                "nvidia.com/gpu.product",
                "NVIDIA-H100-80GB-HBM3",
            ],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S"}, {"model": "L40S"}]}}),
            "spec.gpu.models[1].model",
            &["twice"],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S", "quota": -2}]}}),
            "spec.gpu.models[0].quota",
            &["negative"],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S", "quota": 3, "limit": 1}]}}),
            "spec.gpu.models[0].limit",
            &["below the quota"],
        ),
        (
            json!({"gpu": {"models": [{"model": "L40S", "overQuotaWeight": -1}]}}),
            "spec.gpu.models[0].overQuotaWeight",
            &["negative"],
        ),
    ];
    for (spec, field, words) in cases {
        let problems = validate::queue(&queue("q", spec.clone()));
        assert!(has(&problems, field, words), "{spec}: {problems:?}");
    }
    let fine = [
        json!({}),
        json!({"gpu": {"quota": 2, "limit": -1}}),
        json!({"gpu": {"quota": 2, "limit": 2}}),
        json!({"cpu": {"quota": 32, "limit": "64"}, "memory": {"quota": "64Gi", "limit": -1}}),
        json!({"cpu": {"quota": "500m"}}),
        json!({"gpu": {"quota": 4, "models": [{"model": "NVIDIA-H100-80GB-HBM3", "quota": 2, "limit": 4},
                                              {"model": "L40S", "overQuotaWeight": 0}]}}),
        json!({"namespaces": []}),
        json!({"namespaces": ["team-a", "b0"], "namespaceSelector": {}}),
        json!({"namespaceSelector": {"matchLabels": {"example.com/team": "ml", "tier": ""},
               "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]},
                                    {"key": "gone", "operator": "DoesNotExist"}]}}),
    ];
    for spec in fine {
        let problems = validate::queue(&queue("q", spec.clone()));
        assert!(problems.is_empty(), "{spec}: {problems:?}");
    }
}

#[test]
fn queue_tree_missing_parent_cycle_and_parent_with_pods() {
    let qs = [
        queue("root", json!({})),
        queue("leaf", json!({"parent": "root"})),
        queue("orphan", json!({"parent": "nowhere"})),
        queue("a", json!({"parent": "b"})),
        queue("b", json!({"parent": "c"})),
        queue("c", json!({"parent": "a"})),
        queue("d", json!({"parent": "a"})),
    ];
    let refs: Vec<&Queue> = qs.iter().collect();
    let named = BTreeSet::from(["root".to_string(), "leaf".to_string()]);
    let out = validate::queue_tree(&refs, &named);
    assert!(has(
        &out["orphan"],
        "spec.parent",
        &["\"nowhere\" does not exist", "top-level"]
    ));
    for q in ["a", "b", "c"] {
        assert!(
            has(&out[q], "spec.parent", &["cycle", "tree"]),
            "{q}: {:?}",
            out[q]
        );
    }
    assert!(
        out["a"][0].message.contains("a -> b -> c -> a"),
        "{:?}",
        out["a"]
    );
    // d hangs below the cycle but is not part of it.
    assert!(!out.contains_key("d"), "{out:?}");
    assert!(has(
        &out["root"],
        "metadata.name",
        &["child queues (leaf)", "only leaf queues"]
    ));
    assert!(!out.contains_key("leaf"));
}

#[test]
fn pod_group_fields() {
    let topo = topology(
        json!([{"name": "zone", "nodeLabel": "topology.kubernetes.io/zone"},
                               {"name": "rack", "nodeLabel": "tessera.dev/rack"}]),
    );
    let cases: &[(Value, &str, &[&str])] = &[
        (json!({"minMember": 0}), "spec.minMember", &["below 1"]),
        (
            json!({"minMember": 4, "maxMember": 2}),
            "spec.maxMember",
            &["below minMember 4"],
        ),
        (
            json!({"minMember": 1, "topology": {"required": "row"}}),
            "spec.topology.required",
            &["\"row\" is not a level", "zone, rack"],
        ),
        (
            json!({"minMember": 1, "topology": {"preferred": "pod"}}),
            "spec.topology.preferred",
            &["not a level"],
        ),
    ];
    for (spec, field, words) in cases {
        let problems = validate::pod_group(&group(spec.clone()), Some(&topo));
        assert!(has(&problems, field, words), "{spec}: {problems:?}");
    }
    let fine = [
        json!({"minMember": 2, "maxMember": 2}),
        json!({"minMember": 2, "topology": {"required": "rack", "preferred": "zone"}}),
        // A level's label key is accepted as well as its name.
        json!({"minMember": 2, "topology": {"required": "tessera.dev/rack"}}),
    ];
    for spec in fine {
        let problems = validate::pod_group(&group(spec.clone()), Some(&topo));
        assert!(problems.is_empty(), "{spec}: {problems:?}");
    }
    // Without a Topology object, level names are not checked here (the core reports them).
    let problems = validate::pod_group(&group(json!({"topology": {"required": "row"}})), None);
    assert!(problems.is_empty());
}

#[test]
fn topology_fields_and_condition() {
    let t = topology(
        json!([{"name": "rack", "nodeLabel": "a"}, {"name": "rack", "nodeLabel": "a"},
                            {"name": "", "nodeLabel": ""}]),
    );
    let problems = validate::topology(&t);
    assert!(has(&problems, "spec.levels[1].name", &["twice"]));
    assert!(has(&problems, "spec.levels[1].nodeLabel", &["twice"]));
    assert!(has(&problems, "spec.levels[2].name", &["empty"]));
    assert!(has(&problems, "spec.levels[2].nodeLabel", &["empty"]));
    assert!(has(
        &validate::topology(&topology(json!([]))),
        "spec.levels",
        &["no levels"]
    ));

    let c = validate::condition(&problems, Some(3), "2026-01-01T00:00:00Z");
    assert_eq!((c.type_.as_str(), c.status.as_str()), ("Valid", "False"));
    assert!(c.message.contains("spec.levels[1].name: "), "{}", c.message);
    assert_eq!(c.observed_generation, Some(3));
    let c = validate::condition(&[], None, "2026-01-01T00:00:00Z");
    assert_eq!(c.status, "True");
}

mod quantities {
    use tessera_coordinator::crd::QuantityValue;
    use tessera_coordinator::crd::quantity::{Round, format_mib, format_milli, parse};

    #[test]
    fn parses_the_common_forms_exactly() {
        let cases: &[(&str, Option<i64>, Option<i64>)] = &[
            ("32", Some(32_000), None),
            ("500m", Some(500), None),
            ("0.1", Some(100), None),
            ("1.5", Some(1500), None),
            ("1e3", Some(1_000_000), None),
            ("64Gi", None, Some(65_536)),
            ("4096Mi", None, Some(4096)),
            ("1G", None, Some(954)),
            ("-1", Some(-1000), None),
        ];
        for (text, milli, mib) in cases {
            let p = parse(text).unwrap();
            if let Some(m) = milli {
                assert_eq!(p.milli(Round::Up), Some(*m), "{text}");
            }
            if let Some(m) = mib {
                assert_eq!(p.mib(Round::Up), Some(*m), "{text}");
            }
        }
        assert_eq!(parse("1G").unwrap().mib(Round::Down), Some(953));
        // -1 byte rounds up to 0 MiB and down to -1 MiB (how a `-1` memory limit reads as "none").
        assert_eq!(parse("-1").unwrap().mib(Round::Up), Some(0));
        assert_eq!(parse("-1").unwrap().mib(Round::Down), Some(-1));
    }

    #[test]
    fn rejects_garbage_with_the_accepted_form() {
        for bad in ["", "abc", "1.2.3", "5Xi", "--1", "1e999", "."] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().contains("64Gi"), "{bad}: {e}");
        }
    }

    #[test]
    fn values_read_integers_and_strings() {
        let v: QuantityValue = serde_json::from_str("32").unwrap();
        assert_eq!(v.0, "32");
        let v: QuantityValue = serde_json::from_str("\"64Gi\"").unwrap();
        assert_eq!(v.0, "64Gi");
        assert_eq!(
            serde_json::to_string(&QuantityValue::from("-1")).unwrap(),
            "-1"
        );
        assert_eq!(format_milli(1500), "1500m");
        assert_eq!(format_milli(4000), "4");
        assert_eq!(format_mib(65_536), "64Gi");
        assert_eq!(format_mib(1536), "1536Mi");
    }
}
