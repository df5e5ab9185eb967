//! The MPS daemons and MIG instances an allocation needs, set up once the allocation is
//! recorded and undone when they cannot be.

use std::sync::Arc;

use tessera_device_plugin::ProviderError;

use super::matcher::{Mode, Plan};
use crate::enforce::mig::{MigError, MigManager};
use crate::enforce::mps::{MpsManager, MpsPaths};
use crate::gpu::MigInstance;
use crate::node::Node;

/// What was set up for one container.
pub(super) enum Prepared {
    /// Nothing.
    Plain,
    /// The GPU and its daemon's directories.
    Mps(String, MpsPaths),
    /// The instances, in grant order.
    Mig(Vec<MigInstance>),
}

/// The managers that set up MPS and MIG containers; either may be absent (then the matcher
/// refuses plans that need it).
#[derive(Default)]
pub(super) struct Isolators {
    /// MPS daemons, for `isolation: mps` pods.
    pub(super) mps: Option<Arc<MpsManager>>,
    /// MIG instance creation (`--mig-create`).
    pub(super) mig: Option<Arc<MigManager>>,
}

impl Isolators {
    /// Sets up what `plan` (recorded as ledger allocation `id`) needs; the MIG instances it
    /// creates are added to `made` at once, so that a later failure can destroy them.
    pub(super) async fn prepare(
        &self,
        node: &Node,
        plan: &Plan,
        id: u64,
        made: &mut Vec<String>,
    ) -> Result<Prepared, ProviderError> {
        match plan.mode {
            Mode::Plain => Ok(Prepared::Plain),
            Mode::Mps => {
                let (Some(mps), Some(g)) = (&self.mps, plan.grants.first()) else {
                    return Err(ProviderError::Internal(
                        "MPS plan without an MPS manager or a GPU".into(),
                    ));
                };
                let paths = mps
                    .ensure(&g.uuid)
                    .await
                    .map_err(|e| ProviderError::FailedPrecondition(e.to_string()))?;
                Ok(Prepared::Mps(g.uuid.clone(), paths))
            }
            Mode::Mig => {
                let Some(mig) = &self.mig else {
                    return Err(ProviderError::Internal(
                        "MIG plan without a MIG manager".into(),
                    ));
                };
                let mut instances = Vec::new();
                for g in &plan.grants {
                    let Some(device) = node.device(&g.uuid).cloned() else {
                        return Err(ProviderError::Internal(format!("GPU {} vanished", g.uuid)));
                    };
                    let (manager, grant, slots) = (Arc::clone(mig), g.clone(), plan.slots.clone());
                    let created = tokio::task::spawn_blocking(move || {
                        manager.create_for(&device, grant.memory_mib, grant.compute_milli, &slots)
                    })
                    .await
                    .map_err(|e| ProviderError::Internal(e.to_string()))?;
                    let instance = created.map_err(|e| match e {
                        MigError::Gpu(_) => ProviderError::Unavailable(e.to_string()),
                        _ => ProviderError::FailedPrecondition(e.to_string()),
                    })?;
                    made.push(instance.uuid.clone());
                    // Bound to its allocation at once: the sweep keeps a bound instance while
                    // the allocation is held.
                    mig.bind(&instance.uuid, id);
                    instances.push(instance);
                }
                Ok(Prepared::Mig(instances))
            }
        }
    }

    /// Tells the MPS daemon of a prepared container about its allocation `id`.
    pub(super) fn attach(&self, prepared: &Prepared, id: u64) {
        if let (Prepared::Mps(gpu, _), Some(mps)) = (prepared, &self.mps) {
            mps.attach(gpu, id);
        }
    }

    /// Destroys the MIG instances an Allocate made before it failed.
    pub(super) async fn abandon(&self, made: Vec<String>) {
        let Some(mig) = self.mig.clone() else {
            return;
        };
        if made.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for uuid in made {
                mig.abandon(&uuid);
            }
        })
        .await;
    }
}
