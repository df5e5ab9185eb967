//! Who holds which share of which GPU on this node.
//!
//! Every successful `Allocate` becomes an [`Allocation`]: the slots the kubelet handed
//! out, the GPUs with the memory and compute granted on each, and (when known) the pod
//! and container. The ledger is checkpointed as JSON under the state directory after
//! every change (write to a temporary file, then rename, so a crash leaves the old or
//! the new file, never half of one), and reconciled with the kubelet's pod-resources
//! `List`, which is the truth about which pod holds which slot.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

/// File name of the checkpoint inside the state directory.
pub const CHECKPOINT_FILE: &str = "ledger.json";

/// Failures to read or write the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The file could not be read or written.
    #[error("ledger checkpoint {path}: {source}")]
    Io {
        /// The checkpoint, `ledger.json` in the agent's `--state-dir`.
        path: PathBuf,
        /// Why reading or (atomically) replacing it failed.
        source: std::io::Error,
    },
    /// The file exists but is not a ledger.
    #[error("ledger checkpoint {path} is not valid: {reason} (move it away to start empty)")]
    Corrupt {
        /// The checkpoint, `ledger.json` in the agent's `--state-dir`.
        path: PathBuf,
        /// What the JSON parser refused, with line and column.
        reason: String,
    },
}

/// A pod by namespace and name.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl PodRef {
    /// A reference to pod `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The share of one GPU given to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// GPU UUID.
    pub uuid: String,
    /// Memory limit in MiB.
    pub memory_mib: u64,
    /// Compute share in milli-GPU (1000 = the whole GPU).
    pub compute_milli: u32,
}

/// Why a container holds what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The coordinator's assignment for the pod.
    Assigned,
    /// Whole free GPUs for a pod without an assignment.
    Whole,
    /// Re-learned from the kubelet after the checkpoint was lost.
    Recovered,
}

/// One container's allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// Ledger-unique id.
    pub id: u64,
    /// Resource name (`nvidia.com/gpu`, `nvidia.com/mig-1g.5gb`).
    pub resource: String,
    /// Device ids the kubelet handed out.
    pub slots: Vec<String>,
    /// What the container got on each GPU.
    pub grants: Vec<Grant>,
    /// The pod, once known (from the assignment or from pod-resources).
    pub pod: Option<PodRef>,
    /// The container, once known.
    pub container: Option<String>,
    /// Why.
    pub origin: Origin,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

impl Allocation {
    /// Whether the container holds whole GPUs (nobody may share them).
    pub fn is_whole(&self) -> bool {
        self.origin == Origin::Whole
            || (self.origin == Origin::Recovered
                && self.grants.iter().all(|g| g.compute_milli >= 1000))
    }
}

/// What one GPU has handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Memory granted, MiB.
    pub memory_mib: u64,
    /// Compute granted, milli-GPU.
    pub compute_milli: u32,
    /// Some holder has the GPU whole.
    pub whole: bool,
    /// Number of holders.
    pub holders: usize,
}

/// One container as the kubelet's pod-resources `List` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedContainer {
    /// Namespace and name of the pod, as the kubelet reports it.
    pub pod: PodRef,
    /// Name of the container within that pod.
    pub container: String,
    /// Resource name.
    pub resource: String,
    /// Device ids it holds of that resource.
    pub slots: Vec<String>,
}

/// What [`Ledger::reconcile`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Allocations whose pod the kubelet no longer reports (released).
    pub released: Vec<u64>,
    /// Containers the kubelet reports that the ledger did not know (adopted).
    pub adopted: Vec<u64>,
    /// Allocations whose pod or container was learned or corrected.
    pub named: Vec<u64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LedgerFile {
    next_id: u64,
    allocations: Vec<Allocation>,
}

