//! Writes decisions to the API server: one Binding per pod, carrying its assignment; evictions
//! through the Eviction API.
//!
//! A pod is placed by a single write: the Binding's `metadata.annotations` hold
//! `tessera.dev/assignment` and `tessera.dev/assigned-at`, and the API server copies them onto
//! the pod in the same update that sets `spec.nodeName`. An agent therefore never sees a pod
//! bound to its node without its assignment, and a refused Binding leaves nothing behind. The
//! Binding carries the pod's UID, which the server checks as a precondition: a pod deleted and
//! recreated under the same name since the decision is not bound.
//!
//! A unit (a gang, or a single pod) is bound member by member and stops at the first failure.
//! Undoing the members already bound is [`Binder::roll_back_unit`], the one rollback used for
//! every way a unit fails (a refused or unanswered Binding, a node that never cleared, a member
//! given up); the planner (`cluster::plan`) decides what to roll back.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ObjectMeta, Preconditions as MetaPreconditions,
};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::events::{self, EventKind, EventWriter};
use super::gate::NotLeading;
use tessera_contract::keys::{
    ASSIGNED_AT as ASSIGNED_AT_ANNOTATION, ASSIGNMENT as ASSIGNMENT_ANNOTATION,
};
use tessera_core::model::Assignment;

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
}

impl BindTarget {
    /// The same pod as an eviction target (for a rollback).
    pub fn evict_target(&self) -> EvictTarget {
        EvictTarget {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }
}

/// A pod to evict through the Eviction API, which keeps PodDisruptionBudgets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictTarget {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The UID the eviction is preconditioned on, so a new pod of the same name is never
    /// the one evicted.
    pub uid: String,
}

/// A Binding that did not go through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindFailure {
    /// The pod's UID.
    pub uid: String,
    /// What went wrong, for logs and status.
    pub error: String,
    /// No answer came (a timeout, a broken connection, a 5xx) and the pod could not be shown
    /// unbound: the server may still have bound it, or may bind it late. The caller watches
    /// for it and rolls it back if it shows up bound. `false` when the server refused the
    /// Binding (any 4xx, including 409 already bound or UID mismatch, 404 deleted and 429
    /// throttled): the pod is not bound by this call.
    pub maybe_bound: bool,
    /// This replica lost the Lease: the write gate ([`super::gate`]) did not send the Binding,
    /// and will send nothing more, rollbacks and events included.
    pub deposed: bool,
}

/// What became of one wave of a unit's Bindings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnitOutcome {
    /// UIDs bound, in order. On a failure these are still bound: the caller rolls them back.
    pub bound: Vec<String>,
    /// The first failure; the members after it were not tried.
    pub failed: Option<BindFailure>,
}

/// What became of a rollback.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollbackOutcome {
    /// UIDs evicted (or deleted past a disruption budget), or already gone.
    pub rolled_back: Vec<String>,
    /// UIDs the API server kept throttling, or whose eviction got no answer: still bound, to
    /// be rolled back again later.
    pub retry: Vec<String>,
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

/// How often a gang rollback retries a throttled eviction before handing the member back in
/// [`RollbackOutcome::retry`] (the scheduler tries again in later cycles), and the longest it
/// waits between two tries.
const ROLLBACK_TRIES: usize = 3;
const ROLLBACK_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long one Binding, eviction or deletion may go unanswered before it counts as failed,
/// unless set with [`Binder::with_call_timeout`]. The client has no read timeout of its own
/// (kube's default), and one hung call would stall the scheduling loop.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes bindings and evictions.
#[derive(Clone)]
pub struct Binder {
    client: kube::Client,
    events: EventWriter,
    call_timeout: Duration,
}

