//! The subset of `resource.k8s.io/v1` the allocator reads, as plain serde types.
//!
//! Field names follow the API's JSON (camelCase), and unknown fields are ignored, so the
//! coordinator can feed the objects it watches through `serde_json` (use [`from_json`] or
//! [`from_value`]: their errors name the offending field's path). Fields the allocator does not
//! read (opaque driver config, status conditions, binding conditions' details) are left out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::quantity::Quantity;

/// Parses one API object from JSON text; an error names the field's path (`spec.devices[0]...`).
pub fn from_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, DecodeError> {
    let deserializer = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(deserializer).map_err(DecodeError::from)
}

/// Converts an already-parsed JSON value (a kube object) into an API type; an error names the
/// field's path.
pub fn from_value<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(value).map_err(DecodeError::from)
}

/// A field of an API object that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("field `{path}`: {message}")]
pub struct DecodeError {
    /// Where in the object, as `spec.devices[2].capacity.memory.value`.
    pub path: String,
    /// What was wrong there, with the accepted form.
    pub message: String,
}

impl From<serde_path_to_error::Error<serde_json::Error>> for DecodeError {
    fn from(error: serde_path_to_error::Error<serde_json::Error>) -> Self {
        DecodeError {
            path: error.path().to_string(),
            message: error.inner().to_string(),
        }
    }
}

/// The part of `metadata` the allocator uses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    /// The object's name.
    pub name: String,
    /// Its namespace (claims only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Its UID.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// A `ResourceSlice`: some or all devices of one pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceSlice {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// The slice's content.
    pub spec: ResourceSliceSpec,
}

/// `ResourceSlice.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceSliceSpec {
    /// The driver that publishes the devices.
    pub driver: String,
    /// The pool the slice belongs to.
    pub pool: ResourcePool,
    /// The one node whose devices these are.
    pub node_name: Option<String>,
    /// The nodes that can reach these devices.
    pub node_selector: Option<NodeSelector>,
    /// The devices are reachable from every node.
    pub all_nodes: Option<bool>,
    /// Each device says which nodes reach it.
    pub per_device_node_selection: Option<bool>,
    /// The devices.
    pub devices: Vec<Device>,
    /// Counter sets that partitionable devices of this pool draw on.
    pub shared_counters: Vec<CounterSet>,
}

/// `ResourceSlice.spec.pool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourcePool {
    /// The pool's name, unique per driver.
    pub name: String,
    /// Bumped by the driver on every change; only the highest generation counts.
    pub generation: i64,
    /// How many slices the pool has at this generation.
    pub resource_slice_count: i64,
}

/// One device of a slice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Device {
    /// Unique within the pool.
    pub name: String,
    /// Attributes, by (optionally domain-qualified) name.
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Capacities, by (optionally domain-qualified) name.
    pub capacity: BTreeMap<String, DeviceCapacity>,
    /// Shared counters this device draws on while allocated (partitionable devices).
    pub consumes_counters: Vec<DeviceCounterConsumption>,
    /// With `perDeviceNodeSelection`: the one node.
    pub node_name: Option<String>,
    /// With `perDeviceNodeSelection`: the nodes.
    pub node_selector: Option<NodeSelector>,
    /// With `perDeviceNodeSelection`: every node.
    pub all_nodes: Option<bool>,
    /// Taints; a request must tolerate NoSchedule and NoExecute ones.
    pub taints: Vec<DeviceTaint>,
    /// The device can be allocated to several claims at once (consumable capacity).
    pub allow_multiple_allocations: Option<bool>,
    /// Conditions the device must reach before binding.
    pub binding_conditions: Option<Vec<String>>,
}

