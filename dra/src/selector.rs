//! CEL device selectors in the DRA environment.
//!
//! An expression sees one variable, `device`, with
//! - `device.driver`: the driver's name;
//! - `device.attributes[domain][id]`: ints, bools, strings, and versions as semvers (attribute
//!   names without a domain are in the driver's domain); a domain the device does not have is
//!   an empty map, so `has(device.attributes["other.vendor"].x)` is false rather than an error;
//! - `device.capacity[domain][id]`: quantities (`quantity` values of the Kubernetes library);
//! - `device.allowMultipleAllocations`: a bool.
//!
//! The Kubernetes CEL libraries (quantity, semver, strings, lists, regex, ...) come from
//! `kube-cel`. [`SelectorCache`] compiles each expression once (keyed by its text) and evaluates
//! it once per device and pool generation (memoised); the allocator asks it before searching,
//! never inside the search. A runtime error or a non-bool result is a [`SelectorError`] naming
//! the expression and the device.
//!
//! An unknown domain is recognised as a string literal of the expression: a domain computed
//! at run time (`device.attributes[x + ".com"]`) that the device lacks is a "no such key" error
//! instead of an empty map. Upstream's CEL cost limit is not applied; work per evaluation is
//! bounded by the expression's size (CEL has no unbounded loops).

use std::collections::HashMap;
use std::sync::Arc;

use kube_cel::KubeCelExt;
use kube_cel::cel::objects::{Key, Map};
use kube_cel::cel::{Context, Program, Value};
use rustc_hash::FxHashMap;

use crate::api::{Device, DeviceAttribute};
use crate::pools::{DeviceId, PoolDevice};

/// A selector that could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The expression does not parse.
    #[error("CEL expression `{expression}` does not compile: {message}")]
    Compile {
        /// The expression.
        expression: String,
        /// The parser's message.
        message: String,
    },
    /// The expression failed on a device, or did not return a bool.
    #[error("CEL expression `{expression}` on device {device}: {message}")]
    Runtime {
        /// The expression.
        expression: String,
        /// The device.
        device: DeviceId,
        /// What went wrong.
        message: String,
    },
}

/// One compiled expression.
struct Compiled {
    program: Result<Program, String>,
    /// String literals of the expression: the domains it may look up.
    literals: Vec<String>,
}

/// Compiled selectors and their results per device, kept across scheduling cycles.
///
/// Memory is bounded by expressions × devices: a device's entry is replaced when its pool
/// generation changes. Call [`SelectorCache::retain_devices`] to drop devices that are gone.
pub struct SelectorCache {
    root: Context<'static>,
    to_quantity: Program,
    to_semver: Program,
    expressions: FxHashMap<String, usize>,
    compiled: Vec<Compiled>,
    /// Per device, for its current generation: its `device` value and each expression's result.
    devices: FxHashMap<DeviceId, DeviceMemo>,
}

/// What is known about one device at one pool generation.
struct DeviceMemo {
    generation: i64,
    value: Result<DeviceValue, String>,
    results: FxHashMap<usize, Result<bool, SelectorError>>,
}

/// The `device` variable's parts, built once per device and generation.
#[derive(Clone)]
struct DeviceValue {
    driver: Value,
    attributes: HashMap<Key, Value>,
    capacity: HashMap<Key, Value>,
    allow_multiple: Value,
}

impl Default for SelectorCache {
    fn default() -> Self {
        SelectorCache::new()
    }
}

impl SelectorCache {
    /// An empty cache with the Kubernetes CEL libraries registered.
    pub fn new() -> SelectorCache {
        // Both programs are literals of this file: failing to parse them is a bug caught by
        // every test that evaluates a selector.
        let compile = |text| Program::compile(text).unwrap_or_else(|e| unreachable!("{text}: {e}"));
        SelectorCache {
            root: Context::default().with_all(),
            to_quantity: compile("quantity(text)"),
            to_semver: compile("semver(text)"),
            expressions: FxHashMap::default(),
            compiled: Vec::new(),
            devices: FxHashMap::default(),
        }
    }

    /// Compiles `expression` unless it already was; a parse error is reported every time.
    pub fn compile(&mut self, expression: &str) -> Result<(), SelectorError> {
        let index = self.index(expression);
        match &self.compiled[index].program {
            Ok(_) => Ok(()),
            Err(message) => Err(SelectorError::Compile {
                expression: expression.to_owned(),
                message: message.clone(),
            }),
        }
    }

    fn index(&mut self, expression: &str) -> usize {
        if let Some(&index) = self.expressions.get(expression) {
            return index;
        }
        let index = self.compiled.len();
        self.compiled.push(Compiled {
            program: Program::compile(expression).map_err(|e| e.to_string()),
            literals: string_literals(expression),
        });
        self.expressions.insert(expression.to_owned(), index);
        index
    }

