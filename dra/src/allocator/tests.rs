//! The allocator's behaviour, one rule per test, on objects written as the API's JSON.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::api::{ResourceSlice, from_value};
use crate::pools::{NodeInfo, assemble};

const DRIVER: &str = "gpu.example.com";

fn slice(name: &str, pool: &str, generation: i64, count: i64, devices: Value) -> ResourceSlice {
    from_value(json!({
        "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": "n1",
                 "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                 "devices": devices}
    }))
    .unwrap()
}

fn gpus(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"index": {"int": i}, "numa": {"int": i % 2}}}))
            .collect(),
    )
}

fn class(name: &str, expression: Option<&str>) -> DeviceClass {
    let selectors = match expression {
        Some(e) => json!([{"cel": {"expression": e}}]),
        None => json!([]),
    };
    from_value(json!({"metadata": {"name": name}, "spec": {"selectors": selectors}})).unwrap()
}

fn classes() -> Vec<DeviceClass> {
    vec![class("gpu", Some(&format!("device.driver == '{DRIVER}'")))]
}

fn claim(name: &str, devices: Value) -> ResourceClaim {
    from_value(json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": devices}}))
        .unwrap()
}

fn exact(name: &str, count: i64) -> Value {
    json!({"name": name, "exactly": {"deviceClassName": "gpu", "count": count}})
}

struct Node {
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    allocated: AllocatedState,
}

impl Node {
    fn new(slices: Vec<ResourceSlice>) -> Node {
        Node {
            slices,
            classes: classes(),
            allocated: AllocatedState::default(),
        }
    }

    fn allocate(&self, claims: &[ResourceClaim]) -> Result<Vec<ClaimAllocation>, Refusal> {
        self.allocate_bounded(claims, DEFAULT_SEARCH_BOUND)
    }

    fn allocate_bounded(
        &self,
        claims: &[ResourceClaim],
        bound: u64,
    ) -> Result<Vec<ClaimAllocation>, Refusal> {
        let labels = BTreeMap::new();
        let pools = assemble(
            &self.slices,
            NodeInfo {
                name: "n1",
                labels: &labels,
            },
        )
        .unwrap();
        let mut cache = SelectorCache::new();
        Allocator::new(&pools, &self.classes, &self.allocated)
            .with_search_bound(bound)
            .allocate(claims, &mut cache)
    }

    /// Allocates and records the result as other claims' state.
    fn commit(&mut self, claim: &ResourceClaim) -> Result<ClaimAllocation, Refusal> {
        let mut result = self.allocate(std::slice::from_ref(claim))?;
        let allocation = result.remove(0);
        let mut n = 0;
        self.allocated.add(&allocation.to_api(|| {
            n += 1;
            format!("share-{n}")
        }));
        Ok(allocation)
    }
}

fn names(allocation: &ClaimAllocation) -> Vec<String> {
    allocation
        .devices
        .iter()
        .map(|d| d.id.device.clone())
        .collect()
}

#[test]
fn exact_count_takes_distinct_free_devices() {
    let mut node = Node::new(vec![slice("s", "p", 1, 1, gpus(3))]);
    let first = node
        .commit(&claim("a", json!({"requests": [exact("gpu", 2)]})))
        .unwrap();
    assert_eq!(names(&first), vec!["gpu-0", "gpu-1"]);
    let refusal = node
        .commit(&claim("b", json!({"requests": [exact("gpu", 2)]})))
        .unwrap_err();
    let text = refusal.to_string();
    assert!(
        text.contains("ns/b")
            && text.contains("1 free device(s) of class gpu")
            && text.contains("2 needed"),
        "{text}"
    );
    assert_eq!(
        names(
            &node
                .commit(&claim("c", json!({"requests": [exact("gpu", 1)]})))
                .unwrap()
        ),
        vec!["gpu-2"]
    );
}

#[test]
fn all_mode_takes_every_matching_device_and_fails_on_incomplete_pools() {
    let all = json!({"requests": [{"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}]});
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(3))]);
    assert_eq!(
        names(&node.allocate(&[claim("a", all.clone())]).unwrap()[0]).len(),
        3
    );

    let mut busy = Node::new(vec![slice("s", "p", 1, 1, gpus(3))]);
    busy.commit(&claim("x", json!({"requests": [exact("gpu", 1)]})))
        .unwrap();
    assert!(
        busy.allocate(&[claim("a", all.clone())]).is_err(),
        "one device in use: not all"
    );

    let incomplete = Node::new(vec![
        slice("s", "p", 1, 1, gpus(1)),
        slice("t", "q", 1, 2, gpus(1)),
    ]);
    let refusal = incomplete.allocate(&[claim("a", all)]).unwrap_err();
    assert!(
        matches!(&refusal, Refusal::InvalidClaim { reason, .. } if reason.contains("being updated")),
        "{refusal}"
    );
    // An ExactCount request just skips the incomplete pool.
    assert!(
        incomplete
            .allocate(&[claim("b", json!({"requests": [exact("gpu", 1)]}))])
            .is_ok()
    );
}

#[test]
fn admin_access_does_not_consume() {
    let mut node = Node::new(vec![slice("s", "p", 1, 1, gpus(1))]);
    node.commit(&claim("user", json!({"requests": [exact("gpu", 1)]})))
        .unwrap();
    let admin = claim(
        "monitor",
        json!({"requests": [{"name": "m", "exactly": {"deviceClassName": "gpu", "adminAccess": true}}]}),
    );
    let got = node.commit(&admin).unwrap();
    assert!(got.devices[0].admin_access);
    assert_eq!(
        got.to_api(String::new).devices.results[0].admin_access,
        Some(true)
    );
    // The admin allocation took nothing away.
    assert_eq!(node.allocated.devices.len(), 1);
}

#[test]
fn match_attribute_backtracks_to_a_matching_set() {
    // gpu-0 numa 0, gpu-1 numa 1, gpu-2 numa 0: the first pair fails the constraint.
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(3))]);
    let got = node
        .allocate(&[claim(
            "a",
            json!({"requests": [exact("one", 1), exact("two", 1)],
                   "constraints": [{"matchAttribute": format!("{DRIVER}/numa")}]}),
        )])
        .unwrap();
    assert_eq!(names(&got[0]), vec!["gpu-0", "gpu-2"]);
}

