//! Checks a custom resource against its CRD's structural OpenAPI v3 schema, as the API
//! server's validation and pruning would: unknown fields (which a real server prunes
//! silently), wrong types, missing required fields, values outside `enum`/`minimum`/`maximum`.

use serde_json::Value;

/// The schema of `kind` in `group` at `version`, from CRD documents (as JSON).
pub fn schema_for<'a>(
    crds: &'a [Value],
    group: &str,
    version: &str,
    kind: &str,
) -> Option<&'a Value> {
    crds.iter().find_map(|crd| {
        let spec = crd.get("spec")?;
        if spec.get("group")?.as_str()? != group || spec.pointer("/names/kind")?.as_str()? != kind {
            return None;
        }
        spec.get("versions")?
            .as_array()?
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
            .pointer("/schema/openAPIV3Schema")
    })
}

/// Every violation of `schema` by `value`, each naming its path.
pub fn validate(schema: &Value, value: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    walk(schema, value, "", true, &mut errors);
    errors
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn walk(schema: &Value, value: &Value, path: &str, root: bool, errors: &mut Vec<String>) {
    let flag = |name: &str| schema.get(name).and_then(Value::as_bool) == Some(true);
    let here = if path.is_empty() { "." } else { path };
    if value.is_null() {
        if !flag("nullable") {
            errors.push(format!("{here}: null is not allowed"));
        }
        return;
    }
    if flag("x-kubernetes-int-or-string") {
        if !matches!(value, Value::String(_)) && type_name(value) != "integer" {
            errors.push(format!("{here}: expected an integer or a string"));
        }
        return;
    }
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(value);
        let ok = got == want || (want == "number" && got == "integer");
        if !ok {
            errors.push(format!("{here}: expected {want}, got {got} ({value})"));
            return;
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        errors.push(format!(
            "{here}: {value} is not one of {}",
            Value::from(options.clone())
        ));
    }
    if let (Some(min), Some(n)) = (
        schema.get("minimum").and_then(Value::as_f64),
        value.as_f64(),
    ) && n < min
    {
        errors.push(format!("{here}: {n} is below the minimum {min}"));
    }
    if let (Some(max), Some(n)) = (
        schema.get("maximum").and_then(Value::as_f64),
        value.as_f64(),
    ) && n > max
    {
        errors.push(format!("{here}: {n} is above the maximum {max}"));
    }
    match value {
        Value::Object(map) => {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for r in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(r) {
                        errors.push(format!("{path}.{r}: required field is missing"));
                    }
                }
            }
            if flag("x-kubernetes-preserve-unknown-fields") {
                return;
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (k, v) in map {
                let child = format!("{path}.{k}");
                // apiVersion, kind and metadata are the API server's, not the schema's.
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(s), _) => walk(s, v, &child, false, errors),
                    (None, Some(Value::Object(_))) => {
                        walk(additional.unwrap_or(&Value::Null), v, &child, false, errors);
                    }
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) => errors.push(format!(
                        "{child}: unknown field (the API server would drop it)"
                    )),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), false, errors);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["levels"],
                    "properties": {
                        "levels": {"type": "array", "items": {"type": "string"}},
                        "weight": {"type": "number", "minimum": 0},
                        "mode": {"type": "string", "enum": ["a", "b"]},
                        "quota": {"x-kubernetes-int-or-string": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "opt": {"type": "string", "nullable": true}
                    }
                }
            }
        })
    }

    #[test]
    fn a_valid_object_passes() {
        let v = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"levels": ["a"], "weight": 2, "mode": "a", "quota": "10", "labels": {"k": "v"},
                     "free": {"anything": [1]}, "opt": null}});
        assert_eq!(validate(&schema(), &v), Vec::<String>::new());
    }

    #[test]
    fn every_violation_is_named() {
        let v = json!({"spec": {"levels": [1], "weight": -1, "mode": "c", "quota": 1.5,
            "labels": {"k": 3}, "extra": true}});
        let errors = validate(&schema(), &v);
        for want in [
            ".spec.levels[0]: expected string",
            ".spec.weight: -1 is below the minimum 0",
            ".spec.mode: \"c\" is not one of",
            ".spec.quota: expected an integer or a string",
            ".spec.labels.k: expected string",
            ".spec.extra: unknown field",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(want)),
                "{want} not in {errors:?}"
            );
        }
        let errors = validate(&schema(), &json!({"spec": {}}));
        assert_eq!(errors, [".spec.levels: required field is missing"]);
    }
}
