//! Leader election against a real kube-apiserver (hack/k8s): one leader among
//! two candidates, takeover after the leader dies (lease expiry) and after it steps down
//! (release), never two leaders at once, and expiry judged on the local clock since the
//! Lease last changed, whatever the holder's clock says.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use tessera_coordinator::cluster::leader::{LeaderElector, LeaseConfig};
use tessera_testcluster::{Cluster, ClusterOptions};
use tokio::sync::watch;

/// Deadline for "eventually" conditions.
const WAIT: Duration = Duration::from_secs(30);

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

async fn api_server() -> (Cluster, kube::Client) {
    let server = Cluster::start(ClusterOptions::default());
    let client = server.admin().await;
    // The Lease lives in the coordinator's namespace, which the deployment creates.
    create_namespace(&client, "tessera-system").await;
    (server, client)
}

fn lease(name: &str, duration_secs: u64) -> LeaseConfig {
    LeaseConfig {
        namespace: "tessera-system".into(),
        name: name.into(),
        duration: Duration::from_secs(duration_secs),
        renew_every: Duration::from_millis(250),
    }
}

/// Watches both candidates' signals and records whether both ever said "leader" at once.
struct Monitor {
    double: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    fn start(mut a: watch::Receiver<bool>, mut b: watch::Receiver<bool>) -> Monitor {
        let double = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&double);
        let task = tokio::spawn(async move {
            loop {
                if *a.borrow_and_update() && *b.borrow_and_update() {
                    seen.store(true, Ordering::SeqCst);
                }
                tokio::select! {
                    r = a.changed() => if r.is_err() { return },
                    r = b.changed() => if r.is_err() { return },
                }
            }
        });
        Monitor { double, task }
    }

    fn assert_never_two(self) {
        self.task.abort();
        assert!(
            !self.double.load(Ordering::SeqCst),
            "both candidates were leader at the same time"
        );
    }
}

async fn wait_leader(rx: &mut watch::Receiver<bool>, who: &str) {
    let led = matches!(
        tokio::time::timeout(WAIT, rx.wait_for(|l| *l)).await,
        Ok(Ok(_))
    );
    assert!(led, "{who} never became leader within {WAIT:?}");
}

async fn holder(client: &kube::Client, name: &str) -> (Option<String>, i32) {
    let api: Api<Lease> = Api::namespaced(client.clone(), "tessera-system");
    let spec = api.get(name).await.unwrap().spec.unwrap();
    (
        spec.holder_identity.filter(|h| !h.is_empty()),
        spec.lease_transitions.unwrap_or(0),
    )
}

/// Starts `a`, waits for it to lead, then starts `b` as the standby.
async fn leader_and_standby(
    client: &kube::Client,
    config: LeaseConfig,
) -> (LeaderElector, LeaderElector) {
    let a = LeaderElector::start(client.clone(), "replica-a", config.clone()).unwrap();
    wait_leader(&mut a.is_leader(), "replica-a").await;
    let b = LeaderElector::start(client.clone(), "replica-b", config).unwrap();
    (a, b)
}

#[tokio::test]
async fn one_leader_among_two_and_the_standby_takes_over_after_a_crash() {
    let (server, client) = api_server().await;
    let config = lease("crash", 3);
    let (a, b) = leader_and_standby(&client, config).await;
    let monitor = Monitor::start(a.is_leader(), b.is_leader());
    assert_eq!(
        holder(&client, "crash").await,
        (Some("replica-a".to_string()), 0)
    );

    // The standby keeps polling for several lease durations without taking over, because
    // the leader keeps renewing.
    let mut b_leader = b.is_leader();
    let stayed = tokio::time::timeout(Duration::from_secs(4), b_leader.wait_for(|l| *l))
        .await
        .is_err();
    assert!(stayed, "the standby took a lease that was being renewed");
    assert!(*a.is_leader().borrow());

    // The leader dies without releasing: the standby waits for expiry, then takes over.
    a.abort();
    wait_leader(&mut b_leader, "replica-b").await;
    assert_eq!(
        holder(&client, "crash").await,
        (Some("replica-b".to_string()), 1)
    );
    monitor.assert_never_two();
    b.release().await;
    drop(server);
}

#[tokio::test]
async fn a_graceful_release_hands_over_without_waiting_for_expiry() {
    let (server, client) = api_server().await;
    // A long lease: had the leader not released it, the standby could not lead within
    // the wait below.
    let config = lease("release", 60);
    let (a, b) = leader_and_standby(&client, config).await;
    let monitor = Monitor::start(a.is_leader(), b.is_leader());
    let mut b_leader = b.is_leader();
    a.release().await;
    // Only a yes or no is kept: the `Ref` that `wait_for` returns holds the watch's read
    // lock, and held on it would block the elector's next `send` for good.
    let took_over = matches!(
        tokio::time::timeout(Duration::from_secs(20), b_leader.wait_for(|l| *l)).await,
        Ok(Ok(_))
    );
    assert!(took_over, "the standby did not take over a released lease");
    assert_eq!(
        holder(&client, "release").await,
        (Some("replica-b".to_string()), 1)
    );
    monitor.assert_never_two();

    // The last replica releases too: nobody holds the lease.
    b.release().await;
    assert_eq!(holder(&client, "release").await.0, None);
    drop(server);
}