#[test]
fn distinct_attribute_refuses_when_values_repeat() {
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(4))]);
    let distinct =
        |n| json!({"requests": [exact("g", n)], "constraints": [{"distinctAttribute": "numa"}]});
    assert_eq!(
        names(&node.allocate(&[claim("a", distinct(2))]).unwrap()[0]),
        vec!["gpu-0", "gpu-1"]
    );
    let refusal = node.allocate(&[claim("b", distinct(3))]).unwrap_err();
    assert!(refusal.to_string().contains("constraints"), "{refusal}");
}

#[test]
fn constraint_scoped_to_some_requests() {
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(3))]);
    let got = node
        .allocate(&[claim(
            "a",
            json!({"requests": [exact("free", 1), exact("pair", 2)],
                   "constraints": [{"requests": ["pair"], "matchAttribute": "numa"}]}),
        )])
        .unwrap();
    // "free" takes gpu-0 first; the pair left (gpu-1, gpu-2) is not one numa, so the
    // search backtracks into "free".
    assert_eq!(names(&got[0]), vec!["gpu-1", "gpu-0", "gpu-2"]);
    let numa = |d: &str| d.trim_start_matches("gpu-").parse::<usize>().unwrap() % 2;
    let chosen = names(&got[0]);
    assert_eq!(numa(&chosen[1]), numa(&chosen[2]));
}

#[test]
fn first_available_falls_back_in_order() {
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(2))]);
    let request = json!({"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "four", "deviceClassName": "gpu", "count": 4},
        {"name": "two", "deviceClassName": "gpu", "count": 2},
        {"name": "one", "deviceClassName": "gpu", "count": 1}]}]});
    let got = node.allocate(&[claim("a", request)]).unwrap();
    assert_eq!(got[0].devices.len(), 2);
    assert_eq!(got[0].devices[0].request, "gpu/two");
}

#[test]
fn taints_need_tolerations() {
    let devices = json!([
        {"name": "sick", "taints": [{"key": "health", "value": "bad", "effect": "NoSchedule"}]},
        {"name": "noted", "taints": [{"key": "info", "effect": "None"}]}]);
    let node = Node::new(vec![slice("s", "p", 1, 1, devices)]);
    let two = json!({"requests": [exact("g", 2)]});
    assert!(node.allocate(&[claim("a", two)]).is_err());
    let tolerant = json!({"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 2,
        "tolerations": [{"key": "health", "operator": "Exists", "effect": "NoSchedule"}]}}]});
    let got = node.allocate(&[claim("b", tolerant)]).unwrap();
    assert_eq!(names(&got[0]), vec!["sick", "noted"]);
    assert_eq!(got[0].devices[0].tolerations.len(), 1);
}

