//! Hollow nodes: a Node object plus a kubelet stand-in that plays the pod lifecycle for pods
//! bound to it — device-plugin admission over the real socket when a plugin directory is
//! configured, Running, and Succeeded after the `tessera.dev/sim-duration-seconds` annotation.

mod devices;
mod status;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch as signal;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use devices::ContainerRecord;
use devices::DeviceManager;

use crate::config::{GpuShape, NodeConfig};

/// The GPU extended resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Annotation: seconds after which a running pod succeeds.
pub const SIM_DURATION_ANNOTATION: &str = "tessera.dev/sim-duration-seconds";

/// How to run one hollow node.
#[derive(Debug, Clone)]
pub struct HollowNodeConfig {
    /// Node name.
    pub name: String,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// CPU capacity.
    pub cpu: String,
    /// Memory capacity.
    pub memory: String,
    /// Pod capacity.
    pub pods: u32,
    /// GPUs (count, model, memory); the count is the advertised capacity when no device plugin
    /// directory is set.
    pub gpus: GpuShape,
    /// Device-plugin directory in which this node serves `kubelet.sock`; a device plugin (a
    /// real `tessera-agent`) registering there is called for every GPU pod, and its healthy
    /// devices become the node's `nvidia.com/gpu` capacity.
    pub device_plugin_dir: Option<PathBuf>,
    /// How long to wait for the device plugin at start.
    pub device_plugin_timeout: Duration,
    /// Directory in which to serve the kubelet's pod-resources API (`kubelet.sock`), listing
    /// the devices each container holds (needs `device_plugin_dir`).
    pub pod_resources_dir: Option<PathBuf>,
}

impl HollowNodeConfig {
    /// The node `name` of a cluster description entry.
    pub fn from_description(name: &str, node: &NodeConfig) -> Self {
        Self {
            name: name.into(),
            labels: node.labels.clone(),
            cpu: node.cpu.clone(),
            memory: node.memory.clone(),
            pods: node.pods,
            gpus: node.gpus.clone(),
            device_plugin_dir: node.device_plugin_dir.clone(),
            device_plugin_timeout: Duration::from_secs(10),
            pod_resources_dir: node.pod_resources_dir.clone(),
        }
    }
}

/// Failures starting a hollow node.
#[derive(Debug, thiserror::Error)]
pub enum HollowError {
    /// The API server refused the Node.
    #[error("registering node {node}: {source}")]
    Register {
        /// Node name.
        node: String,
        /// Cause.
        source: kube::Error,
    },
    /// The device plugin side could not start.
    #[error("node {node}: device plugin: {message}")]
    DevicePlugin {
        /// Node name.
        node: String,
        /// What failed.
        message: String,
    },
}

/// Entry point.
pub struct HollowNode;

/// A running hollow node.
pub struct HollowNodeHandle {
    name: String,
    stop: signal::Sender<bool>,
    restart: mpsc::Sender<oneshot::Sender<Result<(), String>>>,
    task: JoinHandle<()>,
    records: Arc<Mutex<Vec<ContainerRecord>>>,
}

impl HollowNode {
    /// Registers the Node (replacing a stale one of the same name) and starts the kubelet loop.
    pub async fn start(
        client: kube::Client,
        config: HollowNodeConfig,
    ) -> Result<HollowNodeHandle, HollowError> {
        let devices = match &config.device_plugin_dir {
            Some(dir) => {
                let manager =
                    DeviceManager::start(dir, GPU_RESOURCE, config.pod_resources_dir.as_deref())
                        .await
                        .map_err(|message| HollowError::DevicePlugin {
                            node: config.name.clone(),
                            message,
                        })?;
                manager
                    .wait_ready(config.device_plugin_timeout)
                    .await
                    .map_err(|message| HollowError::DevicePlugin {
                        node: config.name.clone(),
                        message,
                    })?;
                manager.publish();
                Some(manager)
            }
            None => None,
        };
        let gpu_capacity = match &devices {
            Some(d) => d.healthy_devices().len() as u64,
            None => u64::from(config.gpus.count),
        };
        register_node(&client, &config, gpu_capacity).await?;
        let (stop, stop_rx) = signal::channel(false);
        let (restart, restart_rx) = mpsc::channel(1);
        let records = Arc::new(Mutex::new(Vec::new()));
        let kubelet = Kubelet {
            pods: Api::all(client.clone()),
            nodes: Api::all(client),
            config: config.clone(),
            devices,
            gpu_capacity,
            running: HashMap::new(),
            records: records.clone(),
            next_ip: 1,
        };
        let task = tokio::spawn(kubelet.run(stop_rx, restart_rx));
        Ok(HollowNodeHandle {
            name: config.name,
            stop,
            restart,
            task,
            records,
        })
    }
}

impl HollowNodeHandle {
    /// Node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every container the node started so far and what its device plugin gave it.
    pub fn containers(&self) -> Vec<ContainerRecord> {
        self.records.lock().clone()
    }

