//! Differential test: Tessera's DRA allocator against upstream's structured allocator.
//!
//! Seeded random cases for node `n1`: one or two pools (some split over two slices, some
//! missing a slice, some with a stale older generation or a duplicate device name), devices
//! with attributes, taints, consumable capacity under each request policy, partitionable
//! devices on shared counters, devices already allocated whole or in shares; two classes; one
//! or two claims with ExactCount/All requests, selectors, tolerations, capacity requests,
//! admin access, `firstAvailable` alternatives and match/distinct constraints. Each case goes
//! both ways:
//!
//! - Tessera: the API JSON through `tessera_dra::api`, `pools::assemble` and
//!   `Allocator::allocate`;
//! - upstream: `kube-peer dra-allocate` (hack/k8s/internal/dra), `structured.NewAllocator` of
//!   the pinned release with every feature on, which also checks Tessera's allocation (upstream
//!   must allocate the claims from only the devices Tessera chose).
//!
//! Both must say feasible or not alike, and Tessera's allocation must pass the check. A
//! disagreement is shrunk (array elements and object fields removed while it stays) and
//! written to `target/dra-diff/case-<seed>.json`, which both sides replay:
//! `TESSERA_DRA_CASE=<file> cargo test -p tessera-dra --test it differential` and
//! `kube-peer dra-allocate < <file>`. `TESSERA_DIFF_SEED` and `TESSERA_DIFF_CASES` (default
//! 10,000) choose other seeds and sizes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tessera_dra::allocator::{AllocatedState, Allocator, ClaimAllocation, Refusal};
use tessera_dra::api::{DeviceClass, ResourceClaim, ResourceSlice, from_value};
use tessera_dra::pools::{NodeInfo, assemble};
use tessera_dra::selector::SelectorCache;

