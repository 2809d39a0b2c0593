//! What the operator console reads that is not a resource of the API: the ring of samples
//! behind the overview's charts ([`crate::metrics::ring`]) and a subscription's live state.

use super::{Broker, BrokerError};
use crate::delivery::pull::LockSummary;
use crate::metrics::families::dropped;
use crate::metrics::ring::{Sample, SampleRing};
use crate::model::reason::DropReason;
use std::time::Duration;

/// A subscription's live state, beside its stored resource.
#[derive(Debug, Clone)]
pub struct SubscriptionStatus {
    /// Events waiting (in memory and spilled to disk), in flight included.
    pub pending: u64,
    /// Delivery requests under way.
    pub in_flight: u64,
    /// Dead letters kept.
    pub dead_letters: u64,
    /// Events delivered (cumulative since start).
    pub delivered: u64,
    /// Failed attempts (cumulative since start).
    pub failed_attempts: u64,
    /// Events dead-lettered (cumulative since start).
    pub dead_lettered: u64,
    /// A queue subscription's locks: how many, by delivery count, the oldest locked event, the
    /// next expiry (from now).
    pub locks: Option<QueueLocks>,
    /// The last failed attempt: when (wall ms) and why.
    pub last_error: Option<(u64, String)>,
    /// First enqueue (wall ms) of the oldest event waiting in memory, for a first attempt or a
    /// retry (spilled retries are counted in `retrying`, their age stays on disk).
    pub oldest_ms: Option<u64>,
    /// Events waiting to retry.
    pub retrying: u64,
    /// Until the next retry is due.
    pub next_retry_in: Option<Duration>,
    /// The subscription's events are kept on disk.
    pub persisted: bool,
}

/// A queue subscription's locks, for the console.
#[derive(Debug, Clone)]
pub struct QueueLocks {
    /// The table summed up.
    pub summary: LockSummary,
    /// Until the next lock expires.
    pub next_expiry_in: Option<Duration>,
}

impl Broker {
    /// The counters and gauges now.
    pub fn sample(&self, at_ms: u64) -> Sample {
        let ctx = &self.inner.ctx;
        let mut s = Sample {
            at_ms,
            pending_bytes: ctx.pending_bytes.used(),
            disk_bytes: ctx.store.size_on_disk(),
            ..Sample::default()
        };
        for topic in self.topics() {
            s.events_in += topic.metrics.events_received.get();
            for sub in topic.subscriptions().iter() {
                let m = sub.metrics();
                s.events_out += m.delivery_success_counts.get();
                s.failed_attempts += m.delivery_failure_counts.get();
                for (n, reason) in s.dropped.iter_mut().zip(DropReason::ALL) {
                    *n += dropped(m, reason);
                }
            }
        }
        s
    }

    /// Take a sample into the ring (the server does, every
    /// [`crate::metrics::ring::SAMPLE_EVERY_SECS`]).
    pub fn record_sample(&self, at_ms: u64) {
        let s = self.sample(at_ms);
        crate::sync::lock(&self.inner.samples).push(s);
    }

    /// The ring's samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        crate::sync::lock(&self.inner.samples)
            .iter()
            .copied()
            .collect()
    }

    /// Wall-clock ms now, by the broker's clock (the one event times and the live tail use).
    pub fn now_ms(&self) -> u64 {
        self.inner.ctx.clock.now_ms()
    }

    /// When this broker started, ms since the epoch.
    pub fn started_ms(&self) -> u64 {
        self.inner.started_ms
    }

    /// A subscription's live state.
    ///
    /// # Errors
    /// Not found.
    pub fn subscription_status(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<SubscriptionStatus, BrokerError> {
        let sub = self.find_subscription(topic, name)?;
        let m = sub.metrics();
        let waiting = sub.waiting();
        let now = self.inner.ctx.clock.instant();
        Ok(SubscriptionStatus {
            oldest_ms: waiting.oldest_ms,
            retrying: waiting.retrying as u64,
            next_retry_in: waiting
                .next_retry
                .map(|at| at.saturating_duration_since(now)),
            pending: sub.pending() as u64,
            in_flight: sub.in_flight() as u64,
            dead_letters: self.inner.ctx.dead_letters.count(sub.queue_id()) as u64,
            delivered: m.delivery_success_counts.get(),
            failed_attempts: m.delivery_failure_counts.get(),
            dead_lettered: m.dead_lettered.get(),
            locks: sub.pull().map(|p| {
                let summary = p.lock_summary();
                QueueLocks {
                    next_expiry_in: summary
                        .next_expiry
                        .map(|at| at.saturating_duration_since(now)),
                    summary,
                }
            }),
            last_error: sub.last_error(),
            persisted: sub.config().sub.persisted,
        })
    }
}

/// A new, empty ring for the broker's state.
pub(super) fn ring() -> std::sync::Mutex<SampleRing> {
    std::sync::Mutex::new(SampleRing::default())
}
