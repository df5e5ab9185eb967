//! Prometheus metrics (`/metrics`, text format) and `/healthz` on the metrics port
//! (9090 by convention).
//!
//! GPU and share gauges are read from the node at scrape time, so there is no sampling
//! loop to keep in step; only the Allocate latency histogram is recorded as calls happen.
//! The HTTP side is an axum router with two GET paths.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::node::Node;

type Labels = Vec<(String, String)>;

/// Metrics recorded as events happen.
#[derive(Debug, Clone)]
pub struct Metrics {
    allocate_seconds: Histogram,
    pod_wait_seconds: Histogram,
    /// What enforcement decided per pod, and its action counts (written by the
    /// watchdog, read here, by `status` and by the occupancy report).
    pub enforcement: crate::enforce::state::EnforcementBoard,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            // 10 µs .. ~80 ms.
            allocate_seconds: Histogram::new(exponential_buckets(0.000_01, 2.0, 14)),
            // 100 µs .. ~6.6 s: the wait is bounded at 5 s.
            pod_wait_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 17)),
            enforcement: Default::default(),
        }
    }
}

impl Metrics {
    /// Records one Allocate call.
    pub fn observe_allocate(&self, took: Duration) {
        self.allocate_seconds.observe(took.as_secs_f64());
    }

    /// Records how long one GetPreferredAllocation or Allocate waited for its pod to be
    /// known to the agent (the kubelet admits pods one at a time, so this wait holds up
    /// every pod behind it).
    pub fn observe_pod_wait(&self, took: Duration) {
        self.pod_wait_seconds.observe(took.as_secs_f64());
    }