/// The oracle process: one JSON case per line in, one answer per line out.
struct Oracle {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Oracle {
    fn start() -> Oracle {
        let bin = std::env::var_os("KUBE_PEER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kube-peer/kube-peer")
            });
        let mut child = Command::new(&bin)
            .arg("dra-allocate")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {} dra-allocate: {e} (set KUBE_PEER, or build it with hack/k8s/build target/kube-peer/kube-peer)",
                    bin.display()
                )
            });
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Oracle {
            child,
            stdin,
            stdout,
        }
    }

    /// Upstream's answer, or its refusal of the case (a panic of the allocator, say).
    fn ask(&mut self, case: &Value) -> Result<Value, String> {
        writeln!(self.stdin, "{case}").expect("writing to kube-peer dra-allocate");
        self.stdin.flush().expect("flushing kube-peer dra-allocate");
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("reading from kube-peer dra-allocate");
        assert!(n > 0, "kube-peer dra-allocate ended early");
        let answer: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("kube-peer dra-allocate answered {line:?}: {e}"));
        match answer.get("feasible") {
            Some(_) => Ok(answer),
            None => Err(format!("kube-peer dra-allocate refused the case: {answer}")),
        }
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Tessera's verdict on a case (the JSON must decode: the generator writes valid objects).
fn tessera(case: &Value) -> Result<Result<Vec<ClaimAllocation>, Refusal>, String> {
    let decode = |field: &str| case.get(field).cloned().unwrap_or_else(|| json!([]));
    let slices: Vec<ResourceSlice> = from_value(decode("slices")).map_err(|e| e.to_string())?;
    let classes: Vec<DeviceClass> = from_value(decode("classes")).map_err(|e| e.to_string())?;
    let claims: Vec<ResourceClaim> = from_value(decode("claims")).map_err(|e| e.to_string())?;
    let existing: Vec<ResourceClaim> =
        from_value(decode("allocated")).map_err(|e| e.to_string())?;
    let allocated = AllocatedState::from_claims(&existing);
    let labels = BTreeMap::new();
    let pools = assemble(
        &slices,
        NodeInfo {
            name: "n1",
            labels: &labels,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut cache = SelectorCache::new();
    Ok(Allocator::new(&pools, &classes, &allocated).allocate(&claims, &mut cache))
}

/// Whether both sides found the case feasible, or how they disagree.
fn compare(oracle: &mut Oracle, case: &Value) -> Result<bool, String> {
    let ours = match tessera(case) {
        Ok(ours) => ours,
        // A shrunk case Tessera cannot even read is not the disagreement being shrunk.
        Err(_) => return Ok(false),
    };
    let mut asked = case.clone();
    if let Ok(allocations) = &ours {
        let mut n = 0;
        let results: Vec<Value> = allocations
            .iter()
            .map(|a| {
                serde_json::to_value(a.to_api(|| {
                    n += 1;
                    format!("tessera-share-{n}")
                }))
                .expect("allocation results serialise")
            })
            .collect();
        asked["tessera"] = Value::Array(results);
    }
    let answer = oracle.ask(&asked)?;
    let upstream = answer["feasible"].as_bool().unwrap_or(false);
    if upstream != ours.is_ok() {
        return Err(format!(
            "upstream feasible={upstream} ({}), Tessera {}",
            answer["error"].as_str().unwrap_or(""),
            match &ours {
                Ok(a) => format!("allocated {a:?}"),
                Err(refusal) => format!("refused: {refusal}"),
            }
        ));
    }
    match answer["invalid"].as_str().filter(|s| !s.is_empty()) {
        Some(invalid) => Err(format!(
            "Tessera's allocation is not valid upstream: {invalid}"
        )),
        None => Ok(upstream),
    }
}

/// What kind of disagreement a problem is: shrinking keeps that kind (for a feasibility
/// disagreement, with upstream's same error), so an input upstream trips over differently
/// does not replace the disagreement being shrunk.
fn kind(problem: &str) -> &str {
    let end = if problem.starts_with("upstream feasible=") {
        problem.find(", Tessera ")
    } else {
        problem.find(':')
    };
    &problem[..end.unwrap_or(problem.len())]
}

/// Removes array elements and object fields, one at a time, while the disagreement stays.
fn shrink(oracle: &mut Oracle, mut case: Value, problem: &str) -> Value {
    let mut budget = 2_000;
    loop {
        let mut smaller = None;
        for candidate in removals(&case) {
            budget -= 1;
            if budget == 0 {
                return case;
            }
            if compare(oracle, &candidate).is_err_and(|p| kind(&p) == kind(problem)) {
                smaller = Some(candidate);
                break;
            }
        }
        match smaller {
            Some(s) => case = s,
            None => return case,
        }
    }
}

/// Fields shrinking keeps: the case's id, and what the API server defaults (upstream's
/// allocator reads them as stored, so removing one makes a different, invalid case).
const KEPT: [&str; 3] = ["id", "allocationMode", "count"];

/// Every value one element or field smaller than `value` (never a [`KEPT`] field).
fn removals(value: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    match value {
        Value::Array(items) => {
            for i in 0..items.len() {
                let mut fewer = items.clone();
                fewer.remove(i);
                out.push(Value::Array(fewer));
            }
            for (i, item) in items.iter().enumerate() {
                for smaller in removals(item) {
                    let mut changed = items.clone();
                    changed[i] = smaller;
                    out.push(Value::Array(changed));
                }
            }
        }
        Value::Object(fields) => {
            for key in fields.keys().filter(|k| !KEPT.contains(&k.as_str())) {
                let mut fewer = fields.clone();
                fewer.remove(key);
                out.push(Value::Object(fewer));
            }
            for (key, field) in fields {
                for smaller in removals(field) {
                    let mut changed = fields.clone();
                    changed.insert(key.clone(), smaller);
                    out.push(Value::Object(changed));
                }
            }
        }
        _ => {}
    }
    out
}

fn device(rng: &mut ChaCha8Rng, name: String, counter_set: Option<&str>) -> Value {
    let mut d = json!({"name": name, "attributes": {
        "model": {"string": format!("m{}", rng.random_range(0..2))},
        "numa": {"int": rng.random_range(0..2)}}});
    if rng.random_bool(0.15) {
        let effect = if rng.random_bool(0.5) {
            "NoSchedule"
        } else {
            "NoExecute"
        };
        d["taints"] = json!([{"key": "bad", "effect": effect}]);
    } else if rng.random_bool(0.1) {
        d["taints"] = json!([{"key": "info", "effect": "None"}]);
    }
    if rng.random_bool(0.3) {
        d["allowMultipleAllocations"] = json!(true);
        let mut capacity = json!({"value": "8"});
        match rng.random_range(0..4) {
            0 => {}
            1 => {
                capacity["requestPolicy"] =
                    json!({"default": "2", "validRange": {"min": "1", "step": "1"}})
            }
            2 => {
                capacity["requestPolicy"] = json!({"default": "2", "validValues": ["2", "4", "8"]})
            }
            _ => {
                capacity["requestPolicy"] = json!({"default": "1500m", "validRange": {"min": "500m", "max": "6", "step": "500m"}})
            }
        }
        d["capacity"] = json!({"memory": capacity});
    } else if rng.random_bool(0.2) {
        d["capacity"] = json!({"memory": {"value": "8"}});
    }
    if let Some(set) = counter_set {
        d["consumesCounters"] = json!([{"counterSet": set,
            "counters": {"mem": {"value": format!("{}", rng.random_range(1..5))}}}]);
    }
    d
}

fn request(rng: &mut ChaCha8Rng, name: &str, alternative: bool) -> Value {
    let class = if rng.random_bool(0.7) { "gpu" } else { "m0" };
    let mut r = json!({"deviceClassName": class});
    if rng.random_bool(0.15) {
        r["allocationMode"] = json!("All");
    } else {
        // The API server defaults both; upstream's allocator reads them as stored.
        r["allocationMode"] = json!("ExactCount");
        r["count"] = json!(rng.random_range(1..4));
    }
    if rng.random_bool(0.25) {
        let numa = rng.random_range(0..2);
        r["selectors"] =
            json!([{"cel": {"expression": format!("device.attributes['d'].numa == {numa}")}}]);
    }
    if rng.random_bool(0.2) {
        r["tolerations"] = json!([{"key": "bad", "operator": "Exists"}]);
    }
    if rng.random_bool(0.3) {
        r["capacity"] = json!({"requests": {"memory": format!("{}", rng.random_range(1..6))}});
    }
    if !alternative && rng.random_bool(0.08) {
        r["adminAccess"] = json!(true);
    }
    if alternative {
        r["name"] = json!(name);
        r
    } else {
        json!({"name": name, "exactly": r})
    }
}

/// One random case; `generous` cases have more devices and fewer taken, so more are feasible.
fn case(seed: u64) -> Value {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let generous = seed % 2 == 1;
    let mut slices = Vec::new();
    let mut devices_made = Vec::new();
    for p in 0..rng.random_range(1..3) {
        let pool = format!("p{p}");
        let partitioned = rng.random_bool(0.3);
        let split = !partitioned && rng.random_bool(0.15);
        let missing = rng.random_bool(0.08);
        let n = if generous {
            rng.random_range(3..9)
        } else {
            rng.random_range(0..6)
        };
        let mut devices = Vec::new();
        for i in 0..n {
            let name = format!("dev-{i}");
            devices_made.push((pool.clone(), name.clone()));
            devices.push(device(&mut rng, name, partitioned.then_some("gpu")));
        }
        let count = if partitioned || split { 2 } else { 1 };
        let slice = |name: String, spec: Value| json!({"metadata": {"name": name}, "spec": spec});
        let pool_of = |count: i64, generation: i64| json!({"name": pool, "generation": generation, "resourceSliceCount": count});
        if rng.random_bool(0.1) {
            slices.push(slice(
                format!("{pool}-old"),
                json!({"driver": "d", "nodeName": "n1", "pool": pool_of(1, 0), "devices": [{"name": "old"}]}),
            ));
        }
        slices.push(slice(
            format!("{pool}-a"),
            json!({"driver": "d", "nodeName": "n1", "pool": pool_of(count, 1), "devices": devices}),
        ));
        if partitioned && !missing {
            let total = format!("{}", rng.random_range(2..7));
            slices.push(slice(
                format!("{pool}-b"),
                json!({"driver": "d", "allNodes": true, "pool": pool_of(count, 1),
                       "sharedCounters": [{"name": "gpu", "counters": {"mem": {"value": total}}}]}),
            ));
        } else if split && !missing {
            let duplicate = rng.random_bool(0.2);
            let name = if duplicate {
                "dev-0".to_owned()
            } else {
                "extra".to_owned()
            };
            if !duplicate {
                devices_made.push((pool.clone(), name.clone()));
            }
            let extra = device(&mut rng, name, None);
            slices.push(slice(
                format!("{pool}-b"),
                json!({"driver": "d", "nodeName": "n1", "pool": pool_of(count, 1), "devices": [extra]}),
            ));
        }
    }
    let classes = json!([
        {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": "device.driver == 'd'"}}]}},
        {"metadata": {"name": "m0"}, "spec": {"selectors": [{"cel": {"expression": "device.attributes['d'].model == 'm0'"}}]}}]);
    let mut allocated = Vec::new();
    let taken = if generous { 0.05 } else { 0.15 };
    for (pool, device) in &devices_made {
        if rng.random_bool(taken) {
            let mut result = json!({"request": "r", "driver": "d", "pool": pool, "device": device});
            if rng.random_bool(0.4) {
                result["shareID"] = json!(format!("share-{}", rng.random_range(0..1000)));
                result["consumedCapacity"] =
                    json!({"memory": format!("{}", rng.random_range(1..5))});
            }
            allocated.push(json!({"metadata": {"name": format!("old-{pool}-{device}"), "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}},
                "status": {"allocation": {"devices": {"results": [result]}}}}));
        }
    }
    let mut claims = Vec::new();
    for c in 0..rng.random_range(1..3) {
        let mut requests = Vec::new();
        for r in 0..rng.random_range(1..3) {
            let name = format!("r{r}");
            if rng.random_bool(0.2) {
                let alternatives = [request(&mut rng, "a", true), request(&mut rng, "b", true)];
                requests.push(json!({"name": name, "firstAvailable": alternatives}));
            } else {
                requests.push(request(&mut rng, &name, false));
            }
        }
        let mut constraints = Vec::new();
        if rng.random_bool(0.3) {
            let kind = if rng.random_bool(0.5) {
                "matchAttribute"
            } else {
                "distinctAttribute"
            };
            let mut constraint = json!({kind: "d/numa"});
            if rng.random_bool(0.3) {
                constraint["requests"] = json!(["r0"]);
            }
            constraints.push(constraint);
        }
        claims.push(json!({"metadata": {"name": format!("c{c}"), "namespace": "ns", "uid": format!("uid-{c}")},
            "spec": {"devices": {"requests": requests, "constraints": constraints}}}));
    }
    json!({"id": seed, "slices": slices, "classes": classes, "claims": claims, "allocated": allocated})
}

fn write_case(seed: u64, case: &Value) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dra-diff");
    std::fs::create_dir_all(&dir).expect("creating target/dra-diff");
    let path = dir.join(format!("case-{seed}.json"));
    std::fs::write(&path, format!("{case}\n")).expect("writing the case");
    path
}

#[test]
fn allocator_agrees_with_upstream() {
    let mut oracle = Oracle::start();
    if let Some(path) = std::env::var_os("TESSERA_DRA_CASE") {
        let text = std::fs::read_to_string(&path).expect("reading TESSERA_DRA_CASE");
        let case: Value = serde_json::from_str(&text).expect("TESSERA_DRA_CASE is one JSON case");
        if let Err(problem) = compare(&mut oracle, &case) {
            panic!("{problem}\n{text}");
        }
        return;
    }
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let first = env("TESSERA_DIFF_SEED", 0);
    let cases = env("TESSERA_DIFF_CASES", 10_000);
    let mut feasible = 0;
    for seed in first..first + cases {
        let case = case(seed);
        match compare(&mut oracle, &case) {
            Ok(true) => feasible += 1,
            Ok(false) => {}
            Err(problem) => {
                let small = shrink(&mut oracle, case, &problem);
                let path = write_case(seed, &small);
                panic!(
                    "seed {seed}: {problem}\nshrunk to {} (replay: TESSERA_DRA_CASE={} or kube-peer dra-allocate < it):\n{small}\nnow: {:?}",
                    path.display(),
                    path.display(),
                    compare(&mut oracle, &small)
                );
            }
        }
    }
    // The generator must keep both answers common, or the comparison says little.
    assert!(
        feasible * 10 > cases && feasible * 10 < cases * 9,
        "{feasible} of {cases} feasible"
    );
}

#[test]
fn shrinking_removes_one_thing_at_a_time() {
    let removed = removals(&json!({"id": 1, "a": [1, 2], "b": {"c": 3, "count": 1}}));
    assert!(removed.contains(&json!({"id": 1, "b": {"c": 3, "count": 1}})));
    assert!(removed.contains(&json!({"id": 1, "a": [2], "b": {"c": 3, "count": 1}})));
    assert!(removed.contains(&json!({"id": 1, "a": [1, 2], "b": {"count": 1}})));
    assert!(
        removed.iter().all(|v| v.get("id").is_some()),
        "the id stays"
    );
    assert!(
        removed
            .iter()
            .filter_map(|v| v.get("b"))
            .all(|b| b.get("count").is_some()),
        "defaulted fields stay"
    );
    assert_eq!(
        kind("upstream feasible=false (x: y), Tessera allocated z"),
        "upstream feasible=false (x: y)"
    );
    assert_eq!(
        kind("Tessera's allocation is not valid upstream: why"),
        "Tessera's allocation is not valid upstream"
    );
}
