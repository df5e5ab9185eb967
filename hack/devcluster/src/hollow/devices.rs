//! The kubelet's device-manager side: a (fake, but real-socket) kubelet registration server in
//! the device-plugin directory, and per-container `GetPreferredAllocation` / `Allocate` calls to
//! the plugin that registers there (a real `tessera-agent`), as the kubelet makes them.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tessera_device_plugin::testing::{FakeKubelet, FakePodResources, PluginConnection};
use tessera_proto::podresources::POD_RESOURCES_SOCKET;
use tessera_proto::podresources::v1 as pr;

/// What one container was given by the device plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRecord {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Device IDs the kubelet allocated.
    pub device_ids: Vec<String>,
    /// Environment the container would get (from `Allocate`).
    pub env: BTreeMap<String, String>,
    /// CDI device names from `Allocate`.
    pub cdi_devices: Vec<String>,
}

/// The device manager for one extended resource.
pub struct DeviceManager {
    kubelet: FakeKubelet,
    resource: String,
    /// Device ID → pod uid holding it.
    allocated: HashMap<String, String>,
    /// What each admitted pod's containers hold, by pod uid, for the pod-resources API.
    held: BTreeMap<String, Vec<ContainerRecord>>,
    pod_resources: Option<FakePodResources>,
}

/// Healthy-device status string of the device-plugin API.
const HEALTHY: &str = "Healthy";

impl DeviceManager {
    /// Serves the kubelet registration socket in `dir`, and the pod-resources API in
    /// `pod_resources_dir` when given.
    pub async fn start(
        dir: &Path,
        resource: &str,
        pod_resources_dir: Option<&Path>,
    ) -> Result<Self, String> {
        let kubelet = FakeKubelet::start(dir)
            .await
            .map_err(|e| format!("cannot serve kubelet.sock in {}: {e}", dir.display()))?;
        let pod_resources = match pod_resources_dir {
            Some(pr_dir) => {
                let path = pr_dir.join(POD_RESOURCES_SOCKET);
                Some(FakePodResources::start(&path).await.map_err(|e| {
                    format!(
                        "cannot serve the pod-resources API at {}: {e}",
                        path.display()
                    )
                })?)
            }
            None => None,
        };
        let manager = Self {
            kubelet,
            resource: resource.into(),
            allocated: HashMap::new(),
            held: BTreeMap::new(),
            pod_resources,
        };
        Ok(manager)
    }

