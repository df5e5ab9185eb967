//! Creating and destroying MIG instances for `tessera.dev/isolation: mig` pods.
//!
//! With `--mig-create`, a pod assigned a share of a GPU in MIG mode gets a fresh GPU
//! instance (with one compute instance over all of it) of the smallest profile that
//! holds the share, placed by the [`planner`](super::planner). The instance belongs to
//! the ledger allocation it was made for; once that allocation is released (the pod is
//! gone) a sweep destroys it — unless processes still run in it: the agent never
//! destroys an instance in use. Instances the agent did not create are never touched,
//! and the MIG mode of a GPU is never changed.
//!
//! What was created is kept in `mig-instances.json` in the state directory, so a
//! restarted agent still cleans up after the pods it served.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::planner::{Span, choose_placement, fitting_profiles};
use crate::gpu::{GpuBackend, GpuDevice, GpuError, MigInstance};
use crate::ledger::{Allocation, now_unix_ms};

/// The file (in the state directory) listing the instances this agent created.
pub const STATE_FILE: &str = "mig-instances.json";

/// How long an instance may wait for its allocation to be recorded before a sweep
/// treats it as abandoned (an Allocate that died between creating and recording).
const UNBOUND_GRACE_MS: u64 = 120_000;

/// MIG settings (`--mig-create`).
#[derive(Debug, Clone)]
pub struct MigConfig {
    /// Create instances from free capacity for MIG pods (off: only advertise the
    /// instances that exist).
    pub create: bool,
    /// How often instances of departed pods are looked for.
    pub sweep_every: Duration,
}

impl Default for MigConfig {
    fn default() -> Self {
        Self {
            create: false,
            sweep_every: Duration::from_secs(5),
        }
    }
}

/// Why no instance could be made.
#[derive(Debug, thiserror::Error)]
pub enum MigError {
    /// The backend failed or refused.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The GPU is not in MIG mode (the agent never switches it).
    #[error("GPU {gpu} is not in MIG mode; the agent never changes the MIG mode")]
    NotMig {
        /// UUID of the GPU asked for.
        gpu: String,
    },
    /// No profile is large enough.
    #[error(
        "GPU {gpu} ({model}) has no MIG profile holding {memory_mib} MiB and {compute_milli} milli-GPU \
         (profiles: {profiles})"
    )]
    NoProfile {
        /// UUID of the GPU asked for.
        gpu: String,
        /// Its model.
        model: String,
        /// Memory wanted.
        memory_mib: u64,
        /// Compute wanted.
        compute_milli: u32,
        /// What the GPU offers.
        profiles: String,
    },
    /// Every fitting profile is blocked by existing instances.
    #[error("GPU {gpu} has no free slices for {wanted} (existing instances: {existing})")]
    Full {
        /// UUID of the GPU asked for.
        gpu: String,
        /// Profiles tried, smallest first.
        wanted: String,
        /// What occupies the GPU.
        existing: String,
    },
}

/// An instance this agent created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Created {
    /// UUID of the GPU the instance was carved from.
    pub gpu: String,
    /// The MIG device as the driver reported it after creation (UUID, profile, slices).
    pub instance: MigInstance,
    /// The ledger allocation it serves; `None` until the Allocate is recorded.
    pub allocation: Option<u64>,
    /// The slots of that allocation (to find it again after a restart).
    pub slots: Vec<String>,
    /// When it was created (ms since epoch).
    pub created_unix_ms: u64,
}

/// Creates and destroys the instances of MIG pods.
pub struct MigManager {
    backend: Arc<dyn GpuBackend>,
    created: Mutex<Vec<Created>>,
    /// Planning reads the occupancy and creation changes it: one at a time.
    creating: Mutex<()>,
    state_file: Option<PathBuf>,
}

