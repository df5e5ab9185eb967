//! The node affinity a pending pod inherits from its PersistentVolumes, as kube-scheduler's
//! VolumeBinding plugin reads it:
//!
//! - a claim that is fully bound (`spec.volumeName` set and the PV controller's
//!   `pv.kubernetes.io/bind-completed` annotation present) contributes its volume's
//!   `spec.nodeAffinity.required`, evaluated as kube-scheduler does: against the node's labels
//!   only (a `matchFields` requirement sees an empty node name);
//! - a missing claim, a claim being deleted or lost, and an unbound claim whose StorageClass
//!   binds immediately (or that names its volume but is not bound yet) keep the pod pending
//!   with kube-scheduler's explanation, as an [`InputError`] on the volume;
//! - generic ephemeral volumes use the claim `<pod>-<volume>` the ephemeral volume controller
//!   creates, which must be owned by the pod.
//!
//! Known limit: an unbound claim of a `WaitForFirstConsumer` StorageClass adds no constraint.
//! kube-scheduler would only pick nodes where a matching volume exists or can be provisioned
//! (topology of the class, CSI storage capacity); Tessera places the pod and leaves the
//! provisioning to follow the chosen node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod as KubePod, Volume as KubeVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::constraints::{NODE_NAME_FIELD, node_selector_term};
use tessera_core::model::{InputError, NodeSelector, Requirement, SelectorOp};

/// The PV controller's mark of a completed binding.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// The legacy StorageClass annotation of a claim (wins over `spec.storageClassName`).
pub const LEGACY_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The binding mode that waits for the pod to be scheduled.
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// Claims, volumes and classes by name.
#[derive(Clone, Debug, Default)]
pub struct VolumeObjects<'a> {
    claims: BTreeMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    volumes: BTreeMap<&'a str, &'a PersistentVolume>,
    classes: BTreeMap<&'a str, &'a StorageClass>,
}

impl<'a> VolumeObjects<'a> {
    /// Indexes the objects.
    pub fn new(
        claims: &[&'a PersistentVolumeClaim],
        volumes: &[&'a PersistentVolume],
        classes: &[&'a StorageClass],
    ) -> Self {
        VolumeObjects {
            claims: claims
                .iter()
                .filter_map(|c| {
                    Some((
                        (
                            c.metadata.namespace.as_deref()?,
                            c.metadata.name.as_deref()?,
                        ),
                        *c,
                    ))
                })
                .collect(),
            volumes: volumes
                .iter()
                .filter_map(|v| Some((v.metadata.name.as_deref()?, *v)))
                .collect(),
            classes: classes
                .iter()
                .filter_map(|c| Some((c.metadata.name.as_deref()?, *c)))
                .collect(),
        }
    }
}

/// The node selectors of `pod`'s bound volumes; the problems that keep it pending go to
/// `errors`.
pub fn volume_node_affinity(
    pod: &KubePod,
    objects: &VolumeObjects<'_>,
    errors: &mut Vec<InputError>,
) -> Vec<NodeSelector> {
    let mut out = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    for (i, vol) in spec.volumes.iter().flatten().enumerate() {
        let Some((field, claim_name, ephemeral)) = claim_of(pod, vol, i) else {
            continue;
        };
        let mut problem = |message: String| {
            errors.push(InputError {
                field: field.clone(),
                message,
            })
        };
        let Some(claim) = objects.claims.get(&(namespace, claim_name.as_str())) else {
            problem(if ephemeral {
                format!(
                    "waiting for the ephemeral volume controller to create persistentvolumeclaim {claim_name:?}"
                )
            } else {
                format!("persistentvolumeclaim {claim_name:?} not found")
            });
            continue;
        };
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or("");
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
            problem(format!(
                "persistentvolumeclaim {claim_name:?} bound to non-existent persistentvolume {volume_name:?}"
            ));
            continue;
        }
        if claim.metadata.deletion_timestamp.is_some() {
            problem(format!(
                "persistentvolumeclaim {claim_name:?} is being deleted"
            ));
            continue;
        }
        if ephemeral && !owned_by(claim, pod) {
            problem(format!(
                "persistentvolumeclaim {claim_name:?} was not created for the pod; delete it or rename the volume"
            ));
            continue;
        }
        let bound = !volume_name.is_empty()
            && claim
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(BIND_COMPLETED));
        if !bound {
            if volume_name.is_empty() && delays_binding(claim, objects) {
                // Known limit (module doc): no constraint until the claim is bound.
                continue;
            }
            problem(format!(
                "pod has unbound immediate PersistentVolumeClaims (persistentvolumeclaim {claim_name:?}); wait for it to bind, or use a StorageClass with volumeBindingMode WaitForFirstConsumer"
            ));
            continue;
        }
        let Some(pv) = objects.volumes.get(volume_name) else {
            problem(format!(
                "persistentvolumeclaim {claim_name:?} is bound to persistentvolume {volume_name:?}, which does not exist"
            ));
            continue;
        };
        let Some(required) = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
        else {
            continue;
        };
        let mut pv_errors = Vec::new();
        let terms = required
            .node_selector_terms
            .iter()
            .enumerate()
            .map(|(t, term)| {
                let at = format!("spec.nodeAffinity.required.nodeSelectorTerms[{t}]");
                let mut term = node_selector_term(term, &at, &mut pv_errors);
                for r in &mut term.match_fields {
                    *r = against_empty_name(r);
                }
                term
            })
            .collect();
        for e in pv_errors {
            problem(format!(
                "persistentvolume {volume_name:?} has an unreadable {}: {}",
                e.field, e.message
            ));
        }
        out.push(NodeSelector { terms });
    }
    out
}

/// The claim a volume uses: (the volume's field, claim name, whether ephemeral).
fn claim_of(pod: &KubePod, vol: &KubeVolume, i: usize) -> Option<(String, String, bool)> {
    if let Some(pvc) = &vol.persistent_volume_claim {
        return Some((
            format!("spec.volumes[{i}].persistentVolumeClaim"),
            pvc.claim_name.clone(),
            false,
        ));
    }
    vol.ephemeral.as_ref()?;
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    Some((
        format!("spec.volumes[{i}].ephemeral"),
        format!("{pod_name}-{}", vol.name),
        true,
    ))
}

fn owned_by(claim: &PersistentVolumeClaim, pod: &KubePod) -> bool {
    let Some(uid) = pod.metadata.uid.as_deref() else {
        return false;
    };
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Whether the claim's StorageClass exists and waits for the first consumer. A claim without
/// a class, or naming one that does not exist, binds immediately (as kube-scheduler reads
/// it).
fn delays_binding(claim: &PersistentVolumeClaim, objects: &VolumeObjects<'_>) -> bool {
    let class = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEGACY_CLASS))
        .map(String::as_str)
        .or_else(|| {
            claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or("");
    !class.is_empty()
        && objects
            .classes
            .get(class)
            .is_some_and(|c| c.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER))
}

/// A `metadata.name` requirement as kube-scheduler evaluates a volume's affinity: against a
/// node with no name. Rewritten to a requirement that holds (or fails) for every real node,
/// whose names are never empty.
fn against_empty_name(r: &Requirement) -> Requirement {
    let has_empty = r.values.iter().any(String::is_empty);
    let holds = match r.operator {
        SelectorOp::In => has_empty,
        SelectorOp::NotIn => !has_empty,
        _ => false,
    };
    Requirement {
        key: NODE_NAME_FIELD.to_string(),
        operator: if holds {
            SelectorOp::NotIn
        } else {
            SelectorOp::In
        },
        values: vec![String::new()],
    }
}
