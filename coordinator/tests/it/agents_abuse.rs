//! What a hostile or broken client cannot do to the coordinator's agent port, on real peers:
//! a real coordinator leading through a Lease on the real kube-apiserver (hack/k8s), tokens
//! its issuer bound to agent pods, gRPC over real sockets. Hellos listing 90,000 GPUs, and
//! one over the size limit, are refused at once while the leader keeps its Lease and a
//! legitimate agent is welcomed; 500 streams without valid credentials on one connection
//! cause a bounded number of TokenReviews, counted in the API server's audit log.

use crate::agents::{FakeAgent, Service, channel, hello};
use crate::agents_real_agent::{AUDIENCE, agent_token};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use prost::Message;
use tessera_coordinator::agents::auth::{DEFAULT_REFUSAL_TTL, DEFAULT_REVIEWS_PER_MINUTE};
use tessera_coordinator::agents::{Authenticator, limits};
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig};
use tessera_proto::tessera::v1 as pb;
use tessera_testcluster::{Cluster, ClusterOptions, eventually};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Bound on waiting for the coordinator to lead; generous, for a loaded machine.
const WAIT: Duration = Duration::from_secs(60);

/// A Hello for `node` listing `gpus` GPUs, each as short as a GPU can be described.
fn hello_with_gpus(node: &str, gpus: u32) -> pb::Hello {
    let mut hello = hello(node, pb::PROTOCOL_VERSION);
    let inventory = hello
        .inventory
        .as_mut()
        .expect("hello() lists an inventory");
    inventory.links = None;
    inventory.gpus = (0..gpus)
        .map(|i| pb::Gpu {
            uuid: i.to_string(),
            index: i,
            ..Default::default()
        })
        .collect();
    hello
}

/// The answer to `hello` on a connection of its own: the first message that is not a
/// heartbeat, or the status the stream ended with.
async fn answer_to(
    addr: SocketAddr,
    token: &str,
    hello: pb::Hello,
) -> Result<Option<pb::coordinator_message::Body>, Status> {
    FakeAgent::connect(addr, Some(token), hello)
        .await?
        .next()
        .await
}

/// Two Hellos listing 90,000 GPUs each (about 1 MB, within the size limit), from the node's
/// own valid token, and one just over the size limit: each refused at once with a status
/// naming the cause, while the leader keeps its Lease, and a legitimate agent connecting
/// right after is welcomed. Two runtime workers, as a small coordinator pod has. Fails on
/// the code before #33: the GPUs' uniqueness was checked pairwise (4·10⁹ comparisons per
/// Hello on both workers, so the Lease went unrenewed and the leader stepped down), and the
/// oversized Hello ended its stream with status OK and no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_90000_gpu_hello_is_refused_at_once_and_the_leader_keeps_its_lease() {
    let api = Cluster::start(ClusterOptions::default());
    let client = api.admin().await;
    let token = agent_token(&api, &client, "node-a").await;
    let config = CoordinatorConfig {
        identity: "replica-a".into(),
        lease: LeaseConfig {
            namespace: "tessera-system".into(),
            name: "tessera-abuse".into(),
            duration: Duration::from_secs(10),
            renew_every: Duration::from_secs(1),
        },
        agent_listen: Some("127.0.0.1:0".parse().unwrap()),
        authenticator: Authenticator::token_review(client.clone(), Vec::new())
            .with_audience(Some(AUDIENCE.into())),
        ..CoordinatorConfig::default()
    };
    let coordinator = Coordinator::start(client.clone(), config).await.unwrap();
    let mut leading = coordinator.leadership();
    let led = matches!(
        tokio::time::timeout(WAIT, leading.wait_for(|l| *l)).await,
        Ok(Ok(_))
    );
    assert!(led, "the coordinator never led");
    let stepped_down = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stepped_down = Arc::clone(&stepped_down);
        tokio::spawn(async move {
            if leading.wait_for(|l| !*l).await.is_ok() {
                stepped_down.store(true, Ordering::SeqCst);
            }
        })
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), "tessera-system");
    let transitions = |l: Lease| l.spec.and_then(|s| s.lease_transitions).unwrap_or(0);
    let before = transitions(leases.get("tessera-abuse").await.unwrap());
    let addr = coordinator.agent_addr().unwrap();

    let huge = hello_with_gpus("node-a", 90_000);
    let size = huge.encoded_len();
    assert!(
        size < limits::DEFAULT_MAX_MESSAGE_BYTES,
        "{size} bytes: the GPU cap, not the size limit, must refuse this one"
    );
    let mut oversized = hello_with_gpus("node-a", 1);
    oversized.inventory.as_mut().unwrap().gpus[0].model =
        "m".repeat(limits::DEFAULT_MAX_MESSAGE_BYTES);
    let (first, second, over) = tokio::join!(
        answer_to(addr, &token, huge.clone()),
        answer_to(addr, &token, huge),
        answer_to(addr, &token, oversized),
    );
    for refused in [first, second] {
        let status = refused.expect_err("a 90,000-GPU Hello is refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("hello.inventory.gpus")
                && status.message().contains("at most 64 GPUs per node"),
            "{}",
            status.message()
        );
    }
    let status = over.expect_err("a Hello over the size limit is refused, not ended with OK");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--agent-max-message-bytes"),
        "{}",
        status.message()
    );

    // A legitimate agent right after: welcomed.
    let mut agent = FakeAgent::connect(addr, Some(&token), hello("node-a", pb::PROTOCOL_VERSION))
        .await
        .unwrap()
        .beat();
    agent.expect_welcome().await;
    let registry = coordinator.agents();
    eventually("node-a registered with its 4 GPUs", || async {
        registry
            .get("node-a")
            .is_some_and(|n| n.connected && n.gpus.len() == 4)
            .then_some(())
    })
    .await;

    // The leader held its Lease throughout.
    assert!(
        !stepped_down.load(Ordering::SeqCst),
        "the leader stepped down while refusing the Hellos"
    );
    assert!(coordinator.is_leader());
    let lease = leases.get("tessera-abuse").await.unwrap();
    assert_eq!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("replica-a")
    );
    assert_eq!(transitions(lease), before, "the Lease changed hands");
    watcher.abort();
    drop(agent);
    coordinator.shutdown().await;
    drop(api);
}

