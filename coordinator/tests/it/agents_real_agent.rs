//! The node agent's own reporting client (`tessera_agent::report`) against the
//! coordinator's agent service, with TokenReview authentication through a real
//! kube-apiserver (hack/k8s) and tokens its issuer bound to agent pods: the real inventory (simulated A100 machine with NVLink pairs and a MIG GPU)
//! lands in the registry, health follows an XID, a token of another node is refused, and a
//! stream ends when its token expires, the agent coming back with its rotated token.

use crate::agents::{FakeAgent, Service, end_status, hello};
use crate::tls;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::api::{Api, PostParams};
use tessera_agent::assignments::NoAssignments;
use tessera_agent::enforce::usage::{PodMeter, ProcessAttribution};
use tessera_agent::gpu::XidEvent;
use tessera_agent::gpu::sim::SimBackend;
use tessera_agent::ledger::Ledger;
use tessera_agent::node::{Node, NodeOptions};
use tessera_coordinator::agents::{self, AgentRegistry, Authenticator, DEFAULT_AGENT_USER};
use tessera_proto::tessera::v1 as pb;
use tessera_testcluster::{Cluster, ClusterOptions, pod_bound_token};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(30);

/// The agent ServiceAccount's token as the kubelet projects it into the agent pod on `node`
/// (the real issuer binds it to the pod, so TokenReview names the node).
pub(crate) async fn agent_token(cluster: &Cluster, client: &kube::Client, node: &str) -> String {
    agent_token_for(cluster, client, node, &[AUDIENCE]).await
}

/// The coordinator's token audience, as the chart configures both sides.
pub(crate) const AUDIENCE: &str = "tessera";

