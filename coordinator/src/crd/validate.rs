//! Validation of Tessera objects beyond what the API server's schema checks: pure functions
//! returning problems that name the field and the accepted form. The cluster layer writes them as
//! a `Valid=False` condition on the object (see [`condition`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::condition::{Condition, VALID};
use super::podgroup::PodGroup;
use super::quantity::QuantityValue;
use super::queue::Queue;
use super::topology::Topology;
use tessera_contract::gpu_model;

/// One problem with an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The offending field, as a path from the object root (e.g. `spec.gpu.quota`).
    pub field: String,
    /// What is wrong and which form is accepted.
    pub message: String,
}

impl Problem {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Checks one queue on its own: non-negative quota and weight, a limit that is -1 or at least
/// the quota, well-formed quantities, namespace names and a namespace selector as Kubernetes
/// would parse it.
pub fn queue(q: &Queue) -> Vec<Problem> {
    let mut out = Vec::new();
    if let Some(g) = &q.spec.gpu {
        check_amounts(
            &mut out,
            "gpu",
            Some(g.quota),
            g.over_quota_weight,
            Some(g.limit),
            "GPUs such as 2 or 0.5",
        );
        let mut seen = BTreeSet::new();
        for (i, m) in g.models.iter().enumerate() {
            let res = format!("gpu.models[{i}]");
            if !gpu_model::is_valid_key(&m.model) {
                out.push(Problem::new(
                    format!("spec.{res}.model"),
                    format!("{:?} is not {}", m.model, gpu_model::KEY_FORM),
                ));
            } else if !seen.insert(m.model.as_str()) {
                out.push(Problem::new(
                    format!("spec.{res}.model"),
                    format!("{:?} appears twice; list each GPU model once", m.model),
                ));
            }
            check_amounts(
                &mut out,
                &res,
                Some(m.quota),
                m.over_quota_weight.unwrap_or(1.0),
                Some(m.limit),
                "GPUs such as 2 or 0.5",
            );
        }
    }
    for (name, settings) in [("cpu", &q.spec.cpu), ("memory", &q.spec.memory)] {
        let Some(s) = settings else { continue };
        let quota = quantity_field(&mut out, name, "quota", s.quota.as_ref());
        let limit = quantity_field(&mut out, name, "limit", s.limit.as_ref());
        let example = if name == "cpu" {
            "a quantity such as 32 or 500m"
        } else {
            "a quantity such as 64Gi or 4096Mi"
        };
        check_amounts(
            &mut out,
            name,
            quota,
            s.over_quota_weight,
            limit.or(Some(-1.0)),
            example,
        );
    }
    tenancy(&mut out, q);
    if q.spec.parent.as_deref() == Some(q.metadata.name.as_deref().unwrap_or("")) {
        out.push(Problem::new(
            "spec.parent",
            "a queue cannot be its own parent; name another Queue or remove parent",
        ));
    }
    out
}

/// The operators a namespace selector's requirement may use.
pub const SELECTOR_OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// `spec.namespaces` and `spec.namespaceSelector`: names that can be namespaces, label keys
/// and values Kubernetes accepts, known operators with the values each needs.
fn tenancy(out: &mut Vec<Problem>, q: &Queue) {
    let mut seen = BTreeSet::new();
    for (i, ns) in q.spec.namespaces.iter().flatten().enumerate() {
        let field = format!("spec.namespaces[{i}]");
        if let Err(why) = dns_label(ns) {
            out.push(Problem::new(
                field,
                format!("{ns:?} {why}; give a namespace name such as team-a"),
            ));
        } else if !seen.insert(ns.as_str()) {
            out.push(Problem::new(
                field,
                format!("{ns:?} appears twice; list each namespace once"),
            ));
        }
    }
    let Some(sel) = &q.spec.namespace_selector else {
        return;
    };
    const BASE: &str = "spec.namespaceSelector";
    for (key, value) in &sel.match_labels {
        let field = format!("{BASE}.matchLabels[{key:?}]");
        if let Err(why) = qualified_name(key) {
            out.push(Problem::new(
                field,
                format!("key {key:?} {why}; {KEY_FORM}"),
            ));
        } else if let Err(why) = label_value(value) {
            out.push(Problem::new(
                field,
                format!("value {value:?} {why}; {VALUE_FORM}"),
            ));
        }
    }
    for (j, r) in sel.match_expressions.iter().enumerate() {
        let at = format!("{BASE}.matchExpressions[{j}]");
        if let Err(why) = qualified_name(&r.key) {
            out.push(Problem::new(
                format!("{at}.key"),
                format!("{:?} {why}; {KEY_FORM}", r.key),
            ));
        }
        let wants_values = match r.operator.as_str() {
            "In" | "NotIn" => true,
            "Exists" | "DoesNotExist" => false,
            other => {
                out.push(Problem::new(
                    format!("{at}.operator"),
                    format!(
                        "{other:?} is not a namespace selector operator; use one of {}",
                        SELECTOR_OPERATORS.join(", ")
                    ),
                ));
                continue;
            }
        };
        if wants_values && r.values.is_empty() {
            out.push(Problem::new(
                format!("{at}.values"),
                format!("empty; operator {} needs at least one value", r.operator),
            ));
        } else if !wants_values && !r.values.is_empty() {
            out.push(Problem::new(
                format!("{at}.values"),
                format!("operator {} takes no values; remove them", r.operator),
            ));
        }
        for (k, v) in r.values.iter().enumerate() {
            if let Err(why) = label_value(v) {
                out.push(Problem::new(
                    format!("{at}.values[{k}]"),
                    format!("{v:?} {why}; {VALUE_FORM}"),
                ));
            }
        }
    }
}

/// What a label key looks like, for messages.
const KEY_FORM: &str = "give a label key: a name of at most 63 letters, digits, '-', '_' or '.' \
starting and ending with a letter or digit, optionally after a DNS prefix and '/' (example.com/team)";
/// What a label value looks like, for messages.
const VALUE_FORM: &str = "give a label value: at most 63 letters, digits, '-', '_' or '.', \
starting and ending with a letter or digit, or empty";

/// A DNS-1123 label (a namespace name): 1-63 lower-case letters, digits and '-', starting and
/// ending with a letter or digit. `Err` says what is wrong.
fn dns_label(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("is empty");
    }
    if s.len() > 63 {
        return Err("is longer than 63 characters");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("may hold only lower-case letters, digits and '-'");
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// A DNS-1123 subdomain: dot-separated DNS labels, at most 253 characters.
fn dns_subdomain(s: &str) -> Result<(), &'static str> {
    if s.len() > 253 {
        return Err("has a prefix longer than 253 characters");
    }
    s.split('.').try_for_each(dns_label)
}

/// A label key: `name` or `prefix/name`, the prefix a DNS subdomain, the name a label value
/// that is not empty.
fn qualified_name(s: &str) -> Result<(), &'static str> {
    let name = match s.split_once('/') {
        Some((prefix, name)) => {
            dns_subdomain(prefix)?;
            name
        }
        None => s,
    };
    if name.is_empty() {
        return Err("has an empty name");
    }
    label_value(name)
}

