//! After a kubelet restart: allocations the new kubelet may not know are unconfirmed until
//! its pod-resources API says whether it kept them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use parking_lot::Mutex;
use tessera_contract::PodUid;
use tessera_contract::keys::GPU_RESOURCE;

use crate::assignments::PendingPod;
use crate::ledger::{Ledger, Origin, PodRef};
use crate::node::Node;

/// The ids of `ledger`'s allocations for the `pending` pods.
fn unconfirmed_ids(ledger: &Ledger, pending: &BTreeSet<&PodUid>) -> BTreeSet<u64> {
    ledger
        .allocations()
        .iter()
        .filter(|a| a.resource == GPU_RESOURCE && a.origin == Origin::Assigned)
        .filter(|a| a.pod_uid.as_ref().is_some_and(|p| pending.contains(p)))
        .map(|a| a.id)
        .collect()
}

/// Ledger ids allocated before the latest registration for pods not started yet.
#[derive(Debug, Default)]
pub(super) struct Unconfirmed {
    ids: Mutex<BTreeSet<u64>>,
}

impl Unconfirmed {
    /// Marks the ledger's allocations for `pending` pods (not started) as unconfirmed: the
    /// kubelet about to register may not know them. (The ledger is let go before the set is
    /// locked: [`Unconfirmed::settle`] takes them in the other order.)
    pub(super) fn mark(&self, node: &Node, pending: &[PendingPod]) {
        let pending: BTreeSet<&PodUid> = pending.iter().map(|p| &p.uid).collect();
        let ids = unconfirmed_ids(&node.ledger.lock(), &pending);
        *self.ids.lock() = ids;
    }

    /// Asks pod-resources at `socket` about the unconfirmed allocations (only while there
    /// are any; without a socket they are kept as they are): listed with devices →
    /// confirmed; the pod listed but that container without devices → lost by the kubelet,
    /// released so that the container is matched again; the pod not listed yet → still
    /// open. A pod that started or left (not among `pending`) is confirmed by that.
    pub(super) async fn settle(
        &self,
        node: &Node,
        socket: Option<&Path>,
        pending: impl FnOnce() -> Vec<PendingPod>,
    ) {
        if self.ids.lock().is_empty() {
            return;
        }
        let Some(socket) = socket else {
            self.ids.lock().clear();
            return;
        };
        let listed = match crate::reconcile::list_containers(socket).await {
            Ok(l) => l,
            Err(error) => {
                tracing::debug!(%error, "cannot settle allocations after a kubelet restart yet");
                return;
            }
        };
        // Pod-resources names pods: a pending pod is found there by its name.
        let pending: BTreeMap<PodUid, PodRef> =
            pending().into_iter().map(|p| (p.uid, p.pod)).collect();
        let mut unconfirmed = self.ids.lock();
        let mut ledger = node.ledger.lock();
        let mut lost = Vec::new();
        unconfirmed.retain(|id| {
            let Some(a) = ledger.allocations().iter().find(|a| a.id == *id) else {
                return false;
            };
            let (Some(uid), Some(container)) = (&a.pod_uid, &a.container) else {
                return false;
            };
            let Some(pod) = pending.get(uid) else {
                return false;
            };
            match listed.iter().find(|(p, c, _)| p == pod && c == container) {
                Some((_, _, true)) => false,
                Some((_, _, false)) => {
                    lost.push((a.slots.clone(), pod.clone(), container.clone()));
                    false
                }
                // An init container (pod-resources lists app containers only) or a pod
                // the kubelet has not taken in yet: nothing to conclude.
                None => true,
            }
        });
        for (slots, pod, container) in lost {
            if let Err(error) = ledger.remove_holding(&slots) {
                tracing::warn!(%pod, container, %error, "could not release an allocation the kubelet lost");
                continue;
            }
            tracing::info!(%pod, container, ?slots,
                "the restarted kubelet lost this allocation (not checkpointed); the container is pending again");
        }
    }
}
