//! One watchdog tick on an 8-GPU machine with 50 pod processes per GPU: sampling the
//! (simulated) backend, reading 400 cgroup files, the memory rule and the compute
//! controller on contended GPUs. No signal is really sent (they are recorded).
//!
//! `cargo bench -p tessera-agent --bench watchdog`

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use tessera_agent::enforce::limits::PodLimit;
use tessera_agent::enforce::signals::RecordedSignals;
use tessera_agent::enforce::state::EnforcementBoard;
use tessera_agent::enforce::watchdog::{Watchdog, WatchdogConfig};
use tessera_agent::events::RecordedEvents;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::ledger::PodRef;
use tessera_contract::Isolation;

const GPUS: u32 = 8;
const PROCESSES_PER_GPU: u32 = 50;
/// Pods per GPU (five processes each).
const PODS_PER_GPU: u32 = 10;

fn uid(gpu: u32, pod: u32) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", gpu, pod)
}

fn fake_proc(root: &Path, pid: u32, pod_uid: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n",
            pod_uid.replace('-', "_"),
            "c".repeat(64)
        ),
    )
    .unwrap();
}

fn tick(c: &mut Criterion) {
    let shape = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus/h100-8x-nvswitch.yaml");
    let sim = Arc::new(SimBackend::from_file(shape).unwrap());
    let proc_root = tempfile::tempdir().unwrap();
    let mut limits = Vec::new();
    let mut gpus = Vec::new();
    for g in 0..GPUS {
        let gpu = sim.uuid_of(g).unwrap().to_owned();
        for p in 0..PODS_PER_GPU {
            let pod_uid = uid(g, p);
            limits.push(PodLimit {
                pod: PodRef::new("bench", format!("pod-{g}-{p}")),
                pod_uid: pod_uid.clone(),
                gpu_uuid: gpu.clone(),
                memory_mib: 8000,
                compute_milli: 100,
                isolation: Isolation::Watchdog,
            });
        }
        for k in 0..PROCESSES_PER_GPU {
            // PIDs far above any real one on the bench machine; nothing is signalled anyway.
            let pid = 4_000_000 + g * 1000 + k;
            let pod = k % PODS_PER_GPU;
            fake_proc(proc_root.path(), pid, &uid(g, pod));
            // Half the GPUs contended (so the controller runs), one pod over memory.
            let sm = if g % 2 == 0 { 10 } else { 1 };
            let memory = if pod == 0 && k < PODS_PER_GPU {
                9000
            } else {
                700
            };
            sim.set_process(&gpu, pid, memory, sm).unwrap();
        }
        gpus.push(gpu);
    }
    let signals = Arc::new(RecordedSignals::default());
    let mut watchdog = Watchdog::new(
        WatchdogConfig::default(),
        sim.clone(),
        gpus,
        proc_root.path(),
        signals.clone(),
        Arc::new(RecordedEvents::default()),
        EnforcementBoard::default(),
    );
    c.bench_function("watchdog_tick_8gpu_x_50proc", |b| {
        b.iter(|| {
            watchdog.tick(Instant::now(), &limits);
            signals.clear();
        })
    });
}

criterion_group!(benches, tick);
criterion_main!(benches);
