//! The three patch formats: JSON merge patch (RFC 7386), strategic merge patch (the subset of
//! Kubernetes' rules for the fields Tessera and kubectl touch) and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// Patch formats, chosen by the request's Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/json-patch+json`
    Json,
    /// `application/apply-patch+yaml` (server-side apply), approximated as a strategic merge
    /// without field ownership; creates the object when it does not exist.
    Apply,
}

/// Media types accepted for PATCH, for the 415 message.
pub const ACCEPTED_PATCH_TYPES: &str = "application/merge-patch+json, application/strategic-merge-patch+json, application/json-patch+json, application/apply-patch+yaml";

impl PatchKind {
    /// Maps a Content-Type header to a patch kind.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/json-patch+json" => Some(Self::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Applies `patch` of `kind` to `target` in place.
pub fn apply(kind: PatchKind, target: &mut Value, patch: &Value) -> Result<(), String> {
    match kind {
        PatchKind::Merge => {
            merge_patch(target, patch);
            Ok(())
        }
        PatchKind::Strategic | PatchKind::Apply => strategic_merge(target, patch, ""),
        PatchKind::Json => json_patch(target, patch),
    }
}

/// RFC 7386: maps merge recursively, `null` deletes, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    let target_map = super::meta::ensure_map(target);
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
        } else {
            merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// The merge key of lists that Kubernetes merges element-wise rather than replaces, by field name.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "ownerReferences" => "uid",
        "addresses" => "type",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        _ => return None,
    })
}

/// Lists of scalars that strategic merge unions instead of replacing.
fn is_merged_scalar_list(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch: like a merge patch, but lists with a known merge key are merged
/// element by element (`status.conditions` by `type`, containers by `name`, ...), and the
/// directives kubectl emits (`$patch`, `$retainKeys`, `$setElementOrder/…`,
/// `$deleteFromPrimitiveList/…`) are honoured or, for ordering hints, ignored.
pub fn strategic_merge(target: &mut Value, patch: &Value, field: &str) -> Result<(), String> {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match patch_map.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = Value::Object(without_directives(patch_map));
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) if other != "merge" => {
            return Err(format!(
                "unknown $patch directive {other:?} at {field:?}: accepted: replace, delete, merge"
            ));
        }
        _ => {}
    }
    let target_map = super::meta::ensure_map(target);
    for (key, value) in patch_map {
        if let Some(list_field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(remove)) =
                (target_map.get_mut(list_field), value)
            {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        let slot = target_map.entry(key.clone()).or_insert(Value::Null);
        match value {
            Value::Array(items) => merge_list(slot, items, key)?,
            Value::Object(_) => {
                strategic_merge(slot, value, key)?;
                if slot.is_null() {
                    target_map.remove(key);
                }
            }
            _ => *slot = value.clone(),
        }
    }
    if let Some(Value::Array(retain)) = patch_map.get("$retainKeys") {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        target_map.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn without_directives(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn merge_list(slot: &mut Value, patch_items: &[Value], field: &str) -> Result<(), String> {
    let replace_all = patch_items
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace_all {
        *slot = Value::Array(
            patch_items
                .iter()
                .filter(|item| item.get("$patch").is_none())
                .cloned()
                .collect(),
        );
        return Ok(());
    }
    if is_merged_scalar_list(field) {
        let existing = slot.as_array().cloned().unwrap_or_default();
        let mut merged = existing;
        for item in patch_items {
            if !merged.contains(item) {
                merged.push(item.clone());
            }
        }
        *slot = Value::Array(merged);
        return Ok(());
    }
    let Some(key) = merge_key(field) else {
        *slot = Value::Array(patch_items.to_vec());
        return Ok(());
    };
    let mut merged = match slot.take() {
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    for item in patch_items {
        let Some(id) = item.get(key) else {
            return Err(format!(
                "strategic merge patch of {field:?}: every element needs the merge key {key:?}"
            ));
        };
        let position = merged
            .iter()
            .position(|existing| existing.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                merged.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut merged[i], item, field)?,
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_merge(&mut fresh, item, field)?;
                merged.push(fresh);
            }
        }
    }
    *slot = Value::Array(merged);
    Ok(())
}

/// RFC 6902 JSON patch: `add`, `remove`, `replace`, `move`, `copy`, `test`, applied atomically
/// (on failure `target` is left untouched).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch
        .as_array()
        .ok_or("a JSON patch must be an array of operations like {\"op\":\"add\",\"path\":\"/a\",\"value\":1}")?;
    let mut work = target.clone();
    for (i, op) in ops.iter().enumerate() {
        apply_op(&mut work, op).map_err(|e| format!("JSON patch operation {i}: {e}"))?;
    }
    *target = work;
    Ok(())
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let name = op
        .get("op")
        .and_then(Value::as_str)
        .ok_or("missing \"op\"")?;
    let path = op
        .get("path")
        .and_then(Value::as_str)
        .ok_or("missing \"path\"")?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| format!("{name} needs \"value\""))
    };
    let from = || {
        op.get("from")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{name} needs \"from\""))
    };
    match name {
        "add" => add(doc, path, value()?),
        "remove" => remove(doc, path).map(drop),
        "replace" => {
            let slot = doc
                .pointer_mut(path)
                .ok_or_else(|| format!("path {path:?} does not exist"))?;
            *slot = value()?;
            Ok(())
        }
        "move" => {
            let moved = remove(doc, from()?)?;
            add(doc, path, moved)
        }
        "copy" => {
            let from = from()?;
            let copied = doc
                .pointer(from)
                .cloned()
                .ok_or_else(|| format!("from {from:?} does not exist"))?;
            add(doc, path, copied)
        }
        "test" => {
            let expected = value()?;
            match doc.pointer(path) {
                Some(actual) if *actual == expected => Ok(()),
                _ => Err(format!("test failed: {path:?} is not {expected}")),
            }
        }
        other => Err(format!(
            "unknown op {other:?}: accepted: add, remove, replace, move, copy, test"
        )),
    }
}

