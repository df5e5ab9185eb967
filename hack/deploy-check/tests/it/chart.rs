//! The chart through the real helm and a real API server: `helm lint`, `helm template`
//! (default values and tests/it/values/test-values.yaml) and `helm install` into a real cluster
//! (hack/k8s). Then the checks helm and the API server do not make: the generated
//! manifests are up to date, every YAML file under `deploy/` and `examples/` parses strictly
//! into its Kubernetes type or its CRD's schema, every value is documented, the chart passes
//! only flags the binaries have, and the dashboard and docs name only exported metrics.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{chart_dir, repo, wait_crd_established};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::Api;
use serde_json::Value;
use tessera_deploy_check::chart::{self, Chart, Release, split_documents};
use tessera_deploy_check::kinds::{self, Checked};
use tessera_deploy_check::{lint, manifests, schema};
use tessera_testcluster::{Cluster, ClusterOptions};

fn chart_sources() -> Chart {
    Chart::load(&chart_dir()).unwrap_or_else(|e| panic!("{e}"))
}

fn test_values() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/values/test-values.yaml")
}

/// Every document of `helm template` with `values` files, as JSON, with its template.
fn render(values: &[PathBuf]) -> Vec<(String, Value)> {
    chart::render(&chart_dir(), &Release::default(), values)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|r| {
            let json = kinds::to_json(&r.text).unwrap_or_else(|e| panic!("{}: {e}", r.source));
            (r.source, json)
        })
        .collect()
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the render"))
}

/// The CRDs as the coordinator defines them, as JSON.
fn crds() -> Vec<Value> {
    tessera_coordinator::crd::all()
        .into_iter()
        .map(|(_, crd)| serde_json::to_value(crd).unwrap())
        .collect()
}

/// Checks a tessera.dev object against its CRD schema and the coordinator's Rust type.
fn check_custom(doc: &Value, crds: &[Value]) -> Result<(), String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version
        .split_once('/')
        .ok_or_else(|| format!("apiVersion {api_version:?} has no group"))?;
    let schema = schema::schema_for(crds, group, version, kind)
        .ok_or_else(|| format!("no CRD serves {api_version} {kind}"))?;
    let errors = schema::validate(schema, doc);
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Result<(), String> {
        let t: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
        let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
        match kinds::lost_field(doc, &back, "") {
            None => Ok(()),
            Some(p) => Err(format!("field {p} is not part of the coordinator's type")),
        }
    }
    use tessera_coordinator::crd::{PodGroup, Queue, Topology};
    match kind {
        "Queue" => typed::<Queue>(doc),
        "PodGroup" => typed::<PodGroup>(doc),
        "Topology" => typed::<Topology>(doc),
        other => Err(format!("no coordinator type for {other}")),
    }
}

/// YAML files under `dir` that hold Kubernetes objects (chart sources are not objects).
fn manifest_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            // Go templates, not YAML.
            if name != "templates" {
                manifest_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && !matches!(name, "Chart.yaml" | "values.yaml")
        {
            out.push(path);
        }
    }
}

#[test]
fn generated_manifests_are_up_to_date() {
    let stale = manifests::stale(&repo()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run `cargo run -p tessera-deploy-check -- render`"
    );
}