/// Who holds which share of which GPU on this node, checkpointed as JSON so that an agent
/// restart gives running pods back exactly what they held.
#[derive(Debug, Default)]
pub struct Ledger {
    path: Option<PathBuf>,
    file: LedgerFile,
    writer: Option<Arc<Writer>>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Writes checkpoints off the Allocate path. On ext4 a write-then-rename costs
/// milliseconds (the rename forces the data out), which would dominate Allocate; the
/// writer coalesces bursts and keeps only the newest text. A crash can lose the last
/// few milliseconds of changes, which the start-up reconcile re-learns from the
/// kubelet's pod-resources API (the kubelet checkpoints device assignments itself).
#[derive(Debug, Default)]
struct Writer {
    state: Mutex<WriterState>,
    cond: Condvar,
}

#[derive(Debug, Default)]
struct WriterState {
    /// Newest text not yet written, with its generation.
    pending: Option<(u64, String)>,
    queued: u64,
    written: u64,
}

impl Writer {
    fn start(path: PathBuf) -> Arc<Self> {
        let writer = Arc::new(Self::default());
        let weak = Arc::downgrade(&writer);
        std::thread::spawn(move || {
            loop {
                let Some(w) = weak.upgrade() else { return };
                let job = {
                    let mut st = w.state.lock();
                    if st.pending.is_none() {
                        w.cond
                            .wait_for(&mut st, std::time::Duration::from_millis(200));
                    }
                    st.pending.take()
                };
                if let Some((generation, text)) = job {
                    if let Err(error) = write_atomically(&path, &text) {
                        tracing::error!(path = %path.display(), %error, "cannot write the ledger checkpoint");
                    }
                    w.state.lock().written = generation;
                    w.cond.notify_all();
                }
            }
        });
        writer
    }

    fn submit(&self, text: String) {
        let mut st = self.state.lock();
        st.queued += 1;
        st.pending = Some((st.queued, text));
        self.cond.notify_all();
    }