    /// The Prometheus text exposition for `node` right now.
    pub fn render(&self, node: &Node) -> String {
        let mut registry = Registry::with_prefix("tessera_agent");
        let memory_used = Family::<Labels, Gauge>::default();
        let memory_total = Family::<Labels, Gauge>::default();
        let utilization = Family::<Labels, Gauge>::default();
        let healthy = Family::<Labels, Gauge>::default();
        let shares = Family::<Labels, Gauge>::default();
        let pod_limit = Family::<Labels, Gauge>::default();
        let ledger = node.ledger.lock();
        for d in node.devices() {
            let labels: Labels = vec![
                ("gpu".into(), d.index.to_string()),
                ("uuid".into(), d.uuid.clone()),
                ("model".into(), d.model.clone()),
            ];
            let sample = node.backend().sample(&d.uuid).unwrap_or_default();
            // An unknown reading is left out rather than exported as 0.
            if let Some(used) = sample.memory_used_mib {
                memory_used.get_or_create(&labels).set(used as i64);
            }
            memory_total
                .get_or_create(&labels)
                .set(d.memory_total_mib as i64);
            if let Some(percent) = sample.utilization_percent {
                utilization.get_or_create(&labels).set(i64::from(percent));
            }
            healthy
                .get_or_create(&labels)
                .set(i64::from(node.health(&d.uuid).healthy));
            if d.mig.is_none() {
                let held = ledger
                    .allocations()
                    .iter()
                    .filter(|a| a.grants.iter().any(|g| g.uuid == d.uuid))
                    .map(|a| {
                        if a.is_whole() {
                            node.options().shares_per_gpu
                        } else {
                            1
                        }
                    })
                    .sum::<u32>()
                    .min(node.options().shares_per_gpu);
                shares.get_or_create(&labels).set(i64::from(held));
            }
        }
        for a in ledger.allocations() {
            let pod = a
                .pod
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string);
            for g in &a.grants {
                let labels: Labels = vec![
                    ("pod".into(), pod.clone()),
                    ("container".into(), a.container.clone().unwrap_or_default()),
                    ("uuid".into(), g.uuid.clone()),
                ];
                pod_limit.get_or_create(&labels).set(g.memory_mib as i64);
            }
        }
        drop(ledger);
        registry.register("gpu_memory_used_mib", "GPU memory in use", memory_used);
        registry.register("gpu_memory_total_mib", "GPU memory size", memory_total);
        registry.register("gpu_utilization_percent", "GPU utilisation", utilization);
        registry.register("gpu_healthy", "1 while the GPU is handed out", healthy);
        registry.register("gpu_shares_allocated", "nvidia.com/gpu slots held", shares);
        registry.register(
            "pod_gpu_memory_limit_mib",
            "memory limit of a container on a GPU",
            pod_limit,
        );
        registry.register(
            "allocate_seconds",
            "Allocate call latency",
            self.allocate_seconds.clone(),
        );
        registry.register(
            "pod_wait_seconds",
            "Time GetPreferredAllocation and Allocate waited for their pod to be known (at most 5 s)",
            self.pod_wait_seconds.clone(),
        );
        self.register_enforcement(&mut registry);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

impl Metrics {
    /// Enforcement: action counts and, per pod and GPU the watchdog enforces, the
    /// measured memory and utilisation, the compute share and the throttle duty.
    fn register_enforcement(&self, registry: &mut Registry) {
        let actions = Family::<Labels, Counter>::default();
        for (action, n) in self.enforcement.actions() {
            actions
                .get_or_create(&vec![("action".into(), action.label().into())])
                .inc_by(n);
        }
        let used = Family::<Labels, Gauge>::default();
        let share = Family::<Labels, Gauge>::default();
        let utilization = Family::<Labels, Gauge>::default();
        let run = Family::<Labels, Gauge>::default();
        let state = Family::<Labels, Gauge>::default();
        for p in self.enforcement.pods() {
            let labels: Labels = vec![
                ("pod".into(), p.pod.to_string()),
                ("uuid".into(), p.gpu_uuid.clone()),
            ];
            used.get_or_create(&labels).set(p.memory_used_mib as i64);
            share.get_or_create(&labels).set(i64::from(p.share_percent));
            utilization
                .get_or_create(&labels)
                .set(i64::from(p.used_percent));
            let run_percent = match p.state {
                crate::enforce::state::EnforcementState::Throttled { run_percent } => run_percent,
                _ => 100,
            };
            run.get_or_create(&labels).set(i64::from(run_percent));
            let mut with_state = labels;
            with_state.push(("state".into(), state_name(p.state).into()));
            state.get_or_create(&with_state).set(1);
        }
        registry.register(
            "enforcement_actions",
            "enforcement actions taken (memory_warn, memory_kill, throttle)",
            actions,
        );
        registry.register(
            "pod_gpu_memory_used_mib",
            "measured GPU memory of a pod's processes",
            used,
        );
        registry.register(
            "pod_gpu_compute_share_percent",
            "compute share of a pod on a GPU",
            share,
        );
        registry.register(
            "pod_gpu_utilization_percent",
            "measured SM utilisation of a pod's processes",
            utilization,
        );
        registry.register(
            "pod_gpu_throttle_run_percent",
            "percent of each throttle period a pod's processes run (100: not throttled)",
            run,
        );
        registry.register(
            "pod_gpu_enforcement_state",
            "1 for the pod's current enforcement state",
            state,
        );
    }
}

fn state_name(state: crate::enforce::state::EnforcementState) -> &'static str {
    use crate::enforce::state::EnforcementState as S;
    match state {
        S::Ok => "ok",
        S::Warned => "warned",
        S::Throttled { .. } => "throttled",
        S::Killed => "killed",
        S::NotEnforced => "not_enforced",
    }
}

/// Serves `/metrics` and `/healthz` until the task is dropped (axum: full HTTP/1.1 parsing,
/// keep-alive, and unknown paths answered 404).
pub async fn serve(listener: TcpListener, node: Arc<Node>) {
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|State(node): State<Arc<Node>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    node.metrics.render(&node),
                )
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .with_state(node);
    if let Err(error) = axum::serve(listener, app).await {
        tracing::warn!(%error, "the metrics server stopped");
    }
}
