//! Label and field selectors, matched as Kubernetes matches them.
//!
//! A requirement that Kubernetes would refuse to parse (`In` without values, `Gt` with two,
//! an operator a pod label selector does not allow) makes its selector or term match nothing,
//! which is what kube-scheduler ends up doing with such input.

use std::collections::BTreeMap;

use crate::model::{
    LabelSelector, Node, NodeSelector, NodeSelectorTerm, Pod, Requirement, SelectorOp,
};

/// Whether `r` holds for a label (or field) whose value is `value` (`None` = absent);
/// `None` when the requirement is malformed. `integers` allows `Gt`/`Lt` (node selectors).
fn holds(r: &Requirement, value: Option<&str>, integers: bool) -> Option<bool> {
    match r.operator {
        SelectorOp::In | SelectorOp::NotIn => {
            if r.values.is_empty() {
                return None;
            }
            let inside = value.is_some_and(|v| r.values.iter().any(|x| x == v));
            Some(inside == (r.operator == SelectorOp::In))
        }
        SelectorOp::Exists | SelectorOp::DoesNotExist => {
            if !r.values.is_empty() {
                return None;
            }
            Some(value.is_some() == (r.operator == SelectorOp::Exists))
        }
        SelectorOp::Gt | SelectorOp::Lt => {
            if !integers {
                return None;
            }
            let [bound] = r.values.as_slice() else {
                return None;
            };
            let bound: i64 = bound.parse().ok()?;
            // A present label that is not an integer simply does not match.
            let Some(v) = value.and_then(|v| v.parse::<i64>().ok()) else {
                return Some(false);
            };
            Some(if r.operator == SelectorOp::Gt {
                v > bound
            } else {
                v < bound
            })
        }
    }
}

/// Whether `labels` satisfy every requirement of a pod label selector. A `None` selector (the
/// API field absent) matches nothing; an empty one matches everything.
pub fn selector_matches(sel: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = sel else { return false };
    sel.requirements
        .iter()
        .all(|r| holds(r, labels.get(&r.key).map(String::as_str), false).unwrap_or(false))
}

/// Whether `node` satisfies one node selector term. A term with no requirement matches no
/// node; fields know only `metadata.name`, with `In`/`NotIn` and exactly one value.
pub fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    if t.match_expressions.is_empty() && t.match_fields.is_empty() {
        return false;
    }
    let labels_ok = t
        .match_expressions
        .iter()
        .all(|r| holds(r, node.labels.get(&r.key).map(String::as_str), true).unwrap_or(false));
    let fields_ok = t.match_fields.iter().all(|r| {
        if r.key != "metadata.name"
            || r.values.len() != 1
            || !matches!(r.operator, SelectorOp::In | SelectorOp::NotIn)
        {
            return false;
        }
        holds(r, Some(&node.name), false).unwrap_or(false)
    });
    labels_ok && fields_ok
}

/// Whether `node` satisfies a node selector (any of its terms).
pub fn node_selector_matches(s: &NodeSelector, node: &Node) -> bool {
    s.terms.iter().any(|t| term_matches(t, node))
}

/// Whether `node` satisfies the pod's `nodeSelector` and its required node affinity: what
/// kube-scheduler's NodeAffinity filter (and spread's `nodeAffinityPolicy: Honor`) checks.
pub fn required_node_affinity_ok(pod: &Pod, node: &Node) -> bool {
    pod.node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        && pod
            .constraints
            .node_affinity
            .as_ref()
            .is_none_or(|s| node_selector_matches(s, node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: SelectorOp, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator: op,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn node() -> Node {
        Node::cpu_node("n1", 1000, 1000)
            .label("zone", "a")
            .label("rank", "7")
    }

    fn term(rs: Vec<Requirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: rs,
            match_fields: Vec::new(),
        }
    }

    #[test]
    fn operators_on_node_labels() {
        let n = node();
        let cases = [
            (req("zone", SelectorOp::In, &["a", "b"]), true),
            (req("zone", SelectorOp::In, &["b"]), false),
            (req("zone", SelectorOp::NotIn, &["b"]), true),
            (req("missing", SelectorOp::NotIn, &["b"]), true),
            (req("zone", SelectorOp::Exists, &[]), true),
            (req("missing", SelectorOp::DoesNotExist, &[]), true),
            (req("rank", SelectorOp::Gt, &["6"]), true),
            (req("rank", SelectorOp::Lt, &["7"]), false),
            (req("zone", SelectorOp::Gt, &["1"]), false),
            (req("missing", SelectorOp::Lt, &["9"]), false),
            // Malformed: never matches.
            (req("zone", SelectorOp::In, &[]), false),
            (req("zone", SelectorOp::Exists, &["a"]), false),
            (req("rank", SelectorOp::Gt, &["x"]), false),
        ];
        for (r, want) in cases {
            assert_eq!(term_matches(&term(vec![r.clone()]), &n), want, "{r:?}");
        }
    }

    #[test]
    fn empty_terms_match_nothing_and_fields_read_the_name() {
        let n = node();
        assert!(!term_matches(&term(vec![]), &n));
        let by_name = NodeSelectorTerm {
            match_expressions: Vec::new(),
            match_fields: vec![req("metadata.name", SelectorOp::In, &["n1"])],
        };
        assert!(term_matches(&by_name, &n));
        let two_values = NodeSelectorTerm {
            match_expressions: Vec::new(),
            match_fields: vec![req("metadata.name", SelectorOp::In, &["n1", "n2"])],
        };
        assert!(!term_matches(&two_values, &n));
    }

    #[test]
    fn pod_selectors_none_empty_and_integer_operators() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        assert!(!selector_matches(None, &labels));
        assert!(selector_matches(Some(&LabelSelector::default()), &labels));
        let gt = LabelSelector {
            requirements: vec![req("app", SelectorOp::Gt, &["1"])],
        };
        assert!(!selector_matches(Some(&gt), &labels));
    }
}
