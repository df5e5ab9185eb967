//! Property tests: whatever a cycle decides, no pod it places breaks a constraint that holds
//! regardless of placement order (static filters, required anti-affinity both ways, host ports,
//! pod count, extended resources, gates).

use proptest::prelude::*;
use tessera_core::constraints::{self, affinity, ports};
use tessera_core::cycle::{CycleConfig, schedule};
use tessera_core::model::{
    Assignment, HostPort, LabelSelector, NamespaceScope, Node, NodeSelector, NodeSelectorTerm,
    Placement, Pod, PodAffinityTerm, Queue, Requirement, SelectorOp, Snapshot, Taint, TaintEffect,
    Toleration, TolerationOp,
};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const APPS: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
struct NodeSpec {
    zone: u8,
    tainted: bool,
    max_pods: Option<u32>,
    widgets: u64,
}

#[derive(Clone, Debug)]
struct PodSpec {
    app: usize,
    gpus: u32,
    anti: Option<(usize, bool)>,
    tolerates: bool,
    zone: Option<u8>,
    port: Option<u16>,
    widgets: u64,
    gated: bool,
    bound_to: Option<usize>,
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        0..3u8,
        prop::bool::weighted(0.3),
        prop::option::weighted(0.4, 1..5u32),
        0..3u64,
    )
        .prop_map(|(zone, tainted, max_pods, widgets)| NodeSpec {
            zone,
            tainted,
            max_pods,
            widgets,
        })
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (
        (
            0..3usize,
            0..3u32,
            prop::option::weighted(0.4, (0..3usize, any::<bool>())),
        ),
        (any::<bool>(), prop::option::weighted(0.2, 0..3u8)),
        (
            prop::option::weighted(0.3, 80..82u16),
            prop::option::weighted(0.2, 1..3u64),
        ),
        (
            prop::bool::weighted(0.1),
            prop::option::weighted(0.3, 0..6usize),
        ),
    )
        .prop_map(
            |((app, gpus, anti), (tolerates, zone), (port, widgets), (gated, bound_to))| PodSpec {
                app,
                gpus,
                anti,
                tolerates,
                zone,
                port,
                widgets: widgets.unwrap_or(0),
                gated,
                bound_to,
            },
        )
}

fn app_term(app: usize, by_zone: bool) -> PodAffinityTerm {
    PodAffinityTerm {
        selector: Some(LabelSelector {
            requirements: vec![Requirement {
                key: "app".into(),
                operator: SelectorOp::In,
                values: vec![APPS[app].into()],
            }],
        }),
        namespaces: NamespaceScope {
            names: vec!["default".into()],
            selector: None,
        },
        topology_key: if by_zone { ZONE } else { HOST }.into(),
    }
}

fn build(nodes: &[NodeSpec], pods: &[PodSpec]) -> Snapshot {
    let mut s = Snapshot::at(100).queue(Queue::new("default"));
    for (i, n) in nodes.iter().enumerate() {
        let name = format!("n{i}");
        let mut node = Node::gpu_node(&name, 4, "H100", 80_000)
            .label(HOST, &name)
            .label(ZONE, &format!("z{}", n.zone));
        if n.tainted {
            node.constraints.taints.push(Taint {
                key: "dedicated".into(),
                value: "x".into(),
                effect: TaintEffect::NoSchedule,
            });
        }
        node.constraints.max_pods = n.max_pods;
        node.constraints
            .extended
            .insert("example.com/widgets".into(), n.widgets);
        s = s.node(node);
    }
    for (i, p) in pods.iter().enumerate() {
        let mut pod = Pod::new(&format!("p{i}"), "default").gpus(p.gpus);
        let c = &mut pod.constraints;
        c.labels.insert("app".into(), APPS[p.app].into());
        if let Some((app, by_zone)) = p.anti {
            c.pod_anti_affinity.push(app_term(app, by_zone));
        }
        if p.tolerates {
            c.tolerations.push(Toleration {
                key: "dedicated".into(),
                operator: TolerationOp::Exists,
                value: String::new(),
                effect: None,
            });
        }
        if let Some(z) = p.zone {
            c.node_affinity = Some(NodeSelector {
                terms: vec![NodeSelectorTerm {
                    match_expressions: vec![Requirement {
                        key: ZONE.into(),
                        operator: SelectorOp::In,
                        values: vec![format!("z{z}")],
                    }],
                    match_fields: vec![],
                }],
            });
        }
        if let Some(port) = p.port {
            c.host_ports.push(HostPort {
                protocol: "TCP".into(),
                ip: String::new(),
                port,
            });
        }
        if p.widgets > 0 {
            c.extended.insert("example.com/widgets".into(), p.widgets);
        }
        if p.gated {
            c.scheduling_gates.push("example.com/wait".into());
        }
        if let Some(n) = p.bound_to.filter(|&n| n < nodes.len() && !p.gated) {
            pod.placement = Some(Placement {
                node: format!("n{n}"),
                assignment: Assignment::default(),
            });
        }
        s = s.pod(pod);
    }
    s
}

