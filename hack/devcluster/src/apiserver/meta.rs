//! Object metadata helpers: timestamps, UIDs, generated names, field access.

use rand::Rng;
use serde_json::{Map, Value};

/// The current time as an RFC 3339 timestamp with second precision, as Kubernetes writes them.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A random RFC 4122 version-4 UID.
pub fn new_uid() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `prefix` plus five random characters from the alphabet the API server uses (no vowels, no
/// look-alike digits) so generated names never spell words.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}

/// `obj.metadata.<field>` as a string, or "" when absent.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Mutable access to `obj.metadata`, creating it (and turning `obj` into a map) when absent.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    ensure_map(ensure_map(obj).entry("metadata").or_insert(Value::Null))
}

/// Turns `v` into an empty map unless it already is one, and returns the map.
pub fn ensure_map(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(map) => map,
        // Proven unreachable: `v` was made an object just above.
        _ => unreachable!("value was just made an object"),
    }
}

/// Looks up a dotted field path (`spec.nodeName`) in `obj`.
pub fn field<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(obj, |v, key| v.get(key))
}

/// A field value rendered the way field selectors compare it: strings as-is, scalars as JSON,
/// absent as "".
pub fn field_string(obj: &Value, path: &str) -> String {
    match field(obj, path) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Parses a resourceVersion string; "" means none.
pub fn parse_rv(rv: &str) -> Result<Option<u64>, String> {
    if rv.is_empty() {
        return Ok(None);
    }
    rv.parse::<u64>().map(Some).map_err(|_| {
        format!("resourceVersion {rv:?} is invalid: expected a decimal number as returned by this server")
    })
}

/// Everything of `obj` except `metadata` and `status`: the part whose change bumps generation.
pub fn spec_part(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "kind" | "apiVersion")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_has_v4_shape() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4");
    }

    #[test]
    fn timestamp_is_rfc3339_seconds() {
        let ts = now_rfc3339();
        assert_eq!(ts.len(), 20, "{ts}");
        assert!(ts.ends_with('Z'));
    }

    #[test]
    fn field_string_renders_scalars() {
        let obj = serde_json::json!({"spec": {"nodeName": "n1", "replicas": 3}});
        assert_eq!(field_string(&obj, "spec.nodeName"), "n1");
        assert_eq!(field_string(&obj, "spec.replicas"), "3");
        assert_eq!(field_string(&obj, "status.phase"), "");
    }
}
