//! Fuzz tests (proptest, a bounded number of cases inside `cargo test`) of everything the
//! coordinator does with an agent's message before and as it applies it: the checks in
//! [`limits`], the inventory's conversion, and the registry's handling of Hello,
//! inventory, occupancy, health changes and heartbeats. Messages are generated around
//! every cap (one under, at, one over) and from raw bytes, and the properties are: nothing
//! panics; a message is accepted exactly when it is within every cap and consistent, and a
//! refusal names a field of the message and the accepted form; the work done is linear in
//! the message (counted in [`Steps`], never timed).

use proptest::prelude::*;
use prost::Message;
use tessera_proto::tessera::v1 as pb;
use tokio::sync::mpsc;

use super::limits::{self, FieldError, Steps};
use super::registry::{self, AgentRegistry, ReportError};

/// Cases per property: enough to reach every cap's edge many times, cheap enough for CI.
const CASES: u32 = 256;

/// Lengths around every string cap, and some ordinary ones.
fn length() -> impl Strategy<Value = usize> + Clone {
    prop_oneof![
        6 => 0usize..16,
        1 => prop::sample::select(vec![
            limits::MAX_ID_LEN - 1,
            limits::MAX_ID_LEN,
            limits::MAX_ID_LEN + 1,
            limits::MAX_NAME_LEN,
            limits::MAX_NAME_LEN + 1,
            limits::MAX_TEXT_LEN,
            limits::MAX_TEXT_LEN + 1,
            limits::MAX_REASON_LEN,
            limits::MAX_REASON_LEN + 1,
        ]),
    ]
}

fn text() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => length().prop_map(|n| "x".repeat(n)),
        2 => "\\PC{0,6}",
        // Multi-byte characters right at a cap: the cap is in bytes.
        1 => prop::sample::select(vec![63usize, 64, 126, 127, 128]).prop_map(|n| "é".repeat(n)),
    ]
}

/// GPU UUIDs from a small pool (so duplicates and links that hit happen), or anything.
fn uuid() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => (0u32..6).prop_map(|i| format!("GPU-{i}")),
        1 => text(),
    ]
}

/// Numbers around a range's edges, or anything.
fn number_u64(max: u64) -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        4 => 0..=max,
        1 => prop::sample::select(vec![0, max, max + 1, u64::MAX]),
        1 => any::<u64>(),
    ]
}

fn number_u32(max: u32) -> impl Strategy<Value = u32> + Clone {
    prop_oneof![
        4 => 0..=max,
        1 => prop::sample::select(vec![0, max, max + 1, u32::MAX]),
        1 => any::<u32>(),
    ]
}

/// A list of `base` elements, sometimes blown up to just around `cap` by repeating them.
fn list<T: Clone + std::fmt::Debug>(
    element: impl Strategy<Value = T> + Clone,
    small: usize,
    cap: usize,
) -> impl Strategy<Value = Vec<T>> + Clone {
    (
        prop::collection::vec(element, 0..=small),
        prop_oneof![6 => Just(None), 1 => (cap - 1..=cap + 1).prop_map(Some)],
    )
        .prop_map(|(mut items, grow)| {
            if let Some(n) = grow
                && !items.is_empty()
            {
                let seed = items.clone();
                items = seed.iter().cycle().take(n).cloned().collect();
            }
            items
        })
}

fn mig() -> impl Strategy<Value = pb::MigInstance> + Clone {
    (
        text(),
        text(),
        number_u64(limits::MAX_MEMORY_MIB),
        number_u32(limits::MAX_COMPUTE_SLICES),
        number_u32(limits::MAX_COMPUTE_SLICES),
    )
        .prop_map(
            |(profile, uuid, memory_mib, compute_slices, gpu_compute_slices)| pb::MigInstance {
                profile,
                uuid,
                placement_start: 0,
                placement_size: 0,
                memory_mib,
                compute_slices,
                gpu_compute_slices,
            },
        )
}

fn gpu() -> impl Strategy<Value = pb::Gpu> + Clone {
    (
        uuid(),
        any::<u32>(),
        text(),
        number_u64(limits::MAX_MEMORY_MIB),
        text(),
        any::<bool>(),
        list(mig(), 3, limits::MAX_MIG_INSTANCES),
    )
        .prop_map(
            |(uuid, index, model, memory_mib, pci_bus_id, mig_enabled, mig_instances)| pb::Gpu {
                uuid,
                index: index % 16,
                model,
                memory_mib,
                numa_node: -1,
                pci_bus_id,
                mig_enabled,
                mig_instances,
            },
        )
}

