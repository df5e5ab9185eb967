//! `hack/bench-cluster`: end-to-end binding speed through the real API server, Tessera side by
//! side with the real kube-scheduler in the same run (issue #18).
//!
//! One control plane from `hack/k8s` (etcd, kube-apiserver, kube-scheduler), two pools of
//! `--nodes` device-less 8-GPU nodes created as plain Node objects (no kubelet: nothing here
//! measures the device path), each pool tainted and labelled so that each scheduler only uses
//! its own. The Tessera pool's GPUs are reported into an in-process [`AgentRegistry`] as agents
//! would report them, and the coordinator runs in this process. Then, one phase after the
//! other so that they do not compete for the machine's cores:
//!
//! - Tessera: `--pods` pods created at once, half whole-GPU, a quarter `0.5` and a quarter
//!   `0.25` of a GPU, spread over `--queues` queues;
//! - Tessera, a gang: one PodGroup of `--gang` whole-GPU pods (minMember all of them) on the
//!   emptied pool; the time from its first pod's creation to its last pod bound;
//! - Tessera, a reclaim: queue `reclaim-low` (no quota) fills the whole pool with whole-GPU
//!   pods, then queue `reclaim-high`, deserving `--reclaim-gpus` GPUs, asks for that many; the
//!   time until the coordinator has evicted that many GPUs' worth of `reclaim-low` pods, and
//!   until every `reclaim-high` pod is bound;
//! - kube-scheduler: `--pods` whole-GPU default-scheduler pods on its own pool.
//!
//! Each phase reports pods bound per second (first creation to last pod seen bound), the p50
//! and p99 of creation to bound (as a pod watch first sees `spec.nodeName`), CPU seconds of
//! this process, of the API server process and of kube-scheduler, RSS, and API requests per
//! bound pod from the API server's audit log.
//!
//! ```text
//! KUBE_PEER=target/kube-peer/kube-peer cargo run --release -p tessera-coordinator \
//!     --example bench_cluster -- [--nodes 200] [--pods 1600] [--queues 10] [--gang 512]
//!     [--reclaim-gpus 2000] [--json FILE]
//! ```
//!
//! `--gang 0` or `--reclaim-gpus 0` skips that phase; both are capped to what the pool holds
//! (the reclaim to half of it).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use parking_lot::Mutex;
use serde_json::json;
use tessera_coordinator::agents::AgentRegistry;
use tessera_coordinator::agents::registry::Session;
use tessera_coordinator::cluster::leader::LeaseConfig;
use tessera_coordinator::cluster::{Coordinator, CoordinatorConfig};
use tessera_coordinator::crd::{GpuQuota, PodGroup, PodGroupSpec, Queue, QueueSpec};
use tessera_proto::tessera::v1 as pb;
use tessera_testcluster::{Cluster, ClusterOptions};
use tokio::sync::mpsc;

const GPUS_PER_NODE: u32 = 8;
/// Share slots per GPU the simulated agents report (the agent's default).
const SHARES_PER_GPU: u32 = 10;
const POOL_KEY: &str = "bench.tessera.dev/pool";
const TESSERA_NS: &str = "bench-tessera";
const KUBE_NS: &str = "bench-kube";
const COORDINATOR_SA: &str = "bench-coordinator";
const KUBE_SCHEDULER_SA: &str = "bench-kube-scheduler";
/// Requests in flight while creating nodes or pods: enough to keep the API server busy
/// without making the creation itself the bottleneck being measured.
const CREATE_CONCURRENCY: usize = 32;
/// Linux reports CPU times in /proc in USER_HZ, which is 100 on every architecture the
/// project builds for.
const CLOCK_TICKS: f64 = 100.0;

/// Command-line options.
struct Options {
    nodes: usize,
    pods: usize,
    /// kube-scheduler's pods: `pods`, or as many whole GPUs as its pool has when fewer.
    kube_pods: usize,
    queues: usize,
    json: Option<PathBuf>,
    timeout: Duration,
    /// kube-scheduler's client QPS (its burst is twice that, as upstream's 50/100 defaults).
    kube_qps: usize,
    /// Members of the gang phase's one PodGroup; 0 skips it.
    gang: usize,
    /// GPUs the reclaim phase takes back; 0 skips it.
    reclaim_gpus: usize,
}

