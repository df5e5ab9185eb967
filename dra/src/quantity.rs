//! Kubernetes resource quantities (`"80Gi"`, `"500m"`, `"1e3"`), parsed exactly.
//!
//! k8s-openapi keeps a quantity as its string; the allocator needs to add, compare and round
//! them, so this module parses the API's grammar into an exact count of nano-units (the finest
//! precision Kubernetes keeps: finer input is rounded up, away from zero, as
//! `resource.ParseQuantity` does). Binary suffixes are exact integers, so `1Gi` is exactly
//! 1073741824 units.

use std::fmt;
use std::str::FromStr;

/// Nano-units in one unit.
const NANO: i128 = 1_000_000_000;

/// The accepted form, repeated in every parse error.
const FORM: &str = "a Kubernetes quantity: an optional sign, a decimal number, then one of the suffixes \
     n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent e<int>/E<int> (e.g. 80Gi, 500m, 1.5, 1e3)";

/// An exact Kubernetes quantity.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    /// The value in nano-units (10⁻⁹); i128 holds every quantity up to about 10²⁹.
    nano: i128,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not {FORM}: {problem}")]
pub struct QuantityError {
    /// The rejected input.
    pub input: String,
    /// What was wrong with it.
    pub problem: &'static str,
}

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity { nano: 0 };

    /// `units` whole units.
    pub const fn from_units(units: i64) -> Quantity {
        Quantity {
            nano: units as i128 * NANO,
        }
    }

    /// `nano` billionths of a unit.
    pub const fn from_nano(nano: i128) -> Quantity {
        Quantity { nano }
    }

    /// `milli` thousandths of a unit.
    pub const fn from_milli(milli: i64) -> Quantity {
        Quantity {
            nano: milli as i128 * 1_000_000,
        }
    }

    /// The value in nano-units.
    pub const fn nano(self) -> i128 {
        self.nano
    }

    /// The value in thousandths when it is exactly that, as `MilliValue` round-trips.
    pub fn milli_exact(self) -> Option<i128> {
        (self.nano % 1_000_000 == 0).then_some(self.nano / 1_000_000)
    }

    /// The value in whole units, rounded up (Kubernetes' `Quantity.Value()`).
    pub fn ceil_units(self) -> i128 {
        let units = self.nano.div_euclid(NANO);
        if self.nano.rem_euclid(NANO) == 0 {
            units
        } else {
            units + 1
        }
    }

    /// `self + other`, saturating (no real quantity comes near the limit).
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            nano: self.nano.saturating_add(other.nano),
        }
    }

    /// `self - other`, saturating.
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            nano: self.nano.saturating_sub(other.nano),
        }
    }

    /// Whether the value is below zero.
    pub fn is_negative(self) -> bool {
        self.nano < 0
    }

    /// Parses the Kubernetes quantity grammar exactly.
    pub fn parse(input: &str) -> Result<Quantity, QuantityError> {
        let fail = |problem| QuantityError {
            input: input.to_owned(),
            problem,
        };
        let bytes = input.as_bytes();
        let mut at = 0;
        let negative = match bytes.first() {
            Some(b'-') => {
                at = 1;
                true
            }
            Some(b'+') => {
                at = 1;
                false
            }
            Some(_) => false,
            None => return Err(fail("it is empty")),
        };
        let mut mantissa: i128 = 0;
        let mut digits = 0usize;
        let mut fraction_digits = 0u32;
        let mut seen_point = false;
        while at < bytes.len() {
            match bytes[at] {
                b'0'..=b'9' => {
                    digits += 1;
                    if digits > 30 {
                        return Err(fail("too many digits"));
                    }
                    mantissa = mantissa * 10 + i128::from(bytes[at] - b'0');
                    if seen_point {
                        fraction_digits += 1;
                    }
                }
                b'.' if !seen_point => seen_point = true,
                _ => break,
            }
            at += 1;
        }
        if digits == 0 {
            return Err(fail("it has no digits"));
        }
        let (binary_power, decimal_power) =
            suffix(&input[at..]).ok_or_else(|| fail("unknown suffix"))?;
        // value = mantissa * 1024^binary_power * 10^decimal_power / 10^fraction_digits, in nano-units.
        let mut numerator = mantissa;
        for _ in 0..binary_power {
            numerator = numerator
                .checked_mul(1024)
                .ok_or_else(|| fail("too large"))?;
        }
        let exponent = i64::from(decimal_power) + 9 - i64::from(fraction_digits);
        let nano = if exponent >= 0 {
            let scale = 10i128
                .checked_pow(u32::try_from(exponent).map_err(|_| fail("too large"))?)
                .ok_or_else(|| fail("too large"))?;
            numerator
                .checked_mul(scale)
                .ok_or_else(|| fail("too large"))?
        } else {
            match 10i128.checked_pow(u32::try_from(-exponent).map_err(|_| fail("too small"))?) {
                // Finer than nano: round up (away from zero, applied to the magnitude here).
                Some(scale) => numerator / scale + i128::from(numerator % scale != 0),
                None => i128::from(numerator != 0),
            }
        };
        Ok(Quantity {
            nano: if negative { -nano } else { nano },
        })
    }
}

