//! Who holds which share of which GPU on this node.
//!
//! Every successful `Allocate` becomes an [`Allocation`]: the slots the kubelet handed
//! out, the GPUs with the memory and compute granted on each, the isolation mode its
//! limits are enforced in, and (when known) the pod, by UID, and container. What is recorded
//! at Allocate is never changed from a later pod list: a pod's owner cannot switch its
//! enforcement off or move its share by editing its annotations.
//!
//! The ledger is checkpointed as JSON under the state directory after every change (the
//! new text is written to a temporary file and fsynced, renamed over the old one, and the
//! directory fsynced, so a crash or power cut leaves the old or the new file, never half
//! of one or an empty one), and reconciled with the kubelet's pod-resources `List`, which
//! is the truth about which pod holds which slot. A checkpoint that is missing, empty or
//! not a ledger is logged, moved aside (`ledger.json.corrupt-<unix-ms>`) and the agent
//! starts empty; the reconcile rebuilds it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use tessera_contract::{Isolation, PodUid};

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
    /// The pod's namespace and name, once known (from the assignment source or from
    /// pod-resources): for display and for matching pod-resources, never as its identity.
    pub pod: Option<PodRef>,
    /// The pod's UID, once known: what the allocation belongs to. Checkpoints written before
    /// it was recorded have none; the reconcile fills it in from the assignment source once
    /// the kubelet shows the pod holding the allocation's slots.
    #[serde(default)]
    pub pod_uid: Option<PodUid>,
    /// The container, once known.
    pub container: Option<String>,
    /// How the container's limits (its `grants`) are enforced, fixed at Allocate: later
    /// changes to the pod's `tessera.dev/isolation` change nothing. Checkpoints written
    /// before it was recorded read as `watchdog`, the default mode.
    #[serde(default)]
    pub isolation: Isolation,
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

/// What GPU `uuid` has handed out to those of `allocations` holding none of `slots` (the
/// kubelet handing a slot out again proves its holder gone). The sums saturate: a checkpoint
/// edited by hand cannot make them wrap around to look free. Pure, so the Allocate matcher
/// computes it over the snapshot it decides on.
pub fn usage_of(allocations: &[Allocation], uuid: &str, slots: &[String]) -> GpuUsage {
    let mut usage = GpuUsage::default();
    for a in allocations {
        if a.slots.iter().any(|s| slots.contains(s)) {
            continue;
        }
        for g in a.grants.iter().filter(|g| g.uuid == uuid) {
            usage.memory_mib = usage.memory_mib.saturating_add(g.memory_mib);
            usage.compute_milli = usage.compute_milli.saturating_add(g.compute_milli);
            usage.whole |= a.is_whole();
            usage.holders += 1;
        }
    }
    usage
}

/// The node's ledger behind its one lock. Every part of the agent reaches the ledger through
/// [`LedgerLock::lock`], which counts acquisitions, so that a test can show how often a path
/// takes it (an `Allocate` decides and records under one acquisition).
#[derive(Debug, Default)]
pub struct LedgerLock {
    inner: Mutex<Ledger>,
    acquisitions: AtomicU64,
}

impl LedgerLock {
    /// `ledger` behind the lock.
    pub fn new(ledger: Ledger) -> Self {
        Self {
            inner: Mutex::new(ledger),
            acquisitions: AtomicU64::new(0),
        }
    }

    /// Locks the ledger (held only for short, non-async sections).
    pub fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
        self.inner.lock()
    }

    /// How many times the ledger has been locked so far.
    pub fn acquisitions(&self) -> u64 {
        self.acquisitions.load(Ordering::Relaxed)
    }
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
    /// Allocations whose pod, UID or container was learned or corrected.
    pub named: Vec<u64>,
    /// Containers the kubelet reports that the ledger did not know and did not adopt yet,
    /// each with why (`ns/name/container: reason`); a later reconcile looks again.
    pub waiting: Vec<String>,
}

impl ReconcileReport {
    /// Whether the ledger changed.
    pub fn changed(&self) -> bool {
        !(self.released.is_empty() && self.adopted.is_empty() && self.named.is_empty())
    }
}