fn parse_options() -> anyhow::Result<Options> {
    let mut o = Options {
        nodes: 200,
        pods: 1600,
        kube_pods: 0,
        queues: 10,
        json: None,
        timeout: Duration::from_secs(600),
        kube_qps: 50,
        gang: 512,
        reclaim_gpus: 2000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = || -> anyhow::Result<String> {
            inline
                .clone()
                .or_else(|| args.next())
                .with_context(|| format!("{key} needs a value"))
        };
        let whole = |v: String| -> anyhow::Result<usize> {
            v.parse::<usize>()
                .with_context(|| format!("{key} {v}: expected a whole number"))
        };
        let count = |v: String| -> anyhow::Result<usize> {
            v.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("{key} {v}: expected a whole number above 0"))
        };
        match key.as_str() {
            "--nodes" => o.nodes = count(value()?)?,
            "--pods" => o.pods = count(value()?)?,
            "--queues" => o.queues = count(value()?)?,
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--timeout" => o.timeout = Duration::from_secs(count(value()?)? as u64),
            "--kube-scheduler-qps" => o.kube_qps = count(value()?)?,
            "--gang" => o.gang = whole(value()?)?,
            "--reclaim-gpus" => o.reclaim_gpus = whole(value()?)?,
            "-h" | "--help" => {
                eprintln!(
                    "usage: bench_cluster [--nodes N (200)] [--pods P (1600)] [--queues Q (10)] \
                     [--gang N (512)] [--reclaim-gpus G (2000)] \
                     [--json FILE] [--timeout SECONDS (600)] [--kube-scheduler-qps N (50)]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (try --help)"),
        }
    }
    // Tessera's pods take 1, 1, 0.5 and 0.25 GPU in turn; kube-scheduler's are all whole GPUs
    // on a pool of the same size (its warm-up pod is deleted before they are created), as many
    // as fit when `--pods` does not.
    let capacity = o.nodes * GPUS_PER_NODE as usize;
    let tessera_gpus =
        o.pods.div_ceil(4) * 2 + o.pods.div_ceil(4).div_ceil(2) + o.pods.div_ceil(16);
    if tessera_gpus > capacity {
        bail!(
            "--pods {} needs about {tessera_gpus} GPUs, more than {} nodes of {GPUS_PER_NODE} GPUs have ({capacity})",
            o.pods,
            o.nodes
        );
    }
    o.kube_pods = o.pods.min(capacity);
    o.gang = o.gang.min(capacity);
    o.reclaim_gpus = o.reclaim_gpus.min(capacity / 2);
    Ok(o)
}

