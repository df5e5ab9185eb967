//! The agent as the kubelet sees it: registration, slots, preferred allocation,
//! Allocate with exact assignments, and XID faults.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{Harness, WAIT, gpu_of, refs, share};
use tessera_agent::assignments::NoAssignments;
use tessera_agent::ledger::PodRef;
use tessera_agent::testing::StaticAssignments;
use tonic::Code;

#[tokio::test]
async fn registers_gpu_slots_and_mig_resources() {
    let h = Harness::start("a100-8x-mig.yaml", Arc::new(NoAssignments)).await;
    let plugin = h.gpu_plugin().await;
    let options = plugin.options().await.unwrap();
    assert!(options.get_preferred_allocation_available);
    let devices = plugin.devices().latest().unwrap();
    // GPU 7 is in MIG mode: 7 shared GPUs x 10 slots.
    assert_eq!(devices.len(), 70);
    let first = h.uuid(0);
    let ids: BTreeSet<String> = devices.iter().map(|d| d.id.clone()).collect();
    for k in 0..10 {
        assert!(ids.contains(&format!("{first}-{k}")));
    }
    assert!(!ids.iter().any(|id| id.starts_with(&h.uuid(7))));
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    // Slots carry no NUMA hint (the coordinator picked the GPU; see kubelet_lite.rs).
    assert!(devices.iter().all(|d| d.topology.is_none()));

    let mut resources: Vec<String> = h
        .kubelet
        .wait_for_registrations(4, WAIT)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.resource_name)
        .collect();
    resources.sort();
    assert_eq!(
        resources,
        [
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.5gb",
            "nvidia.com/mig-2g.10gb",
            "nvidia.com/mig-3g.20gb"
        ]
    );
    let mig = h
        .kubelet
        .wait_for_plugin("nvidia.com/mig-1g.5gb", WAIT)
        .await
        .unwrap();
    let migs = mig
        .devices()
        .wait_until(|d| d.len() == 2, WAIT)
        .await
        .unwrap();
    let env = mig.allocate_one(&[&migs[0].id]).await.unwrap().envs;
    assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], migs[0].id);
    assert_eq!(env["TESSERA_GPU_MEMORY_LIMIT_MIB"], "4864");
}