fn link() -> impl Strategy<Value = pb::GpuLink> + Clone {
    (uuid(), uuid(), any::<u32>(), any::<bool>(), any::<i32>()).prop_map(
        |(gpu_a, gpu_b, nvlink_count, nvswitch, pcie)| pb::GpuLink {
            gpu_a,
            gpu_b,
            nvlink_count: nvlink_count % 20,
            nvswitch,
            pcie,
        },
    )
}

fn inventory() -> impl Strategy<Value = pb::NodeInventory> + Clone {
    (
        prop_oneof![4 => Just("node-a".to_owned()), 1 => text()],
        text(),
        list(gpu(), 6, limits::MAX_GPUS),
        prop::option::of(list(link(), 8, 16)),
        number_u32(limits::MAX_SHARES_SETTING),
    )
        .prop_map(|(node_name, agent_version, gpus, links, shares_per_gpu)| {
            pb::NodeInventory {
                node_name,
                agent_version,
                gpus,
                links: links.map(|links| pb::LinkMatrix { links }),
                shares_per_gpu,
            }
        })
}

fn share() -> impl Strategy<Value = pb::Share> + Clone {
    (
        text(),
        text(),
        text(),
        text(),
        text(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            |(pod_uid, pod_namespace, pod_name, container, mig_instance_uuid, mem, pct)| {
                pb::Share {
                    pod_uid,
                    pod_namespace,
                    pod_name,
                    container,
                    memory_limit_mib: mem,
                    compute_percent: pct,
                    measured_memory_mib: mem,
                    measured_utilization_percent: pct,
                    isolation: pct as i32,
                    enforcement: -(pct as i32),
                    mig_instance_uuid,
                }
            },
        )
}

fn occupancy() -> impl Strategy<Value = pb::Occupancy> + Clone {
    let gpu = (
        uuid(),
        any::<i32>(),
        text(),
        list(share(), 3, limits::MAX_SHARES_PER_GPU),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            |(gpu_uuid, health, health_reason, shares, used, util)| pb::GpuOccupancy {
                gpu_uuid,
                health: health.rem_euclid(4),
                health_reason,
                shares,
                used_memory_mib: used,
                utilization_percent: util,
            },
        );
    (
        list(gpu, 5, limits::MAX_GPUS),
        any::<i64>(),
        list(text(), 4, limits::MAX_ALLOCATED_PODS),
    )
        .prop_map(
            |(gpus, observed_unix_ms, allocated_pod_uids)| pb::Occupancy {
                gpus,
                observed_unix_ms,
                allocated_pod_uids,
            },
        )
}

fn health_change() -> impl Strategy<Value = pb::HealthChange> + Clone {
    (uuid(), any::<i32>(), text(), any::<u32>(), any::<i64>()).prop_map(
        |(gpu_uuid, health, reason, xid, observed_unix_ms)| pb::HealthChange {
            gpu_uuid,
            health: health.rem_euclid(4),
            reason,
            xid,
            observed_unix_ms,
        },
    )
}

fn message() -> impl Strategy<Value = pb::AgentMessage> + Clone {
    use pb::agent_message::Body;
    prop_oneof![
        (any::<u32>(), prop::option::of(inventory())).prop_map(|(protocol_version, inventory)| {
            Body::Hello(pb::Hello {
                protocol_version,
                inventory,
            })
        }),
        inventory().prop_map(Body::Inventory),
        occupancy().prop_map(Body::Occupancy),
        health_change().prop_map(Body::HealthChange),
        (any::<u64>(), any::<i64>()).prop_map(|(sequence, sent_unix_ms)| {
            Body::Heartbeat(pb::Heartbeat {
                sequence,
                sent_unix_ms,
            })
        }),
    ]
    .prop_map(|body| pb::AgentMessage { body: Some(body) })
}

/// Whether every list and string of `m` is within its cap and every number within its
/// range: an independent statement of the caps, against which the checks are compared.
fn within_caps(m: &pb::AgentMessage) -> bool {
    use limits::*;
    use pb::agent_message::Body;
    let ok = |s: &str, max: usize| s.len() <= max;
    let inv_ok = |inv: &pb::NodeInventory| {
        let n = inv.gpus.len();
        let links = inv.links.as_ref().map_or(0, |l| l.links.len());
        ok(&inv.node_name, MAX_NAME_LEN)
            && ok(&inv.agent_version, MAX_TEXT_LEN)
            && inv.shares_per_gpu <= MAX_SHARES_SETTING
            && n <= MAX_GPUS
            && links <= n * n.saturating_sub(1) / 2
            && inv.gpus.iter().all(|g| {
                ok(&g.uuid, MAX_ID_LEN)
                    && ok(&g.model, MAX_TEXT_LEN)
                    && ok(&g.pci_bus_id, MAX_ID_LEN)
                    && g.memory_mib <= MAX_MEMORY_MIB
                    && g.mig_instances.len() <= MAX_MIG_INSTANCES
                    && g.mig_instances.iter().all(|i| {
                        ok(&i.profile, MAX_TEXT_LEN)
                            && ok(&i.uuid, MAX_ID_LEN)
                            && i.memory_mib <= MAX_MEMORY_MIB
                            && i.compute_slices <= MAX_COMPUTE_SLICES
                            && i.gpu_compute_slices <= MAX_COMPUTE_SLICES
                    })
            })
    };
    match &m.body {
        Some(Body::Hello(h)) => h.inventory.as_ref().is_some_and(inv_ok),
        Some(Body::Inventory(inv)) => inv_ok(inv),
        Some(Body::Occupancy(o)) => {
            o.gpus.len() <= MAX_GPUS
                && o.allocated_pod_uids.len() <= MAX_ALLOCATED_PODS
                && o.allocated_pod_uids.iter().all(|u| ok(u, MAX_ID_LEN))
                && o.gpus.iter().all(|g| {
                    ok(&g.gpu_uuid, MAX_ID_LEN)
                        && ok(&g.health_reason, MAX_REASON_LEN)
                        && g.shares.len() <= MAX_SHARES_PER_GPU
                        && g.shares.iter().all(|s| {
                            ok(&s.pod_uid, MAX_ID_LEN)
                                && ok(&s.pod_namespace, MAX_NAME_LEN)
                                && ok(&s.pod_name, MAX_NAME_LEN)
                                && ok(&s.container, MAX_NAME_LEN)
                                && ok(&s.mig_instance_uuid, MAX_ID_LEN)
                        })
                })
        }
        Some(Body::HealthChange(h)) => ok(&h.gpu_uuid, MAX_ID_LEN) && ok(&h.reason, MAX_REASON_LEN),
        Some(Body::Heartbeat(_)) | None => true,
    }
}

/// The elements of `m` (list entries and fields), the measure the checks must be linear in.
fn elements(m: &pb::AgentMessage) -> u64 {
    use pb::agent_message::Body;
    let inv = |inv: &pb::NodeInventory| {
        let gpus: usize = inv.gpus.iter().map(|g| 1 + g.mig_instances.len()).sum();
        3 + gpus + inv.links.as_ref().map_or(0, |l| l.links.len())
    };
    (1 + match &m.body {
        Some(Body::Hello(h)) => h.inventory.as_ref().map_or(0, inv),
        Some(Body::Inventory(i)) => inv(i),
        Some(Body::Occupancy(o)) => {
            o.gpus.iter().map(|g| 1 + g.shares.len()).sum::<usize>() + o.allocated_pod_uids.len()
        }
        Some(Body::HealthChange(_)) | Some(Body::Heartbeat(_)) | None => 1,
    }) as u64
}

/// The field names a refusal may end in (list entries stripped of their `[i]`).
const FIELDS: &[&str] = &[
    "node_name",
    "agent_version",
    "shares_per_gpu",
    "gpus",
    "uuid",
    "model",
    "pci_bus_id",
    "memory_mib",
    "mig_instances",
    "profile",
    "compute_slices",
    "gpu_compute_slices",
    "links",
    "gpu_uuid",
    "health_reason",
    "shares",
    "pod_uid",
    "pod_namespace",
    "pod_name",
    "container",
    "mig_instance_uuid",
    "allocated_pod_uids",
    "reason",
    "inventory",
];

fn assert_names_a_field(error: &FieldError) {
    let roots = ["hello.inventory", "inventory", "occupancy", "health_change"];
    assert!(
        roots.iter().any(|r| error.field.starts_with(r)),
        "{error}: not a field of an agent message"
    );
    let last = error.field.rsplit('.').next().unwrap_or_default();
    let last = last.split('[').next().unwrap_or_default();
    assert!(FIELDS.contains(&last), "{error}: unknown field {last:?}");
    let p = &error.problem;
    assert!(
        p.contains("at most")
            || p.contains("required")
            || p.contains("appears twice")
            || p.contains("must be GPUs listed"),
        "{error}: the accepted form is not said"
    );
}

/// Checks `m` and, for an inventory, converts it, counting the steps of both.
fn check_and_convert(m: &pb::AgentMessage, steps: &mut Steps) -> Result<(), FieldError> {
    use pb::agent_message::Body;
    limits::check_message(m, steps)?;
    match &m.body {
        Some(Body::Hello(pb::Hello {
            inventory: Some(inv),
            ..
        })) => registry::gpus_from_inventory_at("hello.inventory", inv, steps).map(|_| ()),
        Some(Body::Inventory(inv)) => {
            registry::gpus_from_inventory_at("inventory", inv, steps).map(|_| ())
        }
        _ => Ok(()),
    }
}

proptest! {
    // The seeds of failures are printed; nothing is written into the source tree.
    #![proptest_config(ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_agent_message_is_accepted_within_the_caps_or_refused_naming_the_field(m in message()) {
        let mut steps = Steps::default();
        match check_and_convert(&m, &mut steps) {
            Ok(()) => prop_assert!(within_caps(&m), "accepted over a cap: {m:?}"),
            Err(error) => assert_names_a_field(&error),
        }
        if !within_caps(&m) {
            prop_assert!(limits::check_message(&m, &mut Steps::default()).is_err());
        }
        // Linear: a bounded number of steps per element of the message.
        prop_assert!(
            steps.0 <= 12 * elements(&m) + 12,
            "{} steps for {} elements", steps.0, elements(&m)
        );
    }

    #[test]
    fn the_registry_takes_any_stream_of_messages_without_panicking(
        hello in inventory(),
        rest in prop::collection::vec(message(), 0..6),
    ) {
        let registry = AgentRegistry::new();
        let (tx, _rx) = mpsc::channel(8);
        let Ok(session) = registry.connect(&hello, 2, tx) else {
            prop_assert!(registry.get(&hello.node_name).is_none());
            return Ok(());
        };
        for m in &rest {
            use pb::agent_message::Body;
            let outcome: Result<(), ReportError> = match &m.body {
                Some(Body::Occupancy(o)) => registry.set_occupancy(&session, o),
                Some(Body::HealthChange(h)) => registry.set_health(&session, h),
                Some(Body::Inventory(inv)) if inv.node_name == session.node => registry
                    .replace_inventory(&session, inv)
                    .map_err(ReportError::Invalid),
                _ => {
                    registry.touch(&session);
                    Ok(())
                }
            };
            if let Err(ReportError::Invalid(error)) = &outcome {
                assert_names_a_field(error);
            }
            let node = registry.get(&session.node).expect("the node stays registered");
            prop_assert!(node.gpus.len() <= limits::MAX_GPUS);
            prop_assert!(node.occupancy.len() <= node.gpus.len());
            prop_assert!(node.occupancy.values().all(|o| o.shares.len() <= limits::MAX_SHARES_PER_GPU));
            prop_assert!(node.allocated_pods.len() <= limits::MAX_ALLOCATED_PODS);
            prop_assert!(node.gpus.iter().flat_map(|g| g.mig.iter().flatten()).all(|m| m.compute_milli <= 1000));
        }
    }

    #[test]
    fn any_bytes_decode_to_a_message_that_is_checked_without_panicking(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        seed in message(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
    ) {
        // Raw bytes, and a real message's encoding with a few bytes changed.
        let mut mutated = seed.encode_to_vec();
        if !mutated.is_empty() {
            for (at, value) in flips {
                let i = at.index(mutated.len());
                mutated[i] = value;
            }
        }
        for input in [bytes, mutated] {
            if let Ok(m) = pb::AgentMessage::decode(input.as_slice()) {
                let mut steps = Steps::default();
                if let Err(error) = check_and_convert(&m, &mut steps) {
                    assert_names_a_field(&error);
                }
                prop_assert!(steps.0 <= 12 * elements(&m) + 12);
            }
        }
    }
}

/// Doubling a message doubles the checks' steps, no more: compared on a node of 32 GPUs
/// and one of 64 (four times the links) and occupancies of 500 and 1,000 shares.
#[test]
fn checking_cost_grows_with_the_message_not_faster() {
    use super::limits::tests::big_real_node;
    let hello = |gpus| pb::AgentMessage {
        body: Some(pb::agent_message::Body::Inventory(
            big_real_node(gpus, 10).0,
        )),
    };
    let occupancy = |shares| pb::AgentMessage {
        body: Some(pb::agent_message::Body::Occupancy(
            big_real_node(1, shares).1,
        )),
    };
    let steps = |m: &pb::AgentMessage| {
        let mut steps = Steps::default();
        check_and_convert(m, &mut steps).unwrap();
        (steps.0, m.encoded_len() as u64)
    };
    for (small, big) in [(hello(32), hello(64)), (occupancy(500), occupancy(1000))] {
        let ((s, bytes_s), (b, bytes_b)) = (steps(&small), steps(&big));
        // Steps per byte stay the same (within a tenth), however the message grows.
        let (per_small, per_big) = (s as f64 / bytes_s as f64, b as f64 / bytes_b as f64);
        assert!(
            per_big <= per_small * 1.1,
            "{s} steps for {bytes_s} bytes, {b} for {bytes_b}"
        );
    }
}