/// The coordinator binary's allocator, so the in-process coordinator costs what it would.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let o = parse_options()?;
    let load_start = load_average();
    progress(format_args!(
        "starting the control plane (etcd, kube-apiserver)"
    ));
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions {
            audit: true,
            ..ClusterOptions::default()
        })
    });
    let apiserver_pid = apiserver_pid(&cluster)?;
    let admin = cluster.admin().await;
    setup_api(&cluster, &admin, &o).await?;

    progress(format_args!("creating 2 × {} nodes", o.nodes));
    create_nodes(&admin, "tessera", o.nodes).await?;
    create_nodes(&admin, "kube", o.nodes).await?;

    let registry = AgentRegistry::new();
    let agents = connect_agents(&registry, o.nodes)?;

    let seen = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let gone = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
    let _watch = watch_bound(admin.clone(), Arc::clone(&seen), Arc::clone(&gone)).await?;

    let coordinator_client = cluster.service_account(TESSERA_NS, COORDINATOR_SA).await;
    let rss_before = memory_kib("VmRSS:");
    let coordinator = Coordinator::start(
        coordinator_client,
        CoordinatorConfig {
            identity: "bench".into(),
            lease: LeaseConfig {
                namespace: TESSERA_NS.into(),
                name: "tessera-bench".into(),
                ..LeaseConfig::default()
            },
            registry: Some(registry.clone()),
            // The simulated agents send no heartbeats.
            agent_timeout: Duration::from_secs(24 * 3600),
            ..CoordinatorConfig::default()
        },
    )
    .await
    .context("starting the coordinator")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !coordinator.is_leader() {
        if Instant::now() > deadline {
            bail!("the coordinator did not lead within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let coordinator_user = format!("system:serviceaccount:{TESSERA_NS}:{COORDINATOR_SA}");
    progress(format_args!(
        "starting kube-scheduler (client QPS {}, burst {})",
        o.kube_qps,
        2 * o.kube_qps
    ));
    let kube_scheduler = start_kube_scheduler(&cluster, &admin, o.kube_qps).await?;
    let scheduler_pid = kube_scheduler.id();

    let tessera_pods: Vec<Pod> = (0..o.pods).map(|i| tessera_pod(i, o.queues)).collect();
    let tessera = run_phase(Phase {
        name: "tessera",
        namespace: TESSERA_NS,
        pod_prefix: "t-",
        pods: tessera_pods,
        client: &admin,
        seen: &seen,
        cluster: &cluster,
        api_user: &coordinator_user,
        scheduler_pid: None,
        apiserver_pid,
        timeout: o.timeout,
    })
    .await?;
    let rss_after = memory_kib("VmRSS:");

    let gang = if o.gang > 0 {
        clear_namespace(&admin, TESSERA_NS).await?;
        create_pod_group(&admin, "bench-gang", o.gang, &queue_name(0)).await?;
        let pods = (0..o.gang)
            .map(|i| gang_pod(i, "bench-gang", &queue_name(0)))
            .collect();
        Some(
            run_phase(Phase {
                name: "tessera gang",
                namespace: TESSERA_NS,
                pod_prefix: "g-",
                pods,
                client: &admin,
                seen: &seen,
                cluster: &cluster,
                api_user: &coordinator_user,
                scheduler_pid: None,
                apiserver_pid,
                timeout: o.timeout,
            })
            .await?,
        )
    } else {
        None
    };
    let reclaim = if o.reclaim_gpus > 0 {
        clear_namespace(&admin, TESSERA_NS).await?;
        Some(
            run_reclaim(
                &admin,
                &cluster,
                &seen,
                &gone,
                &coordinator_user,
                apiserver_pid,
                &o,
            )
            .await?,
        )
    } else {
        None
    };
    let rss_peak = memory_kib("VmHWM:");
    // An idle coordinator still follows every pod change; stopped, it leaves kube-scheduler
    // the machine, and this process's CPU in that phase is the benchmark client's alone.
    coordinator.shutdown().await;
    drop(agents);
    // kube-scheduler's cache would otherwise carry every pod the Tessera phases left.
    clear_namespace(&admin, TESSERA_NS).await?;

    let kube_pods: Vec<Pod> = (0..o.kube_pods).map(kube_pod).collect();
    let kube = run_phase(Phase {
        name: "kube-scheduler",
        namespace: KUBE_NS,
        pod_prefix: "k-",
        pods: kube_pods,
        client: &admin,
        seen: &seen,
        cluster: &cluster,
        api_user: &format!("system:serviceaccount:kube-system:{KUBE_SCHEDULER_SA}"),
        scheduler_pid,
        apiserver_pid,
        timeout: o.timeout,
    })
    .await?;
    let load_end = load_average();
    drop(kube_scheduler);

    let ratio = tessera.pods_per_second / kube.pods_per_second;
    let report = json!({
        "nodes_per_pool": o.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "pods_per_phase": o.pods,
        "kube_scheduler_pods": o.kube_pods,
        "queues": o.queues,
        "machine": {
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "load_average_start": load_start,
            "load_average_end": load_end,
        },
        "tessera": tessera.json(),
        "tessera_gang": gang.as_ref().map(|g| json!({"members": o.gang, "phase": g.json()})),
        "tessera_reclaim": reclaim.as_ref().map(Reclaim::json),
        "kube_scheduler": kube.json(),
        "ratio_pods_per_second": round(ratio, 2),
        "coordinator_rss_mib": {
            "before_start": mib(rss_before),
            "after_tessera_phase": mib(rss_after),
            "peak_during_tessera_phases": mib(rss_peak),
        },
        "notes": [
            "the phases run one after the other on the same API server; kube-scheduler idles \
             (watching) during Tessera's phase; the coordinator is stopped before \
             kube-scheduler's",
            "process_cpu_seconds and RSS are this whole process: the coordinator, the benchmark's \
             own client (pod creation, the pod watch) and the simulated agents; the \
             kube-scheduler phase's process_cpu_seconds is that client alone, an estimate of \
             its share in Tessera's phase",
            "the simulated agents report every announced pod allocated at once (no kubelet), so \
             the coordinator's hold on same-size unallocated pods costs no agent round trip",
            "api_requests: the API server's audit log, the scheduler's own user only (the \
             coordinator's ServiceAccount, kube-scheduler's), lease renewals included; a watch is logged when it ends, so open watches are not counted",
            format!("kube-scheduler: client QPS {}, burst {} (upstream's defaults are 50 and \
                     100); otherwise its default profile", o.kube_qps, 2 * o.kube_qps),
            "Tessera pods: half whole-GPU, a quarter 0.5 and a quarter 0.25 of a GPU; \
             kube-scheduler pods: all whole-GPU",
        ],
    });
    let text = serde_json::to_string_pretty(&report)?;
    let gang_text = gang.as_ref().map_or(String::new(), |g| {
        format!("; a {}-pod gang bound in {:.2} s", o.gang, g.seconds)
    });
    let reclaim_text = reclaim.as_ref().map_or(String::new(), |r| {
        format!(
            "; a {}-GPU reclaim decided and evicted in {:.2} s, the reclaiming pods bound in {:.2} s",
            r.gpus, r.evicted_seconds, r.bound.seconds
        )
    });
    let table = format!(
        "| {} nodes × {GPUS_PER_NODE} GPUs per pool, {} pods{}, {} queues | Tessera {:.0} pods/s (p50 {:.0} ms, p99 {:.0} ms, {:.1} CPU s, {:.1} API requests/pod), kube-scheduler (QPS {}) {:.0} pods/s (p50 {:.0} ms, p99 {:.0} ms, {:.1} CPU s, {:.1} API requests/pod), **{:.2}×**{gang_text}{reclaim_text}; coordinator process peak RSS {:.0} MiB (load average {} → {}) | `hack/bench-cluster --nodes {} --pods {} --queues {} --gang {} --reclaim-gpus {} --kube-scheduler-qps {}` |",
        o.nodes,
        o.pods,
        if o.kube_pods < o.pods {
            format!(" (kube-scheduler's phase {}: its pool's GPUs)", o.kube_pods)
        } else {
            String::new()
        },
        o.queues,
        tessera.pods_per_second,
        tessera.p50_ms,
        tessera.p99_ms,
        tessera.process_cpu_seconds,
        tessera.api_requests_per_pod(),
        o.kube_qps,
        kube.pods_per_second,
        kube.p50_ms,
        kube.p99_ms,
        kube.scheduler_cpu_seconds.unwrap_or(f64::NAN),
        kube.api_requests_per_pod(),
        ratio,
        mib(rss_peak).unwrap_or(f64::NAN),
        load_start,
        load_end,
        o.nodes,
        o.pods,
        o.queues,
        o.gang,
        o.reclaim_gpus,
        o.kube_qps,
    );
    match &o.json {
        Some(path) => {
            std::fs::write(path, format!("{text}\n"))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("{table}");
        }
        None => {
            println!("{text}");
            eprintln!("{table}");
        }
    }
    Ok(())
}

fn progress(args: std::fmt::Arguments<'_>) {
    eprintln!("bench-cluster: {args}");
}

/// The CRDs, the namespaces, their ServiceAccounts (no controller runs to create them) and
/// the queues; the coordinator's ServiceAccount is bound to cluster-admin so that its
/// requests can be told apart in the audit log.
async fn setup_api(cluster: &Cluster, admin: &kube::Client, o: &Options) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for (_, crd) in tessera_coordinator::crd::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .context("creating the CRDs")?;
    }
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for ns in [TESSERA_NS, KUBE_NS] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        namespaces.create(&PostParams::default(), &n).await?;
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
        Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &sa)
            .await?;
    }
    // Creates the ServiceAccount; the binding below gives it everything.
    cluster.service_account_kubeconfig(TESSERA_NS, COORDINATOR_SA);
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench-coordinator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": COORDINATOR_SA, "namespace": TESSERA_NS}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;

    // Every queue deserves an equal part of the pool, more than its pods ask for.
    let quota = (o.nodes as f64 * GPUS_PER_NODE as f64 / o.queues as f64).floor();
    let queues: Api<Queue> = Api::all(admin.clone());
    for q in 0..o.queues {
        let queue = Queue::new(
            &queue_name(q),
            QueueSpec {
                gpu: Some(GpuQuota {
                    quota,
                    ..GpuQuota::default()
                }),
                ..QueueSpec::default()
            },
        );
        // The CRD is served a moment after it is created.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match queues.create(&PostParams::default(), &queue).await {
                Ok(_) => break,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e).context("creating the queues"),
            }
        }
    }
    Ok(())
}