    /// Whether `device` satisfies `expression`, evaluated at most once per device generation.
    pub fn matches(
        &mut self,
        expression: &str,
        device: &PoolDevice<'_>,
    ) -> Result<bool, SelectorError> {
        let index = self.index(expression);
        let memo = match self.devices.get_mut(&device.id) {
            Some(memo) if memo.generation == device.generation => memo,
            _ => {
                let value = device_value(
                    &self.root,
                    &self.to_quantity,
                    &self.to_semver,
                    &device.id,
                    device.device,
                );
                let memo = DeviceMemo {
                    generation: device.generation,
                    value,
                    results: FxHashMap::default(),
                };
                self.devices.insert(device.id.clone(), memo);
                // Just inserted.
                self.devices
                    .get_mut(&device.id)
                    .unwrap_or_else(|| unreachable!())
            }
        };
        if let Some(result) = memo.results.get(&index) {
            return result.clone();
        }
        let result = evaluate(
            &self.root,
            &self.compiled[index],
            &memo.value,
            expression,
            device,
        );
        memo.results.insert(index, result.clone());
        result
    }

    /// Forgets devices for which `keep` is false (their pools are gone).
    pub fn retain_devices(&mut self, mut keep: impl FnMut(&DeviceId) -> bool) {
        self.devices.retain(|id, _| keep(id));
    }

    /// How many (expression, device) results are memoised.
    pub fn memoised(&self) -> usize {
        self.devices.values().map(|m| m.results.len()).sum()
    }
}

fn evaluate(
    root: &Context<'static>,
    compiled: &Compiled,
    value: &Result<DeviceValue, String>,
    expression: &str,
    device: &PoolDevice<'_>,
) -> Result<bool, SelectorError> {
    let runtime = |message: String| SelectorError::Runtime {
        expression: expression.to_owned(),
        device: device.id.clone(),
        message,
    };
    let program = match &compiled.program {
        Ok(program) => program,
        Err(message) => {
            return Err(SelectorError::Compile {
                expression: expression.to_owned(),
                message: message.clone(),
            });
        }
    };
    let mut value = value.clone().map_err(runtime)?;
    for literal in &compiled.literals {
        let key = Key::from(literal.as_str());
        value
            .attributes
            .entry(key.clone())
            .or_insert_with(empty_map);
        value.capacity.entry(key).or_insert_with(empty_map);
    }
    let mut scope = root.new_inner_scope();
    let fields: HashMap<Key, Value> = [
        (Key::from("driver"), value.driver),
        (Key::from("attributes"), map(value.attributes)),
        (Key::from("capacity"), map(value.capacity)),
        (Key::from("allowMultipleAllocations"), value.allow_multiple),
    ]
    .into();
    scope.add_variable_from_value("device", map(fields));
    match program.execute(&scope) {
        Ok(Value::Bool(result)) => Ok(result),
        Ok(other) => Err(runtime(format!(
            "the expression must return a bool, not {:?}",
            other.type_of()
        ))),
        Err(error) => Err(runtime(error.to_string())),
    }
}

fn map(entries: HashMap<Key, Value>) -> Value {
    Value::Map(Map {
        map: Arc::new(entries),
    })
}

fn empty_map() -> Value {
    map(HashMap::new())
}

/// Splits `domain/id`; a name without a domain is in the driver's.
fn qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

fn device_value(
    root: &Context<'static>,
    to_quantity: &Program,
    to_semver: &Program,
    id: &DeviceId,
    device: &Device,
) -> Result<DeviceValue, String> {
    let convert = |program: &Program, text: &str| {
        let mut scope = root.new_inner_scope();
        scope.add_variable_from_value("text", Value::from(text));
        program.execute(&scope).map_err(|e| e.to_string())
    };
    let mut attributes: HashMap<String, HashMap<Key, Value>> = HashMap::new();
    for (name, attribute) in &device.attributes {
        let (domain, local) = qualified(name, &id.driver);
        let value = match attribute {
            DeviceAttribute::Int(v) => Value::Int(*v),
            DeviceAttribute::Bool(v) => Value::Bool(*v),
            DeviceAttribute::String(v) => Value::from(v.as_str()),
            DeviceAttribute::Version(v) => convert(to_semver, v)
                .map_err(|e| format!("attribute {name:?}: version {v:?}: {e}"))?,
        };
        attributes
            .entry(domain.to_owned())
            .or_default()
            .insert(Key::from(local), value);
    }
    let mut capacity: HashMap<String, HashMap<Key, Value>> = HashMap::new();
    for (name, entry) in &device.capacity {
        let (domain, local) = qualified(name, &id.driver);
        let value = convert(to_quantity, &entry.value.to_string())
            .map_err(|e| format!("capacity {name:?}: {e}"))?;
        capacity
            .entry(domain.to_owned())
            .or_default()
            .insert(Key::from(local), value);
    }
    let nest = |outer: HashMap<String, HashMap<Key, Value>>| {
        outer
            .into_iter()
            .map(|(domain, inner)| (Key::from(domain), map(inner)))
            .collect()
    };
    Ok(DeviceValue {
        driver: Value::from(id.driver.as_str()),
        attributes: nest(attributes),
        capacity: nest(capacity),
        allow_multiple: Value::Bool(device.allow_multiple_allocations.unwrap_or(false)),
    })
}