#[tokio::test]
async fn whole_gpu_requests_follow_nvlink_topology() {
    let h = Harness::start("a100-8x-mig.yaml", Arc::new(NoAssignments)).await;
    let plugin = h.gpu_plugin().await;
    let all = h.available(&plugin).await;

    // Two GPUs: an NVLink pair.
    let pair = plugin
        .preferred_allocation(&refs(&all), &[], 2)
        .await
        .unwrap();
    let gpus: Vec<u32> = pair
        .iter()
        .map(|s| h.sim.devices_index(gpu_of(s)))
        .collect();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0] / 2, gpus[1] / 2, "{gpus:?} is not an NVLink pair");
    let env = plugin
        .allocate(tessera_device_plugin::api::AllocateRequest {
            container_requests: vec![tessera_device_plugin::api::ContainerAllocateRequest {
                devices_ids: pair.clone(),
            }],
        })
        .await
        .unwrap()
        .container_responses
        .remove(0)
        .envs;
    assert_eq!(
        env["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", gpu_of(&pair[0]), gpu_of(&pair[1]))
    );
    assert_eq!(env["TESSERA_GPU_MEMORY_LIMIT_MIB"], "40960,40960");
    assert_eq!(env["TESSERA_GPU_COMPUTE_PERCENT"], "100,100");

    // Singles: first GPU 6 (its partner 7 is MIG), then both halves of one pair,
    // never one GPU out of two different pairs.
    let mut singles = Vec::new();
    for _ in 0..3 {
        let one = plugin
            .preferred_allocation(&refs(&all), &[], 1)
            .await
            .unwrap();
        assert_eq!(one.len(), 1);
        plugin.allocate_one(&[&one[0]]).await.unwrap();
        singles.push(h.sim.devices_index(gpu_of(&one[0])));
    }
    assert_eq!(singles[0], 6);
    assert_eq!(
        singles[1] / 2,
        singles[2] / 2,
        "singles {singles:?} split two pairs"
    );
    assert!(!gpus.contains(&singles[1]));

    // Whole GPUs are not shared: a slot on a held GPU is refused.
    let held = format!("{}-9", gpu_of(&pair[0]));
    let err = plugin.allocate_one(&[&held]).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("whole free GPUs only"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn two_pending_pods_with_different_fractions_get_exactly_their_assignment() {
    let source = Arc::new(StaticAssignments::new());
    let h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let plugin = h.gpu_plugin().await;
    let (g0, g1, g2) = (h.uuid(0), h.uuid(1), h.uuid(2));
    let a = PodRef::new("ml", "a");
    let b = PodRef::new("ml", "b");
    // Both on GPU 0, different fractions, pending at the same time.
    source.bind(a.clone(), 1, &[("main", 1)], Some(share(&g0, 20480, 500)));
    source.bind(b.clone(), 2, &[("main", 1)], Some(share(&g0, 10240, 250)));
    let all = h.available(&plugin).await;

    // The kubelet admits the older pod first: preferred, then Allocate.
    let slot_a = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap();
    assert_eq!(gpu_of(&slot_a[0]), g0);
    let env_a = plugin.allocate_one(&refs(&slot_a)).await.unwrap().envs;
    assert_eq!(env_a["NVIDIA_VISIBLE_DEVICES"], g0);
    assert_eq!(env_a["TESSERA_GPU_MEMORY_LIMIT_MIB"], "20480");
    assert_eq!(env_a["TESSERA_GPU_COMPUTE_PERCENT"], "50");

    let free: Vec<String> = all.iter().filter(|s| **s != slot_a[0]).cloned().collect();
    let slot_b = plugin
        .preferred_allocation(&refs(&free), &[], 1)
        .await
        .unwrap();
    assert_eq!(gpu_of(&slot_b[0]), g0);
    assert_ne!(slot_a, slot_b);
    let env_b = plugin.allocate_one(&refs(&slot_b)).await.unwrap().envs;
    assert_eq!(env_b["TESSERA_GPU_MEMORY_LIMIT_MIB"], "10240");
    assert_eq!(env_b["TESSERA_GPU_COMPUTE_PERCENT"], "25");
    {
        let ledger = h.agent().node().ledger.lock();
        let (a, b) = (source.uid(&a).unwrap(), source.uid(&b).unwrap());
        assert!(ledger.has_container(&a, "main") && ledger.has_container(&b, "main"));
    }

    // Two more pending on different GPUs; the kubelet allocates the younger one's GPU
    // without asking for a preference: it is matched by GPU, not by age.
    let c = PodRef::new("ml", "c");
    let d = PodRef::new("ml", "d");
    source.bind(c.clone(), 3, &[("main", 1)], Some(share(&g1, 8000, 300)));
    source.bind(d.clone(), 4, &[("main", 1)], Some(share(&g2, 4000, 100)));
    let env_d = plugin
        .allocate_one(&[&format!("{g2}-0")])
        .await
        .unwrap()
        .envs;
    assert_eq!(env_d["NVIDIA_VISIBLE_DEVICES"], g2);
    assert_eq!(env_d["TESSERA_GPU_MEMORY_LIMIT_MIB"], "4000");
    // A slot on a GPU nobody pending was assigned is refused, naming what is pending.
    let err = plugin
        .allocate_one(&[&format!("{}-0", h.uuid(5))])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("ml/c/main"), "{}", err.message());
    let env_c = plugin
        .allocate_one(&[&format!("{g1}-3")])
        .await
        .unwrap()
        .envs;
    assert_eq!(env_c["TESSERA_GPU_COMPUTE_PERCENT"], "30");

    let ledger = h.agent().node().ledger.lock();
    let usage = ledger.usage(&g0);
    assert_eq!(
        (usage.memory_mib, usage.compute_milli, usage.holders),
        (30720, 750, 2)
    );
}

