//! Keeps the ledger in line with the kubelet: reads pod-resources `List` (which pod
//! holds which device ids) and applies it with [`crate::ledger::Ledger::reconcile`].
//! Runs at start, again as soon as the assignment source has its first list of the
//! node's pods (only then are containers the ledger does not know adopted, see
//! [`adoption`]), so an agent restart recovers allocations even without its checkpoint,
//! and then periodically, so finished pods release their shares.

use std::path::Path;

use tessera_proto::podresources::v1 as pr;
use tessera_proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;

use crate::assignments::{AssignmentSource, SourceKind};
use crate::ledger::{
    Adoption, Grant, ListedContainer, Origin, PodRef, ReconcileReport, now_unix_ms,
};
use crate::node::Node;
use tessera_contract::keys::GPU_RESOURCE;
use tessera_contract::{Isolation, PodUid};

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
/// Containers the ledger does not know are adopted as [`adoption`] decides.
pub async fn reconcile_once(
    node: &Node,
    source: &dyn AssignmentSource,
    socket: &Path,
    grace_ms: u64,
) -> Result<ReconcileReport, ReconcileError> {
    let listed = list_gpu_holders(socket).await?;
    // Read once for the whole pass: a list arriving meanwhile waits for the next one.
    let synced = *source.synced().borrow();
    let report = node.ledger.lock().reconcile(
        &listed,
        now_unix_ms(),
        grace_ms,
        |pod| synced.then(|| source.listed(pod).map(|l| l.uid)).flatten(),
        |c| adoption(node, source, synced, c),
    )?;
    if report.changed() {
        node.bump();
        tracing::info!(released = ?report.released, adopted = ?report.adopted, named = ?report.named,
            waiting = ?report.waiting, "ledger reconciled with the kubelet");
    } else if !report.waiting.is_empty() {
        tracing::debug!(waiting = ?report.waiting, "containers the ledger does not know, not adopted yet");
    }
    Ok(report)
}

/// How a container the kubelet lists and the ledger does not know is taken in (the
/// checkpoint was lost, or the agent was down when it was allocated), or why not yet:
///
/// - before the assignment source has its first full list, nothing is adopted: the agent
///   cannot tell a fractional pod from a whole one, and adopting at 100% would refuse every
///   later pod assigned to that GPU;
/// - a pod the source lists with an assignment is adopted at its assigned share (the
///   container's entry, or, for a container reusing its init containers' GPUs, the pod's
///   share of each GPU it holds), with the isolation the source gives for it now;
/// - a pod the source lists without an assignment (another scheduler's) holds whole GPUs;
/// - a pod the source does not list is left for a later reconcile, not adopted: the
///   source's list holds every unfinished GPU pod bound here, so such a pod has finished or
///   been deleted (the kubelet lists pods until it has torn them down), and its GPUs are
///   free in the coordinator's accounting; adopting them whole would refuse the pods the
///   coordinator places there next. Should it show up in a later list, it is adopted then;
/// - without a cluster (`--no-kube`) every pod holds whole GPUs, and a MIG device is
///   always whole.
pub fn adoption(
    node: &Node,
    source: &dyn AssignmentSource,
    synced: bool,
    c: &ListedContainer,
) -> Result<Adoption, String> {
    let whole = |pod_uid: Option<PodUid>, isolation: Isolation| Adoption {
        pod_uid,
        grants: whole_grants(node, c),
        origin: Origin::Recovered,
        isolation,
    };
    // A MIG device isolates in hardware; a shared GPU is watched unless its pod says otherwise.
    let mig = c.resource != GPU_RESOURCE;
    let plain = if mig {
        Isolation::Mig
    } else {
        Isolation::Watchdog
    };
    if source.kind() == SourceKind::None {
        return Ok(whole(None, plain));
    }
    if !synced {
        return Err(
            "waiting for the first list of this node's pods from the assignment source".into(),
        );
    }
    let listed = source.listed(&c.pod);
    if mig {
        return Ok(whole(listed.map(|l| l.uid), plain));
    }
    let Some(listed) = listed else {
        return Err(format!(
            "{} does not list this pod (finished or deleted): its GPUs are free there; \
             adopted if a later list has it",
            source.kind()
        ));
    };
    let Some(assignment) = listed.assignment else {
        let isolation = match listed.isolation {
            Isolation::None => Isolation::None,
            _ => Isolation::Watchdog,
        };
        return Ok(whole(Some(listed.uid), isolation));
    };
    let gpus: Vec<&str> = c
        .slots
        .iter()
        .filter_map(|s| node.slot_gpu(s).map(|d| d.uuid.as_str()))
        .collect();
    let own = assignment
        .containers
        .iter()
        .find(|x| x.container == c.container);
    let grants: Vec<Grant> = gpus
        .iter()
        .filter_map(|uuid| {
            own.into_iter()
                .chain(&assignment.containers)
                .flat_map(|x| &x.gpus)
                .find(|g| g.uuid == *uuid)
        })
        .map(|g| Grant {
            uuid: g.uuid.clone(),
            memory_mib: g.memory_mib,
            compute_milli: g.compute_milli,
        })
        .collect();
    if grants.is_empty() || grants.len() != c.slots.len() {
        return Err(format!(
            "its slots are on GPUs [{}], which its pod's assignment does not give it",
            gpus.join(", ")
        ));
    }
    // As Allocate would have recorded it: MIG on GPUs in MIG mode, and a pod asking for
    // MIG on a GPU that is not is watched instead.
    let on_mig = grants
        .iter()
        .any(|g| node.device(&g.uuid).is_some_and(|d| d.mig.is_some()));
    let isolation = match listed.isolation {
        _ if on_mig => Isolation::Mig,
        Isolation::Mig => Isolation::Watchdog,
        other => other,
    };
    Ok(Adoption {
        pod_uid: Some(listed.uid),
        grants,
        origin: Origin::Assigned,
        isolation,
    })
}

/// The whole GPUs (or MIG devices) behind a container's device ids.
fn whole_grants(node: &Node, c: &ListedContainer) -> Vec<Grant> {
    c.slots
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
        .collect()
}
