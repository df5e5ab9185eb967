//! `kubectl tessera` end to end on real Kubernetes (hack/k8s): the built `kubectl-tessera`
//! binary, run as a user would, against the real API server, with the coordinator writing its
//! GpuNode views from real agents' reports (kubelet-lite nodes, real pods). `gpus` shows a
//! fractional pod's share on the GPU its assignment names, `queues` the tree with allocated
//! GPUs, `why` a pending pod's reason and what would make it fit, `top --once` both; every
//! `-o json` parses. A ServiceAccount bound only to the chart's `tessera-viewer` ClusterRole
//! (and, for `why`, reads of pods and events in its namespace, as the built-in `view` role
//! grants) runs them all; one without it is refused, clearly.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tessera_testcluster::apply;

use crate::e2e::{self, E2e, NS, Setup, pod};

/// The plugin binary beside the coordinator's: `cargo build -p kubectl-tessera` (or the
/// workspace build `cargo test --workspace` makes) puts it there.
fn plugin() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_tessera-coordinator"))
        .parent()
        .expect("the binary's directory")
        .join("kubectl-tessera");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p kubectl-tessera; cargo test --workspace does)",
        path.display()
    );
    path
}

/// What one run printed.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `kubectl-tessera ARGS` with `kubeconfig` passed as the user would: by `KUBECONFIG` when
/// `by_env`, else by `--kubeconfig`.
async fn run(kubeconfig: &Path, by_env: bool, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(plugin());
    cmd.env_remove("KUBECONFIG").env("HOME", "/nonexistent");
    if by_env {
        cmd.env("KUBECONFIG", kubeconfig);
    } else {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    let out = cmd.args(args).output().await.expect("kubectl-tessera runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The run's JSON, which must parse.
fn parsed(r: &Run) -> Value {
    assert!(r.ok, "the command failed:\n{}", r.stderr);
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("-o json does not parse ({e}):\n{}", r.stdout))
}

/// The chart's `tessera-viewer` ClusterRole as `helm template` renders it.
fn viewer_role() -> Value {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tessera");
    let out = tokio::task::block_in_place(|| {
        tessera_testcluster::helm(
            &[
                "template",
                "tessera",
                &chart.to_string_lossy(),
                "--show-only",
                "templates/rbac.yaml",
            ],
            None,
        )
    });
    assert!(out.success, "helm template: {}", out.stderr);
    out.stdout
        .split("\n---")
        .filter_map(|doc| serde_yaml_ng::from_str::<Value>(doc).ok())
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tessera-viewer")
        .expect("the chart renders the ClusterRole tessera-viewer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_tessera_shows_gpus_queues_and_why_with_the_users_own_rbac() {
    let e2e = E2e::start(Setup::one_node()).await;
    e2e.create_queue("research", 8.0).await;
    e2e.create_queue_under("nlp", Some("research"), 8.0).await;
    // A quarter of one GPU and four whole ones on the 8-GPU node; then a pod asking for all 8,
    // which waits for the five GPUs they hold (same queue and priority: nothing is evicted).
    e2e.create_all([
        pod("frac").fraction("0.25").queue("nlp"),
        pod("four").gpus(4).queue("nlp"),
    ])
    .await;
    let running = e2e.wait_running(&["frac".into(), "four".into()]).await;
    let frac_gpu = e2e::assignment_of(&running[0]).containers[0].gpus[0]
        .uuid
        .clone();
    e2e.create(pod("big").gpus(8).queue("nlp")).await;
    e2e.wait_unschedulable("big").await;

    let admin = e2e.cluster().admin_kubeconfig();

    // gpus: the quarter on the GPU its assignment names, as JSON and in the table.
    let holds = |gpu: &Value, pod: &str| {
        gpu["shares"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["pod"] == pod))
    };
    let gpus = e2e
        .wait_until(
            "kubectl tessera gpus to show frac's and four's shares",
            || async {
                let v = parsed(&run(&admin, false, &["gpus", "-o", "json"]).await);
                let gpus = v["nodes"]
                    .as_array()?
                    .iter()
                    .find(|n| n["node"] == "node-a")?["gpus"]
                    .as_array()?
                    .clone();
                let four = gpus.iter().filter(|g| holds(g, "four")).count();
                let gpu = gpus.into_iter().find(|g| holds(g, "frac"))?;
                (four == 4).then_some(gpu)
            },
        )
        .await;
    assert_eq!(
        gpus["uuid"], frac_gpu,
        "frac's share is on another GPU: {gpus:#}"
    );
    let share = gpus["shares"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["pod"] == "frac")
        .unwrap();
    assert_eq!(share["computePercent"], 25, "{share:#}");
    assert_eq!(share["namespace"], NS);
    let table = run(&admin, true, &["gpus"]).await;
    assert!(table.ok, "{}", table.stderr);
    assert!(
        table.stdout.lines().any(|l| l.starts_with("node-a")
            && l.contains("default/frac (main)")
            && l.contains("25%")),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("8 GPUs: 8 healthy, 3 free"),
        "{}",
        table.stdout
    );

    // queues: nlp under research, holding 4.25 GPUs, with 8 pending.
    let queues = e2e
        .wait_until(
            "kubectl tessera queues to show nlp's allocation and big pending",
            || async {
                let r = run(&admin, false, &["queues"]).await;
                r.stdout
                    .lines()
                    .any(|l| {
                        let cells: Vec<&str> = l.split_whitespace().collect();
                        l.starts_with("└─ nlp")
                            && cells.get(4) == Some(&"4.25")
                            && cells.get(5) == Some(&"8")
                    })
                    .then_some(r.stdout)
            },
        )
        .await;
    let lines: Vec<&str> = queues.lines().collect();
    let research = lines
        .iter()
        .position(|l| l.starts_with("research "))
        .expect(&queues);
    assert!(lines[research + 1].starts_with("└─ nlp"), "{queues}");
    let v = parsed(&run(&admin, false, &["queues", "-o", "json"]).await);
    let research = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "research")
        .expect("research in the JSON");
    assert_eq!(research["children"][0]["name"], "nlp");
    assert_eq!(research["children"][0]["allocated"], 4.25);
    assert_eq!(research["children"][0]["pending"], 8.0);

    // why: the coordinator's reason, node-a's verdict and what would make big fit.
    let why = run(&admin, false, &["why", "big", "-n", NS]).await;
    assert!(why.ok, "{}", why.stderr);
    assert!(
        why.stdout.contains("The coordinator says (Unschedulable"),
        "{}",
        why.stdout
    );
    assert!(
        why.stdout.contains(
            "node node-a: fits once 5 more GPUs are free — held by default/four (main), default/frac (main)"
        ),
        "{}",
        why.stdout
    );
    let v = parsed(&run(&admin, false, &["why", "big", "-o", "json"]).await);
    assert_eq!(v["asks"], "8 whole GPUs");
    assert_eq!(v["nodes"][0]["node"], "node-a");
    assert_eq!(v["nodes"][0]["couldFit"], true);
    // By selector: the one of nlp's pods that is not bound.
    let v = parsed(
        &run(
            &admin,
            false,
            &["why", "-l", "tessera.dev/queue=nlp", "-o", "json"],
        )
        .await,
    );
    assert_eq!(v["pod"], "big");
    let missing = run(&admin, false, &["why", "nobody-here"]).await;
    assert!(
        !missing.ok && missing.stderr.contains("pod default/nobody-here not found"),
        "{}",
        missing.stderr
    );

    // top --once: the nodes and the queue tree.
    let top = run(&admin, false, &["top", "--once"]).await;
    assert!(top.ok, "{}", top.stderr);
    assert!(
        top.stdout.lines().any(|l| l.starts_with("node-a ")),
        "{}",
        top.stdout
    );
    assert!(top.stdout.contains("└─ nlp"), "{}", top.stdout);

    // A viewer: the chart's role, and reads of its namespace's pods and their events.
    let role = viewer_role();
    apply(&e2e.client, &role).await;
    apply(
        &e2e.client,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "viewer-tessera"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tessera-viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": NS}],
        }),
    )
    .await;
    // What the built-in `view` role grants `why` (this cluster runs no role aggregation
    // controller to fill `view` in).
    apply(
        &e2e.client,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pod-reader", "namespace": NS},
            "rules": [{"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list"]}],
        }),
    )
    .await;
    apply(
        &e2e.client,
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "viewer-pods", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": NS}],
        }),
    )
    .await;
    let (viewer, nobody) = tokio::task::block_in_place(|| {
        (
            e2e.cluster().service_account_kubeconfig(NS, "viewer"),
            e2e.cluster().service_account_kubeconfig(NS, "nobody"),
        )
    });
    let seen = e2e
        .wait_until("the viewer's gpus to answer (RBAC caches)", || async {
            let r = run(&viewer, true, &["gpus", "-o", "json"]).await;
            r.ok.then(|| parsed(&r))
        })
        .await;
    assert!(seen.to_string().contains("\"frac\""), "{seen:#}");
    let q = run(&viewer, true, &["queues"]).await;
    assert!(
        q.ok && q.stdout.contains("└─ nlp"),
        "{}\n{}",
        q.stdout,
        q.stderr
    );
    let w = run(&viewer, true, &["why", "big"]).await;
    assert!(w.ok, "{}", w.stderr);
    assert!(
        w.stdout.contains("fits once 5 more GPUs are free"),
        "{}",
        w.stdout
    );
    assert!(!w.stdout.contains("permission denied"), "{}", w.stdout);

    // Without the role: refused, saying what and which role grants it, and no table.
    for args in [&["gpus"][..], &["queues"], &["top", "--once"]] {
        let r = run(&nobody, true, args).await;
        assert!(!r.ok, "{args:?} ran without the viewer role:\n{}", r.stdout);
        assert!(r.stdout.is_empty(), "{}", r.stdout);
        assert!(
            r.stderr.starts_with("error: permission denied: ")
                && r.stderr.contains("cannot list resource")
                && r.stderr.contains("--clusterrole=tessera-viewer"),
            "{args:?}: {}",
            r.stderr
        );
    }
    let r = run(&nobody, true, &["why", "big"]).await;
    assert!(
        !r.ok && r.stderr.contains("permission denied") && r.stderr.contains("pods"),
        "{}",
        r.stderr
    );
    e2e.shutdown().await;
}