fn partitioned(gpus: usize) -> Vec<ResourceSlice> {
    let mut devices = Vec::new();
    let mut sets = Vec::new();
    for g in 0..gpus {
        sets.push(json!({"name": format!("gpu-{g}"), "counters": {"memory": {"value": "40Gi"}}}));
        for (name, memory) in [("whole", "40Gi"), ("half-a", "20Gi"), ("half-b", "20Gi")] {
            devices.push(json!({"name": format!("gpu-{g}-{name}"),
                "consumesCounters": [{"counterSet": format!("gpu-{g}"), "counters": {"memory": {"value": memory}}}]}));
        }
    }
    let mut devices_slice = slice("a-devices", "p", 1, 2, Value::Array(devices));
    let mut counters = slice("b-counters", "p", 1, 2, json!([]));
    counters.spec.node_name = None;
    counters.spec.shared_counters = from_value(Value::Array(sets)).unwrap();
    devices_slice.spec.shared_counters.clear();
    vec![devices_slice, counters]
}

#[test]
fn partitions_draw_on_shared_counters() {
    let mut node = Node::new(partitioned(1));
    let whole = node
        .commit(&claim("a", json!({"requests": [exact("g", 1)]})))
        .unwrap();
    assert_eq!(names(&whole), vec!["gpu-0-whole"]);
    // The whole GPU is taken: its halves cannot be, their counter is spent.
    assert!(
        node.commit(&claim("b", json!({"requests": [exact("g", 1)]})))
            .is_err()
    );

    let node = Node::new(partitioned(1));
    let halves = json!({"requests": [exact("h", 2)]});
    // Two devices out of whole/half-a/half-b: only the two halves fit in 40Gi.
    let got = node.allocate(&[claim("c", halves)]).unwrap();
    assert_eq!(names(&got[0]), vec!["gpu-0-half-a", "gpu-0-half-b"]);
}

#[test]
fn partitions_prefer_gpus_already_split() {
    let mut node = Node::new(partitioned(2));
    node.allocated.devices.insert(DeviceId {
        driver: DRIVER.into(),
        pool: "p".into(),
        device: "gpu-1-half-a".into(),
    });
    let got = node
        .allocate(&[claim("a", json!({"requests": [exact("h", 1)]}))])
        .unwrap();
    // gpu-1 is already split: its other half is used and gpu-0 stays whole.
    assert_eq!(names(&got[0]), vec!["gpu-1-half-b"]);
}

