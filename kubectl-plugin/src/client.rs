//! The API server connection, as kubectl makes it (`--kubeconfig`, `KUBECONFIG`,
//! `--context`, `-n`), and errors put in the user's terms: a refusal names what was refused
//! and the role that grants it.

use std::path::PathBuf;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where to connect, from the global flags.
#[derive(Clone, Debug, Default)]
pub(crate) struct Target {
    /// `--kubeconfig`.
    pub(crate) kubeconfig: Option<PathBuf>,
    /// `--context`.
    pub(crate) context: Option<String>,
    /// `-n`.
    pub(crate) namespace: Option<String>,
}

/// A client and the namespace `why` looks in.
pub(crate) async fn connect(target: &Target) -> anyhow::Result<(kube::Client, String)> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &target.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}: reading it", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        // KUBECONFIG (several files merged, as kubectl does), else ~/.kube/config.
        None if std::env::var_os("KUBECONFIG").is_some() || target.context.is_some() => {
            kube::Config::from_kubeconfig(&options)
                .await
                .context("reading the kubeconfig (KUBECONFIG or ~/.kube/config)")?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig: set KUBECONFIG or --kubeconfig, or run inside a pod")?,
    };
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).context("building the API client")?;
    Ok((client, namespace))
}

/// The role that grants every cluster-wide read `kubectl tessera` makes.
pub(crate) const VIEWER_ROLE: &str = "tessera-viewer";

/// A read the API server refused or could not answer, said for people.
pub(crate) fn explain(error: &anyhow::Error) -> String {
    let api = error
        .chain()
        .find_map(|e| match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => Some(status),
            _ => None,
        });
    match api {
        Some(status) if status.code == 403 => format!(
            "error: permission denied: {}\n\
             kubectl tessera reads, with your own credentials, GpuNode, Queue and PodGroup objects \
             and Nodes cluster-wide (the ClusterRole {VIEWER_ROLE} grants these), and for `why` \
             the pod and its events in its namespace (the built-in `view` role grants these). Ask \
             your cluster admin to bind what is missing, e.g.\n  \
             kubectl create clusterrolebinding $USER-tessera-viewer --clusterrole={VIEWER_ROLE} --user=$USER\n\
             (see docs/kubectl-plugin.md).",
            status.message
        ),
        Some(status) if status.code == 401 => format!(
            "error: the API server did not accept your credentials: {}\n\
             Check the kubeconfig's user (kubectl auth whoami).",
            status.message
        ),
        _ => format!("error: {error:#}"),
    }
}

/// Whether `error` is the API server's 403.
pub(crate) fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 403)
}

/// Whether `error` is the API server's 404 (no such object, or the resource is not served).
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

/// `result`, with a 404 of a whole resource said as "Tessera's CRDs are missing".
pub(crate) fn crd_read<T>(result: Result<T, kube::Error>, resource: &str) -> anyhow::Result<T> {
    result.map_err(|e| {
        if is_not_found(&e) {
            anyhow::anyhow!(
                "the API server does not serve {resource}.tessera.dev: install or upgrade Tessera's CRDs \
                 (deploy/crds/, or the Helm chart) — ({e})"
            )
        } else {
            anyhow::Error::new(e).context(format!("listing {resource}.tessera.dev"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, message: &str) -> anyhow::Error {
        anyhow::Error::new(kube::Error::Api(
            Status::failure(message, "").with_code(code).boxed(),
        ))
        .context("listing gpunodes.tessera.dev")
    }

    #[test]
    fn refusals_name_what_was_refused_and_the_role_that_grants_it() {
        let text = explain(&api(
            403,
            "gpunodes.tessera.dev is forbidden: User \"bob\" cannot list resource \"gpunodes\"",
        ));
        assert!(text.starts_with("error: permission denied: gpunodes.tessera.dev is forbidden"));
        assert!(text.contains("--clusterrole=tessera-viewer"), "{text}");
        let text = explain(&api(401, "Unauthorized"));
        assert!(text.contains("did not accept your credentials"), "{text}");
        let text = explain(&api(500, "etcd is down"));
        assert!(text.contains("listing gpunodes.tessera.dev") && text.contains("etcd is down"));
    }
}