fn queue_name(q: usize) -> String {
    format!("q-{q:03}")
}

/// `count` nodes of pool `pool`: labelled and tainted with it, 8 GPUs each (as
/// `nvidia.com/gpu` share slots on Tessera's pool, where the agent advertises GPUs ×
/// shares, and as whole devices on kube-scheduler's), Ready.
async fn create_nodes(admin: &kube::Client, pool: &str, count: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let gpus = if pool == "tessera" {
        GPUS_PER_NODE * SHARES_PER_GPU
    } else {
        GPUS_PER_NODE
    };
    futures::stream::iter(0..count)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let name = node_name(pool, i);
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {
                        POOL_KEY: pool, "kubernetes.io/hostname": name,
                    }},
                    "spec": {"taints": [{"key": POOL_KEY, "value": pool, "effect": "NoSchedule"}]},
                }))?;
                nodes.create(&PostParams::default(), &node).await?;
                let resources = json!({
                    "cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string(),
                });
                let now = jiff::Timestamp::now().to_string();
                let status = json!({"status": {
                    "capacity": resources, "allocatable": resources,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "device-less benchmark node", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}],
                }});
                nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await
        .with_context(|| format!("creating the {pool} nodes"))
}

fn node_name(pool: &str, i: usize) -> String {
    format!("{pool}-{i:05}")
}

/// Reports each Tessera node's GPUs into `registry` as its agent would, and plays the
/// agent's allocation report: every pod the coordinator announces for the node is reported
/// allocated at once (there is no kubelet to allocate it). The returned tasks and queues keep
/// the sessions open.
fn connect_agents(
    registry: &AgentRegistry,
    count: usize,
) -> anyhow::Result<
    Vec<(
        tokio::task::JoinHandle<()>,
        mpsc::Receiver<pb::CoordinatorMessage>,
    )>,
