//! What an agent's message may hold, and the one check of each message against it.
//!
//! The agent port takes input from every node, and a node can be compromised: whatever a
//! message says, the work the coordinator does for it must stay bounded. So each agent
//! message is checked here before anything else looks at it: every list against a cap
//! (checked on its length before any element is read, so a 90,000-entry list is refused
//! after one comparison), every string against a length, every number the coordinator
//! computes with against a range. The checks visit each element once and keep no state
//! between elements but hash sets, so their cost is linear in the message (the fuzz tests
//! below count their steps). A refusal names the field and the accepted form.
//!
//! Pure: no I/O, no locks, no clocks.

use std::collections::HashSet;

use tessera_proto::tessera::v1 as pb;

/// Default size limit of one agent message (`--agent-max-message-bytes`), gRPC's usual
/// 4 MiB. A 16-GPU node's Hello with every GPU split into 7 MIG instances and its full link
/// matrix is about 30 KB, and its occupancy with 100 shares on every GPU (the agent's most)
/// and names as long as Kubernetes allows under 1 MB (`real_nodes_fit_far_inside_the_limits`).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// GPUs per node. The largest single servers carry 16 (DGX-2/HGX-2) to 20 (single-slot
/// inference boxes); 64 leaves three times that, and keeps the link matrix under 2,016 pairs.
pub const MAX_GPUS: usize = 64;

/// MIG instances per GPU: 7 on every MIG-capable GPU so far (A100, H100, H200, B200).
pub const MAX_MIG_INSTANCES: usize = 16;

/// Shares held on one GPU: the agent advertises at most 100 slots per GPU (and per MIG
/// instance, 7 of them), so it never hands out more than 700 of one GPU.
pub const MAX_SHARES_PER_GPU: usize = 1024;

/// `shares_per_gpu`: the agent accepts 1 to 100.
pub const MAX_SHARES_SETTING: u32 = 1000;

/// Pods reported allocated but not started on one node: kubelet's `--max-pods` is 110 by
/// default and the largest managed offerings stay under 1,000.
pub const MAX_ALLOCATED_PODS: usize = 1024;

/// Kubernetes names: node, namespace, pod and container names (a DNS subdomain is at most
/// 253 characters, a label 63).
pub const MAX_NAME_LEN: usize = 253;

/// Identifiers: GPU and MIG UUIDs (40 characters from NVML), pod UIDs (36), PCI bus ids.
pub const MAX_ID_LEN: usize = 128;

/// Short texts: GPU model (NVML's name buffer is 96 bytes), agent version, MIG profile.
pub const MAX_TEXT_LEN: usize = 256;

/// Health reasons (`XID 79: GPU has fallen off the bus`).
pub const MAX_REASON_LEN: usize = 1024;

/// Memory of one GPU or MIG instance, in MiB: 16 TiB, fifty times the largest GPU's.
pub const MAX_MEMORY_MIB: u64 = 1 << 24;

/// Compute slices of a GPU or MIG instance (7 on MIG-capable GPUs).
pub const MAX_COMPUTE_SLICES: u32 = 64;

/// A message, or part of one, that cannot be accepted, naming the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// Path of the field in the message, e.g. `inventory.gpus[2].uuid`.
    pub field: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

impl FieldError {
    fn new(field: String, problem: String) -> Self {
        Self { field, problem }
    }
}

/// Counts the elementary steps of a check (one per element visited, string measured or set
/// insertion), so tests can show the cost is linear in the message without timing it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Steps(pub u64);

impl Steps {
    pub(crate) fn tick(&mut self) {
        self.0 += 1;
    }
}

fn list<T>(
    field: &str,
    items: &[T],
    max: usize,
    what: &str,
    steps: &mut Steps,
) -> Result<(), FieldError> {
    steps.tick();
    if items.len() > max {
        return Err(FieldError::new(
            field.to_owned(),
            format!("{} entries; at most {max} {what} are accepted", items.len()),
        ));
    }
    Ok(())
}

fn text(
    field: impl FnOnce() -> String,
    value: &str,
    max: usize,
    form: &str,
    steps: &mut Steps,
) -> Result<(), FieldError> {
    steps.tick();
    if value.len() > max {
        return Err(FieldError::new(
            field(),
            format!("{} bytes; at most {max} are accepted ({form})", value.len()),
        ));
    }
    Ok(())
}

fn number<T: Ord + std::fmt::Display>(
    field: impl FnOnce() -> String,
    value: T,
    max: T,
    form: &str,
    steps: &mut Steps,
) -> Result<(), FieldError> {
    steps.tick();
    if value > max {
        return Err(FieldError::new(
            field(),
            format!("{value}; at most {max} is accepted ({form})"),
        ));
    }
    Ok(())
}

