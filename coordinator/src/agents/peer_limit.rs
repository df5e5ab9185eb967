//! Per peer address: how many TokenReviews its streams may still cause, and whether its next
//! refusal is logged at warning level. What keeps a client without credentials from turning
//! each of its streams into a request to the API server, or into a log line.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Peers remembered beyond this count trigger a sweep of those back at a full budget.
const SWEEP_AT: usize = 4096;

/// How often one peer's refusals are logged at warning level (the rest at debug level).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where a stream comes from, as far as limits go: an IPv4 address, or an IPv6 /64 (one
/// host's usual allocation, so it cannot rotate through addresses to get fresh budgets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PeerKey(Option<IpAddr>);

impl PeerKey {
    /// The key of `addr`; `None` (no address known) shares one budget.
    pub(crate) fn of(addr: Option<IpAddr>) -> Self {
        Self(addr.map(|a| match a.to_canonical() {
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
            v4 => v4,
        }))
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(IpAddr::V6(a)) => write!(f, "{a}/64"),
            Some(a) => write!(f, "{a}"),
            None => f.write_str("an unknown address"),
        }
    }
}

/// A peer's budget (a token bucket) and when it was last warned about.
#[derive(Clone, Copy, Debug)]
struct Peer {
    budget: f64,
    at: Instant,
    warned: Option<Instant>,
}

/// Per-peer TokenReview budgets: `per_minute` reviews at once, refilled at `per_minute` a
/// minute. Any sequence of streams from one peer causes at most `per_minute` reviews plus
/// `per_minute` for every minute it goes on.
#[derive(Debug)]
pub(crate) struct PeerLimits {
    per_minute: u32,
    peers: HashMap<PeerKey, Peer>,
}

impl PeerLimits {
    /// Budgets of `per_minute` reviews (at least 1).
    pub(crate) fn new(per_minute: u32) -> Self {
        Self {
            per_minute: per_minute.max(1),
            peers: HashMap::new(),
        }
    }

    fn capacity(&self) -> f64 {
        f64::from(self.per_minute)
    }

    fn refilled(&self, peer: &Peer, now: Instant) -> f64 {
        let minutes = now.saturating_duration_since(peer.at).as_secs_f64() / 60.0;
        (peer.budget + minutes * self.capacity()).min(self.capacity())
    }

    fn peer(&mut self, key: PeerKey, now: Instant) -> &mut Peer {
        if self.peers.len() >= SWEEP_AT && !self.peers.contains_key(&key) {
            let capacity = self.capacity();
            let per_second = capacity / 60.0;
            self.peers.retain(|_, p| {
                let full = p.budget
                    + now.saturating_duration_since(p.at).as_secs_f64() * per_second
                    >= capacity;
                let quiet = p
                    .warned
                    .is_none_or(|w| now.saturating_duration_since(w) >= WARN_EVERY);
                !(full && quiet)
            });
        }
        let capacity = self.capacity();
        self.peers.entry(key).or_insert(Peer {
            budget: capacity,
            at: now,
            warned: None,
        })
    }

    /// Takes one review from `key`'s budget; when it is spent, how long until the next.
    pub(crate) fn take(&mut self, key: PeerKey, now: Instant) -> Result<(), Duration> {
        let per_second = self.capacity() / 60.0;
        let mut peer = *self.peer(key, now);
        peer.budget = self.refilled(&peer, now);
        peer.at = now;
        let outcome = if peer.budget >= 1.0 {
            peer.budget -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - peer.budget) / per_second))
        };
        self.peers.insert(key, peer);
        outcome
    }

    /// True when `key`'s refusals were not logged at warning level within the last minute
    /// (and notes that one is now).
    pub(crate) fn warn(&mut self, key: PeerKey, now: Instant) -> bool {
        let peer = self.peer(key, now);
        let due = peer
            .warned
            .is_none_or(|w| now.saturating_duration_since(w) >= WARN_EVERY);
        if due {
            peer.warned = Some(now);
        }
        due
    }

    /// Peers remembered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> PeerKey {
        PeerKey::of(Some(s.parse().unwrap()))
    }

    #[test]
    fn a_peer_gets_its_burst_then_one_review_per_interval() {
        let mut limits = PeerLimits::new(10);
        let t0 = Instant::now();
        let a = ip("10.0.0.1");
        for _ in 0..10 {
            limits.take(a, t0).unwrap();
        }
        let wait = limits.take(a, t0).unwrap_err();
        assert!(
            wait > Duration::from_secs(5) && wait <= Duration::from_secs(6),
            "{wait:?}"
        );
        // Another peer has its own budget.
        limits.take(ip("10.0.0.2"), t0).unwrap();
        // Six seconds later one more review (10 a minute).
        limits.take(a, t0 + Duration::from_secs(6)).unwrap();
        assert!(limits.take(a, t0 + Duration::from_secs(6)).is_err());
        // Over any stretch, at most the burst plus the rate times its length.
        let mut taken = 0;
        for s in 0..600 {
            if limits
                .take(
                    a,
                    t0 + Duration::from_secs(6) + Duration::from_millis(s * 100),
                )
                .is_ok()
            {
                taken += 1;
            }
        }
        assert!(taken <= 10 + 1, "{taken} reviews in one minute");
    }

    #[test]
    fn ipv6_peers_are_limited_by_their_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(ip("2001:db8::1"), ip("2001:db8::ffff:1"));
        assert_ne!(ip("2001:db8::1"), ip("2001:db8:0:1::1"));
        assert_eq!(ip("::ffff:10.0.0.1"), ip("10.0.0.1"));
        assert_eq!(ip("2001:db8::1").to_string(), "2001:db8::/64");
    }

    #[test]
    fn warnings_are_one_a_minute_per_peer() {
        let mut limits = PeerLimits::new(10);
        let t0 = Instant::now();
        let a = ip("10.0.0.1");
        assert!(limits.warn(a, t0));
        assert!(!limits.warn(a, t0 + Duration::from_secs(59)));
        assert!(limits.warn(ip("10.0.0.2"), t0));
        assert!(limits.warn(a, t0 + Duration::from_secs(60)));
    }

    #[test]
    fn idle_peers_are_forgotten_when_many_are_remembered() {
        let mut limits = PeerLimits::new(10);
        let t0 = Instant::now();
        for i in 0..SWEEP_AT as u32 {
            limits
                .take(PeerKey::of(Some(IpAddr::V4(i.into()))), t0)
                .unwrap();
        }
        assert_eq!(limits.len(), SWEEP_AT);
        // A minute later every budget is full again and nobody was warned: a new peer sweeps.
        limits
            .take(ip("192.168.0.1"), t0 + Duration::from_secs(61))
            .unwrap();
        assert_eq!(limits.len(), 1);
    }
}
