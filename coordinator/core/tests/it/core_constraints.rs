//! kube-scheduler's constraints through whole cycles, one table per constraint: cluster and
//! pods in, where each pod lands (or why it waits) out.

use std::collections::BTreeMap;

use tessera_core::cycle::{CycleConfig, Decisions, schedule};
use tessera_core::model::{
    HostPort, InclusionPolicy, LabelSelector, NamespaceScope, Node, NodeSelector, NodeSelectorTerm,
    Pod, PodAffinityTerm, PodGroup, PreferredNodeTerm, Queue, Requirement, SelectorOp, Snapshot,
    SpreadConstraint, Taint, TaintEffect, Toleration, TolerationOp,
};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

fn node(name: &str, zone: &str) -> Node {
    Node::gpu_node(name, 4, "H100", 80_000)
        .label(HOST, name)
        .label(ZONE, zone)
}

fn cluster(nodes: Vec<Node>) -> Snapshot {
    let mut s = Snapshot::at(1000).queue(Queue::new("default"));
    for n in nodes {
        s = s.node(n);
    }
    s
}

fn three_nodes() -> Snapshot {
    cluster(vec![node("a", "z1"), node("b", "z1"), node("c", "z2")])
}

fn req(key: &str, op: SelectorOp, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op,
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

fn labels(pod: Pod, kv: &[(&str, &str)]) -> Pod {
    let mut pod = pod;
    for (k, v) in kv {
        pod.constraints.labels.insert(k.to_string(), v.to_string());
    }
    pod
}

fn app_selector(app: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        requirements: vec![req("app", SelectorOp::In, &[app])],
    })
}

fn term(app: &str, key: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        selector: app_selector(app),
        namespaces: NamespaceScope {
            names: vec!["default".into()],
            selector: None,
        },
        topology_key: key.into(),
    }
}

fn affinity(mut pod: Pod, terms: Vec<NodeSelectorTerm>) -> Pod {
    pod.constraints.node_affinity = Some(NodeSelector { terms });
    pod
}

fn on_node_term(names: &[&str]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: vec![req(HOST, SelectorOp::In, names)],
        match_fields: Vec::new(),
    }
}

fn taint(mut n: Node, key: &str, value: &str, effect: TaintEffect) -> Node {
    n.constraints.taints.push(Taint {
        key: key.into(),
        value: value.into(),
        effect,
    });
    n
}

fn tolerate(mut pod: Pod, key: &str, op: TolerationOp, value: &str) -> Pod {
    pod.constraints.tolerations.push(Toleration {
        key: key.into(),
        operator: op,
        value: value.into(),
        effect: None,
    });
    pod
}

fn run(s: &Snapshot) -> Decisions {
    schedule(s, &CycleConfig::default())
}

fn node_of<'a>(d: &'a Decisions, uid: &str) -> Option<&'a str> {
    d.bindings
        .iter()
        .find(|b| b.pod == uid)
        .map(|b| b.node.as_str())
}

fn pending_msg<'a>(d: &'a Decisions, uid: &str) -> &'a str {
    d.pending
        .iter()
        .find(|p| p.pod == uid)
        .map_or("<not pending>", |p| p.message.as_str())
}

#[test]
fn required_node_affinity_picks_the_named_node_or_waits() {
    let s = three_nodes()
        .pod(affinity(
            Pod::new("on-b", "default").gpus(1),
            vec![on_node_term(&["b"])],
        ))
        .pod(affinity(
            Pod::new("nowhere", "default").gpus(1),
            vec![on_node_term(&["x"])],
        ))
        // Terms are ORed; a term without requirements matches nothing.
        .pod(affinity(
            Pod::new("or", "default").gpus(1),
            vec![NodeSelectorTerm::default(), on_node_term(&["c"])],
        ));
    let d = run(&s);
    assert_eq!(node_of(&d, "on-b"), Some("b"));
    assert_eq!(node_of(&d, "or"), Some("c"));
    assert_eq!(node_of(&d, "nowhere"), None);
    assert_eq!(
        pending_msg(&d, "nowhere"),
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    );
}

