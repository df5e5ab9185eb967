//! The resource registry: which kinds the server serves under which group/version/plural, built-in
//! ones plus those declared by CustomResourceDefinitions.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

/// Standard verbs of a stored resource, as advertised in discovery.
pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Behaviour the handlers add on top of generic storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// Plain storage.
    None,
    /// core/v1 pods: create defaults, binding and eviction subresources.
    Pod,
    /// core/v1 namespaces: deleting one deletes its contents.
    Namespace,
    /// apiextensions CRDs: creating one starts serving its kind.
    Crd,
    /// authentication TokenReview: create-only, answered, never stored.
    TokenReview,
    /// authentication SelfSubjectReview (`kubectl auth whoami`): create-only, never stored.
    SelfSubjectReview,
}

/// One served resource.
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group; "" for core.
    pub group: String,
    /// Served versions, preferred first. Objects are stored once and presented in any of them.
    pub versions: Vec<String>,
    /// URL plural, e.g. `pods`.
    pub plural: String,
    /// Singular name, e.g. `pod`.
    pub singular: String,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names, e.g. `po`.
    pub short_names: Vec<String>,
    /// Categories (`all` makes `kubectl get all` include the kind).
    pub categories: Vec<String>,
    /// Whether `/status` is a separate subresource (main-resource writes then keep status).
    pub status_subresource: bool,
    /// Served from a CustomResourceDefinition (strategic merge patch is refused, as upstream).
    pub custom: bool,
    /// Extra handler behaviour.
    pub special: Special,
}

impl ResourceType {
    /// The storage key: `plural.group` (or `plural` for core).
    pub fn key(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `apiVersion` for `version`: `v1` for core, `group/version` otherwise.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The preferred (first) version.
    pub fn preferred_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
    special: Special,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        versions: vec![version.into()],
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: short.iter().map(|s| (*s).into()).collect(),
        categories: if matches!(
            plural,
            "pods"
                | "services"
                | "deployments"
                | "daemonsets"
                | "statefulsets"
                | "replicasets"
                | "jobs"
        ) {
            vec!["all".into()]
        } else {
            Vec::new()
        },
        status_subresource: status,
        custom: false,
        special,
    }
}

/// All served resource types, indexed by group then plural.
#[derive(Debug, Clone)]
pub struct Registry {
    by_group: BTreeMap<String, BTreeMap<String, Arc<ResourceType>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// The built-in resources: what Tessera and kubectl use, plus common workload kinds stored
    /// without controllers so example manifests apply.
    pub fn new() -> Self {
        use Special as S;
        let types = [
            builtin("", "v1", "pods", "Pod", true, &["po"], true, S::Pod),
            builtin("", "v1", "nodes", "Node", false, &["no"], true, S::None),
            builtin(
                "",
                "v1",
                "namespaces",
                "Namespace",
                false,
                &["ns"],
                true,
                S::Namespace,
            ),
            builtin("", "v1", "events", "Event", true, &["ev"], false, S::None),
            builtin(
                "",
                "v1",
                "configmaps",
                "ConfigMap",
                true,
                &["cm"],
                false,
                S::None,
            ),
            builtin("", "v1", "secrets", "Secret", true, &[], false, S::None),
            builtin(
                "",
                "v1",
                "services",
                "Service",
                true,
                &["svc"],
                true,
                S::None,
            ),
            builtin(
                "",
                "v1",
                "serviceaccounts",
                "ServiceAccount",
                true,
                &["sa"],
                false,
                S::None,
            ),
            builtin(
                "events.k8s.io",
                "v1",
                "events",
                "Event",
                true,
                &["ev"],
                false,
                S::None,
            ),
            builtin(
                "coordination.k8s.io",
                "v1",
                "leases",
                "Lease",
                true,
                &[],
                false,
                S::None,
            ),
            builtin(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                false,
                &["crd", "crds"],
                true,
                S::Crd,
            ),
            builtin(
                "authentication.k8s.io",
                "v1",
                "tokenreviews",
                "TokenReview",
                false,
                &[],
                false,
                S::TokenReview,
            ),
            builtin(
                "authentication.k8s.io",
                "v1",
                "selfsubjectreviews",
                "SelfSubjectReview",
                false,
                &[],
                false,
                S::SelfSubjectReview,
            ),
            builtin(
                "scheduling.k8s.io",
                "v1",
                "priorityclasses",
                "PriorityClass",
                false,
                &["pc"],
                false,
                S::None,
            ),
            builtin(
                "policy",
                "v1",
                "poddisruptionbudgets",
                "PodDisruptionBudget",
                true,
                &["pdb"],
                true,
                S::None,
            ),
            builtin(
                "apps",
                "v1",
                "deployments",
                "Deployment",
                true,
                &["deploy"],
                true,
                S::None,
            ),
            builtin(
                "apps",
                "v1",
                "daemonsets",
                "DaemonSet",
                true,
                &["ds"],
                true,
                S::None,
            ),
            builtin(
                "apps",
                "v1",
                "statefulsets",
                "StatefulSet",
                true,
                &["sts"],
                true,
                S::None,
            ),
            builtin(
                "apps",
                "v1",
                "replicasets",
                "ReplicaSet",
                true,
                &["rs"],
                true,
                S::None,
            ),
            builtin("batch", "v1", "jobs", "Job", true, &[], true, S::None),
        ];
        let mut registry = Self {
            by_group: BTreeMap::new(),
        };
        for rt in types {
            registry.insert(rt);
        }
        registry
    }

