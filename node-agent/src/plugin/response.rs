//! Recording an allocation in the ledger and the answer the kubelet passes to the runtime.

use std::collections::HashMap;

use tessera_device_plugin::{ProviderError, api};

use super::*;
use crate::ledger::{Allocation, Grant, now_unix_ms};
use tessera_contract::keys::GPU_RESOURCE;

impl GpuPlugin {
    pub(super) fn response(
        &self,
        plan: &Plan,
        prepared: &Prepared,
    ) -> api::ContainerAllocateResponse {
        let cdi = self.node.options().cdi;
        match prepared {
            Prepared::Plain => container_response(cdi, &plan.grants, None),
            Prepared::Mig(instances) => {
                let uuids: Vec<String> = instances.iter().map(|i| i.uuid.clone()).collect();
                container_response(cdi, &plan.grants, Some(&uuids))
            }
            Prepared::Mps(_, paths) => {
                let mut response = container_response(cdi, &plan.grants, None);
                // `mode_of` admits MPS containers with exactly one GPU.
                if let Some(g) = plan.grants.first() {
                    response.envs.extend(mps::client_env(
                        g.memory_mib,
                        g.compute_milli,
                        &paths.pipe,
                    ));
                }
                let pipe = paths.pipe.display().to_string();
                response.mounts.push(api::Mount {
                    container_path: pipe.clone(),
                    host_path: pipe,
                    read_only: false,
                });
                // The daemon's shared memory: without it the client cannot attach and
                // would run with no limits at all.
                response.mounts.push(api::Mount {
                    container_path: "/dev/shm".to_owned(),
                    host_path: paths.shm.display().to_string(),
                    read_only: false,
                });
                response
            }
        }
    }

    /// Records `plans` in the ledger and answers; `prepared` (empty on the plain path)
    /// holds what was set up for each plan.
    pub(super) fn commit(
        &self,
        plans: &[Plan],
        prepared: &[Prepared],
    ) -> Result<api::AllocateResponse, ProviderError> {
        let mut container_responses = Vec::new();
        let mut ids = Vec::new();
        {
            let mut ledger = self.node.ledger.lock();
            for (k, plan) in plans.iter().enumerate() {
                for old in ledger
                    .remove_holding(&plan.slots)
                    .map_err(|e| ProviderError::Internal(e.to_string()))?
                {
                    tracing::info!(id = old.id, pod = ?old.pod, uid = ?old.pod_uid, "slots handed out again; previous holder released");
                }
                let id = ledger
                    .insert(Allocation {
                        id: 0,
                        resource: GPU_RESOURCE.to_owned(),
                        slots: plan.slots.clone(),
                        grants: plan.grants.clone(),
                        pod: plan.owner.as_ref().map(|o| o.pod.clone()),
                        pod_uid: plan.owner.as_ref().map(|o| o.uid.clone()),
                        container: plan.owner.as_ref().map(|o| o.container.clone()),
                        isolation: plan.isolation,
                        origin: plan.origin,
                        at_unix_ms: now_unix_ms(),
                    })
                    .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
                let prepared = prepared.get(k).unwrap_or(&Prepared::Plain);
                container_responses.push(self.response(plan, prepared));
                ids.push(id);
            }
        }
        for (id, prepared) in ids.into_iter().zip(prepared) {
            match prepared {
                Prepared::Plain => {}
                Prepared::Mps(gpu, _) => {
                    if let Some(mps) = &self.mps {
                        mps.attach(gpu, id);
                    }
                }
                Prepared::Mig(instances) => {
                    if let Some(mig) = &self.mig {
                        for i in instances {
                            mig.bind(&i.uuid, id);
                        }
                    }
                }
            }
        }
        let mut reservations = self.reservations.lock();
        for plan in plans {
            if let Some(o) = &plan.owner {
                reservations.retain(|r| !(r.uid == o.uid && r.container == o.container));
                tracing::info!(pod = %o.pod, uid = %o.uid, container = o.container, slots = ?plan.slots,
                    origin = ?plan.origin, isolation = %plan.isolation, "allocated");
            } else {
                tracing::info!(slots = ?plan.slots, "allocated whole GPUs");
            }
        }
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

/// The container's devices and limit variables for `grants`; `devices` replaces the
/// GPU UUIDs in the device list (MIG instance UUIDs, in grant order).
pub(super) fn container_response(
    cdi: bool,
    grants: &[Grant],
    devices: Option<&[String]>,
) -> api::ContainerAllocateResponse {
    let ids: Vec<String> = match devices {
        Some(d) => d.to_vec(),
        None => grants.iter().map(|g| g.uuid.clone()).collect(),
    };
    let join = |f: &dyn Fn(&Grant) -> String| grants.iter().map(f).collect::<Vec<_>>().join(",");
    let mut envs = HashMap::new();
    envs.insert(
        ENV_MEMORY_LIMIT.to_owned(),
        join(&|g| g.memory_mib.to_string()),
    );
    envs.insert(
        ENV_COMPUTE_PERCENT.to_owned(),
        join(&|g| (g.compute_milli.div_ceil(10)).to_string()),
    );
    let mut response = api::ContainerAllocateResponse::default();
    if cdi {
        response.cdi_devices = ids
            .iter()
            .map(|id| api::CdiDevice {
                name: format!("{GPU_RESOURCE}={id}"),
            })
            .collect();
    } else {
        envs.insert(ENV_VISIBLE_DEVICES.to_owned(), ids.join(","));
    }
    response.envs = envs;
    response
}