#[test]
fn node_affinity_operators_and_fields() {
    let s = cluster(vec![
        node("a", "z1").label("rank", "3"),
        node("b", "z1").label("rank", "9"),
    ]);
    let cases: Vec<(NodeSelectorTerm, Option<&str>)> = vec![
        (
            NodeSelectorTerm {
                match_expressions: vec![req("rank", SelectorOp::Gt, &["5"])],
                match_fields: vec![],
            },
            Some("b"),
        ),
        (
            NodeSelectorTerm {
                match_expressions: vec![req(HOST, SelectorOp::NotIn, &["a"])],
                match_fields: vec![],
            },
            Some("b"),
        ),
        (
            NodeSelectorTerm {
                match_expressions: vec![],
                match_fields: vec![req("metadata.name", SelectorOp::In, &["a"])],
            },
            Some("a"),
        ),
        (
            NodeSelectorTerm {
                match_expressions: vec![req("gpu-class", SelectorOp::Exists, &[])],
                match_fields: vec![],
            },
            None,
        ),
    ];
    for (t, want) in cases {
        let d = run(&s
            .clone()
            .pod(affinity(Pod::new("p", "default").gpus(1), vec![t.clone()])));
        assert_eq!(node_of(&d, "p"), want, "{t:?}");
    }
}

#[test]
fn taints_keep_pods_out_unless_tolerated() {
    let s = cluster(vec![
        taint(node("a", "z1"), "dedicated", "ml", TaintEffect::NoSchedule),
        taint(node("b", "z1"), "maintenance", "", TaintEffect::NoExecute),
    ]);
    let cases: Vec<(Pod, Option<&str>)> = vec![
        (Pod::new("p", "default").gpus(1), None),
        (
            tolerate(
                Pod::new("p", "default").gpus(1),
                "dedicated",
                TolerationOp::Equal,
                "ml",
            ),
            Some("a"),
        ),
        (
            tolerate(
                Pod::new("p", "default").gpus(1),
                "dedicated",
                TolerationOp::Equal,
                "web",
            ),
            None,
        ),
        (
            tolerate(
                Pod::new("p", "default").gpus(1),
                "maintenance",
                TolerationOp::Exists,
                "",
            ),
            Some("b"),
        ),
        // An empty key with Exists tolerates everything.
        (
            tolerate(
                Pod::new("p", "default").gpus(4),
                "",
                TolerationOp::Exists,
                "",
            ),
            Some("a"),
        ),
    ];
    for (pod, want) in cases {
        let d = run(&s.clone().pod(pod.clone()));
        assert_eq!(node_of(&d, "p"), want, "{:?}", pod.constraints.tolerations);
    }
    let d = run(&s.clone().pod(Pod::new("p", "default").gpus(1)));
    assert_eq!(
        pending_msg(&d, "p"),
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: ml}, 1 node(s) had untolerated taint {maintenance: }."
    );
}

#[test]
fn prefer_no_schedule_is_a_preference_only() {
    let s = cluster(vec![
        taint(node("a", "z1"), "spot", "", TaintEffect::PreferNoSchedule),
        node("b", "z1"),
    ])
    .pod(Pod::new("p", "default").gpus(4))
    .pod(Pod::new("q", "default").gpus(4));
    let d = run(&s);
    assert_eq!(node_of(&d, "p"), Some("b"));
    assert_eq!(node_of(&d, "q"), Some("a"));
}

#[test]
fn cordoned_nodes_take_only_pods_that_tolerate_the_cordon() {
    let mut a = node("a", "z1");
    a.schedulable = false;
    let s = cluster(vec![a]);
    let d = run(&s.clone().pod(Pod::new("p", "default").gpus(1)));
    assert_eq!(
        pending_msg(&d, "p"),
        "0/1 nodes are available: 1 node(s) were unschedulable."
    );
    let tolerant = tolerate(
        Pod::new("p", "default").gpus(1),
        "node.kubernetes.io/unschedulable",
        TolerationOp::Exists,
        "",
    );
    assert_eq!(node_of(&run(&s.pod(tolerant)), "p"), Some("a"));
}

