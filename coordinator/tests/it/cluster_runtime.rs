//! The coordinator's runtime against a real kube-apiserver (hack/k8s): kubelet-lite nodes with
//! `nvidia.com/gpu` as plain capacity (no device plugin), agents simulated through the registry
//! (inventory as an agent would send it), and a stand-in for the agents' `tessera.dev/allocated`
//! mark where a test needs it. The nodes' kubelets end deleted pods, as real ones do, so an
//! eviction completes.

use crate::fault_proxy;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fault_proxy::{Fault, FaultProxy};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_contract::keys::{
    ALLOCATED as ALLOCATED_ANNOTATION, ASSIGNMENT as ASSIGNMENT_ANNOTATION,
};
use tessera_coordinator::agents::{AgentRegistry, registry::Session};
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig, CoordinatorHandle};
use tessera_coordinator::crd::{GpuQuota, Queue, QueueSpec};
use tessera_core::model::Assignment;
use tessera_proto::tessera::v1 as pb;
use tessera_testcluster::eventually;
use tessera_testcluster::{Cluster, ClusterOptions, LiteNode, NodeOptions};
use tokio::sync::mpsc;

/// Generous bound for anything eventually true (the CI machine is slow).
const WAIT: Duration = Duration::from_secs(30);

struct Env {
    server: Cluster,
    nodes: Vec<LiteNode>,
    client: kube::Client,
    registry: AgentRegistry,
    /// Keeps the simulated agents' outbound queues open.
    _outbound: Vec<mpsc::Receiver<pb::CoordinatorMessage>>,
}

async fn env() -> Env {
    let server = Cluster::start(ClusterOptions {
        controllers: Some("serviceaccount-controller".into()),
        audit: true,
        ..ClusterOptions::default()
    });
    let client = server.admin().await;
    tessera_testcluster::wait_service_account(&client, "default", "default").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in tessera_coordinator::crd::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for (_, crd) in tessera_coordinator::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        tessera_testcluster::wait_crd_established(&client, &name).await;
    }
    Env {
        server,
        nodes: Vec::new(),
        client,
        registry: AgentRegistry::new(),
        _outbound: Vec::new(),
    }
}

impl Env {
    /// A Ready node with `gpus` GPUs and an agent (simulated) reporting them; returns the
    /// agent's session, to report occupancy through.
    async fn node(&mut self, name: &str, gpus: u32) -> Session {
        let mut options = NodeOptions::new(name);
        options.capacity = BTreeMap::from([
            ("cpu".to_owned(), "64".to_owned()),
            ("memory".to_owned(), "512Gi".to_owned()),
            ("nvidia.com/gpu".to_owned(), (gpus * 10).to_string()),
        ]);
        self.nodes.push(LiteNode::start(&self.server, options));
        let inventory = pb::NodeInventory {
            node_name: name.into(),
            agent_version: "test".into(),
            gpus: (0..gpus)
                .map(|i| pb::Gpu {
                    uuid: format!("GPU-{name}-{i}"),
                    index: i,
                    model: "NVIDIA A100-SXM4-80GB".into(),
                    memory_mib: 81920,
                    numa_node: -1,
                    ..Default::default()
                })
                .collect(),
            links: None,
            shares_per_gpu: 10,
        };
        let (tx, rx) = mpsc::channel(16);
        let session = self.registry.connect(&inventory, 2, tx).unwrap();
        self._outbound.push(rx);
        session
    }

    fn config(&self, identity: &str) -> CoordinatorConfig {
        CoordinatorConfig {
            identity: identity.into(),
            lease: LeaseConfig {
                namespace: "default".into(),
                name: "tessera-test".into(),
                duration: Duration::from_secs(2),
                renew_every: Duration::from_millis(400),
            },
            registry: Some(self.registry.clone()),
            agent_timeout: Duration::from_secs(3600),
            // Missing agents are named at once: these tests are about what is said of them.
            agent_grace: Duration::ZERO,
            cycle_interval: Duration::from_millis(200),
            bind_call_timeout: Duration::from_secs(2),
            ..CoordinatorConfig::default()
        }
    }

    async fn start(&self, identity: &str) -> CoordinatorHandle {
        self.start_with(self.client.clone(), identity).await
    }