/// One attribute value: exactly one of int, bool, string or version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawAttribute", into = "RawAttribute")]
pub enum DeviceAttribute {
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// `version`: a semantic version string.
    Version(String),
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct RawAttribute {
    #[serde(skip_serializing_if = "Option::is_none")]
    int: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bool: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    string: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

impl TryFrom<RawAttribute> for DeviceAttribute {
    type Error = String;

    fn try_from(raw: RawAttribute) -> Result<Self, String> {
        match (raw.int, raw.bool, raw.string, raw.version) {
            (Some(v), None, None, None) => Ok(DeviceAttribute::Int(v)),
            (None, Some(v), None, None) => Ok(DeviceAttribute::Bool(v)),
            (None, None, Some(v), None) => Ok(DeviceAttribute::String(v)),
            (None, None, None, Some(v)) => Ok(DeviceAttribute::Version(v)),
            _ => Err(
                "an attribute must set exactly one of `int`, `bool`, `string` or `version`"
                    .to_owned(),
            ),
        }
    }
}

impl From<DeviceAttribute> for RawAttribute {
    fn from(value: DeviceAttribute) -> Self {
        let mut raw = RawAttribute::default();
        match value {
            DeviceAttribute::Int(v) => raw.int = Some(v),
            DeviceAttribute::Bool(v) => raw.bool = Some(v),
            DeviceAttribute::String(v) => raw.string = Some(v),
            DeviceAttribute::Version(v) => raw.version = Some(v),
        }
        raw
    }
}

/// One capacity of a device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceCapacity {
    /// The total.
    pub value: Quantity,
    /// How requests for a share of it are rounded and limited.
    pub request_policy: Option<CapacityRequestPolicy>,
}

/// `DeviceCapacity.requestPolicy`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CapacityRequestPolicy {
    /// Consumed when the request names no amount (else the whole capacity).
    pub default: Option<Quantity>,
    /// Requests round up to the next of these (ascending).
    pub valid_values: Vec<Quantity>,
    /// Requests round up to `min + k·step`, at most `max`.
    pub valid_range: Option<CapacityRequestPolicyRange>,
}

/// `CapacityRequestPolicy.validRange`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CapacityRequestPolicyRange {
    /// The least amount consumed.
    pub min: Option<Quantity>,
    /// The most that may be requested.
    pub max: Option<Quantity>,
    /// The granularity above `min`.
    pub step: Option<Quantity>,
}

/// A named set of counters in a pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CounterSet {
    /// Unique within the pool.
    pub name: String,
    /// The counters and their totals.
    pub counters: BTreeMap<String, Counter>,
}

/// One counter value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Counter {
    /// The amount.
    pub value: Quantity,
}

/// What a partitionable device draws from one counter set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceCounterConsumption {
    /// The counter set's name.
    pub counter_set: String,
    /// The amounts drawn.
    pub counters: BTreeMap<String, Counter>,
}

/// A device taint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceTaint {
    /// The taint's key.
    pub key: String,
    /// Its value.
    pub value: Option<String>,
    /// `NoSchedule`, `NoExecute` or `None`.
    pub effect: String,
}

/// A request's toleration of device taints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceToleration {
    /// The taint key; empty with `Exists` tolerates every key.
    pub key: String,
    /// `Exists` or `Equal` (the default).
    pub operator: Option<String>,
    /// The value to match with `Equal`.
    pub value: Option<String>,
    /// The effect tolerated; empty tolerates all.
    pub effect: Option<String>,
    /// How long a NoExecute taint is tolerated (not used for allocation).
    pub toleration_seconds: Option<i64>,
}

impl DeviceToleration {
    /// Whether this toleration tolerates `taint` (Kubernetes' `ToleratesTaint`).
    pub fn tolerates(&self, taint: &DeviceTaint) -> bool {
        if let Some(effect) = self.effect.as_deref().filter(|e| !e.is_empty())
            && effect != taint.effect
        {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        match self.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            "Equal" | "" => {
                self.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            _ => false,
        }
    }
}

/// A node selector (`core/v1 NodeSelector`): the terms are ORed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSelector {
    /// The terms.
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// One term: all its requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSelectorTerm {
    /// Requirements on node labels.
    pub match_expressions: Vec<NodeSelectorRequirement>,
    /// Requirements on node fields (only `metadata.name`).
    pub match_fields: Vec<NodeSelectorRequirement>,
}

/// One requirement.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSelectorRequirement {
    /// The label key or field path.
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt` or `Lt`.
    pub operator: String,
    /// The operands.
    pub values: Vec<String>,
}

/// A `DeviceClass`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceClass {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// The class's content.
    pub spec: DeviceClassSpec,
}

/// `DeviceClass.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceClassSpec {
    /// Every device of the class matches all of these.
    pub selectors: Vec<DeviceSelector>,
    /// The extended resource (e.g. `nvidia.com/gpu`) pods may ask for to get this class (KEP-5004).
    pub extended_resource_name: Option<String>,
}

/// A device selector.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceSelector {
    /// A CEL expression (the only kind the API defines).
    pub cel: Option<CelDeviceSelector>,
}