> {
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let name = node_name("tessera", i);
        let inventory = pb::NodeInventory {
            node_name: name.clone(),
            agent_version: "bench".into(),
            gpus: (0..GPUS_PER_NODE)
                .map(|g| pb::Gpu {
                    uuid: format!("GPU-{name}-{g}"),
                    index: g,
                    model: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib: 81559,
                    numa_node: -1,
                    ..Default::default()
                })
                .collect(),
            links: None,
            shares_per_gpu: SHARES_PER_GPU,
        };
        let (tx, rx) = mpsc::channel(16);
        let session = registry
            .connect(&inventory, 2, tx)
            .with_context(|| format!("reporting {name}'s inventory"))?;
        let task = tokio::spawn(allocate_announced(registry.clone(), session));
        out.push((task, rx));
    }
    Ok(out)
}

async fn allocate_announced(registry: AgentRegistry, session: Session) {
    let mut pods = registry.node_pods(&session.node);
    while pods.changed().await.is_ok() {
        // Copied out so the watch's lock is not held while the registry is updated.
        let uids: Vec<String> = pods
            .borrow_and_update()
            .as_ref()
            .map(|p| p.pods.iter().map(|p| p.uid.clone()).collect())
            .unwrap_or_default();
        let occupancy = pb::Occupancy {
            allocated_pod_uids: uids,
            ..Default::default()
        };
        // Every GPU of the report is known (there are none in it), so this cannot fail.
        let _ = registry.set_occupancy(&session, &occupancy);
    }
}

/// Records, for every pod in the benchmark's namespaces, when a watch first saw it bound.
/// Returns once the watch has listed, so nothing created afterwards is missed.
async fn watch_bound(
    client: kube::Client,
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    gone: Arc<Mutex<HashMap<String, Instant>>>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let pods: Api<Pod> = Api::all(client);
        let stream = watcher(pods, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let key = |pod: &Pod| {
                format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or(""),
                    pod.metadata.name.as_deref().unwrap_or("")
                )
            };
            let pod = match event {
                Ok(watcher::Event::Delete(p)) => {
                    gone.lock().entry(key(&p)).or_insert_with(Instant::now);
                    continue;
                }
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // An eviction shows first as a deletionTimestamp (the pod is gone once its grace
            // period ends, at once for the benchmark's pods of grace 0).
            if pod.metadata.deletion_timestamp.is_some() {
                gone.lock().entry(key(&pod)).or_insert_with(Instant::now);
            }
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
            {
                continue;
            }
            seen.lock().entry(key(&pod)).or_insert_with(Instant::now);
        }
    });
    tokio::time::timeout(Duration::from_secs(60), listed)
        .await
        .context("the pod watch did not list within 60 s")?
        .context("the pod watch ended")?;
    Ok(task)
}

fn tessera_pod(i: usize, queues: usize) -> Pod {
    let fraction = match i % 4 {
        2 => Some("0.5"),
        3 => Some("0.25"),
        _ => None,
    };
    let mut annotations = serde_json::Map::new();
    if let Some(f) = fraction {
        annotations.insert("tessera.dev/gpu-fraction".into(), f.into());
    }
    pod(
        &format!("t-{i:06}"),
        json!({"tessera.dev/queue": queue_name(i % queues)}),
        annotations.into(),
        json!({"schedulerName": "tessera"}),
        "tessera",
    )
}

fn kube_pod(i: usize) -> Pod {
    kube_pod_named(&format!("k-{i:06}"))
}

fn kube_pod_named(name: &str) -> Pod {
    pod(
        name,
        json!({}),
        json!({}),
        json!({"nodeSelector": {POOL_KEY: "kube"}}),
        "kube",
    )
}

/// Member `i` of PodGroup `group`: one whole GPU.
fn gang_pod(i: usize, group: &str, queue: &str) -> Pod {
    pod(
        &format!("g-{i:06}"),
        json!({"tessera.dev/queue": queue}),
        json!({"tessera.dev/pod-group": group}),
        json!({"schedulerName": "tessera"}),
        "tessera",
    )
}

/// A whole-GPU pod of the reclaim phase in `queue`; grace 0, so that an evicted one is gone
/// at once (no kubelet runs to end a grace period).
fn reclaim_pod(name: &str, queue: &str) -> Pod {
    pod(
        name,
        json!({"tessera.dev/queue": queue}),
        json!({}),
        json!({"schedulerName": "tessera", "terminationGracePeriodSeconds": 0}),
        "tessera",
    )
}

async fn create_pod_group(
    admin: &kube::Client,
    name: &str,
    members: usize,
    queue: &str,
) -> anyhow::Result<()> {
    let groups: Api<PodGroup> = Api::namespaced(admin.clone(), TESSERA_NS);
    let group = PodGroup::new(
        name,
        PodGroupSpec {
            min_member: i32::try_from(members).context("--gang is too large")?,
            queue: Some(queue.to_owned()),
            ..PodGroupSpec::default()
        },
    );
    groups
        .create(&PostParams::default(), &group)
        .await
        .with_context(|| format!("creating PodGroup {name}"))?;
    Ok(())
}

