//! A Pod's placement constraints (tolerations, node affinity, inter-pod affinity, topology
//! spread, host ports, extended resources, scheduling gates) as [`PodConstraints`], with
//! kube-scheduler's reading of each API field:
//!
//! - an absent label selector matches no pod (`None`), an empty one every pod;
//!   `matchLabels` become `In [value]` requirements;
//! - an inter-pod term with neither `namespaces` nor `namespaceSelector` is about the pod's
//!   own namespace;
//! - `matchLabelKeys` / `mismatchLabelKeys` of inter-pod terms and `matchLabelKeys` of spread
//!   constraints become `In` / `NotIn [the pod's value]` requirements for the keys the pod
//!   carries. The API server (v1.34+) already merged them when the pod was created, so an
//!   identical requirement is not added twice;
//! - spread constraints default `minDomains` to none, `nodeAffinityPolicy` to Honor and
//!   `nodeTaintsPolicy` to Ignore;
//! - host ports are those of app containers and of sidecar init containers (the only init
//!   containers that run for the pod's life), protocol defaulting to TCP, address to
//!   `0.0.0.0`.
//!
//! Every malformed field becomes an [`InputError`] naming it and the accepted form; the
//! malformed part is left out (the pod is not scheduled while it has errors). Volume node
//! affinity needs the pod's claims and is filled by [`super::volumes`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm as KubeTerm, Pod as KubePod,
    PodAffinityTerm as KubeAffinityTerm, PodSpec, Toleration as KubeToleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as KubeSelector;

use super::requests::{self, MilliAmounts};
use tessera_core::model::{
    HostPort, InclusionPolicy, InputError, LabelSelector, NamespaceScope, NodeSelector,
    NodeSelectorTerm, PodAffinityTerm, PodConstraints, PreferredNodeTerm, Requirement, SelectorOp,
    SpreadConstraint, TaintEffect, Toleration, TolerationOp, WeightedPodTerm,
};

/// The only node field a node selector term's `matchFields` may name.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// The taint key of GPU nodes whose GPU pods tolerate it implicitly (see
/// [`gpu_tolerations`]).
pub const GPU_TAINT_KEY: &str = tessera_contract::keys::GPU_RESOURCE;

fn err(field: String, message: impl Into<String>) -> InputError {
    InputError {
        field,
        message: message.into(),
    }
}

/// Everything of `pod` but the volume node affinity. `requests` is the pod's effective
/// request (see [`requests::pod_requests`]); its resources other than CPU, memory and GPUs
/// become `extended` in base units.
pub fn pod_constraints(
    pod: &KubePod,
    spec: &PodSpec,
    requests: &MilliAmounts,
    errors: &mut Vec<InputError>,
) -> PodConstraints {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = PodConstraints {
        tolerations: tolerations(spec.tolerations.as_deref().unwrap_or(&[]), errors),
        host_ports: host_ports(spec, errors),
        scheduling_gates: spec
            .scheduling_gates
            .iter()
            .flatten()
            .map(|g| g.name.clone())
            .collect(),
        extended: requests
            .iter()
            .filter(|(name, _)| requests::is_extended(name))
            .map(|(name, milli)| (name.clone(), requests::whole(*milli)))
            .filter(|(_, v)| *v > 0)
            .collect(),
        ..PodConstraints::default()
    };
    let affinity = spec.affinity.as_ref();
    if let Some(na) = affinity.and_then(|a| a.node_affinity.as_ref()) {
        const BASE: &str = "spec.affinity.nodeAffinity";
        if let Some(req) = &na.required_during_scheduling_ignored_during_execution {
            let terms = req
                .node_selector_terms
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let field = format!(
                        "{BASE}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
                    );
                    node_selector_term(t, &field, errors)
                })
                .collect();
            out.node_affinity = Some(NodeSelector { terms });
        }
        for (i, p) in na
            .preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .enumerate()
        {
            let field =
                format!("{BASE}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference");
            out.preferred_node_affinity.push(PreferredNodeTerm {
                weight: p.weight,
                term: node_selector_term(&p.preference, &field, errors),
            });
        }
    }
    let ctx = TermContext {
        namespace,
        labels: &labels,
    };
    if let Some(pa) = affinity.and_then(|a| a.pod_affinity.as_ref()) {
        const BASE: &str = "spec.affinity.podAffinity";
        out.pod_affinity = required_terms(
            pa.required_during_scheduling_ignored_during_execution
                .as_deref(),
            BASE,
            &ctx,
            errors,
        );
        out.preferred_pod_affinity = preferred_terms(
            pa.preferred_during_scheduling_ignored_during_execution
                .as_deref(),
            BASE,
            &ctx,
            errors,
        );
    }
    if let Some(pa) = affinity.and_then(|a| a.pod_anti_affinity.as_ref()) {
        const BASE: &str = "spec.affinity.podAntiAffinity";
        out.pod_anti_affinity = required_terms(
            pa.required_during_scheduling_ignored_during_execution
                .as_deref(),
            BASE,
            &ctx,
            errors,
        );
        out.preferred_pod_anti_affinity = preferred_terms(
            pa.preferred_during_scheduling_ignored_during_execution
                .as_deref(),
            BASE,
            &ctx,
            errors,
        );
    }
    out.spread = spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, c)| spread(c, i, &labels, errors))
        .collect();
    out.labels = labels;
    out
}