/// A label value: empty, or at most 63 letters, digits, '-', '_' and '.', starting and ending
/// with a letter or digit.
fn label_value(s: &str) -> Result<(), &'static str> {
    if s.len() > 63 {
        return Err("is longer than 63 characters");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("may hold only letters, digits, '-', '_' and '.'");
    }
    let alnum = |b: Option<u8>| b.is_none_or(|b| b.is_ascii_alphanumeric());
    if !alnum(s.bytes().next()) || !alnum(s.bytes().last()) {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// Parses `spec.<res>.<field>` in its resource's unit: cores for CPU, bytes for memory
/// (compared only with each other, so the unit does not matter as long as it is one).
fn quantity_field(
    out: &mut Vec<Problem>,
    res: &str,
    field: &str,
    v: Option<&QuantityValue>,
) -> Option<f64> {
    let v = v?;
    match v.parse() {
        Ok(p) => Some(p.as_f64()),
        Err(e) => {
            out.push(Problem::new(format!("spec.{res}.{field}"), e.to_string()));
            None
        }
    }
}

fn check_amounts(
    out: &mut Vec<Problem>,
    res: &str,
    quota: Option<f64>,
    weight: f64,
    limit: Option<f64>,
    example: &str,
) {
    if let Some(q) = quota
        && (q < 0.0 || !q.is_finite())
    {
        out.push(Problem::new(
            format!("spec.{res}.quota"),
            format!("{q} is negative; give 0 or more ({example})"),
        ));
    }
    if weight < 0.0 || !weight.is_finite() {
        out.push(Problem::new(
            format!("spec.{res}.overQuotaWeight"),
            format!("{weight} is negative; give a weight of 0 or more (default 1)"),
        ));
    }
    if let Some(l) = limit {
        // Any negative limit other than -1 is a typo rather than "no limit".
        if l < 0.0 && l != -1.0 {
            out.push(Problem::new(
                format!("spec.{res}.limit"),
                format!("{l} is negative; give -1 for no limit or an amount ({example})"),
            ));
        } else if l >= 0.0
            && let Some(q) = quota
            && l < q
        {
            out.push(Problem::new(
                format!("spec.{res}.limit"),
                format!("{l} is below the quota {q}; give -1 for no limit or at least the quota"),
            ));
        }
    }
}

/// Checks the queue tree as a whole. Returns problems per queue name: a parent that is not an
/// existing Queue, a cycle of parents, and (given the queues pods name) a queue that has child
/// queues and is also named by pods (only leaves take pods). Per-queue checks of [`queue`] are
/// included.
pub fn queue_tree(
    queues: &[&Queue],
    queues_named_by_pods: &BTreeSet<String>,
) -> BTreeMap<String, Vec<Problem>> {
    let name_of = |q: &Queue| q.metadata.name.clone().unwrap_or_default();
    let queues = queues.iter().copied();
    let parent_of: BTreeMap<String, Option<String>> = queues
        .clone()
        .map(|q| (name_of(q), q.spec.parent.clone()))
        .collect();
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, parent) in &parent_of {
        if let Some(p) = parent
            && p != name
        {
            children.entry(p.as_str()).or_default().push(name.as_str());
        }
    }
    let mut out: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
    for q in queues {
        let name = name_of(q);
        let mut problems = queue(q);
        if let Some(p) = &q.spec.parent
            && p != &name
        {
            if !parent_of.contains_key(p) {
                problems.push(Problem::new(
                    "spec.parent",
                    format!(
                        "queue {p:?} does not exist; name an existing Queue, or remove parent to make this a top-level queue"
                    ),
                ));
            } else if let Some(cycle) = cycle_through(&name, &parent_of) {
                problems.push(Problem::new(
                    "spec.parent",
                    format!(
                        "the parent chain forms a cycle ({}); the hierarchy must be a tree, so one of these queues must drop or change its parent",
                        cycle.join(" -> ")
                    ),
                ));
            }
        }
        if let Some(kids) = children.get(name.as_str())
            && queues_named_by_pods.contains(&name)
        {
            problems.push(Problem::new(
                "metadata.name",
                format!(
                    "queue {name:?} has child queues ({}) and is also named by pods; only leaf queues take pods, so label those pods with a leaf queue",
                    kids.join(", ")
                ),
            ));
        }
        if !problems.is_empty() {
            out.entry(name).or_default().extend(problems);
        }
    }
    out
}