/// The contents of the expression's quoted string literals (escapes kept as written, which
/// is enough for domain names).
fn string_literals(expression: &str) -> Vec<String> {
    let mut literals = Vec::new();
    let mut chars = expression.chars();
    while let Some(c) = chars.next() {
        if c != '"' && c != '\'' {
            continue;
        }
        let mut literal = String::new();
        let mut escaped = false;
        for next in chars.by_ref() {
            if escaped {
                literal.push(next);
                escaped = false;
            } else if next == '\\' {
                escaped = true;
            } else if next == c {
                break;
            } else {
                literal.push(next);
            }
        }
        literals.push(literal);
    }
    literals.sort();
    literals.dedup();
    literals
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DeviceCapacity, from_json};
    use crate::quantity::Quantity;

    fn gpu() -> Device {
        from_json(
            r#"{"name":"gpu-0","allowMultipleAllocations":true,
              "attributes":{"model":{"string":"H100"},"index":{"int":3},"mig":{"bool":false},
                            "driverVersion":{"version":"550.54.15"},"numa.example.com/node":{"int":1}},
              "capacity":{"memory":{"value":"80Gi"}}}"#,
        )
        .unwrap()
    }

    fn pool_device(device: &Device, generation: i64) -> PoolDevice<'_> {
        PoolDevice {
            id: DeviceId {
                driver: "gpu.example.com".into(),
                pool: "node-1".into(),
                device: device.name.clone(),
            },
            device,
            generation,
        }
    }

    #[test]
    fn dra_environment() {
        let device = gpu();
        let d = pool_device(&device, 1);
        let mut cache = SelectorCache::new();
        for (expression, want) in [
            (r#"device.driver == "gpu.example.com""#, true),
            (
                r#"device.attributes["gpu.example.com"].model == "H100""#,
                true,
            ),
            (r#"device.attributes["gpu.example.com"].index > 2"#, true),
            (r#"device.attributes["gpu.example.com"].mig"#, false),
            (r#"device.attributes["numa.example.com"].node == 1"#, true),
            (
                r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) > 0"#,
                true,
            ),
            (
                r#"device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("100Gi"))"#,
                false,
            ),
            (
                r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.0.0"))"#,
                true,
            ),
            (r#"device.allowMultipleAllocations"#, true),
            (r#"has(device.attributes["other.vendor.com"].model)"#, false),
            (r#"size(device.attributes["other.vendor.com"]) == 0"#, true),
            (
                r#"device.attributes["gpu.example.com"].model.lowerAscii().startsWith("h1")"#,
                true,
            ),
        ] {
            assert_eq!(cache.matches(expression, &d), Ok(want), "{expression}");
        }
    }

    #[test]
    fn runtime_error_names_expression_and_device() {
        let device = gpu();
        let d = pool_device(&device, 1);
        let mut cache = SelectorCache::new();
        let expression = r#"device.attributes["gpu.example.com"].missing == 1"#;
        let err = cache.matches(expression, &d).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(expression) && text.contains("gpu.example.com/node-1/gpu-0"),
            "{text}"
        );
    }

    #[test]
    fn non_bool_is_an_error() {
        let device = gpu();
        let mut cache = SelectorCache::new();
        let err = cache
            .matches(r#"device.driver"#, &pool_device(&device, 1))
            .unwrap_err();
        assert!(err.to_string().contains("must return a bool"), "{err}");
    }

    #[test]
    fn compile_error_is_reported() {
        let mut cache = SelectorCache::new();
        let err = cache.compile("device.driver ==").unwrap_err();
        assert!(matches!(err, SelectorError::Compile { .. }), "{err}");
    }

    #[test]
    fn memoised_per_generation() {
        let mut device = gpu();
        let mut cache = SelectorCache::new();
        let expression = r#"device.attributes["gpu.example.com"].model == "H100""#;
        assert_eq!(
            cache.matches(expression, &pool_device(&device, 1)),
            Ok(true)
        );
        assert_eq!(cache.memoised(), 1);
        device
            .attributes
            .insert("model".into(), DeviceAttribute::String("A100".into()));
        // Same generation: the stored result stands (drivers bump the generation on change).
        assert_eq!(
            cache.matches(expression, &pool_device(&device, 1)),
            Ok(true)
        );
        assert_eq!(
            cache.matches(expression, &pool_device(&device, 2)),
            Ok(false)
        );
        assert_eq!(cache.memoised(), 1);
        cache.retain_devices(|_| false);
        assert_eq!(cache.memoised(), 0);
    }

    #[test]
    fn bad_version_attribute_is_a_runtime_error() {
        let mut device = gpu();
        device.attributes.insert(
            "driverVersion".into(),
            DeviceAttribute::Version("not-a-version".into()),
        );
        device.capacity.insert(
            "cores".into(),
            DeviceCapacity {
                value: Quantity::from_units(1),
                request_policy: None,
            },
        );
        let mut cache = SelectorCache::new();
        let err = cache.matches("true", &pool_device(&device, 1)).unwrap_err();
        assert!(err.to_string().contains("driverVersion"), "{err}");
    }

    #[test]
    fn cache_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<SelectorCache>();
    }
}
