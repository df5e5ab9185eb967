//! Criterion benchmark: the whole openb default-trace fill (10,866 arrivals on 1,213 nodes, the
//! published arrival order of seed 42) per policy. Skips when the trace is absent.
//! Run: `cargo bench -p tessera-core --bench openb`.

use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use tessera_sim::experiment::{FillSpec, default_data_dir, prepare};
use tessera_sim::fill::run_fill;
use tessera_sim::policy::Policy;

fn openb(c: &mut Criterion) {
    let Some(dir) = default_data_dir(Path::new(env!("CARGO_MANIFEST_DIR"))) else {
        println!("openb data not found at ../../shared/data/openb: skipping");
        return;
    };
    let events = dir.join("events/default_s42_order.csv.gz");
    let spec = FillSpec {
        nodes: dir.join("openb_node_list_gpu_node.csv"),
        pods: dir.join("openb_pod_list_default.csv"),
        events: events.exists().then_some(events),
        prefixes: None,
        inflate: 1.3,
        seed: 42,
    };
    let p = match prepare(&spec) {
        Ok(p) => p,
        Err(e) => {
            println!("cannot read the openb trace: {e}; skipping");
            return;
        }
    };
    let mut g = c.benchmark_group("openb_default_fill");
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.measurement_time(Duration::from_secs(5));
    g.warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(p.arrivals.len() as u64));
    for policy in [Policy::Tessera, Policy::Fgd, Policy::BestFit] {
        g.bench_function(policy.name(), |b| {
            b.iter(|| run_fill(&p.cluster, &p.mix, &p.arrivals, policy, 42, &mut |_, _| {}))
        });
    }
    g.finish();
}

criterion_group!(benches, openb);
criterion_main!(benches);
