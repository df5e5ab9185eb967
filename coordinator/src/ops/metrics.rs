//! The coordinator's Prometheus metrics. The runtime records into [`Metrics`]; `/metrics`
//! renders it in the Prometheus text format.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
    resource: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// One queue's fair share and allocation of one resource, for
/// [`Metrics::set_queues`].
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSample {
    /// Queue name.
    pub queue: String,
    /// Resource name (`gpu`, `cpu`, `memory`, ...).
    pub resource: String,
    /// The queue's fair share of the resource.
    pub fair_share: f64,
    /// What the queue holds now.
    pub allocated: f64,
}

/// Every metric the coordinator exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    cycle_duration: Histogram,
    pods_placed: Counter,
    pods_pending: Family<ReasonLabels, Gauge>,
    queue_fair_share: Family<QueueLabels, FloatGauge>,
    queue_allocated: Family<QueueLabels, FloatGauge>,
    evictions: Family<ReasonLabels, Counter>,
    bind_errors: Counter,
    agents_connected: Gauge,
    is_leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All metrics at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        // 1 ms .. ~33 s: a cycle over a large cluster can take seconds.
        let cycle_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "tessera_cycle_duration",
            "Wall time of one scheduling cycle",
            Unit::Seconds,
            cycle_duration.clone(),
        );
        let pods_placed = Counter::default();
        registry.register(
            "tessera_pods_placed",
            "Pods bound by the coordinator",
            pods_placed.clone(),
        );
        let pods_pending = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "tessera_pods_pending",
            "Pods left pending after the last cycle, by reason",
            pods_pending.clone(),
        );
        let queue_fair_share = Family::<QueueLabels, FloatGauge>::default();
        registry.register(
            "tessera_queue_fair_share",
            "Fair share of each queue per resource after the last cycle",
            queue_fair_share.clone(),
        );
        let queue_allocated = Family::<QueueLabels, FloatGauge>::default();
        registry.register(
            "tessera_queue_allocated",
            "Resources allocated to each queue after the last cycle",
            queue_allocated.clone(),
        );
        let evictions = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "tessera_evictions",
            "Pods evicted by the coordinator, by reason",
            evictions.clone(),
        );
        let bind_errors = Counter::default();
        registry.register(
            "tessera_bind_errors",
            "Failed bindings (a Binding, which carries the assignment, refused or unanswered)",
            bind_errors.clone(),
        );
        let agents_connected = Gauge::default();
        registry.register(
            "tessera_agents_connected",
            "Node agents with an open stream to this replica",
            agents_connected.clone(),
        );
        let is_leader = Gauge::default();
        registry.register(
            "tessera_is_leader",
            "1 while this replica holds the leader lease",
            is_leader.clone(),
        );
        Self {
            registry,
            cycle_duration,
            pods_placed,
            pods_pending,
            queue_fair_share,
            queue_allocated,
            evictions,
            bind_errors,
            agents_connected,
            is_leader,
        }
    }

    /// Records one scheduling cycle's wall time.
    pub fn observe_cycle(&self, duration: Duration) {
        self.cycle_duration.observe(duration.as_secs_f64());
    }

    /// Counts pods bound.
    pub fn add_pods_placed(&self, n: u64) {
        self.pods_placed.inc_by(n);
    }

    /// Replaces the pending-pod gauges with `counts` (reason -> pods). Reasons should
    /// be short categories (e.g. `insufficient-gpu`, `gang-incomplete`), not free text:
    /// each distinct reason is a time series.
    pub fn set_pending<'a>(&self, counts: impl IntoIterator<Item = (&'a str, u64)>) {
        self.pods_pending.clear();
        for (reason, n) in counts {
            self.pods_pending
                .get_or_create(&ReasonLabels {
                    reason: reason.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Replaces the per-queue fair share and allocation gauges.
    pub fn set_queues(&self, samples: impl IntoIterator<Item = QueueSample>) {
        self.queue_fair_share.clear();
        self.queue_allocated.clear();
        for s in samples {
            let labels = QueueLabels {
                queue: s.queue,
                resource: s.resource,
            };
            self.queue_fair_share
                .get_or_create(&labels)
                .set(s.fair_share);
            self.queue_allocated.get_or_create(&labels).set(s.allocated);
        }
    }

    /// Counts evictions for `reason` (e.g. `reclaim`, `preemption`, `consolidation`,
    /// `gang-broken`).
    pub fn add_evictions(&self, reason: &str, n: u64) {
        self.evictions
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc_by(n);
    }

    /// Counts one failed binding.
    pub fn inc_bind_errors(&self) {
        self.bind_errors.inc();
    }

    /// Sets the number of connected agents.
    pub fn set_agents_connected(&self, n: usize) {
        self.agents_connected
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.is_leader.set(i64::from(leader));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in a metric's
        // encoder, and a partial page is better than none.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(%error, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_name_appears_in_the_text() {
        let m = Metrics::new();
        m.observe_cycle(Duration::from_millis(12));
        m.add_pods_placed(3);
        m.set_pending([("insufficient-gpu", 2), ("gang-incomplete", 4)]);
        m.set_queues([QueueSample {
            queue: "team-a".into(),
            resource: "gpu".into(),
            fair_share: 4.5,
            allocated: 6.0,
        }]);
        m.add_evictions("reclaim", 2);
        m.inc_bind_errors();
        m.set_agents_connected(2);
        m.set_leader(true);
        let text = m.encode();
        for needle in [
            "tessera_cycle_duration_seconds_bucket",
            "tessera_cycle_duration_seconds_count 1",
            "tessera_pods_placed_total 3",
            "tessera_pods_pending{reason=\"insufficient-gpu\"} 2",
            "tessera_pods_pending{reason=\"gang-incomplete\"} 4",
            "tessera_queue_fair_share{queue=\"team-a\",resource=\"gpu\"} 4.5",
            "tessera_queue_allocated{queue=\"team-a\",resource=\"gpu\"} 6.0",
            "tessera_evictions_total{reason=\"reclaim\"} 2",
            "tessera_bind_errors_total 1",
            "tessera_agents_connected 2",
            "tessera_is_leader 1",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn pending_and_queue_gauges_are_replaced_not_accumulated() {
        let m = Metrics::new();
        m.set_pending([("insufficient-gpu", 2)]);
        m.set_pending([("gang-incomplete", 1)]);
        let text = m.encode();
        assert!(!text.contains("insufficient-gpu"), "{text}");
        assert!(text.contains("tessera_pods_pending{reason=\"gang-incomplete\"} 1"));
    }
}