/// How a container the kubelet lists, and the ledger does not know, is taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The UID of its pod, when the assignment source knows it.
    pub pod_uid: Option<PodUid>,
    /// What it holds.
    pub grants: Vec<Grant>,
    /// Why.
    pub origin: Origin,
    /// How its limits are enforced.
    pub isolation: Isolation,
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

/// Replaces `path` with `text` so that a crash or a power cut at any point leaves the old
/// file or the new one: the temporary file's data is on disk before the rename makes it
/// the checkpoint (else the rename can reach the disk first, leaving an empty file), and
/// the directory is synced after, so the rename itself is not lost.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Why a checkpoint could not be used, for the log.
fn unusable(text: &str, error: &serde_json::Error) -> String {
    if text.trim().is_empty() {
        "the file is empty".to_owned()
    } else {
        format!("not a ledger: {error}")
    }
}

/// Moves an unusable checkpoint out of the way, keeping it for a post-mortem; returns
/// where it went.
fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".corrupt-{}", now_unix_ms()));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(aside)
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

    /// Opens the checkpoint in `state_dir` (creating the directory). A missing, empty or
    /// unreadable checkpoint is logged (warn, naming the file and what was wrong) and the
    /// ledger starts empty, to be rebuilt by the reconcile with the kubelet; an empty or
    /// unreadable file is first moved aside (`ledger.json.corrupt-<unix-ms>`). Only a
    /// state directory that cannot be created is an error.
    pub fn open(state_dir: &Path) -> Result<Self, LedgerError> {
        std::fs::create_dir_all(state_dir).map_err(|source| LedgerError::Io {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let path = state_dir.join(CHECKPOINT_FILE);
        let file = match std::fs::read_to_string(&path) {
            Ok(text) => match serde_json::from_str::<LedgerFile>(&text) {
                Ok(mut file) => {
                    // A hand-edited file may carry ids above `next_id`: never hand one out twice.
                    let top = file.allocations.iter().map(|a| a.id).max().unwrap_or(0);
                    file.next_id = file.next_id.max(top);
                    file
                }
                Err(error) => {
                    let reason = unusable(&text, &error);
                    match move_aside(&path) {
                        Ok(aside) => tracing::warn!(
                            path = %path.display(), %reason, moved_to = %aside.display(),
                            "the ledger checkpoint cannot be used; moved aside, starting empty and \
                             rebuilding from the kubelet's pod-resources and the coordinator's assignments"
                        ),
                        Err(error) => tracing::warn!(
                            path = %path.display(), %reason, %error,
                            "the ledger checkpoint cannot be used nor moved aside; starting empty and \
                             rebuilding from the kubelet's pod-resources and the coordinator's assignments \
                             (the next checkpoint replaces it)"
                        ),
                    }
                    LedgerFile::default()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(
                    path = %path.display(),
                    "no ledger checkpoint (a first start on this node, or the state directory was lost); \
                     starting empty and rebuilding from the kubelet's pod-resources and the coordinator's assignments"
                );
                LedgerFile::default()
            }
            Err(error) => {
                tracing::warn!(
                    path = %path.display(), %error,
                    "cannot read the ledger checkpoint; starting empty and rebuilding from the kubelet's \
                     pod-resources and the coordinator's assignments (the next checkpoint replaces it)"
                );
                LedgerFile::default()
            }
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

    /// Drops the allocations with ids `ids` (an Allocate that recorded them failed after)
    /// and checkpoints; returns them.
    pub fn remove(&mut self, ids: &[u64]) -> Result<Vec<Allocation>, LedgerError> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.file.allocations)
            .into_iter()
            .partition(|a| ids.contains(&a.id));
        self.file.allocations = kept;
        if !gone.is_empty() {
            self.persist()?;
        }
        Ok(gone)
    }

    /// Drops every allocation of the pod with UID `uid` (it was deleted or finished) and
    /// checkpoints; returns them. A pod of the same name with another UID keeps its own.
    pub fn release_pod(&mut self, uid: &PodUid) -> Result<Vec<Allocation>, LedgerError> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.file.allocations)
            .into_iter()
            .partition(|a| a.pod_uid.as_ref() == Some(uid));
        self.file.allocations = kept;
        if !gone.is_empty() {
            self.persist()?;
        }
        Ok(gone)
    }

    /// What GPU `uuid` has handed out. The sums saturate: a checkpoint edited by hand
    /// cannot make them wrap around to look free.
    pub fn usage(&self, uuid: &str) -> GpuUsage {
        self.usage_except(uuid, &[])
    }

    /// What GPU `uuid` has handed out to allocations holding none of `slots` (the kubelet
    /// handing a slot out again proves its holder gone).
    pub fn usage_except(&self, uuid: &str, slots: &[String]) -> GpuUsage {
        usage_of(&self.file.allocations, uuid, slots)
    }

    /// Whether `container` of the pod with UID `uid` already has an allocation.
    pub fn has_container(&self, uid: &PodUid, container: &str) -> bool {
        self.file
            .allocations
            .iter()
            .any(|a| a.pod_uid.as_ref() == Some(uid) && a.container.as_deref() == Some(container))
    }

    /// Makes the ledger agree with the kubelet: names allocations after the pods that
    /// hold their slots (`uid_of` gives the UID of a pod the kubelet names, from the
    /// assignment source), releases allocations older than `grace_ms` whose slots no pod
    /// holds, and adopts listed containers the ledger does not know as `adopt` says, or
    /// leaves them for a later pass with the reason it gives.
    ///
    /// An allocation keeps the UID it has while the kubelet shows a pod of its name
    /// holding its slots: the slots prove it is the same pod, even when a newer pod of that
    /// name exists. A UID is learned only for an allocation that has none, or whose slots a
    /// pod of another name holds now.
    pub fn reconcile(
        &mut self,
        listed: &[ListedContainer],
        now_ms: u64,
        grace_ms: u64,
        uid_of: impl Fn(&PodRef) -> Option<PodUid>,
        adopt: impl Fn(&ListedContainer) -> Result<Adoption, String>,
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
                    let mut changed = false;
                    if a.pod.as_ref() != Some(&c.pod) {
                        a.pod = Some(c.pod.clone());
                        a.pod_uid = uid_of(&c.pod);
                        changed = true;
                    } else if a.pod_uid.is_none()
                        && let Some(uid) = uid_of(&c.pod)
                    {
                        a.pod_uid = Some(uid);
                        changed = true;
                    }
                    if a.container.as_deref() != Some(&c.container) {
                        a.container = Some(c.container.clone());
                        changed = true;
                    }
                    if changed {
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
            match adopt(c) {
                // The kubelet lists pods by name: slots a pod of this name holds while the
                // pod the source lists under it already has this container allocated are an
                // earlier pod's of the same name, not being torn down yet.
                Ok(Adoption {
                    pod_uid: Some(uid), ..
                }) if self.has_container(&uid, &c.container)
                    || adopted.iter().any(|a: &Allocation| {
                        a.pod_uid.as_ref() == Some(&uid)
                            && a.container.as_ref() == Some(&c.container)
                    }) =>
                {
                    report.waiting.push(format!(
                        "{}/{}: pod {uid} already holds this container's allocation; these slots are \
                         an earlier pod's of the same name",
                        c.pod, c.container
                    ));
                }
                Ok(how) => adopted.push(Allocation {
                    id: 0,
                    resource: c.resource.clone(),
                    slots: c.slots.clone(),
                    grants: how.grants,
                    pod: Some(c.pod.clone()),
                    pod_uid: how.pod_uid,
                    container: Some(c.container.clone()),
                    isolation: how.isolation,
                    origin: how.origin,
                    at_unix_ms: now_ms,
                }),
                Err(reason) => report
                    .waiting
                    .push(format!("{}/{}: {reason}", c.pod, c.container)),
            }
        }
        for mut a in adopted {
            self.file.next_id += 1;
            a.id = self.file.next_id;
            report.adopted.push(a.id);
            self.file.allocations.push(a);
        }
        if report.changed() {
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
            pod_uid: None,
            container: None,
            isolation: Isolation::Watchdog,
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

    fn uid_of(pod: &PodRef) -> Option<PodUid> {
        Some(PodUid::new(format!("uid-{}", pod.name)).unwrap())
    }

    #[test]
    fn checkpoint_survives_reopen_and_usage_adds_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path()).unwrap();
        ledger
            .insert(alloc(&["GPU-a-0"], "GPU-a", 500, Origin::Assigned, 1))
            .unwrap();
        let mut second = alloc(&["GPU-a-1"], "GPU-a", 250, Origin::Assigned, 1);
        second.pod_uid = Some(PodUid::new("uid-b").unwrap());
        second.isolation = Isolation::None;
        ledger.insert(second.clone()).unwrap();
        ledger.flush();
        let ledger = Ledger::open(dir.path()).unwrap();
        assert_eq!(ledger.allocations().len(), 2);
        assert_eq!(ledger.allocations()[1].pod_uid, second.pod_uid);
        assert_eq!(ledger.allocations()[1].isolation, Isolation::None);
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
    fn a_checkpoint_written_before_uids_and_isolation_loads_as_watchdog_without_uid() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(CHECKPOINT_FILE),
            r#"{"next_id":3,"allocations":[{"id":3,"resource":"nvidia.com/gpu","slots":["GPU-a-0"],
               "grants":[{"uuid":"GPU-a","memory_mib":100,"compute_milli":250}],
               "pod":{"namespace":"ml","name":"a"},"container":"main","origin":"assigned","at_unix_ms":1}]}"#,
        )
        .unwrap();
        let mut ledger = Ledger::open(dir.path()).unwrap();
        let a = &ledger.allocations()[0];
        assert_eq!(
            (a.pod_uid.clone(), a.isolation),
            (None, Isolation::Watchdog)
        );
        // The kubelet shows ml/a holding the slot: the UID is learned then.
        let report = ledger
            .reconcile(
                &[listed("ml", "a", &["GPU-a-0"])],
                10,
                0,
                uid_of,
                |_| unreachable!(),
            )
            .unwrap();
        assert_eq!(report.named, vec![3]);
        assert_eq!(
            ledger.allocations()[0].pod_uid,
            Some(PodUid::new("uid-a").unwrap())
        );
    }

    #[test]
    fn a_missing_empty_or_corrupt_checkpoint_is_moved_aside_and_the_ledger_starts_empty() {
        for text in [
            None,
            Some(""),
            Some("{not json"),
            Some(r#"{"next_id":"x"}"#),
        ] {
            let dir = tempfile::tempdir().unwrap();
            if let Some(text) = text {
                std::fs::write(dir.path().join(CHECKPOINT_FILE), text).unwrap();
            }
            let mut ledger = Ledger::open(dir.path()).unwrap();
            assert!(ledger.allocations().is_empty(), "{text:?}");
            let names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            let aside = names
                .iter()
                .filter(|n| n.starts_with("ledger.json.corrupt-"))
                .count();
            assert_eq!(aside, usize::from(text.is_some()), "{text:?}: {names:?}");
            // And it keeps working: the next checkpoint is a ledger again.
            ledger
                .insert(alloc(&["GPU-a-0"], "GPU-a", 500, Origin::Assigned, 1))
                .unwrap();
            ledger.flush();
            drop(ledger);
            assert_eq!(Ledger::open(dir.path()).unwrap().allocations().len(), 1);
        }
    }

    #[test]
    fn usage_saturates_instead_of_wrapping() {
        let mut ledger = Ledger::in_memory();
        for slot in ["GPU-a-0", "GPU-a-1"] {
            let mut a = alloc(&[slot], "GPU-a", u32::MAX, Origin::Assigned, 0);
            a.grants[0].memory_mib = u64::MAX;
            ledger.insert(a).unwrap();
        }
        let usage = ledger.usage("GPU-a");
        assert_eq!(
            (usage.memory_mib, usage.compute_milli),
            (u64::MAX, u32::MAX)
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
                    listed("ml", "unknown", &["GPU-b-1"]),
                ],
                10_000,
                1_000,
                uid_of,
                |c| {
                    if c.pod.name == "unknown" {
                        return Err("not listed".into());
                    }
                    assert_eq!(c.pod.name, "c");
                    Ok(Adoption {
                        pod_uid: uid_of(&c.pod),
                        grants: vec![Grant {
                            uuid: "GPU-b".into(),
                            memory_mib: 100,
                            compute_milli: 1000,
                        }],
                        origin: Origin::Recovered,
                        isolation: Isolation::Watchdog,
                    })
                },
            )
            .unwrap();
        assert_eq!(report.named, vec![named]);
        assert_eq!(report.released, vec![gone]);
        assert_eq!(report.adopted.len(), 1);
        assert_eq!(
            report.waiting,
            vec!["ml/unknown/main: not listed".to_owned()]
        );
        let ids: Vec<u64> = ledger.allocations().iter().map(|a| a.id).collect();
        assert_eq!(ids, vec![named, young, report.adopted[0]]);
        assert!(ledger.usage("GPU-b").whole);
        assert!(ledger.has_container(&PodUid::new("uid-a").unwrap(), "main"));
        assert!(!ledger.has_container(&PodUid::new("uid-unknown").unwrap(), "main"));
        // A second pass with the same truth changes nothing.
        let again = ledger
            .reconcile(
                &[
                    listed("ml", "a", &["GPU-a-0"]),
                    listed("ml", "c", &["GPU-b-0"]),
                ],
                10_000,
                1_000,
                uid_of,
                |_| unreachable!(),
            )
            .unwrap();
        assert_eq!(again, ReconcileReport::default());
    }

    #[test]
    fn an_allocation_keeps_its_uid_while_a_pod_of_its_name_holds_its_slots() {
        let mut ledger = Ledger::in_memory();
        let mut a = alloc(&["GPU-a-0"], "GPU-a", 500, Origin::Assigned, 0);
        a.pod = Some(PodRef::new("ml", "a"));
        a.pod_uid = Some(PodUid::new("first").unwrap());
        a.container = Some("main".into());
        ledger.insert(a).unwrap();
        // The source now lists another pod under that name: the slots say the holder is
        // still the one allocated.
        let report = ledger
            .reconcile(
                &[listed("ml", "a", &["GPU-a-0"])],
                0,
                0,
                |_| Some(PodUid::new("second").unwrap()),
                |_| unreachable!(),
            )
            .unwrap();
        assert!(!report.changed());
        assert_eq!(
            ledger.allocations()[0].pod_uid,
            Some(PodUid::new("first").unwrap())
        );
        // Released by its own UID only.
        assert!(
            ledger
                .release_pod(&PodUid::new("second").unwrap())
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            ledger
                .release_pod(&PodUid::new("first").unwrap())
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn slots_of_an_earlier_pod_of_the_same_name_are_not_adopted_for_the_current_one() {
        let mut ledger = Ledger::in_memory();
        let mut current = alloc(&["GPU-a-1"], "GPU-a", 500, Origin::Assigned, 0);
        current.pod = Some(PodRef::new("ml", "a"));
        current.pod_uid = Some(PodUid::new("uid-a").unwrap());
        current.container = Some("main".into());
        ledger.insert(current).unwrap();
        // The kubelet still lists the earlier ml/a (being torn down) holding another slot.
        let report = ledger
            .reconcile(
                &[
                    listed("ml", "a", &["GPU-a-1"]),
                    listed("ml", "a", &["GPU-a-0"]),
                ],
                0,
                0,
                uid_of,
                |c| {
                    Ok(Adoption {
                        pod_uid: uid_of(&c.pod),
                        grants: vec![],
                        origin: Origin::Assigned,
                        isolation: Isolation::Watchdog,
                    })
                },
            )
            .unwrap();
        assert!(report.adopted.is_empty(), "{report:?}");
        assert_eq!(report.waiting.len(), 1);
        assert_eq!(ledger.allocations().len(), 1);
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