#[test]
fn every_yaml_under_deploy_and_examples_parses_into_its_kind() {
    let crds = crds();
    let mut files = Vec::new();
    manifest_files(&repo().join("deploy"), &mut files);
    manifest_files(&repo().join("examples"), &mut files);
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("deploy/manifests/tessera.yaml")),
        "{files:?}"
    );
    let mut problems = Vec::new();
    let mut kinds_seen = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, doc) in split_documents(&text).iter().enumerate() {
            let where_ = format!("{} (document {})", file.display(), i + 1);
            let json = match kinds::to_json(doc) {
                Ok(j) => j,
                Err(e) => {
                    problems.push(format!("{where_}: {e}"));
                    continue;
                }
            };
            match kinds::check(&json) {
                Ok(Checked::Typed { kind, .. }) => {
                    kinds_seen.insert(kind);
                }
                Ok(Checked::Unknown { api_version, kind })
                    if api_version.starts_with("tessera.dev/") =>
                {
                    match check_custom(&json, &crds) {
                        Ok(()) => {
                            kinds_seen.insert(kind);
                        }
                        Err(e) => problems.push(format!("{where_}: {kind}: {e}")),
                    }
                }
                Ok(Checked::Unknown { api_version, kind }) => {
                    problems.push(format!("{where_}: no type known for {api_version} {kind}"))
                }
                Err(e) => problems.push(format!("{where_}: {e}")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for kind in [
        "Deployment",
        "DaemonSet",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "PriorityClass",
        "CustomResourceDefinition",
        "Queue",
        "PodGroup",
        "Topology",
        "Pod",
        "Job",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            kinds_seen.contains(kind),
            "no {kind} checked: {kinds_seen:?}"
        );
    }
}

#[test]
fn schema_check_catches_a_misspelt_custom_field() {
    let bad = kinds::to_json(
        "apiVersion: tessera.dev/v1alpha1\nkind: Queue\nmetadata: {name: q}\nspec:\n  gpu: {quota: 2, overQuotaWieght: 3}\n",
    )
    .unwrap();
    let e = check_custom(&bad, &crds()).unwrap_err();
    assert!(e.contains(".spec.gpu.overQuotaWieght"), "{e}");
}

#[test]
fn default_render_has_the_promised_shape() {
    let docs = render(&[]);
    let deployment = find(&docs, "Deployment", "tessera-coordinator");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["ports"][1]["containerPort"], 9090);
    assert_eq!(c["env"][0]["name"], "POD_NAME");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"--lease-namespace=tessera-system"),
        "{args:?}"
    );
    assert!(
        args.contains(&"--agent-users=system:serviceaccount:tessera-system:tessera-agent"),
        "{args:?}"
    );
    assert_eq!(
        find(&docs, "PodDisruptionBudget", "tessera-coordinator")["spec"]["minAvailable"],
        1
    );

    let ds = find(&docs, "DaemonSet", "tessera-agent");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert!(pod.get("hostNetwork").is_none());
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], false);
    assert_eq!(
        c["securityContext"]["capabilities"]["add"],
        serde_json::json!(["KILL"])
    );
    let mounts: BTreeSet<(String, bool)> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["mountPath"].as_str().unwrap().to_string(),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    for want in [
        ("/var/lib/kubelet/device-plugins", false),
        ("/var/lib/kubelet/pod-resources", true),
        ("/host/proc", true),
        ("/var/run/tessera", false),
        ("/var/lib/tessera", false),
    ] {
        assert!(
            mounts.contains(&(want.0.to_string(), want.1)),
            "{want:?} not in {mounts:?}"
        );
    }

    for (name, value, preemptible) in [
        ("tessera-notebook", 200, false),
        ("tessera-inference", 300, false),
        ("tessera-training", 50, true),
    ] {
        let pc = find(&docs, "PriorityClass", name);
        assert_eq!(pc["value"], value);
        assert_eq!(value < 100, preemptible, "{name}");
    }
    let queue = find(&docs, "Queue", "default");
    assert_eq!(queue["spec"]["gpu"]["quota"], 0);
    assert!(
        queue["spec"].get("namespaces").is_none()
            && queue["spec"].get("namespaceSelector").is_none(),
        "the default queue admits every namespace: {queue}"
    );
    assert_eq!(
        find(&docs, "Service", "tessera-coordinator")["spec"]["ports"][0]["port"],
        7070
    );
    assert_eq!(
        find(&docs, "Service", "tessera-coordinator-metrics")["spec"]["ports"][0]["port"],
        9090
    );
    assert!(!docs.iter().any(|(_, d)| d["kind"] == "ServiceMonitor"));

    // The protected keys' policy, bound with Deny, exempting exactly Tessera's two accounts.
    let policy = find(&docs, "ValidatingAdmissionPolicy", "tessera-protected-keys");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let exemption = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        exemption.contains("'system:serviceaccount:tessera-system:tessera-coordinator'")
            && exemption.contains("'system:serviceaccount:tessera-system:tessera-agent'"),
        "{exemption}"
    );
    let binding = find(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "tessera-protected-keys",
    );
    assert_eq!(binding["spec"]["policyName"], "tessera-protected-keys");
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
}