/// The cycle `start` is part of, as a list of names starting and ending at `start`.
fn cycle_through(start: &str, parent_of: &BTreeMap<String, Option<String>>) -> Option<Vec<String>> {
    let mut path = vec![start.to_string()];
    let mut cur = start;
    for _ in 0..=parent_of.len() {
        let next = parent_of.get(cur)?.as_deref()?;
        path.push(next.to_string());
        if next == start {
            return Some(path);
        }
        cur = next;
    }
    None
}

/// Checks a PodGroup: `minMember` at least 1, `maxMember` at least `minMember`, and topology
/// level names that the Topology object defines (when one exists).
pub fn pod_group(g: &PodGroup, topology: Option<&Topology>) -> Vec<Problem> {
    let mut out = Vec::new();
    let s = &g.spec;
    if s.min_member < 1 {
        out.push(Problem::new(
            "spec.minMember",
            format!(
                "{} is below 1; give the gang size, at least 1",
                s.min_member
            ),
        ));
    }
    if let Some(max) = s.max_member
        && max < s.min_member
    {
        out.push(Problem::new(
            "spec.maxMember",
            format!(
                "{max} is below minMember {}; give at least minMember, or omit it for no bound",
                s.min_member
            ),
        ));
    }
    if let (Some(t), Some(topo)) = (topology, &s.topology) {
        for (field, level) in [
            ("spec.topology.required", &topo.required),
            ("spec.topology.preferred", &topo.preferred),
        ] {
            if let Some(level) = level
                && let Some(msg) = unknown_level(level, t)
            {
                out.push(Problem::new(field, msg));
            }
        }
    }
    out
}

