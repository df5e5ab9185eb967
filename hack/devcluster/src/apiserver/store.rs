//! In-memory object storage with one global resourceVersion counter and a bounded history of
//! changes that watches replay from.
//!
//! Every write happens under one lock, which also assigns the resourceVersion and publishes the
//! change, so watchers see changes in exactly resourceVersion order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::error::ApiError;
use super::events;
use super::meta::{self, meta_str, metadata_mut};
use super::resources::{Registry, ResourceType, Special};
use super::selectors::Selectors;

/// Namespaces that exist from the start, as on a fresh cluster.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Deleted.
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change, as watchers receive it.
#[derive(Debug)]
pub struct Change {
    /// resourceVersion assigned by this change.
    pub rv: u64,
    /// Storage key of the resource type (`pods`, `queues.tessera.dev`).
    pub key: String,
    /// Namespace of the object ("" when cluster-scoped).
    pub namespace: String,
    /// Added, modified or deleted.
    pub kind: ChangeKind,
    /// The object before the change (modifications only), for selector transitions.
    pub old: Option<Value>,
    /// The object after the change (the last state for deletions).
    pub object: Value,
}

/// Where a new watch starts.
pub struct WatchStart {
    /// Current objects to send as ADDED first (watch from "now").
    pub initial: Vec<Value>,
    /// Retained changes after the requested resourceVersion (resumed watch).
    pub replay: Vec<Arc<Change>>,
    /// The resourceVersion up to which `initial`/`replay` cover; live changes at or below it
    /// are skipped.
    pub covered_rv: u64,
    /// Live changes.
    pub live: broadcast::Receiver<Arc<Change>>,
}

type ObjectKey = (String, String);

struct State {
    registry: Registry,
    rv: u64,
    objects: HashMap<String, BTreeMap<ObjectKey, Value>>,
    log: VecDeque<Arc<Change>>,
    history: usize,
    /// Highest resourceVersion whose change was dropped from `log`.
    compacted_through: u64,
}

/// The object store.
pub struct Store {
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
}

/// Preconditions a delete may carry (`DeleteOptions.preconditions`).
#[derive(Debug, Default, Clone)]
pub struct Preconditions {
    /// Required uid.
    pub uid: Option<String>,
    /// Required resourceVersion.
    pub resource_version: Option<String>,
}

impl Store {
    /// An empty store with the initial namespaces, retaining `history` changes for watch
    /// resumption (older resourceVersions get 410 Gone).
    pub fn new(history: usize) -> Self {
        let (changes, _) = broadcast::channel(history.clamp(1024, 65536));
        let store = Self {
            state: Mutex::new(State {
                registry: Registry::new(),
                rv: 0,
                objects: HashMap::new(),
                log: VecDeque::new(),
                history: history.max(1),
                compacted_through: 0,
            }),
            changes,
        };
        let namespaces = store.lookup("", "v1", "namespaces");
        for ns in INITIAL_NAMESPACES {
            if let Some(rt) = &namespaces {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                // Cannot fail: the store is empty and the names are distinct.
                let _ = store.create(rt, "", obj);
            }
        }
        store
    }

