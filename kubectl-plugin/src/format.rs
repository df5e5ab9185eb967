//! Text shared by every command: aligned columns, GiB, GPU counts and ages.

use std::fmt::Write as _;

/// Rows under a header, each column as wide as its widest cell, two spaces apart; the last
/// column is not padded (no trailing blanks).
pub(crate) fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let n = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(n) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate().take(n) {
            if i + 1 == n {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = width[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// MiB as GiB with one decimal (`45.0Gi`).
pub(crate) fn gib(mib: u64) -> String {
    format!("{:.1}Gi", mib as f64 / 1024.0)
}

/// A number of GPUs as the status writes it (milli precision), without trailing zeros (`2`,
/// `0.25`, `-` for none given).
pub(crate) fn gpus(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_owned();
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// How long ago `then` was, from `now`, coarsely (`5s`, `3m`, `2h`, `4d`); `-` when unknown.
pub(crate) fn ago(then: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    let Some(then) = then else {
        return "-".to_owned();
    };
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// An RFC 3339 time as the API writes it, if it is one.
pub(crate) fn timestamp(text: Option<&str>) -> Option<jiff::Timestamp> {
    text?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_leave_no_trailing_blanks() {
        let rows = vec![
            vec!["l40s-0".into(), "0".into(), "default/notebook".into()],
            vec![String::new(), "1".into(), String::new()],
        ];
        assert_eq!(
            columns(&["NODE", "GPU", "HELD BY"], &rows),
            "NODE    GPU  HELD BY\nl40s-0  0    default/notebook\n        1\n"
        );
    }

    #[test]
    fn numbers_and_ages() {
        for (v, want) in [
            (2.0, "2"),
            (0.25, "0.25"),
            (0.0, "0"),
            (12.5, "12.5"),
            (-0.0, "0"),
        ] {
            assert_eq!(gpus(v), want);
        }
        assert_eq!(gpus(f64::NAN), "-");
        assert_eq!(gib(46068), "45.0Gi");
        let now: jiff::Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        for (then, want) in [
            ("2026-01-01T11:59:55Z", "5s"),
            ("2026-01-01T11:57:00Z", "3m"),
            ("2026-01-01T09:00:00Z", "3h"),
            ("2025-12-28T12:00:00Z", "4d"),
            ("2026-01-01T12:00:10Z", "0s"),
        ] {
            assert_eq!(ago(timestamp(Some(then)), now), want, "{then}");
        }
        assert_eq!(ago(timestamp(Some("yesterday")), now), "-");
    }
}
