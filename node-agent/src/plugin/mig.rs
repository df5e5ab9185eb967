//! The `nvidia.com/mig-<profile>` device plugin: the kubelet picks the instance, the agent
//! records and answers it.

use std::sync::Arc;

use tessera_device_plugin::{DeviceProvider, DeviceWatch, ProviderError, api};

use super::response::container_response;
use crate::ledger::{Allocation, Grant, Origin, now_unix_ms};
use crate::node::{Node, mig_resource, slot_id};
use tessera_contract::Isolation;

/// The `nvidia.com/mig-<profile>` provider for one profile.
pub struct MigPlugin {
    node: Arc<Node>,
    profile: String,
}

impl MigPlugin {
    /// A provider for `profile` on `node`.
    pub fn new(node: Arc<Node>, profile: impl Into<String>) -> Self {
        Self {
            node,
            profile: profile.into(),
        }
    }
}

#[tonic::async_trait]
impl DeviceProvider for MigPlugin {
    fn devices(&self) -> DeviceWatch {
        match self.node.mig_lists().get(&self.profile) {
            Some(list) => list.watch(),
            // The server is only built for profiles that exist.
            None => tessera_device_plugin::DeviceList::new(Vec::new()).watch(),
        }
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let resource = mig_resource(&self.profile);
        let mut responses = Vec::new();
        let mut ledger = self.node.ledger.lock();
        for req in &request.container_requests {
            let mut grants = Vec::new();
            for id in &req.devices_ids {
                let (gpu, mig) = self.node.mig_device(id).ok_or_else(|| {
                    ProviderError::InvalidRequest(format!(
                        "{id:?} is not a MIG device of this node"
                    ))
                })?;
                if !self.node.mig_healthy(id) {
                    return Err(ProviderError::FailedPrecondition(format!(
                        "MIG device {id} (GPU {}) is unhealthy",
                        gpu.uuid
                    )));
                }
                grants.push(Grant {
                    uuid: mig.uuid.clone(),
                    memory_mib: mig.memory_total_mib,
                    compute_milli: 1000,
                });
            }
            ledger
                .remove_holding(&req.devices_ids)
                .and_then(|_| {
                    ledger.insert(Allocation {
                        id: 0,
                        resource: resource.clone(),
                        slots: req.devices_ids.clone(),
                        grants: grants.clone(),
                        pod: None,
                        pod_uid: None,
                        container: None,
                        // A MIG instance isolates in hardware.
                        isolation: Isolation::Mig,
                        origin: Origin::Whole,
                        at_unix_ms: now_unix_ms(),
                    })
                })
                .map_err(|e| ProviderError::Unavailable(e.to_string()))?;
            responses.push(container_response(self.node.options().cdi, &grants, None));
        }
        drop(ledger);
        self.node.bump();
        Ok(api::AllocateResponse {
            container_responses: responses,
        })
    }
}

/// All slot ids of GPU `uuid` (for tests and tools).
pub fn slots_of(node: &Node, uuid: &str) -> Vec<String> {
    (0..node.options().shares_per_gpu)
        .map(|k| slot_id(uuid, k))
        .collect()
}
