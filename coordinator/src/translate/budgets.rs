//! PodDisruptionBudgets (policy/v1) into the core's [`DisruptionBudget`]: which pods each
//! covers and how many of them the Eviction API lets go now.
//!
//! The count is the disruption controller's `status.disruptionsAllowed`. A budget it has not
//! counted yet (no status, or `observedGeneration` behind `generation`) allows nothing: the
//! API server refuses evictions it covers until the controller catches up. The selector is
//! policy/v1's: an empty selector covers every pod of the namespace, an absent one none.
//! Finished pods are not covered (they hold nothing and are never victims).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod as KubePod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use tessera_core::model::DisruptionBudget;

use super::constraints::label_selector;

/// The budgets over `pods`.
pub fn translate(budgets: &[&PodDisruptionBudget], pods: &[&KubePod]) -> Vec<DisruptionBudget> {
    if budgets.is_empty() {
        return Vec::new();
    }
    // Each budget reads only its own namespace's unfinished pods: index them once.
    let mut by_namespace: BTreeMap<&str, Vec<&KubePod>> = BTreeMap::new();
    for p in pods {
        let finished = tessera_contract::pod::is_finished(p);
        if let (false, Some(ns)) = (finished, p.metadata.namespace.as_deref()) {
            by_namespace.entry(ns).or_default().push(p);
        }
    }
    let no_labels = BTreeMap::new();
    budgets
        .iter()
        .filter_map(|pdb| {
            let namespace = pdb.metadata.namespace.as_deref()?;
            let name = pdb.metadata.name.as_deref()?;
            let mut ignored = Vec::new();
            let selector = label_selector(
                pdb.spec.as_ref().and_then(|s| s.selector.as_ref()),
                "spec.selector",
                &mut ignored,
            )?;
            let covered = by_namespace
                .get(namespace)
                .into_iter()
                .flatten()
                .filter(|p| {
                    let labels = p.metadata.labels.as_ref().unwrap_or(&no_labels);
                    tessera_core::constraints::labels::selector_matches(Some(&selector), labels)
                })
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            Some(DisruptionBudget {
                name: format!("{namespace}/{name}"),
                disruptions_allowed: disruptions_allowed(pdb),
                pods: covered,
            })
        })
        .collect()
}

/// What the Eviction API allows now (0 until the disruption controller has counted this
/// generation of the budget).
fn disruptions_allowed(pdb: &PodDisruptionBudget) -> u32 {
    let Some(status) = pdb.status.as_ref() else {
        return 0;
    };
    let current = match (status.observed_generation, pdb.metadata.generation) {
        (Some(seen), Some(generation)) => seen >= generation,
        (_, None) => true,
        (None, Some(_)) => false,
    };
    if !current {
        return 0;
    }
    u32::try_from(status.disruptions_allowed.unwrap_or(0).max(0)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, ns: &str, labels: serde_json::Value, phase: &str) -> KubePod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": name, "labels": labels},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn pdb(selector: serde_json::Value, status: serde_json::Value) -> PodDisruptionBudget {
        let mut v = json!({
            "metadata": {"name": "b", "namespace": "ns", "generation": 2},
            "spec": {"minAvailable": 1},
            "status": status,
        });
        if !selector.is_null() {
            v["spec"]["selector"] = selector;
        }
        serde_json::from_value(v).unwrap()
    }

    fn counted(allowed: i32) -> serde_json::Value {
        json!({"disruptionsAllowed": allowed, "observedGeneration": 2,
               "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0})
    }

    #[test]
    fn a_budget_covers_its_namespaces_matching_running_pods() {
        let pods = [
            pod("a", "ns", json!({"app": "db"}), "Running"),
            pod("b", "ns", json!({"app": "web"}), "Running"),
            pod("c", "other", json!({"app": "db"}), "Running"),
            pod("d", "ns", json!({"app": "db"}), "Succeeded"),
        ];
        let refs: Vec<&KubePod> = pods.iter().collect();
        let b = pdb(json!({"matchLabels": {"app": "db"}}), counted(1));
        let out = translate(&[&b], &refs);
        assert_eq!(
            out,
            vec![DisruptionBudget {
                name: "ns/b".into(),
                disruptions_allowed: 1,
                pods: vec!["a".into()],
            }]
        );
        // policy/v1: an empty selector covers the whole namespace, an absent one nothing.
        let all = translate(&[&pdb(json!({}), counted(1))], &refs);
        assert_eq!(all[0].pods, vec!["a".to_owned(), "b".to_owned()]);
        assert!(translate(&[&pdb(serde_json::Value::Null, counted(1))], &refs).is_empty());
    }

    #[test]
    fn an_uncounted_budget_allows_nothing() {
        let pods = [pod("a", "ns", json!({"app": "db"}), "Running")];
        let refs: Vec<&KubePod> = pods.iter().collect();
        let sel = json!({"matchLabels": {"app": "db"}});
        let no_status = translate(&[&pdb(sel.clone(), serde_json::Value::Null)], &refs);
        assert_eq!(no_status[0].disruptions_allowed, 0);
        let mut stale = counted(3);
        stale["observedGeneration"] = json!(1);
        assert_eq!(
            translate(&[&pdb(sel.clone(), stale)], &refs)[0].disruptions_allowed,
            0
        );
        assert_eq!(
            translate(&[&pdb(sel, counted(-1))], &refs)[0].disruptions_allowed,
            0
        );
    }
}
