//! The answer the kubelet passes to the runtime: devices and limit variables per container.

use std::collections::HashMap;

use tessera_device_plugin::api;

use super::enforced::Prepared;
use super::matcher::Plan;
use super::{ENV_COMPUTE_PERCENT, ENV_MEMORY_LIMIT, ENV_VISIBLE_DEVICES};
use crate::enforce::mps;
use crate::ledger::Grant;
use tessera_contract::keys::GPU_RESOURCE;

/// The answer for `plan`, with what was set up for it (`prepared`); `cdi` names devices by
/// CDI instead of `NVIDIA_VISIBLE_DEVICES`.
pub(super) fn response(
    cdi: bool,
    plan: &Plan,
    prepared: &Prepared,
) -> api::ContainerAllocateResponse {
    match prepared {
        Prepared::Plain => container_response(cdi, &plan.grants, None),
        Prepared::Mig(instances) => {
            let uuids: Vec<String> = instances.iter().map(|i| i.uuid.clone()).collect();
            container_response(cdi, &plan.grants, Some(&uuids))
        }
        Prepared::Mps(_, paths) => {
            let mut response = container_response(cdi, &plan.grants, None);
            // The matcher admits MPS containers with exactly one GPU.
            if let Some(g) = plan.grants.first() {
                response
                    .envs
                    .extend(mps::client_env(g.memory_mib, g.compute_milli, &paths.pipe));
            }
            let pipe = paths.pipe.display().to_string();
            response.mounts.push(api::Mount {
                container_path: pipe.clone(),
                host_path: pipe,
                read_only: false,
            });
            // The daemon's shared memory: without it the client cannot attach and would
            // run with no limits at all.
            response.mounts.push(api::Mount {
                container_path: "/dev/shm".to_owned(),
                host_path: paths.shm.display().to_string(),
                read_only: false,
            });
            response
        }
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