    /// The resource type served at `group/version/plural`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.state.lock().registry.lookup(group, version, plural)
    }

    /// A copy of the registry, for discovery.
    pub fn registry(&self) -> Registry {
        self.state.lock().registry.clone()
    }

    /// The latest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.state.lock().rv
    }

    /// One object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        let state = self.state.lock();
        state
            .objects
            .get(&rt.key())
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    /// Objects matching `selectors` in `ns` (all namespaces when `None`), and the list's
    /// resourceVersion.
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        selectors: &Selectors,
    ) -> (Vec<Value>, u64) {
        let state = self.state.lock();
        let items = state
            .objects
            .get(&rt.key())
            .map(|m| {
                m.iter()
                    .filter(|((obj_ns, _), _)| ns.is_none_or(|ns| ns == obj_ns))
                    .map(|(_, v)| v)
                    .filter(|v| selectors.matches(v))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (items, state.rv)
    }

    /// Creates `obj` in `ns` ("" for cluster-scoped types), assigning name (from generateName),
    /// uid, creationTimestamp, generation and resourceVersion.
    pub fn create(&self, rt: &ResourceType, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
        let mut state = self.state.lock();
        let key = rt.key();
        if rt.namespaced {
            let ns_key = (String::new(), ns.to_string());
            let ns_exists = state
                .objects
                .get("namespaces")
                .is_some_and(|m| m.contains_key(&ns_key));
            if !ns_exists {
                return Err(ApiError::not_found("", "namespaces", ns));
            }
        }
        let md = metadata_mut(&mut obj);
        let mut name = md
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let prefix = md.get("generateName").and_then(Value::as_str).unwrap_or("");
            if prefix.is_empty() {
                return Err(ApiError::invalid(format!(
                    "{} is invalid: metadata.name: Required value: name or generateName is required",
                    rt.kind
                )));
            }
            let existing = state.objects.get(&key);
            name = loop {
                let candidate = meta::generate_name(prefix);
                if !existing.is_some_and(|m| m.contains_key(&(ns.to_string(), candidate.clone()))) {
                    break candidate;
                }
            };
        }
        md.insert("name".into(), Value::String(name.clone()));
        if rt.namespaced {
            md.insert("namespace".into(), Value::String(ns.to_string()));
        } else {
            md.remove("namespace");
        }
        md.insert("uid".into(), Value::String(meta::new_uid()));
        md.insert(
            "creationTimestamp".into(),
            Value::String(meta::now_rfc3339()),
        );
        md.insert("generation".into(), json!(1));
        md.remove("deletionTimestamp");
        let obj_key = (ns.to_string(), name.clone());
        if state
            .objects
            .get(&key)
            .is_some_and(|m| m.contains_key(&obj_key))
        {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        match rt.special {
            Special::Crd => {
                state.registry.register_crd(&obj).map_err(|e| {
                    ApiError::invalid(format!("CustomResourceDefinition {name:?} is invalid: {e}"))
                })?;
                set_crd_status(&mut obj);
            }
            Special::Namespace => {
                meta::ensure_map(&mut obj).insert("status".into(), json!({"phase": "Active"}));
            }
            _ => {}
        }
        Ok(state.commit(&self.changes, key, obj_key, ChangeKind::Added, None, obj))
    }

    /// Read-modify-write of one object: `change` gets the current object and returns the new one.
    /// A non-empty `metadata.resourceVersion` in the result must equal the current one (409
    /// otherwise); identity fields are kept; a result equal to the current object is a no-op.
    pub fn update(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let mut state = self.state.lock();
        let key = rt.key();
        let obj_key = (ns.to_string(), name.to_string());
        let current = state
            .objects
            .get(&key)
            .and_then(|m| m.get(&obj_key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let mut next = change(&current)?;
        let current_rv = meta_str(&current, "resourceVersion").to_string();
        let asked_rv = meta_str(&next, "resourceVersion");
        if !asked_rv.is_empty() && asked_rv != current_rv {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let body_name = meta_str(&next, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let spec_changed = meta::spec_part(&current) != meta::spec_part(&next);
        let md = metadata_mut(&mut next);
        for identity in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
        ] {
            match current.get("metadata").and_then(|m| m.get(identity)) {
                Some(v) => md.insert(identity.into(), v.clone()),
                None => md.remove(identity),
            };
        }
        md.insert("resourceVersion".into(), Value::String(current_rv));
        md.insert(
            "generation".into(),
            json!(if spec_changed {
                generation + 1
            } else {
                generation
            }),
        );
        if next == current {
            return Ok(current);
        }
        let finalizers_left = next
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if next.pointer("/metadata/deletionTimestamp").is_some() && !finalizers_left {
            state.commit(
                &self.changes,
                key.clone(),
                obj_key.clone(),
                ChangeKind::Modified,
                Some(current),
                next,
            );
            return Ok(state.purge(&self.changes, rt, &key, &obj_key));
        }
        if rt.special == Special::Crd {
            state.registry.register_crd(&next).map_err(|e| {
                ApiError::invalid(format!("CustomResourceDefinition {name:?} is invalid: {e}"))
            })?;
            set_crd_status(&mut next);
        }
        Ok(state.commit(
            &self.changes,
            key,
            obj_key,
            ChangeKind::Modified,
            Some(current),
            next,
        ))
    }

    /// Deletes one object (immediately: no graceful deletion or finalizers). Deleting a CRD
    /// deletes its custom resources; deleting a namespace deletes its contents.
    pub fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        pre: &Preconditions,
    ) -> Result<Value, ApiError> {
        let mut state = self.state.lock();
        let key = rt.key();
        let obj_key = (ns.to_string(), name.to_string());
        let current = state
            .objects
            .get(&key)
            .and_then(|m| m.get(&obj_key))
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let failed = |what: &str, want: &str, have: &str| {
            ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!("Precondition failed: {what}: {want}, {what} in object meta: {have}"),
            )
        };
        if let Some(uid) = &pre.uid
            && uid != meta_str(current, "uid")
        {
            return Err(failed("UID", uid, meta_str(current, "uid")));
        }
        if let Some(rv) = &pre.resource_version
            && rv != meta_str(current, "resourceVersion")
        {
            return Err(failed(
                "ResourceVersion",
                rv,
                meta_str(current, "resourceVersion"),
            ));
        }
        let has_finalizers = current
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            // Deletion waits for the finalizers' owners, as upstream: mark and keep.
            if current.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(current.clone());
            }
            let old = current.clone();
            let mut marked = current.clone();
            let md = metadata_mut(&mut marked);
            md.insert("deletionTimestamp".into(), json!(meta::now_rfc3339()));
            md.insert("deletionGracePeriodSeconds".into(), json!(0));
            return Ok(state.commit(
                &self.changes,
                key,
                obj_key,
                ChangeKind::Modified,
                Some(old),
                marked,
            ));
        }
        Ok(state.purge(&self.changes, rt, &key, &obj_key))
    }

    /// Starts a watch of `key` objects in `ns` (all when `None`): from now (`from` = `None`,
    /// initial ADDED events for current objects) or resuming after resourceVersion `from`.
    /// Fails with 410 Gone when `from` is older than the retained history.
    pub fn watch(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, ApiError> {
        let state = self.state.lock();
        let key = rt.key();
        // Subscribing under the lock means no change can fall between snapshot and live stream.
        let live = self.changes.subscribe();
        let in_scope = |obj_ns: &str| ns.is_none_or(|ns| ns == obj_ns);
        match from {
            None => {
                let initial = state
                    .objects
                    .get(&key)
                    .map(|m| {
                        m.iter()
                            .filter(|((obj_ns, _), _)| in_scope(obj_ns))
                            .map(|(_, v)| v.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(WatchStart {
                    initial,
                    replay: Vec::new(),
                    covered_rv: state.rv,
                    live,
                })
            }
            Some(rv) if rv < state.compacted_through => Err(ApiError::gone(format!(
                "too old resource version: {rv} ({})",
                state.compacted_through
            ))),
            // A version this server never issued (e.g. from before a restart): make the client
            // relist instead of silently skipping changes until the counter catches up.
            Some(rv) if rv > state.rv => Err(ApiError::gone(format!(
                "too large resource version: {rv}, current: {}",
                state.rv
            ))),
            Some(rv) => {
                let replay = state
                    .log
                    .iter()
                    .filter(|c| c.rv > rv && c.key == key && in_scope(&c.namespace))
                    .cloned()
                    .collect();
                Ok(WatchStart {
                    initial: Vec::new(),
                    replay,
                    covered_rv: state.rv.max(rv),
                    live,
                })
            }
        }
    }
}

impl State {
    /// Assigns the next resourceVersion, stores (or, for deletions, drops) the object, records
    /// the change and publishes it.
    fn commit(
        &mut self,
        changes: &broadcast::Sender<Arc<Change>>,
        key: String,
        obj_key: ObjectKey,
        kind: ChangeKind,
        old: Option<Value>,
        mut object: Value,
    ) -> Value {
        self.rv += 1;
        let rv = self.rv;
        metadata_mut(&mut object).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let objects = self.objects.entry(key.clone()).or_default();
        if kind == ChangeKind::Deleted {
            objects.remove(&obj_key);
        } else {
            objects.insert(obj_key.clone(), object.clone());
        }
        let change_key = key.clone();
        let change = Arc::new(Change {
            rv,
            key,
            namespace: obj_key.0.clone(),
            kind,
            old,
            object: object.clone(),
        });
        self.log.push_back(change.clone());
        while self.log.len() > self.history {
            if let Some(dropped) = self.log.pop_front() {
                self.compacted_through = dropped.rv;
            }
        }
        // No receivers is normal (nobody watching).
        let _ = changes.send(change);
        if change_key == events::NEW_EVENTS_KEY {
            self.mirror_event(changes, &obj_key, kind, &object);
        }
        object
    }

    /// Keeps the core/v1 twin of an `events.k8s.io/v1` Event in step with it.
    fn mirror_event(
        &mut self,
        changes: &broadcast::Sender<Arc<Change>>,
        obj_key: &ObjectKey,
        kind: ChangeKind,
        object: &Value,
    ) {
        let core_key = events::CORE_EVENTS_KEY.to_string();
        let existing = self
            .objects
            .get(&core_key)
            .and_then(|m| m.get(obj_key))
            .cloned();
        match (kind, existing) {
            (ChangeKind::Deleted, Some(_)) => {
                self.remove(changes, &core_key, obj_key);
            }
            (ChangeKind::Deleted, None) => {}
            (_, existing) => {
                let core = events::to_core(object);
                let change = if existing.is_some() {
                    ChangeKind::Modified
                } else {
                    ChangeKind::Added
                };
                self.commit(changes, core_key, obj_key.clone(), change, existing, core);
            }
        }
    }

    /// Removes an object for good, with the cascades of its kind: a CRD takes its custom
    /// resources along, a namespace its contents.
    fn purge(
        &mut self,
        changes: &broadcast::Sender<Arc<Change>>,
        rt: &ResourceType,
        key: &str,
        obj_key: &ObjectKey,
    ) -> Value {
        let removed = self.remove(changes, key, obj_key);
        match rt.special {
            Special::Crd => {
                if let Some(custom) = self.registry.unregister_crd(&removed) {
                    self.remove_all(changes, &custom.key(), |_| true);
                }
            }
            Special::Namespace => {
                let keys: Vec<String> = self.objects.keys().cloned().collect();
                for k in keys {
                    let namespaced = self.registry.by_key(&k).is_some_and(|t| t.namespaced);
                    if namespaced {
                        self.remove_all(changes, &k, |(obj_ns, _)| *obj_ns == obj_key.1);
                    }
                }
            }
            _ => {}
        }
        removed
    }

    fn remove(
        &mut self,
        changes: &broadcast::Sender<Arc<Change>>,
        key: &str,
        obj_key: &ObjectKey,
    ) -> Value {
        let object = self
            .objects
            .get(key)
            .and_then(|m| m.get(obj_key))
            .cloned()
            .unwrap_or(Value::Null);
        self.commit(
            changes,
            key.to_string(),
            obj_key.clone(),
            ChangeKind::Deleted,
            None,
            object,
        )
    }

    fn remove_all(
        &mut self,
        changes: &broadcast::Sender<Arc<Change>>,
        key: &str,
        which: impl Fn(&ObjectKey) -> bool,
    ) {
        let doomed: Vec<ObjectKey> = self
            .objects
            .get(key)
            .map(|m| m.keys().filter(|k| which(k)).cloned().collect())
            .unwrap_or_default();
        for obj_key in doomed {
            self.remove(changes, key, &obj_key);
        }
    }
}

/// Marks a CRD accepted and established, as the apiextensions controller would right away.
fn set_crd_status(crd: &mut Value) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(Value::Null);
    let now = meta::now_rfc3339();
    let condition = |t: &str, reason: &str| json!({"type": t, "status": "True", "reason": reason, "message": "", "lastTransitionTime": now});
    let versions: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    meta::ensure_map(crd).insert(
        "status".into(),
        json!({
            "acceptedNames": names,
            "conditions": [condition("NamesAccepted", "NoConflicts"), condition("Established", "InitialNamesAccepted")],
            "storedVersions": versions,
        }),
    );
}