/// The CEL list literal `['a', 'b']` as its strings.
fn cel_strings(list: &str) -> Vec<String> {
    list.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|k| k.trim().trim_matches('\'').to_string())
        .filter(|k| !k.is_empty())
        .collect()
}

/// The admission policy protects exactly the contract's keys (tessera_contract::keys): the
/// chart's lists are generated from them, and this fails when the generated template is stale
/// or the policy reads another list.
#[test]
fn the_admission_policy_protects_exactly_the_contracts_keys() {
    use tessera_contract::keys;
    let docs = render(&[]);
    let policy = find(&docs, "ValidatingAdmissionPolicy", "tessera-protected-keys");
    let variable = |name: &str| -> Vec<String> {
        let vars = policy["spec"]["variables"].as_array().unwrap();
        let v = vars
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"));
        cel_strings(v["expression"].as_str().unwrap())
    };
    assert_eq!(variable("writtenByTessera"), keys::WRITTEN_BY_TESSERA);
    assert_eq!(
        variable("fixedAnnotations"),
        keys::FIXED_ONCE_BOUND_ANNOTATIONS
    );
    assert_eq!(variable("fixedLabels"), keys::FIXED_ONCE_BOUND_LABELS);
}

#[test]
fn chart_renders_with_test_values() {
    let docs = render(&[test_values()]);
    let mut problems = Vec::new();
    for (source, doc) in &docs {
        if let Err(e) = kinds::check(doc) {
            problems.push(format!("{source}: {e}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let deployment = find(&docs, "Deployment", "tessera-coordinator");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(deployment["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        deployment["metadata"]["labels"]["app.kubernetes.io/name"],
        "gpu-sched"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example.com/ml/tessera-coordinator:v9.9.9-test"
    );
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "Always");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "regcred");
    assert!(pod.get("affinity").is_none());
    assert_eq!(
        pod["tolerations"][0]["key"],
        "node-role.kubernetes.io/control-plane"
    );
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert!(args.contains(&Value::from("--scheduler-name=tessera-test")));
    assert!(args.contains(&Value::from("--identity=pinned-for-test")));

    let ds = find(&docs, "DaemonSet", "tessera-agent");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["nodeSelector"]["accelerator"], "h100");
    assert_eq!(pod["tolerations"][0]["effect"], "NoExecute");
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        "registry.example.com/ml/tessera-agent:v9.9.9-test"
    );
    let args = c["args"].as_array().unwrap();
    for want in ["--cdi", "--no-watchdog", "--mig-create"] {
        assert!(args.contains(&Value::from(want)), "{want} not in {args:?}");
    }
    assert_eq!(
        c["securityContext"]["capabilities"]["add"],
        serde_json::json!(["KILL", "SYS_ADMIN"])
    );
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "NVIDIA_MIG_CONFIG_DEVICES")
    );

    assert_eq!(find(&docs, "PriorityClass", "batch-low")["value"], 10);
    let queue = find(&docs, "Queue", "default");
    assert_eq!(queue["spec"]["gpu"]["quota"], 4);
    assert_eq!(
        queue["spec"]["namespaces"],
        serde_json::json!(["ml-research"])
    );
    assert_eq!(
        queue["spec"]["namespaceSelector"]["matchExpressions"][0]["operator"],
        "Exists"
    );
    assert!(
        !docs
            .iter()
            .any(|(_, d)| d["kind"] == "ValidatingAdmissionPolicy"),
        "admissionPolicy.enabled=false"
    );
    for name in ["tessera-coordinator", "tessera-agent"] {
        let sm = find(&docs, "ServiceMonitor", name);
        assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
        assert_eq!(sm["spec"]["endpoints"][0]["interval"], "15s");
    }
}

#[test]
fn values_are_documented_and_templates_read_only_defined_values() {
    let chart = chart_sources();
    assert_eq!(
        lint::undocumented_values(&chart.values_source),
        Vec::<String>::new()
    );
    assert_eq!(
        lint::undefined_value_refs(&chart.template_sources, &chart.values),
        Vec::<String>::new()
    );
}