/// `Some(message)` when `level` names no level of `t` (by name or by node label).
pub fn unknown_level(level: &str, t: &Topology) -> Option<String> {
    let levels = &t.spec.levels;
    if levels
        .iter()
        .any(|l| l.name == level || l.node_label == level)
    {
        return None;
    }
    let names: Vec<&str> = levels.iter().map(|l| l.name.as_str()).collect();
    Some(format!(
        "{level:?} is not a level of Topology {:?}; use one of: {}",
        t.metadata.name.as_deref().unwrap_or(""),
        names.join(", ")
    ))
}

/// Checks a Topology: at least one level, names and node labels non-empty and unique.
pub fn topology(t: &Topology) -> Vec<Problem> {
    let mut out = Vec::new();
    if t.spec.levels.is_empty() {
        out.push(Problem::new(
            "spec.levels",
            "no levels; list node label keys coarse to fine, e.g. {name: rack, nodeLabel: topology.tessera.dev/rack}",
        ));
    }
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for (i, l) in t.spec.levels.iter().enumerate() {
        if l.name.trim().is_empty() {
            out.push(Problem::new(
                format!("spec.levels[{i}].name"),
                "empty; give the name groups use for this level, e.g. rack",
            ));
        } else if !names.insert(l.name.as_str()) {
            out.push(Problem::new(
                format!("spec.levels[{i}].name"),
                format!("{:?} appears twice; level names must be unique", l.name),
            ));
        }
        if l.node_label.trim().is_empty() {
            out.push(Problem::new(
                format!("spec.levels[{i}].nodeLabel"),
                "empty; give a node label key, e.g. topology.kubernetes.io/zone",
            ));
        } else if !labels.insert(l.node_label.as_str()) {
            out.push(Problem::new(
                format!("spec.levels[{i}].nodeLabel"),
                format!(
                    "{:?} appears twice; each level needs its own label",
                    l.node_label
                ),
            ));
        }
    }
    out
}

/// The `Valid` condition for an object with these problems (`True` when there are none).
/// `now` is the RFC 3339 time to stamp; the caller keeps the old stamp when the status did not
/// change.
pub fn condition(problems: &[Problem], generation: Option<i64>, now: &str) -> Condition {
    let (status, reason, message) = if problems.is_empty() {
        ("True", "Valid", String::new())
    } else {
        let text: Vec<String> = problems.iter().map(Problem::to_string).collect();
        ("False", "InvalidSpec", text.join("; "))
    };
    Condition {
        type_: VALID.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: Some(now.to_string()),
        observed_generation: generation,
    }
}
