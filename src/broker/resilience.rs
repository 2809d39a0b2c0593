//! The broker's resilience operations: endpoint health per subscription, dead letters (list,
//! purge; replay is in `replay.rs`), dead-letter webhooks, and their metrics. Kept apart from the publish path.

use super::{Broker, BrokerError};
use crate::delivery::deadletter::DeadLetter;
use crate::delivery::health::{EndpointHealth, HealthSnapshot};
use crate::delivery::sink::Sink;
use crate::delivery::subscription::SubscriptionHandle;
use crate::model::delivery_options::DeliveryOptions;
use crate::model::subscription::Subscription;
use crate::store::{Answer, QueueId, Writes};
use std::sync::Arc;

/// Most dead letters one list call returns.
pub const MAX_PAGE: usize = 1000;

impl Broker {
    /// The health tracker of `sub`'s destination URL (HTTP destinations, tracking on).
    pub(super) fn endpoint_health_for(&self, sub: &Subscription) -> Option<Arc<EndpointHealth>> {
        let ctx = &self.inner.ctx;
        if !ctx.health_cfg.enabled {
            return None;
        }
        let key = sub.destination.health_key()?;
        Some(ctx.health.get(key, ctx.clock.now_ms()))
    }

    /// The sink sending to `sub`'s dead-letter destination, through the same sink factory.
    pub(super) fn dead_letter_sink_for(&self, sub: &Subscription) -> Option<Arc<dyn Sink>> {
        let mut dl = sub.clone();
        dl.destination = sub.delivery.dead_letter.clone()?;
        dl.delivery = DeliveryOptions::default();
        dl.batching = Default::default();
        Some(self.inner.sinks.create(&dl))
    }

    /// Wait until the store has done the writes of every delivery settled so far (dead letters
    /// kept, events removed): a commit answered after the frame of the committer's next round,
    /// which puts the letters handed over before it. Blocks: management operations only.
    pub(super) fn settled_writes(&self) {
        let done = self.inner.ctx.store.stage(Writes::Staged, Answer::Frame);
        if let Err(e) = done.and_then(crate::store::Commit::wait_blocking) {
            tracing::warn!(error = %e, "dead letters: the store's writes before this call are not all done");
        }
    }

    pub(super) fn forget_dead_letters(&self, queue: QueueId) {
        if let Err(e) = self.inner.ctx.dead_letters.delete_queue(queue) {
            tracing::error!(error = %e, "could not delete a subscription's dead letters");
        }
    }

    /// A subscription that exists on a topic that exists.
    ///
    /// # Errors
    /// [`BrokerError::TopicNotFound`], then [`BrokerError::SubscriptionNotFound`].
    pub fn find_subscription(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<Arc<SubscriptionHandle>, BrokerError> {
        self.find_topic(topic)?;
        self.subscription(topic, name)
            .ok_or_else(|| BrokerError::subscription_not_found(topic, name))
    }

    /// Re-enable a subscription's destination (disabled or frozen).
    ///
    /// # Errors
    /// Not found (topic/subscription); [`BrokerError::HealthNotTracked`].
    pub fn enable_endpoint(&self, topic: &str, name: &str) -> Result<HealthSnapshot, BrokerError> {
        let e = self.find_subscription(topic, name)?;
        let cfg = e.config();
        let h = cfg.health.as_ref().ok_or(BrokerError::HealthNotTracked)?;
        h.enable(self.inner.ctx.clock.now_ms());
        e.wake();
        Ok(h.snapshot())
    }

    /// Dead letters of a subscription with id > `after`, oldest first, at most `limit`; every
    /// dead letter decided before the call is listed. Blocks on the store: call it through
    /// [`Broker::manage`].
    ///
    /// # Errors
    /// Not found (topic/subscription); the store's failure.
    pub fn dead_letters(
        &self,
        topic: &str,
        name: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let e = self.find_subscription(topic, name)?;
        self.settled_writes();
        self.inner
            .ctx
            .dead_letters
            .list(e.queue_id(), after, limit.min(MAX_PAGE))
            .map_err(BrokerError::Store)
    }

    /// Remove dead letters without replaying them (`ids` = `None`: all). Returns how many.
    ///
    /// # Errors
    /// Not found (topic/subscription); the store's failure.
    pub fn purge_dead_letters(
        &self,
        topic: &str,
        name: &str,
        ids: Option<&[u64]>,
    ) -> Result<usize, BrokerError> {
        let e = self.find_subscription(topic, name)?;
        self.settled_writes();
        let n = self
            .inner
            .ctx
            .dead_letters
            .take(e.queue_id(), ids)
            .map_err(BrokerError::Store)?
            .len();
        Ok(n)
    }
}
