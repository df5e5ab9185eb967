//! Taints and tolerations, with kube-scheduler's matching rules.

use crate::model::{Taint, TaintEffect, Toleration, TolerationOp};

/// The taint key a cordoned node is treated as carrying (`spec.unschedulable`).
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Whether toleration `t` tolerates `taint`: an unset effect matches every effect, an empty key
/// every key; `Exists` ignores the value, `Equal` compares it.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect.is_some_and(|e| e != taint.effect) {
        return false;
    }
    if !t.key.is_empty() && t.key != taint.key {
        return false;
    }
    match t.operator {
        TolerationOp::Exists => true,
        TolerationOp::Equal => t.value == taint.value,
    }
}

/// Whether any of `tolerations` tolerates `taint`.
pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// The first NoSchedule/NoExecute taint no toleration tolerates.
pub fn first_untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        matches!(t.effect, TaintEffect::NoSchedule | TaintEffect::NoExecute)
            && !tolerated(tolerations, t)
    })
}

/// PreferNoSchedule taints not tolerated (the taint score counts them).
pub fn untolerated_soft(taints: &[Taint], tolerations: &[Toleration]) -> usize {
    taints
        .iter()
        .filter(|t| t.effect == TaintEffect::PreferNoSchedule && !tolerated(tolerations, t))
        .count()
}

/// Whether the pod may land on a cordoned node: it tolerates
/// `node.kubernetes.io/unschedulable:NoSchedule`.
pub fn tolerates_cordon(tolerations: &[Toleration]) -> bool {
    tolerated(
        tolerations,
        &Taint {
            key: UNSCHEDULABLE_TAINT.to_string(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        },
    )
}

/// `{key: value}`, as kube-scheduler names an untolerated taint.
pub fn describe(t: &Taint) -> String {
    format!("{{{}: {}}}", t.key, t.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: TaintEffect) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect,
        }
    }

    fn tol(key: &str, op: TolerationOp, value: &str, effect: Option<TaintEffect>) -> Toleration {
        Toleration {
            key: key.into(),
            operator: op,
            value: value.into(),
            effect,
        }
    }

    #[test]
    fn matching_rules() {
        let t = taint("gpu", "a100", TaintEffect::NoSchedule);
        let cases = [
            (tol("gpu", TolerationOp::Equal, "a100", None), true),
            (tol("gpu", TolerationOp::Equal, "h100", None), false),
            (tol("gpu", TolerationOp::Exists, "", None), true),
            (
                tol(
                    "gpu",
                    TolerationOp::Exists,
                    "",
                    Some(TaintEffect::NoExecute),
                ),
                false,
            ),
            (tol("", TolerationOp::Exists, "", None), true),
            (tol("other", TolerationOp::Exists, "", None), false),
            // An empty key with Equal compares values across all keys, as Kubernetes does.
            (tol("", TolerationOp::Equal, "a100", None), true),
        ];
        for (x, want) in cases {
            assert_eq!(tolerates(&x, &t), want, "{x:?}");
        }
    }

    #[test]
    fn soft_taints_do_not_filter() {
        let ts = [
            taint("a", "", TaintEffect::PreferNoSchedule),
            taint("b", "x", TaintEffect::NoExecute),
        ];
        assert_eq!(
            first_untolerated(&ts, &[]).map(|t| t.key.as_str()),
            Some("b")
        );
        assert_eq!(untolerated_soft(&ts, &[]), 1);
        assert_eq!(describe(&ts[1]), "{b: x}");
        assert!(!tolerates_cordon(&[]));
        assert!(tolerates_cordon(&[tol("", TolerationOp::Exists, "", None)]));
    }
}
