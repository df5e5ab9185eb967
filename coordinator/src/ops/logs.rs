//! Structured logs: `tracing` events as human-readable text, or as one JSON object per line
//! for log collectors, in tracing-subscriber's JSON layout:
//! `{"timestamp","level","fields":{"message",...},"target","spans":[{"name",...}]}`.

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
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;
    use serde_json::Value;

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
        // The same layout `init(LogFormat::Json)` installs.
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("cycle");
            let _guard = span.enter();
            tracing::warn!(node = "node-a", gpus = 4u64, "agent connected");
        });
        let text = String::from_utf8(buffer.0.lock().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["fields"]["message"], "agent connected");
        assert_eq!(line["fields"]["node"], "node-a");
        assert_eq!(line["fields"]["gpus"], 4);
        assert_eq!(line["spans"][0]["name"], "cycle");
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
