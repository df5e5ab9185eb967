//! Writes decisions to the API server: the assignment annotation, then the Binding; evictions
//! through the Eviction API.
//!
//! A unit (a gang, or a single pod) is written in two passes: every member's
//! `tessera.dev/assignment` first, then every Binding. If any call fails, the members not yet
//! bound stay unbound and the ones already bound are evicted again, so no partial gang runs.
//! A member whose patch went through but whose Binding did not keeps a stale annotation; it is
//! harmless (the agent reads only pods bound to its node) and the next decision overwrites it.

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ObjectMeta, Preconditions as MetaPreconditions,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

use super::events::{self, EventKind, EventWriter};
use super::{ASSIGNED_AT_ANNOTATION, ASSIGNMENT_ANNOTATION};
use crate::model::Assignment;

/// One pod to bind.
#[derive(Clone, Debug, PartialEq)]
pub struct BindTarget {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (a precondition of every write, so a recreated pod of the same name is untouched).
    pub uid: String,
    /// Target node.
    pub node: String,
    /// The exact GPU assignment.
    pub assignment: Assignment,
    /// The resourceVersion the decision was made on: the assignment write is refused (409)
    /// when the pod changed since, e.g. another replica bound it.
    pub resource_version: Option<String>,
    /// The assignment annotation is already written (by [`Binder::annotate`]); only the
    /// Binding remains.
    pub annotated: bool,
}

/// A pod to evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictTarget {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// What became of a unit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnitOutcome {
    /// UIDs bound (and left bound).
    pub bound: Vec<String>,
    /// The first failure: the pod's UID and the error text.
    pub failed: Option<(String, String)>,
    /// UIDs bound during this unit and evicted again because another member failed.
    pub rolled_back: Vec<String>,
    /// UIDs bound during this unit whose rollback eviction the API server kept throttling
    /// (429 without a disruption-budget cause): still bound, not in `rolled_back`, to be
    /// evicted again later.
    pub rollback_throttled: Vec<String>,
}

/// How an eviction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The API accepted the eviction.
    Evicted,
    /// The pod was already gone (or replaced by another pod of the same name).
    Gone,
    /// The API server answered 429 without a disruption-budget cause (API Priority and
    /// Fairness throttling): nothing happened to the pod, and the call must be made again
    /// later, after `retry_after_seconds` when the server suggested a delay (0 when not).
    Throttled {
        /// The server's suggested delay (`details.retryAfterSeconds`).
        retry_after_seconds: u32,
    },
}

/// Why the API server refused an eviction with 429 Too Many Requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionRefusal {
    /// A PodDisruptionBudget does not allow the disruption: the eviction REST handler adds a
    /// `details.causes` entry with reason `DisruptionBudget` (policy/v1 `DisruptionBudgetCause`)
    /// to every such answer, including "the budget is still being processed".
    DisruptionBudget,
    /// Any other 429, in practice API Priority and Fairness throttling the request before it
    /// reached the eviction handler. Says nothing about the pod; the call is to be retried.
    Throttled {
        /// The server's suggested delay (`details.retryAfterSeconds`), 0 when absent.
        retry_after_seconds: u32,
    },
}

impl EvictionRefusal {
    /// Classifies an API error; `None` when it is not a 429.
    pub fn of(error: &kube::Error) -> Option<Self> {
        match error {
            kube::Error::Api(status) => Self::of_status(status),
            _ => None,
        }
    }

    /// Classifies a Status answer; `None` when it is not a 429.
    pub fn of_status(status: &kube::core::Status) -> Option<Self> {
        if status.code != 429 {
            return None;
        }
        let details = status.details.as_ref();
        if details.is_some_and(|d| d.causes.iter().any(|c| c.reason == DISRUPTION_BUDGET_CAUSE)) {
            return Some(Self::DisruptionBudget);
        }
        Some(Self::Throttled {
            retry_after_seconds: details.map_or(0, |d| d.retry_after_seconds),
        })
    }
}

/// `policy/v1.DisruptionBudgetCause`, the cause the eviction handler puts on a budget refusal.
const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";