fn split_pointer(path: &str) -> Result<(&str, String), String> {
    let idx = path
        .rfind('/')
        .ok_or_else(|| format!("path {path:?} must start with '/'"))?;
    let last = path[idx + 1..].replace("~1", "/").replace("~0", "~");
    Ok((&path[..idx], last))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    let parent_value = doc
        .pointer_mut(parent)
        .ok_or_else(|| format!("parent of {path:?} does not exist"))?;
    match parent_value {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(items) => {
            if last == "-" {
                items.push(value);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| format!("array index {last:?} in {path:?} is not a number"))?;
            if i > items.len() {
                return Err(format!("array index {i} in {path:?} is out of bounds"));
            }
            items.insert(i, value);
            Ok(())
        }
        _ => Err(format!("parent of {path:?} is not an object or array")),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("path {path:?} does not exist");
    match doc.pointer_mut(parent).ok_or_else(missing)? {
        Value::Object(map) => map.remove(&last).ok_or_else(missing),
        Value::Array(items) => {
            let i: usize = last.parse().map_err(|_| missing())?;
            (i < items.len())
                .then(|| items.remove(i))
                .ok_or_else(missing)
        }
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null_and_replaces_lists() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(doc, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn strategic_merges_conditions_by_type() {
        let mut pod = json!({"metadata": {"labels": {"a": "1"}}, "status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
            {"type": "Ready", "status": "False"}]}});
        let patch = json!({"metadata": {"labels": {"b": "2"}}, "status": {"conditions": [
            {"type": "PodScheduled", "status": "True", "reason": null},
            {"type": "Initialized", "status": "True"}]}});
        strategic_merge(&mut pod, &patch, "").unwrap();
        assert_eq!(pod["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(
            pod["status"]["conditions"],
            json!([
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"},
            {"type": "Initialized", "status": "True"}])
        );
    }

    #[test]
    fn strategic_directives() {
        let mut doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b"}],
            "tolerations": [{"key": "k"}]}, "metadata": {"finalizers": ["f1"]}});
        let patch = json!({"spec": {"$setElementOrder/containers": [{"name": "a"}],
            "containers": [{"name": "b", "$patch": "delete"}, {"name": "a", "image": "y"}],
            "tolerations": [{"key": "z"}]}, "metadata": {"finalizers": ["f2"]}});
        strategic_merge(&mut doc, &patch, "").unwrap();
        assert_eq!(
            doc["spec"]["containers"],
            json!([{"name": "a", "image": "y"}])
        );
        assert_eq!(doc["spec"]["tolerations"], json!([{"key": "z"}]));
        assert_eq!(doc["metadata"]["finalizers"], json!(["f1", "f2"]));
    }

    #[test]
    fn json_patch_ops_are_atomic() {
        let mut doc = json!({"metadata": {"labels": {"a/b": "1"}}, "l": [1, 2]});
        json_patch(
            &mut doc,
            &json!([
            {"op": "add", "path": "/l/-", "value": 3},
            {"op": "remove", "path": "/metadata/labels/a~1b"},
            {"op": "add", "path": "/metadata/labels/x", "value": "y"},
            {"op": "test", "path": "/l/0", "value": 1},
            {"op": "copy", "from": "/l/0", "path": "/first"},
            {"op": "move", "from": "/first", "path": "/moved"},
            {"op": "replace", "path": "/l/1", "value": 20}]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"x": "y"}}, "l": [1, 20, 3], "moved": 1})
        );
        let before = doc.clone();
        let err = json_patch(
            &mut doc,
            &json!([
            {"op": "add", "path": "/z", "value": 1},
            {"op": "test", "path": "/l/0", "value": 99}]),
        )
        .unwrap_err();
        assert!(err.contains("operation 1"), "{err}");
        assert_eq!(doc, before);
    }
}