#[test]
fn required_anti_affinity_spreads_pods_and_the_rest_wait() {
    let web = |uid: &str| {
        let mut p = labels(Pod::new(uid, "default").gpus(1), &[("app", "web")]);
        p.constraints.pod_anti_affinity.push(term("web", HOST));
        p
    };
    let s = cluster(vec![node("a", "z1"), node("b", "z1")])
        .pod(web("w1"))
        .pod(web("w2"))
        .pod(web("w3"));
    let d = run(&s);
    let (n1, n2) = (node_of(&d, "w1"), node_of(&d, "w2"));
    assert!(n1.is_some() && n2.is_some() && n1 != n2, "{n1:?} {n2:?}");
    assert_eq!(node_of(&d, "w3"), None);
    // Both nodes hold a web pod: w3's own anti-affinity rejects both, and so do theirs.
    assert_eq!(
        pending_msg(&d, "w3"),
        "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."
    );
}

#[test]
fn a_running_pods_anti_affinity_keeps_matching_pods_away() {
    let mut guard = labels(Pod::new("guard", "default").gpus(1), &[("app", "db")]).on_node("a");
    guard
        .constraints
        .pod_anti_affinity
        .push(term("cache", HOST));
    let s = cluster(vec![node("a", "z1"), node("b", "z1")])
        .pod(guard)
        .pod(labels(
            Pod::new("cache", "default").gpus(3),
            &[("app", "cache")],
        ))
        .pod(labels(
            Pod::new("other", "default").gpus(3),
            &[("app", "other")],
        ));
    let d = run(&s);
    assert_eq!(node_of(&d, "cache"), Some("b"));
    // Not matched by the guard's term: free to share node a.
    assert_eq!(node_of(&d, "other"), Some("a"));
}

#[test]
fn required_affinity_follows_the_matching_pod_and_a_self_affine_series_may_start() {
    let leader = labels(Pod::new("leader", "default").gpus(1), &[("app", "db")]).on_node("c");
    let mut follower = Pod::new("follower", "default").gpus(1);
    follower.constraints.pod_affinity.push(term("db", ZONE));
    let s = three_nodes().pod(leader).pod(follower);
    assert_eq!(node_of(&run(&s), "follower"), Some("c"));

    // Nobody matches yet, but the pod matches its own term: it may go anywhere.
    let mut first = labels(Pod::new("first", "default").gpus(1), &[("app", "ring")]);
    first.constraints.pod_affinity.push(term("ring", ZONE));
    assert!(node_of(&run(&three_nodes().pod(first)), "first").is_some());

    // Nobody matches and the pod does not match itself: it waits.
    let mut lonely = Pod::new("lonely", "default").gpus(1);
    lonely.constraints.pod_affinity.push(term("ring", ZONE));
    let d = run(&three_nodes().pod(lonely));
    assert_eq!(
        pending_msg(&d, "lonely"),
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules."
    );
}

#[test]
fn namespace_selectors_choose_whose_pods_count() {
    let mut s = cluster(vec![node("a", "z1"), node("b", "z1")]);
    s.namespaces.insert(
        "team-x".into(),
        BTreeMap::from([("team".into(), "x".into())]),
    );
    s.namespaces.insert(
        "team-y".into(),
        BTreeMap::from([("team".into(), "y".into())]),
    );
    let mut there = labels(Pod::new("there", "default").gpus(1), &[("app", "web")]).on_node("a");
    there.namespace = "team-x".into();
    let mut p = Pod::new("p", "default").gpus(1);
    p.constraints.pod_anti_affinity.push(PodAffinityTerm {
        selector: app_selector("web"),
        namespaces: NamespaceScope {
            names: vec![],
            selector: Some(LabelSelector {
                requirements: vec![req("team", SelectorOp::In, &["x"])],
            }),
        },
        topology_key: HOST.into(),
    });
    let d = run(&s.clone().pod(there.clone()).pod(p.clone()));
    assert_eq!(node_of(&d, "p"), Some("b"));
    // The same pod in team-y is not counted.
    there.namespace = "team-y".into();
    let mut on_a = p.clone();
    on_a.constraints.node_affinity = Some(NodeSelector {
        terms: vec![on_node_term(&["a"])],
    });
    assert_eq!(node_of(&run(&s.pod(there).pod(on_a)), "p"), Some("a"));
}

