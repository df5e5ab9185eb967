//! The Helm chart through the real helm (v4, run as `kube-peer helm` from hack/k8s):
//! `helm template` renders it, `helm lint` lints it. [`Chart`] reads the sources the lints
//! of [`crate::lint`] look at (`Chart.yaml`, `values.yaml`, the templates).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml_ng::Value;

/// Errors loading, rendering or linting a chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// What could not be read or run: a chart file or directory, the temporary helm home, or
        /// the `kube-peer` binary.
        path: PathBuf,
        /// Why the read or spawn failed (missing, no permission).
        source: std::io::Error,
    },
    /// A YAML file does not parse or does not have the expected shape.
    #[error("{path}: {message}")]
    Yaml {
        /// The chart file (`Chart.yaml`, `values.yaml`) that is malformed.
        path: PathBuf,
        /// The parser's complaint, or which shape the file must have.
        message: String,
    },
    /// helm (the `kube-peer` binary) is not available.
    #[error("helm is not available: {0}")]
    NoHelm(String),
    /// A helm command failed.
    #[error("helm {args} failed:\n{stderr}")]
    Helm {
        /// The arguments, space-separated.
        args: String,
        /// What helm printed (both streams).
        stderr: String,
    },
}

/// `Chart.yaml` (Helm's v2 chart API; unknown keys are refused to catch typos).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartMeta {
    /// Always `v2`.
    pub api_version: String,
    /// Chart name.
    pub name: String,
    /// Chart version (SemVer).
    pub version: String,
    /// Version of the software the chart deploys.
    #[serde(default)]
    pub app_version: Option<String>,
    /// One-line description.
    #[serde(default)]
    pub description: Option<String>,
    /// `application` or `library`.
    #[serde(default, rename = "type")]
    pub chart_type: Option<String>,
    /// Supported Kubernetes versions (a SemVer range).
    #[serde(default)]
    pub kube_version: Option<String>,
    /// Project home page.
    #[serde(default)]
    pub home: Option<String>,
    /// Source repositories.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Search keywords.
    #[serde(default)]
    pub keywords: Vec<String>,
}

/// The release a render is for (`helm template NAME --namespace NAMESPACE`).
#[derive(Debug, Clone)]
pub struct Release {
    /// `.Release.Name`.
    pub name: String,
    /// `.Release.Namespace`.
    pub namespace: String,
}

impl Default for Release {
    fn default() -> Self {
        Self {
            name: "tessera".into(),
            namespace: "tessera-system".into(),
        }
    }
}

/// One document of `helm template`'s output.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The template it came from, inside the chart (`templates/coordinator.yaml`).
    pub source: String,
    /// The document's YAML text, without the `---` separator and the `# Source:` line.
    pub text: String,
}

/// The chart's sources, for the lints helm does not do.
#[derive(Debug)]
pub struct Chart {
    /// Where `Chart.yaml` lives (`deploy/helm/tessera`); template paths are relative to it.
    pub dir: PathBuf,
    /// `Chart.yaml`.
    pub meta: ChartMeta,
    /// `values.yaml` as written.
    pub values_source: String,
    /// `values.yaml` parsed.
    pub values: Value,
    /// Template sources by path inside the chart (`templates/x.yaml`), sorted.
    pub template_sources: Vec<(String, String)>,
}

