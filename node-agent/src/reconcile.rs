//! Keeps the ledger in line with the kubelet: reads pod-resources `List` (which pod
//! holds which device ids) and applies it with [`crate::ledger::Ledger::reconcile`].
//! Runs at start, so an agent restart recovers allocations even without its
//! checkpoint, and then periodically, so finished pods release their shares.

use std::path::Path;

use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;

use crate::assignments::AssignmentSource;
use crate::ledger::{Grant, ListedContainer, Origin, PodRef, ReconcileReport, now_unix_ms};
use crate::node::Node;
use tessera_contract::keys::GPU_RESOURCE;

/// Failures talking to the kubelet's pod-resources API.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The socket could not be reached.
    #[error("cannot reach the kubelet pod-resources socket {path}: {reason}")]
    Connect {
        /// The kubelet's pod-resources socket (`--pod-resources-socket`).
        path: String,
        /// The connection failure; a missing socket usually means the directory is not mounted.
        reason: String,
    },
    /// `List` failed.
    #[error("pod-resources List failed: {0}")]
    List(#[from] tonic::Status),
    /// The checkpoint could not be written.
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
}

async fn list(socket: &Path) -> Result<pr::ListPodResourcesResponse, ReconcileError> {
    let channel = tessera_device_plugin::uds::connect(socket.to_path_buf())
        .await
        .map_err(|e| ReconcileError::Connect {
            path: socket.display().to_string(),
            reason: e.to_string(),
        })?;
    Ok(PodResourcesListerClient::new(channel)
        .list(pr::ListPodResourcesRequest {})
        .await?
        .into_inner())
}

/// Every container the kubelet lists (its pods' app containers, whether or not they hold
/// devices), and whether it holds `nvidia.com/gpu` slots.
pub async fn list_containers(socket: &Path) -> Result<Vec<(PodRef, String, bool)>, ReconcileError> {
    let response = list(socket).await?;
    Ok(response
        .pod_resources
        .into_iter()
        .flat_map(|pod| {
            let p = PodRef::new(&pod.namespace, &pod.name);
            pod.containers.into_iter().map(move |c| {
                let holds = c
                    .devices
                    .iter()
                    .any(|d| d.resource_name == GPU_RESOURCE && !d.device_ids.is_empty());
                (p.clone(), c.name, holds)
            })
        })
        .collect())
}

/// Reads every container's `nvidia.com/*` device ids from the pod-resources socket.
pub async fn list_gpu_holders(socket: &Path) -> Result<Vec<ListedContainer>, ReconcileError> {
    let response = list(socket).await?;
    let mut out = Vec::new();
    for pod in response.pod_resources {
        for container in pod.containers {
            for devices in container.devices {
                if devices.resource_name.starts_with("nvidia.com/") {
                    out.push(ListedContainer {
                        pod: PodRef::new(&pod.namespace, &pod.name),
                        container: container.name.clone(),
                        resource: devices.resource_name,
                        slots: devices.device_ids,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// One reconcile pass against `socket`; allocations younger than `grace_ms` that the
/// kubelet does not report yet are kept (the kubelet records them after Allocate).
pub async fn reconcile_once(
    node: &Node,
    source: &dyn AssignmentSource,
    socket: &Path,
    grace_ms: u64,
) -> Result<ReconcileReport, ReconcileError> {
    let listed = list_gpu_holders(socket).await?;
    let report = node
        .ledger
        .lock()
        .reconcile(&listed, now_unix_ms(), grace_ms, |c| {
            grants_for(node, source, c)
        })?;
    if report != ReconcileReport::default() {
        node.bump();
        tracing::info!(released = ?report.released, adopted = ?report.adopted, named = ?report.named,
            "ledger reconciled with the kubelet");
    }
    Ok(report)
}

/// What a container the ledger did not know holds: its pod's assignment when there is
/// one, else the whole GPUs (or MIG devices) behind its device ids.
fn grants_for(
    node: &Node,
    source: &dyn AssignmentSource,
    c: &ListedContainer,
) -> (Vec<Grant>, Origin) {
    if c.resource == GPU_RESOURCE
        && let Some(assigned) = source.assignment_of(&c.pod).and_then(|a| {
            a.containers
                .into_iter()
                .find(|x| x.container == c.container)
        })
    {
        let grants = assigned
            .gpus
            .into_iter()
            .map(|g| Grant {
                uuid: g.uuid,
                memory_mib: g.memory_mib,
                compute_milli: g.compute_milli,
            })
            .collect();
        return (grants, Origin::Assigned);
    }
    let grants = c
        .slots
        .iter()
        .filter_map(|id| {
            if let Some(d) = node.slot_gpu(id) {
                Some((d.uuid.clone(), d.memory_total_mib))
            } else {
                node.mig_device(id)
                    .map(|(_, m)| (m.uuid.clone(), m.memory_total_mib))
            }
        })
        .map(|(uuid, memory_mib)| Grant {
            uuid,
            memory_mib,
            compute_milli: 1000,
        })
        .collect();
    (grants, Origin::Recovered)
}
