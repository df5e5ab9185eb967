//! Structured logs: `tracing` events as human-readable text or as one JSON object per
//! line (`{"timestamp","level","target","message","fields","spans"}`) for log collectors.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber writing to stderr, filtered by `RUST_LOG` (default
/// `info`). Fails if a subscriber is already installed.
pub fn init(format: LogFormat) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.event_format(JsonFormat).try_init(),
    }
}

/// Formats each event as one JSON object.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonFormat;

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writeln!(writer, "{}", event_json(event, ctx))
    }
}

fn event_json<S, N>(event: &Event<'_>, ctx: &FmtContext<'_, S, N>) -> Value
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let meta = event.metadata();
    let mut fields = JsonFields::default();
    event.record(&mut fields);
    let mut line = Map::new();
    line.insert(
        "timestamp".into(),
        Value::String(jiff::Timestamp::now().to_string()),
    );
    line.insert("level".into(), Value::String(meta.level().to_string()));
    line.insert("target".into(), Value::String(meta.target().to_owned()));
    if let Some(message) = fields.0.remove("message") {
        line.insert("message".into(), message);
    }
    if !fields.0.is_empty() {
        line.insert("fields".into(), Value::Object(fields.0));
    }
    if let Some(scope) = ctx.event_scope() {
        let spans: Vec<Value> = scope
            .from_root()
            .map(|span| Value::String(span.name().to_owned()))
            .collect();
        line.insert("spans".into(), Value::Array(spans));
    }
    Value::Object(line)
}

/// Collects an event's fields as JSON values.
#[derive(Default)]
struct JsonFields(Map<String, Value>);

impl Visit for JsonFields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::String(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use parking_lot::Mutex;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_level_message_fields_and_spans() {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .event_format(JsonFormat)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("cycle");
            let _guard = span.enter();
            tracing::warn!(node = "node-a", gpus = 4u64, "agent connected");
        });
        let text = String::from_utf8(buffer.0.lock().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "agent connected");
        assert_eq!(line["fields"]["node"], "node-a");
        assert_eq!(line["fields"]["gpus"], 4);
        assert_eq!(line["spans"][0], "cycle");
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