/// Deletes every pod in `namespace` at once (grace 0: no kubelet runs to end a grace period)
/// and waits until the API server lists none, so the next phase starts on an empty pool.
async fn clear_namespace(admin: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    progress(format_args!("emptying {namespace}"));
    let api: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    // Deleting tens of thousands of pods can outlast the API server's request timeout, which
    // then closes the connection; what was deleted stays deleted, so the rest is asked again.
    for attempt in 1.. {
        match api
            .delete_collection(
                &kube::api::DeleteParams::default().grace_period(0),
                &kube::api::ListParams::default(),
            )
            .await
        {
            Ok(_) => break,
            Err(e) if attempt < 10 => {
                progress(format_args!("deleting the pods of {namespace} again ({e})"))
            }
            Err(e) => {
                return Err(e).with_context(|| format!("deleting the pods of {namespace}"));
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left = api
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await?;
        if left.items.is_empty() {
            // Let the coordinator's watch catch up before the next phase is timed.
            tokio::time::sleep(Duration::from_secs(2)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{namespace} still has pods 300 s after deleting them all");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the reclaim phase measured.
struct Reclaim {
    gpus: usize,
    fill: Outcome,
    /// From the first reclaiming pod's creation to the `gpus`-th eviction seen.
    evicted_seconds: f64,
    evicted: usize,
    bound: Outcome,
}

impl Reclaim {
    fn json(&self) -> serde_json::Value {
        json!({
            "gpus": self.gpus,
            "fill": self.fill.json(),
            "seconds_to_evict": round(self.evicted_seconds, 3),
            "pods_evicted": self.evicted,
            "reclaiming_pods": self.bound.json(),
        })
    }
}

/// `reclaim-low` (deserving nothing) fills the pool, then `reclaim-high` (deserving
/// `--reclaim-gpus`) asks for that many GPUs: the coordinator must evict that many of
/// `reclaim-low`'s pods and bind `reclaim-high`'s in their place.
async fn run_reclaim(
    admin: &kube::Client,
    cluster: &Cluster,
    seen: &Mutex<HashMap<String, Instant>>,
    gone: &Mutex<HashMap<String, Instant>>,
    api_user: &str,
    apiserver_pid: Option<u32>,
    o: &Options,
) -> anyhow::Result<Reclaim> {
    let queues: Api<Queue> = Api::all(admin.clone());
    for (name, quota) in [
        ("reclaim-low", 0.0),
        ("reclaim-high", o.reclaim_gpus as f64),
    ] {
        let queue = Queue::new(
            name,
            QueueSpec {
                gpu: Some(GpuQuota {
                    quota,
                    ..GpuQuota::default()
                }),
                ..QueueSpec::default()
            },
        );
        queues.create(&PostParams::default(), &queue).await?;
    }
    let pool = o.nodes * GPUS_PER_NODE as usize;
    let low = (0..pool)
        .map(|i| reclaim_pod(&format!("rl-{i:06}"), "reclaim-low"))
        .collect();
    let fill = run_phase(Phase {
        name: "tessera reclaim: fill",
        namespace: TESSERA_NS,
        pod_prefix: "rl-",
        pods: low,
        client: admin,
        seen,
        cluster,
        api_user,
        scheduler_pid: None,
        apiserver_pid,
        timeout: o.timeout,
    })
    .await?;
    let high = (0..o.reclaim_gpus)
        .map(|i| reclaim_pod(&format!("rh-{i:06}"), "reclaim-high"))
        .collect();
    let started = Instant::now();
    let bound = run_phase(Phase {
        name: "tessera reclaim: reclaiming",
        namespace: TESSERA_NS,
        pod_prefix: "rh-",
        pods: high,
        client: admin,
        seen,
        cluster,
        api_user,
        scheduler_pid: None,
        apiserver_pid,
        timeout: o.timeout,
    })
    .await?;
    let prefix = format!("{TESSERA_NS}/rl-");
    let mut evictions: Vec<Instant> = gone
        .lock()
        .iter()
        .filter(|(k, at)| k.starts_with(&prefix) && **at >= started)
        .map(|(_, at)| *at)
        .collect();
    evictions.sort();
    let evicted_seconds = evictions
        .get(o.reclaim_gpus.saturating_sub(1))
        .map_or(f64::NAN, |at| at.duration_since(started).as_secs_f64());
    Ok(Reclaim {
        gpus: o.reclaim_gpus,
        fill,
        evicted_seconds,
        evicted: evictions.len(),
        bound,
    })
}

fn pod(
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
    extra_spec: serde_json::Value,
    pool: &str,
) -> Pod {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "tolerations": [{"key": POOL_KEY, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "busybox", "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi", "nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"},
        }}],
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(extra.clone());
    }
    // Built from literals above; a failure would be a bug in this file.
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
    .expect("a valid pod")
}

struct Phase<'a> {
    name: &'static str,
    namespace: &'static str,
    /// The first characters of the phase's pod names.
    pod_prefix: &'static str,
    pods: Vec<Pod>,
    client: &'a kube::Client,
    seen: &'a Mutex<HashMap<String, Instant>>,
    cluster: &'a Cluster,
    /// The audit log user whose requests are the scheduler's.
    api_user: &'a str,
    /// kube-scheduler's process, whose CPU is reported when known.
    scheduler_pid: Option<u32>,
    apiserver_pid: Option<u32>,
    timeout: Duration,
}

/// What one phase measured.
struct Outcome {
    pods: usize,
    seconds: f64,
    pods_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    create_seconds: f64,
    process_cpu_seconds: f64,
    apiserver_cpu_seconds: Option<f64>,
    scheduler_cpu_seconds: Option<f64>,
    api_requests: BTreeMap<String, usize>,
}

impl Outcome {
    fn api_requests_per_pod(&self) -> f64 {
        self.api_requests.values().sum::<usize>() as f64 / self.pods as f64
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "pods_bound": self.pods,
            "seconds_first_creation_to_last_bound": round(self.seconds, 3),
            "seconds_creating": round(self.create_seconds, 3),
            "pods_per_second": round(self.pods_per_second, 1),
            "creation_to_bound_ms": {
                "p50": round(self.p50_ms, 1), "p99": round(self.p99_ms, 1), "max": round(self.max_ms, 1),
            },
            "process_cpu_seconds": round(self.process_cpu_seconds, 2),
            "apiserver_cpu_seconds": self.apiserver_cpu_seconds.map(|s| round(s, 2)),
            "kube_scheduler_cpu_seconds": self.scheduler_cpu_seconds.map(|s| round(s, 2)),
            "api_requests": self.api_requests,
            "api_requests_per_pod": round(self.api_requests_per_pod(), 2),
        })
    }
}