#[tokio::test]
async fn racing_candidates_elect_exactly_one() {
    let (server, client) = api_server().await;
    let config = lease("race", 2);
    let a = LeaderElector::start(client.clone(), "replica-a", config.clone()).unwrap();
    let b = LeaderElector::start(client.clone(), "replica-b", config).unwrap();
    let monitor = Monitor::start(a.is_leader(), b.is_leader());
    let (mut ra, mut rb) = (a.is_leader(), b.is_leader());
    let ok = tokio::time::timeout(WAIT, async {
        tokio::select! {
            _ = ra.wait_for(|l| *l) => {}
            _ = rb.wait_for(|l| *l) => {}
        }
    })
    .await;
    assert!(ok.is_ok(), "nobody became leader");
    // Give the loser a few rounds to (wrongly) claim the lease too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leaders = [*a.is_leader().borrow(), *b.is_leader().borrow()];
    assert_eq!(leaders.iter().filter(|l| **l).count(), 1, "{leaders:?}");
    let expected = if leaders[0] { "replica-a" } else { "replica-b" };
    assert_eq!(holder(&client, "race").await.0.as_deref(), Some(expected));
    monitor.assert_never_two();
    a.release().await;
    b.release().await;
    drop(server);
}

#[tokio::test]
async fn a_holder_with_a_skewed_clock_keeps_its_lease_while_it_renews() {
    let (server, client) = api_server().await;
    let api: Api<Lease> = Api::namespaced(client.clone(), "tessera-system");
    // Another replica, whose wall clock is an hour behind, holds the Lease and renews it
    // every 250 ms. Read against the local wall clock its renewTime is always an hour old.
    let skewed = || {
        let at = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
        serde_json::json!({
            "metadata": {"name": "skew", "namespace": "tessera-system"},
            "spec": {"holderIdentity": "replica-skewed", "leaseDurationSeconds": 2,
                     "renewTime": at.to_string(), "acquireTime": at.to_string(),
                     "leaseTransitions": 0},
        })
    };
    let first: Lease = serde_json::from_value(skewed()).unwrap();
    api.create(&PostParams::default(), &first).await.unwrap();
    let renewing = Arc::new(AtomicBool::new(true));
    let renewer = {
        let (api, renewing) = (api.clone(), Arc::clone(&renewing));
        tokio::spawn(async move {
            while renewing.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let mut next: Lease = serde_json::from_value(skewed()).unwrap();
                let current = api.get("skew").await.unwrap();
                next.metadata.resource_version = current.metadata.resource_version;
                // The renewal changes the record, as a real holder's renewTime would.
                next.spec.as_mut().unwrap().renew_time =
                    current.spec.and_then(|s| s.renew_time).map(|t| {
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            t.0 + jiff::SignedDuration::from_millis(250),
                        )
                    });
                let _ = api.replace("skew", &PostParams::default(), &next).await;
            }
        })
    };
    let b = LeaderElector::start(client.clone(), "replica-b", lease("skew", 2)).unwrap();
    let mut b_leader = b.is_leader();
    let stayed = tokio::time::timeout(Duration::from_secs(5), b_leader.wait_for(|l| *l))
        .await
        .is_err();
    assert!(
        stayed,
        "a standby took a Lease that was being renewed, because the holder's clock is behind"
    );
    // The holder stops renewing: two seconds after the record last changed, it is expired.
    renewing.store(false, Ordering::SeqCst);
    renewer.await.unwrap();
    wait_leader(&mut b_leader, "replica-b").await;
    assert_eq!(
        holder(&client, "skew").await.0.as_deref(),
        Some("replica-b")
    );
    b.release().await;
    drop(server);
}

/// Log lines written while a test runs, for asserting what an operator would read.
#[derive(Clone, Default)]
struct Logs(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

#[tokio::test]
async fn a_missing_lease_namespace_is_named_once_with_the_flag_and_recovers() {
    let server = Cluster::start(ClusterOptions::default());
    let client = server.admin().await;
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // The test runtime has one thread, so the elector's task logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let config = LeaseConfig {
        namespace: "not-yet".into(),
        ..lease("missing", 2)
    };
    let a = LeaderElector::start(client.clone(), "replica-a", config).unwrap();
    // Eight rounds or so against the missing namespace.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&logs.0.lock()).into_owned();
    let named = text.matches("namespace \"not-yet\" does not exist").count();
    assert_eq!(named, 1, "the cause should be logged once:\n{text}");
    assert!(text.contains("--lease-namespace"), "{text}");

    create_namespace(&client, "not-yet").await;
    wait_leader(&mut a.is_leader(), "replica-a").await;
    a.release().await;
    drop(server);
}

#[test]
fn unusable_timings_are_rejected_naming_the_setting() {
    let mut config = LeaseConfig::default();
    assert!(config.validate().is_ok());
    config.renew_every = config.duration;
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("renew interval"), "{e}");
    let config = LeaseConfig {
        duration: Duration::from_millis(1500),
        ..LeaseConfig::default()
    };
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("whole number of seconds"), "{e}");
}