fn spread(max_skew: u32, key: &str, hard: bool) -> SpreadConstraint {
    SpreadConstraint {
        max_skew,
        topology_key: key.into(),
        hard,
        selector: app_selector("web"),
        min_domains: None,
        node_affinity_policy: InclusionPolicy::Honor,
        node_taints_policy: InclusionPolicy::Ignore,
    }
}

#[test]
fn hard_topology_spread_balances_replicas_within_one_cycle() {
    let replica = |uid: &str| {
        let mut p = labels(Pod::new(uid, "default").fraction(100), &[("app", "web")]);
        p.constraints.spread.push(spread(1, HOST, true));
        p
    };
    let mut s = cluster(vec![node("a", "z1"), node("b", "z1")]);
    for i in 0..4 {
        s = s.pod(replica(&format!("r{i}")));
    }
    let d = run(&s);
    let on_a = d.bindings.iter().filter(|b| b.node == "a").count();
    let on_b = d.bindings.iter().filter(|b| b.node == "b").count();
    assert_eq!((on_a, on_b), (2, 2), "{:?}", d.bindings);
}

#[test]
fn spread_counts_running_pods_and_honours_min_domains() {
    // Not preemptible, so consolidation cannot move them to make room.
    let running = |uid: &str, n: &str| {
        labels(Pod::new(uid, "default").fraction(100), &[("app", "web")])
            .preemptible(false)
            .on_node(n)
    };
    let mut next = labels(Pod::new("next", "default").fraction(100), &[("app", "web")]);
    next.constraints.spread.push(spread(1, ZONE, true));
    let s = three_nodes().pod(running("x", "a")).pod(running("y", "b"));
    // z1 holds two, z2 none: only node c (z2) keeps the skew within 1.
    assert_eq!(
        node_of(&run(&s.clone().pod(next.clone())), "next"),
        Some("c")
    );

    // With minDomains 3 and two zones, the global minimum counts as 0: z2 (0+1) passes.
    let mut strict = next.clone();
    strict.constraints.spread[0].min_domains = Some(3);
    let with_c = s.clone().pod(running("z", "c")).pod(strict);
    let d = run(&with_c);
    assert_eq!(
        pending_msg(&d, "next"),
        "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints.",
        "{:?} {:?}",
        d.bindings,
        d.evictions
    );

    // A node without the key fails the constraint.
    let bare = Node::gpu_node("bare", 4, "H100", 80_000);
    let mut only_bare = next;
    only_bare.constraints.node_affinity = Some(NodeSelector {
        terms: vec![NodeSelectorTerm {
            match_expressions: vec![],
            match_fields: vec![req("metadata.name", SelectorOp::In, &["bare"])],
        }],
    });
    let d = run(&cluster(vec![bare]).pod(only_bare));
    assert_eq!(
        pending_msg(&d, "next"),
        "0/1 nodes are available: 1 node(s) didn't match pod topology spread constraints (missing required label)."
    );
}