fn read(path: &Path) -> Result<String, ChartError> {
    std::fs::read_to_string(path).map_err(|source| ChartError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses YAML text into a value, naming the file on error.
pub fn parse_yaml(path: &Path, text: &str) -> Result<Value, ChartError> {
    serde_yaml_ng::from_str(text).map_err(|e| ChartError::Yaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Splits a multi-document YAML text into its non-empty documents (comment-only documents
/// dropped).
pub fn split_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        let meaningful = current
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if meaningful {
            docs.push(current.trim_matches('\n').to_string());
        }
        current.clear();
    };
    for line in text.lines() {
        if line.trim_end() == "---" {
            flush(&mut current);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current);
    docs
}

/// Splits `helm template` output into documents, each with the template helm names in its
/// `# Source: <chart>/<path>` line (the chart-name prefix removed).
pub fn parse_helm_output(text: &str) -> Vec<Rendered> {
    split_documents(text)
        .into_iter()
        .map(|doc| {
            let mut source = String::new();
            let mut body = Vec::new();
            for line in doc.lines() {
                match line.strip_prefix("# Source: ") {
                    Some(s) if source.is_empty() => {
                        source = s
                            .split_once('/')
                            .map_or(s, |(_chart, path)| path)
                            .to_string();
                    }
                    _ => body.push(line),
                }
            }
            Rendered {
                source,
                text: body.join("\n").trim_matches('\n').to_string(),
            }
        })
        .collect()
}

/// Runs `helm ARGS` (the `kube-peer` binary's helm, see `tessera_testcluster::kube_peer`) with
/// private cache and config directories and no cluster; its standard output on success.
pub fn helm(args: &[&str]) -> Result<String, ChartError> {
    let peer = tessera_testcluster::kube_peer().map_err(|e| ChartError::NoHelm(e.to_string()))?;
    let home = tempfile::tempdir().map_err(|source| ChartError::Read {
        path: std::env::temp_dir(),
        source,
    })?;
    let mut cmd = Command::new(peer);
    cmd.arg("helm").args(args).env_remove("KUBECONFIG");
    for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        cmd.env(var, home.path());
    }
    let out = cmd.output().map_err(|source| ChartError::Read {
        path: peer.to_path_buf(),
        source,
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(ChartError::Helm {
            args: args.join(" "),
            stderr: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(stdout)
}

/// `helm template` of the chart at `dir` for `release`, with `values` files merged over
/// `values.yaml` in order; `crds` also renders the chart's `crds/` (`--include-crds`).
pub fn template(
    dir: &Path,
    release: &Release,
    values: &[PathBuf],
    crds: bool,
) -> Result<String, ChartError> {
    let dir = dir.to_string_lossy();
    let mut args: Vec<String> = vec![
        "template".into(),
        release.name.clone(),
        dir.into_owned(),
        "--namespace".into(),
        release.namespace.clone(),
    ];
    if crds {
        args.push("--include-crds".into());
    }
    for v in values {
        args.push("--values".into());
        args.push(v.to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm(&args)
}

/// The chart's templates rendered by `helm template` (no CRDs), one entry per document.
pub fn render(
    dir: &Path,
    release: &Release,
    values: &[PathBuf],
) -> Result<Vec<Rendered>, ChartError> {
    Ok(parse_helm_output(&template(dir, release, values, false)?))
}

/// `helm lint --strict` of the chart at `dir` with `values` files; helm's report on success.
pub fn lint(dir: &Path, values: &[PathBuf]) -> Result<String, ChartError> {
    let dir = dir.to_string_lossy();
    let mut args: Vec<String> = vec!["lint".into(), "--strict".into(), dir.into_owned()];
    for v in values {
        args.push("--values".into());
        args.push(v.to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm(&args)
}

impl Chart {
    /// Reads the chart directory's `Chart.yaml`, `values.yaml` and templates.
    pub fn load(dir: &Path) -> Result<Chart, ChartError> {
        let meta_path = dir.join("Chart.yaml");
        let meta: ChartMeta =
            serde_yaml_ng::from_str(&read(&meta_path)?).map_err(|e| ChartError::Yaml {
                path: meta_path.clone(),
                message: e.to_string(),
            })?;
        let values_path = dir.join("values.yaml");
        let values_source = read(&values_path)?;
        let values = parse_yaml(&values_path, &values_source)?;
        if !matches!(values, Value::Mapping(_)) {
            return Err(ChartError::Yaml {
                path: values_path,
                message: "values.yaml must be a map at the top level".into(),
            });
        }
        let templates = dir.join("templates");
        let entries = std::fs::read_dir(&templates).map_err(|source| ChartError::Read {
            path: templates.clone(),
            source,
        })?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "tpl")
            })
            .collect();
        paths.sort();
        let mut template_sources = Vec::new();
        for path in paths {
            let name = format!(
                "templates/{}",
                path.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            );
            template_sources.push((name, read(&path)?));
        }
        Ok(Chart {
            dir: dir.to_path_buf(),
            meta,
            values_source,
            values,
            template_sources,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_split_on_separators_and_drop_empty_ones() {
        let docs = split_documents("---\n# only a comment\n---\na: 1\n---\n\n---\nb: 2\n");
        assert_eq!(docs, ["a: 1", "b: 2"]);
    }

    #[test]
    fn helm_output_names_each_document_by_its_template() {
        let out = "---\n# Source: tessera/templates/rbac.yaml\n# a comment\nkind: Role\n---\n# Source: tessera/templates/rbac.yaml\nkind: RoleBinding\n";
        let docs = parse_helm_output(out);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].source, "templates/rbac.yaml");
        assert_eq!(docs[0].text, "# a comment\nkind: Role");
        assert_eq!(docs[1].text, "kind: RoleBinding");
    }
}
