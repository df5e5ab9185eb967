//! Consumable capacity: how much of a device's capacity a request consumes, and whether it
//! fits, following the request policies (`default`, `validRange` with `min`/`max`/`step`,
//! `validValues`) as upstream's `consumable_capacity.go` does with fractional ranges on
//! (steps in thousandths when every bound is a whole number of thousandths).

use std::collections::BTreeMap;

use crate::api::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements, DeviceCapacity,
};
use crate::quantity::Quantity;

/// A request whose rounding cannot be represented.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("capacity {name:?}: {problem}")]
pub struct CapacityError {
    /// The capacity's name.
    pub name: String,
    /// What could not be computed.
    pub problem: String,
}

/// What one request consumes of one capacity: the requested amount rounded up by the policy,
/// or the policy's default (else the whole capacity) when the request names none.
pub(crate) fn consumed_for(
    requested: Option<Quantity>,
    capacity: &DeviceCapacity,
) -> Result<Quantity, String> {
    let Some(requested) = requested else {
        return Ok(capacity
            .request_policy
            .as_ref()
            .and_then(|p| p.default)
            .unwrap_or(capacity.value));
    };
    let Some(policy) = &capacity.request_policy else {
        return Ok(requested);
    };
    match &policy.valid_range {
        Some(range) if range.min.is_some() => round_up_range(requested, range),
        _ => Ok(policy
            .valid_values
            .iter()
            .find(|v| requested <= **v)
            .copied()
            .unwrap_or(requested)),
    }
}

/// Whether steps are counted in thousandths: every bound is a whole number of them and the
/// step at least one.
fn use_milli(range: &CapacityRequestPolicyRange) -> bool {
    [range.min, range.max, range.step]
        .iter()
        .flatten()
        .all(|q| q.milli_exact().is_some())
        && range
            .step
            .and_then(Quantity::milli_exact)
            .is_none_or(|s| s >= 1)
}

fn round_up_range(
    requested: Quantity,
    range: &CapacityRequestPolicyRange,
) -> Result<Quantity, String> {
    let min = range.min.unwrap_or(Quantity::ZERO);
    if requested < min {
        return Ok(min);
    }
    let Some(step) = range.step else {
        return Ok(requested);
    };
    let (requested_n, min_n, step_n, to_quantity): (i128, i128, i128, fn(i128) -> i128) =
        if use_milli(range) {
            let Some(requested_m) = requested.milli_exact() else {
                return Err(format!(
                    "request {requested} is not a whole number of thousandths"
                ));
            };
            // `use_milli` proved the bounds exact.
            let exact = |q: Quantity| q.milli_exact().unwrap_or_default();
            (requested_m, exact(min), exact(step), |m| m * 1_000_000)
        } else {
            (
                requested.ceil_units(),
                min.ceil_units(),
                step.ceil_units(),
                |u| u * 1_000_000_000,
            )
        };
    if step_n <= 0 {
        return Err(format!("step {step} is not positive"));
    }
    let added = requested_n - min_n;
    let steps = added / step_n + i128::from(added % step_n != 0);
    let value = steps
        .checked_mul(step_n)
        .and_then(|v| v.checked_add(min_n))
        .filter(|v| *v <= i128::from(i64::MAX))
        .ok_or_else(|| {
            format!(
                "rounding request {requested} up to the next step leaves the representable range"
            )
        })?;
    Ok(Quantity::from_nano(to_quantity(value)))
}

/// Whether an amount breaks the policy (outside the range, off a step, not a valid value).
pub(crate) fn violates_policy(consumed: Quantity, policy: Option<&CapacityRequestPolicy>) -> bool {
    let Some(policy) = policy else { return false };
    if policy.default == Some(consumed) {
        return false;
    }
    if let Some(range) = &policy.valid_range {
        if range.max.is_some_and(|max| consumed > max) {
            return true;
        }
        if let Some(step) = range.step {
            let min = range.min.unwrap_or(Quantity::ZERO);
            let (value, min, step) = if use_milli(range) {
                let Some(value) = consumed.milli_exact() else {
                    return true;
                };
                (
                    value,
                    min.milli_exact().unwrap_or_default(),
                    step.milli_exact().unwrap_or_default(),
                )
            } else {
                (consumed.ceil_units(), min.ceil_units(), step.ceil_units())
            };
            return step == 0 || (value - min) % step != 0;
        }
        return false;
    }
    !policy.valid_values.is_empty() && !policy.valid_values.contains(&consumed)
}

/// What a request consumes of every capacity of a device.
pub(crate) fn consumption(
    request: Option<&CapacityRequirements>,
    capacities: &BTreeMap<String, DeviceCapacity>,
) -> Result<BTreeMap<String, Quantity>, CapacityError> {
    capacities
        .iter()
        .map(|(name, capacity)| {
            let requested = request.and_then(|r| r.requests.get(name)).copied();
            let consumed = consumed_for(requested, capacity).map_err(|problem| CapacityError {
                name: name.clone(),
                problem,
            })?;
            if consumed.is_negative() {
                return Err(CapacityError {
                    name: name.clone(),
                    problem: "capacity value is negative".to_owned(),
                });
            }
            Ok((name.clone(), consumed))
        })
        .collect()
}