fn shared_gpus(n: usize) -> Vec<ResourceSlice> {
    let devices = (0..n)
        .map(|i| json!({"name": format!("gpu-{i}"), "allowMultipleAllocations": true,
            "capacity": {"memory": {"value": "80Gi",
                "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}}))
        .collect();
    vec![slice("s", "p", 1, 1, Value::Array(devices))]
}

fn memory(name: &str, amount: &str) -> ResourceClaim {
    claim(
        name,
        json!({"requests": [{"name": "m", "exactly": {"deviceClassName": "gpu",
            "capacity": {"requests": {"memory": amount}}}}]}),
    )
}

#[test]
fn consumable_capacity_shares_a_device_and_a_third_waits() {
    let mut node = Node::new(shared_gpus(1));
    let a = node.commit(&memory("a", "40Gi")).unwrap();
    assert!(a.devices[0].shared);
    assert_eq!(
        a.devices[0].consumed_capacity["memory"],
        Quantity::from_units(40 << 30)
    );
    node.commit(&memory("b", "40Gi")).unwrap();
    let refusal = node.commit(&memory("c", "1Gi")).unwrap_err();
    assert!(refusal.to_string().contains("capacity"), "{refusal}");
    // The rounding follows the policy: 1.5Gi consumes 2Gi.
    let mut fresh = Node::new(shared_gpus(1));
    let rounded = fresh.commit(&memory("d", "1536Mi")).unwrap();
    assert_eq!(
        rounded.devices[0].consumed_capacity["memory"],
        Quantity::from_units(2 << 30)
    );
    let api = rounded.to_api(|| "uid-1".to_owned());
    assert_eq!(api.devices.results[0].share_id.as_deref(), Some("uid-1"));
}

#[test]
fn capacity_requests_prefer_devices_already_shared() {
    let mut node = Node::new(shared_gpus(2));
    node.allocated.shared.insert(
        DeviceId {
            driver: DRIVER.into(),
            pool: "p".into(),
            device: "gpu-1".into(),
        },
        [("memory".to_owned(), Quantity::from_units(10 << 30))].into(),
    );
    let got = node.commit(&memory("a", "10Gi")).unwrap();
    assert_eq!(names(&got), vec!["gpu-1"], "gpu-0 stays whole");
}

#[test]
fn a_request_without_amount_takes_the_default() {
    let mut node = Node::new(shared_gpus(1));
    let whole = node
        .commit(&claim("a", json!({"requests": [exact("g", 1)]})))
        .unwrap();
    assert_eq!(
        whole.devices[0].consumed_capacity["memory"],
        Quantity::from_units(80 << 30)
    );
    assert!(node.commit(&memory("b", "1Gi")).is_err());
}

#[test]
fn claims_are_allocated_together_or_not_at_all() {
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(2))]);
    let one = |n| claim(n, json!({"requests": [exact("g", 1)]}));
    let got = node.allocate(&[one("a"), one("b")]).unwrap();
    assert_eq!(
        (names(&got[0]), names(&got[1])),
        (vec!["gpu-0".to_owned()], vec!["gpu-1".to_owned()])
    );
    let refusal = node.allocate(&[one("a"), one("b"), one("c")]).unwrap_err();
    assert!(
        matches!(refusal, Refusal::Unsatisfiable { .. }),
        "{refusal}"
    );
}

#[test]
fn selector_errors_and_missing_classes_name_the_culprit() {
    let mut node = Node::new(vec![slice("s", "p", 1, 1, gpus(1))]);
    node.classes.push(class(
        "broken",
        Some("device.attributes['gpu.example.com'].nope == 1"),
    ));
    let refusal = node
        .allocate(&[claim(
            "a",
            json!({"requests": [{"name": "g", "exactly": {"deviceClassName": "broken"}}]}),
        )])
        .unwrap_err();
    let text = refusal.to_string();
    assert!(
        text.contains("nope == 1") && text.contains("gpu.example.com/p/gpu-0"),
        "{text}"
    );
    let refusal = node
        .allocate(&[claim(
            "a",
            json!({"requests": [{"name": "g", "exactly": {"deviceClassName": "missing"}}]}),
        )])
        .unwrap_err();
    assert!(
        refusal
            .to_string()
            .contains("device class missing not found"),
        "{refusal}"
    );
}

#[test]
fn invalid_pools_are_reported_when_nothing_fits() {
    let node = Node::new(vec![
        slice("s", "p", 1, 2, gpus(1)),
        slice("t", "p", 1, 2, gpus(1)),
    ]);
    let refusal = node
        .allocate(&[claim("a", json!({"requests": [exact("g", 1)]}))])
        .unwrap_err();
    assert!(
        matches!(&refusal, Refusal::InvalidPools { pools } if pools[0].contains("duplicate device name")),
        "{refusal}"
    );
}

#[test]
fn the_search_bound_stops_hopeless_searches() {
    // 24 devices, all numa 0 or 1: 3 with pairwise distinct numa is impossible, and the
    // search has to try the combinations to find out.
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(24))]);
    let hopeless = claim(
        "a",
        json!({"requests": [exact("g", 3)], "constraints": [{"distinctAttribute": "numa"}]}),
    );
    let refusal = node
        .allocate_bounded(std::slice::from_ref(&hopeless), 100)
        .unwrap_err();
    assert_eq!(refusal, Refusal::SearchBound { steps: 100 });
    assert!(matches!(
        node.allocate(&[hopeless]),
        Err(Refusal::Unsatisfiable { .. })
    ));
}

#[test]
fn more_than_32_devices_is_refused() {
    let node = Node::new(vec![slice("s", "p", 1, 1, gpus(40))]);
    let refusal = node
        .allocate(&[claim("a", json!({"requests": [exact("g", 33)]}))])
        .unwrap_err();
    assert!(
        refusal.to_string().contains("claim limit of 32"),
        "{refusal}"
    );
}

/// A small random node and claim, checked against brute force.
#[derive(Debug, Clone)]
struct Case {
    /// (model, numa, allocated) per device.
    devices: Vec<(u8, u8, bool)>,
    /// (model wanted, count) per request.
    requests: Vec<(u8, usize)>,
    match_numa: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((0u8..2, 0u8..2, prop::bool::weighted(0.2)), 0..7),
        prop::collection::vec((0u8..2, 1usize..3), 1..3),
        any::<bool>(),
    )
        .prop_map(|(devices, requests, match_numa)| Case {
            devices,
            requests,
            match_numa,
        })
}