/// Like [`agent_token`], for `audiences` (empty: the API server's own).
async fn agent_token_for(
    cluster: &Cluster,
    client: &kube::Client,
    node: &str,
    audiences: &[&str],
) -> String {
    let _ = cluster.token("tessera-system", "tessera-agent", &[]);
    let n: KubeNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    .unwrap();
    Api::<KubeNode>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap();
    let pod = format!("agent-{node}");
    let p: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": "tessera-system"},
        "spec": {"nodeName": node, "serviceAccountName": "tessera-agent",
                 "containers": [{"name": "agent", "image": "tessera-agent"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "tessera-system")
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    pod_bound_token(client, "tessera-system", "tessera-agent", &pod, audiences).await
}

/// `token` (one the cluster's issuer minted) as the issuer would have minted it to expire
/// `lifetime` from now: the same header and claims, `iat`/`nbf`/`exp` moved, signed with the
/// cluster's ServiceAccount key. The TokenRequest API refuses lifetimes under 10 minutes, too
/// long for a test to wait out; the API server checks this token like any other it issued.
pub(crate) fn reissued_to_expire(cluster: &Cluster, token: &str, lifetime: Duration) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.split('.');
    let (header, claims) = (parts.next().unwrap(), parts.next().unwrap());
    let mut claims: serde_json::Value =
        serde_json::from_slice(&b64.decode(claims).unwrap()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    claims["iat"] = (now - 1).into();
    claims["nbf"] = (now - 1).into();
    claims["exp"] = (now + lifetime.as_secs()).into();
    let signed = format!("{header}.{}", b64.encode(claims.to_string()));
    let pem = std::fs::read_to_string(cluster.dir().join("pki/sa.key")).unwrap();
    let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(der)
        .unwrap();
    let key = ring::signature::RsaKeyPair::from_pkcs8(&der).unwrap();
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .unwrap();
    format!("{signed}.{}", b64.encode(signature))
}

fn agent_node(dir: &Path) -> Arc<Node> {
    let shape = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/gpus/a100-8x-mig.yaml");
    let sim = Arc::new(SimBackend::from_file(shape).unwrap());
    let ledger = Ledger::open(&dir.join("state")).unwrap();
    Arc::new(Node::new(sim, ledger, NodeOptions::default()).unwrap())
}

async fn wait_for(registry: &AgentRegistry, what: &str, f: impl Fn(&AgentRegistry) -> bool) {
    let mut changes = registry.changes();
    let ok = tokio::time::timeout(WAIT, async {
        while !f(registry) {
            let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "registry never showed {what}");
}

#[tokio::test]
async fn the_real_agent_reports_with_its_token_and_only_for_its_node() {
    let api = Cluster::start(ClusterOptions::default());
    let client = api.admin().await;
    let token_a = agent_token(&api, &client, "node-a").await;
    let token_b = agent_token(&api, &client, "node-b").await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let registry = AgentRegistry::new();
    let (stop, stop_rx) = watch::channel(false);
    let service = tokio::spawn(agents::serve(
        listener,
        registry.clone(),
        Authenticator::token_review(client, vec![DEFAULT_AGENT_USER.to_string()])
            .with_audience(Some(AUDIENCE.into())),
        stop_rx,
    ));

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token-a"), format!("{token_a}\n")).unwrap();
    std::fs::write(dir.path().join("token-b"), &token_b).unwrap();
    let meter = || {
        PodMeter::new(
            ProcessAttribution::new(dir.path().join("proc")),
            Arc::new(NoAssignments),
        )
    };

    // node-a with its own token.
    let node = agent_node(&dir.path().join("a"));
    let reporter_a = tokio::spawn(tessera_agent::report::run_authenticated(
        endpoint.clone(),
        Arc::clone(&node),
        "node-a".into(),
        meter(),
        tessera_agent::report::Security {
            token_file: Some(dir.path().join("token-a")),
            ca_file: None,
        },
        None,
    ));
    // An agent on node-b that claims to be node-c: refused over and over.
    let reporter_c = tokio::spawn(tessera_agent::report::run_authenticated(
        endpoint.clone(),
        agent_node(&dir.path().join("c")),
        "node-c".into(),
        meter(),
        tessera_agent::report::Security {
            token_file: Some(dir.path().join("token-b")),
            ca_file: None,
        },
        None,
    ));
    // An agent whose token file is missing connects without a token: refused.
    let reporter_d = tokio::spawn(tessera_agent::report::run_authenticated(
        endpoint.clone(),
        agent_node(&dir.path().join("d")),
        "node-d".into(),
        meter(),
        tessera_agent::report::Security {
            token_file: Some(dir.path().join("no-such-token")),
            ca_file: None,
        },
        None,
    ));

    wait_for(&registry, "node-a with its occupancy", |r| {
        r.get("node-a")
            .is_some_and(|n| n.connected && n.occupancy.len() == 8)
    })
    .await;
    let a = registry.get("node-a").unwrap();
    assert_eq!(a.gpus.len(), 8);
    let islands: Vec<_> = a.gpus.iter().map(|g| g.nvlink_island).collect();
    assert_eq!(
        islands,
        vec![
            Some(0),
            Some(0),
            Some(1),
            Some(1),
            Some(2),
            Some(2),
            Some(3),
            Some(3)
        ]
    );
    let mig = a.gpus[7].mig.as_ref().expect("GPU 7 is in MIG mode");
    assert_eq!(mig.len(), 4);
    assert_eq!(mig[0].profile, "3g.20gb");
    assert_eq!(mig[0].compute_milli, 428);
    assert!(a.gpus[..7].iter().all(|g| g.mig.is_none()));

    // A fatal XID on GPU 5 reaches the registry as a health change.
    let uuid5 = a.gpus[5].uuid.clone();
    node.on_xid(&XidEvent {
        uuid: uuid5.clone(),
        xid: 79,
    });
    wait_for(&registry, "GPU 5 unhealthy", |r| {
        r.get("node-a").is_some_and(|n| !n.gpus[5].healthy)
    })
    .await;
    assert!(
        registry.get("node-a").unwrap().health_reasons[&uuid5].contains("79"),
        "{:?}",
        registry.get("node-a").unwrap().health_reasons
    );

    // By now the impostor and the tokenless agent have tried at least once.
    assert!(registry.get("node-c").is_none());
    assert!(registry.get("node-d").is_none());
    assert_eq!(registry.connected_count(), 1);

    // The agent goes away: its node is marked disconnected.
    reporter_a.abort();
    wait_for(&registry, "node-a disconnected", |r| {
        r.get("node-a").is_some_and(|n| !n.connected)
    })
    .await;

    reporter_c.abort();
    reporter_d.abort();
    stop.send(true).unwrap();
    tokio::time::timeout(WAIT, service)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(api);
}

#[tokio::test]
async fn a_token_for_the_api_server_is_not_accepted_by_the_coordinator() {
    let api = Cluster::start(ClusterOptions::default());
    let client = api.admin().await;
    let auth = Authenticator::token_review(client.clone(), vec![DEFAULT_AGENT_USER.to_string()])
        .with_audience(Some(AUDIENCE.into()));
    // The agent pod's ordinary token (the API server's audience), bound to its node.
    let ordinary = agent_token_for(&api, &client, "node-a", &[]).await;
    let error = auth
        .authenticate(Some(&format!("Bearer {ordinary}")), None)
        .await
        .expect_err("a token for the API server is refused");
    let text = error.to_string();
    assert!(
        text.contains("audience \"tessera\"") && text.contains("--coordinator-token-file"),
        "{text}"
    );
    // The projected token for the coordinator's audience is accepted, bound to its node.
    let projected = pod_bound_token(
        &client,
        "tessera-system",
        "tessera-agent",
        "agent-node-a",
        &[AUDIENCE],
    )
    .await;
    let identity = auth
        .authenticate(Some(&format!("Bearer {projected}")), None)
        .await
        .expect("the coordinator's own token");
    assert_eq!(identity.node.as_deref(), Some("node-a"));
    drop(api);
}

/// The stream over TLS: an agent that trusts the coordinator's CA reports; one with another CA,
/// and one speaking plaintext, never reach the registry (their token would otherwise cross
/// the network readable).
#[tokio::test]
async fn agents_reach_a_tls_coordinator_only_through_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = tls::write_pair(&certs);
    std::fs::write(dir.path().join("ca.crt"), &ca).unwrap();
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(dir.path().join("other-ca.crt"), tls::write_pair(&other)).unwrap();

    let files = tessera_coordinator::tls::CertFiles {
        cert_file: certs.join("tls.crt"),
        key_file: certs.join("tls.key"),
    };
    let (cert, _reloading) = tessera_coordinator::tls::ReloadingCert::load(
        &files,
        "agent service",
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let registry = AgentRegistry::new();
    let (_stop, stop_rx) = watch::channel(false);
    let options = agents::ServiceOptions {
        tls: Some(cert),
        ..agents::ServiceOptions::default()
    };
    tokio::spawn(agents::serve_with(
        listener,
        registry.clone(),
        Authenticator::Disabled,
        options,
        stop_rx,
    ));
    let meter = || {
        PodMeter::new(
            ProcessAttribution::new(dir.path().join("proc")),
            Arc::new(NoAssignments),
        )
    };
    let report = |node: &str, endpoint: String, ca: Option<&str>| {
        tokio::spawn(tessera_agent::report::run_authenticated(
            endpoint,
            agent_node(&dir.path().join(node)),
            node.into(),
            meter(),
            tessera_agent::report::Security {
                token_file: None,
                ca_file: ca.map(|c| dir.path().join(c)),
            },
            None,
        ))
    };
    let https = format!("https://127.0.0.1:{port}");
    let trusted = report("node-a", https.clone(), Some("ca.crt"));
    let wrong_ca = report("node-b", https, Some("other-ca.crt"));
    let plaintext = report("node-c", format!("http://127.0.0.1:{port}"), None);
    wait_for(&registry, "node-a over TLS", |r| {
        r.get("node-a")
            .is_some_and(|n| n.connected && n.occupancy.len() == 8)
    })
    .await;
    // The others have retried meanwhile (backoff starts at 200 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        registry.get("node-b").is_none(),
        "an agent with another CA was accepted"
    );
    assert!(
        registry.get("node-c").is_none(),
        "a plaintext agent was accepted"
    );
    for task in [trusted, wrong_ca, plaintext] {
        task.abort();
    }
}

/// A stream lasts no longer than its token: the scripted agent's stream ends UNAUTHENTICATED
/// at the token's expiry and the same token is refused from then on, and the real agent,
/// refused with its expired token, comes back once its token file holds a fresh one (the
/// kubelet rotates the projected token; the agent reads the file on every connect).
/// Fails on the code before #33: the streams outlive their tokens.
#[tokio::test]
async fn a_stream_ends_when_its_token_expires_and_the_agent_returns_with_a_fresh_one() {
    let api = Cluster::start(ClusterOptions::default());
    let client = api.admin().await;
    let lifetime = Duration::from_secs(20);
    let token_a = reissued_to_expire(&api, &agent_token(&api, &client, "node-a").await, lifetime);
    let fresh_b = agent_token(&api, &client, "node-b").await;
    let token_b = reissued_to_expire(&api, &fresh_b, lifetime);

    let auth = Authenticator::token_review(client.clone(), vec![DEFAULT_AGENT_USER.to_string()])
        .with_audience(Some(AUDIENCE.into()));
    let service = Service::start(auth, Duration::from_secs(1)).await;
    let (addr, registry) = (service.addr, service.registry.clone());

    // node-b: the real agent, its token file holding the short-lived token.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token-b");
    std::fs::write(&token_file, &token_b).unwrap();
    let reporter = tokio::spawn(tessera_agent::report::run_authenticated(
        format!("http://{addr}"),
        agent_node(&dir.path().join("b")),
        "node-b".into(),
        PodMeter::new(
            ProcessAttribution::new(dir.path().join("proc")),
            Arc::new(NoAssignments),
        ),
        tessera_agent::report::Security {
            token_file: Some(token_file.clone()),
            ca_file: None,
        },
        None,
    ));

    // node-a: a scripted agent, to read the status its stream ends with.
    let hello_a = || hello("node-a", pb::PROTOCOL_VERSION);
    let mut scripted = FakeAgent::connect(addr, Some(&token_a), hello_a())
        .await
        .expect("the token is valid for now")
        .beat();
    scripted.expect_welcome().await;
    wait_for(&registry, "node-b connected", |r| {
        r.get("node-b").is_some_and(|n| n.connected)
    })
    .await;

    // The deadline is generous: the stream must end at the token's expiry, 20 s from its
    // minting, and the wait only bounds a failure.
    let status = tokio::time::timeout(Duration::from_secs(90), end_status(&mut scripted))
        .await
        .expect("the stream outlived its token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(
        status
            .message()
            .contains("token expired; reconnect with a fresh token"),
        "{}",
        status.message()
    );
    let status = match FakeAgent::connect(addr, Some(&token_a), hello_a()).await {
        Err(status) => status,
        Ok(mut again) => end_status(&mut again).await,
    };
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // The real agent's stream ended too, and its expired token keeps it out...
    wait_for(
        &registry,
        "node-b disconnected at its token's expiry",
        |r| r.get("node-b").is_some_and(|n| !n.connected),
    )
    .await;
    // ...until the file holds a fresh token, which it reads on its next attempt.
    std::fs::write(&token_file, &fresh_b).unwrap();
    wait_for(&registry, "node-b back with the fresh token", |r| {
        r.get("node-b").is_some_and(|n| n.connected)
    })
    .await;

    reporter.abort();
    service.shutdown().await;
    drop(api);
}
