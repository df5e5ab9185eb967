//! The binder against the real kube-apiserver, with a fault-injecting proxy (real TCP socket)
//! in front of it for what the server will not do on demand: every way one Binding of a unit
//! can fail, and what the binder reports so the scheduler's single rollback leaves no partial
//! gang. The assignment travels in the Binding: one write per pod, no pod patch.

use crate::fault_proxy;

use std::sync::Arc;
use std::time::Duration;

use fault_proxy::{Fault, FaultProxy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tessera_contract::keys::{
    ASSIGNED_AT as ASSIGNED_AT_ANNOTATION, ASSIGNMENT as ASSIGNMENT_ANNOTATION,
};
use tessera_coordinator::cluster::binder::{BindFailure, BindTarget, Binder, UnitOutcome};
use tessera_coordinator::cluster::events::EventWriter;
use tessera_coordinator::cluster::gate;
use tessera_core::model::{Assignment, ContainerAssignment, GpuSlice};
use tessera_testcluster::{Cluster, ClusterOptions};
use tokio::sync::watch;

struct Env {
    cluster: Cluster,
    admin: kube::Client,
    proxy: FaultProxy,
}

async fn env() -> Env {
    let cluster = Cluster::start(ClusterOptions {
        controllers: Some("serviceaccount-controller".into()),
        audit: true,
        ..ClusterOptions::default()
    });
    let admin = cluster.admin().await;
    tessera_testcluster::wait_service_account(&admin, "default", "default").await;
    let proxy = FaultProxy::start(admin.clone()).await;
    Env {
        cluster,
        admin,
        proxy,
    }
}

async fn wait<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    tessera_testcluster::wait_for(what, probe, || async { String::new() }).await
}

fn pod_manifest(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "tessera", "containers": [{"name": "main", "image": "cuda"}]},
    }))
    .unwrap()
}

fn assignment(gpu: &str) -> Assignment {
    Assignment {
        containers: vec![ContainerAssignment {
            container: "main".into(),
            gpus: vec![GpuSlice {
                uuid: gpu.into(),
                memory_mib: 81920,
                compute_milli: 1000,
            }],
        }],
    }
}

impl Env {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), "default")
    }

    /// A binder writing through the proxy.
    fn binder(&self, call_timeout: Duration) -> Binder {
        let client = self.proxy.client();
        Binder::new(client.clone(), EventWriter::new(client, "tessera", "test"))
            .with_call_timeout(call_timeout)
    }

    /// Creates the pods `<prefix>-0..n` and the targets binding them to node `n1`.
    async fn unit(&self, prefix: &str, n: usize) -> Vec<BindTarget> {
        let mut targets = Vec::new();
        for i in 0..n {
            let name = format!("{prefix}-{i}");
            let pod = self
                .pods()
                .create(&PostParams::default(), &pod_manifest(&name))
                .await
                .unwrap();
            targets.push(BindTarget {
                namespace: "default".into(),
                name,
                uid: pod.metadata.uid.unwrap(),
                node: "n1".into(),
                assignment: assignment(&format!("GPU-{i}")),
            });
        }
        targets
    }

    async fn get(&self, name: &str) -> Option<Pod> {
        self.pods().get_opt(name).await.unwrap()
    }
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The first member bound, the second failed as `maybe_bound` says, the third never tried.
fn assert_stopped_at_second(
    env: &Env,
    unit: &[BindTarget],
    outcome: &UnitOutcome,
    maybe_bound: bool,
) {
    assert_eq!(outcome.bound, vec![unit[0].uid.clone()], "{outcome:?}");
    let failed = outcome.failed.as_ref().expect("a failure");
    assert_eq!(failed.uid, unit[1].uid);
    assert_eq!(failed.maybe_bound, maybe_bound, "{failed:?}");
    assert!(
        !env.proxy.bindings().contains(&unit[2].name),
        "a member after the failure was tried"
    );
}

