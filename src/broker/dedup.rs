//! Deduplication on publish: a topic remembers the identities it accepted within its window
//! (`broker__deduplicationWindowSeconds`, or the topic's `deduplicationWindowInSeconds`; 0 =
//! off) and a publish of an identity it remembers is answered 200 without being routed again.
//!
//! * **Identity**: CloudEvents `source` + `id` (the CloudEvents spec's identity); EventGridSchema
//!   the topic + `id` (the window is the topic's, so `id` alone). Custom-schema events have no
//!   identity and are never suppressed.
//! * **Remembered** as a 128-bit keyed hash (two 64-bit halves: 8-byte alignment keeps a map
//!   bucket at 25 bytes and a queue entry at 24) of the identity (two SipHash keys drawn at start:
//!   a publisher cannot construct collisions) with the time it was accepted, in a map and a
//!   queue in acceptance order: expiry pops the queue's front. An identity is recorded only
//!   once its publish succeeded (a refused publish may be sent again); two concurrent publishes
//!   of one identity may both be routed.
//! * **Bounded**: at most `broker__deduplicationMaxIdentities` per topic; past it the oldest are
//!   forgotten before their window ends (counted). The cost per identity is measured in
//!   `bytes_per_identity_at_a_million` (docs/CLOUD.md gives the figure).
//! * **Restarts**: the window is in memory. The store keeps settled events' records for the
//!   longest window (`broker/retention.rs`), and at start-up the window is rebuilt from every
//!   stored event accepted within it, delivered or not (`broker/recovery.rs`): each is
//!   remembered as accepted then. Nothing is written for it; what is not rebuilt is in
//!   docs/CLOUD.md.

use crate::clock::WallMs;
use crate::model::topic::{EventSchema, Topic};
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};

/// The window of `topic` in milliseconds (its own `deduplicationWindowInSeconds`, else
/// `default`), `None` when deduplication is off for it (a zero window, or a custom schema:
/// no identity).
pub fn window_ms(topic: &Topic, default: std::time::Duration) -> Option<u64> {
    let window = topic
        .dedup_window_secs
        .map_or(default, std::time::Duration::from_secs);
    if window.is_zero() || topic.input_schema == EventSchema::Custom {
        return None;
    }
    Some(window.as_millis() as u64)
}

/// A CloudEvent's `source` (the other half of its identity), read from its JSON body.
pub fn cloud_event_source(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Source<'a> {
        #[serde(borrow)]
        source: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Source<'_>>(body)
        .ok()?
        .source
        .map(std::borrow::Cow::into_owned)
}

/// One topic's remembered identities.
#[derive(Debug)]
pub struct Window {
    keys: (RandomState, RandomState),
    seen: HashMap<(u64, u64), WallMs>,
    order: VecDeque<(WallMs, (u64, u64))>,
    max: usize,
    /// Identities forgotten early to stay within `max`.
    pub evicted: u64,
}

/// An event's identity, hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity((u64, u64));

impl Window {
    /// An empty window holding at most `max` identities.
    pub fn new(max: usize) -> Self {
        Self {
            keys: (RandomState::new(), RandomState::new()),
            seen: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
            evicted: 0,
        }
    }

    /// The identity of an event with `id` and (CloudEvents) `source`.
    pub fn identity(&self, source: Option<&str>, id: &str) -> Identity {
        let half = |s: &RandomState| {
            let mut h = s.build_hasher();
            source.hash(&mut h);
            id.hash(&mut h);
            h.finish()
        };
        Identity((half(&self.keys.0), half(&self.keys.1)))
    }

    /// Forget what was accepted `window_ms` or longer before `now_ms`.
    fn expire(&mut self, now_ms: WallMs, window_ms: u64) {
        while let Some(&(at, key)) = self.order.front() {
            if at.saturating_add(window_ms) > now_ms {
                break;
            }
            self.order.pop_front();
            if self.seen.get(&key) == Some(&at) {
                self.seen.remove(&key);
            }
        }
        if self.order.capacity() > 1024 && self.order.len() < self.order.capacity() / 4 {
            self.order.shrink_to_fit();
            self.seen.shrink_to_fit();
        }
    }