/// `--flag-name` → whether `flag_name` is a field of the binary's clap arguments.
fn flags_of(main_rs: &str) -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo().join(main_rs)).unwrap();
    source
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let (field, _) = l.split_once(':')?;
            let field = field.trim().strip_prefix("pub ").unwrap_or(field.trim());
            (!field.is_empty()
                && field.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                && !l.starts_with("//"))
            .then(|| field.replace('_', "-"))
        })
        .collect()
}

#[test]
fn the_chart_passes_only_flags_the_binaries_have_each_once() {
    let coordinator = flags_of("coordinator/src/main.rs");
    let agent = flags_of("node-agent/src/main.rs");
    for values in [vec![], vec![test_values()]] {
        let docs = render(&values);
        for (kind, name, known) in [
            ("Deployment", "tessera-coordinator", &coordinator),
            ("DaemonSet", "tessera-agent", &agent),
        ] {
            let doc = find(&docs, kind, name);
            let args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap();
            assert_eq!(args[0], "run");
            let mut seen = BTreeSet::new();
            for arg in args.iter().skip(1).filter_map(Value::as_str) {
                let flag = arg
                    .strip_prefix("--")
                    .unwrap_or_else(|| panic!("{name}: {arg:?} is not a --flag"))
                    .split('=')
                    .next()
                    .unwrap_or_default();
                assert!(
                    known.contains(flag),
                    "{name}: --{flag} is not a flag of the binary"
                );
                assert!(
                    seen.insert(flag.to_string()),
                    "{name}: --{flag} given twice"
                );
            }
        }
    }
}

/// Sample names a Prometheus text exposition can contain: each `# TYPE` name, plus
/// `_total` for counters and `_bucket`/`_sum`/`_count` for histograms.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        names.insert(name.to_string());
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
            }
            _ => {}
        }
    }
    names
}

/// `tessera_...` identifiers in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("tessera_") {
        let before_ok =
            at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.');
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if before_ok {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The agent's metric names, from its source: its families are built at scrape time and
/// empty ones are not exported, so a fresh agent's exposition lacks the per-pod ones.
/// Each name may be queried as is or with a counter or histogram suffix.
fn agent_registered() -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo().join("node-agent/src/metrics.rs")).unwrap();
    let mut names = BTreeSet::new();
    let mut rest = source.as_str();
    while let Some(at) = rest.find("registry.register(") {
        rest = &rest[at + "registry.register(".len()..];
        let Some(open) = rest.find('"') else { break };
        let tail = &rest[open + 1..];
        let Some(close) = tail.find('"') else { break };
        names.insert(format!("tessera_agent_{}", &tail[..close]));
    }
    names
}

#[test]
fn dashboard_and_metrics_doc_use_only_exported_metric_names() {
    use tessera_coordinator::ops::{Metrics, QueueSample};

    // Every coordinator family with one sample, so each is in the exposition.
    let metrics = Metrics::new();
    metrics.set_pending([("gang", 1)]);
    metrics.set_queues([QueueSample {
        queue: "q".into(),
        resource: "gpu".into(),
        fair_share: 1.0,
        allocated: 1.0,
    }]);
    metrics.add_evictions("reclaim", 1);
    let coordinator = metrics.encode();
    let agent = agent_registered();
    assert!(agent.contains("tessera_agent_gpu_healthy"), "{agent:?}");
    let mut known = exported(&coordinator);
    for name in &agent {
        for suffix in ["", "_total", "_bucket", "_sum", "_count"] {
            known.insert(format!("{name}{suffix}"));
        }
    }
    assert!(
        known.contains("tessera_cycle_duration_seconds_bucket"),
        "{known:?}"
    );

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("docs/grafana/tessera-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push_str(target["expr"].as_str().unwrap_or_default());
            exprs.push('\n');
        }
    }
    let used = metric_names(&exprs);
    assert!(used.len() >= 15, "{used:?}");
    let unknown: Vec<&String> = used.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics nobody exports: {unknown:?}"
    );

    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let documented = metric_names(&doc);
    let unknown: Vec<&String> = documented.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "docs/metrics.md names metrics nobody exports: {unknown:?}"
    );
    // And the doc lists every metric there is, by the name a query uses.
    let mut undocumented = Vec::new();
    for line in coordinator
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
    {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let visible = match kind {
            "counter" => format!("{name}_total"),
            _ => name.to_string(),
        };
        if !documented.contains(&visible) {
            undocumented.push(visible);
        }
    }
    for name in &agent {
        if !documented.contains(name) && !documented.contains(&format!("{name}_total")) {
            undocumented.push(name.clone());
        }
    }
    assert!(
        undocumented.is_empty(),
        "docs/metrics.md misses: {undocumented:?}"
    );
}

