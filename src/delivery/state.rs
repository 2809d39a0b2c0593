//! What a subscription's handle and its task share: the configuration a PUT swaps as a whole
//! ([`SubConfig`]) and the queue, wake-up and metrics ([`SubscriptionState`]). Everything in
//! delivery that acts on a subscription takes these; none of it needs the handle or the task.

use super::health::EndpointHealth;
use super::queue::{Limits, SubQueue};
use super::settle::Rules;
use super::sink::Sink;
use super::writer::Owner;
use crate::metrics::SubscriptionMetrics;
use crate::model::subscription::{BatchCaps, EffectivePolicy, Subscription};
use crate::store::QueueId;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::Notify;

/// Everything about a subscription that a PUT may change, swapped as a whole.
pub struct SubConfig {
    /// The subscription as created/updated.
    pub sub: Subscription,
    /// Retry limits in force.
    pub policy: EffectivePolicy,
    /// What one request may carry.
    pub batch: BatchCaps,
    /// Where batches go.
    pub sink: Arc<dyn Sink>,
    /// The destination URL's health tracker (HTTP destinations, health tracking on).
    pub health: Option<Arc<EndpointHealth>>,
    /// Where dead letters are also posted (`deadLetterDestination`).
    pub dead_letter_sink: Option<Arc<dyn Sink>>,
}

impl SubConfig {
    /// What settling an attempt needs to know about the subscription.
    pub(super) fn rules(&self) -> Rules<'_> {
        Rules {
            policy: &self.policy,
            persisted: self.sub.persisted,
            forwards: self.dead_letter_sink.is_some(),
            hold_outages: self.health.is_some(),
        }
    }

    /// The batch caps and in-flight budgets a round of sending works within
    /// (`max_in_flight`: the broker's per-subscription bound; a quarter of it for retries).
    pub fn limits(&self, max_in_flight: usize) -> Limits {
        Limits {
            max_events: self.batch.max_events,
            max_bytes: self.batch.max_bytes,
            max_in_flight,
            retry_cap: (max_in_flight / 4).max(1),
        }
    }
}

/// State shared between a subscription's handle and its task.
pub(super) struct SubscriptionState {
    /// Store queue id.
    pub queue_id: QueueId,
    /// Topic name.
    pub topic: Arc<str>,
    /// Subscription name.
    pub name: Arc<str>,
    /// Current configuration.
    pub config: RwLock<Arc<SubConfig>>,
    /// The queue (short critical sections only, never across an await).
    pub queue: Mutex<SubQueue>,
    /// Wakes the task: new events, or a slot freed.
    pub notify: Notify,
    /// Metrics.
    pub metrics: Arc<SubscriptionMetrics>,
    /// Set when the subscription is deleted: store writes still queued for it keep nothing.
    pub retired: Arc<AtomicBool>,
    /// The last failed attempt: when (wall ms) and why (the console shows it).
    pub last_error: Mutex<Option<(u64, String)>>,
}

impl SubscriptionState {
    /// Current configuration snapshot.
    pub fn config(&self) -> Arc<SubConfig> {
        crate::sync::read(&self.config).clone()
    }

    /// Who the store writer writes for.
    /// Who the store writer writes for, about events in trace context `trace` (its ids go on
    /// the write's error lines).
    pub fn owner(&self, trace: Option<&crate::telemetry::TraceContext>) -> Owner {
        Owner {
            queue: self.queue_id,
            name: self.name.clone(),
            metrics: self.metrics.clone(),
            retired: self.retired.clone(),
            trace: trace.cloned(),
        }
    }

    /// Lock the queue. Every critical section is a few map operations with no await and no
    /// panic path, so a poisoned lock still holds consistent data.
    pub fn queue(&self) -> std::sync::MutexGuard<'_, SubQueue> {
        crate::sync::lock(&self.queue)
    }
}
