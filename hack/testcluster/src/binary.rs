//! Finding or building the Go test peers, once per machine: `kube-peer` (hack/k8s) and
//! `kueue-peer` (hack/kueue).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

/// Why the real-Kubernetes peer is not available.
#[derive(Debug, thiserror::Error)]
pub enum KubePeerError {
    /// Go is not installed.
    #[error(
        "the test peer {name} (hack/{src}) is built with Go, which is not on PATH: install Go 1.26 or newer, or set {env} to a built {name} binary"
    )]
    NoGo {
        /// The binary.
        name: &'static str,
        /// Its source directory under `hack/`.
        src: &'static str,
        /// The variable that names a built one.
        env: &'static str,
    },
    /// `go build` failed.
    #[error("building hack/{src} failed (go build exited with {status}):\n{stderr}")]
    Build {
        /// Its source directory under `hack/`.
        src: &'static str,
        /// Exit status.
        status: std::process::ExitStatus,
        /// What the Go toolchain printed.
        stderr: String,
    },
    /// Something else on the file system.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why the file system refused (permissions, a missing directory, a full disk).
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KubePeerError {
    let what = what.into();
    move |source| KubePeerError::Io { what, source }
}

/// The repository root (this crate lives at `hack/testcluster`).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Go test peer: its binary name, source directory under `hack/` and the variable that
/// names a built one.
struct Peer {
    name: &'static str,
    src: &'static str,
    env: &'static str,
}

/// The `kube-peer` binary: `$KUBE_PEER` if set, else built from `hack/k8s` into the Cargo
/// target directory when missing or older than its sources. Builds are serialised across test
/// processes by a file lock, so parallel test binaries build it once.
pub fn kube_peer() -> Result<&'static Path, &'static KubePeerError> {
    static PEER: OnceLock<Result<PathBuf, KubePeerError>> = OnceLock::new();
    PEER.get_or_init(|| {
        locate_or_build(&Peer {
            name: "kube-peer",
            src: "k8s",
            env: "KUBE_PEER",
        })
    })
    .as_ref()
    .map(PathBuf::as_path)
}

/// The `kueue-peer` binary (Kueue's controller, hack/kueue): `$KUEUE_PEER` if set, else the
/// `kueue-peer` beside `$KUBE_PEER` when there is one, else built as [`kube_peer`] is.
pub fn kueue_peer() -> Result<&'static Path, &'static KubePeerError> {
    static PEER: OnceLock<Result<PathBuf, KubePeerError>> = OnceLock::new();
    PEER.get_or_init(|| {
        let beside = std::env::var_os("KUBE_PEER")
            .map(PathBuf::from)
            .and_then(|k| Some(k.parent()?.join("kueue-peer")))
            .filter(|p| p.is_file());
        match (std::env::var_os("KUEUE_PEER"), beside) {
            (Some(p), _) => Ok(PathBuf::from(p)),
            (None, Some(p)) => Ok(p),
            (None, None) => locate_or_build(&Peer {
                name: "kueue-peer",
                src: "kueue",
                env: "KUEUE_PEER",
            }),
        }
    })
    .as_ref()
    .map(PathBuf::as_path)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

fn locate_or_build(peer: &Peer) -> Result<PathBuf, KubePeerError> {
    if let Some(p) = std::env::var_os(peer.env) {
        return Ok(PathBuf::from(p));
    }
    let src = repo_root().join("hack").join(peer.src);
    let out_dir = target_dir().join("kube-peer");
    std::fs::create_dir_all(&out_dir).map_err(io(format!("creating {}", out_dir.display())))?;
    let bin = out_dir.join(peer.name);
    let lock = File::create(out_dir.join(format!(".{}.lock", peer.name)))
        .map_err(io("creating the build lock"))?;
    lock.lock().map_err(io("taking the build lock"))?;
    let newest = newest_source(&src).map_err(io(format!("reading {}", src.display())))?;
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    if built.is_some_and(|b| b >= newest) {
        return Ok(bin);
    }
    if Command::new("go").arg("version").output().is_err() {
        return Err(KubePeerError::NoGo {
            name: peer.name,
            src: peer.src,
            env: peer.env,
        });
    }
    eprintln!(
        "tessera-testcluster: building {} from hack/{} (the first build on a machine takes several minutes; set {} to reuse a built one)",
        peer.name, peer.src, peer.env
    );
    let tmp = out_dir.join(format!("{}.tmp", peer.name));
    let out = Command::new("bash")
        .arg(src.join("build"))
        .arg(&tmp)
        .output()
        .map_err(io("running go build"))?;
    if !out.status.success() {
        return Err(KubePeerError::Build {
            src: peer.src,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    std::fs::rename(&tmp, &bin).map_err(io(format!("installing {}", peer.name)))?;
    Ok(bin)
}

fn newest_source(dir: &Path) -> std::io::Result<SystemTime> {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let meta = entry.metadata()?;
        if meta.is_dir() {
            newest = newest.max(newest_source(&path)?);
        } else if path
            .extension()
            .is_some_and(|e| e == "go" || e == "mod" || e == "sum")
            || path.file_name().is_some_and(|n| n == "build")
        {
            newest = newest.max(meta.modified()?);
        }
    }
    Ok(newest)
}