#[test]
fn helm_lint_passes_with_default_and_test_values() {
    for values in [vec![], vec![test_values()]] {
        let report = chart::lint(&chart_dir(), &values)
            .unwrap_or_else(|e| panic!("helm lint with {values:?}: {e}"));
        assert!(
            report.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{report}"
        );
    }
}

/// `helm install` of the chart (default values) into a real API server: the CRDs are
/// Established, and every object the chart renders was accepted and exists. The pods of the
/// Deployment and DaemonSet do not run (no controllers, no images): the objects are what is
/// checked here; tests/rbac.rs and tests/examples.rs run the components.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_creates_every_object_of_the_chart() {
    let cluster = tokio::task::block_in_place(|| Cluster::start(ClusterOptions::default()));
    let kubeconfig = cluster.admin_kubeconfig();
    let chart = chart_dir();
    let out = common::helm_install(&kubeconfig);
    assert!(
        out.success,
        "helm install failed:\n{}\n{}\n{}",
        out.stdout,
        out.stderr,
        cluster.logs()
    );
    let client = cluster.admin().await;
    for (_, crd) in tessera_coordinator::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        wait_crd_established(&client, &name).await;
    }
    let ns = common::NAMESPACE;
    let docs = render(&[]);
    assert!(docs.len() >= 15, "{} documents", docs.len());
    for (source, doc) in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let found = match kind {
            "ServiceAccount" => Api::<ServiceAccount>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "Service" => Api::<Service>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "Deployment" => Api::<Deployment>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "DaemonSet" => Api::<DaemonSet>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "ClusterRole" => Api::<ClusterRole>::all(client.clone())
                .get(name)
                .await
                .is_ok(),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
                .get(name)
                .await
                .is_ok(),
            "Role" => Api::<Role>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "RoleBinding" => Api::<RoleBinding>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "PriorityClass" => Api::<PriorityClass>::all(client.clone())
                .get(name)
                .await
                .is_ok(),
            "PodDisruptionBudget" => {
                Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
                    client.clone(),
                    ns,
                )
                .get(name)
                .await
                .is_ok()
            }
            "Queue" => Api::<tessera_coordinator::crd::Queue>::all(client.clone())
                .get(name)
                .await
                .is_ok(),
            "ResourceQuota" => {
                Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), ns)
                    .get(name)
                    .await
                    .is_ok()
            }
            "Secret" => Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .is_ok(),
            "MutatingWebhookConfiguration" => Api::<
                k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
            >::all(client.clone())
            .get(name)
            .await
            .is_ok(),
            "ValidatingAdmissionPolicy" => Api::<
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
            >::all(client.clone())
            .get(name)
            .await
            .is_ok(),
            "ValidatingAdmissionPolicyBinding" => Api::<
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
            >::all(client.clone())
            .get(name)
            .await
            .is_ok(),
            other => panic!("{source}: the test does not know how to look up a {other}"),
        };
        assert!(
            found,
            "{source}: {kind} {name} was not created by helm install"
        );
    }
    // The API server kept what the chart says (defaults added, nothing dropped).
    let pc = Api::<PriorityClass>::all(client.clone())
        .get("tessera-training")
        .await
        .expect("PriorityClass");
    assert_eq!(pc.value, Some(50));
    assert_eq!(pc.preemption_policy.as_deref(), Some("Never"));
    let queue = Api::<tessera_coordinator::crd::Queue>::all(client.clone())
        .get("default")
        .await
        .expect("default Queue");
    assert_eq!(queue.spec.gpu.map(|g| g.quota), Some(0.0));
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("tessera-coordinator")
        .await
        .expect("Deployment");
    assert_eq!(deployment.spec.replicas, Some(2));

    let status = tokio::task::block_in_place(|| {
        tessera_testcluster::helm(&["status", "tessera", "--namespace", ns], Some(&kubeconfig))
    });
    assert!(
        status.success && status.stdout.contains("STATUS: deployed"),
        "{}\n{}",
        status.stdout,
        status.stderr
    );

    // The webhook's certificate: the API server trusts the CA in the Secret the coordinator
    // serves, and an upgrade keeps both (a new pair on every upgrade would leave the API
    // server and the mounted Secret disagreeing until the kubelet refreshes the volume).
    let webhook_ca = || async {
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
            .get("tessera-coordinator-webhook-tls")
            .await
            .expect("the webhook Secret");
        let ca = secret.data.unwrap_or_default()["ca.crt"].0.clone();
        let config =
            Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(
                client.clone(),
            )
            .get("tessera-coordinator")
            .await
            .expect("the MutatingWebhookConfiguration");
        let bundle = config.webhooks.unwrap_or_default()[0]
            .client_config
            .ca_bundle
            .clone()
            .expect("a caBundle")
            .0;
        assert_eq!(bundle, ca, "the caBundle is the Secret's CA");
        assert!(String::from_utf8_lossy(&ca).starts_with("-----BEGIN CERTIFICATE-----"));
        ca
    };
    let before = webhook_ca().await;
    let upgrade = tokio::task::block_in_place(|| {
        tessera_testcluster::helm(
            &[
                "upgrade",
                "tessera",
                &chart.to_string_lossy(),
                "--namespace",
                ns,
                "--wait=false",
            ],
            Some(&kubeconfig),
        )
    });
    assert!(upgrade.success, "helm upgrade failed:\n{}", upgrade.stderr);
    assert_eq!(
        webhook_ca().await,
        before,
        "the upgrade kept the certificate"
    );
}