/// Whether the request fits the device given what is already consumed (`used`, the sum over
/// the device's current shares): every requested capacity exists, every amount meets its
/// policy, and no total exceeds the capacity.
pub(crate) fn fits(
    request: Option<&CapacityRequirements>,
    capacities: &BTreeMap<String, DeviceCapacity>,
    used: Option<&BTreeMap<String, Quantity>>,
) -> Result<bool, CapacityError> {
    if let Some(request) = request
        && request
            .requests
            .keys()
            .any(|name| !capacities.contains_key(name))
    {
        return Ok(false);
    }
    let consumed = consumption(request, capacities)?;
    for (name, capacity) in capacities {
        let amount = consumed[name];
        if violates_policy(amount, capacity.request_policy.as_ref()) {
            return Ok(false);
        }
        let already = used
            .and_then(|u| u.get(name))
            .copied()
            .unwrap_or(Quantity::ZERO);
        if already.saturating_add(amount) > capacity.value {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn cap(value: &str, policy: Option<CapacityRequestPolicy>) -> DeviceCapacity {
        DeviceCapacity {
            value: q(value),
            request_policy: policy,
        }
    }

    fn range(min: &str, max: Option<&str>, step: Option<&str>) -> CapacityRequestPolicy {
        CapacityRequestPolicy {
            default: Some(q(min)),
            valid_values: vec![],
            valid_range: Some(CapacityRequestPolicyRange {
                min: Some(q(min)),
                max: max.map(q),
                step: step.map(q),
            }),
        }
    }

    #[test]
    fn default_and_whole_capacity() {
        assert_eq!(consumed_for(None, &cap("80Gi", None)), Ok(q("80Gi")));
        assert_eq!(
            consumed_for(None, &cap("80Gi", Some(range("1Gi", None, None)))),
            Ok(q("1Gi"))
        );
        assert_eq!(
            consumed_for(Some(q("3Gi")), &cap("80Gi", None)),
            Ok(q("3Gi"))
        );
    }

    #[test]
    fn range_rounds_up_to_steps() {
        let c = cap("80Gi", Some(range("1Gi", Some("40Gi"), Some("2Gi"))));
        assert_eq!(consumed_for(Some(q("512Mi")), &c), Ok(q("1Gi")));
        assert_eq!(consumed_for(Some(q("2Gi")), &c), Ok(q("3Gi")));
        assert_eq!(consumed_for(Some(q("3Gi")), &c), Ok(q("3Gi")));
        let policy = c.request_policy.as_ref();
        assert!(!violates_policy(q("3Gi"), policy));
        assert!(violates_policy(q("2Gi"), policy));
        assert!(violates_policy(q("41Gi"), policy));
    }

    #[test]
    fn fractional_steps_use_thousandths() {
        let c = cap("1", Some(range("100m", None, Some("250m"))));
        assert_eq!(consumed_for(Some(q("200m")), &c), Ok(q("350m")));
        assert_eq!(
            consumed_for(Some(q("200u")), &c),
            Ok(q("100m")),
            "below min: min"
        );
        assert!(consumed_for(Some(q("150500u")), &c).is_err());
    }

    #[test]
    fn valid_values_round_up() {
        let policy = CapacityRequestPolicy {
            default: None,
            valid_values: vec![q("10"), q("20"), q("40")],
            valid_range: None,
        };
        let c = cap("40", Some(policy));
        assert_eq!(consumed_for(Some(q("11")), &c), Ok(q("20")));
        assert_eq!(consumed_for(Some(q("41")), &c), Ok(q("41")));
        assert!(violates_policy(q("41"), c.request_policy.as_ref()));
    }

    #[test]
    fn fits_counts_what_is_used() {
        let caps: BTreeMap<String, DeviceCapacity> =
            [("memory".to_owned(), cap("80Gi", None))].into();
        let half = CapacityRequirements {
            requests: [("memory".to_owned(), q("40Gi"))].into(),
        };
        assert_eq!(fits(Some(&half), &caps, None), Ok(true));
        let used: BTreeMap<String, Quantity> = [("memory".to_owned(), q("40Gi"))].into();
        assert_eq!(fits(Some(&half), &caps, Some(&used)), Ok(true));
        let full: BTreeMap<String, Quantity> = [("memory".to_owned(), q("41Gi"))].into();
        assert_eq!(fits(Some(&half), &caps, Some(&full)), Ok(false));
        // No amount named: the whole capacity.
        assert_eq!(fits(None, &caps, Some(&used)), Ok(false));
        let unknown = CapacityRequirements {
            requests: [("cores".to_owned(), q("1"))].into(),
        };
        assert_eq!(fits(Some(&unknown), &caps, None), Ok(false));
    }

    proptest! {
        /// A rounded request is never below what was asked, lands on a step, and is the least
        /// such amount.
        #[test]
        fn range_rounding_is_the_least_valid_amount(min in 0i64..1000, step in 1i64..100, ask in 0i64..5000) {
            let policy = CapacityRequestPolicy {
                default: None,
                valid_values: vec![],
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Some(Quantity::from_milli(min)),
                    max: None,
                    step: Some(Quantity::from_milli(step)),
                }),
            };
            let c = DeviceCapacity { value: Quantity::from_units(1_000_000), request_policy: Some(policy) };
            let got = consumed_for(Some(Quantity::from_milli(ask)), &c).unwrap();
            prop_assert!(got >= Quantity::from_milli(ask));
            prop_assert!(!violates_policy(got, c.request_policy.as_ref()));
            if got > Quantity::from_milli(min) {
                prop_assert!(got.saturating_sub(Quantity::from_milli(step)) < Quantity::from_milli(ask));
            }
        }
    }
}