    /// Restarts the kubelet the way a real one restarts: its sockets go away and come back
    /// (the device plugin has to register again), it lists its pods afresh, and what it
    /// had admitted survives as its device checkpoint does, so running pods keep their
    /// devices and are not allocated again while pods bound but not yet admitted are.
    /// Containers keep running meanwhile. Returns once the plugin has registered again.
    pub async fn restart_kubelet(&self) -> Result<(), HollowError> {
        let failed = |message: String| HollowError::DevicePlugin {
            node: self.name.clone(),
            message,
        };
        let (done, answer) = oneshot::channel();
        self.restart
            .send(done)
            .await
            .map_err(|_| failed("the kubelet loop has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| failed("the kubelet loop stopped while restarting".to_owned()))?
            .map_err(failed)
    }

    /// Stops the kubelet loop (the Node object stays).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn register_node(
    client: &kube::Client,
    config: &HollowNodeConfig,
    gpus: u64,
) -> Result<(), HollowError> {
    let capacity = BTreeMap::from([
        ("cpu".to_string(), config.cpu.clone()),
        ("memory".to_string(), config.memory.clone()),
        ("pods".to_string(), config.pods.to_string()),
        (GPU_RESOURCE.to_string(), gpus.to_string()),
    ]);
    let mut capacity = capacity;
    for (profile, count) in &config.gpus.mig {
        capacity.insert(format!("nvidia.com/mig-{profile}"), count.to_string());
    }
    let doc = status::node_object(
        &config.name,
        &config.labels,
        &capacity,
        &config.gpus.model,
        config.gpus.memory_mib,
    );
    let err = |source| HollowError::Register {
        node: config.name.clone(),
        source,
    };
    let node: Node =
        serde_json::from_value(doc.clone()).map_err(|e| err(kube::Error::SerdeError(e)))?;
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // A node of this name survived a previous run: take it over.
            nodes
                .patch(&config.name, &PatchParams::default(), &Patch::Merge(&doc))
                .await
                .map_err(err)?;
            nodes
                .patch_status(&config.name, &PatchParams::default(), &Patch::Merge(&doc))
                .await
                .map_err(err)?;
            Ok(())
        }
        Err(e) => Err(err(e)),
    }
}

/// Sum of the container limits (else requests) for `resource`.
pub(crate) fn requested(container: &Value, resource: &str) -> u64 {
    ["limits", "requests"]
        .iter()
        .find_map(|kind| {
            container
                .pointer(&format!("/resources/{kind}"))
                .and_then(|m| m.get(resource))
        })
        .and_then(|q| match q {
            Value::String(s) => s.parse().ok(),
            Value::Number(n) => n.as_u64(),
            _ => None,
        })
        .unwrap_or(0)
}

fn pod_requested(pod: &Value) -> u64 {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().map(|c| requested(c, GPU_RESOURCE)).sum())
        .unwrap_or(0)
}

struct RunningPod {
    gpus: u64,
    timer: Option<JoinHandle<()>>,
}

struct Kubelet {
    pods: Api<Pod>,
    nodes: Api<Node>,
    config: HollowNodeConfig,
    devices: Option<DeviceManager>,
    gpu_capacity: u64,
    /// Pods this kubelet admitted (or rejected, with 0 GPUs), by uid.
    running: HashMap<String, RunningPod>,
    records: Arc<Mutex<Vec<ContainerRecord>>>,
    next_ip: u32,
}

impl Kubelet {
    async fn run(
        mut self,
        mut stop: signal::Receiver<bool>,
        mut restart: mpsc::Receiver<oneshot::Sender<Result<(), String>>>,
    ) {
        // Each pass is one kubelet life: a fresh pod watch, so a restart re-lists.
        'life: loop {
            let selector = format!("spec.nodeName={}", self.config.name);
            let stream = watcher(
                self.pods.clone(),
                watcher::Config::default().fields(&selector),
            );
            futures::pin_mut!(stream);
            let mut capacity_check = tokio::time::interval(Duration::from_millis(500));
            let mut initial: Vec<Pod> = Vec::new();
            loop {
                tokio::select! {
                    _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => break 'life,
                    Some(done) = restart.recv() => {
                        let result = match &mut self.devices {
                            Some(devices) => devices.restart(self.config.device_plugin_timeout).await,
                            None => Ok(()),
                        };
                        let _ = done.send(result);
                        continue 'life;
                    }
                    _ = capacity_check.tick(), if self.devices.is_some() => self.refresh_capacity().await,
                    event = stream.next() => match event {
                        Some(Ok(watcher::Event::Apply(pod))) => self.on_pod(pod).await,
                        Some(Ok(watcher::Event::Init)) => initial.clear(),
                        Some(Ok(watcher::Event::InitApply(pod))) => initial.push(pod),
                        Some(Ok(watcher::Event::InitDone)) => self.on_listed(std::mem::take(&mut initial)).await,
                        Some(Ok(watcher::Event::Delete(pod))) => self.forget(pod.metadata.uid.as_deref().unwrap_or("")),
                        Some(Err(e)) => {
                            tracing::warn!(node = %self.config.name, error = %e, "pod watch failed; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        None => break 'life,
                    }
                }
            }
        }
        for (_, pod) in self.running.drain() {
            if let Some(timer) = pod.timer {
                timer.abort();
            }
        }
        if let Some(devices) = self.devices.take() {
            devices.stop().await;
        }
    }

    /// A full listing of the node's pods (at start, after a restart or a watch re-list).
    async fn on_listed(&mut self, mut listed: Vec<Pod>) {
        // Like the kubelet, admit what is already bound oldest first.
        listed.sort_by(|a, b| {
            (
                a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                &a.metadata.name,
            )
                .cmp(&(
                    b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    &b.metadata.name,
                ))
        });
        // Pods deleted while the watch was re-listing never sent a Delete.
        let present: std::collections::HashSet<String> = listed
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|uid| !present.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.forget(&uid);
        }
        for pod in listed {
            self.on_pod(pod).await;
        }
    }