/// The tolerations a GPU pod of Tessera's carries implicitly: `nvidia.com/gpu` (any value)
/// with effect NoSchedule and NoExecute. Kubernetes' ExtendedResourceToleration admission
/// plugin adds the NoSchedule one to every pod requesting `nvidia.com/gpu`; Tessera adds both
/// for its GPU pods, also those asking only for a fraction by annotation, so a GPU node
/// tainted the customary way (`nvidia.com/gpu:NoSchedule` or `NoExecute`) takes them without
/// every workload spelling the toleration out.
pub fn gpu_tolerations() -> [Toleration; 2] {
    [TaintEffect::NoSchedule, TaintEffect::NoExecute].map(|effect| Toleration {
        key: GPU_TAINT_KEY.to_string(),
        operator: TolerationOp::Exists,
        value: String::new(),
        effect: Some(effect),
    })
}

fn tolerations(list: &[KubeToleration], errors: &mut Vec<InputError>) -> Vec<Toleration> {
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let operator = match t.operator.as_deref().unwrap_or("") {
            "" | "Equal" => TolerationOp::Equal,
            "Exists" => TolerationOp::Exists,
            other => {
                errors.push(err(
                    format!("spec.tolerations[{i}].operator"),
                    format!("{other:?} is not a toleration operator; use Equal or Exists"),
                ));
                continue;
            }
        };
        let effect = match t.effect.as_deref().unwrap_or("") {
            "" => None,
            e => match TaintEffect::parse(e) {
                Some(effect) => Some(effect),
                None => {
                    errors.push(err(
                        format!("spec.tolerations[{i}].effect"),
                        format!(
                            "{e:?} is not a taint effect; use NoSchedule, PreferNoSchedule or NoExecute, or leave it empty for all"
                        ),
                    ));
                    continue;
                }
            },
        };
        out.push(Toleration {
            key: t.key.clone().unwrap_or_default(),
            operator,
            value: t.value.clone().unwrap_or_default(),
            effect,
        });
    }
    out
}

/// A node selector term; `field` is its path (for errors).
pub fn node_selector_term(
    term: &KubeTerm,
    field: &str,
    errors: &mut Vec<InputError>,
) -> NodeSelectorTerm {
    let mut out = NodeSelectorTerm::default();
    for (j, r) in term.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{j}]");
        if let Some(req) = node_requirement(r, &at, errors) {
            out.match_expressions.push(req);
        }
    }
    for (j, r) in term.match_fields.iter().flatten().enumerate() {
        let at = format!("{field}.matchFields[{j}]");
        if r.key != NODE_NAME_FIELD {
            errors.push(err(
                format!("{at}.key"),
                format!("{:?} is not a node field; only {NODE_NAME_FIELD} is", r.key),
            ));
            continue;
        }
        let values = r.values.clone().unwrap_or_default();
        let operator = match r.operator.as_str() {
            "In" => SelectorOp::In,
            "NotIn" => SelectorOp::NotIn,
            other => {
                errors.push(err(
                    format!("{at}.operator"),
                    format!("{other:?} is not an operator for node fields; use In or NotIn"),
                ));
                continue;
            }
        };
        if values.len() != 1 {
            errors.push(err(
                format!("{at}.values"),
                format!(
                    "has {} values; a node field requirement takes exactly one node name",
                    values.len()
                ),
            ));
            continue;
        }
        out.match_fields.push(Requirement {
            key: r.key.clone(),
            operator,
            values,
        });
    }
    out
}

fn node_requirement(
    r: &NodeSelectorRequirement,
    at: &str,
    errors: &mut Vec<InputError>,
) -> Option<Requirement> {
    let values = r.values.clone().unwrap_or_default();
    let operator = match r.operator.as_str() {
        "In" => SelectorOp::In,
        "NotIn" => SelectorOp::NotIn,
        "Exists" => SelectorOp::Exists,
        "DoesNotExist" => SelectorOp::DoesNotExist,
        "Gt" => SelectorOp::Gt,
        "Lt" => SelectorOp::Lt,
        other => {
            errors.push(err(
                format!("{at}.operator"),
                format!(
                    "{other:?} is not an operator; use one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
                ),
            ));
            return None;
        }
    };
    check_values(operator, &values, at, errors).then(|| Requirement {
        key: r.key.clone(),
        operator,
        values,
    })
}

