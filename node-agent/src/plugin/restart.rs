//! After a kubelet restart: allocations the new kubelet may not know are unconfirmed until
//! its pod-resources API says whether it kept them.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::ledger::{Origin, PodRef, PodUid};
use tessera_contract::keys::GPU_RESOURCE;

impl GpuPlugin {
    /// Marks the ledger's allocations for pods that have not started as unconfirmed: the
    /// kubelet about to register may not know them.
    pub(super) fn mark_unconfirmed(&self) {
        let pending: BTreeSet<PodUid> = self.source.pending().into_iter().map(|p| p.uid).collect();
        let ledger = self.node.ledger.lock();
        let ids: BTreeSet<u64> = ledger
            .allocations()
            .iter()
            .filter(|a| a.resource == GPU_RESOURCE && a.origin == Origin::Assigned)
            .filter(|a| a.pod_uid.as_ref().is_some_and(|p| pending.contains(p)))
            .map(|a| a.id)
            .collect();
        drop(ledger);
        *self.unconfirmed.lock() = ids;
    }

    /// Asks pod-resources about the unconfirmed allocations (only while there are any):
    /// listed with devices → confirmed; the pod listed but that container without devices
    /// → lost by the kubelet, released so that the container is matched again; the pod not
    /// listed yet → still open. A pod that started or left is confirmed by that.
    pub(super) async fn settle_unconfirmed(&self) {
        if self.unconfirmed.lock().is_empty() {
            return;
        }
        let Some(socket) = &self.pod_resources else {
            self.unconfirmed.lock().clear();
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
        let pending: BTreeMap<PodUid, PodRef> = self
            .source
            .pending()
            .into_iter()
            .map(|p| (p.uid, p.pod))
            .collect();
        let mut unconfirmed = self.unconfirmed.lock();
        let mut ledger = self.node.ledger.lock();
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
