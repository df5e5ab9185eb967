//! MIG isolation end to end on the simulated backend: with `--mig-create`, a pod
//! assigned a share of a GPU in MIG mode is allocated (through the fake kubelet, over
//! the real socket) a MIG instance created for it, which is destroyed once the pod is
//! gone — but never while processes run in it, and instances the agent did not create
//! are left alone.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Harness, bind_isolated};
use tessera_agent::enforce::mig::MigConfig;
use tessera_agent::gpu::{GpuBackend, MigInstance};
use tessera_agent::ledger::PodRef;
use tessera_agent::testing::StaticAssignments;
use tessera_contract::Isolation;
use tessera_device_plugin::testing::PluginConnection;
use tessera_testcluster::until;
use tonic::Code;

const EVENTUALLY: Duration = Duration::from_secs(20);

/// GPU 0 shared as slots, GPU 1 an A100 in MIG mode without instances, GPU 2 an H100
/// in MIG mode with one instance made by someone else.
const SHAPE: &str = "
name: mig-create
gpus:
  - {model: A100-40GB, memory_mib: 40960, pci_bus_id: '0000:07:00.0'}
  - {model: A100-40GB, memory_mib: 40960, pci_bus_id: '0000:0f:00.0', mig: []}
  - model: H100-80GB
    memory_mib: 81559
    pci_bus_id: '0000:47:00.0'
    mig:
      - {profile: 1g.10gb, memory_mib: 9984}
";

async fn harness(source: Arc<StaticAssignments>) -> (Harness, Arc<PluginConnection>) {
    let shape = tempfile::tempdir().unwrap();
    let file = shape.path().join("mig-create.yaml");
    std::fs::write(&file, SHAPE).unwrap();
    // An absolute path replaces the shapes directory.
    let mut h = Harness::start(file.to_str().unwrap(), source.clone()).await;
    // Without --mig-create the GPUs in MIG mode get no slots.
    let slots = h.gpu_plugin().await.devices().latest().unwrap();
    assert_eq!(slots.len(), 10);
    let plugin = h
        .restart_agent_with(source, |config, _| {
            config.mig = MigConfig {
                create: true,
                sweep_every: Duration::from_millis(50),
            }
        })
        .await;
    plugin
        .devices()
        .wait_until(|d| d.len() == 30, EVENTUALLY)
        .await
        .unwrap();
    (h, plugin)
}

fn mig_pod(source: &StaticAssignments, name: &str, created: u64, gpu: &str, mib: u64, milli: u32) {
    bind_isolated(source, name, created, (gpu, mib, milli), Isolation::Mig);
}

fn instances(h: &Harness, gpu: &str) -> Vec<MigInstance> {
    let mut list = h.sim.mig_instances(gpu).unwrap();
    list.sort_by_key(|i| i.start);
    list
}

fn layout(h: &Harness, gpu: &str) -> Vec<(String, u32)> {
    instances(h, gpu)
        .into_iter()
        .map(|i| (i.profile, i.start))
        .collect()
}

fn release(h: &Harness, slot: &str) {
    let ledger = &h.agent().node().ledger;
    let gone = ledger.lock().remove_holding(&[slot.to_owned()]).unwrap();
    assert_eq!(gone.len(), 1, "{slot} was not held");
}

fn pair(profile: &str, start: u32) -> (String, u32) {
    (profile.to_owned(), start)
}