    fn flush(&self) {
        let mut st = self.state.lock();
        let target = st.queued;
        while st.written < target {
            self.cond
                .wait_for(&mut st, std::time::Duration::from_millis(50));
        }
    }
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Ledger {
    /// A ledger that is never written to disk (tests).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Opens the checkpoint in `state_dir` (creating the directory), starting empty
    /// when there is none.
    pub fn open(state_dir: &Path) -> Result<Self, LedgerError> {
        std::fs::create_dir_all(state_dir).map_err(|source| LedgerError::Io {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let path = state_dir.join(CHECKPOINT_FILE);
        let file = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| LedgerError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LedgerFile::default(),
            Err(source) => return Err(LedgerError::Io { path, source }),
        };
        Ok(Self {
            writer: Some(Writer::start(path.clone())),
            path: Some(path),
            file,
        })
    }

    fn persist(&self) -> Result<(), LedgerError> {
        // Serialising plain strings and integers cannot fail.
        let text = serde_json::to_string_pretty(&self.file).unwrap_or_default();
        match (&self.writer, &self.path) {
            (Some(writer), _) => writer.submit(text),
            (None, Some(path)) => {
                write_atomically(path, &text).map_err(|source| LedgerError::Io {
                    path: path.clone(),
                    source,
                })?
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// Waits until every change so far is in the checkpoint file.
    pub fn flush(&self) {
        if let Some(writer) = &self.writer {
            writer.flush();
        }
    }

    /// All allocations, oldest first.
    pub fn allocations(&self) -> &[Allocation] {
        &self.file.allocations
    }

    /// Records a new allocation (its `id` is assigned here) and checkpoints.
    pub fn insert(&mut self, mut allocation: Allocation) -> Result<u64, LedgerError> {
        self.file.next_id += 1;
        allocation.id = self.file.next_id;
        self.file.allocations.push(allocation);
        self.persist()?;
        Ok(self.file.next_id)
    }

    /// Drops every allocation holding any of `slots` (the kubelet handing a slot out
    /// again proves its previous holder is gone) and checkpoints; returns them.
    pub fn remove_holding(&mut self, slots: &[String]) -> Result<Vec<Allocation>, LedgerError> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.file.allocations)
            .into_iter()
            .partition(|a| a.slots.iter().any(|s| slots.contains(s)));
        self.file.allocations = kept;
        if !gone.is_empty() {
            self.persist()?;
        }
        Ok(gone)
    }

    /// Drops every allocation of `pod` (it was deleted or finished) and checkpoints;
    /// returns them.
    pub fn release_pod(&mut self, pod: &PodRef) -> Result<Vec<Allocation>, LedgerError> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.file.allocations)
            .into_iter()
            .partition(|a| a.pod.as_ref() == Some(pod));
        self.file.allocations = kept;
        if !gone.is_empty() {
            self.persist()?;
        }
        Ok(gone)
    }

    /// What GPU `uuid` has handed out.
    pub fn usage(&self, uuid: &str) -> GpuUsage {
        let mut usage = GpuUsage::default();
        for a in &self.file.allocations {
            for g in a.grants.iter().filter(|g| g.uuid == uuid) {
                usage.memory_mib += g.memory_mib;
                usage.compute_milli += g.compute_milli;
                usage.whole |= a.is_whole();
                usage.holders += 1;
            }
        }
        usage
    }

    /// Whether `container` of `pod` already has an allocation.
    pub fn has_container(&self, pod: &PodRef, container: &str) -> bool {
        self.file
            .allocations
            .iter()
            .any(|a| a.pod.as_ref() == Some(pod) && a.container.as_deref() == Some(container))
    }

    /// Makes the ledger agree with the kubelet: names allocations after the pods that
    /// hold their slots, releases allocations older than `grace_ms` whose slots no pod
    /// holds, and adopts listed containers the ledger does not know, with grants from
    /// `grants_for` (the pod's assignment, or whole GPUs).
    pub fn reconcile(
        &mut self,
        listed: &[ListedContainer],
        now_ms: u64,
        grace_ms: u64,
        grants_for: impl Fn(&ListedContainer) -> (Vec<Grant>, Origin),
    ) -> Result<ReconcileReport, LedgerError> {
        let mut report = ReconcileReport::default();
        let mut known: BTreeSet<&str> = BTreeSet::new();
        let mut kept = Vec::new();
        for mut a in std::mem::take(&mut self.file.allocations) {
            let holder = listed
                .iter()
                .find(|c| c.resource == a.resource && a.slots.iter().any(|s| c.slots.contains(s)));
            match holder {
                Some(c) => {
                    if a.pod.as_ref() != Some(&c.pod)
                        || a.container.as_deref() != Some(&c.container)
                    {
                        a.pod = Some(c.pod.clone());
                        a.container = Some(c.container.clone());
                        report.named.push(a.id);
                    }
                    kept.push(a);
                }
                None if now_ms.saturating_sub(a.at_unix_ms) < grace_ms => kept.push(a),
                None => report.released.push(a.id),
            }
        }
        self.file.allocations = kept;
        for a in &self.file.allocations {
            known.extend(a.slots.iter().map(String::as_str));
        }
        let mut adopted = Vec::new();
        for c in listed {
            if c.slots.is_empty() || c.slots.iter().any(|s| known.contains(s.as_str())) {
                continue;
            }
            let (grants, origin) = grants_for(c);
            adopted.push(Allocation {
                id: 0,
                resource: c.resource.clone(),
                slots: c.slots.clone(),
                grants,
                pod: Some(c.pod.clone()),
                container: Some(c.container.clone()),
                origin,
                at_unix_ms: now_ms,
            });
        }
        for mut a in adopted {
            self.file.next_id += 1;
            a.id = self.file.next_id;
            report.adopted.push(a.id);
            self.file.allocations.push(a);
        }
        if report != ReconcileReport::default() {
            self.persist()?;
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(slots: &[&str], uuid: &str, milli: u32, origin: Origin, at: u64) -> Allocation {
        Allocation {
            id: 0,
            resource: "nvidia.com/gpu".into(),
            slots: slots.iter().map(|s| (*s).to_owned()).collect(),
            grants: vec![Grant {
                uuid: uuid.into(),
                memory_mib: u64::from(milli) * 10,
                compute_milli: milli,
            }],
            pod: None,
            container: None,
            origin,
            at_unix_ms: at,
        }
    }

    fn listed(ns: &str, name: &str, slots: &[&str]) -> ListedContainer {
        ListedContainer {
            pod: PodRef::new(ns, name),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            slots: slots.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn checkpoint_survives_reopen_and_usage_adds_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path()).unwrap();
        ledger
            .insert(alloc(&["GPU-a-0"], "GPU-a", 500, Origin::Assigned, 1))
            .unwrap();
        ledger
            .insert(alloc(&["GPU-a-1"], "GPU-a", 250, Origin::Assigned, 1))
            .unwrap();
        ledger.flush();
        let ledger = Ledger::open(dir.path()).unwrap();
        assert_eq!(ledger.allocations().len(), 2);
        let usage = ledger.usage("GPU-a");
        assert_eq!(
            (
                usage.memory_mib,
                usage.compute_milli,
                usage.whole,
                usage.holders
            ),
            (7500, 750, false, 2)
        );
    }

    #[test]
    fn corrupt_checkpoint_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CHECKPOINT_FILE), "{not json").unwrap();
        let err = Ledger::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("is not valid") && err.contains("move it away"),
            "{err}"
        );
    }

