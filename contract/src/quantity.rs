//! Kubernetes quantities (`32`, `500m`, `64Gi`, `1.5`, `1e3`) parsed exactly, without floating
//! point, so `0.1` CPU is 100 milli-cores and not 100.000000001 rounded up to 101.
//!
//! Shared by the coordinator (CRD quantities, pod requests, the GPU share annotations) and
//! `kubectl tessera` (which reads the same fields); its schema (feature `crd`) is the CRDs'.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a malformed quantity looked like and which forms are accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a quantity ({why}); use a number with an optional suffix such as \"32\", \"500m\", \"1.5\", \"64Gi\" or \"4096Mi\""
)]
pub struct QuantityError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Which way to round a quantity that does not fall on a whole unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// Towards positive infinity (requests: never under-account).
    Up,
    /// Towards negative infinity (capacity: never over-promise).
    Down,
}

/// A parsed quantity: `sign * mantissa * 10^exp10 * 2^exp2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

/// Parses a Kubernetes quantity: an optionally signed decimal number, then either a binary
/// suffix (`Ki` `Mi` `Gi` `Ti` `Pi` `Ei`), a decimal suffix (`n` `u` `m` `k` `M` `G` `T` `P` `E`)
/// or a decimal exponent (`e3`, `E-2`).
pub fn parse(text: &str) -> Result<Parsed, QuantityError> {
    let err = |why| QuantityError {
        text: text.to_string(),
        why,
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let (negative, s) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("no digits"));
    }
    if frac_part.contains('.') {
        return Err(err("more than one decimal point"));
    }
    let mut mantissa: u128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        let d = u128::from(c as u8 - b'0');
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(d))
            .ok_or_else(|| err("too many digits"))?;
    }
    let mut exp10 = -(frac_part.len() as i32);
    let mut exp2 = 0u32;
    match suffix {
        "" => {}
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        other if other.starts_with(['e', 'E']) => {
            let e: i32 = other[1..]
                .parse()
                .map_err(|_| err("unknown suffix or exponent"))?;
            if e.abs() > 30 {
                return Err(err("exponent out of range"));
            }
            exp10 += e;
        }
        _ => return Err(err("unknown suffix")),
    }
    Ok(Parsed {
        negative,
        mantissa,
        exp10,
        exp2,
    })
}

impl Parsed {
    /// Whether the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.negative && self.mantissa != 0
    }

    /// The quantity times `mul / div`, rounded as asked; `None` when it does not fit an `i64`.
    pub fn scaled(&self, mul: u128, div: u128, round: Round) -> Option<i64> {
        let mut num = self.mantissa.checked_mul(mul)?;
        num = num.checked_mul(1u128.checked_shl(self.exp2)?)?;
        let mut den = div.max(1);
        let p = 10u128.checked_pow(self.exp10.unsigned_abs())?;
        if self.exp10 >= 0 {
            num = num.checked_mul(p)?;
        } else {
            den = den.checked_mul(p)?;
        }
        let q = num / den;
        let exact = num % den == 0;
        // Rounding up a negative number means truncating its magnitude, and vice versa.
        let away_from_zero = !exact && ((round == Round::Up) != self.negative);
        let mag = i64::try_from(q + u128::from(away_from_zero)).ok()?;
        Some(if self.negative { -mag } else { mag })
    }

    /// In thousandths of the unit (CPU cores → milli-cores).
    pub fn milli(&self, round: Round) -> Option<i64> {
        self.scaled(1000, 1, round)
    }

    /// Bytes → MiB.
    pub fn mib(&self, round: Round) -> Option<i64> {
        self.scaled(1, 1 << 20, round)
    }

    /// As a floating-point number of the unit (for GPU counts and weights).
    pub fn as_f64(&self) -> f64 {
        let v = self.mantissa as f64 * 10f64.powi(self.exp10) * 2f64.powi(self.exp2 as i32);
        if self.negative { -v } else { v }
    }
}

/// A quantity as written in a CRD: an integer or a string (`32`, `"500m"`, `"64Gi"`, `-1`).
/// Kept as text; parsed when translated so a bad value is reported, not rejected on read.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct QuantityValue(pub String);

impl QuantityValue {
    /// Parses the text.
    pub fn parse(&self) -> Result<Parsed, QuantityError> {
        parse(&self.0)
    }
}

impl fmt::Display for QuantityValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for QuantityValue {
    fn from(s: &str) -> Self {
        QuantityValue(s.to_string())
    }
}

impl Serialize for QuantityValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Integers go back out as integers so a round trip keeps `quota: 32` an integer.
        match self.0.parse::<i64>() {
            Ok(n) => s.serialize_i64(n),
            Err(_) => s.serialize_str(&self.0),
        }
    }
}

impl<'de> Deserialize<'de> for QuantityValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Float(f64),
            Text(String),
        }
        Ok(QuantityValue(match Raw::deserialize(d)? {
            Raw::Int(n) => n.to_string(),
            Raw::Float(f) => f.to_string(),
            Raw::Text(t) => t,
        }))
    }
}

#[cfg(feature = "crd")]
impl schemars::JsonSchema for QuantityValue {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "QuantityValue".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // The Kubernetes int-or-string form, as resource quantities are declared in core types.
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "description": "A Kubernetes quantity: an integer or a string such as \"500m\", \"32\" or \"64Gi\"; -1 = no limit where a limit is meant."
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// Formats milli-cores as a quantity (`4`, `1500m`).
pub fn format_milli(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// Formats MiB as a quantity (`64Gi`, `1536Mi`).
pub fn format_mib(mib: u64) -> String {
    if mib != 0 && mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}
