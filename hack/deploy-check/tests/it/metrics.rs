//! `/metrics` of the running coordinator and of a running agent process pass the Prometheus
//! exposition parser and linter (`promtool check metrics`, via `kube-peer promlint`), after
//! real work so the per-queue, per-pod and per-GPU families have samples.

use crate::common;

use common::{Harness, NodeSpec, Options, gpu_pod, is_running};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_and_agent_metrics_pass_promlint() {
    let h = Harness::start(Options::new(vec![NodeSpec::new("gpu-0", 2)])).await;
    let pods: Api<Pod> = Api::namespaced(h.admin.clone(), "default");
    for (name, fraction) in [("half", "0.5"), ("whole", "1")] {
        pods.create(
            &PostParams::default(),
            &gpu_pod(
                name,
                "default",
                1,
                "tessera-notebook",
                json!({"tessera.dev/gpu-fraction": fraction}),
            ),
        )
        .await
        .expect("pod created");
    }
    h.wait_until("both pods to be allocated", || async {
        let a = h.pod("half").await?;
        let b = h.pod("whole").await?;
        (is_running(&a) && is_running(&b)).then_some(())
    })
    .await;

    let coordinator = h
        .coordinator()
        .metrics_addr()
        .expect("the coordinator serves /metrics");
    let text = h
        .wait_until("a coordinator exposition with a placed pod", || async {
            let text = common::scrape(coordinator).await;
            text.lines()
                .any(|l| l.starts_with("tessera_pods_placed_total ") && !l.ends_with(" 0"))
                .then_some(text)
        })
        .await;
    for family in [
        "tessera_cycle_duration_seconds",
        "tessera_queue_fair_share",
        "tessera_is_leader",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    if let Err(problems) = tessera_testcluster::promlint(&text) {
        panic!(
            "the coordinator's /metrics fails promlint:\n{}\n---\n{text}",
            problems.join("\n")
        );
    }

    let agent = h.node("gpu-0").metrics;
    let text = h
        .wait_until("an agent exposition with its GPUs", || async {
            let text = common::scrape(agent).await;
            text.contains("tessera_agent_gpu_shares_allocated")
                .then_some(text)
        })
        .await;
    if let Err(problems) = tessera_testcluster::promlint(&text) {
        panic!(
            "the agent's /metrics fails promlint:\n{}\n---\n{text}",
            problems.join("\n")
        );
    }
    h.shutdown().await;
}
