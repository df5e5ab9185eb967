//! Which pod a kubelet request is for: the kubelet names none, so a request is matched by
//! its size, the GPUs its slots are on and the slot set GetPreferredAllocation reserved,
//! oldest pending pod first, and never to another pod's share.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tessera_device_plugin::{ProviderError, api};

use super::*;
use crate::ledger::{Grant, Origin, PodUid};
use tessera_contract::GpuSlice;

impl GpuPlugin {
    pub(super) fn live_reservations(&self) -> Vec<Reservation> {
        let mut r = self.reservations.lock();
        r.retain(|x| x.at.elapsed() < RESERVATION_TTL);
        r.clone()
    }

    /// Pending containers wanting `size` slots, assigned ones (`assigned`) or those
    /// without an assignment, oldest pod first, skipping containers already in the ledger.
    fn candidates(&self, size: usize, assigned: bool) -> Vec<Candidate> {
        let ledger = self.node.ledger.lock();
        self.source
            .pending()
            .into_iter()
            .flat_map(|p| {
                let (uid, pod, isolation) = (p.uid, p.pod, p.isolation);
                p.containers.into_iter().filter_map(move |c| {
                    if c.slots as usize != size || c.gpus.is_some() != assigned {
                        return None;
                    }
                    Some(Candidate {
                        uid: uid.clone(),
                        pod: pod.clone(),
                        container: c.name,
                        gpus: c.gpus.unwrap_or_default(),
                        isolation,
                    })
                })
            })
            .filter(|c| !ledger.has_container(&c.uid, &c.container))
            .collect()
    }

    /// Pending assigned containers wanting `size` slots, oldest pod first, skipping
    /// containers already in the ledger.
    pub(super) fn assigned_candidates(&self, size: usize) -> Vec<Candidate> {
        self.candidates(size, true)
    }

    /// Pending containers without an assignment wanting `size` slots, oldest first.
    pub(super) fn unassigned_candidates(&self, size: usize) -> Vec<Candidate> {
        self.candidates(size, false)
    }

