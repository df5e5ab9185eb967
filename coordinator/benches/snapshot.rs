//! What one scheduling cycle's snapshot costs the in-cluster path before the core runs
//! (issue #18): the cache's objects through `translate`, joined with the agents and the
//! overlay, at 5,000 8-GPU nodes and 50,000 pods in 100 queues (four in five bound with an
//! assignment, one in five pending; half whole-GPU, the rest 0.5 or 0.25 GPU).
//!
//! `fresh` translates every object as if for the first time (what every cycle did before
//! [`snapshot::Builder`] remembered translations); `steady` is a cycle after 50 pods
//! changed, the common case while pods are being bound.
//!
//!     cargo bench -p tessera-coordinator --bench snapshot

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use tessera_contract::{Assignment, ContainerAssignment, GpuSlice};
use tessera_coordinator::agents::AgentNode;
use tessera_coordinator::cluster::cache::Store;
use tessera_coordinator::cluster::snapshot::{self, BuildContext, Builder, Overlay};
use tessera_core::model::Gpu;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 5_000;
const PODS: usize = 50_000;
const GPUS: usize = 8;

fn node(i: usize) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("n{i}"), "uid": format!("node-{i}"), "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": format!("n{i}"), "nvidia.com/gpu.present": "true"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}}
        }))
        .expect("a valid Node"),
    )
}

fn pod(i: usize, rv: u64) -> Arc<Pod> {
    let fraction = ["1", "1", "0.5", "0.25"][i % 4];
    let bound = !i.is_multiple_of(5);
    let mut annotations = serde_json::Map::new();
    if fraction != "1" {
        annotations.insert("tessera.dev/gpu-fraction".into(), fraction.into());
    }
    let n = i % NODES;
    if bound {
        let share: f64 = fraction.parse().expect("a number");
        let assignment = Assignment {
            containers: vec![ContainerAssignment {
                container: "main".into(),
                gpus: vec![GpuSlice {
                    uuid: format!("GPU-n{n}-{}", (i / NODES) % GPUS),
                    memory_mib: (81_920.0 * share) as u64,
                    compute_milli: (1000.0 * share) as u32,
                }],
            }],
        };
        annotations.insert("tessera.dev/assignment".into(), assignment.to_json().into());
    }
    let gpus = if fraction == "1" { "1" } else { "0" };
    let mut spec = serde_json::json!({
        "schedulerName": "tessera",
        "containers": [{"name": "main", "image": "trainer:1",
                        "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "4", "memory": "16Gi"},
                                      "requests": {"cpu": "4", "memory": "16Gi"}}}]
    });
    if bound {
        spec["nodeName"] = format!("n{n}").into();
    }
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("p{i}"), "namespace": "ml", "uid": format!("u{i}"),
                         "resourceVersion": rv.to_string(),
                         "creationTimestamp": "2026-12-01T00:00:00Z",
                         "labels": {"tessera.dev/queue": format!("q{}", i % 100), "app": "train"},
                         "annotations": annotations},
            "spec": spec,
            "status": {"phase": if bound { "Running" } else { "Pending" }}
        }))
        .expect("a valid Pod"),
    )
}

fn agents() -> Vec<AgentNode> {
    (0..NODES)
        .map(|n| {
            let name = format!("n{n}");
            AgentNode {
                gpus: (0..GPUS as u32)
                    .map(|i| Gpu::new(&name, i, "A100", 81_920))
                    .collect(),
                node: name,
                agent_version: "bench".into(),
                protocol_version: 1,
                shares_per_gpu: 10,
                occupancy: Default::default(),
                health_reasons: Default::default(),
                allocated_pods: Default::default(),
                occupancy_reports: 0,
                connected: true,
                last_seen: Instant::now(),
            }
        })
        .collect()
}

fn store() -> Store {
    let mut store = Store::default();
    for i in 0..NODES {
        store.nodes.insert(format!("n{i}"), node(i));
    }
    for i in 0..PODS {
        store.pods.insert(format!("u{i}"), pod(i, 1));
    }
    store
}

fn bench(c: &mut Criterion) {
    let mut store = store();
    let agents = agents();
    let overlay = Overlay::default();
    let ctx = BuildContext {
        now: 1_796_000_000,
        instant: Instant::now(),
        agent_timeout: Duration::from_secs(3600),
        scheduler_name: "tessera",
    };
    let mut group = c.benchmark_group("snapshot_5000_nodes_50000_pods");
    group.sample_size(10);
    group.bench_function("fresh", |b| {
        b.iter(|| snapshot::build(&store, &agents, &overlay, &ctx))
    });
    let mut builder = Builder::default();
    builder.build(&store, &agents, &overlay, &ctx);
    let mut rv = 1;
    group.bench_function("steady", |b| {
        b.iter(|| {
            rv += 1;
            for i in (0..PODS)
                .step_by(PODS / 50)
                .map(|i| (i + rv as usize) % PODS)
            {
                store.pods.insert(format!("u{i}"), pod(i, rv));
            }
            builder.build(&store, &agents, &overlay, &ctx)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