/// `DeviceSelector.cel`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CelDeviceSelector {
    /// The expression; it must evaluate to a bool.
    pub expression: String,
}

/// A `ResourceClaim`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceClaim {
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// What is asked for.
    pub spec: ResourceClaimSpec,
    /// What was allocated.
    pub status: ResourceClaimStatus,
}

/// `ResourceClaim.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceClaimSpec {
    /// The device requests and constraints.
    pub devices: DeviceClaim,
}

/// `ResourceClaim.spec.devices`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceClaim {
    /// The requests, all of which must be satisfied.
    pub requests: Vec<DeviceRequest>,
    /// Constraints across the requests' devices.
    pub constraints: Vec<DeviceConstraint>,
}

/// One request: either `exactly` or a ranked `firstAvailable` list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceRequest {
    /// Unique within the claim.
    pub name: String,
    /// One exact request.
    pub exactly: Option<ExactDeviceRequest>,
    /// Alternatives, tried in order; the first that can be satisfied is used.
    pub first_available: Vec<DeviceSubRequest>,
}

/// How many devices a request wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocationMode {
    /// `count` devices.
    #[default]
    ExactCount,
    /// Every matching device on the node; fails if any pool is incomplete.
    All,
}

/// `DeviceRequest.exactly`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExactDeviceRequest {
    /// The device class.
    pub device_class_name: String,
    /// Extra selectors, ANDed with the class's.
    pub selectors: Vec<DeviceSelector>,
    /// ExactCount (the default) or All.
    pub allocation_mode: Option<AllocationMode>,
    /// With ExactCount: how many (default 1).
    pub count: Option<i64>,
    /// Monitoring access: does not consume the device.
    pub admin_access: Option<bool>,
    /// Device taints this request tolerates.
    pub tolerations: Vec<DeviceToleration>,
    /// Amounts of consumable capacity wanted from each device.
    pub capacity: Option<CapacityRequirements>,
}

/// One alternative of `firstAvailable`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceSubRequest {
    /// Unique within the request; results name it `request/subrequest`.
    pub name: String,
    /// The device class.
    pub device_class_name: String,
    /// Extra selectors, ANDed with the class's.
    pub selectors: Vec<DeviceSelector>,
    /// ExactCount (the default) or All.
    pub allocation_mode: Option<AllocationMode>,
    /// With ExactCount: how many (default 1).
    pub count: Option<i64>,
    /// Device taints this alternative tolerates.
    pub tolerations: Vec<DeviceToleration>,
    /// Amounts of consumable capacity wanted from each device.
    pub capacity: Option<CapacityRequirements>,
}

/// `capacity` of a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CapacityRequirements {
    /// Amount per capacity name.
    pub requests: BTreeMap<String, Quantity>,
}

/// A constraint across devices of several requests of one claim.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceConstraint {
    /// The requests (or `request/subrequest`s) it covers; empty = all.
    pub requests: Vec<String>,
    /// All covered devices have this attribute, with one value.
    pub match_attribute: Option<String>,
    /// All covered devices have this attribute, with pairwise different values.
    pub distinct_attribute: Option<String>,
}

/// `ResourceClaim.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceClaimStatus {
    /// The allocation, once made.
    pub allocation: Option<AllocationResult>,
}

/// `ResourceClaim.status.allocation`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AllocationResult {
    /// The devices.
    pub devices: DeviceAllocationResult,
    /// Nodes the allocation is usable from.
    pub node_selector: Option<NodeSelector>,
}

/// `AllocationResult.devices`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceAllocationResult {
    /// One entry per allocated device.
    pub results: Vec<DeviceRequestAllocationResult>,
}

