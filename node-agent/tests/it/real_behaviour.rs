//! Issue #16: the agent against the simulated backend behaving as NVML really does —
//! untyped NVLink ends, MIG parents without monitoring privilege, NOT_SUPPORTED
//! readings, samples only for busy processes, per-device event support, lost GPUs,
//! NVSwitch fabric state, reserved memory — and machines with GPUs of their own.
//! Each test fails against the agent as it was before the fix it covers.

use std::sync::Arc;
use std::time::Duration;

use tessera_agent::gpu::sim::{SimBackend, SimFabric};
use tessera_agent::gpu::{GpuBackend, LinkPeer, XidEvent, canonical_bus_id, sysfs_numa_node};
use tessera_agent::ledger::Ledger;
use tessera_agent::node::{Node, NodeOptions, mig_resource};
use tessera_agent::topology::Topology;

fn shape_text(file: &str) -> String {
    let path = format!("{}/../hack/gpus/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

fn node(sim: Arc<SimBackend>) -> Node {
    Node::new(sim, Ledger::in_memory(), NodeOptions::default()).unwrap()
}

/// Item 1: nvml-wrapper's remote type is always `Unknown`; the agent decides from the
/// remote bus id, so NVSwitch boxes are all-to-all and bridged pairs stay pairs.
#[test]
fn untyped_nvlink_ends_are_decided_by_remote_bus_id() {
    let h100 = format!(
        "{}\nnvlink_remote_type: unknown\n",
        shape_text("h100-8x-nvswitch.yaml")
    );
    let sim = SimBackend::from_yaml(&h100, "node-a").unwrap();
    let devices = sim.devices().unwrap();
    assert!(
        devices
            .iter()
            .all(|d| d.nvlinks.iter().all(|l| l.remote == LinkPeer::Switch))
    );
    let t = Topology::discover(&sim, &devices).unwrap();
    for i in 0..8 {
        for j in (0..8).filter(|&j| j != i) {
            assert_eq!(t.pair(i, j).label(), "NVS18", "pair {i},{j}");
        }
    }

    let a100 = format!(
        "{}\nnvlink_remote_type: unknown\n",
        shape_text("a100-8x-mig.yaml")
    );
    let sim = SimBackend::from_yaml(&a100, "node-a").unwrap();
    let devices = sim.devices().unwrap();
    let t = Topology::discover(&sim, &devices).unwrap();
    assert_eq!(t.pair(0, 1).label(), "NV12");
    assert_eq!(t.pair(0, 2).label(), "NODE");
    // NVML writes bus ids with an 8-digit domain, sysfs and nvidia-smi with 4.
    assert_eq!(canonical_bus_id("00000000:18:00.0"), "0000:18:00.0");
    assert_eq!(canonical_bus_id("0000:AB:00.0"), "0000:ab:00.0");
}

/// Item 2: a MIG parent without monitoring privilege loses its memory reading only;
/// the node still serves, its utilisation is NOT_SUPPORTED (unknown, not 0), and
/// `+me` profiles are named as NVIDIA's plugin names them.
#[test]
fn mig_parent_without_privilege_degrades_only_that_datum() {
    let text = format!(
        "{}\nmig_monitor: false\n",
        shape_text("a100-8x-mig.yaml").replace(
            "{profile: 1g.5gb, memory_mib: 4864, compute_milli: 142}\n      - {profile: 1g.5gb",
            "{profile: 1g.10gb+me, memory_mib: 9856, compute_milli: 142}\n      - {profile: 1g.5gb"
        )
    );
    let sim = Arc::new(SimBackend::from_yaml(&text, "node-a").unwrap());
    let node = node(sim.clone());
    let parent = &node.devices()[7];
    assert!(parent.mig.is_some());
    assert!(
        parent.unknown.iter().any(|u| u.contains("no permission")),
        "{:?}",
        parent.unknown
    );
    // The full-GPU instance's memory stands in for the parent's.
    assert_eq!(parent.memory_total_mib, 40192);
    assert!(node.health(&parent.uuid).healthy);
    assert_eq!(node.shareable().count(), 7);
    let sample = sim.sample(&parent.uuid).unwrap();
    assert_eq!(sample.utilization_percent, None);
    assert_eq!(
        sim.sample(&node.devices()[0].uuid)
            .unwrap()
            .utilization_percent,
        Some(0)
    );
    assert!(node.mig_lists().contains_key("1g.10gb.me"));
    assert_eq!(mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
    tessera_device_plugin::PluginConfig::new(mig_resource("1g.10gb+me")).unwrap();
}

/// Item 4: CDI names for instances created during Allocate would exist in no spec.
#[test]
fn cdi_with_created_mig_instances_is_refused_clearly() {
    let sim = Arc::new(SimBackend::from_yaml(&shape_text("a100-8x-mig.yaml"), "n").unwrap());
    let options = NodeOptions {
        cdi: true,
        mig_slots: true,
        ..NodeOptions::default()
    };
    let err = Node::new(sim, Ledger::in_memory(), options)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("--cdi with --mig-create") && err.contains("no CDI spec"),
        "{err}"
    );
}

/// Item 5: NVML logs samples only for processes that ran; asking with `lastSeen = 0`
/// would return a process's old busy sample after it went idle.
#[test]
fn an_idle_process_reads_zero_not_its_last_busy_sample() {
    let sim = SimBackend::from_yaml(&shape_text("l40s-4x-pcie.yaml"), "node-a").unwrap();
    let gpu = sim.uuid_of(0).unwrap().to_owned();
    sim.set_process(&gpu, 4242, 1000, 80).unwrap();
    let busy = sim.sample(&gpu).unwrap();
    assert_eq!(busy.processes[0].sm_percent, 80);
    sim.set_process(&gpu, 4242, 1000, 0).unwrap();
    let idle = sim.sample(&gpu).unwrap();
    assert_eq!(idle.processes[0].sm_percent, 0, "{idle:?}");
    assert_eq!(idle.utilization_percent, Some(0));
}

/// Item 7: capacity leaves out what the driver reserves.
#[test]
fn capacity_leaves_out_reserved_memory() {
    let sim = SimBackend::from_yaml(
        "gpus: [{model: H100-80GB, memory_mib: 81559, reserved_mib: 527}]",
        "node-a",
    )
    .unwrap();
    let d = &sim.devices().unwrap()[0];
    assert_eq!((d.memory_total_mib, d.memory_reserved_mib), (81032, 527));
}

/// Item 8: a GPU without XID support leaves the others watched; a MIG instance's XID
/// marks that instance, not its GPU.
#[test]
fn events_per_device_and_mig_xids_mark_the_instance() {
    let text = shape_text("a100-8x-mig.yaml").replace(
        "{model: A100-40GB, memory_mib: 40960, numa: 0, pci_bus_id: \"0000:0f:00.0\"}",
        "{model: A100-40GB, memory_mib: 40960, numa: 0, pci_bus_id: \"0000:0f:00.0\", xid_events: false}",
    );
    let sim = Arc::new(SimBackend::from_yaml(&text, "node-a").unwrap());
    let node = node(sim.clone());
    let gaps = sim.event_gaps();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert!(gaps[0].contains(sim.uuid_of(1).unwrap()));
    let (g0, g1) = (sim.uuid_of(0).unwrap(), sim.uuid_of(1).unwrap());
    sim.inject_xid(g1, 79).unwrap();
    sim.inject_xid(g0, 79).unwrap();
    let first = sim.wait_event(Duration::from_millis(10)).unwrap().unwrap();
    assert_eq!(first.uuid, g0, "GPU 1 cannot deliver events");

    let parent = node.devices()[7].clone();
    let migs = parent.mig.clone().unwrap();
    sim.inject_xid(&migs[0].uuid, 48).unwrap();
    let event = sim.wait_event(Duration::from_millis(10)).unwrap().unwrap();
    assert_eq!(event.uuid, migs[0].uuid);
    assert!(node.on_xid(&event));
    assert!(!node.mig_healthy(&migs[0].uuid));
    assert!(node.mig_healthy(&migs[1].uuid));
    assert!(node.health(&parent.uuid).healthy);
    // A fatal XID on the GPU itself takes every instance down.
    assert!(node.on_xid(&XidEvent {
        uuid: parent.uuid.clone(),
        xid: 79
    }));
    assert!(!node.mig_healthy(&migs[1].uuid));
}

/// Item 9: NUMA from sysfs when NVML has none.
#[test]
fn numa_node_from_sysfs() {
    let root = tempfile::tempdir().unwrap();
    let dev = root.path().join("bus/pci/devices/0000:18:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("numa_node"), "1\n").unwrap();
    assert_eq!(sysfs_numa_node(root.path(), "00000000:18:00.0"), Some(1));
    std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
    assert_eq!(sysfs_numa_node(root.path(), "0000:18:00.0"), None);
    assert_eq!(sysfs_numa_node(root.path(), "0000:99:00.0"), None);
}

/// Item 10: a GPU lost at start (its topology queries fail too) degrades that GPU,
/// never the node; it comes back when it answers again.
#[test]
fn a_lost_gpu_degrades_that_gpu_only() {
    let sim = Arc::new(SimBackend::from_yaml(&shape_text("l40s-4x-pcie.yaml"), "node-a").unwrap());
    let lost = sim.uuid_of(2).unwrap().to_owned();
    sim.set_lost(&lost, true).unwrap();
    let node = node(sim.clone());
    assert_eq!(node.devices().len(), 4);
    let h = node.health(&lost);
    assert!(
        !h.healthy && h.reason.as_deref().is_some_and(|r| r.contains("lost")),
        "{h:?}"
    );
    for i in [0, 1, 3] {
        assert!(node.health(sim.uuid_of(i).unwrap()).healthy);
    }
    assert_eq!(node.topology().pair(2, 3).label(), "SYS");
    assert!(sim.sample(&lost).is_err());
    // Lost while running, then back: only the polled condition moves it.
    let other = sim.uuid_of(0).unwrap().to_owned();
    sim.set_lost(&other, true).unwrap();
    assert!(node.refresh_conditions());
    assert!(!node.health(&other).healthy);
    sim.set_lost(&other, false).unwrap();
    assert!(node.refresh_conditions());
    assert!(node.health(&other).healthy);
}

/// Item 12: GPUs stay unhealthy while the NVSwitch fabric has not registered them.
#[test]
fn gpus_wait_for_the_nvswitch_fabric() {
    let sim = Arc::new(SimBackend::from_yaml(&shape_text("h100-8x-nvswitch.yaml"), "n").unwrap());
    let gpu = sim.uuid_of(3).unwrap().to_owned();
    sim.set_fabric(&gpu, SimFabric::InProgress).unwrap();
    let node = node(sim.clone());
    let h = node.health(&gpu);
    assert!(
        !h.healthy && h.reason.as_deref().is_some_and(|r| r.contains("fabric")),
        "{h:?}"
    );
    assert!(node.health(sim.uuid_of(0).unwrap()).healthy);
    sim.set_fabric(&gpu, SimFabric::Completed).unwrap();
    assert!(node.refresh_conditions());
    assert!(node.health(&gpu).healthy);
    sim.set_fabric(&gpu, SimFabric::Failed).unwrap();
    assert!(node.refresh_conditions());
    assert!(!node.health(&gpu).healthy);
}

/// Show: two machines built from one shape file have GPUs of their own.
#[test]
fn machines_from_one_shape_do_not_share_gpu_uuids() {
    let text = shape_text("h100-8x-nvswitch.yaml");
    let a = SimBackend::from_yaml(&text, "node-a").unwrap();
    let b = SimBackend::from_yaml(&text, "node-b").unwrap();
    let ua: Vec<String> = a.devices().unwrap().into_iter().map(|d| d.uuid).collect();
    let ub: Vec<String> = b.devices().unwrap().into_iter().map(|d| d.uuid).collect();
    assert!(ua.iter().all(|u| !ub.contains(u)), "{ua:?} / {ub:?}");
    // The same machine twice is the same machine.
    let again = SimBackend::from_yaml(&text, "node-a").unwrap();
    assert_eq!(again.uuid_of(0), a.uuid_of(0));
}