/// Whether some assignment of distinct free devices satisfies the case.
fn brute_force(case: &Case, request: usize, used: &mut Vec<usize>, numa: Option<u8>) -> bool {
    let Some(&(model, count)) = case.requests.get(request) else {
        return true;
    };
    fn pick(
        case: &Case,
        request: usize,
        model: u8,
        left: usize,
        from: usize,
        used: &mut Vec<usize>,
        numa: Option<u8>,
    ) -> bool {
        if left == 0 {
            return brute_force(case, request + 1, used, numa);
        }
        for i in from..case.devices.len() {
            let (m, n, allocated) = case.devices[i];
            if allocated
                || m != model
                || used.contains(&i)
                || (case.match_numa && numa.is_some_and(|x| x != n))
            {
                continue;
            }
            used.push(i);
            let found = pick(
                case,
                request,
                model,
                left - 1,
                i + 1,
                used,
                if case.match_numa { Some(n) } else { numa },
            );
            used.pop();
            if found {
                return true;
            }
        }
        false
    }
    pick(case, request, model, count, 0, used, numa)
}

proptest! {
    #[test]
    fn feasibility_matches_brute_force(case in case()) {
        let devices: Vec<Value> = case.devices.iter().enumerate()
            .map(|(i, (model, numa, _))| json!({"name": format!("d{i}"),
                "attributes": {"model": {"string": format!("m{model}")}, "numa": {"int": numa}}}))
            .collect();
        let mut node = Node::new(vec![slice("s", "p", 1, 1, Value::Array(devices))]);
        for (i, (_, _, allocated)) in case.devices.iter().enumerate() {
            if *allocated {
                node.allocated.devices.insert(DeviceId { driver: DRIVER.into(), pool: "p".into(), device: format!("d{i}") });
            }
        }
        let requests: Vec<Value> = case.requests.iter().enumerate()
            .map(|(r, (model, count))| json!({"name": format!("r{r}"), "exactly": {"deviceClassName": "gpu", "count": count,
                "selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].model == 'm{model}'")}}]}}))
            .collect();
        let constraints = if case.match_numa { json!([{"matchAttribute": "numa"}]) } else { json!([]) };
        let result = node.allocate(&[claim("c", json!({"requests": requests, "constraints": constraints}))]);
        let expected = brute_force(&case, 0, &mut Vec::new(), None);
        prop_assert_eq!(result.is_ok(), expected, "{:?}", result);
        if let Ok(allocations) = result {
            let chosen: Vec<usize> = allocations[0].devices.iter()
                .map(|d| d.id.device.trim_start_matches('d').parse().unwrap()).collect();
            let mut distinct = chosen.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), chosen.len(), "a device twice");
            let mut at = 0;
            for (r, (model, count)) in case.requests.iter().enumerate() {
                for d in &allocations[0].devices[at..at + count] {
                    prop_assert_eq!(&d.request, &format!("r{r}"));
                }
                for i in &chosen[at..at + count] {
                    prop_assert_eq!(case.devices[*i].0, *model);
                    prop_assert!(!case.devices[*i].2, "allocated device reused");
                }
                at += count;
            }
            if case.match_numa {
                prop_assert!(chosen.iter().all(|i| case.devices[*i].1 == case.devices[chosen[0]].1));
            }
        }
    }
}

#[test]
fn all_under_a_constraint_keeps_upstream_order() {
    // gpu-1 is already shared, so the preference would try it first for "share"; then "all"
    // (gpu-0) breaks the numa constraint, which upstream makes a hard failure. Upstream tries
    // gpu-0 first and succeeds, so must we.
    let devices = json!([
        {"name": "gpu-0", "allowMultipleAllocations": true, "attributes": {"numa": {"int": 1}},
         "capacity": {"memory": {"value": "8"}}},
        {"name": "gpu-1", "allowMultipleAllocations": true, "attributes": {"numa": {"int": 0}},
         "capacity": {"memory": {"value": "8"}}}]);
    let mut node = Node::new(vec![slice("s", "p", 1, 1, devices)]);
    node.allocated.shared.insert(
        DeviceId {
            driver: DRIVER.into(),
            pool: "p".into(),
            device: "gpu-1".into(),
        },
        [("memory".to_owned(), Quantity::from_units(1))].into(),
    );
    let got = node
        .allocate(&[claim(
            "a",
            json!({"requests": [
                {"name": "share", "exactly": {"deviceClassName": "gpu", "capacity": {"requests": {"memory": "1"}}}},
                {"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All",
                    "capacity": {"requests": {"memory": "1"}},
                    "selectors": [{"cel": {"expression": "device.attributes['gpu.example.com'].numa == 1"}}]}}],
                "constraints": [{"matchAttribute": "numa"}]}),
        )])
        .unwrap();
    assert_eq!(names(&got[0]), vec!["gpu-0", "gpu-0"]);
}
