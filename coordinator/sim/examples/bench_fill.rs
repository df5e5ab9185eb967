//! The openb fill protocol on a larger, openb-shaped cluster: the 1,213 GPU nodes of the openb
//! node list repeated up to `TESSERA_BENCH_NODES` (default 5,000; copies named `<node>-r<k>`),
//! and the default trace's pods in a generated arrival order (seed 42, tuned to 130% of the
//! cluster's GPU capacity, as the published protocol does for the original cluster). Prints,
//! per policy, the placement loop's time (best of `TESSERA_BENCH_RUNS`, default 3) and
//! placements per second and a digest of its decisions (equal digests: the same decisions),
//! and at the end the process's peak memory.
//!
//! Run: `cargo run --release -p tessera-core --example bench_fill`. `TESSERA_BENCH_POLICIES`
//! (comma-separated, default `tessera,fgd`) picks the policies. Skips without the openb data.

use std::path::Path;

use tessera_sim::cluster::Cluster;
use tessera_sim::fill::run_fill;
use tessera_sim::openb::{OpenbNode, read_nodes, read_pods};
use tessera_sim::policy::Policy;
use tessera_sim::trace::{TYPICAL_COVERAGE, generate, typical_mix};

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// FNV-1a of every decision, to compare runs of different builds.
fn digest(lines: impl Iterator<Item = String>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for l in lines {
        for b in l.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(dir) =
        tessera_sim::experiment::default_data_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
    else {
        println!("openb data not found at ../../shared/data/openb: skipping");
        return Ok(());
    };
    let want = env_or("TESSERA_BENCH_NODES", 5000);
    let runs = env_or("TESSERA_BENCH_RUNS", 3).max(1);
    let base = read_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let original = read_pods(&dir.join("openb_pod_list_default.csv"))?;
    let nodes: Vec<OpenbNode> = (0..want)
        .map(|i| {
            let mut n = base[i % base.len()].clone();
            n.name = format!("{}-r{}", n.name, i / base.len());
            n
        })
        .collect();
    let mut cluster = Cluster::from_openb(&nodes, None);
    let arrivals = generate(&original, cluster.gpu_milli(), nodes.len(), 1.3, 42);
    cluster.apply_permutation(&arrivals.node_perm);
    for p in &original {
        for m in p
            .gpu_spec
            .split('|')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            if cluster.models.get(m).is_none() {
                cluster.models.intern(m);
            }
        }
    }
    let mix = typical_mix(&cluster, &original, TYPICAL_COVERAGE);
    let pods: Vec<_> = arrivals.pods.iter().map(|p| cluster.pod(p)).collect();
    println!(
        "cluster: {} nodes, {} GPUs; {} arrivals (seed 42, 130% of GPU capacity)",
        cluster.nodes.len(),
        cluster.gpu_count(),
        pods.len()
    );
    let policies = std::env::var("TESSERA_BENCH_POLICIES").unwrap_or_else(|_| "tessera,fgd".into());
    for name in policies.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Ok(policy) = name.parse::<Policy>() else {
            println!("unknown policy {name}");
            continue;
        };
        let mut best = f64::INFINITY;
        let mut placed = 0;
        let mut decisions = 0;
        for _ in 0..runs {
            let out = run_fill(&cluster, &mix, &pods, policy, 42, &mut |_, _| {});
            best = best.min(out.wall.as_secs_f64());
            placed = out.placed;
            decisions = digest(out.placements.iter().map(|p| match p {
                Some(p) => format!("{} {:x}", p.node, p.gpus),
                None => "-".into(),
            }));
        }
        println!(
            "{name:<8} {placed} placed of {}: {:.1} ms (best of {runs}), {:.0} placements/s, decisions {decisions:016x}",
            pods.len(),
            best * 1000.0,
            placed as f64 / best
        );
    }
    match vm_hwm_kib() {
        Some(k) => println!("peak RSS (VmHWM): {:.1} MiB", k as f64 / 1024.0),
        None => println!("peak RSS: unavailable (/proc/self/status)"),
    }
    Ok(())
}