#[tokio::test]
async fn multi_gpu_assignment_is_steered_to_the_assigned_gpus() {
    let source = Arc::new(StaticAssignments::new());
    let h = Harness::start("h100-8x-nvswitch.yaml", source.clone()).await;
    let plugin = h.gpu_plugin().await;
    let (g3, g6) = (h.uuid(3), h.uuid(6));
    let mut assignment = share(&g3, 40000, 500);
    assignment.containers[0]
        .gpus
        .extend(share(&g6, 30000, 400).containers[0].gpus.clone());
    source.bind(
        PodRef::new("ml", "train"),
        1,
        &[("main", 2)],
        Some(assignment),
    );
    let all = h.available(&plugin).await;
    let slots = plugin
        .preferred_allocation(&refs(&all), &[], 2)
        .await
        .unwrap();
    let gpus: BTreeSet<&str> = slots.iter().map(|s| gpu_of(s)).collect();
    assert_eq!(gpus, BTreeSet::from([g3.as_str(), g6.as_str()]));
    let env = plugin.allocate_one(&refs(&slots)).await.unwrap().envs;
    let visible: Vec<&str> = env["NVIDIA_VISIBLE_DEVICES"].split(',').collect();
    let memory: Vec<&str> = env["TESSERA_GPU_MEMORY_LIMIT_MIB"].split(',').collect();
    for (uuid, mem) in visible.iter().zip(&memory) {
        let expected = if *uuid == g3 { "40000" } else { "30000" };
        assert_eq!(*mem, expected);
    }
}

#[tokio::test]
async fn fatal_xid_turns_a_gpus_slots_unhealthy_at_once() {
    let h = Harness::start("h100-8x-nvswitch.yaml", Arc::new(NoAssignments)).await;
    let plugin = h.gpu_plugin().await;
    let bad = h.uuid(3);
    // An application XID leaves the GPU alone.
    h.sim.inject_xid(&bad, 13).unwrap();
    h.sim.inject_xid(&bad, 79).unwrap();
    let devices = plugin
        .devices()
        .wait_until(|d| d.iter().any(|x| x.health == "Unhealthy"), WAIT)
        .await
        .unwrap();
    let unhealthy: Vec<&str> = devices
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(unhealthy.len(), 10);
    assert!(unhealthy.iter().all(|id| gpu_of(id) == bad));
    let err = plugin
        .allocate_one(&[&format!("{bad}-0")])
        .await
        .unwrap_err();
    assert!(
        err.message().contains("unhealthy (XID 79)"),
        "{}",
        err.message()
    );
    // Preferred allocation no longer offers it.
    let all: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let eight = plugin
        .preferred_allocation(&refs(&all), &[], 7)
        .await
        .unwrap();
    assert!(eight.iter().all(|s| gpu_of(s) != bad));
}

#[tokio::test]
async fn metrics_expose_gpus_shares_and_allocate_latency() {
    let h = Harness::start("l40s-4x-pcie.yaml", Arc::new(NoAssignments)).await;
    let plugin = h.gpu_plugin().await;
    h.sim.set_process(&h.uuid(0), 4242, 1234, 40).unwrap();
    plugin
        .allocate_one(&[&format!("{}-0", h.uuid(0))])
        .await
        .unwrap();
    let node = Arc::clone(h.agent().node());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tessera_agent::metrics::serve(listener, node));
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    assert!(get("/healthz").await.ends_with("\r\n\r\nok\n"));
    let text = get("/metrics").await;
    let g0 = h.uuid(0);
    for line in [
        format!("tessera_agent_gpu_memory_used_mib{{gpu=\"0\",uuid=\"{g0}\",model=\"L40S\"}} 1234"),
        format!(
            "tessera_agent_gpu_utilization_percent{{gpu=\"0\",uuid=\"{g0}\",model=\"L40S\"}} 40"
        ),
        format!("tessera_agent_gpu_shares_allocated{{gpu=\"0\",uuid=\"{g0}\",model=\"L40S\"}} 10"),
        format!(
            "tessera_agent_pod_gpu_memory_limit_mib{{pod=\"-\",container=\"\",uuid=\"{g0}\"}} 46068"
        ),
        "tessera_agent_allocate_seconds_count 1".to_owned(),
    ] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
}
