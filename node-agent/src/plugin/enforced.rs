//! How a container's limits are set up: the isolation mode of each plan, the capacity check,
//! and the MPS daemons and MIG instances made before an allocation is recorded.

use std::sync::Arc;

use tessera_device_plugin::{ProviderError, api};

use super::*;
use crate::ledger::Origin;

impl GpuPlugin {
    /// How `plan`'s limits are set up: MIG for GPUs in MIG mode, MPS for assigned pods
    /// asking for it, nothing more otherwise.
    pub(super) fn mode_of(&self, plan: &Plan) -> Result<Mode, ProviderError> {
        let who = || plan.who();
        let on_mig: Vec<&str> = plan
            .grants
            .iter()
            .filter(|g| self.node.device(&g.uuid).is_some_and(|d| d.mig.is_some()))
            .map(|g| g.uuid.as_str())
            .collect();
        if !on_mig.is_empty() {
            if on_mig.len() != plan.grants.len() {
                return Err(ProviderError::FailedPrecondition(format!(
                    "{} is assigned GPUs in MIG mode ({}) together with GPUs that are not; \
                     a container's GPUs must all be MIG instances or none",
                    who(),
                    on_mig.join(", ")
                )));
            }
            if self.mig.is_none() {
                return Err(ProviderError::FailedPrecondition(format!(
                    "{} is assigned GPU {} in MIG mode, but creating MIG instances is off \
                     (start the agent with --mig-create)",
                    who(),
                    on_mig.join(", ")
                )));
            }
            return Ok(Mode::Mig);
        }
        // Whole GPUs need no MPS daemon: nobody shares them.
        let isolation = match plan.origin {
            Origin::Assigned => plan.isolation,
            _ => Isolation::Watchdog,
        };
        match isolation {
            Isolation::Mps => {
                if plan.grants.len() != 1 {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "{} has tessera.dev/isolation: mps with {} GPUs; an MPS client reaches the \
                         daemon of one GPU only, so MPS containers get exactly one GPU",
                        who(),
                        plan.grants.len()
                    )));
                }
                if self.mps.is_none() {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "{} has tessera.dev/isolation: mps, but this agent runs without MPS support",
                        who()
                    )));
                }
                Ok(Mode::Mps)
            }
            Isolation::Mig => {
                tracing::warn!(
                    container = %who(),
                    "isolation mig on a GPU not in MIG mode; limits are watched instead"
                );
                Ok(Mode::Plain)
            }
            Isolation::Watchdog | Isolation::None => Ok(Mode::Plain),
        }
    }

    /// Refuses an assignment that would overcommit a GPU or share a whole-held one. The
    /// sums are checked: no value in an assignment or the checkpoint can wrap them around
    /// to look as if they fit.
    pub(super) fn check_capacity(&self, plan: &Plan) -> Result<(), ProviderError> {
        if plan.origin != Origin::Assigned {
            return Ok(());
        }
        let ledger = self.node.ledger.lock();
        for g in &plan.grants {
            // Holders of the very slots requested are gone (the kubelet re-issued them).
            let usage = ledger.usage_except(&g.uuid, &plan.slots);
            let total = self.node.device(&g.uuid).map_or(0, |d| d.memory_total_mib);
            if usage.whole {
                return Err(ProviderError::FailedPrecondition(format!(
                    "GPU {} is held whole by a pod without assignment; cannot add a share to it",
                    g.uuid
                )));
            }
            let memory_fits = usage
                .memory_mib
                .checked_add(g.memory_mib)
                .is_some_and(|m| m <= total);
            let compute_fits = usage
                .compute_milli
                .checked_add(g.compute_milli)
                .is_some_and(|c| c <= 1000);
            if !memory_fits || !compute_fits {
                return Err(ProviderError::FailedPrecondition(format!(
                    "assignment would overcommit GPU {}: {} MiB + {} MiB of {} MiB, {} + {} of 1000 milli-GPU",
                    g.uuid,
                    usage.memory_mib,
                    g.memory_mib,
                    total,
                    usage.compute_milli,
                    g.compute_milli
                )));
            }
        }
        Ok(())
    }

    /// Sets up MPS daemons and MIG instances for `plans`, then records them; whatever
    /// was created is removed again when the allocation fails.
    pub(super) async fn allocate_enforced(
        &self,
        plans: &[Plan],
    ) -> Result<api::AllocateResponse, ProviderError> {
        let mut prepared = Vec::new();
        let mut made: Vec<String> = Vec::new();
        let mut outcome = Ok(());
        for plan in plans {
            match self.prepare(plan, &mut made).await {
                Ok(p) => prepared.push(p),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // Other Allocates may have run while this one waited.
        let outcome =
            outcome.and_then(|()| plans.iter().try_for_each(|plan| self.check_capacity(plan)));
        let result = outcome.and_then(|()| self.commit(plans, &prepared));
        if result.is_err() {
            self.abandon(made).await;
        }
        result
    }

    pub(super) async fn prepare(
        &self,
        plan: &Plan,
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
                    let Some(device) = self.node.device(&g.uuid).cloned() else {
                        return Err(ProviderError::Internal(format!("GPU {} vanished", g.uuid)));
                    };
                    let (mig, grant, slots) = (Arc::clone(mig), g.clone(), plan.slots.clone());
                    let created = tokio::task::spawn_blocking(move || {
                        mig.create_for(&device, grant.memory_mib, grant.compute_milli, &slots)
                    })
                    .await
                    .map_err(|e| ProviderError::Internal(e.to_string()))?;
                    let instance = created.map_err(|e| match e {
                        MigError::Gpu(_) => ProviderError::Unavailable(e.to_string()),
                        _ => ProviderError::FailedPrecondition(e.to_string()),
                    })?;
                    made.push(instance.uuid.clone());
                    instances.push(instance);
                }
                Ok(Prepared::Mig(instances))
            }
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
