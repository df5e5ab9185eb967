//! How Tessera's two programs log, defined once for both (`tessera-agent run`,
//! `tessera-coordinator run`): `tracing` events on stderr, filtered by `RUST_LOG` (default
//! `info`), as human-readable text or, with `--log-format json`, one JSON object per line in
//! tracing-subscriber's layout (`{"timestamp","level","fields":{"message",...},"target",
//! "spans":[{"name",...}]}`), so one collector parses both programs.
//!
//! Text is coloured only when stderr is a terminal (and `NO_COLOR` is unset): a log written to
//! a file or collected from a container carries no escape codes.

use std::io::IsTerminal;

/// How log lines look (`--log-format`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether text logs get ANSI colours: only on a terminal, and not when `NO_COLOR` is set to
/// anything non-empty (<https://no-color.org>).
pub fn colour(terminal: bool, no_color: Option<&str>) -> bool {
    terminal && no_color.is_none_or(str::is_empty)
}

/// Installs the global subscriber writing to stderr in `format`. Fails if a subscriber is
/// already installed.
pub fn init(format: LogFormat) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = colour(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    }
}

/// Log output kept in memory (feature `testing`): give a clone to a subscriber's
/// `with_writer(move || captured.clone())`, read it back with [`Captured::text`].
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Debug, Default)]
pub struct Captured(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

#[cfg(any(test, feature = "testing"))]
impl Captured {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

#[cfg(any(test, feature = "testing"))]
impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let rows = [
            (true, None, true),
            (false, None, false),
            (true, Some("1"), false),
            (true, Some(""), true),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, want) in rows {
            assert_eq!(colour(terminal, no_color), want, "{terminal} {no_color:?}");
        }
    }

    #[test]
    fn json_lines_carry_level_message_fields_and_spans() {
        let buffer = Captured::default();
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
        let text = buffer.text();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["fields"]["message"], "agent connected");
        assert_eq!(line["fields"]["node"], "node-a");
        assert_eq!(line["fields"]["gpus"], 4);
        assert_eq!(line["spans"][0]["name"], "cycle");
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
