//! The live tail of a topic: a sample of the events as they are published, for the console.
//!
//! Each topic has a small ring of recent events ([`CAPACITY`] at most, each body cut to
//! [`MAX_BODY`] bytes, at most [`PER_REQUEST`] from one publish request), filled only while
//! someone has polled it within [`WATCH_MS`]: an unwatched topic pays one atomic load and a clock
//! read per publish request. A publish never waits for a reader: it pushes under a short lock
//! and wakes the pollers. A reader that polls too slowly finds that older events have rolled off
//! the ring and is told how many it missed; the broker never slows down for it.

use crate::model::filter::{EventView, Filter, LazyObject};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Events kept per watched topic.
pub const CAPACITY: usize = 100;
/// Events taken from one publish request (the rest are not sampled).
pub const PER_REQUEST: usize = 10;
/// Bytes of an event's body kept (the rest is cut off, and the event marked truncated).
pub const MAX_BODY: usize = 8 * 1024;
/// A topic is tailed for this long after its last poll.
pub const WATCH_MS: u64 = 30_000;

/// One sampled event.
#[derive(Debug)]
pub struct Tailed {
    /// Its number in this topic's tail (1, 2, ...; not the store's sequence).
    pub seq: u64,
    /// When it was published, ms since the epoch.
    pub at_ms: u64,
    /// Its id.
    pub id: String,
    /// Its subject, if its schema has one.
    pub subject: Option<String>,
    /// Its type.
    pub event_type: Option<String>,
    /// The event's JSON, at most [`MAX_BODY`] bytes of it.
    pub body: Bytes,
    /// The body was cut.
    pub truncated: bool,
}

/// What a poll returns.
#[derive(Debug, Default)]
pub struct TailPage {
    /// Matching events after the poll's `after`, oldest first.
    pub events: Vec<Arc<Tailed>>,
    /// The position to poll after next.
    pub next: u64,
    /// Events that rolled off the ring before this poll could see them.
    pub missed: u64,
}

#[derive(Default)]
struct Ring {
    last: u64,
    items: VecDeque<Arc<Tailed>>,
}

/// A topic's tail.
#[derive(Default)]
pub struct Tail {
    ring: Mutex<Ring>,
    wake: tokio::sync::Notify,
    /// Until when (ms since the epoch) publishes are sampled.
    watched_until: AtomicU64,
    /// Polls waiting now.
    waiting: AtomicUsize,
}

/// Counts a poll as waiting while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// One event offered to the tail.
pub struct Offered<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its subject.
    pub subject: Option<&'a str>,
    /// Its type.
    pub event_type: Option<&'a str>,
    /// Its JSON.
    pub body: &'a [u8],
}

impl Tail {
    /// Whether anyone polled recently (publishes call this first, and skip the rest if not).
    pub fn watched(&self, now_ms: u64) -> bool {
        self.watched_until.load(Relaxed) > now_ms
    }

    /// Polls waiting now.
    pub fn polls_waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Sample the events of one publish request (call only when [`Tail::watched`]).
    pub fn offer<'a>(&self, now_ms: u64, events: impl Iterator<Item = Offered<'a>>) {
        let mut ring = crate::sync::lock(&self.ring);
        for e in events.take(PER_REQUEST) {
            ring.last += 1;
            let cut = e.body.len().min(MAX_BODY);
            let item = Arc::new(Tailed {
                seq: ring.last,
                at_ms: now_ms,
                id: e.id.to_string(),
                subject: e.subject.map(str::to_string),
                event_type: e.event_type.map(str::to_string),
                body: Bytes::copy_from_slice(&e.body[..cut]),
                truncated: cut < e.body.len(),
            });
            if ring.items.len() == CAPACITY {
                ring.items.pop_front();
            }
            ring.items.push_back(item);
        }
        drop(ring);
        self.wake.notify_waiters();
    }

    /// The events after `after` (`None`: from now on) that pass `filter`, waiting up to `wait`
    /// for one to arrive. Marks the topic watched.
    pub async fn poll(
        &self,
        after: Option<u64>,
        filter: Option<&Filter>,
        wait: Duration,
        now_ms: u64,
    ) -> TailPage {
        self.watched_until.store(now_ms + WATCH_MS, Relaxed);
        self.waiting.fetch_add(1, Relaxed);
        let _waiting = Waiting(&self.waiting);
        let deadline = tokio::time::Instant::now() + wait;
        let mut after = after;
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let page = self.read(after, filter);
            if !page.events.is_empty() || page.missed > 0 {
                return page;
            }
            after = Some(page.next);
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return page;
            }
        }
    }

    fn read(&self, after: Option<u64>, filter: Option<&Filter>) -> TailPage {
        let ring = crate::sync::lock(&self.ring);
        let after = after.unwrap_or(ring.last).min(ring.last);
        let oldest = ring.items.front().map_or(ring.last + 1, |t| t.seq);
        let missed = oldest.saturating_sub(after + 1);
        let events = ring
            .items
            .iter()
            .filter(|t| t.seq > after)
            .filter(|t| filter.is_none_or(|f| passes(f, t)))
            .cloned()
            .collect();
        TailPage {
            events,
            next: ring.last,
            missed,
        }
    }
}