/// How often a gang rollback retries a throttled eviction before leaving the member to the
/// next cycle (the stale-gang eviction), and the longest it waits between two tries.
const ROLLBACK_TRIES: usize = 3;
const ROLLBACK_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes bindings and evictions.
#[derive(Clone)]
pub struct Binder {
    client: kube::Client,
    events: EventWriter,
}

impl Binder {
    /// A binder writing through `client`, reporting through `events`.
    pub fn new(client: kube::Client, events: EventWriter) -> Self {
        Self { client, events }
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Writes the assignment annotation of every target; on the first failure stops and
    /// returns the pod's UID and the error (with an event on the pod).
    pub async fn annotate(&self, targets: &[BindTarget]) -> Result<(), (String, String)> {
        let at = jiff::Timestamp::now().to_string();
        for t in targets {
            if let Err(e) = self.write_assignment(t, &at).await {
                self.report_failure(t, &e.to_string()).await;
                return Err((
                    t.uid.clone(),
                    format!("writing {ASSIGNMENT_ANNOTATION}: {e}"),
                ));
            }
        }
        Ok(())
    }

    /// Writes the assignment annotations of every member, then binds each; on the first
    /// failure binds nothing more and evicts the members bound so far.
    pub async fn bind_unit(&self, unit: &[BindTarget]) -> UnitOutcome {
        let mut outcome = UnitOutcome::default();
        let at = jiff::Timestamp::now().to_string();
        for t in unit.iter().filter(|t| !t.annotated) {
            if let Err(e) = self.write_assignment(t, &at).await {
                outcome.failed = Some((
                    t.uid.clone(),
                    format!("writing {ASSIGNMENT_ANNOTATION}: {e}"),
                ));
                self.report_failure(t, &e.to_string()).await;
                return outcome;
            }
        }
        for t in unit {
            match self.bind(t).await {
                Ok(()) => outcome.bound.push(t.uid.clone()),
                Err(e) => {
                    outcome.failed = Some((t.uid.clone(), format!("binding to {}: {e}", t.node)));
                    self.report_failure(t, &e.to_string()).await;
                    break;
                }
            }
        }
        if outcome.failed.is_some() && !outcome.bound.is_empty() {
            let failed = outcome
                .failed
                .as_ref()
                .map(|f| f.0.clone())
                .unwrap_or_default();
            let failed_name = unit
                .iter()
                .find(|t| t.uid == failed)
                .map(|t| format!("{}/{}", t.namespace, t.name))
                .unwrap_or(failed);
            let reason = format!(
                "gang member {failed_name} could not be bound; evicting the members already bound so no partial gang runs"
            );
            for uid in std::mem::take(&mut outcome.bound) {
                let Some(t) = unit.iter().find(|t| t.uid == uid) else {
                    continue;
                };
                let target = EvictTarget {
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    uid: t.uid.clone(),
                };
                // A refused eviction (disruption budget) must not leave a partial gang.
                match self.roll_back(&target, &reason).await {
                    Ok(EvictOutcome::Throttled { .. }) => {
                        tracing::warn!(pod = %t.name, "the API server kept throttling the rollback of a gang member; it is evicted later");
                        outcome.rollback_throttled.push(uid);
                    }
                    Ok(_) => outcome.rolled_back.push(uid),
                    Err(e) => {
                        tracing::warn!(pod = %t.name, error = %e, "could not roll back a gang member");
                        outcome.rolled_back.push(uid);
                    }
                }
            }
        }
        for t in unit.iter().filter(|t| outcome.bound.contains(&t.uid)) {
            let gpus: Vec<String> = t
                .assignment
                .slices()
                .map(|s| {
                    if s.compute_milli >= 1000 {
                        s.uuid.clone()
                    } else {
                        format!("{} ({}‰, {} MiB)", s.uuid, s.compute_milli, s.memory_mib)
                    }
                })
                .collect();
            let message = if gpus.is_empty() {
                format!(
                    "Successfully assigned {}/{} to {}",
                    t.namespace, t.name, t.node
                )
            } else {
                format!(
                    "Successfully assigned {}/{} to {} with GPUs {}",
                    t.namespace,
                    t.name,
                    t.node,
                    gpus.join(", ")
                )
            };
            self.events
                .publish(
                    &pod_object(&t.namespace, &t.name, &t.uid),
                    EventKind::Normal,
                    events::SCHEDULED,
                    &message,
                )
                .await;
        }
        outcome
    }

    async fn report_failure(&self, t: &BindTarget, error: &str) {
        self.events
            .publish(
                &pod_object(&t.namespace, &t.name, &t.uid),
                EventKind::Warning,
                events::BIND_FAILED,
                &format!("binding to node {} failed: {error}", t.node),
            )
            .await;
    }

    async fn write_assignment(&self, t: &BindTarget, at: &str) -> Result<(), kube::Error> {
        // The resourceVersion makes the write conditional: a pod bound (or recreated under the
        // same name) since the snapshot must never get a new assignment, or its agent could
        // read GPUs that belong to another decision.
        let mut metadata = json!({"annotations": {
            ASSIGNMENT_ANNOTATION: t.assignment.to_json(),
            ASSIGNED_AT_ANNOTATION: at,
        }});
        if let Some(rv) = &t.resource_version {
            metadata["resourceVersion"] = json!(rv);
        }
        let patch = json!({ "metadata": metadata });
        self.pods(&t.namespace)
            .patch(&t.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }

    async fn bind(&self, t: &BindTarget) -> Result<(), kube::Error> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(t.name.clone()),
                namespace: Some(t.namespace.clone()),
                uid: Some(t.uid.clone()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(t.node.clone()),
                ..ObjectReference::default()
            },
        };
        let _: serde_json::Value = self
            .pods(&t.namespace)
            .create_subresource("binding", &t.name, &PostParams::default(), &binding)
            .await?;
        Ok(())
    }