#[tokio::test]
async fn mig_pods_get_instances_that_go_with_them() {
    let source = Arc::new(StaticAssignments::new());
    let (h, plugin) = harness(source.clone()).await;
    let (g0, g1, g2) = (h.uuid(0), h.uuid(1), h.uuid(2));

    // A small share becomes a 1g.5gb at the top, keeping the 4g and 3g halves.
    mig_pod(&source, "a", 1, &g1, 4096, 100);
    let a = plugin.allocate_one(&[&format!("{g1}-0")]).await.unwrap();
    assert_eq!(layout(&h, &g1), [pair("1g.5gb", 6)]);
    let a_mig = instances(&h, &g1)[0].uuid.clone();
    assert!(a_mig.starts_with("MIG-"));
    assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], a_mig);
    assert_eq!(a.envs["TESSERA_GPU_MEMORY_LIMIT_MIB"], "4096");

    // Half the memory with 4/7 of compute: a 4g.20gb at slice 0.
    mig_pod(&source, "b", 2, &g1, 20480, 500);
    let b = plugin.allocate_one(&[&format!("{g1}-1")]).await.unwrap();
    assert_eq!(layout(&h, &g1), [pair("4g.20gb", 0), pair("1g.5gb", 6)]);
    assert_eq!(b.envs["NVIDIA_VISIBLE_DEVICES"], instances(&h, &g1)[0].uuid);

    // A pod without an assignment never gets a GPU in MIG mode.
    source.bind(PodRef::new("ml", "other"), 4, &[("main", 1)], None);
    let err = plugin
        .allocate_one(&[&format!("{g1}-5")])
        .await
        .unwrap_err();
    assert!(
        err.message().contains("is in MIG mode"),
        "{}",
        err.message()
    );
    // ... but the regular GPU, whole.
    let whole = plugin.allocate_one(&[&format!("{g0}-0")]).await.unwrap();
    assert_eq!(whole.envs["NVIDIA_VISIBLE_DEVICES"], g0);

    // A 3g no longer fits anywhere: a clear refusal, nothing created or recorded.
    mig_pod(&source, "c", 3, &g1, 16384, 400);
    let err = plugin
        .allocate_one(&[&format!("{g1}-2")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("no free slices for 3g.20gb") && err.message().contains("4g.20gb@0"),
        "{}",
        err.message()
    );
    assert_eq!(instances(&h, &g1).len(), 2);
    assert_eq!(h.agent().node().ledger.lock().allocations().len(), 3);

    // Pod a is gone while a process still runs in its instance: the instance stays.
    h.sim.set_mig_processes(&a_mig, 1);
    source.unbind(&PodRef::new("ml", "a"));
    release(&h, &format!("{g1}-0"));
    let watch_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < watch_until {
        assert_eq!(
            instances(&h, &g1).len(),
            2,
            "an instance in use was destroyed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The process ends: the instance is destroyed, and the 3g fits again.
    h.sim.set_mig_processes(&a_mig, 0);
    until("pod a's instance is destroyed", || {
        instances(&h, &g1).len() == 1
    })
    .await;
    let c = plugin.allocate_one(&[&format!("{g1}-2")]).await.unwrap();
    assert_eq!(layout(&h, &g1), [pair("4g.20gb", 0), pair("3g.20gb", 4)]);
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], instances(&h, &g1)[1].uuid);

    // The H100 already holds someone else's 1g.10gb (at the top); a 2g goes beside it.
    let foreign = instances(&h, &g2);
    assert_eq!(layout(&h, &g2), [pair("1g.10gb", 6)]);
    mig_pod(&source, "d", 5, &g2, 10240, 200);
    plugin.allocate_one(&[&format!("{g2}-0")]).await.unwrap();
    assert_eq!(layout(&h, &g2), [pair("2g.20gb", 4), pair("1g.10gb", 6)]);
    // When pod d goes, only its own instance goes.
    source.unbind(&PodRef::new("ml", "d"));
    release(&h, &format!("{g2}-0"));
    until("pod d's instance is destroyed", || {
        instances(&h, &g2).len() == 1
    })
    .await;
    assert_eq!(instances(&h, &g2), foreign);

    // What the agent created is remembered in the state directory.
    let state = std::fs::read_to_string(h.dir.path().join("state/mig-instances.json")).unwrap();
    assert!(state.contains(&instances(&h, &g1)[1].uuid), "{state}");
    assert!(!state.contains(&a_mig), "{state}");
}
