//! Which pods changed since a reader last looked: what lets a reader of a 50,000-pod cache
//! work in proportion to the changes instead of comparing every pod on each pass.
//!
//! The cache's pod watcher records each changed uid, under the store's write lock, in every
//! live [`PodLog`]; a reader takes the set under the read lock (see
//! [`super::cache::Cache::read_pod_changes`]), so what it takes is exactly what the store it
//! reads has changed since its last take. A relist (the first list, or a watch that had to
//! start over) replaces the whole table and marks every log [`Changed::All`].

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// What changed since the last take.
#[derive(Debug, Default, PartialEq, Eq)]
pub enum Changed {
    /// Anything may have: compare every pod (a new log, or after a relist).
    #[default]
    All,
    /// Only these uids (a uid absent from the store now is a pod that left).
    Pods(HashSet<String>),
}

impl Changed {
    fn note(&mut self, uid: &str) {
        if let Changed::Pods(uids) = self
            && !uids.contains(uid)
        {
            uids.insert(uid.to_owned());
        }
    }
}

/// One reader's record of the pods changed since it last took it; starts at
/// [`Changed::All`]. Dropping it unregisters it.
#[derive(Debug)]
pub struct PodLog {
    pending: Arc<Mutex<Changed>>,
}

impl PodLog {
    /// What changed since the last take, leaving an empty record.
    pub(super) fn take(&self) -> Changed {
        std::mem::replace(&mut *self.pending.lock(), Changed::Pods(HashSet::new()))
    }
}

/// The cache's side: every live log, to note changes in.
#[derive(Debug, Default)]
pub(super) struct Logs {
    readers: Mutex<Vec<Weak<Mutex<Changed>>>>,
}

impl Logs {
    /// A new log, registered here.
    pub(super) fn open(&self) -> PodLog {
        let pending = Arc::new(Mutex::new(Changed::All));
        self.readers.lock().push(Arc::downgrade(&pending));
        PodLog { pending }
    }

    /// Notes that the pod `uid` changed or left (call under the store's write lock).
    pub(super) fn changed(&self, uid: &str) {
        self.each(|c| c.note(uid));
    }

    /// Notes that the whole table was replaced (call under the store's write lock).
    pub(super) fn relisted(&self) {
        self.each(|c| *c = Changed::All);
    }

    fn each(&self, mut f: impl FnMut(&mut Changed)) {
        self.readers.lock().retain(|reader| match reader.upgrade() {
            Some(pending) => {
                f(&mut pending.lock());
                true
            }
            None => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_starts_at_all_then_collects_uids_until_taken() {
        let logs = Logs::default();
        let log = logs.open();
        logs.changed("a");
        assert_eq!(log.take(), Changed::All);
        assert_eq!(log.take(), Changed::Pods(HashSet::new()));
        logs.changed("a");
        logs.changed("b");
        logs.changed("a");
        assert_eq!(
            log.take(),
            Changed::Pods(["a".to_owned(), "b".to_owned()].into())
        );
        logs.changed("c");
        logs.relisted();
        logs.changed("d");
        assert_eq!(log.take(), Changed::All);
    }

    #[test]
    fn each_reader_has_its_own_record_and_a_dropped_one_is_forgotten() {
        let logs = Logs::default();
        let first = logs.open();
        first.take();
        let second = logs.open();
        logs.changed("a");
        assert_eq!(first.take(), Changed::Pods(["a".to_owned()].into()));
        assert_eq!(second.take(), Changed::All);
        drop(first);
        logs.changed("b");
        assert_eq!(logs.readers.lock().len(), 1);
        assert_eq!(second.take(), Changed::Pods(["b".to_owned()].into()));
    }
}