    fn insert(&mut self, rt: ResourceType) {
        self.by_group
            .entry(rt.group.clone())
            .or_default()
            .insert(rt.plural.clone(), Arc::new(rt));
    }

    /// The resource served at `group/version/plural`, if any.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.by_group
            .get(group)?
            .get(plural)
            .filter(|rt| rt.versions.iter().any(|v| v == version))
            .cloned()
    }

    /// The resource stored under a storage key.
    pub fn by_key(&self, key: &str) -> Option<Arc<ResourceType>> {
        self.by_group
            .values()
            .flat_map(|m| m.values())
            .find(|rt| rt.key() == key)
            .cloned()
    }

    /// Every group with its served versions (preferred first), core ("") included.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        self.by_group
            .iter()
            .map(|(group, types)| {
                let mut versions: Vec<String> = Vec::new();
                for rt in types.values() {
                    for v in &rt.versions {
                        if !versions.contains(v) {
                            versions.push(v.clone());
                        }
                    }
                }
                (group.clone(), versions)
            })
            .collect()
    }

    /// Resources served in `group/version`.
    pub fn resources(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.by_group
            .get(group)
            .map(|m| {
                m.values()
                    .filter(|rt| rt.versions.iter().any(|v| v == version))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Starts (or updates) serving the kind a CRD declares.
    pub fn register_crd(&mut self, crd: &Value) -> Result<Arc<ResourceType>, String> {
        let rt = crd_resource_type(crd)?;
        if let Some(existing) = self.by_group.get(&rt.group).and_then(|m| m.get(&rt.plural))
            && !existing.custom
        {
            return Err(format!(
                "spec.names.plural {:?} in group {:?} is a built-in resource",
                rt.plural, rt.group
            ));
        }
        let rt = Arc::new(rt);
        self.by_group
            .entry(rt.group.clone())
            .or_default()
            .insert(rt.plural.clone(), rt.clone());
        Ok(rt)
    }

    /// Stops serving a CRD's kind; returns it so its objects can be deleted.
    pub fn unregister_crd(&mut self, crd: &Value) -> Option<Arc<ResourceType>> {
        let rt = crd_resource_type(crd).ok()?;
        let group = self.by_group.get_mut(&rt.group)?;
        let removed = group.remove(&rt.plural);
        if group.is_empty() {
            self.by_group.remove(&rt.group);
        }
        removed
    }
}

/// Reads the served kind out of a CRD object, naming the offending field on bad input.
pub fn crd_resource_type(crd: &Value) -> Result<ResourceType, String> {
    let spec = crd.get("spec").ok_or("spec is required")?;
    let text = |path: &str| -> Option<String> {
        super::meta::field(spec, path)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let group = text("group")
        .filter(|g| !g.is_empty())
        .ok_or("spec.group is required")?;
    let plural = text("names.plural")
        .filter(|p| !p.is_empty())
        .ok_or("spec.names.plural is required")?;
    let kind = text("names.kind")
        .filter(|k| !k.is_empty())
        .ok_or("spec.names.kind is required")?;
    let singular = text("names.singular").unwrap_or_else(|| kind.to_lowercase());
    let namespaced = match text("scope").as_deref() {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => {
            return Err(format!(
                "spec.scope {other:?} is invalid: accepted: Namespaced, Cluster"
            ));
        }
    };
    let expected_name = format!("{plural}.{group}");
    let name = super::meta::meta_str(crd, "name");
    if name != expected_name {
        return Err(format!(
            "metadata.name {name:?} must be spec.names.plural + \".\" + spec.group = {expected_name:?}"
        ));
    }
    let versions_json = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or("spec.versions must list at least one version")?;
    let mut versions = Vec::new();
    let mut status_subresource = false;
    for (i, v) in versions_json.iter().enumerate() {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("spec.versions[{i}].name is required"))?;
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        // The storage version is preferred, as the real server's discovery does.
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            versions.insert(0, name.to_string());
        } else {
            versions.push(name.to_string());
        }
        status_subresource |= v.pointer("/subresources/status").is_some();
    }
    status_subresource |= spec.pointer("/subresources/status").is_some();
    let categories = spec
        .pointer("/names/categories")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let short_names = spec
        .pointer("/names/shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(ResourceType {
        group,
        versions,
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        categories,
        status_subresource,
        custom: true,
        special: Special::None,
    })
}
