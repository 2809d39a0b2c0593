//! Dead-letter replay: letters go back into their subscription's queue as new events (fresh
//! attempts and time to live), persisted first for persisted subscriptions.
//!
//! Cancel safety: the replay runs in its own task, so a client that hangs up while the commit
//! is under way cannot leave the replayed events durable (and the letters kept or taken) but
//! not queued in memory. The request only waits for that task.

use super::{Broker, BrokerError};
use crate::config::Key;
use crate::delivery::deadletter::DeadLetter;
use crate::delivery::payload::EventData;
use crate::delivery::subscription::SubscriptionHandle;
use std::sync::Arc;

impl Broker {
    /// Put dead letters back into the subscription's queue as new events (fresh attempts and
    /// time to live), persisted first for persisted subscriptions. `ids` = `None`: all of them.
    /// Returns how many were replayed.
    ///
    /// For a persisted subscription the letters are read, appended to the event store and
    /// committed, and only then removed (replays of one broker run one at a time): a crash in
    /// between leaves a letter that was also re-enqueued (a duplicate), never a lost one.
    ///
    /// # Errors
    /// Not found (topic/subscription); [`BrokerError::Unavailable`] when the queue has no room;
    /// [`BrokerError::Store`] on store failure (the letters are kept then).
    pub async fn replay_dead_letters(
        &self,
        topic: &str,
        name: &str,
        ids: Option<Vec<u64>>,
    ) -> Result<usize, BrokerError> {
        let sub = self.find_subscription(topic, name)?;
        let broker = self.clone();
        // Runs to completion even when the caller stops waiting (see the module docs).
        tokio::spawn(async move { broker.replay_into(&sub, ids).await }).await?
    }

    /// The replay itself (see [`Broker::replay_dead_letters`]): the letters are peeked, their
    /// places reserved in the queue (an in-memory subscription within its bound), then they are
    /// taken (in memory) or persisted and taken (persisted), and queued.
    async fn replay_into(
        &self,
        sub: &SubscriptionHandle,
        ids: Option<Vec<u64>>,
    ) -> Result<usize, BrokerError> {
        let ctx = &self.inner.ctx;
        let persisted = sub.config().sub.persisted;
        let _replaying = if persisted {
            Some(self.inner.replays.lock().await)
        } else {
            None
        };
        let queue = sub.queue_id();
        let mut letters = self
            .manage(move |b| {
                b.settled_writes();
                b.inner
                    .ctx
                    .dead_letters
                    .peek(queue, ids.as_deref())
                    .map_err(BrokerError::Store)
            })
            .await?;
        if letters.is_empty() {
            return Ok(0);
        }
        let bound =
            (!persisted).then_some(self.inner.cfg.broker.max_pending_events_per_subscription);
        let places = sub.reserve(letters.len(), bound).map_err(|_| {
            BrokerError::unavailable(format!(
                "subscription '{}' has no room for {} more events ({}); replay fewer or later",
                sub.name(),
                letters.len(),
                Key::broker__maxPendingEventsPerSubscription.name()
            ))
        })?;
        if !persisted {
            letters = self.take_for_memory(sub, &letters).await?;
        }
        let now_ms = ctx.clock.now_ms();
        let (events, commit) = {
            // Numbered and submitted in one step, as a publish (the store sees sequence order).
            let mut next = crate::sync::lock(&self.inner.seq);
            let events = self.replayed_events(&letters, &mut next);
            let commit = if persisted {
                let durable: Vec<_> = events
                    .iter()
                    .map(|(seq, data)| (sub.queue_id(), data.to_stored(*seq, now_ms)))
                    .collect();
                Some(ctx.store.submit(durable).map_err(BrokerError::Store)?)
            } else {
                None
            };
            (events, commit)
        };
        if let Some(commit) = commit {
            self.persist_replayed(sub, &letters, commit).await?;
        }
        let n = sub.replay(places, &events, now_ms);
        tracing::info!(topic = %sub.config().sub.topic, subscription = %sub.name(), events = n, "dead letters replayed");
        Ok(n)
    }

    /// Replayed into memory: within `broker__maxPendingBytes`, like a publish; the letters are
    /// taken (removed) at once.
    async fn take_for_memory(
        &self,
        sub: &SubscriptionHandle,
        letters: &[DeadLetter],
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let ctx = &self.inner.ctx;
        let bytes: u64 = letters
            .iter()
            .map(|l| crate::delivery::payload::payload_size(&l.body, &l.event_id))
            .sum();
        if !self.has_byte_room(bytes) {
            return Err(BrokerError::unavailable(
                format!(
                    "replaying {bytes} bytes would pass {} ({} of {} bytes of undelivered events in memory); replay fewer or later",
                    Key::broker__maxPendingBytes.name(),
                    ctx.pending_bytes.used(),
                    ctx.pending_bytes.limit()
                ),
            ));
        }
        let ids: Vec<u64> = letters.iter().map(|l| l.id).collect();
        let queue = sub.queue_id();
        self.manage(move |b| {
            b.inner
                .ctx
                .dead_letters
                .take(queue, Some(&ids))
                .map_err(BrokerError::Store)
        })
        .await
    }

    /// New payloads, with fresh sequence numbers, for `letters`.
    fn replayed_events(
        &self,
        letters: &[DeadLetter],
        next: &mut u64,
    ) -> Vec<(u64, Arc<EventData>)> {
        let ctx = &self.inner.ctx;
        letters
            .iter()
            .map(|l| {
                let seq = *next;
                *next += 1;
                // A dead letter keeps no trace context: a replayed one starts a new trace.
                let data = EventData::new(
                    l.body.clone(),
                    l.event_id.clone().into_boxed_str(),
                    None,
                    Some(&ctx.pending_bytes),
                );
                (seq, Arc::new(data))
            })
            .collect()
    }

    /// Wait until the replayed events are durable, then remove their letters.
    async fn persist_replayed(
        &self,
        sub: &SubscriptionHandle,
        letters: &[DeadLetter],
        commit: crate::store::Commit,
    ) -> Result<(), BrokerError> {
        // On failure the letters were never taken: they stay dead letters.
        commit.wait().await.map_err(BrokerError::Store)?;
        let ids: Vec<u64> = letters.iter().map(|l| l.id).collect();
        let queue = sub.queue_id();
        let taken = self
            .manage(move |b| {
                b.inner
                    .ctx
                    .dead_letters
                    .take(queue, Some(&ids))
                    .map_err(BrokerError::Store)
            })
            .await;
        if let Err(e) = taken {
            // The events are queued and durable; the letters stay listed as well.
            tracing::error!(subscription = %sub.name(), error = %e, "replayed dead letters could not be removed");
        }
        Ok(())
    }
}