/// Checks a node inventory (`prefix` is its path: `inventory` or `hello.inventory`): caps,
/// a node name, non-empty GPU UUIDs each listed once, links only between listed GPUs.
pub fn check_inventory(
    prefix: &str,
    inv: &pb::NodeInventory,
    steps: &mut Steps,
) -> Result<(), FieldError> {
    if inv.node_name.is_empty() {
        return Err(FieldError::new(
            format!("{prefix}.node_name"),
            "required: the Kubernetes node name the agent runs on".to_owned(),
        ));
    }
    text(
        || format!("{prefix}.node_name"),
        &inv.node_name,
        MAX_NAME_LEN,
        "a Kubernetes node name",
        steps,
    )?;
    text(
        || format!("{prefix}.agent_version"),
        &inv.agent_version,
        MAX_TEXT_LEN,
        "a version such as 0.1.0",
        steps,
    )?;
    number(
        || format!("{prefix}.shares_per_gpu"),
        inv.shares_per_gpu,
        MAX_SHARES_SETTING,
        "the agent's --shares-per-gpu, 1 to 100",
        steps,
    )?;
    list(
        &format!("{prefix}.gpus"),
        &inv.gpus,
        MAX_GPUS,
        "GPUs per node",
        steps,
    )?;
    let mut uuids: HashSet<&str> = HashSet::with_capacity(inv.gpus.len());
    for (i, g) in inv.gpus.iter().enumerate() {
        let at = || format!("{prefix}.gpus[{i}]");
        if g.uuid.is_empty() {
            return Err(FieldError::new(
                format!("{}.uuid", at()),
                "required: the NVML UUID such as GPU-5f1c...".to_owned(),
            ));
        }
        text(
            || format!("{}.uuid", at()),
            &g.uuid,
            MAX_ID_LEN,
            "an NVML UUID such as GPU-5f1c...",
            steps,
        )?;
        steps.tick();
        if !uuids.insert(g.uuid.as_str()) {
            return Err(FieldError::new(
                format!("{}.uuid", at()),
                format!("{} appears twice; each GPU must be listed once", g.uuid),
            ));
        }
        text(
            || format!("{}.model", at()),
            &g.model,
            MAX_TEXT_LEN,
            "NVML's product name",
            steps,
        )?;
        text(
            || format!("{}.pci_bus_id", at()),
            &g.pci_bus_id,
            MAX_ID_LEN,
            "a PCI bus id such as 00000000:17:00.0",
            steps,
        )?;
        number(
            || format!("{}.memory_mib", at()),
            g.memory_mib,
            MAX_MEMORY_MIB,
            "MiB of framebuffer",
            steps,
        )?;
        list(
            &format!("{}.mig_instances", at()),
            &g.mig_instances,
            MAX_MIG_INSTANCES,
            "MIG instances per GPU",
            steps,
        )?;
        for (k, m) in g.mig_instances.iter().enumerate() {
            let at = || format!("{prefix}.gpus[{i}].mig_instances[{k}]");
            text(
                || format!("{}.profile", at()),
                &m.profile,
                MAX_TEXT_LEN,
                "a profile name such as 1g.10gb",
                steps,
            )?;
            text(
                || format!("{}.uuid", at()),
                &m.uuid,
                MAX_ID_LEN,
                "a MIG UUID such as MIG-2b7f...",
                steps,
            )?;
            number(
                || format!("{}.memory_mib", at()),
                m.memory_mib,
                MAX_MEMORY_MIB,
                "MiB of the instance's memory",
                steps,
            )?;
            number(
                || format!("{}.compute_slices", at()),
                m.compute_slices,
                MAX_COMPUTE_SLICES,
                "the instance's compute slices, 7 at most on today's GPUs",
                steps,
            )?;
            number(
                || format!("{}.gpu_compute_slices", at()),
                m.gpu_compute_slices,
                MAX_COMPUTE_SLICES,
                "the GPU's compute slices, 7 on today's GPUs",
                steps,
            )?;
        }
    }
    let links = inv.links.as_ref().map_or(&[][..], |l| l.links.as_slice());
    let n = inv.gpus.len();
    let pairs = n * n.saturating_sub(1) / 2;
    list(
        &format!("{prefix}.links.links"),
        links,
        pairs,
        &format!("links for {n} GPUs (one per unordered pair)"),
        steps,
    )?;
    for (i, l) in links.iter().enumerate() {
        steps.tick();
        if !uuids.contains(l.gpu_a.as_str()) || !uuids.contains(l.gpu_b.as_str()) {
            let shown = |s: &str| shorten(s, MAX_ID_LEN);
            return Err(FieldError::new(
                format!("{prefix}.links.links[{i}]"),
                format!(
                    "links {} and {}, but both must be GPUs listed in {prefix}.gpus",
                    shown(&l.gpu_a),
                    shown(&l.gpu_b)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks an occupancy snapshot: caps on GPUs, shares per GPU and allocated pods, and the
/// length of every string. Which GPUs it names is the registry's to judge (an unknown one
/// asks the agent for a resync).
pub fn check_occupancy(occupancy: &pb::Occupancy, steps: &mut Steps) -> Result<(), FieldError> {
    list(
        "occupancy.gpus",
        &occupancy.gpus,
        MAX_GPUS,
        "GPUs per node",
        steps,
    )?;
    for (i, o) in occupancy.gpus.iter().enumerate() {
        let at = || format!("occupancy.gpus[{i}]");
        text(
            || format!("{}.gpu_uuid", at()),
            &o.gpu_uuid,
            MAX_ID_LEN,
            "an NVML UUID such as GPU-5f1c...",
            steps,
        )?;
        text(
            || format!("{}.health_reason", at()),
            &o.health_reason,
            MAX_REASON_LEN,
            "a short reason such as XID 79",
            steps,
        )?;
        list(
            &format!("{}.shares", at()),
            &o.shares,
            MAX_SHARES_PER_GPU,
            "shares per GPU",
            steps,
        )?;
        for (k, s) in o.shares.iter().enumerate() {
            let at = || format!("occupancy.gpus[{i}].shares[{k}]");
            text(
                || format!("{}.pod_uid", at()),
                &s.pod_uid,
                MAX_ID_LEN,
                "a pod UID",
                steps,
            )?;
            text(
                || format!("{}.pod_namespace", at()),
                &s.pod_namespace,
                MAX_NAME_LEN,
                "a namespace name",
                steps,
            )?;
            text(
                || format!("{}.pod_name", at()),
                &s.pod_name,
                MAX_NAME_LEN,
                "a pod name",
                steps,
            )?;
            text(
                || format!("{}.container", at()),
                &s.container,
                MAX_NAME_LEN,
                "a container name",
                steps,
            )?;
            text(
                || format!("{}.mig_instance_uuid", at()),
                &s.mig_instance_uuid,
                MAX_ID_LEN,
                "a MIG UUID such as MIG-2b7f...",
                steps,
            )?;
        }
    }
    list(
        "occupancy.allocated_pod_uids",
        &occupancy.allocated_pod_uids,
        MAX_ALLOCATED_PODS,
        "pods per node",
        steps,
    )?;
    for (i, uid) in occupancy.allocated_pod_uids.iter().enumerate() {
        text(
            || format!("occupancy.allocated_pod_uids[{i}]"),
            uid,
            MAX_ID_LEN,
            "a pod UID",
            steps,
        )?;
    }
    Ok(())
}

/// Checks one GPU's health change.
pub fn check_health_change(change: &pb::HealthChange, steps: &mut Steps) -> Result<(), FieldError> {
    text(
        || "health_change.gpu_uuid".to_owned(),
        &change.gpu_uuid,
        MAX_ID_LEN,
        "an NVML UUID such as GPU-5f1c...",
        steps,
    )?;
    text(
        || "health_change.reason".to_owned(),
        &change.reason,
        MAX_REASON_LEN,
        "a short reason such as XID 79",
        steps,
    )
}

/// Checks any agent message: the one entry point the stream calls before acting on it.
/// (A heartbeat carries two numbers, every value of which is acceptable.)
pub fn check_message(message: &pb::AgentMessage, steps: &mut Steps) -> Result<(), FieldError> {
    use pb::agent_message::Body;
    match &message.body {
        Some(Body::Hello(hello)) => match &hello.inventory {
            Some(inv) => check_inventory("hello.inventory", inv, steps),
            None => Err(FieldError::new(
                "hello.inventory".to_owned(),
                "required: the node's GPU inventory".to_owned(),
            )),
        },
        Some(Body::Inventory(inv)) => check_inventory("inventory", inv, steps),
        Some(Body::Occupancy(o)) => check_occupancy(o, steps),
        Some(Body::HealthChange(h)) => check_health_change(h, steps),
        Some(Body::Heartbeat(_)) | None => {
            steps.tick();
            Ok(())
        }
    }
}

/// At most `max` bytes of `s` (cut at a character boundary), for messages and logs that
/// quote what an agent sent.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use prost::Message;

    /// A node as the real agent reports it, every string as long as its source allows:
    /// `gpus` GPUs of 7 MIG instances each, their full link matrix, `shares_per_gpu` shares
    /// on each GPU.
    pub(crate) fn big_real_node(
        gpus: u32,
        shares_per_gpu: u32,
    ) -> (pb::NodeInventory, pb::Occupancy) {
        let uuid = |i: u32| format!("GPU-{i:08}-5f1c-4c8e-9a4b-0123456789ab");
        let gpus_list: Vec<pb::Gpu> = (0..gpus)
            .map(|i| pb::Gpu {
                uuid: uuid(i),
                index: i,
                model: "NVIDIA H100 80GB HBM3".repeat(4),
                memory_mib: 81559,
                numa_node: 1,
                pci_bus_id: "00000000:17:00.0".into(),
                mig_enabled: true,
                mig_instances: (0..7)
                    .map(|k| pb::MigInstance {
                        profile: "1g.10gb+me".into(),
                        uuid: format!("MIG-{i:04}{k:04}-2b7f-4c8e-9a4b-0123456789ab"),
                        placement_start: k,
                        placement_size: 1,
                        memory_mib: 9856,
                        compute_slices: 1,
                        gpu_compute_slices: 7,
                    })
                    .collect(),
            })
            .collect();
        let mut links = Vec::new();
        for a in 0..gpus {
            for b in a + 1..gpus {
                links.push(pb::GpuLink {
                    gpu_a: uuid(a),
                    gpu_b: uuid(b),
                    nvlink_count: 18,
                    nvswitch: true,
                    pcie: pb::PcieRelation::CrossSocket as i32,
                });
            }
        }
        let inventory = pb::NodeInventory {
            node_name: "n".repeat(MAX_NAME_LEN),
            agent_version: "0.1.0-rc.1+build.20250101".into(),
            gpus: gpus_list,
            links: Some(pb::LinkMatrix { links }),
            shares_per_gpu,
        };
        let occupancy = pb::Occupancy {
            gpus: (0..gpus)
                .map(|i| pb::GpuOccupancy {
                    gpu_uuid: uuid(i),
                    health: pb::Health::Unhealthy as i32,
                    health_reason: "XID 79: GPU has fallen off the bus".into(),
                    shares: (0..shares_per_gpu)
                        .map(|k| pb::Share {
                            pod_uid: format!("{k:08}-1111-2222-3333-444455556666"),
                            pod_namespace: "s".repeat(63),
                            pod_name: "p".repeat(253),
                            container: "c".repeat(63),
                            memory_limit_mib: 81559,
                            compute_percent: 100,
                            measured_memory_mib: 81559,
                            measured_utilization_percent: 100,
                            isolation: pb::Isolation::Mps as i32,
                            enforcement: pb::EnforcementState::Throttled as i32,
                            mig_instance_uuid: format!("MIG-{k:08}-2b7f-4c8e-9a4b-0123456789ab"),
                        })
                        .collect(),
                    used_memory_mib: 81559,
                    utilization_percent: 100,
                })
                .collect(),
            observed_unix_ms: i64::MAX,
            allocated_pod_uids: (0..110)
                .map(|k| format!("{k:08}-1111-2222-3333-444455556666"))
                .collect(),
        };
        (inventory, occupancy)
    }

    #[test]
    fn real_nodes_fit_far_inside_the_limits() {
        for gpus in [8, 16] {
            let (inventory, occupancy) = big_real_node(gpus, 100);
            let hello = pb::AgentMessage {
                body: Some(pb::agent_message::Body::Hello(pb::Hello {
                    protocol_version: 2,
                    inventory: Some(inventory),
                })),
            };
            let occupancy = pb::AgentMessage {
                body: Some(pb::agent_message::Body::Occupancy(occupancy)),
            };
            for m in [&hello, &occupancy] {
                check_message(m, &mut Steps::default()).unwrap();
                let size = m.encoded_len();
                assert!(
                    size * 4 < DEFAULT_MAX_MESSAGE_BYTES,
                    "{gpus} GPUs: a {size}-byte message is not far inside the limit"
                );
            }
        }
    }

    #[test]
    fn every_cap_is_refused_naming_the_field_and_the_accepted_form() {
        let (inventory, occupancy) = big_real_node(2, 2);
        let inv = |f: &dyn Fn(&mut pb::NodeInventory)| {
            let mut i = inventory.clone();
            f(&mut i);
            check_inventory("inventory", &i, &mut Steps::default()).unwrap_err()
        };
        let cases: Vec<(FieldError, &str, &str)> = vec![
            (
                inv(&|i| {
                    i.gpus = (0..90_000)
                        .map(|k| pb::Gpu {
                            uuid: k.to_string(),
                            ..Default::default()
                        })
                        .collect();
                    i.links = None;
                }),
                "inventory.gpus",
                "at most 64 GPUs per node",
            ),
            (
                inv(&|i| i.gpus[1].uuid = "G".repeat(129)),
                "inventory.gpus[1].uuid",
                "at most 128",
            ),
            (
                inv(&|i| i.gpus[1].uuid = i.gpus[0].uuid.clone()),
                "inventory.gpus[1].uuid",
                "appears twice",
            ),
            (
                inv(&|i| i.node_name = "n".repeat(254)),
                "inventory.node_name",
                "a Kubernetes node name",
            ),
            (
                inv(&|i| i.gpus[0].model = "m".repeat(300)),
                "inventory.gpus[0].model",
                "at most 256",
            ),
            (
                inv(&|i| i.gpus[0].memory_mib = u64::MAX),
                "inventory.gpus[0].memory_mib",
                "at most 16777216",
            ),
            (
                inv(&|i| {
                    let m = i.gpus[1].mig_instances[0].clone();
                    i.gpus[1].mig_instances = vec![m; 17];
                }),
                "inventory.gpus[1].mig_instances",
                "at most 16 MIG instances per GPU",
            ),
            (
                inv(&|i| i.gpus[1].mig_instances[2].compute_slices = u32::MAX),
                "inventory.gpus[1].mig_instances[2].compute_slices",
                "at most 64",
            ),
            (
                inv(&|i| {
                    let l = i.links.as_ref().unwrap().links[0].clone();
                    i.links = Some(pb::LinkMatrix { links: vec![l; 2] });
                }),
                "inventory.links.links",
                "at most 1 links for 2 GPUs",
            ),
            (
                inv(&|i| i.shares_per_gpu = 5000),
                "inventory.shares_per_gpu",
                "1 to 100",
            ),
        ];
        let occ = |f: &dyn Fn(&mut pb::Occupancy)| {
            let mut o = occupancy.clone();
            f(&mut o);
            check_occupancy(&o, &mut Steps::default()).unwrap_err()
        };
        let more: Vec<(FieldError, &str, &str)> = vec![
            (
                occ(&|o| {
                    let g = o.gpus[0].clone();
                    o.gpus = vec![g; 65];
                }),
                "occupancy.gpus",
                "at most 64 GPUs per node",
            ),
            (
                occ(&|o| {
                    let s = o.gpus[1].shares[0].clone();
                    o.gpus[1].shares = vec![s; 1025];
                }),
                "occupancy.gpus[1].shares",
                "at most 1024 shares per GPU",
            ),
            (
                occ(&|o| o.gpus[0].shares[1].pod_name = "p".repeat(254)),
                "occupancy.gpus[0].shares[1].pod_name",
                "a pod name",
            ),
            (
                occ(&|o| o.allocated_pod_uids = vec![String::new(); 1025]),
                "occupancy.allocated_pod_uids",
                "at most 1024 pods per node",
            ),
            (
                occ(&|o| o.gpus[0].health_reason = "x".repeat(2000)),
                "occupancy.gpus[0].health_reason",
                "at most 1024",
            ),
        ];
        for (error, field, form) in cases.into_iter().chain(more) {
            assert_eq!(error.field, field, "{error}");
            assert!(error.problem.contains(form), "{error}");
        }
        let health = pb::HealthChange {
            gpu_uuid: "g".repeat(129),
            ..Default::default()
        };
        let error = check_health_change(&health, &mut Steps::default()).unwrap_err();
        assert_eq!(error.field, "health_change.gpu_uuid");
    }

    #[test]
    fn an_oversized_list_is_refused_before_any_element_is_read() {
        let mut inv = big_real_node(1, 1).0;
        inv.gpus = vec![pb::Gpu::default(); 90_000];
        let mut steps = Steps::default();
        let error = check_inventory("hello.inventory", &inv, &mut steps).unwrap_err();
        assert_eq!(error.field, "hello.inventory.gpus");
        assert!(steps.0 < 10, "{steps:?} steps to refuse 90,000 GPUs");
    }

    #[test]
    fn shorten_cuts_at_a_character_boundary() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("ééé", 3), "é… (6 bytes)");
    }
}
