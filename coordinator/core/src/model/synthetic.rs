//! Synthetic clusters and workloads for benchmarks, tests and the simulator: deterministic for
//! a seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Node, Pod, PodGroup, Queue, Snapshot};

/// Shape of a synthetic cluster and workload.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    /// Nodes (8 GPUs each, NVLink pairs on even nodes, one 8-GPU NVSwitch island on odd ones).
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Nodes per rack (label `rack`); 1,000 nodes per zone (label `zone`).
    pub nodes_per_rack: usize,
    /// Pending pods to generate.
    pub pending_pods: usize,
    /// Top-level queues; each has `leaves_per_top` leaf children.
    pub top_queues: usize,
    /// Leaf queues per top-level queue.
    pub leaves_per_top: usize,
    /// Largest gang (pods).
    pub max_gang: u32,
    /// Seed.
    pub seed: u64,
}

impl Default for SyntheticSpec {
    /// The benchmark shape: 5,000 nodes × 8 GPUs, 50,000 pending pods, 100 queues in two levels
    /// (10 parents × 9 leaves), gangs up to 256 pods.
    fn default() -> Self {
        SyntheticSpec {
            nodes: 5000,
            gpus_per_node: 8,
            nodes_per_rack: 32,
            pending_pods: 50_000,
            top_queues: 10,
            leaves_per_top: 9,
            max_gang: 256,
            seed: 7,
        }
    }
}

/// Builds the snapshot described by `spec`: every pod pending.
pub fn synthetic(spec: &SyntheticSpec) -> Snapshot {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut s = Snapshot::at(0).levels(&["zone", "rack"]);
    for i in 0..spec.nodes {
        let name = format!("node-{i:05}");
        let island = if i % 2 == 0 { 2 } else { spec.gpus_per_node };
        let node = Node::gpu_node(&name, spec.gpus_per_node, "H100", 81_920)
            .with_cpu(192_000, 2_097_152)
            .nvlink_islands(island)
            .label("zone", &format!("z{}", i / 1000))
            .label("rack", &format!("r{:04}", i / spec.nodes_per_rack.max(1)));
        s.nodes.push(node);
    }
    let total_gpus = (spec.nodes as f64) * f64::from(spec.gpus_per_node);
    let leaves = spec.top_queues * spec.leaves_per_top;
    let mut leaf_names = Vec::with_capacity(leaves);
    for t in 0..spec.top_queues {
        let top = format!("org-{t:02}");
        let top_quota = (total_gpus * 0.8 / spec.top_queues as f64).floor();
        s.queues
            .push(Queue::new(&top).gpu(top_quota, 1.0 + (t % 3) as f64, -1.0));
        for l in 0..spec.leaves_per_top {
            let name = format!("{top}-team-{l}");
            let q = (top_quota / spec.leaves_per_top as f64).floor();
            let limit = if l == 0 { top_quota * 0.5 } else { -1.0 };
            s.queues.push(
                Queue::new(&name)
                    .parent(&top)
                    .gpu(q, 1.0 + (l % 2) as f64, limit),
            );
            leaf_names.push(name);
        }
    }
    let mut made = 0usize;
    let mut gang_no = 0usize;
    while made < spec.pending_pods {
        let queue = leaf_names[rng.random_range(0..leaf_names.len())].clone();
        let roll: f64 = rng.random();
        let prio = if rng.random_bool(0.2) { 50 } else { 0 };
        if roll < 0.04 && spec.max_gang >= 2 {
            // A gang: 2..=max_gang pods (powers of two), 8 or 1 GPUs each.
            let max_pow = (spec.max_gang as f64).log2() as u32;
            let size = (1u32 << rng.random_range(1..=max_pow))
                .min((spec.pending_pods - made).max(1) as u32);
            let per = if rng.random_bool(0.5) { 8 } else { 1 };
            let name = format!("gang-{gang_no:05}");
            gang_no += 1;
            let mut g = PodGroup::new(&name, &queue, size);
            if per == 8 && size <= spec.nodes_per_rack as u32 && rng.random_bool(0.5) {
                g = g.required("rack");
            } else if rng.random_bool(0.3) {
                g = g.preferred("rack");
            }
            s.groups.push(g);
            for k in 0..size {
                let pod = Pod::new(&format!("{name}-{k}"), &queue)
                    .controlled_by(&format!("Job {name}"))
                    .gpus(per)
                    .cpu(8_000, 65_536)
                    .group(&name)
                    .priority(prio)
                    .created(made as u64);
                s.pods.push(pod);
                made += 1;
            }
            continue;
        }
        let uid = format!("pod-{made:06}");
        // Every generated pod comes from a workload controller, which recreates it if evicted.
        let pod = Pod::new(&uid, &queue)
            .controlled_by(&format!("ReplicaSet {uid}"))
            .priority(prio)
            .created(made as u64);
        let pod = if roll < 0.50 {
            pod.fraction(50 * rng.random_range(2..=18))
                .cpu(2_000, 8_192)
        } else if roll < 0.60 {
            pod.gpu_memory(1, 1024 * rng.random_range(8..=40))
                .cpu(2_000, 8_192)
        } else if roll < 0.85 {
            pod.gpus(1).cpu(4_000, 16_384)
        } else if roll < 0.95 {
            pod.gpus([2, 4, 8][rng.random_range(0..3)])
                .cpu(8_000, 32_768)
        } else {
            pod.cpu(1_000, 2_048)
        };
        s.pods.push(pod);
        made += 1;
    }
    s
}
