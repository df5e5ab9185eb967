//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists) and field selectors
//! (`=`, `==`, `!=` on any dotted field path, e.g. `spec.nodeName`).

use serde_json::Value;

use super::meta::field_string;

/// One parsed label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(input: &str) -> Result<Self, String> {
        let reqs = split_top_level(input)
            .into_iter()
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(parse_label_req)
            .collect::<Result<_, _>>()?;
        Ok(Self { reqs })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.reqs.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Splits on commas that are not inside parentheses (`a in (x,y),b` is two requirements).
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

const LABEL_FORMS: &str =
    "accepted forms: key=value, key==value, key!=value, key in (a,b), key notin (a,b), key, !key";

fn parse_label_req(part: &str) -> Result<LabelReq, String> {
    let bad = || format!("invalid label selector requirement {part:?}: {LABEL_FORMS}");
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key)
            .then(|| LabelReq::NotExists(key.into()))
            .ok_or_else(bad);
    }
    if let Some(open) = part.find('(') {
        let close = part
            .rfind(')')
            .filter(|&c| c == part.len() - 1)
            .ok_or_else(bad)?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let values: Vec<String> = part[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        return match head.as_slice() {
            [key, "in"] if valid_key(key) => Ok(LabelReq::In((*key).into(), values)),
            [key, "notin"] if valid_key(key) => Ok(LabelReq::NotIn((*key).into(), values)),
            _ => Err(bad()),
        };
    }
    let (key, value, negate) = if let Some((k, v)) = part.split_once("!=") {
        (k, v, true)
    } else if let Some((k, v)) = part.split_once("==") {
        (k, v, false)
    } else if let Some((k, v)) = part.split_once('=') {
        (k, v, false)
    } else {
        let key = part.trim();
        return valid_key(key)
            .then(|| LabelReq::Exists(key.into()))
            .ok_or_else(bad);
    };
    let (key, value) = (key.trim(), value.trim());
    if !valid_key(key) || value.contains(['=', '!', ' ']) {
        return Err(bad());
    }
    Ok(if negate {
        LabelReq::NotEq(key.into(), value.into())
    } else {
        LabelReq::Eq(key.into(), value.into())
    })
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// A parsed field selector; all terms must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter (`spec.nodeName=n1,status.phase!=Failed`).
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, value, negate) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, true)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v, false)
            } else {
                return Err(format!(
                    "invalid field selector {part:?}: accepted forms: field=value, field==value, field!=value"
                ));
            };
            let path = path.trim();
            if !valid_key(path) {
                return Err(format!(
                    "invalid field selector {part:?}: field path {path:?} is not a dotted path"
                ));
            }
            terms.push((path.to_string(), value.trim().to_string(), negate));
        }
        Ok(Self { terms })
    }

    /// Whether every term holds for `obj`; an absent field compares as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|(path, value, negate)| (field_string(obj, path) == *value) != *negate)
    }
}

/// Label and field selectors of one request together.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// The `labelSelector` parameter.
    pub labels: LabelSelector,
    /// The `fieldSelector` parameter.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether `obj` passes both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "labels": labels}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_operators() {
        let p = pod(json!({"app": "web", "tier": "fe"}));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web,db)",
            "app notin (db)",
            "tier",
            "!missing",
            "app=web,tier in (fe, be)",
            "",
        ];
        for sel in yes {
            assert!(LabelSelector::parse(sel).unwrap().matches(&p), "{sel}");
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web,db)",
            "missing",
            "!app",
        ];
        for sel in no {
            assert!(!LabelSelector::parse(sel).unwrap().matches(&p), "{sel}");
        }
        assert!(
            LabelSelector::parse("missing notin (x)")
                .unwrap()
                .matches(&p)
        );
    }

    #[test]
    fn label_parse_errors_name_forms() {
        for sel in ["app in web", "a b", "=v", "a in (x"] {
            let err = LabelSelector::parse(sel).expect_err(sel);
            assert!(err.contains("accepted forms"), "{err}");
        }
    }

    #[test]
    fn field_selectors() {
        let p = pod(json!({}));
        assert!(
            FieldSelector::parse("spec.nodeName=n1")
                .unwrap()
                .matches(&p)
        );
        assert!(
            FieldSelector::parse("metadata.name==p,status.phase!=Failed")
                .unwrap()
                .matches(&p)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=n2")
                .unwrap()
                .matches(&p)
        );
        assert!(
            FieldSelector::parse("spec.schedulerName=")
                .unwrap()
                .matches(&p)
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