/// Whether `values` suit `operator` (kube's label requirement rules); reports why not.
fn check_values(
    operator: SelectorOp,
    values: &[String],
    at: &str,
    errors: &mut Vec<InputError>,
) -> bool {
    let problem = match operator {
        SelectorOp::In | SelectorOp::NotIn if values.is_empty() => {
            Some("is empty; In and NotIn need at least one value".to_string())
        }
        SelectorOp::Exists | SelectorOp::DoesNotExist if !values.is_empty() => {
            Some("must be empty for Exists and DoesNotExist".to_string())
        }
        SelectorOp::Gt | SelectorOp::Lt
            if values.len() != 1 || values[0].trim().parse::<i64>().is_err() =>
        {
            Some(format!(
                "{values:?} is not one whole number; Gt and Lt take exactly one, e.g. [\"4\"]"
            ))
        }
        _ => None,
    };
    match problem {
        Some(p) => {
            errors.push(err(format!("{at}.values"), p));
            false
        }
        None => true,
    }
}

/// A label selector; `None` where the field is absent (matches nothing) or malformed.
pub fn label_selector(
    sel: Option<&KubeSelector>,
    field: &str,
    errors: &mut Vec<InputError>,
) -> Option<LabelSelector> {
    let sel = sel?;
    let mut requirements: Vec<Requirement> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| Requirement {
            key: k.clone(),
            operator: SelectorOp::In,
            values: vec![v.clone()],
        })
        .collect();
    let mut ok = true;
    for (j, r) in sel.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{j}]");
        let values = r.values.clone().unwrap_or_default();
        let operator = match r.operator.as_str() {
            "In" => SelectorOp::In,
            "NotIn" => SelectorOp::NotIn,
            "Exists" => SelectorOp::Exists,
            "DoesNotExist" => SelectorOp::DoesNotExist,
            other => {
                errors.push(err(
                    format!("{at}.operator"),
                    format!(
                        "{other:?} is not a label selector operator; use one of In, NotIn, Exists, DoesNotExist"
                    ),
                ));
                ok = false;
                continue;
            }
        };
        if !check_values(operator, &values, &at, errors) {
            ok = false;
            continue;
        }
        requirements.push(Requirement {
            key: r.key.clone(),
            operator,
            values,
        });
    }
    ok.then_some(LabelSelector { requirements })
}

/// Adds `key op [the pod's value]` for each of `keys` the pod carries, unless the selector
/// already holds exactly that requirement (the API server merged it at creation).
fn merge_label_keys(
    selector: &mut LabelSelector,
    keys: &[String],
    operator: SelectorOp,
    labels: &BTreeMap<String, String>,
) {
    for key in keys {
        let Some(value) = labels.get(key) else {
            continue;
        };
        let req = Requirement {
            key: key.clone(),
            operator,
            values: vec![value.clone()],
        };
        if !selector.requirements.contains(&req) {
            selector.requirements.push(req);
        }
    }
}

/// What inter-pod terms need of the pod they belong to.
struct TermContext<'a> {
    namespace: &'a str,
    labels: &'a BTreeMap<String, String>,
}

fn affinity_term(
    t: &KubeAffinityTerm,
    field: &str,
    ctx: &TermContext<'_>,
    errors: &mut Vec<InputError>,
) -> PodAffinityTerm {
    let mut selector = label_selector(
        t.label_selector.as_ref(),
        &format!("{field}.labelSelector"),
        errors,
    );
    if let Some(sel) = selector.as_mut() {
        merge_label_keys(
            sel,
            t.match_label_keys.as_deref().unwrap_or(&[]),
            SelectorOp::In,
            ctx.labels,
        );
        merge_label_keys(
            sel,
            t.mismatch_label_keys.as_deref().unwrap_or(&[]),
            SelectorOp::NotIn,
            ctx.labels,
        );
    }
    let names = t.namespaces.clone().unwrap_or_default();
    let ns_selector = label_selector(
        t.namespace_selector.as_ref(),
        &format!("{field}.namespaceSelector"),
        errors,
    );
    let names = if names.is_empty() && t.namespace_selector.is_none() {
        vec![ctx.namespace.to_string()]
    } else {
        names
    };
    if t.topology_key.is_empty() {
        errors.push(err(
            format!("{field}.topologyKey"),
            "is empty; name the node label that defines \"the same place\", e.g. kubernetes.io/hostname",
        ));
    }
    PodAffinityTerm {
        selector,
        namespaces: NamespaceScope {
            names,
            selector: ns_selector,
        },
        topology_key: t.topology_key.clone(),
    }
}