/// The TokenReviews the API server has answered so far, from its audit log.
fn token_reviews(api: &Cluster) -> usize {
    api.audit()
        .iter()
        .filter(|r| r.resource == "tokenreviews" && r.verb == "create")
        .count()
}

/// The codes 250 streams opened at once on `channel` end with, presenting `token(i)`.
/// UNAVAILABLE is the per-connection stream limit's REFUSED_STREAM: the client opened the
/// next stream as soon as it saw one end, before the server counted it closed.
async fn storm(channel: &Channel, token: impl Fn(usize) -> String) -> Vec<Code> {
    let streams = (0..250).map(|i| {
        let (channel, token) = (channel.clone(), token(i));
        async move {
            let hello = hello("node-a", pb::PROTOCOL_VERSION);
            match FakeAgent::connect_on(channel, Some(&token), hello).await {
                Err(status) => status.code(),
                Ok(mut agent) => match agent.next().await {
                    Err(status) => status.code(),
                    Ok(_) => Code::Ok,
                },
            }
        }
    });
    futures::future::join_all(streams).await
}

/// 500 streams on one connection, none with valid credentials: 250 repeating one made-up
/// token, then 250 each with a new one. A refusal is cached (one review for the repeated
/// token) and a peer's reviews are budgeted, so the API server sees at most the budget plus
/// its refill over the test's duration, not one review per stream. Counted in the real API
/// server's audit log. Fails on the code before #33: 500 TokenReviews.
#[tokio::test]
async fn unauthenticated_streams_on_one_connection_cause_a_bounded_number_of_token_reviews() {
    let api = Cluster::start(ClusterOptions {
        audit: true,
        ..ClusterOptions::default()
    });
    let client = api.admin().await;
    let auth = Authenticator::token_review(client, Vec::new()).with_audience(Some(AUDIENCE.into()));
    let service = Service::start(auth, Duration::from_secs(1)).await;
    let before = token_reviews(&api);
    // One connection for every stream.
    let channel = channel(service.addr).await;
    let started = Instant::now();

    let repeated = storm(&channel, |_| "made-up-token".to_owned()).await;
    let elapsed = started.elapsed();
    assert!(
        repeated
            .iter()
            .all(|c| matches!(c, Code::Unauthenticated | Code::Unavailable)),
        "{repeated:?}"
    );
    assert!(repeated.contains(&Code::Unauthenticated), "{repeated:?}");
    let reviews = eventually("the repeated token's review in the audit log", || async {
        let n = token_reviews(&api) - before;
        (n >= 1).then_some(n)
    })
    .await;
    // One review, and one more for every time the cached refusal ran out meanwhile.
    let bound = 1 + (elapsed.as_secs_f64() / DEFAULT_REFUSAL_TTL.as_secs_f64()) as usize;
    assert!(
        reviews <= bound,
        "{reviews} TokenReviews for 250 streams repeating one token in {elapsed:?}"
    );

    let fresh = storm(&channel, |i| format!("made-up-token-{i}")).await;
    let elapsed = started.elapsed();
    assert!(
        fresh.iter().all(|c| matches!(
            c,
            Code::Unauthenticated | Code::ResourceExhausted | Code::Unavailable
        )),
        "{fresh:?}"
    );
    let reviews = eventually("the new tokens' reviews in the audit log", || async {
        let n = token_reviews(&api) - before;
        (n >= 2).then_some(n)
    })
    .await;
    // The peer's budget: its burst, then as many a minute, over the whole test.
    let per_minute = DEFAULT_REVIEWS_PER_MINUTE as f64;
    let budget = per_minute + per_minute * elapsed.as_secs_f64() / 60.0;
    assert!(
        reviews as f64 <= budget + 1.0,
        "{reviews} TokenReviews for 500 streams in {elapsed:?}; the budget allows {budget:.1}"
    );
    let limited = fresh
        .iter()
        .filter(|c| **c != Code::Unauthenticated)
        .count();
    assert!(
        limited as f64 >= 250.0 - budget,
        "only {limited} of 250 new tokens were refused unreviewed"
    );
    assert!(fresh.contains(&Code::ResourceExhausted), "{fresh:?}");
    service.shutdown().await;
    drop(api);
}