#[test]
fn host_ports_extended_resources_and_pod_count() {
    let port = |ip: &str, n: u16| HostPort {
        protocol: "TCP".into(),
        ip: ip.into(),
        port: n,
    };
    let mut holder = Pod::new("holder", "default").on_node("a");
    holder.constraints.host_ports.push(port("", 8080));
    let mut wants = Pod::new("wants", "default").cpu(100, 10);
    wants.constraints.host_ports.push(port("10.0.0.1", 8080));
    let s = cluster(vec![node("a", "z1")])
        .pod(holder.clone())
        .pod(wants.clone());
    assert!(
        pending_msg(&run(&s), "wants").starts_with(
            "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
        ),
        "{}",
        pending_msg(&run(&s), "wants")
    );
    wants.constraints.host_ports[0].protocol = "UDP".into();
    let s = cluster(vec![node("a", "z1")]).pod(holder).pod(wants);
    assert_eq!(node_of(&run(&s), "wants"), Some("a"));

    let mut a = node("a", "z1");
    a.constraints.extended.insert("example.com/foo".into(), 2);
    a.constraints.max_pods = Some(2);
    let foo = |uid: &str, n: u64| {
        let mut p = Pod::new(uid, "default");
        p.constraints.extended.insert("example.com/foo".into(), n);
        p
    };
    let d = run(&cluster(vec![a.clone()]).pod(foo("big", 3)));
    assert_eq!(
        pending_msg(&d, "big"),
        "0/1 nodes are available: 1 Insufficient example.com/foo."
    );
    let d = run(&cluster(vec![a])
        .pod(foo("one", 1))
        .pod(foo("two", 1))
        .pod(Pod::new("three", "default")));
    assert_eq!(d.bindings.len(), 2);
    assert_eq!(
        pending_msg(&d, "three"),
        "0/1 nodes are available: 1 Too many pods."
    );
}

#[test]
fn volume_node_affinity_pins_the_pod() {
    let mut p = Pod::new("p", "default").gpus(1);
    p.constraints.volume_node_affinity.push(NodeSelector {
        terms: vec![NodeSelectorTerm {
            match_expressions: vec![req(ZONE, SelectorOp::In, &["z2"])],
            match_fields: vec![],
        }],
    });
    assert_eq!(node_of(&run(&three_nodes().pod(p.clone())), "p"), Some("c"));
    p.constraints.volume_node_affinity[0].terms[0].match_expressions[0].values = vec!["z9".into()];
    let d = run(&three_nodes().pod(p));
    assert_eq!(
        pending_msg(&d, "p"),
        "0/3 nodes are available: 3 node(s) didn't match PersistentVolume's node affinity."
    );
}

#[test]
fn gated_and_terminating_pods_are_never_placed() {
    let mut gated = Pod::new("gated", "default").gpus(1);
    gated
        .constraints
        .scheduling_gates
        .push("kueue.x-k8s.io/admission".into());
    let mut dying = Pod::new("dying", "default").gpus(1);
    dying.terminating = true;
    let d = run(&three_nodes().pod(gated).pod(dying));
    assert!(d.bindings.is_empty(), "{:?}", d.bindings);
    assert_eq!(
        pending_msg(&d, "gated"),
        "scheduling is blocked by the pod's scheduling gates (kueue.x-k8s.io/admission)"
    );
}

#[test]
fn preferred_node_affinity_ranks_nodes() {
    let mut p = Pod::new("p", "default").gpus(1);
    p.constraints
        .preferred_node_affinity
        .push(PreferredNodeTerm {
            weight: 50,
            term: on_node_term(&["c"]),
        });
    assert_eq!(node_of(&run(&three_nodes().pod(p)), "p"), Some("c"));
}

#[test]
fn a_gang_with_anti_affinity_among_its_members_is_all_or_nothing() {
    let member = |uid: &str| {
        let mut p = labels(Pod::new(uid, "default").gpus(1), &[("app", "ring")]).group("ring");
        p.constraints.pod_anti_affinity.push(term("ring", HOST));
        p
    };
    let gang = |s: Snapshot, n: usize| {
        let mut s = s.group(PodGroup::new("ring", "default", 3));
        for i in 0..n {
            s = s.pod(member(&format!("m{i}")));
        }
        s
    };
    let d = run(&gang(three_nodes(), 3));
    let mut nodes: Vec<&str> = d.bindings.iter().map(|b| b.node.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["a", "b", "c"]);
    let d = run(&gang(cluster(vec![node("a", "z1"), node("b", "z1")]), 3));
    assert!(d.bindings.is_empty(), "{:?}", d.bindings);
}
