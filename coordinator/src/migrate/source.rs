//! Where `migrate` reads documents from: YAML files (several documents each, `kind: List`
//! unpacked; `-` is standard input) or a cluster (KAI's Queues and PodGroups, and the pods
//! that name KAI's scheduler). Errors name the file and document.

use std::io::Read;
use std::path::Path;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde::Deserialize;
use serde_json::Value;

use super::kai::{Document, KAI_GROUP, KAI_POD_GROUP_VERSION, KAI_QUEUE_VERSION, KAI_SCHEDULER};

/// Documents read from one file; each file holds at most this many, so a file that is not
/// what it should be costs bounded work.
pub const MAX_DOCUMENTS: usize = 10_000;

/// Why documents could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file (`-` for standard input).
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A document is not YAML.
    #[error("{path}, document {index}: not YAML: {source}")]
    Yaml {
        /// The file.
        path: String,
        /// 1-based document number.
        index: usize,
        /// The parser's error (with line and column).
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// Too many documents.
    #[error("{path}: more than {MAX_DOCUMENTS} documents; split the file")]
    TooMany {
        /// The file.
        path: String,
    },
    /// The API server refused a list.
    #[error("listing {what}: {source}")]
    List {
        /// What was listed.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// Every document of the YAML `text` (read from `path`), `List`s unpacked, empty documents
/// skipped.
pub fn parse(path: &str, text: &str) -> Result<Vec<Document>, SourceError> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        if index > MAX_DOCUMENTS {
            return Err(SourceError::TooMany {
                path: path.to_owned(),
            });
        }
        let value = Value::deserialize(doc).map_err(|source| SourceError::Yaml {
            path: path.to_owned(),
            index,
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let origin = format!("{path}#{index}");
        match value.get("items").and_then(Value::as_array) {
            Some(items)
                if value
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                for (j, item) in items.iter().enumerate() {
                    out.push(Document {
                        origin: format!("{origin}.items[{j}]"),
                        value: item.clone(),
                        notes_only: false,
                    });
                }
            }
            _ => out.push(Document {
                origin,
                value,
                notes_only: false,
            }),
        }
    }
    Ok(out)
}

/// The documents of `path` (`-`: standard input; a directory: its `.yaml`, `.yml` and `.json`
/// files in name order, not descending further).
pub fn read_file(path: &Path) -> Result<Vec<Document>, SourceError> {
    let name = path.display().to_string();
    if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|source| SourceError::Read {
            path: name.clone(),
            source,
        })?;
        let mut files: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && p.extension()
                        .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            })
            .collect();
        files.sort();
        let mut out = Vec::new();
        for f in files {
            out.extend(read_file(&f)?);
        }
        return Ok(out);
    }
    let mut text = String::new();
    let read = if name == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|source| SourceError::Read {
        path: name.clone(),
        source,
    })?;
    parse(&name, &text)
}

/// KAI's Queues and PodGroups in the cluster `client` reaches, and the pods that name KAI's
/// scheduler. A KAI CRD that is not installed gives nothing (and a note in `absent`).
pub async fn read_cluster(
    client: &kube::Client,
    absent: &mut Vec<String>,
) -> Result<Vec<Document>, SourceError> {
    let mut out = Vec::new();
    for (version, kind, plural) in [
        (KAI_QUEUE_VERSION, "Queue", "queues"),
        (KAI_POD_GROUP_VERSION, "PodGroup", "podgroups"),
    ] {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(KAI_GROUP, version, kind),
            plural,
        );
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                for item in list.items {
                    push_object(&mut out, "cluster", &item, &resource);
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                absent.push(format!("{plural}.{KAI_GROUP} ({version}) is not installed"));
            }
            Err(source) => {
                return Err(SourceError::List {
                    what: format!("{plural}.{KAI_GROUP}"),
                    source,
                });
            }
        }
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|source| SourceError::List {
            what: "pods".to_owned(),
            source,
        })?;
    for pod in list.items {
        let kai =
            pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some(KAI_SCHEDULER);
        if !kai {
            continue;
        }
        if let Ok(mut value) = serde_json::to_value(&pod) {
            strip_server_fields(&mut value);
            if let Some(m) = value.as_object_mut() {
                m.insert("apiVersion".into(), "v1".into());
                m.insert("kind".into(), "Pod".into());
            }
            out.push(Document {
                origin: "cluster".to_owned(),
                value,
                notes_only: true,
            });
        }
    }
    Ok(out)
}

fn push_object(
    out: &mut Vec<Document>,
    origin: &str,
    item: &DynamicObject,
    resource: &ApiResource,
) {
    if let Ok(mut value) = serde_json::to_value(item) {
        strip_server_fields(&mut value);
        if let Some(m) = value.as_object_mut() {
            m.insert("apiVersion".into(), resource.api_version.clone().into());
            m.insert("kind".into(), resource.kind.clone().into());
        }
        out.push(Document {
            origin: origin.to_owned(),
            value,
            notes_only: false,
        });
    }
}

/// Drops what the API server writes (status, uid, resourceVersion, managed fields ...), so a
/// printed object can be applied elsewhere.
fn strip_server_fields(value: &mut Value) {
    if let Some(m) = value.as_object_mut() {
        m.remove("status");
    }
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "managedFields",
            "selfLink",
        ] {
            meta.remove(key);
        }
    }
}