    #[test]
    fn reconcile_names_releases_and_adopts() {
        let mut ledger = Ledger::in_memory();
        let named = ledger
            .insert(alloc(&["GPU-a-0"], "GPU-a", 500, Origin::Assigned, 0))
            .unwrap();
        let gone = ledger
            .insert(alloc(&["GPU-a-1"], "GPU-a", 250, Origin::Assigned, 0))
            .unwrap();
        let young = ledger
            .insert(alloc(&["GPU-a-2"], "GPU-a", 100, Origin::Assigned, 9_500))
            .unwrap();
        let report = ledger
            .reconcile(
                &[
                    listed("ml", "a", &["GPU-a-0"]),
                    listed("ml", "c", &["GPU-b-0"]),
                ],
                10_000,
                1_000,
                |c| {
                    assert_eq!(c.pod.name, "c");
                    (
                        vec![Grant {
                            uuid: "GPU-b".into(),
                            memory_mib: 100,
                            compute_milli: 1000,
                        }],
                        Origin::Recovered,
                    )
                },
            )
            .unwrap();
        assert_eq!(report.named, vec![named]);
        assert_eq!(report.released, vec![gone]);
        assert_eq!(report.adopted.len(), 1);
        let ids: Vec<u64> = ledger.allocations().iter().map(|a| a.id).collect();
        assert_eq!(ids, vec![named, young, report.adopted[0]]);
        assert!(ledger.usage("GPU-b").whole);
        assert!(ledger.has_container(&PodRef::new("ml", "a"), "main"));
        // A second pass with the same truth changes nothing.
        let again = ledger
            .reconcile(
                &[
                    listed("ml", "a", &["GPU-a-0"]),
                    listed("ml", "c", &["GPU-b-0"]),
                ],
                10_000,
                1_000,
                |_| unreachable!(),
            )
            .unwrap();
        assert_eq!(again, ReconcileReport::default());
    }

    #[test]
    fn handing_a_slot_out_again_drops_its_old_holder() {
        let mut ledger = Ledger::in_memory();
        ledger
            .insert(alloc(&["GPU-a-0"], "GPU-a", 1000, Origin::Whole, 0))
            .unwrap();
        let gone = ledger.remove_holding(&["GPU-a-0".to_owned()]).unwrap();
        assert_eq!(gone.len(), 1);
        assert!(ledger.allocations().is_empty());
    }
}