    /// Evicts a pod through the Eviction API (policy/v1), only if it is still the pod with
    /// `t.uid`, and writes an `Evicted` event with `reason`.
    ///
    /// The Eviction is built here rather than with kube's `Api::evict`: kube-core 5 serialises
    /// its delete options as `delete_options`, a field the API server does not know and drops,
    /// and with it the UID precondition — a recreated pod of the same name would be evicted.
    pub async fn evict(&self, t: &EvictTarget, reason: &str) -> Result<EvictOutcome, kube::Error> {
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(t.name.clone()),
                namespace: Some(t.namespace.clone()),
                ..ObjectMeta::default()
            },
            delete_options: Some(DeleteOptions {
                preconditions: Some(MetaPreconditions {
                    uid: Some(t.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteOptions::default()
            }),
        };
        let result: Result<serde_json::Value, kube::Error> = self
            .pods(&t.namespace)
            .create_subresource("eviction", &t.name, &PostParams::default(), &eviction)
            .await;
        self.settle(t, reason, result.map(drop)).await
    }

    /// [`Binder::evict_or_delete`], tried again a few times while the API server throttles it.
    async fn roll_back(&self, t: &EvictTarget, reason: &str) -> Result<EvictOutcome, kube::Error> {
        let mut tries = 1;
        loop {
            let outcome = self.evict_or_delete(t, reason).await;
            let Ok(EvictOutcome::Throttled {
                retry_after_seconds,
            }) = outcome
            else {
                return outcome;
            };
            if tries >= ROLLBACK_TRIES {
                return outcome;
            }
            tries += 1;
            let wait = std::time::Duration::from_secs(retry_after_seconds.into())
                .clamp(std::time::Duration::from_millis(200), ROLLBACK_MAX_WAIT);
            tokio::time::sleep(wait).await;
        }
    }

    /// Evicts; when a disruption budget refuses the eviction, deletes the pod. A 429 that is
    /// not a budget refusal (API Priority and Fairness throttling) deletes nothing and comes
    /// back as [`EvictOutcome::Throttled`]: the caller tries again later.
    ///
    /// Deleting past a budget is deliberate and only used to roll back a gang member bound
    /// moments ago in the same unit: a budget protects a running workload's availability, and
    /// this member is part of a gang that cannot run whole, so it does no useful work and
    /// holds GPUs the rest of its gang (and others) wait for. Leaving it would be a partial
    /// gang, the state the two-pass bind exists to prevent. (Pods still Pending are never
    /// guarded by a budget; the server evicts them without one.)
    pub async fn evict_or_delete(
        &self,
        t: &EvictTarget,
        reason: &str,
    ) -> Result<EvictOutcome, kube::Error> {
        match self.evict(t, reason).await {
            Err(e) => match EvictionRefusal::of(&e) {
                Some(EvictionRefusal::DisruptionBudget) => {
                    let result = self.pods(&t.namespace).delete(&t.name, &same_pod(t)).await;
                    self.settle(t, reason, result.map(drop)).await
                }
                Some(EvictionRefusal::Throttled {
                    retry_after_seconds,
                }) => Ok(EvictOutcome::Throttled {
                    retry_after_seconds,
                }),
                None => Err(e),
            },
            other => other,
        }
    }

    /// Turns the answer to an eviction or deletion into an outcome, with an Event when
    /// the pod went.
    async fn settle(
        &self,
        t: &EvictTarget,
        reason: &str,
        result: Result<(), kube::Error>,
    ) -> Result<EvictOutcome, kube::Error> {
        match result {
            Ok(()) => {
                self.events
                    .publish(
                        &pod_object(&t.namespace, &t.name, &t.uid),
                        EventKind::Normal,
                        events::EVICTED,
                        reason,
                    )
                    .await;
                Ok(EvictOutcome::Evicted)
            }
            // Gone already, or the name now belongs to a new pod (uid precondition).
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(EvictOutcome::Gone),
            Err(e) => Err(e),
        }
    }
}

/// Delete options that only touch the pod with this uid, never a successor of the same name.
fn same_pod(t: &EvictTarget) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(t.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

fn pod_object(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    events::pod_ref(namespace, name, uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::core::response::{StatusCause, StatusDetails};

    fn too_many(causes: Vec<StatusCause>, retry_after_seconds: u32) -> Status {
        Status::failure(
            "Too many requests, please try again later.",
            "TooManyRequests",
        )
        .with_code(429)
        .with_details(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes,
            retry_after_seconds,
        })
    }

    #[test]
    fn a_429_without_a_budget_cause_is_throttling() {
        // What API Priority and Fairness answers: no causes, a retry-after.
        let apf = too_many(Vec::new(), 1);
        assert_eq!(
            EvictionRefusal::of(&kube::Error::Api(apf.boxed())),
            Some(EvictionRefusal::Throttled {
                retry_after_seconds: 1
            })
        );
        // No details at all.
        let bare = Status::failure("slow down", "TooManyRequests").with_code(429);
        assert_eq!(
            EvictionRefusal::of_status(&bare),
            Some(EvictionRefusal::Throttled {
                retry_after_seconds: 0
            })
        );
        // A cause, but another one.
        let other = too_many(
            vec![StatusCause {
                reason: "FieldValueInvalid".into(),
                message: "x".into(),
                field: String::new(),
            }],
            0,
        );
        assert!(matches!(
            EvictionRefusal::of_status(&other),
            Some(EvictionRefusal::Throttled { .. })
        ));
    }

    #[test]
    fn a_429_with_the_budget_cause_is_a_budget_refusal() {
        let pdb = too_many(
            vec![StatusCause {
                reason: DISRUPTION_BUDGET_CAUSE.into(),
                message: "The disruption budget b needs 1 healthy pods and has 1 currently".into(),
                field: String::new(),
            }],
            0,
        );
        assert_eq!(
            EvictionRefusal::of_status(&pdb),
            Some(EvictionRefusal::DisruptionBudget)
        );
        // The same cause on another code is no 429 refusal.
        let forbidden = Status { code: 403, ..pdb };
        assert_eq!(EvictionRefusal::of_status(&forbidden), None);
    }
}
