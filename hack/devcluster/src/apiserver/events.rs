//! `events.k8s.io/v1` Events seen as core/v1 Events.
//!
//! The real server keeps one storage for both groups; here every write of an
//! `events.k8s.io/v1` Event is mirrored into a core Event of the same name, so `kubectl
//! describe` shows what controllers record through the newer API (kube-runtime's `Recorder`).

use serde_json::{Map, Value, json};

/// Storage key of `events.k8s.io` Events.
pub const NEW_EVENTS_KEY: &str = "events.events.k8s.io";
/// Storage key of core Events.
pub const CORE_EVENTS_KEY: &str = "events";

/// The core/v1 form of an `events.k8s.io/v1` Event.
pub fn to_core(event: &Value) -> Value {
    let get = |path: &str| event.pointer(path).cloned();
    let mut core = Map::new();
    core.insert("apiVersion".into(), json!("v1"));
    core.insert("kind".into(), json!("Event"));
    let mut metadata = event.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Some(md) = metadata.as_object_mut() {
        md.remove("resourceVersion");
    }
    core.insert("metadata".into(), metadata);
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(v) = value.filter(|v| !v.is_null()) {
            core.insert(key.into(), v);
        }
    };
    put("involvedObject", get("/regarding"));
    put("related", get("/related"));
    put("message", get("/note"));
    put("reason", get("/reason"));
    put("type", get("/type"));
    put("action", get("/action"));
    put("eventTime", get("/eventTime"));
    put("reportingComponent", get("/reportingController"));
    put("reportingInstance", get("/reportingInstance"));
    put(
        "source",
        get("/reportingController")
            .map(|c| json!({"component": c, "host": get("/reportingInstance")})),
    );
    let first = get("/deprecatedFirstTimestamp").or_else(|| get("/eventTime"));
    let last = get("/series/lastObservedTime")
        .or_else(|| get("/deprecatedLastTimestamp"))
        .or_else(|| get("/eventTime"));
    put("firstTimestamp", first);
    put("lastTimestamp", last);
    put(
        "count",
        get("/series/count")
            .or_else(|| get("/deprecatedCount"))
            .or(Some(json!(1))),
    );
    Value::Object(core)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_fields_describe_reads() {
        let ev = json!({
            "metadata": {"name": "e1", "namespace": "ml", "resourceVersion": "9"},
            "regarding": {"kind": "Pod", "name": "p", "namespace": "ml"},
            "note": "no GPU fits", "reason": "Unschedulable", "type": "Warning",
            "reportingController": "tessera", "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
        });
        let core = to_core(&ev);
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "no GPU fits");
        assert_eq!(core["source"]["component"], "tessera");
        assert_eq!(core["count"], 3);
        assert_eq!(core["lastTimestamp"], "2026-01-01T00:01:00.000000Z");
        assert!(core["metadata"].get("resourceVersion").is_none());
    }
}