    /// Whether `id` was accepted within `window_ms` before `now_ms`.
    pub fn seen(&mut self, id: Identity, now_ms: WallMs, window_ms: u64) -> bool {
        self.expire(now_ms, window_ms);
        self.seen.contains_key(&id.0)
    }

    /// Remember `id` as accepted at `now_ms`.
    pub fn record(&mut self, id: Identity, now_ms: WallMs, window_ms: u64) {
        self.expire(now_ms, window_ms);
        self.seen.insert(id.0, now_ms);
        self.order.push_back((now_ms, id.0));
        while self.seen.len() > self.max {
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if self.seen.get(&key) == Some(&at) {
                self.seen.remove(&key);
                self.evicted += 1;
            }
        }
    }

    /// Identities remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Heap bytes held (capacity, not length).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        // hashbrown: a bucket per capacity slot plus one control byte.
        let bucket = std::mem::size_of::<((u64, u64), WallMs)>() + 1;
        let buckets = (self.seen.capacity() * 8 / 7).next_power_of_two();
        buckets * bucket + self.order.capacity() * std::mem::size_of::<(WallMs, (u64, u64))>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    #[test]
    fn window_edges() {
        let mut w = Window::new(10);
        let a = w.identity(Some("/src"), "1");
        assert_ne!(a, w.identity(Some("/other"), "1"), "source is part of it");
        assert_ne!(a, w.identity(None, "1"));
        assert!(!w.seen(a, 0, 60 * S));
        w.record(a, 0, 60 * S);
        assert!(w.seen(a, 59_999, 60 * S), "inside the window");
        assert!(!w.seen(a, 60 * S, 60 * S), "gone at its edge");
        assert!(w.is_empty());
        // Accepted again after the window: remembered from then.
        w.record(a, 61 * S, 60 * S);
        assert!(w.seen(a, 120 * S, 60 * S));
        assert!(!w.seen(a, 121 * S, 60 * S));
    }

    #[test]
    fn a_refreshed_identity_is_kept_from_its_last_acceptance() {
        let mut w = Window::new(10);
        let a = w.identity(None, "a");
        w.record(a, 0, 10 * S);
        w.record(a, 5 * S, 10 * S);
        assert!(w.seen(a, 12 * S, 10 * S));
        assert!(!w.seen(a, 15 * S, 10 * S));
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn the_bound_forgets_the_oldest_first() {
        let mut w = Window::new(3);
        let ids: Vec<Identity> = (0..5).map(|i| w.identity(None, &i.to_string())).collect();
        for (i, id) in ids.iter().enumerate() {
            w.record(*id, i as u64, 3600 * S);
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.evicted, 2);
        assert!(!w.seen(ids[0], 10, 3600 * S));
        assert!(!w.seen(ids[1], 10, 3600 * S));
        assert!(w.seen(ids[4], 10, 3600 * S));
    }

    /// The bound docs/CLOUD.md states: bytes per remembered identity with a million in the
    /// window (run with `--ignored --nocapture` to print it).
    #[test]
    #[ignore]
    fn bytes_per_identity_at_a_million() {
        let n = 1_000_000;
        let mut w = Window::new(n);
        for i in 0..n {
            let id = w.identity(Some("/plant/7/line/3"), &format!("{i:032x}"));
            w.record(id, i as u64, u64::MAX / 2);
        }
        assert_eq!(w.len(), n);
        let per = w.heap_bytes() as f64 / n as f64;
        println!(
            "{n} identities: {} bytes, {per:.1} bytes each",
            w.heap_bytes()
        );
        assert!(per < 80.0, "{per}");
    }
}