/// Rolls back what was bound and checks it is being deleted (evicted with its UID).
async fn assert_rolled_back(env: &Env, binder: &Binder, unit: &[BindTarget]) {
    let outcome = binder
        .roll_back_unit(&[unit[0].evict_target()], "test rollback")
        .await;
    assert_eq!(outcome.rolled_back, vec![unit[0].uid.clone()]);
    assert!(outcome.retry.is_empty());
    let p = env.get(&unit[0].name).await;
    assert!(
        p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the bound member was not evicted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_is_bound_with_one_write_per_pod_carrying_the_assignment() {
    let env = env().await;
    let binder = env.binder(Duration::from_secs(10));
    let unit = env.unit("ok", 2).await;
    let outcome = binder.bind_unit(&unit).await;
    assert_eq!(
        outcome.bound,
        unit.iter().map(|t| t.uid.clone()).collect::<Vec<_>>()
    );
    assert_eq!(outcome.failed, None);
    for t in &unit {
        let p = env.get(&t.name).await.unwrap();
        assert_eq!(node_of(&p), Some("n1"));
        assert_eq!(
            annotation(&p, ASSIGNMENT_ANNOTATION),
            Some(t.assignment.to_json().as_str()),
            "the Binding's annotations are on the pod"
        );
        assert!(annotation(&p, ASSIGNED_AT_ANNOTATION).is_some());
    }
    // The server's record: per pod one create of pods/binding and no write to the pod itself.
    let audit = env.cluster.audit();
    for t in &unit {
        let writes: Vec<String> = audit
            .iter()
            .filter(|r| r.name.as_deref() == Some(t.name.as_str()) && r.resource == "pods")
            .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
            .map(|r| format!("{} {:?}", r.verb, r.subresource))
            .collect();
        assert_eq!(
            writes,
            vec![
                "create None".to_owned(),
                "create Some(\"binding\")".to_owned()
            ],
            "{}: the test's create, then the one Binding",
            t.name
        );
    }
}

/// A fault that runs `act` on the admin's pod API, with the pod's name, just before the proxy
/// forwards that pod's Binding: another writer winning the race.
fn before<F, Fut>(act: F) -> Fault
where
    F: Fn(Api<Pod>, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let act = Arc::new(act);
    Fault::Before(Arc::new(move |admin, name| {
        let act = act.clone();
        Box::pin(async move { act(Api::namespaced(admin, "default"), name).await })
    }))
}

/// Creates a unit of three named `prefix-*`, has the proxy apply `fault` to the second
/// member's Binding, binds the unit and checks it stopped there with the pod not bound by
/// this call.
async fn refused(
    env: &Env,
    binder: &Binder,
    prefix: &str,
    fault: Fault,
) -> (Vec<BindTarget>, BindFailure) {
    let unit = env.unit(prefix, 3).await;
    env.proxy.on_binding(&unit[1].name, fault);
    let outcome = binder.bind_unit(&unit).await;
    assert_stopped_at_second(env, &unit, &outcome, false);
    let failure = outcome.failed.clone().unwrap_or_else(|| unreachable!());
    (unit, failure)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_binding_stops_the_unit_and_binds_nothing() {
    let env = env().await;
    let binder = env.binder(Duration::from_secs(10));

    // 409: another writer bound the pod elsewhere just before.
    let (unit, failure) = refused(
        &env,
        &binder,
        "elsewhere",
        before(|pods, name| async move {
            let binding = json!({"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": "default"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "other"}});
            let _: serde_json::Value = pods
                .create_subresource("binding", &name, &PostParams::default(), &binding)
                .await
                .expect("the other writer binds");
        }),
    )
    .await;
    assert!(failure.error.contains("409"), "{failure:?}");
    let other = env.get(&unit[1].name).await.unwrap();
    assert_eq!(
        node_of(&other),
        Some("other"),
        "the other writer's bind stands"
    );
    assert_eq!(
        annotation(&other, ASSIGNMENT_ANNOTATION),
        None,
        "a refused Binding writes no assignment"
    );
    assert_rolled_back(&env, &binder, &unit).await;

    // 404: the pod was deleted.
    let (unit, failure) = refused(
        &env,
        &binder,
        "deleted",
        before(|pods, name| async move {
            pods.delete(&name, &DeleteParams::default()).await.unwrap();
        }),
    )
    .await;
    assert!(failure.error.contains("404"), "{failure:?}");
    assert_rolled_back(&env, &binder, &unit).await;

    // 409 by the UID precondition: deleted and recreated under the same name.
    let (unit, failure) = refused(
        &env,
        &binder,
        "recreated",
        before(|pods, name| async move {
            pods.delete(&name, &DeleteParams::default()).await.unwrap();
            pods.create(&PostParams::default(), &pod_manifest(&name))
                .await
                .unwrap();
        }),
    )
    .await;
    assert!(failure.error.contains("409"), "{failure:?}");
    let successor = env.get(&unit[1].name).await.unwrap();
    assert_ne!(
        successor.metadata.uid.as_deref(),
        Some(unit[1].uid.as_str())
    );
    assert_eq!(node_of(&successor), None, "the recreated pod was bound");
    assert_eq!(annotation(&successor, ASSIGNMENT_ANNOTATION), None);
    assert_rolled_back(&env, &binder, &unit).await;

    // 429: throttled before the server's handler; nothing happened to the pod.
    let (unit, failure) = refused(&env, &binder, "throttled", Fault::Throttle).await;
    assert!(failure.error.contains("429"), "{failure:?}");
    assert_eq!(node_of(&env.get(&unit[1].name).await.unwrap()), None);
    assert_rolled_back(&env, &binder, &unit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_binding_is_looked_up() {
    let env = env().await;
    let binder = env.binder(Duration::from_secs(1));

    // The write went through and the connection broke before the answer: the pod is found
    // bound as asked, so the unit goes on.
    let unit = env.unit("dropped", 3).await;
    env.proxy.on_binding(&unit[1].name, Fault::DropAnswer);
    let outcome = binder.bind_unit(&unit).await;
    assert_eq!(outcome.failed, None, "{outcome:?}");
    assert_eq!(outcome.bound.len(), 3);
    assert_eq!(node_of(&env.get(&unit[1].name).await.unwrap()), Some("n1"));

    // The connection broke before the request reached the server: not bound, but reported as
    // possibly bound (a client cannot tell this from a lost answer).
    let unit = env.unit("broken", 3).await;
    env.proxy.on_binding(&unit[1].name, Fault::DropRequest);
    let outcome = binder.bind_unit(&unit).await;
    assert_stopped_at_second(&env, &unit, &outcome, true);
    assert_eq!(node_of(&env.get(&unit[1].name).await.unwrap()), None);
    assert_rolled_back(&env, &binder, &unit).await;

    // No answer within the call timeout, and the server applies the bind later: reported as
    // a failure that may still be bound, for the scheduler to watch and roll back.
    let unit = env.unit("late", 3).await;
    env.proxy
        .on_binding(&unit[1].name, Fault::Delay(Duration::from_secs(3)));
    let outcome = binder.bind_unit(&unit).await;
    assert_stopped_at_second(&env, &unit, &outcome, true);
    let BindFailure { error, .. } = outcome.failed.clone().unwrap();
    assert!(error.contains("no answer"), "{error}");
    wait("the late bind to land", || async {
        env.get(&unit[1].name)
            .await
            .filter(|p| node_of(p) == Some("n1"))
    })
    .await;
    assert_rolled_back(&env, &binder, &unit).await;

    // A rollback eviction unanswered within the call timeout comes back to be tried again;
    // the server applies it late.
    let unit = env.unit("slow-evict", 1).await;
    assert_eq!(binder.bind_unit(&unit).await.failed, None);
    env.proxy
        .on_next_evictions(1, Fault::Delay(Duration::from_secs(3)));
    let rollback = binder
        .roll_back_unit(&[unit[0].evict_target()], "test rollback")
        .await;
    assert_eq!(rollback.retry, vec![unit[0].uid.clone()], "{rollback:?}");
    wait("the late eviction to land", || async {
        env.get(&unit[0].name)
            .await
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_binder_sends_nothing_more() {
    let env = env().await;
    let (leading, rx) = watch::channel(true);
    let client = gate::gated(env.proxy.client(), rx);
    let binder = Binder::new(client.clone(), EventWriter::new(client, "tessera", "test"));
    let unit = env.unit("deposed", 3).await;
    // The Lease is lost while the first member's Binding is on its way.
    let leading = Arc::new(leading);
    env.proxy.on_binding(
        &unit[0].name,
        Fault::Before(Arc::new(move |_, _| {
            leading.send_replace(false);
            Box::pin(async {})
        })),
    );
    let sent_before = env.proxy.requests().len();
    let outcome = binder.bind_unit(&unit).await;
    assert_eq!(outcome.bound, vec![unit[0].uid.clone()]);
    let failure = outcome.failed.expect("stopped");
    assert!(failure.deposed && !failure.maybe_bound, "{failure:?}");
    assert_eq!(failure.uid, unit[1].uid);
    // Its rollback is not sent either: the new leader deals with the partial unit.
    let rollback = binder
        .roll_back_unit(&[unit[0].evict_target()], "test rollback")
        .await;
    assert_eq!(rollback.retry, vec![unit[0].uid.clone()]);
    let after: Vec<_> = env.proxy.requests().split_off(sent_before);
    assert_eq!(
        after,
        vec![(
            http::Method::POST,
            format!("/api/v1/namespaces/default/pods/{}/binding", unit[0].name)
        )],
        "after the first Binding nothing reached the server (no Binding, eviction or event)"
    );
    assert_eq!(node_of(&env.get(&unit[1].name).await.unwrap()), None);
}