    /// Publishes current allocations and allocatable devices on the pod-resources API, as
    /// the kubelet reports them.
    pub fn publish(&self) {
        let Some(server) = &self.pod_resources else {
            return;
        };
        let devices = |ids: Vec<String>| pr::ContainerDevices {
            resource_name: self.resource.clone(),
            device_ids: ids,
            topology: None,
        };
        let pods = self
            .held
            .values()
            .filter_map(|records| {
                let first = records.first()?;
                Some(pr::PodResources {
                    name: first.pod.clone(),
                    namespace: first.namespace.clone(),
                    containers: records
                        .iter()
                        .map(|r| pr::ContainerResources {
                            name: r.container.clone(),
                            devices: vec![devices(r.device_ids.clone())],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
            })
            .collect();
        server.set_pods(pods);
        server.set_allocatable(pr::AllocatableResourcesResponse {
            devices: vec![devices(self.healthy_devices())],
            ..Default::default()
        });
    }

    fn plugin(&self) -> Option<Arc<PluginConnection>> {
        self.kubelet.plugin(&self.resource)
    }

    /// Healthy devices the plugin advertises now (0 before it registers).
    pub fn healthy_devices(&self) -> Vec<String> {
        self.plugin()
            .and_then(|p| p.devices().latest())
            .map(|ds| {
                ds.into_iter()
                    .filter(|d| d.health == HEALTHY)
                    .map(|d| d.id)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits up to `timeout` for the plugin to register and list at least one device.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<usize, String> {
        let plugin = self
            .kubelet
            .wait_for_plugin(&self.resource, timeout)
            .await
            .map_err(|e| e.to_string())?;
        let devices = plugin
            .devices()
            .wait_until(|d| !d.is_empty(), timeout)
            .await
            .map_err(|e| e.to_string())?;
        Ok(devices.len())
    }

    /// Frees the devices of a pod that finished or was deleted.
    pub fn release(&mut self, pod_uid: &str) {
        self.allocated.retain(|_, holder| holder != pod_uid);
        if self.held.remove(pod_uid).is_some() {
            self.publish();
        }
    }

    /// Allocates devices to each container of `pod` requesting the resource, in container
    /// order, and returns what each got. On failure nothing stays allocated to the pod and the
    /// error reads like the kubelet's admission error.
    pub async fn admit(&mut self, pod: &Value) -> Result<Vec<ContainerRecord>, String> {
        let uid = pod
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let result = self.admit_containers(pod, &uid).await;
        match &result {
            Ok(records) if !records.is_empty() => {
                self.held.insert(uid, records.clone());
                self.publish();
            }
            Ok(_) => {}
            Err(_) => self.release(&uid),
        }
        result
    }

    async fn admit_containers(
        &mut self,
        pod: &Value,
        uid: &str,
    ) -> Result<Vec<ContainerRecord>, String> {
        let text = |p: &str| {
            pod.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let mut records = Vec::new();
        let containers = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for container in &containers {
            let wanted = super::requested(container, &self.resource);
            if wanted == 0 {
                continue;
            }
            let plugin = self.plugin().ok_or_else(|| {
                format!("Allocate failed due to no device plugin registered for {}, which is unexpected", self.resource)
            })?;
            let available: Vec<String> = self
                .healthy_devices()
                .into_iter()
                .filter(|id| !self.allocated.contains_key(id))
                .collect();
            if (available.len() as u64) < wanted {
                return Err(format!(
                    "Node didn't have enough resource: {}, requested: {wanted}, available: {}",
                    self.resource,
                    available.len()
                ));
            }
            let size = i32::try_from(wanted)
                .map_err(|_| format!("request of {wanted} {} is too large", self.resource))?;
            let available_refs: Vec<&str> = available.iter().map(String::as_str).collect();
            let preferred = plugin
                .options()
                .await
                .map(|o| o.get_preferred_allocation_available)
                .unwrap_or(false);
            let mut chosen: Vec<String> = Vec::new();
            if preferred {
                let answer = plugin
                    .preferred_allocation(&available_refs, &[], size)
                    .await
                    .map_err(|s| format!("GetPreferredAllocation failed: {}", s.message()))?;
                // The kubelet only honours a preference that is a valid choice.
                if answer.len() as u64 == wanted && answer.iter().all(|id| available.contains(id)) {
                    chosen = answer;
                }
            }
            if chosen.is_empty() {
                chosen = available.iter().take(wanted as usize).cloned().collect();
            }
            let chosen_refs: Vec<&str> = chosen.iter().map(String::as_str).collect();
            let response = plugin.allocate_one(&chosen_refs).await.map_err(|s| {
                format!(
                    "Allocate failed due to rpc error: code = {:?} desc = {}, which is unexpected",
                    s.code(),
                    s.message()
                )
            })?;
            for id in &chosen {
                self.allocated.insert(id.clone(), uid.to_string());
            }
            records.push(ContainerRecord {
                namespace: text("/metadata/namespace"),
                pod: text("/metadata/name"),
                container: container
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                device_ids: chosen,
                env: response.envs.into_iter().collect(),
                cdi_devices: response.cdi_devices.into_iter().map(|d| d.name).collect(),
            });
        }
        Ok(records)
    }

    /// Restarts the kubelet side as a real kubelet restart does: the registration socket
    /// and every plugin socket in the directory go away and `kubelet.sock` is served anew,
    /// and the pod-resources API goes down and comes back. What the device manager had
    /// allocated survives, as the kubelet's device checkpoint does: admitted pods are not
    /// allocated again. Waits for the plugin to register again.
    pub async fn restart(&mut self, timeout: Duration) -> Result<(), String> {
        if let Some(server) = self.pod_resources.take() {
            let path = server.socket_path().to_path_buf();
            server.stop().await;
            self.pod_resources = Some(FakePodResources::start(&path).await.map_err(|e| {
                format!(
                    "cannot serve the pod-resources API at {} again: {e}",
                    path.display()
                )
            })?);
        }
        self.kubelet
            .restart()
            .await
            .map_err(|e| format!("cannot serve kubelet.sock again: {e}"))?;
        self.wait_ready(timeout).await?;
        self.publish();
        Ok(())
    }

    /// Stops serving the kubelet (and pod-resources) sockets.
    pub async fn stop(self) {
        self.kubelet.stop().await;
        if let Some(server) = self.pod_resources {
            server.stop().await;
        }
    }
}
