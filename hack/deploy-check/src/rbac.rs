//! Kubernetes RBAC evaluation over rendered manifests: which rules a ServiceAccount gets
//! through (Cluster)RoleBindings, and whether they allow one request. Used to check the
//! chart against the requests the components really make.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde_json::Value;

/// One API request, in RBAC terms.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// API group ("" for core).
    pub api_group: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource, if any.
    pub subresource: Option<String>,
    /// Namespace, for namespaced requests.
    pub namespace: Option<String>,
    /// Object name, when the request names one.
    pub name: Option<String>,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.api_group.is_empty() {
            "core"
        } else {
            &self.api_group
        };
        write!(f, "{} {group} {}", self.verb, self.resource)?;
        if let Some(sub) = &self.subresource {
            write!(f, "/{sub}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " (cluster scope)"),
        }
    }
}

/// A rule and where it applies.
#[derive(Debug, Clone)]
pub struct Grant {
    /// `None`: every namespace and cluster-scoped resources (ClusterRoleBinding);
    /// `Some(ns)`: only requests in `ns` (RoleBinding).
    pub namespace: Option<String>,
    /// The rule.
    pub rule: PolicyRule,
    /// The role it comes from, for messages.
    pub role: String,
}

/// Everything one subject is granted.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// The rules.
    pub grants: Vec<Grant>,
}

fn parse<T: serde::de::DeserializeOwned>(doc: &Value) -> Option<T> {
    serde_json::from_value(doc.clone()).ok()
}

fn kind(doc: &Value) -> &str {
    doc.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// The rules bound to ServiceAccount `namespace/name` in `docs` (rendered manifests as JSON).
pub fn grants_for_service_account(docs: &[Value], namespace: &str, name: &str) -> Grants {
    let is_subject = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.name == name
                && s.namespace.as_deref() == Some(namespace)
        })
    };
    let cluster_role = |role: &str| -> Vec<PolicyRule> {
        docs.iter()
            .filter(|d| kind(d) == "ClusterRole")
            .filter_map(parse::<ClusterRole>)
            .filter(|r| r.metadata.name.as_deref() == Some(role))
            .flat_map(|r| r.rules.unwrap_or_default())
            .collect()
    };
    let role_in = |role: &str, ns: &str| -> Vec<PolicyRule> {
        docs.iter()
            .filter(|d| kind(d) == "Role")
            .filter_map(parse::<Role>)
            .filter(|r| {
                r.metadata.name.as_deref() == Some(role)
                    && r.metadata.namespace.as_deref() == Some(ns)
            })
            .flat_map(|r| r.rules.unwrap_or_default())
            .collect()
    };
    let mut grants = Vec::new();
    for b in docs
        .iter()
        .filter(|d| kind(d) == "ClusterRoleBinding")
        .filter_map(parse::<ClusterRoleBinding>)
    {
        if is_subject(&b.subjects) && b.role_ref.kind == "ClusterRole" {
            for rule in cluster_role(&b.role_ref.name) {
                grants.push(Grant {
                    namespace: None,
                    rule,
                    role: format!("ClusterRole/{}", b.role_ref.name),
                });
            }
        }
    }
    for b in docs
        .iter()
        .filter(|d| kind(d) == "RoleBinding")
        .filter_map(parse::<RoleBinding>)
    {
        if !is_subject(&b.subjects) {
            continue;
        }
        let ns = b.metadata.namespace.clone().unwrap_or_default();
        let rules = match b.role_ref.kind.as_str() {
            "ClusterRole" => cluster_role(&b.role_ref.name),
            _ => role_in(&b.role_ref.name, &ns),
        };
        for rule in rules {
            grants.push(Grant {
                namespace: Some(ns.clone()),
                rule,
                role: format!("{}/{} in {ns}", b.role_ref.kind, b.role_ref.name),
            });
        }
    }
    Grants { grants }
}

