//! Status writes beside the scheduling loop, never in its way.
//!
//! After each cycle the loop hands what users should see (pending pods' conditions,
//! nominations, PodGroup / Queue / Topology status) to one task as a [`StatusJob`] and goes
//! on binding. A job not yet started when the next one comes is replaced by it, so a slow API
//! server costs stale conditions for a moment, never a slower loop or a growing backlog; the
//! pods bound by the replaced job's cycle carry over (they count as scheduled in PodGroup
//! status and get no `Unschedulable` from an older picture). What the task writes about a pod
//! is conditional on the pod's version in the job (see `cluster::status`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::agent_gap::Overdue;
use super::cache::Store;
use super::status::StatusWriter;
use crate::translate::Translated;
use tessera_core::cycle::Decisions;

/// What one cycle leaves for the status writer.
pub(super) struct StatusJob {
    /// The leadership term the cycle ran in: the writer forgets what it wrote in an earlier
    /// term, since another replica may have written since.
    pub term: u64,
    /// The cache as the cycle read it.
    pub store: Store,
    /// The cycle's translated input (problems, warnings, the snapshot the core saw).
    pub translated: Translated,
    /// The core's decisions, pending pods and their explanations included.
    pub decisions: Decisions,
    /// Pods bound (or held for binding) by this cycle and any replaced one before it.
    pub bound: BTreeSet<String>,
    /// Pods waiting for their victims to go: uid → the node to nominate.
    pub waiting: BTreeMap<String, String>,
    /// Pods whose nomination is left as it is (decided, about to be bound).
    pub keep: BTreeSet<String>,
    /// Nodes whose missing agent messages may name.
    pub overdue: Overdue,
}

/// The one task writing status, and the slot holding its next job.
pub(super) struct StatusQueue {
    next: Arc<Mutex<Option<StatusJob>>>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

impl StatusQueue {
    /// Starts the task, writing with `writer` for `scheduler_name`'s pods.
    pub(super) fn start(mut writer: StatusWriter, scheduler_name: String) -> Self {
        let next: Arc<Mutex<Option<StatusJob>>> = Arc::default();
        let wake = Arc::new(Notify::new());
        let (slot, woken) = (Arc::clone(&next), Arc::clone(&wake));
        let task = tokio::spawn(async move {
            let mut term = None;
            loop {
                woken.notified().await;
                let Some(job) = slot.lock().take() else {
                    continue;
                };
                if term != Some(job.term) {
                    writer.forget();
                    term = Some(job.term);
                }
                writer
                    .nominations(&job.store, &scheduler_name, &job.waiting, &job.keep)
                    .await;
                writer
                    .update(
                        &job.store,
                        &job.translated,
                        &job.decisions,
                        &job.bound,
                        &job.overdue,
                    )
                    .await;
            }
        });
        Self { next, wake, task }
    }

    /// Queues `job`, replacing one not yet started (whose bound pods it takes over).
    pub(super) fn submit(&self, mut job: StatusJob) {
        let mut next = self.next.lock();
        if let Some(replaced) = next.take()
            && replaced.term == job.term
        {
            job.bound.extend(replaced.bound);
        }
        *next = Some(job);
        drop(next);
        self.wake.notify_one();
    }
}

impl Drop for StatusQueue {
    fn drop(&mut self) {
        self.task.abort();
    }
}
