//! Lints `helm lint` does not do but the chart promises: every value in `values.yaml` has a
//! comment saying what it is, and every `.Values.x.y` a template reads exists in
//! `values.yaml` (so it is documented and has a default).

use serde_yaml_ng::Value;

/// Keys of `values.yaml` with no comment on the line(s) above or at the end of the line,
/// as dotted paths. Keys inside list items are not checked (the list itself is).
pub fn undocumented_values(source: &str) -> Vec<String> {
    let mut missing = Vec::new();
    // (indent, key) of the enclosing map keys; a `None` key marks a list item.
    let mut stack: Vec<(usize, Option<String>)> = Vec::new();
    let mut previous_is_comment = false;
    for line in source.lines() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() {
            previous_is_comment = false;
            continue;
        }
        if trimmed.starts_with('#') {
            previous_is_comment = true;
            continue;
        }
        let indent = line.len() - trimmed.len();
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let documented = previous_is_comment;
        previous_is_comment = false;
        if trimmed.starts_with("- ") || trimmed == "-" {
            stack.push((indent, None));
            continue;
        }
        let Some(colon) = key_end(trimmed) else {
            continue;
        };
        let key = trimmed[..colon]
            .trim_matches(|c| c == '"' || c == '\'')
            .to_string();
        let in_list = stack.iter().any(|(_, k)| k.is_none());
        let inline_comment = trimmed[colon..].contains(" #");
        if !in_list && !documented && !inline_comment {
            let mut path: Vec<&str> = stack.iter().filter_map(|(_, k)| k.as_deref()).collect();
            path.push(&key);
            missing.push(path.join("."));
        }
        stack.push((indent, Some(key)));
    }
    missing
}

/// Where a `key:` ends on a line that starts with a map key (quotes allowed).
fn key_end(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut quote = None;
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (Some(q), b) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'"' | b'\'') if i == 0 => quote = Some(b),
            (None, b':') if bytes.get(i + 1).is_none_or(|n| *n == b' ') => return Some(i),
            (None, b' ' | b'{' | b'[') => return None,
            _ => {}
        }
    }
    None
}

/// `.Values.a.b` paths read by the templates that `values.yaml` does not define. A path may go
/// below a key whose default is an empty map or nil (user-supplied maps such as
/// `nodeSelector`).
pub fn undefined_value_refs(templates: &[(String, String)], values: &Value) -> Vec<String> {
    let mut missing = Vec::new();
    for (name, source) in templates {
        let mut rest = source.as_str();
        while let Some(at) = rest.find(".Values.") {
            let tail = &rest[at + ".Values.".len()..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(tail.len());
            let path = tail[..end].trim_end_matches('.');
            rest = &tail[end..];
            if !defined(values, path) {
                let entry = format!("{name}: .Values.{path}");
                if !missing.contains(&entry) {
                    missing.push(entry);
                }
            }
        }
    }
    missing
}

fn defined(values: &Value, path: &str) -> bool {
    let mut current = values;
    for key in path.split('.') {
        match current {
            Value::Mapping(m) if m.is_empty() => return true,
            Value::Mapping(m) => match m.get(key) {
                Some(v) => current = v,
                None => return false,
            },
            Value::Null => return true,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_without_comments() {
        let src = "\
# The image.
image:
  # Repository.
  repository: x
  tag: v1 # inline is fine
  pullPolicy: IfNotPresent
undocumented: 1

# Tolerations.
tolerations:
  - key: a
    effect: NoSchedule
";
        assert_eq!(
            undocumented_values(src),
            ["image.pullPolicy", "undocumented"]
        );
    }

    #[test]
    fn finds_template_reads_missing_from_values() {
        let values: Value =
            serde_yaml_ng::from_str("a: {b: 1}\nsel: {}\nn: null\nimage: {tag: v}").unwrap();
        let templates = vec![(
            "templates/x.yaml".to_string(),
            "{{ .Values.a.b }} {{ .Values.a.c }} {{ .Values.sel.any }} {{ .Values.n.x }} {{ .Values.image.tag.y }}"
                .to_string(),
        )];
        assert_eq!(
            undefined_value_refs(&templates, &values),
            [
                "templates/x.yaml: .Values.a.c",
                "templates/x.yaml: .Values.image.tag.y"
            ]
        );
    }
}
