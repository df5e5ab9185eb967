//! The plain manifests for users without Helm, generated from the chart with its default
//! values, and the chart's copy of the CRDs (Helm only reads `crds/` inside the chart).
//!
//! Sources of truth: `deploy/crds/*.yaml` (written by `tessera-coordinator crds`) and
//! `deploy/helm/tessera/`. Generated: `deploy/helm/tessera/crds/*.yaml` (copies),
//! `deploy/manifests/crds.yaml` and `deploy/manifests/tessera.yaml`.

use std::path::{Path, PathBuf};

use crate::chart::{Chart, ChartError, Release};

/// The chart, relative to the repository root.
pub const CHART_DIR: &str = "deploy/helm/tessera";
/// The CRDs as the coordinator generates them.
pub const CRDS_DIR: &str = "deploy/crds";
/// The plain manifests.
pub const MANIFESTS_DIR: &str = "deploy/manifests";

/// Helm's install order by kind (what `helm install` applies first); other kinds follow,
/// in the order the templates produce them.
const INSTALL_ORDER: &[&str] = &[
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicaSet",
    "Deployment",
    "StatefulSet",
    "Job",
    "CronJob",
];

const HEADER: &str = "# Generated from deploy/helm/tessera with its default values by\n\
# `cargo run -p tessera-deploy-check -- render --out deploy/manifests`. Do not edit by hand:\n\
# change the chart and re-run; a test fails while this file is out of date.\n";

/// One generated file: path relative to the repository root, and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Relative path.
    pub path: PathBuf,
    /// Full content.
    pub content: String,
}

fn kind_of(doc: &str) -> String {
    doc.lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(|k| k.trim().to_string())
        .unwrap_or_default()
}

fn crd_sources(repo: &Path) -> Result<Vec<(String, String)>, ChartError> {
    let dir = repo.join(CRDS_DIR);
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => return Err(ChartError::Read { path: dir, source }),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(|source| ChartError::Read {
            path: path.clone(),
            source,
        })?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        out.push((name, text));
    }
    Ok(out)
}

/// Everything the generator writes, in order: the chart's CRD copies, then the manifests.
pub fn generate(repo: &Path) -> Result<Vec<Generated>, ChartError> {
    let crds = crd_sources(repo)?;
    let mut files: Vec<Generated> = crds
        .iter()
        .map(|(name, text)| Generated {
            path: Path::new(CHART_DIR).join("crds").join(name),
            content: text.clone(),
        })
        .collect();

    let mut crd_manifest = String::from(HEADER);
    crd_manifest.push_str("# Apply this file first and wait for the CRDs to be Established.\n");
    for (name, text) in &crds {
        crd_manifest.push_str(&format!("---\n# Source: {CRDS_DIR}/{name}\n"));
        for doc in crate::chart::split_documents(text) {
            crd_manifest.push_str(&doc);
            crd_manifest.push('\n');
        }
    }
    files.push(Generated {
        path: Path::new(MANIFESTS_DIR).join("crds.yaml"),
        content: crd_manifest,
    });

    let chart = Chart::load(&repo.join(CHART_DIR))?;
    let release = Release::default();
    let rendered = chart.render(&release, &[])?;
    let mut docs: Vec<(usize, usize, String, String)> = Vec::new();
    let namespace = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}",
        release.namespace
    );
    docs.push((0, 0, "(namespace of the release)".into(), namespace));
    for r in rendered {
        for doc in r.documents {
            let rank = INSTALL_ORDER
                .iter()
                .position(|k| *k == kind_of(&doc))
                .unwrap_or(INSTALL_ORDER.len());
            let seq = docs.len();
            docs.push((rank, seq, r.source.clone(), doc));
        }
    }
    docs.sort_by_key(|(rank, seq, _, _)| (*rank, *seq));
    let mut main = String::from(HEADER);
    main.push_str(&format!(
        "# Release {:?} in namespace {:?}, chart {} {}.\n",
        release.name, release.namespace, chart.meta.name, chart.meta.version
    ));
    for (_, _, source, doc) in docs {
        main.push_str(&format!("---\n# Source: {source}\n{doc}\n"));
    }
    files.push(Generated {
        path: Path::new(MANIFESTS_DIR).join("tessera.yaml"),
        content: main,
    });
    Ok(files)
}

/// Writes the generated files; removes stale CRD copies from the chart.
pub fn write(repo: &Path, out_dir: Option<&Path>) -> Result<Vec<PathBuf>, ChartError> {
    let files = generate(repo)?;
    let chart_crds = repo.join(CHART_DIR).join("crds");
    remove_extra(&chart_crds, &files, repo)?;
    let mut written = Vec::new();
    for f in files {
        let target = match (out_dir, f.path.starts_with(MANIFESTS_DIR)) {
            (Some(dir), true) => dir.join(f.path.file_name().unwrap_or_default()),
            _ => repo.join(&f.path),
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|source| ChartError::Read {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&target, &f.content).map_err(|source| ChartError::Read {
            path: target.clone(),
            source,
        })?;
        written.push(target);
    }
    Ok(written)
}

fn remove_extra(dir: &Path, files: &[Generated], repo: &Path) -> Result<(), ChartError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let wanted = files.iter().any(|f| repo.join(&f.path) == path);
        if !wanted {
            std::fs::remove_file(&path).map_err(|source| ChartError::Read {
                path: path.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Generated files that are missing or differ on disk, and chart CRD copies that have no
/// source any more. Empty when everything is up to date.
pub fn stale(repo: &Path) -> Result<Vec<PathBuf>, ChartError> {
    let files = generate(repo)?;
    let mut out = Vec::new();
    for f in &files {
        let on_disk = std::fs::read_to_string(repo.join(&f.path)).ok();
        if on_disk.as_deref() != Some(f.content.as_str()) {
            out.push(f.path.clone());
        }
    }
    for dir in [
        Path::new(CHART_DIR).join("crds"),
        PathBuf::from(MANIFESTS_DIR),
    ] {
        let Ok(entries) = std::fs::read_dir(repo.join(&dir)) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let rel = dir.join(entry.file_name());
            if !files.iter().any(|f| f.path == rel) {
                out.push(rel);
            }
        }
    }
    Ok(out)
}
