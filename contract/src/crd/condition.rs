//! The status condition shared by the CRDs (the `metav1.Condition` shape).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One observation about an object, as `kubectl describe` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type, e.g. `Valid`, `Scheduled`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable CamelCase reason.
    #[serde(default)]
    pub reason: String,
    /// Human-readable explanation.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The object generation this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Condition type the coordinator sets on Queue, PodGroup and Topology objects after validating
/// them: `False` with the problems in the message when the object is malformed.
pub const VALID: &str = "Valid";