impl Binder {
    /// A binder writing through `client`, reporting through `events`.
    pub fn new(client: kube::Client, events: EventWriter) -> Self {
        Self {
            client,
            events,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// The same binder giving up on a Binding, eviction or deletion unanswered after `timeout`.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Binds every member of `wave` in order, each with its assignment in the Binding, and
    /// stops at the first failure (reported in an event on the pod). Nothing is rolled back
    /// here: the members bound so far stay in [`UnitOutcome::bound`] for the caller to hand to
    /// [`Binder::roll_back_unit`] together with what earlier waves bound.
    pub async fn bind_unit(&self, wave: &[BindTarget]) -> UnitOutcome {
        let mut outcome = UnitOutcome::default();
        let at = jiff::Timestamp::now().to_string();
        for t in wave {
            match self.bind(t, &at).await {
                Ok(()) => outcome.bound.push(t.uid.clone()),
                Err(failure) => {
                    if failure.deposed {
                        // No event either: it would not be sent.
                        outcome.failed = Some(failure);
                        return outcome;
                    }
                    self.report_failure(t, &failure.error).await;
                    outcome.failed = Some(failure);
                    break;
                }
            }
        }
        for t in wave.iter().filter(|t| outcome.bound.contains(&t.uid)) {
            self.events
                .publish(
                    &pod_object(&t.namespace, &t.name, &t.uid),
                    EventKind::Normal,
                    events::SCHEDULED,
                    &scheduled_message(t),
                )
                .await;
        }
        outcome
    }

    /// Undoes a unit that cannot run whole: evicts every member in `bound` (each only while it
    /// is still the pod with its UID), retrying throttled evictions a few times, and deletes a
    /// member a disruption budget protects (see [`Binder::evict_or_delete`]). Members it could
    /// not remove come back in [`RollbackOutcome::retry`].
    pub async fn roll_back_unit(&self, bound: &[EvictTarget], reason: &str) -> RollbackOutcome {
        let mut outcome = RollbackOutcome::default();
        for t in bound {
            match self.roll_back(t, reason).await {
                Ok(EvictOutcome::Throttled { .. }) => {
                    tracing::warn!(pod = %t.name, "the API server kept throttling the rollback of a gang member; it is tried again");
                    outcome.retry.push(t.uid.clone());
                }
                Ok(_) => outcome.rolled_back.push(t.uid.clone()),
                Err(e) => {
                    tracing::warn!(pod = %t.name, error = %e, "could not roll back a gang member; it is tried again");
                    outcome.retry.push(t.uid.clone());
                }
            }
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

    /// One Binding with the assignment in its annotations. An unanswered call is looked up:
    /// a pod found bound to `t.node` with this assignment was bound by it.
    async fn bind(&self, t: &BindTarget, at: &str) -> Result<(), BindFailure> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(t.name.clone()),
                namespace: Some(t.namespace.clone()),
                // The server's precondition: only the pod this decision was made for.
                uid: Some(t.uid.clone()),
                annotations: Some(BTreeMap::from([
                    (ASSIGNMENT_ANNOTATION.to_owned(), t.assignment.to_json()),
                    (ASSIGNED_AT_ANNOTATION.to_owned(), at.to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(t.node.clone()),
                ..ObjectReference::default()
            },
        };
        let pods = self.pods(&t.namespace);
        let params = PostParams::default();
        let call =
            pods.create_subresource::<_, serde_json::Value>("binding", &t.name, &params, &binding);
        let error = match tokio::time::timeout(self.call_timeout, call).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(kube::Error::Api(status))) if status.code < 500 => {
                return Err(BindFailure {
                    uid: t.uid.clone(),
                    error: format!(
                        "binding to {} refused ({} {}): {}",
                        t.node, status.code, status.reason, status.message
                    ),
                    maybe_bound: false,
                    deposed: false,
                });
            }
            Ok(Err(e)) if NotLeading::is(&e) => {
                return Err(BindFailure {
                    uid: t.uid.clone(),
                    error: e.to_string(),
                    maybe_bound: false,
                    deposed: true,
                });
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} s", self.call_timeout.as_secs_f32()),
        };
        match self.bound_by(t).await {
            Some(true) => {
                tracing::info!(pod = %t.name, %error, "a Binding went unanswered but the pod is bound as asked");
                Ok(())
            }
            Some(false) => Err(BindFailure {
                uid: t.uid.clone(),
                error: format!("binding to {}: {error}", t.node),
                // Not bound now; an unanswered request may still be applied late.
                maybe_bound: true,
                deposed: false,
            }),
            None => Err(BindFailure {
                uid: t.uid.clone(),
                error: format!(
                    "binding to {}: {error} (and the pod could not be read)",
                    t.node
                ),
                maybe_bound: true,
                deposed: false,
            }),
        }
    }

    /// Whether the pod `t` names is bound to `t.node` with `t.assignment`; `None` when it could
    /// not be read. A missing pod, or one of another UID, is not bound by this decision.
    async fn bound_by(&self, t: &BindTarget) -> Option<bool> {
        let pods = self.pods(&t.namespace);
        let read = pods.get_opt(&t.name);
        let pod = tokio::time::timeout(self.call_timeout, read)
            .await
            .ok()?
            .ok()?;
        let Some(pod) = pod else { return Some(false) };
        if pod.metadata.uid.as_deref() != Some(&t.uid) {
            return Some(false);
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let assignment = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
            .and_then(|text| Assignment::from_json(text).ok());
        Some(node == Some(t.node.as_str()) && assignment.as_ref() == Some(&t.assignment))
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
        let pods = self.pods(&t.namespace);
        let params = PostParams::default();
        let result = self
            .answered(pods.create_subresource::<_, serde_json::Value>(
                "eviction", &t.name, &params, &eviction,
            ))
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
    /// gang, the state the unit rollback exists to prevent. (Pods still Pending are never
    /// guarded by a budget; the server evicts them without one.)
    pub async fn evict_or_delete(
        &self,
        t: &EvictTarget,
        reason: &str,
    ) -> Result<EvictOutcome, kube::Error> {
        match self.evict(t, reason).await {
            Err(e) => match EvictionRefusal::of(&e) {
                Some(EvictionRefusal::DisruptionBudget) => {
                    let pods = self.pods(&t.namespace);
                    let params = same_pod(t);
                    let result = self.answered(pods.delete(&t.name, &params)).await;
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

    /// `call`, given up after the call timeout (as an error: the caller tries again later).
    async fn answered<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", self.call_timeout.as_secs_f32()),
            )))),
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

/// The `Scheduled` event's text: the node, and the GPUs with their share when fractional.
fn scheduled_message(t: &BindTarget) -> String {
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
    if gpus.is_empty() {
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
    }
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