/// One allocated device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DeviceRequestAllocationResult {
    /// The request, or `request/subrequest`.
    pub request: String,
    /// The device's driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
    /// Allocated for admin access (not consuming).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
    /// The request's tolerations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<DeviceToleration>,
    /// Identifies this share of a multi-allocatable device.
    #[serde(rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Capacity consumed from a multi-allocatable device.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, Quantity>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_from_api_json() {
        let slice: ResourceSlice = from_json(
            r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",
            "metadata":{"name":"node-1-gpu","uid":"u1"},
            "spec":{"driver":"gpu.example.com","nodeName":"node-1",
              "pool":{"name":"node-1","generation":3,"resourceSliceCount":1},
              "devices":[{"name":"gpu-0",
                 "attributes":{"model":{"string":"H100"},"cc":{"version":"9.0.0"},"index":{"int":0},"mig":{"bool":false}},
                 "capacity":{"memory":{"value":"80Gi","requestPolicy":{"default":"1Gi","validRange":{"min":"1Gi","step":"1Gi"}}}},
                 "allowMultipleAllocations":true,
                 "taints":[{"key":"broken","effect":"NoSchedule"}]}]}}"#,
        )
        .unwrap();
        assert_eq!(slice.spec.pool.resource_slice_count, 1);
        let device = &slice.spec.devices[0];
        assert_eq!(
            device.attributes["cc"],
            DeviceAttribute::Version("9.0.0".into())
        );
        assert_eq!(device.attributes["index"], DeviceAttribute::Int(0));
        assert_eq!(
            device.capacity["memory"].value,
            Quantity::from_units(80 << 30)
        );
        assert_eq!(device.allow_multiple_allocations, Some(true));
        assert_eq!(device.taints[0].effect, "NoSchedule");
    }

    #[test]
    fn bad_quantity_names_the_field() {
        let err = from_json::<ResourceSlice>(
            r#"{"spec":{"devices":[{"name":"a"},{"name":"b","capacity":{"memory":{"value":"12Q"}}}]}}"#,
        )
        .unwrap_err();
        assert_eq!(err.path, "spec.devices[1].capacity.memory.value");
        assert!(err.to_string().contains("Kubernetes quantity"), "{err}");
    }

    #[test]
    fn attribute_needs_exactly_one_value() {
        let err = from_json::<Device>(r#"{"attributes":{"x":{"int":1,"bool":true}}}"#).unwrap_err();
        assert!(err.path.starts_with("attributes.x"), "{err}");
        assert!(err.message.contains("exactly one"), "{err}");
    }

    #[test]
    fn claim_from_api_json() {
        let claim: ResourceClaim = from_json(
            r#"{"metadata":{"name":"c","namespace":"ns","uid":"u"},
            "spec":{"devices":{"requests":[
              {"name":"gpu","exactly":{"deviceClassName":"gpu.example.com","allocationMode":"ExactCount","count":2,
                "tolerations":[{"operator":"Exists"}],"capacity":{"requests":{"memory":"10Gi"}}}},
              {"name":"alt","firstAvailable":[{"name":"big","deviceClassName":"c","selectors":[{"cel":{"expression":"true"}}]},
                                             {"name":"small","deviceClassName":"c","allocationMode":"All"}]}],
              "constraints":[{"requests":["gpu"],"matchAttribute":"gpu.example.com/model"}]}},
            "status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"d","pool":"p","device":"x","shareID":"s1","consumedCapacity":{"memory":"10Gi"}}]}}}}"#,
        )
        .unwrap();
        let exact = claim.spec.devices.requests[0].exactly.as_ref().unwrap();
        assert_eq!(exact.count, Some(2));
        assert_eq!(
            claim.spec.devices.requests[1].first_available[1].allocation_mode,
            Some(AllocationMode::All)
        );
        let result = &claim.status.allocation.as_ref().unwrap().devices.results[0];
        assert_eq!(result.share_id.as_deref(), Some("s1"));
        assert_eq!(
            result.consumed_capacity["memory"],
            Quantity::from_units(10 << 30)
        );
    }

    #[test]
    fn tolerations_follow_kubernetes() {
        let taint = DeviceTaint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoSchedule".into(),
        };
        let tol = |key: &str, op: Option<&str>, value: Option<&str>, effect: Option<&str>| {
            DeviceToleration {
                key: key.into(),
                operator: op.map(Into::into),
                value: value.map(Into::into),
                effect: effect.map(Into::into),
                toleration_seconds: None,
            }
        };
        assert!(tol("", Some("Exists"), None, None).tolerates(&taint));
        assert!(tol("k", None, Some("v"), None).tolerates(&taint));
        assert!(!tol("k", None, Some("w"), None).tolerates(&taint));
        assert!(!tol("k", Some("Exists"), None, Some("NoExecute")).tolerates(&taint));
        assert!(tol("k", Some("Exists"), None, Some("NoSchedule")).tolerates(&taint));
        assert!(!tol("j", Some("Exists"), None, None).tolerates(&taint));
    }
}