fn matches(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

impl Grants {
    /// Whether some rule allows `req` (RBAC is additive: one matching rule is enough).
    pub fn allows(&self, req: &Request) -> bool {
        let resource = match &req.subresource {
            Some(sub) => format!("{}/{sub}", req.resource),
            None => req.resource.clone(),
        };
        self.grants.iter().any(|g| {
            if let Some(ns) = &g.namespace
                && req.namespace.as_ref() != Some(ns)
            {
                return false;
            }
            let r = &g.rule;
            let resources = r.resources.as_deref().unwrap_or_default();
            let groups = r.api_groups.as_deref().unwrap_or_default();
            let names_ok = match r.resource_names.as_deref() {
                None | Some([]) => true,
                Some(names) => req.name.as_ref().is_some_and(|n| names.contains(n)),
            };
            matches(&r.verbs, &req.verb)
                && matches(groups, &req.api_group)
                && matches(resources, &resource)
                && names_ok
        })
    }

    /// Rules that no request in `requests` needed: candidates for removal.
    pub fn unused(&self, requests: &[Request]) -> Vec<String> {
        let mut out = Vec::new();
        for g in &self.grants {
            let r = &g.rule;
            for verb in &r.verbs {
                for group in r.api_groups.as_deref().unwrap_or_default() {
                    for resource in r.resources.as_deref().unwrap_or_default() {
                        let used = requests.iter().any(|q| {
                            let res = match &q.subresource {
                                Some(sub) => format!("{}/{sub}", q.resource),
                                None => q.resource.clone(),
                            };
                            (verb == "*" || *verb == q.verb)
                                && (group == "*" || *group == q.api_group)
                                && (resource == "*" || *resource == res)
                        });
                        if !used {
                            out.push(format!("{} {verb} {group}/{resource}", g.role));
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn docs() -> Vec<Value> {
        vec![
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "c"},
                "rules": [{"apiGroups": [""], "resources": ["pods", "pods/binding"], "verbs": ["get", "create"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "c"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "c"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "r", "namespace": "ns"},
                "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["update"], "resourceNames": ["lock"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "r", "namespace": "ns"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
        ]
    }

    fn req(
        verb: &str,
        group: &str,
        res: &str,
        sub: Option<&str>,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Request {
        Request {
            verb: verb.into(),
            api_group: group.into(),
            resource: res.into(),
            subresource: sub.map(Into::into),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn bindings_scope_and_subresources() {
        let g = grants_for_service_account(&docs(), "ns", "sa");
        assert!(g.allows(&req("get", "", "pods", None, Some("any"), Some("p"))));
        assert!(g.allows(&req(
            "create",
            "",
            "pods",
            Some("binding"),
            Some("x"),
            Some("p")
        )));
        assert!(!g.allows(&req(
            "create",
            "",
            "pods",
            Some("eviction"),
            Some("x"),
            Some("p")
        )));
        assert!(!g.allows(&req("list", "", "pods", None, None, None)));
        assert!(g.allows(&req(
            "update",
            "coordination.k8s.io",
            "leases",
            None,
            Some("ns"),
            Some("lock")
        )));
        assert!(!g.allows(&req(
            "update",
            "coordination.k8s.io",
            "leases",
            None,
            Some("other"),
            Some("lock")
        )));
        assert!(!g.allows(&req(
            "update",
            "coordination.k8s.io",
            "leases",
            None,
            Some("ns"),
            Some("x")
        )));
        let nobody = grants_for_service_account(&docs(), "ns", "other");
        assert!(!nobody.allows(&req("get", "", "pods", None, Some("any"), Some("p"))));
    }

    #[test]
    fn unused_rules_are_listed() {
        let g = grants_for_service_account(&docs(), "ns", "sa");
        let used = [req("get", "", "pods", None, Some("a"), Some("p"))];
        let unused = g.unused(&used);
        assert!(
            unused.contains(&"ClusterRole/c create /pods/binding".to_string()),
            "{unused:?}"
        );
        assert!(
            !unused.contains(&"ClusterRole/c get /pods".to_string()),
            "{unused:?}"
        );
    }
}
