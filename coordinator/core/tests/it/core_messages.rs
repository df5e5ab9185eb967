//! Pending pods' messages, one row per message: cluster and pod in, the exact text out. The
//! node-level part comes first in kube-scheduler's words and order ("0/N nodes are available:
//! …, counts most frequent first."), then what the job and its queue wait for.

use tessera_core::cycle::{CycleConfig, schedule};
use tessera_core::model::{Isolation, Node};
use tessera_core::model::{
    NodeSelector, NodeSelectorTerm, Pod, PodGroup, Queue, Requirement, SelectorOp, Snapshot,
};

fn message(s: &Snapshot, pod: &str) -> String {
    let d = schedule(s, &CycleConfig::default());
    d.pending
        .iter()
        .find(|p| p.pod == pod)
        .unwrap_or_else(|| panic!("{pod} is not pending: {:?}", d.bindings))
        .message
        .clone()
}

/// A required node affinity no node's labels satisfy.
fn nowhere(mut pod: Pod) -> Pod {
    pod.constraints.node_affinity = Some(NodeSelector {
        terms: vec![NodeSelectorTerm {
            match_expressions: vec![Requirement {
                key: "example.com/pool".into(),
                operator: SelectorOp::In,
                values: vec!["absent".into()],
            }],
            match_fields: Vec::new(),
        }],
    });
    pod
}

/// | n1 8 H100 | a (quota 2), b (quota 6): b runs two gangs of 2 × 2 GPUs on n1.
fn b_holds_the_node() -> Snapshot {
    crate::core_scenarios::b_runs_two_gangs(2.0, 6.0)
}

/// Four nodes smaller than an 8-GPU pod in four ways.
fn smaller_nodes() -> Snapshot {
    Snapshot::at(1000)
        .queue(Queue::new("default"))
        .node(Node::gpu_node("l40s", 4, "L40S", 46_068))
        .node(Node::gpu_node("a100", 8, "A100", 40_960).unhealthy_gpu(3))
        .node(Node::gpu_node("h100-busy", 8, "H100", 81_559))
        .node(Node::cpu_node("cpu", 64_000, 262_144))
        .pod(Pod::new("holder", "default").gpus(1).on_node("h100-busy"))
}

#[test]
fn each_message_in_kube_schedulers_words_and_order() {
    let mig_pod = {
        let mut p = Pod::new("mig", "default").fraction(500);
        p.isolation = Isolation::Mig;
        p
    };
    let rows: Vec<(&str, Snapshot, &str, &str)> = vec![
        (
            "a pod whose node affinity matches no node hears it before fair share",
            b_holds_the_node().pod(nowhere(Pod::new("a0", "a").gpus(1).created(10))),
            "a0",
            "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. \
             queue a is below its fair share, but no preemptible pod of a queue above its own \
             can be evicted for it without taking that queue below its deserved quota, or below \
             its fair share where a would pass its own deserved quota (a gang leaves whole)",
        ),
        (
            "fair share alone once the node would fit",
            b_holds_the_node().pod(Pod::new("a0", "a").gpus(1).created(10)),
            "a0",
            "0/1 nodes are available: 1 node(s) had no free GPU. queue a is below its fair \
             share, but no preemptible pod of a queue above its own can be evicted for it \
             without taking that queue below its deserved quota, or below its fair share where \
             a would pass its own deserved quota (a gang leaves whole)",
        ),
        (
            "an 8-GPU pod on smaller nodes: fewer GPUs, unhealthy only where one is, taken",
            smaller_nodes().pod(Pod::new("big", "default").gpus(8)),
            "big",
            "0/4 nodes are available: 1 node(s) had no GPUs, 1 node(s) had fewer than 8 GPUs, \
             1 node(s) had fewer than 8 healthy GPUs, 1 node(s) had fewer than 8 free GPUs.",
        ),
        (
            "counts most frequent first",
            smaller_nodes()
                .node(Node::gpu_node("l40s-2", 4, "L40S", 46_068))
                .pod(Pod::new("big", "default").gpus(8)),
            "big",
            "0/5 nodes are available: 2 node(s) had fewer than 8 GPUs, 1 node(s) had no GPUs, \
             1 node(s) had fewer than 8 healthy GPUs, 1 node(s) had fewer than 8 free GPUs.",
        ),
        (
            "a one-GPU pod where no GPU is free",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .node(Node::gpu_node("n", 1, "H100", 81_559))
                .pod(Pod::new("holder", "default").gpus(1).on_node("n"))
                .pod(Pod::new("one", "default").gpus(1)),
            "one",
            "0/1 nodes are available: 1 node(s) had no free GPU.",
        ),
        (
            "a fraction on a full GPU",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .node(Node::gpu_node("n", 1, "H100", 81_559))
                .pod(Pod::new("holder", "default").fraction(800).on_node("n"))
                .pod(Pod::new("half", "default").fraction(500)),
            "half",
            "0/1 nodes are available: 1 node(s) had no GPU with enough free compute share.",
        ),
        (
            "a MIG pod on a node without MIG",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .node(Node::gpu_node("n", 2, "A100", 40_960))
                .pod(mig_pod),
            "mig",
            "0/1 nodes are available: 1 node(s) had no GPU in MIG mode.",
        ),
        (
            "a GPU model the pod does not accept",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .node(Node::gpu_node("n", 2, "A100", 40_960))
                .pod(Pod::new("h100-only", "default").gpus(1).models(&["H100"])),
            "h100-only",
            "0/1 nodes are available: 1 node(s) didn't have the GPU model the pod accepts.",
        ),
        (
            "a gang: the nodes first, then the gang",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .node(Node::gpu_node("n1", 8, "H100", 81_559))
                .node(Node::gpu_node("n2", 8, "H100", 81_559))
                .node(Node::gpu_node("n3", 4, "H100", 81_559))
                .pod(Pod::new("h1", "default").gpus(1).on_node("n1"))
                .pod(Pod::new("h2", "default").gpus(1).on_node("n2"))
                .group(PodGroup::new("g", "default", 2))
                .pod(Pod::new("g-0", "default").gpus(8).group("g"))
                .pod(Pod::new("g-1", "default").gpus(8).group("g")),
            "g-0",
            "0/3 nodes are available: 2 node(s) had fewer than 8 free GPUs, 1 node(s) had fewer \
             than 8 GPUs. gang default/g: its 2 pods do not fit together",
        ),
        (
            "a pod larger than every node: the nodes say so, no input error",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .node(Node::gpu_node("n1", 4, "L40S", 46_068))
                .node(Node::gpu_node("n2", 8, "A100", 40_960).unhealthy_gpu(0))
                .pod(Pod::new("big", "default").gpus(8)),
            "big",
            "0/2 nodes are available: 1 node(s) had fewer than 8 GPUs, 1 node(s) had fewer \
             than 8 healthy GPUs.",
        ),
        (
            "no nodes at all",
            Snapshot::at(1000)
                .queue(Queue::new("default"))
                .pod(Pod::new("p", "default").gpus(1)),
            "p",
            "no nodes available to schedule pods.",
        ),
    ];
    for (what, snapshot, pod, want) in rows {
        assert_eq!(message(&snapshot, pod), want, "{what}");
    }
}
