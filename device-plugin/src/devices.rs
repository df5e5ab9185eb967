//! The advertised device list and its change feed.
//!
//! A `tokio::sync::watch` channel holds the current list: a change is one store plus
//! one wake-up of every receiver, so all open `ListAndWatch` streams see it at once,
//! and a slow stream skips intermediate lists instead of queueing them (the kubelet
//! only needs the latest full list).

use std::sync::Arc;

use tessera_proto::deviceplugin::{HEALTHY, UNHEALTHY, v1beta1 as api};
use tokio::sync::watch;

/// Whether the kubelet may hand a device out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// Usable.
    Healthy,
    /// Must not be handed out; already allocated containers keep it.
    Unhealthy,
}

impl Health {
    /// The string the device-plugin API uses for this state.
    pub fn as_api_str(self) -> &'static str {
        match self {
            Health::Healthy => HEALTHY,
            Health::Unhealthy => UNHEALTHY,
        }
    }
}

/// One advertised device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Id the kubelet will pass back in Allocate (at most 63 characters).
    pub id: String,
    /// Current health.
    pub health: Health,
    /// NUMA node for the kubelet's topology manager, when known.
    pub numa_node: Option<i64>,
}

impl Device {
    /// A healthy device without NUMA information.
    pub fn healthy(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            health: Health::Healthy,
            numa_node: None,
        }
    }

    /// Sets the NUMA node.
    pub fn with_numa_node(mut self, node: i64) -> Self {
        self.numa_node = Some(node);
        self
    }

    /// The wire form sent in `ListAndWatchResponse`.
    pub fn to_api(&self) -> api::Device {
        api::Device {
            id: self.id.clone(),
            health: self.health.as_api_str().to_owned(),
            topology: self.numa_node.map(|id| api::TopologyInfo {
                nodes: vec![api::NumaNode { id }],
            }),
        }
    }
}

/// The publishing side of a device list; cheap to clone, every clone publishes to the
/// same list.
#[derive(Debug, Clone)]
pub struct DeviceList {
    tx: Arc<watch::Sender<Arc<Vec<Device>>>>,
}

impl DeviceList {
    /// A list starting with `devices`.
    pub fn new(devices: Vec<Device>) -> Self {
        let (tx, _rx) = watch::channel(Arc::new(devices));
        Self { tx: Arc::new(tx) }
    }

    /// Replaces the whole list (devices added or removed) and notifies every watcher.
    pub fn replace(&self, devices: Vec<Device>) {
        self.tx.send_replace(Arc::new(devices));
    }

    /// Sets the health of one device; returns false (and notifies nobody) when no
    /// device has that id or its health is already `health`.
    pub fn set_health(&self, id: &str, health: Health) -> bool {
        self.tx
            .send_if_modified(|list| match list.iter().position(|d| d.id == id) {
                Some(i) if list[i].health != health => {
                    Arc::make_mut(list)[i].health = health;
                    true
                }
                _ => false,
            })
    }

    /// Sets the health of every device whose id satisfies `matches` (e.g. all slots
    /// of one GPU) in a single notification; returns how many changed.
    pub fn set_health_where(&self, matches: impl Fn(&str) -> bool, health: Health) -> usize {
        let mut changed = 0;
        self.tx.send_if_modified(|list| {
            let list = Arc::make_mut(list);
            for device in list.iter_mut().filter(|d| matches(&d.id)) {
                if device.health != health {
                    device.health = health;
                    changed += 1;
                }
            }
            changed > 0
        });
        changed
    }

    /// The devices as last published, what the next `ListAndWatch` response carries.
    pub fn snapshot(&self) -> Arc<Vec<Device>> {
        self.tx.borrow().clone()
    }

    /// A receiver that starts at the current list and sees every later change.
    pub fn watch(&self) -> DeviceWatch {
        DeviceWatch {
            rx: self.tx.subscribe(),
        }
    }
}

/// The receiving side of a [`DeviceList`].
#[derive(Debug, Clone)]
pub struct DeviceWatch {
    rx: watch::Receiver<Arc<Vec<Device>>>,
}

impl DeviceWatch {
    /// The current list, marking it as seen.
    pub fn current(&mut self) -> Arc<Vec<Device>> {
        self.rx.borrow_and_update().clone()
    }

    /// The current list without marking it as seen.
    pub fn peek(&self) -> Arc<Vec<Device>> {
        self.rx.borrow().clone()
    }

    /// Waits for the next change and returns the new list; `None` once every
    /// [`DeviceList`] clone is gone (no more changes can come).
    pub async fn changed(&mut self) -> Option<Arc<Vec<Device>>> {
        self.rx.changed().await.ok()?;
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_health_only_notifies_on_a_real_change() {
        let list = DeviceList::new(vec![Device::healthy("a"), Device::healthy("b")]);
        let mut watch = list.watch();
        watch.current();
        assert!(!list.set_health("a", Health::Healthy));
        assert!(!list.set_health("zzz", Health::Unhealthy));
        assert!(!watch.rx.has_changed().unwrap());
        assert!(list.set_health("b", Health::Unhealthy));
        assert!(watch.rx.has_changed().unwrap());
        assert_eq!(watch.current()[1].health, Health::Unhealthy);
    }

    #[test]
    fn set_health_where_changes_all_matches_at_once() {
        let list = DeviceList::new(vec![
            Device::healthy("gpu0-0"),
            Device::healthy("gpu0-1"),
            Device::healthy("gpu1-0"),
        ]);
        assert_eq!(
            list.set_health_where(|id| id.starts_with("gpu0-"), Health::Unhealthy),
            2
        );
        let health: Vec<_> = list.snapshot().iter().map(|d| d.health).collect();
        assert_eq!(
            health,
            [Health::Unhealthy, Health::Unhealthy, Health::Healthy]
        );
    }

    #[test]
    fn api_form_carries_health_string_and_numa() {
        let api = Device::healthy("x").with_numa_node(1).to_api();
        assert_eq!(api.health, "Healthy");
        assert_eq!(api.topology.unwrap().nodes[0].id, 1);
    }
}
