//! Writing a kubeconfig that points kubectl and kube-rs at the development API server.

use std::path::Path;

use serde_json::json;

/// Name used for the cluster, user and context entries.
pub const CONTEXT: &str = "tessera-devcluster";

/// The kubeconfig document for `server` (an `http://` URL), with a bearer token if given.
pub fn render(server: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(token) => json!({"token": token}),
        None => json!({}),
    };
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server}}],
        "users": [{"name": CONTEXT, "user": user}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"}}],
        "current-context": CONTEXT,
        "preferences": {},
    });
    // Serialising a JSON value to YAML cannot fail; fall back to JSON (valid YAML) regardless.
    serde_yaml_ng::to_string(&doc).unwrap_or_else(|_| doc.to_string())
}

/// Writes the kubeconfig to `path` atomically (temp file + rename), mode 0600 since it may hold
/// a token.
pub fn write(path: &Path, server: &str, token: Option<&str>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(render(server, token).as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A kube-rs client configuration for `server`, without reading any kubeconfig.
pub fn client_config(server: &str, token: Option<&str>) -> Result<kube::Config, String> {
    let uri = server
        .parse()
        .map_err(|e| format!("server URL {server:?} is invalid: {e}"))?;
    let mut config = kube::Config::new(uri);
    config.default_namespace = "default".into();
    if let Some(token) = token {
        let value = axum::http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "token must be printable ASCII".to_string())?;
        config
            .headers
            .push((axum::http::header::AUTHORIZATION, value));
    }
    Ok(config)
}
