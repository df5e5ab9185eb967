//! Criterion benchmark: one scheduling cycle on the synthetic 5,000-node, 40,000-GPU cluster
//! with 50,000 pending pods. Throughput is reported in placements (bindings) per second.
//! Run: `cargo bench -p tessera-core --bench cycle`.

use std::time::Duration;

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use tessera_core::cycle::{CycleConfig, schedule};
use tessera_core::model::synthetic::{SyntheticSpec, synthetic};

fn cycle(c: &mut Criterion) {
    let snap = synthetic(&SyntheticSpec::default());
    let cfg = CycleConfig::default();
    let placed = schedule(&snap, &cfg).bindings.len() as u64;
    let mut g = c.benchmark_group("cycle");
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.measurement_time(Duration::from_secs(10));
    g.warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(placed));
    g.bench_function("5000_nodes_50000_pending", |b| {
        b.iter(|| schedule(&snap, &cfg))
    });
    g.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
