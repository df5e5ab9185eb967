//! Measured usage per pod: simulated GPU processes whose PIDs have cgroup files in a
//! fake proc tree are attributed to the pods holding the GPU, in `status` (admin
//! socket and CLI) and in the occupancy report; others are counted as unknown.

use crate::common;

use std::sync::Arc;

use common::{Harness, refs, share};
use tessera_agent::admin::{self, Response};
use tessera_agent::enforce::usage::{PodMeter, ProcessAttribution};
use tessera_agent::ledger::{Allocation, Grant, Origin, PodRef};
use tessera_agent::testing::StaticAssignments;
use tessera_contract::Isolation;

const UID_A: &str = "6a1f0c2e-8b3d-4c5e-9f70-1a2b3c4d5e6f";
const UID_STRANGER: &str = "11111111-2222-4333-8444-555555555555";

#[tokio::test]
async fn status_and_report_show_measured_memory_per_pod() {
    let source = Arc::new(StaticAssignments::new());
    let h = Harness::start("a100-8x-mig.yaml", source.clone()).await;
    let plugin = h.gpu_plugin().await;
    let g0 = h.uuid(0);
    let a = PodRef::new("ml", "a");
    let b = PodRef::new("ml", "b");
    source.bind(a.clone(), 1, &[("main", 1)], Some(share(&g0, 20480, 500)));
    source.bind(b.clone(), 2, &[("main", 1)], Some(share(&g0, 10240, 250)));
    source.set_uid(a.clone(), UID_A);
    let all = h.available(&plugin).await;
    let slot_a = plugin
        .preferred_allocation(&refs(&all), &[], 1)
        .await
        .unwrap();
    plugin.allocate_one(&refs(&slot_a)).await.unwrap();
    let free: Vec<String> = all.iter().filter(|s| **s != slot_a[0]).cloned().collect();
    let slot_b = plugin
        .preferred_allocation(&refs(&free), &[], 1)
        .await
        .unwrap();
    plugin.allocate_one(&refs(&slot_b)).await.unwrap();
    // An allocation from a checkpoint written before UIDs were recorded, its pod not yet
    // seen holding it: its row must say its usage is unknown, not zero.
    h.agent()
        .node()
        .ledger
        .lock()
        .insert(Allocation {
            id: 0,
            resource: "nvidia.com/gpu".into(),
            slots: vec![format!("{g0}-9")],
            grants: vec![Grant {
                uuid: g0.clone(),
                memory_mib: 1024,
                compute_milli: 100,
            }],
            pod: Some(PodRef::new("ml", "old")),
            pod_uid: None,
            container: Some("main".into()),
            isolation: Isolation::Watchdog,
            origin: Origin::Assigned,
            at_unix_ms: 0,
        })
        .unwrap();

    // Two processes of pod a, one of a pod holding no share, one host process.
    let container = "c".repeat(64);
    h.fake_pod_process(5001, UID_A, &container);
    h.fake_pod_process(5002, UID_A, &container);
    h.fake_pod_process(6001, UID_STRANGER, &container);
    h.sim.set_process(&g0, 5001, 3000, 20).unwrap();
    h.sim.set_process(&g0, 5002, 1000, 15).unwrap();
    h.sim.set_process(&g0, 6001, 700, 5).unwrap();
    h.sim.set_process(&g0, 7001, 300, 1).unwrap();

    let Response::Status(report) = admin::request(&h.admin_socket(), "status").await.unwrap()
    else {
        panic!("not a status report");
    };
    let gpu = report.gpus.iter().find(|g| g.uuid == g0).unwrap();
    let row = |name: &str| {
        gpu.pods
            .iter()
            .find(|p| p.pod == format!("ml/{name}"))
            .unwrap()
    };
    assert_eq!(row("a").pod_uid.as_deref(), Some(UID_A));
    assert_eq!(row("a").memory_used_mib, Some(4000));
    assert_eq!(row("a").utilization_percent, Some(35));
    assert_eq!(row("a").enforcement, "none");
    assert_eq!(row("b").pod_uid.as_deref(), Some("uid-ml-b"));
    assert_eq!(row("b").memory_used_mib, Some(0));
    assert_eq!(row("old").pod_uid, None);
    assert_eq!(row("old").memory_used_mib, None);
    assert_eq!(row("old").utilization_percent, None);
    assert_eq!((gpu.unknown_processes, gpu.unknown_memory_mib), (2, 1000));

    let text = admin::render_status(&report);
    assert!(text.contains("used   4000 MiB  util  35%"), "{text}");
    assert!(
        text.contains("unknown processes: 2 using 1000 MiB"),
        "{text}"
    );

    // The CLI prints the same over the admin socket.
    // On a blocking thread: this test's runtime also serves the admin socket.
    let socket = h.admin_socket();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tessera-agent"))
            .args(["status", "--json", "--admin-socket"])
            .arg(socket)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli_gpu = json["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["uuid"] == g0.as_str())
        .unwrap();
    let cli_a = cli_gpu["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pod"] == "ml/a")
        .unwrap();
    assert_eq!(cli_a["memory_used_mib"], 4000);

    // The occupancy report carries the same figures and the UID.
    let meter = PodMeter::new(ProcessAttribution::new(h.proc_root()), source.clone());
    let occupancy = tessera_agent::report::occupancy(h.agent().node(), &meter);
    let shares = &occupancy
        .gpus
        .iter()
        .find(|g| g.gpu_uuid == g0)
        .unwrap()
        .shares;
    let share_a = shares.iter().find(|s| s.pod_name == "a").unwrap();
    assert_eq!(share_a.pod_uid, UID_A);
    assert_eq!(
        (
            share_a.measured_memory_mib,
            share_a.measured_utilization_percent
        ),
        (4000, 35)
    );
    let share_old = shares.iter().find(|s| s.pod_name == "old").unwrap();
    assert_eq!(
        (share_old.pod_uid.as_str(), share_old.measured_memory_mib),
        ("", 0)
    );
}
