//! The watchdog on real child processes: the simulated backend reports them as GPU
//! processes (memory set by the test, utilisation following their real CPU use), a fake
//! proc tree maps their PIDs to pods, and the agent's watchdog signals them for real.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Harness, proc_stat, refs, share};
use tessera_agent::admin::{self, Response, StatusReport};
use tessera_agent::agent::Agent;
use tessera_agent::enforce::memory::MemoryAction;
use tessera_agent::enforce::watchdog::WatchdogConfig;
use tessera_agent::events::{EventReason, RecordedEvents};
use tessera_agent::ledger::PodRef;
use tessera_agent::testing::StaticAssignments;
use tessera_contract::Isolation;
use tessera_device_plugin::testing::PluginConnection;

/// Deadline for "eventually" conditions (slow CI machines).
const EVENTUALLY: Duration = Duration::from_secs(30);

/// A child process killed (and reaped) when the test ends, whatever happens.
struct Child(std::process::Child);

impl Child {
    fn sleeper() -> Self {
        Self(
            std::process::Command::new("sleep")
                .arg("120")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn busy() -> Self {
        Self(
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn exited(&mut self) -> bool {
        self.0.try_wait().unwrap().is_some()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An agent with the watchdog on, and a way to give pods shares of GPUs.
struct Node {
    h: Harness,
    source: Arc<StaticAssignments>,
    events: Arc<RecordedEvents>,
    plugin: Arc<PluginConnection>,
    used_slots: Vec<String>,
    created: u64,
}

impl Node {
    async fn start(config: WatchdogConfig) -> Node {
        let source = Arc::new(StaticAssignments::new());
        let mut h = Harness::start("l40s-4x-pcie.yaml", source.clone()).await;
        let old = h.gpu_plugin().await;
        h.stop_agent().await;
        let events = Arc::new(RecordedEvents::default());
        let mut agent_config = h.config(source.clone());
        agent_config.watchdog = Some(config);
        agent_config.events = events.clone();
        h.agent = Some(Agent::start(agent_config).await.unwrap());
        let plugin = h.new_gpu_plugin(&old).await;
        Node {
            h,
            source,
            events,
            plugin,
            used_slots: Vec::new(),
            created: 0,
        }
    }

    /// Pod `name` (UID `uid`) gets `memory_mib` and `compute_milli` of GPU `gpu` through
    /// the plugin, as the kubelet would; returns its slot.
    async fn admit(
        &mut self,
        name: &str,
        uid: &str,
        gpu: u32,
        memory_mib: u64,
        compute_milli: u32,
    ) -> String {
        self.admit_as(
            name,
            uid,
            (gpu, memory_mib, compute_milli),
            Isolation::Watchdog,
        )
        .await
    }

    /// [`Node::admit`] for a pod whose `tessera.dev/isolation` says `isolation` when it is
    /// allocated.
    async fn admit_as(
        &mut self,
        name: &str,
        uid: &str,
        (gpu, memory_mib, compute_milli): (u32, u64, u32),
        isolation: Isolation,
    ) -> String {
        let pod = PodRef::new("ml", name);
        let uuid = self.h.uuid(gpu);
        self.created += 1;
        self.source.bind(
            pod.clone(),
            self.created,
            &[("main", 1)],
            Some(share(&uuid, memory_mib, compute_milli)),
        );
        self.source.set_uid(pod.clone(), uid);
        self.source.set_isolation(pod, isolation);
        let free: Vec<String> = self
            .h
            .available(&self.plugin)
            .await
            .into_iter()
            .filter(|s| !self.used_slots.contains(s))
            .collect();
        let slot = self
            .plugin
            .preferred_allocation(&refs(&free), &[], 1)
            .await
            .unwrap();
        assert!(slot[0].starts_with(&uuid), "{slot:?} not on {uuid}");
        self.plugin.allocate_one(&refs(&slot)).await.unwrap();
        self.used_slots.push(slot[0].clone());
        slot[0].clone()
    }

    /// Makes `child` a GPU process of pod `uid` on GPU `gpu` holding `memory_mib`.
    fn run_on_gpu(&self, child: &Child, uid: &str, gpu: u32, memory_mib: u64) {
        self.h.fake_pod_process(child.pid(), uid, &"c".repeat(64));
        self.h
            .sim
            .set_process_cpu_following(&self.h.uuid(gpu), child.pid(), memory_mib)
            .unwrap();
    }

    async fn status(&self) -> StatusReport {
        match admin::request(&self.h.admin_socket(), "status")
            .await
            .unwrap()
        {
            Response::Status(report) => report,
            other => panic!("not a status report: {other:?}"),
        }
    }

    /// The `status` enforcement label of pod `name` on GPU `gpu`.
    async fn enforcement(&self, name: &str, gpu: u32) -> String {
        let uuid = self.h.uuid(gpu);
        let report = self.status().await;
        let g = report.gpus.iter().find(|g| g.uuid == uuid).unwrap();
        g.pods
            .iter()
            .find(|p| p.pod == format!("ml/{name}"))
            .map(|p| p.enforcement.clone())
            .unwrap_or_default()
    }

    /// Waits until `status` shows pod `name` on GPU `gpu` in a state for which `ok` holds.
    async fn wait_enforcement(&self, name: &str, gpu: u32, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + EVENTUALLY;
        loop {
            let state = self.enforcement(name, gpu).await;
            if ok(&state) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "ml/{name} on GPU {gpu} stayed {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until pod `name` has at least `count` events, and returns them all.
    async fn wait_events(&self, name: &str, count: usize) -> Vec<(EventReason, String)> {
        let deadline = Instant::now() + EVENTUALLY;
        loop {
            let events = self.events_for(name);
            if events.len() >= count || Instant::now() >= deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn events_for(&self, name: &str) -> Vec<(EventReason, String)> {
        self.events
            .events()
            .into_iter()
            .filter(|e| e.pod.name == name)
            .map(|e| (e.reason, e.message))
            .collect()
    }
}

const UID_A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const UID_B: &str = "bbbbbbbb-0000-4000-8000-000000000002";
const UID_C: &str = "cccccccc-0000-4000-8000-000000000003";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_over_its_memory_limit_is_killed_after_the_grace_period_and_others_are_untouched() {
    let interval = Duration::from_millis(250);
    let grace = Duration::from_secs(1);
    let mut node = Node::start(WatchdogConfig {
        interval,
        memory_grace: grace,
        ..WatchdogConfig::default()
    })
    .await;
    node.admit("a", UID_A, 0, 1000, 500).await;
    node.admit("b", UID_B, 0, 1000, 500).await;
    node.admit_as("c", UID_C, (1, 4000, 1000), Isolation::None)
        .await;
    let mut a = Child::sleeper();
    let mut b = Child::sleeper();
    let mut c = Child::sleeper();
    node.run_on_gpu(&a, UID_A, 0, 600);
    node.run_on_gpu(&b, UID_B, 0, 900);
    // Pod c is far over its limit but not watchdog-isolated: never acted on.
    node.run_on_gpu(&c, UID_C, 1, 9000);
    node.wait_enforcement("a", 0, |s| s == "ok").await;
    node.wait_enforcement("b", 0, |s| s == "ok").await;
    assert_eq!(node.enforcement("c", 1).await, "none");

    let over_at = Instant::now();
    node.run_on_gpu(&a, UID_A, 0, 1500);
    node.wait_enforcement("a", 0, |s| s == "warned").await;
    let deadline = Instant::now() + EVENTUALLY;
    while !a.exited() {
        assert!(
            Instant::now() < deadline,
            "the over-limit process was not killed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dead_after = over_at.elapsed();
    assert!(
        dead_after >= grace,
        "killed {dead_after:?} after going over, before the {grace:?} grace period"
    );

    // The watchdog signals first and records the event after, so the exit can be seen
    // a moment before the second event.
    let events = node.wait_events("a", 2).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, EventReason::GpuMemoryOverLimit);
    assert!(
        events[0].1.contains("1500 MiB") && events[0].1.contains("limit of 1000 MiB"),
        "{events:?}"
    );
    assert_eq!(events[1].0, EventReason::GpuMemoryKilled);
    assert!(
        events[1].1.contains(&format!("pids {}", a.pid())) && events[1].1.contains("1500 MiB"),
        "{events:?}"
    );
    // The watchdog's own clock: from the first reading over the limit to the kill, at
    // least the grace period and at most one more interval; the first reading comes at
    // most one interval after the memory went over, hence "within two intervals after
    // the grace period".
    let over_for: f64 = events[1]
        .1
        .split(" for ")
        .nth(1)
        .and_then(|s| s.split('s').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {events:?}"));
    let over_for = Duration::from_secs_f64(over_for);
    assert!(
        over_for >= grace && over_for <= grace + interval + Duration::from_millis(100),
        "killed after {over_for:?} over the limit (grace {grace:?}, interval {interval:?})"
    );
    println!(
        "killed {dead_after:?} after the memory went over (watchdog clock: {over_for:?} over)"
    );

    node.wait_enforcement("a", 0, |s| s == "killed").await;
    assert!(!b.exited() && !c.exited(), "an innocent process died");
    assert!(node.events_for("b").is_empty() && node.events_for("c").is_empty());
    assert_eq!(node.enforcement("b", 0).await, "ok");

    let text = admin::render_status(&node.status().await);
    assert!(text.contains("enforce killed"), "{text}");
    let metrics = node.h.agent().node().metrics.render(node.h.agent().node());
    assert!(
        metrics.contains("tessera_agent_enforcement_actions_total{action=\"memory_kill\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_agent_enforcement_actions_total{action=\"memory_warn\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolation_changed_after_allocate_does_not_switch_enforcement_off() {
    // The pod's owner annotates its running pod `tessera.dev/isolation: none` (the source
    // lists the new value, as the coordinator's stream would): the agent keeps holding it
    // to the limits it was allocated with, in the mode it was allocated in.
    let mut node = Node::start(WatchdogConfig {
        interval: Duration::from_millis(100),
        memory_grace: Duration::from_millis(300),
        ..WatchdogConfig::default()
    })
    .await;
    node.admit("a", UID_A, 0, 1000, 500).await;
    let mut a = Child::sleeper();
    node.run_on_gpu(&a, UID_A, 0, 600);
    node.wait_enforcement("a", 0, |s| s == "ok").await;
    node.source
        .set_isolation(PodRef::new("ml", "a"), Isolation::None);
    node.run_on_gpu(&a, UID_A, 0, 1500);
    let deadline = Instant::now() + EVENTUALLY;
    while !a.exited() {
        assert!(
            Instant::now() < deadline,
            "a pod over its memory limit was left alone after its isolation annotation changed \
             (status: {})",
            node.enforcement("a", 0).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.wait_enforcement("a", 0, |s| s == "killed").await;
    let status = node.status().await;
    let share = status.gpus[0]
        .pods
        .iter()
        .find(|p| p.pod == "ml/a")
        .unwrap();
    assert_eq!(share.pod_uid.as_deref(), Some(UID_A));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warn_only_mode_never_kills() {
    let interval = Duration::from_millis(100);
    let grace = Duration::from_millis(300);
    let mut node = Node::start(WatchdogConfig {
        interval,
        memory_grace: grace,
        memory_action: MemoryAction::Warn,
        ..WatchdogConfig::default()
    })
    .await;
    node.admit("a", UID_A, 2, 1000, 500).await;
    let mut a = Child::sleeper();
    node.run_on_gpu(&a, UID_A, 2, 5000);
    node.wait_enforcement("a", 2, |s| s == "warned").await;
    // Many grace periods later: still alive, still only warned, warned once.
    tokio::time::sleep(grace * 6).await;
    assert!(!a.exited(), "warn-only mode killed a process");
    assert_eq!(node.enforcement("a", 2).await, "warned");
    let events = node.events_for("a");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, EventReason::GpuMemoryOverLimit);
    assert!(events[0].1.contains("only warns"), "{events:?}");
}

/// Samples the real `/proc` state of `pids` every few milliseconds until none has
/// been seen stopped for `settle`; fails if that does not happen in time.
async fn wait_never_stopped(pids: &[u32], settle: Duration) {
    let deadline = Instant::now() + EVENTUALLY;
    let mut clean_since = Instant::now();
    loop {
        if pids.iter().any(|p| proc_stat(*p).0 == 'T') {
            clean_since = Instant::now();
        }
        if clean_since.elapsed() >= settle {
            return;
        }
        assert!(Instant::now() < deadline, "a process stays stopped");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compute_shares_hold_under_contention_only_and_nothing_is_left_stopped() {
    let mut node = Node::start(WatchdogConfig::default()).await;
    let slot_a = node.admit("a", UID_A, 3, 10_000, 700).await;
    let slot_b = node.admit("b", UID_B, 3, 10_000, 300).await;
    let _ = slot_a;

    // Pod b alone on the GPU, far above its 30% share: the GPU is not contended, so it
    // is never throttled.
    let b = Child::busy();
    node.run_on_gpu(&b, UID_B, 3, 100);
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let report = node.status().await;
        let gpu = report.gpus.iter().find(|g| g.index == 3).unwrap();
        let row = gpu.pods.iter().find(|p| p.pod == "ml/b").unwrap();
        if row.utilization_percent.unwrap_or(0) >= 50 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the busy loop never showed up: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.wait_enforcement("b", 3, |s| s == "ok").await;
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        assert_ne!(
            proc_stat(b.pid()).0,
            'T',
            "an uncontended GPU was throttled"
        );
        assert_eq!(node.enforcement("b", 3).await, "ok");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Pod a joins: 200% of demand on one GPU. Shares 70/30.
    let a = Child::busy();
    node.run_on_gpu(&a, UID_A, 3, 100);
    node.wait_enforcement("a", 3, |s| s.starts_with("throttled"))
        .await;
    node.wait_enforcement("b", 3, |s| s.starts_with("throttled"))
        .await;
    // Let the controllers settle, then measure real CPU time over 10 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (start, a0, b0) = (Instant::now(), proc_stat(a.pid()).1, proc_stat(b.pid()).1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (a1, b1) = (proc_stat(a.pid()).1, proc_stat(b.pid()).1);
    let wall = start.elapsed().as_secs_f64();
    let (da, db) = ((a1 - a0) as f64, (b1 - b0) as f64);
    let share_a = 100.0 * da / (da + db);
    let share_b = 100.0 * db / (da + db);
    println!(
        "over {wall:.1}s: a {share_a:.1}% b {share_b:.1}% of their CPU time; of a core: a {:.1}% b {:.1}%",
        da / wall,
        db / wall
    );
    assert!((share_a - 70.0).abs() <= 5.0, "a got {share_a:.1}%");
    assert!((share_b - 30.0).abs() <= 5.0, "b got {share_b:.1}%");
    let throttled = node
        .events_for("b")
        .into_iter()
        .filter(|(r, _)| *r == EventReason::GpuComputeThrottled)
        .count();
    assert_eq!(throttled, 1, "{:?}", node.events_for("b"));
    let metrics = node.h.agent().node().metrics.render(node.h.agent().node());
    assert!(
        metrics.contains("tessera_agent_pod_gpu_throttle_run_percent{pod=\"ml/b\""),
        "{metrics}"
    );

    // Pod b leaves mid-throttle (the kubelet released its slot): resumed for good.
    node.h
        .agent()
        .node()
        .ledger
        .lock()
        .remove_holding(&[slot_b])
        .unwrap();
    wait_never_stopped(&[b.pid()], Duration::from_millis(500)).await;

    // Pod a is still throttled (pod b's process now counts as load nobody may
    // throttle); the agent stops: nothing is left stopped.
    node.wait_enforcement("a", 3, |s| s.starts_with("throttled"))
        .await;
    node.h.stop_agent().await;
    for pid in [a.pid(), b.pid()] {
        assert_ne!(proc_stat(pid).0, 'T', "pid {pid} left stopped by the agent");
    }
    wait_never_stopped(&[a.pid(), b.pid()], Duration::from_millis(300)).await;
}

#[tokio::test]
async fn kube_events_land_on_the_pod_with_this_node_as_source() {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::{Api, ListParams};
    use tessera_agent::events::{EventSink, KubeEvents, PodEvent};
    use tessera_testcluster::{Cluster, ClusterOptions};

    // A real API server: events.k8s.io and core Events are validated there.
    let server = Cluster::start(ClusterOptions::default());
    let client = server.admin().await;
    let sink = KubeEvents::new(client.clone(), "node-a");
    sink.emit(PodEvent {
        pod: PodRef::new("default", "trainer"),
        pod_uid: UID_A.into(),
        reason: EventReason::GpuMemoryKilled,
        message: "killed 1 process(es) (pids 42) using 1500 MiB".into(),
    });
    let api: Api<Event> = Api::namespaced(client, "default");
    let deadline = Instant::now() + EVENTUALLY;
    let event = loop {
        // The API server writes Events of its own in `default` (its Service IP repair loop's
        // ClusterIPNotAllocated, for one): only the pod's count.
        let ours = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.involved_object.name.as_deref() == Some("trainer"));
        if let Some(e) = ours {
            break e;
        }
        assert!(Instant::now() < deadline, "no Event was written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(event.reason.as_deref(), Some("GpuMemoryKilled"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(event.involved_object.name.as_deref(), Some("trainer"));
    assert_eq!(event.involved_object.uid.as_deref(), Some(UID_A));
    assert_eq!(event.reporting_component.as_deref(), Some("tessera-agent"));
    let source = event.source.unwrap();
    assert_eq!(source.component.as_deref(), Some("tessera-agent"));
    assert_eq!(source.host.as_deref(), Some("node-a"));
    assert!(event.message.unwrap().contains("1500 MiB"));
}