fn passes(f: &Filter, t: &Tailed) -> bool {
    let object = LazyObject::from_json(t.body.clone());
    f.matches(&EventView {
        object: &object,
        subject: t.subject.as_deref(),
        event_type: t.event_type.as_deref(),
        lowered: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(tail: &Tail, n: usize, subject: &str) {
        let ids: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        tail.offer(
            1,
            ids.iter().map(|id| Offered {
                id,
                subject: Some(subject),
                event_type: Some("t"),
                body: b"{}",
            }),
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_sees_what_was_published_after_it_started_and_what_it_missed() {
        let tail = Tail::default();
        assert!(!tail.watched(0));
        let first = tail.poll(None, None, Duration::from_millis(10), 0).await;
        assert!(first.events.is_empty());
        assert_eq!(
            tail.polls_waiting(),
            0,
            "a poll that ended no longer counts"
        );
        assert!(tail.watched(1));
        // One request is sampled up to PER_REQUEST events.
        offer(&tail, PER_REQUEST + 5, "a");
        let page = tail.poll(Some(first.next), None, Duration::ZERO, 1).await;
        assert_eq!(page.events.len(), PER_REQUEST);
        assert_eq!(page.missed, 0);
        // A slow reader: more than CAPACITY arrive before it polls again; it is told how many
        // rolled off, and the publishes were never held up.
        for _ in 0..(CAPACITY / PER_REQUEST + 2) {
            offer(&tail, PER_REQUEST, "b");
        }
        let late = tail.poll(Some(page.next), None, Duration::ZERO, 1).await;
        assert_eq!(late.events.len(), CAPACITY);
        assert_eq!(late.missed, 2 * PER_REQUEST as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_poll_is_woken_by_a_publish_and_filters_like_a_subscription() {
        let tail = Arc::new(Tail::default());
        let start = tail.poll(None, None, Duration::ZERO, 0).await;
        let filter = Filter::from_record(&serde_json::json!({"subjectBeginsWith": "keep"}))
            .expect("a filter");
        let t = tail.clone();
        let waiting = tokio::spawn(async move {
            t.poll(Some(start.next), Some(&filter), Duration::from_secs(20), 0)
                .await
        });
        tokio::task::yield_now().await;
        offer(&tail, 1, "drop/me");
        offer(&tail, 1, "keep/me");
        let page = waiting.await.expect("poll ends");
        let subjects: Vec<_> = page.events.iter().map(|e| e.subject.clone()).collect();
        assert_eq!(subjects, vec![Some("keep/me".to_string())]);
    }

    #[test]
    fn a_large_body_is_cut() {
        let tail = Tail::default();
        let big = vec![b'x'; MAX_BODY * 2];
        tail.offer(
            0,
            std::iter::once(Offered {
                id: "1",
                subject: None,
                event_type: None,
                body: &big,
            }),
        );
        let page = tail.read(Some(0), None);
        assert_eq!(page.events[0].body.len(), MAX_BODY);
        assert!(page.events[0].truncated);
    }
}