    /// Waits (bounded by [`WATCH_CATCH_UP`]) until some pending pod could own a request
    /// of each of `sizes` GPUs. The kubelet and the agent's pod watch see a binding
    /// independently, so the kubelet may ask about a pod the watch has not delivered yet;
    /// answering at once would steer it to whole free GPUs or fail its Allocate.
    pub(super) async fn await_candidates(&self, sizes: &[usize]) {
        if self.source.kind() == "none" {
            return;
        }
        self.settle_unconfirmed().await;
        let began = Instant::now();
        let deadline = began + WATCH_CATCH_UP;
        for &size in sizes {
            while self.assigned_candidates(size).is_empty()
                && !self.unassigned_pending(size)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.node.metrics.observe_pod_wait(began.elapsed());
    }

    pub(super) fn unassigned_pending(&self, size: usize) -> bool {
        !self.unassigned_candidates(size).is_empty()
    }

    /// Whole free GPUs are allowed without a cluster, or for a pod without assignment.
    pub(super) fn whole_allowed(&self, size: usize) -> bool {
        self.source.kind() == "none" || self.unassigned_pending(size)
    }

    pub(super) fn preferred_one(
        &self,
        req: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, ProviderError> {
        let size = usize::try_from(req.allocation_size).unwrap_or(0);
        // Available slots grouped by their (healthy) GPU.
        let mut by_gpu: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for slot in &req.available_device_i_ds {
            if let Some(d) = self.node.slot_gpu(slot)
                && self.node.health(&d.uuid).healthy
            {
                by_gpu.entry(d.uuid.clone()).or_default().push(slot.clone());
            }
        }
        let must_gpus: BTreeSet<String> = req
            .must_include_device_i_ds
            .iter()
            .filter_map(|s| self.node.slot_gpu(s).map(|d| d.uuid.clone()))
            .collect();
        let reserved: Vec<Reservation> = self.live_reservations();
        // Slots the ledger holds are only offered by a kubelet that lost track of them;
        // never steer a new pod onto them.
        let held: BTreeSet<String> = self
            .node
            .ledger
            .lock()
            .allocations()
            .iter()
            .flat_map(|a| a.slots.iter().cloned())
            .collect();
        let pick = |uuid: &str| -> Option<String> {
            let slots = by_gpu.get(uuid)?;
            slots
                .iter()
                .find(|s| req.must_include_device_i_ds.contains(s))
                .or_else(|| {
                    slots.iter().find(|s| {
                        !held.contains(*s) && !reserved.iter().any(|r| r.slots.contains(*s))
                    })
                })
                .cloned()
        };
        for c in self.assigned_candidates(size) {
            let uuids: BTreeSet<String> = c.gpus.iter().map(|g| g.uuid.clone()).collect();
            if uuids.len() != size || !must_gpus.is_subset(&uuids) {
                continue;
            }
            let slots: Option<Vec<String>> = c.gpus.iter().map(|g| pick(&g.uuid)).collect();
            if let Some(slots) = slots {
                let mut r = self.reservations.lock();
                r.retain(|x| !(x.uid == c.uid && x.container == c.container));
                r.push(Reservation {
                    slots: slots.iter().cloned().collect(),
                    uid: c.uid,
                    container: c.container,
                    at: Instant::now(),
                });
                return Ok(slots);
            }
        }
        // No assignment fits: the best-connected whole free GPUs.
        let topology = self.node.topology();
        let ledger = self.node.ledger.lock();
        let free: Vec<usize> = by_gpu
            .keys()
            .filter(|u| ledger.usage(u).holders == 0)
            // A GPU in MIG mode is only ever handed out as instances.
            .filter(|u| self.node.device(u).is_some_and(|d| d.mig.is_none()))
            .filter(|u| {
                !reserved
                    .iter()
                    .any(|r| r.slots.iter().any(|s| s.starts_with(u.as_str())))
            })
            .filter_map(|u| topology.position(u))
            .collect();
        let must: Vec<usize> = must_gpus
            .iter()
            .filter_map(|u| topology.position(u))
            .collect();
        drop(ledger);
        if let Some(set) = topology.best_set(&free, &must, size) {
            let slots: Option<Vec<String>> = set
                .iter()
                .map(|&i| pick(&topology.gpus()[i].uuid))
                .collect();
            if let Some(slots) = slots {
                return Ok(slots);
            }
        }
        // Nothing sensible: echo must-include plus the first available; Allocate will
        // explain what is wrong.
        let mut out: Vec<String> = req.must_include_device_i_ds.clone();
        for s in &req.available_device_i_ds {
            if out.len() >= size {
                break;
            }
            if !out.contains(s) {
                out.push(s.clone());
            }
        }
        Ok(out)
    }

    /// Decides what the container holding `slots` gets.
    pub(super) fn plan(&self, slots: &[String], planned: &[Plan]) -> Result<Plan, ProviderError> {
        if slots.is_empty() {
            return Err(ProviderError::InvalidRequest(
                "a container request with no devices".into(),
            ));
        }
        let mut gpus: Vec<String> = Vec::new();
        for slot in slots {
            let d = self.node.slot_gpu(slot).ok_or_else(|| {
                ProviderError::InvalidRequest(format!(
                    "device id {slot:?} is not a slot of a shared GPU (expected <gpu-uuid>-<0..{}>)",
                    self.node.options().shares_per_gpu
                ))
            })?;
            let health = self.node.health(&d.uuid);
            if !health.healthy {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {} ({}) is unhealthy (XID {}); its slots cannot be allocated",
                    d.index,
                    d.uuid,
                    health.xid.unwrap_or(0)
                )));
            }
            if gpus.contains(&d.uuid) {
                return Err(ProviderError::InvalidRequest(format!(
                    "two slots of GPU {} in one container request; each slot must be on a different GPU",
                    d.uuid
                )));
            }
            gpus.push(d.uuid.clone());
        }
        let set: BTreeSet<String> = slots.iter().cloned().collect();
        let gpu_set: BTreeSet<&String> = gpus.iter().collect();
        let taken = |uid: &PodUid, c: &str| planned.iter().any(|p| p.is_for(uid, c));
        let candidates = self.assigned_candidates(slots.len());
        // 1. The pod this exact slot set was reserved for.
        let reserved = self
            .live_reservations()
            .into_iter()
            .find(|r| r.slots == set)
            .and_then(|r| {
                candidates
                    .iter()
                    .find(|c| {
                        c.uid == r.uid && c.container == r.container && !taken(&c.uid, &c.container)
                    })
                    .cloned()
            });
        // 2. The oldest pending pod assigned exactly these GPUs.
        let matched = reserved.or_else(|| {
            candidates
                .iter()
                .find(|c| {
                    !taken(&c.uid, &c.container)
                        && c.gpus.iter().map(|s| &s.uuid).collect::<BTreeSet<_>>() == gpu_set
                })
                .cloned()
        });
        // 3. A container reusing the GPUs an init container of its own pod holds: the kubelet
        //    chooses which of those reusable devices it hands on, so the GPUs can differ from
        //    the container's entry while staying within the pod's.
        let matched = matched.or_else(|| self.reusing(&candidates, &gpu_set, &taken));
        if let Some(owner) = matched {
            // Grants in the order of the request's slots.
            let grants = gpus
                .iter()
                .filter_map(|u| owner.gpus.iter().find(|g| &g.uuid == u))
                .map(|g| Grant {
                    uuid: g.uuid.clone(),
                    memory_mib: g.memory_mib,
                    compute_milli: g.compute_milli,
                })
                .collect();
            return Ok(Plan {
                slots: slots.to_vec(),
                grants,
                isolation: owner.isolation,
                owner: Some(owner),
                origin: Origin::Assigned,
                mode: Mode::Plain,
            });
        }
        if !self.whole_allowed(slots.len()) {
            let pending: Vec<String> = candidates
                .iter()
                .map(|c| {
                    let u: Vec<&str> = c.gpus.iter().map(|s| s.uuid.as_str()).collect();
                    format!("{}/{} -> [{}]", c.pod, c.container, u.join(", "))
                })
                .collect();
            return Err(ProviderError::FailedPrecondition(format!(
                "no pending pod on this node is assigned GPUs [{}] with {} GPU(s) (pending assignments: {}); \
                 only pods without a Tessera assignment may get whole free GPUs",
                gpus.join(", "),
                slots.len(),
                if pending.is_empty() {
                    "none".to_owned()
                } else {
                    pending.join("; ")
                }
            )));
        }
        // The oldest pod of another scheduler asking for this many GPUs (none without
        // a cluster); the kubelet admits pods oldest first.
        let owner = self
            .unassigned_candidates(slots.len())
            .into_iter()
            .find(|c| !taken(&c.uid, &c.container));
        let ledger = self.node.ledger.lock();
        let mut grants = Vec::new();
        for uuid in &gpus {
            if self.node.device(uuid).is_some_and(|d| d.mig.is_some()) {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {uuid} is in MIG mode: it serves only pods assigned to it with \
                     tessera.dev/isolation: mig, each on a MIG instance of its own"
                )));
            }
            // Holders of the very slots requested are gone (the kubelet re-issued them).
            let others = ledger
                .allocations()
                .iter()
                .filter(|a| a.grants.iter().any(|g| &g.uuid == uuid))
                .filter(|a| !a.slots.iter().any(|s| set.contains(s)))
                .count()
                + planned
                    .iter()
                    .filter(|p| p.grants.iter().any(|g| &g.uuid == uuid))
                    .count();
            if others > 0 {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {uuid} is already in use by {others} container(s); a pod without a Tessera \
                     assignment gets whole free GPUs only"
                )));
            }
            let total = self.node.device(uuid).map_or(0, |d| d.memory_total_mib);
            grants.push(Grant {
                uuid: uuid.clone(),
                memory_mib: total,
                compute_milli: 1000,
            });
        }
        Ok(Plan {
            slots: slots.to_vec(),
            grants,
            isolation: owner.as_ref().map_or(Isolation::Watchdog, |o| o.isolation),
            owner,
            origin: Origin::Whole,
            mode: Mode::Plain,
        })
    }

    /// The candidate among `candidates` whose GPUs `gpus` lie within its own entry plus the
    /// GPUs its pod's containers already hold (an init container's devices, which the
    /// kubelet reuses first and picks among itself): a container may get GPUs other than its
    /// entry names, but never outside its pod's. Returns those slices.
    pub(super) fn reusing(
        &self,
        candidates: &[Candidate],
        gpus: &BTreeSet<&String>,
        taken: &dyn Fn(&PodUid, &str) -> bool,
    ) -> Option<Candidate> {
        let ledger = self.node.ledger.lock();
        candidates
            .iter()
            .filter(|c| !taken(&c.uid, &c.container))
            .find_map(|c| {
                let own = &c.gpus;
                let mut slices: Vec<GpuSlice> = own.clone();
                let held = ledger
                    .allocations()
                    .iter()
                    .filter(|a| a.pod_uid.as_ref() == Some(&c.uid) && a.origin == Origin::Assigned)
                    .flat_map(|a| a.grants.iter());
                for g in held {
                    if !slices.iter().any(|x| x.uuid == g.uuid) {
                        slices.push(GpuSlice {
                            uuid: g.uuid.clone(),
                            memory_mib: g.memory_mib,
                            compute_milli: g.compute_milli,
                        });
                    }
                }
                let covered = gpus.iter().all(|u| slices.iter().any(|s| &&s.uuid == u));
                (covered && slices.len() > own.len()).then(|| Candidate {
                    gpus: slices,
                    ..c.clone()
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::assignments::StaticAssignments;
    use crate::gpu::sim::SimBackend;
    use crate::ledger::Ledger;
    use crate::ledger::PodRef;
    use crate::node::{NodeOptions, slot_id};
    use tessera_contract::{Assignment, ContainerAssignment};

    /// Four L40S GPUs (no NVLink), 10 slots each, and a source the test fills.
    fn plugin() -> (GpuPlugin, Arc<StaticAssignments>, Vec<String>) {
        let shape = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus/l40s-4x-pcie.yaml");
        let sim = Arc::new(SimBackend::from_file(shape).expect("the shape parses"));
        let uuids = (0..4)
            .map(|i| sim.uuid_of(i).expect("4 GPUs").to_owned())
            .collect();
        let node = Arc::new(
            Node::new(sim, Ledger::in_memory(), NodeOptions::default()).expect("the node starts"),
        );
        let source = Arc::new(StaticAssignments::new());
        (GpuPlugin::new(node, source.clone()), source, uuids)
    }

    fn share(uuid: &str, milli: u32) -> Assignment {
        Assignment {
            containers: vec![ContainerAssignment {
                container: "main".into(),
                gpus: vec![GpuSlice {
                    uuid: uuid.into(),
                    memory_mib: 1024,
                    compute_milli: milli,
                }],
            }],
        }
    }

    fn pod_of(plan: &Plan) -> String {
        plan.owner
            .as_ref()
            .map(|o| o.pod.name.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_request_goes_to_the_oldest_pending_pod_assigned_exactly_its_gpus() {
        let (p, source, g) = plugin();
        source.bind(
            PodRef::new("ml", "young"),
            2,
            &[("main", 1)],
            Some(share(&g[0], 250)),
        );
        source.bind(
            PodRef::new("ml", "old"),
            1,
            &[("main", 1)],
            Some(share(&g[0], 500)),
        );
        source.bind(
            PodRef::new("ml", "other"),
            0,
            &[("main", 1)],
            Some(share(&g[1], 500)),
        );
        let plan = p.plan(&[slot_id(&g[0], 3)], &[]).unwrap();
        assert_eq!(pod_of(&plan), "old");
        assert_eq!(plan.grants[0].compute_milli, 500);
        // The same request again within one Allocate: the next pod on that GPU.
        let second = p.plan(&[slot_id(&g[0], 4)], &[plan]).unwrap();
        assert_eq!(pod_of(&second), "young");
        // A request on GPU 1 is the pod assigned GPU 1, though older pods are pending.
        assert_eq!(pod_of(&p.plan(&[slot_id(&g[1], 0)], &[]).unwrap()), "other");
    }

    #[test]
    fn a_reserved_slot_set_goes_to_the_pod_it_was_reserved_for() {
        let (p, source, g) = plugin();
        source.bind(
            PodRef::new("ml", "a"),
            1,
            &[("main", 1)],
            Some(share(&g[2], 500)),
        );
        source.bind(
            PodRef::new("ml", "b"),
            2,
            &[("main", 1)],
            Some(share(&g[2], 250)),
        );
        p.reservations.lock().push(Reservation {
            slots: BTreeSet::from([slot_id(&g[2], 7)]),
            uid: source.uid(&PodRef::new("ml", "b")).unwrap(),
            container: "main".into(),
            at: Instant::now(),
        });
        assert_eq!(pod_of(&p.plan(&[slot_id(&g[2], 7)], &[]).unwrap()), "b");
        assert_eq!(pod_of(&p.plan(&[slot_id(&g[2], 8)], &[]).unwrap()), "a");
    }

    #[test]
    fn a_request_on_gpus_no_pending_pod_is_assigned_is_refused_naming_the_pending_ones() {
        let (p, source, g) = plugin();
        source.bind(
            PodRef::new("ml", "a"),
            1,
            &[("main", 1)],
            Some(share(&g[0], 500)),
        );
        let err = p.plan(&[slot_id(&g[3], 0)], &[]).err().expect("refused");
        let text = err.to_string();
        assert!(text.contains(&g[3]) && text.contains("ml/a/main"), "{text}");
    }

    #[test]
    fn a_pod_without_an_assignment_gets_whole_free_gpus_and_never_a_shared_one() {
        let (p, source, g) = plugin();
        source.bind(PodRef::new("ml", "plain"), 1, &[("main", 1)], None);
        let plan = p.plan(&[slot_id(&g[1], 0)], &[]).unwrap();
        assert_eq!(
            (pod_of(&plan), plan.origin),
            ("plain".to_owned(), Origin::Whole)
        );
        assert_eq!(plan.grants[0].compute_milli, 1000);
    }
}