/// The suffix as (powers of 1024, powers of 10), or `None` when it is not one.
fn suffix(text: &str) -> Option<(u32, i32)> {
    Some(match text {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (1, 0),
        "Mi" => (2, 0),
        "Gi" => (3, 0),
        "Ti" => (4, 0),
        "Pi" => (5, 0),
        "Ei" => (6, 0),
        _ => {
            let exponent = text.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            (0, exponent.parse().ok()?)
        }
    })
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// Writes the exact value in the coarsest of units, m, u or n that holds it, so the text
/// parses back to the same quantity.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nano;
        if n % NANO == 0 {
            write!(f, "{}", n / NANO)
        } else if n % 1_000_000 == 0 {
            write!(f, "{}m", n / 1_000_000)
        } else if n % 1_000 == 0 {
            write!(f, "{}u", n / 1_000)
        } else {
            write!(f, "{n}n")
        }
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quantity({self})")
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Accepts the API's string form and, as the apiserver does, a bare JSON number.
impl<'de> serde::Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(FORM)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Quantity::parse(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::from_units(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Quantity::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Quantity::parse(&v.to_string()).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn suffixes_are_exact() {
        assert_eq!(q("1Gi").ceil_units(), 1 << 30);
        assert_eq!(q("80Gi").ceil_units(), 80 << 30);
        assert_eq!(q("1.5Gi").ceil_units(), 3 << 29);
        assert_eq!(q("500m"), Quantity::from_milli(500));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E3"), q("1k"));
        assert_eq!(q("2E"), q("2e18"));
        assert_eq!(q("1e-3"), q("1m"));
        assert_eq!(q("-1.5"), Quantity::from_milli(-1500));
        assert_eq!(q("+7"), Quantity::from_units(7));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("1n").nano(), 1);
    }

    #[test]
    fn finer_than_nano_rounds_up() {
        assert_eq!(q("0.1n").nano(), 1);
        assert_eq!(q("1.0000000001").nano(), 1_000_000_001);
        assert_eq!(q("-0.1n").nano(), -1);
    }

    #[test]
    fn rounding_helpers() {
        assert_eq!(q("1500m").ceil_units(), 2);
        assert_eq!(q("1500m").milli_exact(), Some(1500));
        assert_eq!(q("1u").milli_exact(), None);
        assert_eq!(q("-1500m").ceil_units(), -1);
    }

    #[test]
    fn bad_input_names_the_form() {
        for bad in [
            "", "Gi", "1Q", "1.2.3", "1e", "1ee3", "--1", "1 Gi", "1gi", "1e99999",
        ] {
            let err = Quantity::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains("Kubernetes quantity"),
                "{bad}: {err}"
            );
        }
        assert!(Quantity::parse("1e40").is_err());
    }

    #[test]
    fn json_accepts_strings_and_numbers() {
        let v: Vec<Quantity> = serde_json::from_str(r#"["4Gi", 3, 0.5]"#).unwrap();
        assert_eq!(v, vec![q("4Gi"), q("3"), q("500m")]);
        assert_eq!(serde_json::to_string(&q("1.5")).unwrap(), r#""1500m""#);
    }

    proptest! {
        #[test]
        fn display_round_trips(nano in -(1i128 << 90)..(1i128 << 90)) {
            let quantity = Quantity { nano };
            prop_assert_eq!(q(&quantity.to_string()), quantity);
        }

        #[test]
        fn binary_suffix_is_power_of_1024(n in 0i64..1_000_000, power in 0usize..4) {
            let suffixes = ["", "Ki", "Mi", "Gi"];
            let expected = i128::from(n) << (10 * power);
            prop_assert_eq!(q(&format!("{n}{}", suffixes[power])).ceil_units(), expected);
        }

        #[test]
        fn order_matches_the_numbers(a in -1_000_000i64..1_000_000, b in -1_000_000i64..1_000_000) {
            prop_assert_eq!(Quantity::from_milli(a).cmp(&Quantity::from_milli(b)), a.cmp(&b));
        }
    }
}