fn required_terms(
    terms: Option<&[KubeAffinityTerm]>,
    base: &str,
    ctx: &TermContext<'_>,
    errors: &mut Vec<InputError>,
) -> Vec<PodAffinityTerm> {
    terms
        .unwrap_or(&[])
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let field = format!("{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]");
            affinity_term(t, &field, ctx, errors)
        })
        .collect()
}

fn preferred_terms(
    terms: Option<&[k8s_openapi::api::core::v1::WeightedPodAffinityTerm]>,
    base: &str,
    ctx: &TermContext<'_>,
    errors: &mut Vec<InputError>,
) -> Vec<WeightedPodTerm> {
    terms
        .unwrap_or(&[])
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let field = format!(
                "{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm"
            );
            WeightedPodTerm {
                weight: w.weight,
                term: affinity_term(&w.pod_affinity_term, &field, ctx, errors),
            }
        })
        .collect()
}

fn spread(
    c: &TopologySpreadConstraint,
    i: usize,
    labels: &BTreeMap<String, String>,
    errors: &mut Vec<InputError>,
) -> Option<SpreadConstraint> {
    let field = format!("spec.topologySpreadConstraints[{i}]");
    let before = errors.len();
    let hard = match c.when_unsatisfiable.as_str() {
        "DoNotSchedule" => true,
        "ScheduleAnyway" => false,
        other => {
            errors.push(err(
                format!("{field}.whenUnsatisfiable"),
                format!("{other:?} is not an action; use DoNotSchedule or ScheduleAnyway"),
            ));
            false
        }
    };
    let max_skew = u32::try_from(c.max_skew).ok().filter(|s| *s >= 1);
    if max_skew.is_none() {
        errors.push(err(
            format!("{field}.maxSkew"),
            format!("{} is not a whole number of at least 1", c.max_skew),
        ));
    }
    let min_domains = match c.min_domains {
        None => None,
        Some(n) if n >= 1 => Some(n as u32),
        Some(n) => {
            errors.push(err(
                format!("{field}.minDomains"),
                format!("{n} is not a whole number of at least 1; give one or leave it out"),
            ));
            None
        }
    };
    let policy =
        |value: Option<&str>, name: &str, default, errors: &mut Vec<InputError>| match value {
            None => default,
            Some("Honor") => InclusionPolicy::Honor,
            Some("Ignore") => InclusionPolicy::Ignore,
            Some(other) => {
                errors.push(err(
                    format!("{field}.{name}"),
                    format!("{other:?} is not a policy; use Honor or Ignore"),
                ));
                default
            }
        };
    let node_affinity_policy = policy(
        c.node_affinity_policy.as_deref(),
        "nodeAffinityPolicy",
        InclusionPolicy::Honor,
        errors,
    );
    let node_taints_policy = policy(
        c.node_taints_policy.as_deref(),
        "nodeTaintsPolicy",
        InclusionPolicy::Ignore,
        errors,
    );
    if c.topology_key.is_empty() {
        errors.push(err(
            format!("{field}.topologyKey"),
            "is empty; name the node label whose values are the domains, e.g. topology.kubernetes.io/zone",
        ));
    }
    let mut selector = label_selector(
        c.label_selector.as_ref(),
        &format!("{field}.labelSelector"),
        errors,
    );
    if let Some(sel) = selector.as_mut() {
        merge_label_keys(
            sel,
            c.match_label_keys.as_deref().unwrap_or(&[]),
            SelectorOp::In,
            labels,
        );
    }
    (errors.len() == before).then(|| SpreadConstraint {
        max_skew: max_skew.unwrap_or(1),
        topology_key: c.topology_key.clone(),
        hard,
        selector,
        min_domains,
        node_affinity_policy,
        node_taints_policy,
    })
}

fn host_ports(spec: &PodSpec, errors: &mut Vec<InputError>) -> Vec<HostPort> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| requests::is_restartable(c))
        .map(|(i, c)| ("initContainers", i, c));
    let apps = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| ("containers", i, c));
    let mut out = Vec::new();
    for (kind, i, c) in sidecars.chain(apps) {
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let Some(port) = p.host_port.filter(|p| *p > 0) else {
                continue;
            };
            let Ok(port) = u16::try_from(port) else {
                errors.push(err(
                    format!("spec.{kind}[{i}].ports[{j}].hostPort"),
                    format!("{port} is not a port number; use 1 to 65535"),
                ));
                continue;
            };
            let protocol = p
                .protocol
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "TCP".to_string());
            let ip = p
                .host_ip
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "0.0.0.0".to_string());
            out.push(HostPort { protocol, ip, port });
        }
    }
    out
}