impl MigManager {
    /// A manager over `backend`, remembering its instances in `state_dir` (none: in
    /// memory only).
    pub fn new(backend: Arc<dyn GpuBackend>, state_dir: Option<&Path>) -> Self {
        let state_file = state_dir.map(|d| d.join(STATE_FILE));
        let created = state_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|text| match serde_json::from_str::<Vec<Created>>(&text) {
                Ok(list) => Some(list),
                Err(error) => {
                    tracing::warn!(%error, "unreadable MIG instance list; starting empty");
                    None
                }
            })
            .unwrap_or_default();
        Self {
            backend,
            created: Mutex::new(created),
            creating: Mutex::new(()),
            state_file,
        }
    }

    /// Creates an instance on GPU `gpu` for a share of `memory_mib` and `compute_milli`
    /// going to the container holding `slots`. Blocking (NVML calls take a while): run
    /// it off the async threads.
    pub fn create_for(
        &self,
        gpu: &GpuDevice,
        memory_mib: u64,
        compute_milli: u32,
        slots: &[String],
    ) -> Result<MigInstance, MigError> {
        if gpu.mig.is_none() {
            return Err(MigError::NotMig {
                gpu: gpu.uuid.clone(),
            });
        }
        let _one_at_a_time = self.creating.lock();
        let table = self.backend.mig_profiles(&gpu.uuid)?;
        let fitting = fitting_profiles(&table, gpu.memory_total_mib, memory_mib, compute_milli);
        if fitting.is_empty() {
            return Err(MigError::NoProfile {
                gpu: gpu.uuid.clone(),
                model: gpu.model.clone(),
                memory_mib,
                compute_milli,
                profiles: table
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let existing = self.backend.mig_instances(&gpu.uuid)?;
        let occupied: Vec<Span> = existing.iter().map(Span::from).collect();
        for profile in &fitting {
            let Some(start) = choose_placement(&table, &occupied, profile) else {
                continue;
            };
            let instance = self.backend.mig_create(&gpu.uuid, profile.id, start)?;
            tracing::info!(
                gpu = %gpu.uuid,
                mig = %instance.uuid,
                profile = %instance.profile,
                start,
                "MIG instance created"
            );
            self.created.lock().push(Created {
                gpu: gpu.uuid.clone(),
                instance: instance.clone(),
                allocation: None,
                slots: slots.to_vec(),
                created_unix_ms: now_unix_ms(),
            });
            self.save();
            return Ok(instance);
        }
        Err(MigError::Full {
            gpu: gpu.uuid.clone(),
            wanted: fitting
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            existing: if existing.is_empty() {
                "none".to_owned()
            } else {
                existing
                    .iter()
                    .map(|i| format!("{}@{}", i.profile, i.start))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
    }

    /// Records that instance `mig_uuid` serves ledger allocation `allocation`.
    pub fn bind(&self, mig_uuid: &str, allocation: u64) {
        if let Some(c) = self
            .created
            .lock()
            .iter_mut()
            .find(|c| c.instance.uuid == mig_uuid)
        {
            c.allocation = Some(allocation);
        }
        self.save();
    }

    /// Destroys instance `mig_uuid` at once (its Allocate failed after creating it).
    pub fn abandon(&self, mig_uuid: &str) {
        let found = {
            let created = self.created.lock();
            created
                .iter()
                .find(|c| c.instance.uuid == mig_uuid)
                .cloned()
        };
        if let Some(c) = found {
            match self.destroy(&c) {
                Ok(true) | Err(_) => {}
                Ok(false) => {
                    tracing::warn!(mig = mig_uuid, "abandoned MIG instance is in use; kept")
                }
            }
        }
    }

    /// Instances created so far and not destroyed.
    pub fn created(&self) -> Vec<Created> {
        self.created.lock().clone()
    }

    /// Re-binds instances whose allocation id the ledger no longer has but whose slots
    /// an allocation holds (the ledger re-learnt it under a new id).
    pub fn rebind(&self, allocations: &[Allocation]) {
        let mut changed = false;
        for c in self.created.lock().iter_mut() {
            if c.allocation
                .is_some_and(|id| allocations.iter().any(|a| a.id == id))
            {
                continue;
            }
            if let Some(a) = allocations
                .iter()
                .find(|a| !c.slots.is_empty() && a.slots == c.slots)
            {
                c.allocation = Some(a.id);
                changed = true;
            }
        }
        if changed {
            self.save();
        }
    }

    /// Destroys the instances whose allocation is not among the ledger ids `held` returns
    /// and in which no process runs; returns the UUIDs destroyed. Blocking.
    ///
    /// `held` is read after the instances: an Allocate records its allocation in the ledger
    /// before binding its instance to it, so an instance seen bound has its id in `held`
    /// unless the allocation was released since. Read before, an Allocate in between would
    /// have its new instance destroyed under it.
    pub fn sweep(&self, held: impl FnOnce() -> BTreeSet<u64>) -> Vec<String> {
        let now = now_unix_ms();
        let created = self.created.lock().clone();
        let held = held();
        let gone: Vec<Created> = created
            .into_iter()
            .filter(|c| match c.allocation {
                Some(id) => !held.contains(&id),
                None => now.saturating_sub(c.created_unix_ms) > UNBOUND_GRACE_MS,
            })
            .collect();
        let mut destroyed = Vec::new();
        for c in gone {
            match self.destroy(&c) {
                Ok(true) => destroyed.push(c.instance.uuid.clone()),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(mig = %c.instance.uuid, %error, "cannot destroy MIG instance; will retry")
                }
            }
        }
        destroyed
    }

    /// Destroys `c` unless processes run in it; `Ok(false)` when it was kept.
    fn destroy(&self, c: &Created) -> Result<bool, GpuError> {
        let _one_at_a_time = self.creating.lock();
        let now = self.backend.mig_instances(&c.gpu)?;
        let current = now
            .iter()
            .find(|i| i.gpu_instance_id == c.instance.gpu_instance_id && i.uuid == c.instance.uuid);
        match current {
            None => {
                tracing::info!(mig = %c.instance.uuid, "MIG instance already gone");
            }
            Some(i) if i.processes > 0 => {
                tracing::debug!(mig = %i.uuid, processes = i.processes, "MIG instance of a departed pod still in use; kept");
                return Ok(false);
            }
            Some(i) => {
                self.backend.mig_destroy(&c.gpu, i.gpu_instance_id)?;
                tracing::info!(gpu = %c.gpu, mig = %i.uuid, profile = %i.profile, "MIG instance destroyed");
            }
        }
        self.created
            .lock()
            .retain(|x| x.instance.uuid != c.instance.uuid);
        self.save();
        Ok(true)
    }

    fn save(&self) {
        let Some(file) = &self.state_file else {
            return;
        };
        let text = serde_json::to_string_pretty(&*self.created.lock()).unwrap_or_default();
        let tmp = file.with_extension("json.tmp");
        let result = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, file));
        if let Err(error) = result {
            tracing::warn!(file = %file.display(), %error, "cannot save the MIG instance list");
        }
    }
}
