//! The values of the GPU share annotations users write (`tessera.dev/gpu-fraction`,
//! `tessera.dev/gpu-memory` and their aliases), read the one way both the coordinator's
//! translation and `kubectl tessera why` read them.

use crate::quantity::{self, Round};

/// A decimal in (0, 1] as milli-GPU; `None` when it is not one (or rounds to 0).
pub fn parse_fraction(text: &str) -> Option<u32> {
    let t = text.trim();
    if t.is_empty() || !t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let p = quantity::parse(t).ok()?;
    let milli = p.milli(Round::Down)?;
    // Keep the precision the accounting has (milli); a finer share would round to nothing.
    (1..=1000).contains(&milli).then_some(milli as u32)
}

/// GPU memory in MiB from a quantity (`10Gi`, `4096Mi`) or a plain whole number of MiB.
pub fn parse_gpu_memory(text: &str) -> Result<u64, &'static str> {
    let t = text.trim();
    let mib = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        t.parse::<u64>().map_err(|_| "is too large")?
    } else {
        let p = quantity::parse(t).map_err(|_| "is not a memory amount")?;
        if p.is_negative() {
            return Err("is negative");
        }
        let v = p.mib(Round::Up).ok_or("is too large")?;
        u64::try_from(v).map_err(|_| "is negative")?
    };
    if mib == 0 {
        return Err("is zero");
    }
    Ok(mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_and_memory_amounts() {
        for (text, want) in [
            ("0.25", Some(250)),
            ("1", Some(1000)),
            ("0.0001", None),
            ("1.5", None),
            ("-0.5", None),
            ("abc", None),
            ("", None),
        ] {
            assert_eq!(parse_fraction(text), want, "{text:?}");
        }
        for (text, want) in [
            ("4096", Ok(4096)),
            ("10Gi", Ok(10240)),
            ("1.5Gi", Ok(1536)),
            ("0", Err("is zero")),
            ("-1Gi", Err("is negative")),
            ("lots", Err("is not a memory amount")),
        ] {
            assert_eq!(parse_gpu_memory(text), want, "{text:?}");
        }
    }
}