    /// Mirrors the plugin's healthy device count into the node's capacity, as the kubelet does.
    async fn refresh_capacity(&mut self) {
        let Some(devices) = &self.devices else { return };
        let healthy = devices.healthy_devices().len() as u64;
        if healthy == self.gpu_capacity {
            return;
        }
        let patch = json!({"status": {"capacity": {GPU_RESOURCE: healthy.to_string()}, "allocatable": {GPU_RESOURCE: healthy.to_string()}}});
        match self
            .nodes
            .patch_status(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => self.gpu_capacity = healthy,
            Err(e) => {
                tracing::warn!(node = %self.config.name, error = %e, "updating node capacity failed")
            }
        }
    }

    fn forget(&mut self, uid: &str) {
        if let Some(pod) = self.running.remove(uid)
            && let Some(timer) = pod.timer
        {
            timer.abort();
        }
        if let Some(devices) = &mut self.devices {
            devices.release(uid);
        }
    }

    async fn on_pod(&mut self, pod: Pod) {
        let Ok(pod) = serde_json::to_value(&pod) else {
            return;
        };
        let text = |p: &str| {
            pod.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (uid, name, namespace) = (
            text("/metadata/uid"),
            text("/metadata/name"),
            text("/metadata/namespace"),
        );
        if matches!(text("/status/phase").as_str(), "Succeeded" | "Failed") {
            self.forget(&uid);
            return;
        }
        if self.running.contains_key(&uid) || pod.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let pods: Api<Pod> = Api::namespaced(self.pods.clone().into_client(), &namespace);
        let wanted = pod_requested(&pod);
        let used: u64 = self.running.values().map(|p| p.gpus).sum();
        let admission = if used + wanted > self.gpu_capacity {
            Err((
                "OutOf".to_string() + GPU_RESOURCE,
                format!(
                    "Pod was rejected: Node didn't have enough resource: {GPU_RESOURCE}, requested: {wanted}, used: {used}, capacity: {}",
                    self.gpu_capacity
                ),
            ))
        } else if let Some(devices) = &mut self.devices {
            devices.admit(&pod).await.map_err(|message| {
                (
                    "UnexpectedAdmissionError".to_string(),
                    format!("Pod was rejected: {message}"),
                )
            })
        } else {
            Ok(Vec::new())
        };
        let records = match admission {
            Ok(records) => records,
            Err((reason, message)) => {
                tracing::info!(node = %self.config.name, pod = %name, %message, "pod rejected at admission");
                self.running.insert(
                    uid,
                    RunningPod {
                        gpus: 0,
                        timer: None,
                    },
                );
                let patch = status::rejected(&reason, &message);
                if let Err(e) = pods
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(pod = %name, error = %e, "marking pod failed");
                }
                return;
            }
        };
        self.records.lock().extend(records);
        let ip = format!("10.244.{}.{}", self.next_ip / 250, self.next_ip % 250 + 1);
        self.next_ip += 1;
        let patch = status::running(&pod, &ip);
        if let Err(e) = pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pod = %name, error = %e, "marking pod running");
        }
        let timer = pod
            .pointer(&format!(
                "/metadata/annotations/{}",
                SIM_DURATION_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|secs| secs.is_finite() && *secs >= 0.0)
            .map(|secs| {
                tokio::spawn(finish_after(
                    pods,
                    name.clone(),
                    Duration::from_secs_f64(secs),
                ))
            });
        self.running.insert(
            uid,
            RunningPod {
                gpus: wanted,
                timer,
            },
        );
    }
}

async fn finish_after(pods: Api<Pod>, name: String, after: Duration) {
    tokio::time::sleep(after).await;
    let current = match pods.get(&name).await {
        Ok(pod) => pod,
        Err(e) => {
            tracing::debug!(pod = %name, error = %e, "pod gone before it finished");
            return;
        }
    };
    let Ok(current) = serde_json::to_value(&current) else {
        return;
    };
    let patch = status::succeeded(&current);
    if let Err(e) = pods
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(pod = %name, error = %e, "marking pod succeeded");
    }
}
