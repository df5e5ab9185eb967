//! A Helm chart directory: `Chart.yaml`, `values.yaml`, `templates/` (files starting with `_`
//! hold helpers only) and `crds/` (installed first, never templated), rendered as
//! `helm template` would with the subset in [`crate::template`].

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use crate::template::{TemplateError, TemplateSet};

/// Errors loading or rendering a chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A YAML file does not parse or does not have the expected shape.
    #[error("{path}: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A template failed.
    #[error(transparent)]
    Template(#[from] TemplateError),
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

/// The release a render is for (`.Release`).
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

/// One rendered template file, split into its non-empty YAML documents.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// Path inside the chart, e.g. `templates/coordinator.yaml`.
    pub source: String,
    /// The documents, without `---` separators.
    pub documents: Vec<String>,
}

/// A loaded chart.
#[derive(Debug)]
pub struct Chart {
    /// The chart directory.
    pub dir: PathBuf,
    /// `Chart.yaml`.
    pub meta: ChartMeta,
    /// `values.yaml` as written.
    pub values_source: String,
    /// `values.yaml` parsed.
    pub values: Value,
    /// Template sources by path inside the chart, sorted.
    pub template_sources: Vec<(String, String)>,
    /// `crds/` files by name, sorted.
    pub crds: Vec<(String, String)>,
    templates: TemplateSet,
}

fn read(path: &Path) -> Result<String, ChartError> {
    std::fs::read_to_string(path).map_err(|source| ChartError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Files of `dir` ending in one of `exts`, sorted by name; none when `dir` is absent.
fn files_in(dir: &Path, exts: &[&str]) -> Result<Vec<PathBuf>, ChartError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ChartError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| exts.contains(&e))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Parses YAML text into a value, naming the file on error.
pub fn parse_yaml(path: &Path, text: &str) -> Result<Value, ChartError> {
    serde_yaml_ng::from_str(text).map_err(|e| ChartError::Yaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Deep-merges `over` into `base`: maps merge key by key, anything else replaces.
pub fn merge_values(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge_values(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Splits a rendered file into its non-empty documents (comment-only documents dropped).
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

fn key(s: &str) -> Value {
    Value::String(s.to_string())
}

impl Chart {
    /// Reads and parses a chart directory.
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
        let mut templates = TemplateSet::new();
        let mut template_sources = Vec::new();
        for path in files_in(&dir.join("templates"), &["yaml", "yml", "tpl"])? {
            let name = format!(
                "templates/{}",
                path.file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
            );
            let source = read(&path)?;
            templates.add(&name, &source)?;
            template_sources.push((name, source));
        }
        let mut crds = Vec::new();
        for path in files_in(&dir.join("crds"), &["yaml", "yml"])? {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            crds.push((name, read(&path)?));
        }
        Ok(Chart {
            dir: dir.to_path_buf(),
            meta,
            values_source,
            values,
            template_sources,
            crds,
            templates,
        })
    }

    /// The root object templates see: `.Values`, `.Release`, `.Chart`.
    pub fn context(&self, release: &Release, overrides: &[Value]) -> Value {
        let mut values = self.values.clone();
        for o in overrides {
            merge_values(&mut values, o);
        }
        let mut rel = Mapping::new();
        rel.insert(key("Name"), key(&release.name));
        rel.insert(key("Namespace"), key(&release.namespace));
        rel.insert(key("Service"), key("Helm"));
        rel.insert(key("IsInstall"), Value::Bool(true));
        let mut chart = Mapping::new();
        chart.insert(key("Name"), key(&self.meta.name));
        chart.insert(key("Version"), key(&self.meta.version));
        chart.insert(
            key("AppVersion"),
            key(self.meta.app_version.as_deref().unwrap_or("")),
        );
        let mut root = Mapping::new();
        root.insert(key("Values"), values);
        root.insert(key("Release"), Value::Mapping(rel));
        root.insert(key("Chart"), Value::Mapping(chart));
        Value::Mapping(root)
    }

    /// Renders every template file that is not a helper file (`_*.tpl`/`_*.yaml`).
    pub fn render(
        &self,
        release: &Release,
        overrides: &[Value],
    ) -> Result<Vec<Rendered>, ChartError> {
        let root = self.context(release, overrides);
        let mut out = Vec::new();
        for (name, _) in &self.template_sources {
            let file = name.trim_start_matches("templates/");
            if file.starts_with('_') || name.ends_with(".tpl") {
                continue;
            }
            let text = self.templates.render(name, &root)?;
            out.push(Rendered {
                source: name.clone(),
                documents: split_documents(&text),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_deep_for_maps_and_replaces_the_rest() {
        let mut base: Value = serde_yaml_ng::from_str("a: {b: 1, c: [1]}\nd: x").unwrap();
        let over: Value = serde_yaml_ng::from_str("a: {c: [2], e: 3}\nd: null").unwrap();
        merge_values(&mut base, &over);
        let want: Value = serde_yaml_ng::from_str("a: {b: 1, c: [2], e: 3}\nd: null").unwrap();
        assert_eq!(base, want);
    }

    #[test]
    fn documents_split_on_separators_and_drop_empty_ones() {
        let docs = split_documents("---\n# only a comment\n---\na: 1\n---\n\n---\nb: 2\n");
        assert_eq!(docs, ["a: 1", "b: 2"]);
    }
}