/// Creates the phase's pods at once and waits until every one is seen bound.
async fn run_phase(phase: Phase<'_>) -> anyhow::Result<Outcome> {
    let total = phase.pods.len();
    let requests_before = count_requests(phase.cluster, phase.api_user);
    let cpu_before = cpu_seconds(None);
    let apiserver_before = phase.apiserver_pid.and_then(|p| cpu_seconds(Some(p)));
    let scheduler_before = phase.scheduler_pid.and_then(|p| cpu_seconds(Some(p)));
    progress(format_args!("{}: creating {total} pods", phase.name));

    let api: Api<Pod> = Api::namespaced(phase.client.clone(), phase.namespace);
    let created = Arc::new(Mutex::new(HashMap::<String, Instant>::with_capacity(total)));
    let start = Instant::now();
    let creating = {
        let created = Arc::clone(&created);
        let namespace = phase.namespace;
        tokio::spawn(
            futures::stream::iter(phase.pods)
                .map(move |pod| {
                    let api = api.clone();
                    let created = Arc::clone(&created);
                    async move {
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        created
                            .lock()
                            .insert(format!("{namespace}/{name}"), Instant::now());
                        api.create(&PostParams::default(), &pod)
                            .await
                            .with_context(|| format!("creating pod {name}"))?;
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(CREATE_CONCURRENCY)
                .try_collect::<()>(),
        )
    };

    // Only the phase's own pods (`t-`, `k-`), not kube-scheduler's warm-up pod.
    let prefix = format!("{}/{}", phase.namespace, phase.pod_prefix);
    let count_bound = || {
        phase
            .seen
            .lock()
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .count()
    };
    let mut creating = Some(creating);
    let mut create_seconds = None;
    let mut last_report = Instant::now();
    loop {
        if let Some(task) = &creating
            && task.is_finished()
        {
            if let Some(task) = creating.take() {
                task.await.context("the pod creation task")??;
            }
            create_seconds = Some(start.elapsed().as_secs_f64());
        }
        let bound = count_bound();
        if last_report.elapsed() >= Duration::from_secs(1) || bound == total {
            let made = created.lock().len();
            eprint!(
                "\rbench-cluster: {}: {:6.1} s, {made}/{total} created, {bound}/{total} bound   ",
                phase.name,
                start.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        if bound == total && creating.is_none() {
            eprintln!();
            break;
        }
        if start.elapsed() > phase.timeout {
            eprintln!();
            bail!(
                "{}: only {bound} of {total} pods bound after {} s",
                phase.name,
                phase.timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let cpu = cpu_seconds(None).zip(cpu_before).map(|(a, b)| a - b);
    let created = created.lock().clone();
    let seen = phase.seen.lock().clone();
    let mut latencies: Vec<f64> = Vec::with_capacity(total);
    let mut last = start;
    for (key, at) in &created {
        let bound = seen
            .get(key)
            .with_context(|| format!("{key} counted bound but not recorded"))?;
        latencies.push(bound.saturating_duration_since(*at).as_secs_f64() * 1000.0);
        last = last.max(*bound);
    }
    latencies.sort_by(f64::total_cmp);
    let seconds = last.duration_since(start).as_secs_f64();
    // The audit backend writes each request after its answer; give the last ones a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut requests = count_requests(phase.cluster, phase.api_user);
    for (k, v) in requests_before {
        if let Some(n) = requests.get_mut(&k) {
            *n = n.saturating_sub(v);
        }
    }
    requests.retain(|_, n| *n > 0);
    let outcome = Outcome {
        pods: total,
        seconds,
        pods_per_second: total as f64 / seconds,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        create_seconds: create_seconds.unwrap_or(seconds),
        process_cpu_seconds: cpu.unwrap_or(f64::NAN),
        apiserver_cpu_seconds: phase
            .apiserver_pid
            .and_then(|p| cpu_seconds(Some(p)))
            .zip(apiserver_before)
            .map(|(a, b)| a - b),
        scheduler_cpu_seconds: phase
            .scheduler_pid
            .and_then(|p| cpu_seconds(Some(p)))
            .zip(scheduler_before)
            .map(|(a, b)| a - b),
        api_requests: requests,
    };
    progress(format_args!(
        "{}: {total} pods bound in {:.2} s, {:.0} pods/s, p50 {:.0} ms, p99 {:.0} ms",
        phase.name, outcome.seconds, outcome.pods_per_second, outcome.p50_ms, outcome.p99_ms
    ));
    Ok(outcome)
}

/// Nearest-rank percentile of sorted `values`.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The API server's completed requests by `user`, per `verb resource[/subresource]`. A watch
/// is logged when it ends, so the watches still open are not counted.
fn count_requests(cluster: &Cluster, user: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in cluster.audit().into_iter().filter(|r| r.user == user) {
        let what = match &r.subresource {
            Some(s) => format!("{} {}/{s}", r.verb, r.resource),
            None => format!("{} {}", r.verb, r.resource),
        };
        *out.entry(what).or_insert(0) += 1;
    }
    out
}

/// User plus system CPU seconds of process `pid` (this one when `None`).
fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLOCK_TICKS)
}

/// A `/proc/self/status` memory line (`VmRSS:`, `VmHWM:`) in KiB.
fn memory_kib(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| round(k as f64 / 1024.0, 1))
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The `kube-peer cluster up` process (etcd and kube-apiserver run inside it).
fn apiserver_pid(cluster: &Cluster) -> anyhow::Result<Option<u32>> {
    let text = std::fs::read_to_string(cluster.dir().join("cluster.json"))?;
    let state: serde_json::Value = serde_json::from_str(&text)?;
    Ok(state["pid"].as_u64().map(|p| p as u32))
}

/// Starts the real kube-scheduler (`kube-peer kube-scheduler`) with client QPS `qps` as its
/// own ServiceAccount bound to cluster-admin (so that the audit log tells its requests apart),
/// and returns once it has bound a warm-up pod, which is then deleted: its informers have
/// synced, so the phase measures scheduling, not start-up.
async fn start_kube_scheduler(
    cluster: &Cluster,
    admin: &kube::Client,
    qps: usize,
) -> anyhow::Result<tokio::process::Child> {
    let peer = tessera_testcluster::kube_peer().map_err(|e| anyhow::anyhow!("{e}"))?;
    let kubeconfig = cluster.service_account_kubeconfig("kube-system", KUBE_SCHEDULER_SA);
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench-kube-scheduler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": KUBE_SCHEDULER_SA, "namespace": "kube-system"}],
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let config = cluster.dir().join("bench-kube-scheduler.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\n\
             kind: KubeSchedulerConfiguration\n\
             clientConnection:\n  kubeconfig: {}\n  qps: {qps}\n  burst: {}\n\
             leaderElection:\n  leaderElect: false\n",
            kubeconfig.display(),
            2 * qps
        ),
    )?;
    let log_path = cluster.dir().join("bench-kube-scheduler.log");
    let log = std::fs::File::create(&log_path)?;
    let child = tokio::process::Command::new(peer)
        .arg("kube-scheduler")
        .arg(format!("--config={}", config.display()))
        .arg("--secure-port=0")
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting kube-scheduler")?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), KUBE_NS);
    pods.create(&PostParams::default(), &kube_pod_named("warm-up"))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = pods.get("warm-up").await?;
        if p.spec.and_then(|s| s.node_name).is_some() {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("kube-scheduler bound no pod within 120 s; its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // No kubelet runs to finish a graceful deletion.
    pods.delete(
        "warm-up",
        &kube::api::DeleteParams::default().grace_period(0),
    )
    .await?;
    Ok(child)
}
