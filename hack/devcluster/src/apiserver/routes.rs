//! URL path parsing into the endpoint it names.

/// A resource URL, e.g. `/api/v1/namespaces/default/pods/p1/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group; "" for core.
    pub group: String,
    /// Version in the URL.
    pub version: String,
    /// Resource plural.
    pub plural: String,
    /// Namespace segment, when the URL has one.
    pub namespace: Option<String>,
    /// Object name, when the URL names one.
    pub name: Option<String>,
    /// Subresource (`status`, `binding`, `eviction`).
    pub sub: Option<String>,
    /// The deprecated `/watch/` path prefix was used.
    pub watch_prefix: bool,
}

/// What a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/healthz`, `/readyz`, `/livez`.
    Health,
    /// `/version`.
    Version,
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/<group>`.
    Group(String),
    /// `/api/v1`, `/apis/<group>/<version>`.
    Resources {
        /// API group.
        group: String,
        /// Version.
        version: String,
    },
    /// Anything under a group version.
    Resource(ResourcePath),
    /// `/openapi/v3`.
    OpenApiIndex,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`.
    OpenApiGroupVersion {
        /// API group.
        group: String,
        /// Version.
        version: String,
    },
    /// Unknown path.
    Unknown,
}

/// Parses a request path.
pub fn parse(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["healthz" | "readyz" | "livez", ..] => Route::Health,
        ["version"] => Route::Version,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["openapi", "v3"] => Route::OpenApiIndex,
        ["openapi", "v3", "api", version] => Route::OpenApiGroupVersion {
            group: String::new(),
            version: (*version).to_string(),
        },
        ["openapi", "v3", "apis", group, version] => Route::OpenApiGroupVersion {
            group: (*group).to_string(),
            version: (*version).to_string(),
        },
        ["apis", group] => Route::Group((*group).to_string()),
        ["api", version, rest @ ..] => resource_route("", version, rest),
        ["apis", group, version, rest @ ..] => resource_route(group, version, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let (watch_prefix, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let path = |namespace: Option<&str>, parts: &[&str]| -> Route {
        let owned = |i: usize| parts.get(i).map(|s| (*s).to_string());
        match parts.len() {
            1..=3 => Route::Resource(ResourcePath {
                group: group.to_string(),
                version: version.to_string(),
                plural: parts[0].to_string(),
                namespace: namespace.map(str::to_string),
                name: owned(1),
                sub: owned(2),
                watch_prefix,
            }),
            _ => Route::Unknown,
        }
    };
    match rest {
        [] if !watch_prefix => Route::Resources {
            group: group.to_string(),
            version: version.to_string(),
        },
        // `/api/v1/namespaces/<ns>/status` is the namespace's own status, not a resource.
        ["namespaces", ns, plural, more @ ..]
            if !(group.is_empty() && matches!(*plural, "status" | "finalize")) =>
        {
            let mut parts = vec![*plural];
            parts.extend_from_slice(more);
            path(Some(ns), &parts)
        }
        parts => path(None, parts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(route: Route) -> ResourcePath {
        match route {
            Route::Resource(p) => p,
            other => panic!("not a resource route: {other:?}"),
        }
    }

    #[test]
    fn parses_resource_paths() {
        let p = res(parse("/api/v1/namespaces/default/pods/p1/binding"));
        assert_eq!((p.group.as_str(), p.plural.as_str()), ("", "pods"));
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.name.as_deref(), Some("p1"));
        assert_eq!(p.sub.as_deref(), Some("binding"));

        let p = res(parse("/api/v1/namespaces/kube-system/status"));
        assert_eq!(p.plural, "namespaces");
        assert_eq!(p.name.as_deref(), Some("kube-system"));
        assert_eq!(p.sub.as_deref(), Some("status"));

        let p = res(parse("/apis/tessera.dev/v1alpha1/queues"));
        assert_eq!(
            (p.group.as_str(), p.version.as_str()),
            ("tessera.dev", "v1alpha1")
        );
        assert_eq!(p.namespace, None);

        let p = res(parse("/api/v1/watch/namespaces/a/pods"));
        assert!(p.watch_prefix);
        assert_eq!(p.namespace.as_deref(), Some("a"));

        assert_eq!(
            parse("/apis/apps/v1"),
            Route::Resources {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        assert_eq!(parse("/openapi/v2"), Route::Unknown);
    }
}