    async fn start_with(&self, client: kube::Client, identity: &str) -> CoordinatorHandle {
        Coordinator::start(client, self.config(identity))
            .await
            .unwrap()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create_pod(
        &self,
        name: &str,
        gpus: u32,
        annotations: serde_json::Value,
        labels: serde_json::Value,
    ) {
        self.create_pod_with(name, gpus, annotations, labels, json!({}))
            .await;
    }

    /// [`Env::create_pod`] with more fields in the pod's spec.
    async fn create_pod_with(
        &self,
        name: &str,
        gpus: u32,
        annotations: serde_json::Value,
        labels: serde_json::Value,
        extra_spec: serde_json::Value,
    ) {
        let mut resources = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
        if gpus > 0 {
            resources["limits"] = json!({"nvidia.com/gpu": gpus.to_string()});
        }
        let mut spec = json!({"schedulerName": "tessera",
            "containers": [{"name": "main", "image": "busybox", "resources": resources}]});
        if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
            s.extend(extra.clone());
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations, "labels": labels},
            "spec": spec,
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    async fn get(&self, name: &str) -> Option<Pod> {
        self.pods().get_opt(name).await.unwrap()
    }

    /// Plays the agents' part: marks every bound GPU pod allocated.
    fn allocate_bound_pods(&self) -> tokio::task::JoinHandle<()> {
        let pods = self.pods();
        tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&ListParams::default()).await {
                    for p in list {
                        let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                        let marked = p
                            .metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key(ALLOCATED_ANNOTATION));
                        if bound && !marked {
                            let _ = mark_allocated(&pods, p.metadata.name.as_deref().unwrap_or(""))
                                .await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }

    async fn events_for(&self, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }
}

async fn mark_allocated(pods: &Api<Pod>, name: &str) -> kube::Result<Pod> {
    let patch = json!({"metadata": {"annotations": {ALLOCATED_ANNOTATION: "1"}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

fn assignment_of(p: &Pod) -> Option<Assignment> {
    let text = p
        .metadata
        .annotations
        .as_ref()?
        .get(ASSIGNMENT_ANNOTATION)?;
    Some(Assignment::from_json(text).unwrap())
}

fn unschedulable_message(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })?
        .message
        .clone()
}

async fn bound(env: &Env, name: &str) -> Pod {
    eventually(&format!("pod {name} bound"), || async {
        env.get(name).await.filter(|p| node_of(p).is_some())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_bound_with_assignments_and_events() {
    let mut env = env().await;
    // Room for all: 2 whole GPUs, half of a third, and the gang's two whole GPUs.
    env.node("n1", 5).await;
    let coordinator = env.start("c1").await;
    let _agent = env.allocate_bound_pods();
    env.create_pod("whole", 2, json!({}), json!({})).await;
    env.create_pod(
        "half",
        1,
        json!({"tessera.dev/gpu-fraction": "0.5"}),
        json!({}),
    )
    .await;
    for i in 0..2 {
        env.create_pod(
            &format!("gang-{i}"),
            1,
            json!({"tessera.dev/pod-group": "g", "tessera.dev/min-member": "2"}),
            json!({}),
        )
        .await;
    }
    let whole = bound(&env, "whole").await;
    assert_eq!(node_of(&whole).as_deref(), Some("n1"));
    let a = assignment_of(&whole).expect("assignment written");
    let slices: Vec<_> = a.slices().collect();
    assert_eq!(slices.len(), 2);
    assert!(
        slices
            .iter()
            .all(|s| s.compute_milli == 1000 && s.uuid.starts_with("GPU-n1-"))
    );
    assert!(
        whole
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key("tessera.dev/assigned-at")
    );

    let half = bound(&env, "half").await;
    let a = assignment_of(&half).unwrap();
    assert_eq!(
        a.slices().map(|s| s.compute_milli).collect::<Vec<_>>(),
        vec![500]
    );

    let g0 = bound(&env, "gang-0").await;
    let g1 = bound(&env, "gang-1").await;
    let u0: Vec<_> = assignment_of(&g0)
        .unwrap()
        .slices()
        .map(|s| s.uuid.clone())
        .collect();
    let u1: Vec<_> = assignment_of(&g1)
        .unwrap()
        .slices()
        .map(|s| s.uuid.clone())
        .collect();
    assert!(
        u0.iter().all(|u| !u1.contains(u)),
        "gang members share a whole GPU: {u0:?} {u1:?}"
    );

    let events = eventually("a Scheduled event naming the node and GPUs", || async {
        env.events_for("whole")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Scheduled"))
    })
    .await;
    let message = events.message.unwrap();
    assert!(
        message.contains("n1") && message.contains("GPU-n1-"),
        "{message}"
    );
    assert!(coordinator.is_leader());
    coordinator.shutdown().await;
    drop(env);
}

/// Creates `gang-0..2`, a gang of three 2-GPU pods, and returns the pod of the first Binding
/// `proxy` sees.
async fn create_gang(env: &Env, proxy: &FaultProxy) -> String {
    for i in 0..3 {
        env.create_pod(
            &format!("gang-{i}"),
            2,
            json!({"tessera.dev/pod-group": "g", "tessera.dev/min-member": "3"}),
            json!({}),
        )
        .await;
    }
    eventually("the first Binding", || async {
        proxy.bindings().first().cloned()
    })
    .await
}

/// Starts the coordinator behind a fault proxy, creates a gang of three whose second Binding
/// suffers `fault` (and whose first `throttled_evictions` evictions get 429), and waits until
/// the member bound first has been evicted with the gang named; returns the proxy.
async fn gang_with_a_failed_bind(
    env: &Env,
    fault: Fault,
    throttled_evictions: usize,
) -> (FaultProxy, CoordinatorHandle) {
    let proxy = FaultProxy::start(env.client.clone()).await;
    let coordinator = env.start_with(proxy.client(), "c1").await;
    proxy.on_nth_binding(2, fault);
    proxy.throttle_evictions(throttled_evictions);
    let first = create_gang(env, &proxy).await;
    eventually(&format!("{first} to be evicted as a partial gang"), || {
        evicted_as_partial_gang(env, &first)
    })
    .await;
    (proxy, coordinator)
}

/// The event of `name`'s eviction as a member of a gang that could not be bound whole.
async fn evicted_as_partial_gang(env: &Env, name: &str) -> Option<Event> {
    env.events_for(name).await.into_iter().find(|e| {
        e.reason.as_deref() == Some("Evicted")
            && e.message.as_deref().unwrap_or("").contains("partial gang")
    })
}

/// Whether any of the gang's pods is bound now.
async fn any_gang_member_bound(env: &Env) -> bool {
    for i in 0..3 {
        if let Some(p) = env.get(&format!("gang-{i}")).await
            && node_of(&p).is_some()
            && p.metadata.deletion_timestamp.is_none()
        {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_with_a_throttled_bind_is_not_left_partial() {
    let mut env = env().await;
    env.node("n1", 4).await;
    env.node("n2", 4).await;
    let _agent = env.allocate_bound_pods();
    let (proxy, coordinator) = gang_with_a_failed_bind(&env, Fault::Throttle, 0).await;
    let throttled = proxy.bindings()[1].clone();
    eventually("the throttled bind reported", || async {
        env.events_for(&throttled)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedBinding"))
    })
    .await;
    eventually("no gang member left bound", || async {
        (!any_gang_member_bound(&env).await).then_some(())
    })
    .await;
    assert!(node_of(&env.get(&throttled).await.unwrap()).is_none());
    // The third member was never tried, and the gang is not tried again: its first member
    // is gone, so it can no longer be whole.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(proxy.bindings().len(), 2, "{:?}", proxy.bindings());
    // A pod outside the gang is unaffected.
    env.create_pod("solo", 1, json!({}), json!({})).await;
    bound(&env, "solo").await;
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_the_server_keeps_throttling_is_retried_in_later_cycles() {
    let mut env = env().await;
    env.node("n1", 4).await;
    env.node("n2", 4).await;
    let _agent = env.allocate_bound_pods();
    // More 429s than the binder's own tries (3): the member stays bound past the failed
    // unit's cycle, and a later cycle evicts it.
    let (proxy, coordinator) = gang_with_a_failed_bind(&env, Fault::Throttle, 4).await;
    let first = proxy.bindings()[0].clone();
    let tries = proxy.evictions();
    assert!(
        tries.len() >= 5 && tries.iter().all(|p| *p == first),
        "evictions: {tries:?}"
    );
    eventually("no gang member left bound", || async {
        (!any_gang_member_bound(&env).await).then_some(())
    })
    .await;
    // While the first member was still bound (and counted towards the gang by the core), the
    // other two were not bound to complete it: it would have been partial once it left.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(proxy.bindings().len(), 2, "{:?}", proxy.bindings());
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_bind_answered_too_late_is_rolled_back_once_it_lands() {
    let mut env = env().await;
    env.node("n1", 4).await;
    env.node("n2", 4).await;
    let _agent = env.allocate_bound_pods();
    // The coordinator gives up on a Binding after 2 s (see `config`); this one is applied
    // after 5 s, when the unit has already been rolled back.
    let (proxy, coordinator) =
        gang_with_a_failed_bind(&env, Fault::Delay(Duration::from_secs(5)), 0).await;
    let late = proxy.bindings()[1].clone();
    // Under load the late bind may land, be rolled back and the pod be gone (the kubelet
    // finishes the deletion) before the first poll; the eviction event then shows it landed.
    eventually(&format!("{late}'s late bind to land"), || async {
        let bound = env.get(&late).await.and_then(|p| node_of(&p)).is_some();
        (bound || evicted_as_partial_gang(&env, &late).await.is_some()).then_some(())
    })
    .await;
    eventually(&format!("{late} to be rolled back once bound"), || {
        evicted_as_partial_gang(&env, &late)
    })
    .await;
    eventually("no gang member left bound", || async {
        (!any_gang_member_bound(&env).await).then_some(())
    })
    .await;
    assert_eq!(proxy.bindings().len(), 2, "{:?}", proxy.bindings());
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unschedulable_condition_changes_only_with_its_message() {
    let mut env = env().await;
    env.node("n1", 4).await;
    let coordinator = env.start("c1").await;
    env.create_pod("big", 8, json!({}), json!({})).await;
    let (first, rv) = eventually("an Unschedulable condition", || async {
        let p = env.get("big").await?;
        let m = unschedulable_message(&p)?;
        Some((m, p.metadata.resource_version.clone()))
    })
    .await;
    // Cycles keep running (another pod gets bound) without rewriting the same message.
    let _agent = env.allocate_bound_pods();
    env.create_pod("small-1", 1, json!({}), json!({})).await;
    bound(&env, "small-1").await;
    env.create_pod("small-2", 1, json!({}), json!({})).await;
    bound(&env, "small-2").await;
    let again = env.get("big").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, rv,
        "the condition was rewritten unchanged"
    );
    let failed = |events: Vec<Event>| {
        events
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .count()
    };
    assert_eq!(failed(env.events_for("big").await), 1);
    // A larger second node changes the explanation ("the largest node has 6"): the
    // condition follows.
    env.node("n2", 6).await;
    let second = eventually("the message to change", || async {
        let m = unschedulable_message(&env.get("big").await?)?;
        (m != first).then_some(m)
    })
    .await;
    assert!(!second.is_empty());
    // One event per message: the node may first show up without its agent's GPUs (the
    // message then names it), and again once they are counted; never the same one twice.
    // The event is written after the condition, so wait for it before counting.
    let scheduling_messages = || async {
        env.events_for("big")
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .map(|e| e.message.unwrap_or_default())
            .collect::<Vec<String>>()
    };
    eventually("an event with the new message", || async {
        scheduling_messages().await.contains(&second).then_some(())
    })
    .await;
    let messages = scheduling_messages().await;
    let distinct: std::collections::BTreeSet<&String> = messages.iter().collect();
    assert!((2..=3).contains(&messages.len()), "{messages:#?}");
    assert_eq!(distinct.len(), messages.len(), "{messages:#?}");
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_pods_say_that_no_agent_reports_when_none_does() {
    let mut env = env().await;
    // A Ready node whose agent never reported.
    env.nodes
        .push(LiteNode::start(&env.server, NodeOptions::new("quiet")));
    let coordinator = env.start("c1").await;
    env.create_pod("waits", 1, json!({}), json!({})).await;
    let message = eventually("an Unschedulable condition", || async {
        unschedulable_message(&env.get("waits").await?)
    })
    .await;
    assert!(
        message.starts_with("no tessera-agent is reporting GPUs from any of the 1 nodes"),
        "{message}"
    );
    assert!(message.contains("tessera-agent DaemonSet"), "{message}");
    // Once an agent reports GPUs the pod is placed.
    let _agent = env.allocate_bound_pods();
    env.node("n1", 2).await;
    bound(&env, "waits").await;
    coordinator.shutdown().await;
    drop(env);
}

/// Right after a coordinator starts, agents are still reconnecting: within the grace period a
/// GPU pod is told the core's reason, not that no agent reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_agents_are_not_blamed_within_the_grace_period() {
    let mut env = env().await;
    let mut quiet = NodeOptions::new("quiet");
    quiet
        .labels
        .insert("nvidia.com/gpu.present".to_owned(), "true".to_owned());
    env.nodes.push(LiteNode::start(&env.server, quiet));
    let config = CoordinatorConfig {
        agent_grace: Duration::from_secs(3600),
        ..env.config("c1")
    };
    let coordinator = Coordinator::start(env.client.clone(), config)
        .await
        .unwrap();
    env.create_pod("waits", 1, json!({}), json!({})).await;
    let message = eventually("the core's reason: no GPUs reported", || async {
        let m = unschedulable_message(&env.get("waits").await?)?;
        m.contains("node(s) had no GPUs").then_some(m)
    })
    .await;
    assert_eq!(
        message, "0/1 nodes are available: 1 node(s) had no GPUs.",
        "no agent is named while agents may still be connecting"
    );
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_pods_name_the_gpu_nodes_whose_agent_is_silent() {
    let mut env = env().await;
    env.node("n1", 2).await;
    // A GPU node (as NVIDIA's feature discovery labels it) whose agent never reported, and a
    // CPU node, which is not named.
    let mut quiet = NodeOptions::new("quiet");
    quiet
        .labels
        .insert("nvidia.com/gpu.present".to_owned(), "true".to_owned());
    env.nodes.push(LiteNode::start(&env.server, quiet));
    env.nodes
        .push(LiteNode::start(&env.server, NodeOptions::new("cpu-only")));
    let coordinator = env.start("c1").await;
    env.create_pod("wide", 4, json!({}), json!({})).await;
    let message = eventually(
        "an Unschedulable condition naming the silent node",
        || async {
            let m = unschedulable_message(&env.get("wide").await?)?;
            m.contains("quiet").then_some(m)
        },
    )
    .await;
    // The core's reason first, then the node it could not count.
    assert!(!message.starts_with("no tessera-agent"), "{message}");
    assert!(
        message.contains(
            ". no tessera-agent is reporting from 1 GPU node (quiet), so its GPUs are not counted"
        ),
        "{message}"
    );
    assert!(!message.contains("cpu-only"), "{message}");
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_annotation_is_named_and_nothing_else_is_affected() {
    let mut env = env().await;
    env.node("n1", 4).await;
    let coordinator = env.start("c1").await;
    let _agent = env.allocate_bound_pods();
    env.create_pod(
        "bad",
        1,
        json!({"tessera.dev/gpu-fraction": "1.5"}),
        json!({}),
    )
    .await;
    env.create_pod(
        "good",
        1,
        json!({"tessera.dev/gpu-fraction": "0.5"}),
        json!({}),
    )
    .await;
    let message = eventually("the bad pod's condition", || async {
        unschedulable_message(&env.get("bad").await?)
    })
    .await;
    assert!(message.contains("tessera.dev/gpu-fraction"), "{message}");
    bound(&env, "good").await;
    let event = eventually("an event naming the field", || async {
        env.events_for("bad").await.into_iter().find(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains("tessera.dev/gpu-fraction"))
        })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(node_of(&env.get("bad").await.unwrap()).is_none());
    coordinator.shutdown().await;
    drop(env);
}

async fn queue(client: &kube::Client, name: &str, gpus: f64) {
    let api: Api<Queue> = Api::all(client.clone());
    let q = Queue::new(
        name,
        QueueSpec {
            gpu: Some(GpuQuota {
                quota: gpus,
                ..GpuQuota::default()
            }),
            ..QueueSpec::default()
        },
    );
    api.create(&PostParams::default(), &q).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_evicts_with_an_event_and_places_the_reclaimer() {
    let mut env = env().await;
    env.node("n1", 4).await;
    queue(&env.client, "a", 2.0).await;
    queue(&env.client, "b", 2.0).await;
    let coordinator = env.start("c1").await;
    let _agent = env.allocate_bound_pods();
    for i in 0..4 {
        env.create_pod(
            &format!("a-{i}"),
            1,
            json!({}),
            json!({"tessera.dev/queue": "a"}),
        )
        .await;
        bound(&env, &format!("a-{i}")).await;
    }
    env.create_pod("b-0", 1, json!({}), json!({"tessera.dev/queue": "b"}))
        .await;
    let b = bound(&env, "b-0").await;
    let b_gpu = assignment_of(&b)
        .unwrap()
        .slices()
        .next()
        .unwrap()
        .uuid
        .clone();
    // One of a's pods made room, with an event naming the reclaiming queue.
    let mut evicted = Vec::new();
    for i in 0..4 {
        let name = format!("a-{i}");
        if env.get(&name).await.is_none() {
            evicted.push(name);
        }
    }
    assert_eq!(evicted.len(), 1, "evicted: {evicted:?}");
    let event = eventually("the eviction event", || async {
        env.events_for(&evicted[0])
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Evicted"))
    })
    .await;
    assert!(event.message.unwrap().contains("queue b"));
    // The reclaimer got a GPU no remaining pod holds.
    for p in env.pods().list(&ListParams::default()).await.unwrap() {
        if p.metadata.name.as_deref() != Some("b-0") {
            let held: Vec<_> = assignment_of(&p)
                .map(|a| a.slices().map(|s| s.uuid.clone()).collect())
                .unwrap_or_default();
            assert!(!held.contains(&b_gpu));
        }
    }
    coordinator.shutdown().await;
    drop(env);
}

/// The pods of queue `a` in [`reclaim_from_slow_victims`].
const SLOW_VICTIMS: [&str; 4] = ["a-0", "a-1", "a-2", "a-3"];

/// One 4-GPU node full with the four [`SLOW_VICTIMS`] of queue `a`, whose containers ignore
/// SIGTERM (each runs until its `grace` seconds end), and coordinator `c1` with a
/// `bind_wait_timeout` (2 s) far shorter than that; then `b-0` of queue `b` asks for two GPUs,
/// which reclaim must take from `a`. Returns once two victims are terminating, with their
/// deletion times, after checking the server set those to the eviction plus the grace period.
async fn reclaim_from_slow_victims(
    grace: i64,
) -> (
    Env,
    CoordinatorHandle,
    tokio::task::JoinHandle<()>,
    Vec<(String, jiff::Timestamp)>,
) {
    let mut env = env().await;
    env.node("n1", 4).await;
    queue(&env.client, "a", 2.0).await;
    queue(&env.client, "b", 2.0).await;
    let mut config = env.config("c1");
    config.bind_wait_timeout = Duration::from_secs(2);
    let coordinator = Coordinator::start(env.client.clone(), config)
        .await
        .unwrap();
    let agent = env.allocate_bound_pods();
    for name in SLOW_VICTIMS {
        env.create_pod_with(
            name,
            1,
            json!({"kubelet-lite.tessera.dev/sigterm": "ignore"}),
            json!({"tessera.dev/queue": "a"}),
            json!({"terminationGracePeriodSeconds": grace}),
        )
        .await;
        bound(&env, name).await;
    }
    env.create_pod("b-0", 2, json!({}), json!({"tessera.dev/queue": "b"}))
        .await;
    let evicted_at = jiff::Timestamp::now();
    let victims = eventually("two of a's pods evicted", || async {
        let v = terminating(&env).await;
        (v.len() == 2).then_some(v)
    })
    .await;
    // The server sets deletionTimestamp to the deletion plus the grace period: the end of the
    // wait the coordinator honours.
    for (name, end) in &victims {
        let ahead = end.duration_since(evicted_at).as_secs();
        assert!(
            (grace - 2..=grace + 1).contains(&ahead),
            "{name}: deletionTimestamp {ahead} s after the eviction"
        );
    }
    (env, coordinator, agent, victims)
}

/// The [`SLOW_VICTIMS`] being deleted, with their deletion times.
async fn terminating(env: &Env) -> Vec<(String, jiff::Timestamp)> {
    let mut out = Vec::new();
    for name in SLOW_VICTIMS {
        if let Some(p) = env.get(name).await
            && let Some(t) = p.metadata.deletion_timestamp
        {
            out.push((name.to_owned(), t.0));
        }
    }
    out
}

/// Checks, some seconds into the victims' grace period, that `b-0` waits nominated to `n1`
/// and that no further victim was taken; then that it is bound once they are gone (never
/// before) and that the other two pods of `a` still run.
async fn assert_waits_for_victims_only(env: &Env, victims: &[(String, jiff::Timestamp)]) {
    let b = env.get("b-0").await.unwrap();
    assert_eq!(node_of(&b), None, "b-0 was bound while its victims ran");
    assert_eq!(
        b.status.and_then(|s| s.nominated_node_name).as_deref(),
        Some("n1")
    );
    let names = |v: &[(String, jiff::Timestamp)]| -> Vec<String> {
        v.iter().map(|(n, _)| n.clone()).collect()
    };
    assert_eq!(names(&terminating(env).await), names(victims));
    eventually("b-0 bound after its victims are gone", || async {
        let b = env.get("b-0").await?;
        node_of(&b)?;
        for (name, _) in victims {
            assert!(
                env.get(name).await.is_none(),
                "b-0 was bound while {name} was still there"
            );
        }
        Some(())
    })
    .await;
    let mut survivors = 0;
    for name in SLOW_VICTIMS {
        if let Some(p) = env.get(name).await {
            assert!(
                p.metadata.deletion_timestamp.is_none(),
                "{name} evicted too"
            );
            survivors += 1;
        }
    }
    assert_eq!(survivors, 2, "only what b-0 needed was evicted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimer_waits_for_its_victims_grace_period_and_takes_no_more() {
    let (env, coordinator, _agent, victims) = reclaim_from_slow_victims(12).await;
    let nominated = eventually("b-0 nominated to n1", || async {
        env.get("b-0").await?.status?.nominated_node_name
    })
    .await;
    assert_eq!(nominated, "n1");
    // Past bind_wait_timeout, and long before the grace period ends.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_waits_for_victims_only(&env, &victims).await;
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_lets_a_nominated_pod_wait_for_its_victims() {
    let (env, first, _agent, victims) = reclaim_from_slow_victims(20).await;
    eventually("b-0 nominated to n1", || async {
        env.get("b-0").await?.status?.nominated_node_name
    })
    .await;
    // The leader dies while b-0 waits; the next one knows nothing of the decision but what
    // the API shows: b-0 nominated to n1, two pods terminating there.
    first.kill();
    let second = env.start("c2").await;
    eventually("c2 to lead", || async { second.is_leader().then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_waits_for_victims_only(&env, &victims).await;
    second.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_with_the_same_gpu_count_bind_one_at_a_time_per_node() {
    let mut env = env().await;
    let agent = env.node("n1", 6).await;
    // No kubelet runs n1's pods from here on, so none starts (a started pod is allocated):
    // only what the agent reports tells the coordinator a pod was allocated.
    env.nodes[0].stop();
    let coordinator = env.start("c1").await;
    env.create_pod("one-a", 1, json!({}), json!({})).await;
    let first = bound(&env, "one-a").await;
    env.create_pod("one-b", 1, json!({}), json!({})).await;
    env.create_pod("two", 2, json!({}), json!({})).await;
    // A different count is not held back.
    bound(&env, "two").await;
    // The same count waits while one-a is not allocated by its agent.
    let p = env.get("one-b").await.unwrap();
    assert!(
        node_of(&p).is_none(),
        "one-b bound while one-a is not allocated"
    );
    assert!(
        unschedulable_message(&p).is_none(),
        "a held pod is not unschedulable"
    );
    // The agent's occupancy says one-a is allocated (protocol revision 2).
    let one_a = first.metadata.uid.clone().unwrap();
    env.registry
        .set_occupancy(
            &agent,
            &pb::Occupancy {
                allocated_pod_uids: vec![one_a],
                ..pb::Occupancy::default()
            },
        )
        .unwrap();
    let second = bound(&env, "one-b").await;
    assert_ne!(assignment_of(&first), assignment_of(&second));
    // A revision-1 agent's tessera.dev/allocated still counts.
    env.create_pod("one-c", 1, json!({}), json!({})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        node_of(&env.get("one-c").await.unwrap()).is_none(),
        "one-c bound while one-b is not allocated"
    );
    mark_allocated(&env.pods(), "one-b").await.unwrap();
    bound(&env, "one-c").await;
    coordinator.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_rebuilds_from_the_api_without_binding_twice() {
    let mut env = env().await;
    env.node("n1", 4).await;
    env.node("n2", 4).await;
    let first = env.start("c1").await;
    let _agent = env.allocate_bound_pods();
    for i in 0..2 {
        env.create_pod(
            &format!("gang-{i}"),
            2,
            json!({"tessera.dev/pod-group": "g", "tessera.dev/min-member": "2"}),
            json!({}),
        )
        .await;
    }
    let before: BTreeMap<String, (Option<String>, Option<Assignment>)> = {
        let mut m = BTreeMap::new();
        for i in 0..2 {
            let p = bound(&env, &format!("gang-{i}")).await;
            m.insert(format!("gang-{i}"), (node_of(&p), assignment_of(&p)));
        }
        m
    };
    first.kill();
    // A stale assignment on an unbound pod, naming GPUs a running pod holds (as an earlier
    // coordinator version, which annotated before binding, could leave when it died between
    // the two writes): the Binding's own annotation replaces it.
    let held = before["gang-0"].1.clone().unwrap();
    env.create_pod(
        "orphan",
        2,
        json!({ASSIGNMENT_ANNOTATION: held.to_json()}),
        json!({}),
    )
    .await;
    let second = env.start("c2").await;
    let orphan = bound(&env, "orphan").await;
    assert!(second.is_leader());
    let mine: Vec<_> = assignment_of(&orphan)
        .unwrap()
        .slices()
        .map(|s| s.uuid.clone())
        .collect();
    for (name, (node, assignment)) in &before {
        let p = env.get(name).await.unwrap();
        assert_eq!(&node_of(&p), node, "{name} moved");
        assert_eq!(
            &assignment_of(&p),
            assignment,
            "{name} got a new assignment"
        );
        if node_of(&orphan) == *node {
            let theirs: Vec<_> = assignment
                .as_ref()
                .unwrap()
                .slices()
                .map(|s| s.uuid.clone())
                .collect();
            assert!(
                mine.iter().all(|u| !theirs.contains(u)),
                "orphan shares GPUs with {name}"
            );
        }
    }
    // The real server refuses a second bind (409); the coordinator must not even try one.
    let binds = env
        .server
        .audit()
        .into_iter()
        .filter(|r| r.verb == "create" && r.subresource.as_deref() == Some("binding"))
        .fold(BTreeMap::<String, Vec<u16>>::new(), |mut m, r| {
            m.entry(r.name.unwrap_or_default())
                .or_default()
                .push(r.code);
            m
        });
    assert!(
        binds
            .values()
            .all(|codes| codes.len() == 1 && codes[0] < 300),
        "{binds:?}"
    );
    assert_eq!(binds.len(), 3, "{binds:?}");
    second.shutdown().await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_mid_gang_writes_nothing_more() {
    let mut env = env().await;
    env.node("n1", 4).await;
    env.node("n2", 4).await;
    let _agent = env.allocate_bound_pods();
    let proxy = FaultProxy::start(env.client.clone()).await;
    let coordinator = env.start_with(proxy.client(), "c1").await;
    // While the gang's first Binding is on its way, another replica takes the Lease, and the
    // coordinator notices before that Binding is answered.
    let leadership = coordinator.leadership();
    // Requests received when the coordinator noticed: the status and event writers run beside
    // the loop, so what they sent while it still led may arrive after the first Binding.
    let noticed_at = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let received = Arc::new(proxy.request_counter());
    let noticed = noticed_at.clone();
    proxy.on_nth_binding(
        1,
        Fault::Before(Arc::new(move |admin, _| {
            let mut leadership = leadership.clone();
            let noticed = noticed.clone();
            let received = received.clone();
            Box::pin(async move {
                steal_lease(&admin, "tessera-test").await;
                tokio::time::timeout(WAIT, leadership.wait_for(|leads| !leads))
                    .await
                    .expect("the coordinator noticed it lost the Lease")
                    .expect("the coordinator is running");
                noticed.store(received(), std::sync::atomic::Ordering::SeqCst);
            })
        })),
    );
    let first = create_gang(&env, &proxy).await;
    bound(&env, &first).await;
    assert!(!coordinator.is_leader());
    // Several cycles' worth of time: the deposed replica only reads.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = proxy.requests();
    let first_binding = requests
        .iter()
        .position(|(m, p)| m == http::Method::POST && p.ends_with("/binding"))
        .expect("the first Binding");
    let noticed = noticed_at.load(std::sync::atomic::Ordering::SeqCst);
    assert_ne!(noticed, usize::MAX, "the first Binding's fault ran");
    let at = noticed.max(first_binding + 1).min(requests.len());
    let writes: Vec<_> = requests[at..]
        .iter()
        .filter(|(m, p)| m != http::Method::GET && !p.contains("/leases/"))
        .collect();
    assert!(
        writes.is_empty(),
        "written after losing the Lease: {writes:?}"
    );
    assert_eq!(proxy.bindings(), vec![first.clone()]);
    for i in 0..3 {
        let name = format!("gang-{i}");
        if name != first {
            assert_eq!(node_of(&env.get(&name).await.unwrap()), None, "{name}");
        }
    }
    coordinator.kill();
    drop(env);
}

/// Makes another identity hold the Lease `name` in `default` for an hour, as a replica that
/// took over would.
async fn steal_lease(admin: &kube::Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "default");
    loop {
        let mut lease = leases.get(name).await.expect("the Lease exists");
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some("thief".into());
        spec.lease_duration_seconds = Some(3600);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        match leases.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => return,
            // The holder renewed in between: try again on its new version.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("taking the Lease: {e}"),
        }
    }
}

/// A report from `agent` that GPU `uuid` of node `node` holds `holders` (pod uid, name).
fn report(env: &Env, agent: &Session, node: &str, gpus: u32, holders: &[(u32, &str, &str)]) {
    let occupancy = pb::Occupancy {
        gpus: (0..gpus)
            .map(|i| pb::GpuOccupancy {
                gpu_uuid: format!("GPU-{node}-{i}"),
                health: pb::Health::Healthy as i32,
                shares: holders
                    .iter()
                    .filter(|(g, _, _)| *g == i)
                    .map(|(_, uid, name)| pb::Share {
                        pod_uid: (*uid).to_owned(),
                        pod_namespace: "default".into(),
                        pod_name: (*name).to_owned(),
                        container: "main".into(),
                        ..pb::Share::default()
                    })
                    .collect(),
                ..pb::GpuOccupancy::default()
            })
            .collect(),
        ..pb::Occupancy::default()
    };
    env.registry.set_occupancy(agent, &occupancy).unwrap();
}

/// The scenario of the coexistence loop, made deterministic: a pod of another scheduler is
/// bound first and its agent has not yet said which GPU it took; Tessera's pod must then not
/// be given any GPU that may be that one. Once the report comes, it gets the other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_pods_gpus_are_not_handed_out_before_its_agent_reports_them() {
    let mut env = env().await;
    let agent = env.node("n1", 2).await;
    // Another scheduler's pod, already on n1 (the kubelet admits it against the slots).
    env.create_pod_with(
        "foreign",
        1,
        json!({}),
        json!({}),
        json!({"schedulerName": "default-scheduler", "nodeName": "n1"}),
    )
    .await;
    let foreign = env.get("foreign").await.unwrap();
    let coordinator = env.start("c1").await;
    env.create_pod("ours", 1, json!({}), json!({})).await;
    let message = eventually("ours told its node's GPUs are not reported yet", || async {
        unschedulable_message(&env.get("ours").await?).filter(|m| m.contains("not yet reported"))
    })
    .await;
    assert!(
        message.contains("n1: its agent has not yet reported which GPUs default/foreign holds"),
        "{message}"
    );
    assert!(node_of(&env.get("ours").await.unwrap()).is_none());
    // The agent took GPU 1 for it (the lowest-index guess would have been GPU 0).
    report(
        &env,
        &agent,
        "n1",
        2,
        &[(1, foreign.metadata.uid.as_deref().unwrap(), "foreign")],
    );
    let ours = bound(&env, "ours").await;
    let gpus: Vec<String> = assignment_of(&ours)
        .unwrap()
        .slices()
        .map(|s| s.uuid.clone())
        .collect();
    assert_eq!(gpus, ["GPU-n1-0"]);
    coordinator.shutdown().await;
    drop(env);
}

/// A pod the node refused at admission on its assignment: its replacement is not given the
/// same GPU again until the agent, in a later report, shows the GPU free, and its condition
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_the_node_refused_is_not_assigned_again_until_its_agent_reports_it_free() {
    let mut env = env().await;
    let agent = env.node("n1", 1).await;
    // No kubelet runs n1's pods from here on: this test plays the kubelet's refusal.
    env.nodes[0].stop();
    report(&env, &agent, "n1", 1, &[]);
    let coordinator = env.start("c1").await;
    env.create_pod("web-1", 1, json!({}), json!({})).await;
    let first = bound(&env, "web-1").await;
    let uuid = assignment_of(&first)
        .unwrap()
        .slices()
        .next()
        .unwrap()
        .uuid
        .clone();
    assert_eq!(uuid, "GPU-n1-0");
    // What the kubelet writes when the device plugin refuses the allocation.
    let refusal = json!({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
        "message": format!("Allocate failed due to rpc error: code = Unknown desc = assignment would overcommit GPU {uuid}, which is unexpected")}});
    env.pods()
        .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&refusal))
        .await
        .unwrap();
    // The ReplicaSet's replacement, as it would come at once.
    env.create_pod("web-2", 1, json!({}), json!({})).await;
    let message = eventually("web-2 told the node refused the GPU", || async {
        unschedulable_message(&env.get("web-2").await?).filter(|m| m.contains("refused"))
    })
    .await;
    assert!(
        message.contains("n1 refused GPU-n1-0 for default/web-1 at admission")
            && message.contains("would overcommit"),
        "{message}"
    );
    // A later report that still shows the GPU held keeps it fenced.
    report(&env, &agent, "n1", 1, &[(0, "u-stale", "stale")]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(node_of(&env.get("web-2").await.unwrap()).is_none());
    // Free in a later report: assigned again.
    report(&env, &agent, "n1", 1, &[]);
    let second = bound(&env, "web-2").await;
    assert_eq!(
        assignment_of(&second)
            .unwrap()
            .slices()
            .next()
            .unwrap()
            .uuid,
        "GPU-n1-0"
    );
    coordinator.shutdown().await;
    drop(env);
}
