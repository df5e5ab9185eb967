//! The real helm CLI and the Prometheus exposition linter, from the same `kube-peer` binary.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::binary::kube_peer;

/// What a helm command printed.
#[derive(Debug)]
pub struct HelmOutput {
    /// Exit status was 0.
    pub success: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `helm ARGS` (helm v4, the library's own CLI) with `kubeconfig` when given. Helm's
/// caches and config go to a private directory so tests never touch the user's.
pub fn helm(args: &[&str], kubeconfig: Option<&Path>) -> HelmOutput {
    let peer = kube_peer().unwrap_or_else(|e| panic!("{e}"));
    let home = tempfile::tempdir().expect("helm home");
    let mut cmd = Command::new(peer);
    cmd.arg("helm").args(args);
    for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        cmd.env(var, home.path());
    }
    match kubeconfig {
        Some(k) => cmd.env("KUBECONFIG", k),
        None => cmd.env_remove("KUBECONFIG"),
    };
    let out = cmd.output().expect("running kube-peer helm");
    HelmOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Checks a Prometheus text exposition as `promtool check metrics` does (it parses, and the
/// upstream linter finds nothing); the problems otherwise.
pub fn promlint(exposition: &str) -> Result<(), Vec<String>> {
    let peer = kube_peer().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(peer)
        .args(["promlint", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kube-peer promlint");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(exposition.as_bytes())
        .expect("writing the exposition");
    let out = child.wait_with_output().expect("promlint output");
    if out.status.success() {
        return Ok(());
    }
    let mut problems: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    if problems.is_empty() {
        problems.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Err(problems)
}

/// `GET /metrics` from `addr` over plain HTTP/1.0, as a Prometheus server scrapes: the body.
/// Panics unless the answer is `200`.
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP response from {addr}: {text:?}"));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{addr}/metrics: {head}"
    );
    body.to_owned()
}
