//! Host ports, as kube-scheduler's NodePorts plugin compares them.

use crate::model::{HostPort, Pod, Snapshot};

fn protocol(p: &HostPort) -> &str {
    if p.protocol.is_empty() {
        "TCP"
    } else {
        &p.protocol
    }
}

fn wildcard(ip: &str) -> bool {
    ip.is_empty() || ip == "0.0.0.0"
}

/// Whether two host ports collide: same protocol and port, and the same address or either
/// bound to every address.
pub fn collide(a: &HostPort, b: &HostPort) -> bool {
    a.port != 0
        && a.port == b.port
        && protocol(a) == protocol(b)
        && (a.ip == b.ip || wildcard(&a.ip) || wildcard(&b.ip))
}

/// Whether `pod` wants a host port that one of `others` (pods on the node) holds.
pub fn conflict(snap: &Snapshot, pod: &Pod, others: &[u32]) -> bool {
    let want = &pod.constraints.host_ports;
    if want.is_empty() {
        return false;
    }
    others.iter().any(|&q| {
        let held = &snap.pods[q as usize].constraints.host_ports;
        want.iter().any(|w| held.iter().any(|h| collide(w, h)))
    })
}
