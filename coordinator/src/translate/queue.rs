//! Queue CRD → the core's queue, in accounting units: GPUs, milli-cores, MiB.

use crate::crd::quantity::{QuantityValue, Round};
use crate::crd::{QuantityQuota, Queue as QueueCrd};
use tessera_core::model::{Queue, QueueResource};

/// Translates a Queue object. Malformed values (negative quota or weight, unreadable
/// quantities) are reported by [`crate::crd::validate::queue`]; here they fall back to the safe
/// reading: negative → 0, unreadable quota → 0, unreadable or negative limit → none.
pub fn translate(q: &QueueCrd) -> Queue {
    let s = &q.spec;
    let gpu = s
        .gpu
        .as_ref()
        .map(|g| QueueResource {
            quota: non_negative(g.quota),
            over_quota_weight: non_negative(g.over_quota_weight),
            limit: if g.limit.is_finite() && g.limit >= 0.0 {
                g.limit
            } else {
                -1.0
            },
        })
        .unwrap_or_default();
    Queue {
        name: q.metadata.name.clone().unwrap_or_default(),
        parent: s.parent.clone().filter(|p| !p.is_empty()),
        priority: s.priority,
        gpu,
        cpu: quantities(s.cpu.as_ref(), |v| v.milli(Round::Down)),
        memory: quantities(s.memory.as_ref(), |v| v.mib(Round::Down)),
    }
}

fn non_negative(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { 0.0 }
}

fn quantities(
    q: Option<&QuantityQuota>,
    unit: impl Fn(&crate::crd::quantity::Parsed) -> Option<i64>,
) -> QueueResource {
    let Some(q) = q else {
        return QueueResource::default();
    };
    let amount = |v: Option<&QuantityValue>| -> Option<i64> { unit(&v?.parse().ok()?) };
    QueueResource {
        quota: amount(q.quota.as_ref()).map_or(0.0, |v| v.max(0) as f64),
        over_quota_weight: non_negative(q.over_quota_weight),
        limit: match amount(q.limit.as_ref()) {
            Some(v) if v >= 0 => v as f64,
            _ => -1.0,
        },
    }
}