/// The container args of the first container of the workload `kind`/`name`.
fn args_of(docs: &[(String, Value)], kind: &str, name: &str) -> Vec<String> {
    let doc = find(docs, kind, name);
    serde_json::from_value(doc["spec"]["template"]["spec"]["containers"][0]["args"].clone())
        .expect("args")
}

/// The agents' stream is TLS whenever the coordinator has a certificate: both sides name the
/// same Secret's files, and the agent gets only the CA of it, never the key. Without the
/// webhook (the plain manifests) both fall back to plaintext together.
#[test]
fn agents_and_coordinator_agree_on_the_streams_tls() {
    let docs = render(&[]);
    let coordinator = args_of(&docs, "Deployment", "tessera-coordinator");
    let agent = args_of(&docs, "DaemonSet", "tessera-agent");
    assert!(
        coordinator.contains(&"--agent-tls-cert-file=/etc/tessera/webhook/tls.crt".to_owned()),
        "{coordinator:?}"
    );
    assert!(
        agent
            .iter()
            .any(|a| a.starts_with("--coordinator=https://tessera-coordinator.")),
        "{agent:?}"
    );
    assert!(agent.contains(&"--coordinator-ca-file=/var/run/secrets/tessera/ca.crt".to_owned()));
    let ds = find(&docs, "DaemonSet", "tessera-agent");
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    let projected = volumes
        .iter()
        .find(|v| v["name"] == "coordinator-token")
        .expect("the coordinator-token volume");
    let secret = projected["projected"]["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .find_map(|s| s.get("secret"))
        .expect("the CA from the coordinator's Secret");
    assert_eq!(
        secret["items"],
        serde_json::json!([{"key": "ca.crt", "path": "ca.crt"}])
    );

    let plain = render(&[repo().join(manifests::MANIFESTS_VALUES)]);
    let coordinator = args_of(&plain, "Deployment", "tessera-coordinator");
    let agent = args_of(&plain, "DaemonSet", "tessera-agent");
    assert!(
        !coordinator.iter().any(|a| a.starts_with("--agent-tls")),
        "{coordinator:?}"
    );
    assert!(
        agent
            .iter()
            .any(|a| a.starts_with("--coordinator=tessera-coordinator.")),
        "{agent:?}"
    );
}