/// Applies a cycle's decisions: evicted pods are gone, new bindings placed.
fn apply(s: &Snapshot, d: &tessera_core::cycle::Decisions) -> Snapshot {
    let mut out = s.clone();
    out.pods
        .retain(|p| !d.evictions.iter().any(|e| e.pod == p.uid));
    for b in &d.bindings {
        if let Some(p) = out.pods.iter_mut().find(|p| p.uid == b.pod) {
            p.placement = Some(Placement {
                node: b.node.clone(),
                assignment: b.assignment.clone(),
            });
        }
    }
    out
}

fn check(before: &Snapshot, after: &Snapshot, new: &[String]) -> Result<(), TestCaseError> {
    let node_of = |p: &Pod| p.placement.as_ref().map(|pl| pl.node.clone());
    let node = |name: &str| after.nodes.iter().find(|n| n.name == name);
    for p in after.pods.iter().filter(|p| new.contains(&p.uid)) {
        prop_assert!(
            p.constraints.scheduling_gates.is_empty(),
            "gated {} bound",
            p.uid
        );
        let n = node(&node_of(p).unwrap_or_default()).ok_or(TestCaseError::fail("no node"))?;
        prop_assert_eq!(
            constraints::static_misfit(p, n),
            None,
            "{} on {}",
            &p.uid,
            &n.name
        );
        let others: Vec<&Pod> = after
            .pods
            .iter()
            .filter(|q| q.uid != p.uid && q.placement.is_some())
            .collect();
        for q in &others {
            let qn = node(&node_of(q).unwrap_or_default()).ok_or(TestCaseError::fail("no node"))?;
            let ns = affinity::namespace_labels(after, "default");
            let same =
                |key: &str| n.labels.contains_key(key) && n.labels.get(key) == qn.labels.get(key);
            for t in &p.constraints.pod_anti_affinity {
                prop_assert!(
                    !(same(&t.topology_key) && affinity::term_matches(t, q, ns)),
                    "{} next to {} against its anti-affinity",
                    &p.uid,
                    &q.uid
                );
            }
            for t in &q.constraints.pod_anti_affinity {
                prop_assert!(
                    !(same(&t.topology_key) && affinity::term_matches(t, p, ns)),
                    "{} next to {} against that pod's anti-affinity",
                    &p.uid,
                    &q.uid
                );
            }
            if qn.name == n.name {
                for a in &p.constraints.host_ports {
                    prop_assert!(
                        !q.constraints
                            .host_ports
                            .iter()
                            .any(|b| ports::collide(a, b)),
                        "{} and {} share a host port",
                        &p.uid,
                        &q.uid
                    );
                }
            }
        }
        let here: Vec<&Pod> = after
            .pods
            .iter()
            .filter(|q| node_of(q).as_deref() == Some(n.name.as_str()))
            .collect();
        // Only nodes that took a new pod must respect the limits (the input may overcommit).
        let before_count = before
            .pods
            .iter()
            .filter(|q| node_of(q).as_deref() == Some(n.name.as_str()))
            .count();
        if let Some(max) = n.constraints.max_pods {
            prop_assert!(
                here.len() <= (max as usize).max(before_count),
                "{} pods on {} (max {max})",
                here.len(),
                &n.name
            );
        }
        if p.constraints.extended.contains_key("example.com/widgets") {
            let used: u64 = here
                .iter()
                .filter_map(|q| q.constraints.extended.get("example.com/widgets"))
                .sum();
            let have = n
                .constraints
                .extended
                .get("example.com/widgets")
                .copied()
                .unwrap_or(0);
            prop_assert!(
                used <= have,
                "{used} example.com/widgets on {} of {have}",
                &n.name
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn placements_respect_every_order_independent_constraint(
        nodes in prop::collection::vec(node_spec(), 1..6),
        pods in prop::collection::vec(pod_spec(), 1..14),
    ) {
        let before = build(&nodes, &pods);
        let d = schedule(&before, &CycleConfig::default());
        let new: Vec<String> = d.bindings.iter().map(|b| b.pod.clone()).collect();
        let after = apply(&before, &d);
        check(&before, &after, &new)?;
        // A second cycle on the result keeps them too.
        let d2 = schedule(&after, &CycleConfig::default());
        let new2: Vec<String> = d2.bindings.iter().map(|b| b.pod.clone()).collect();
        check(&after, &apply(&after, &d2), &new2)?;
    }
}
