//! Dead-letter replay: letters go back into their subscription's queue as new events (fresh
//! attempts and time to live), persisted first for persisted subscriptions.
//!
//! Cancel safety: the replay runs in its own task, so a client that hangs up while the commit
//! is under way cannot leave the replayed events durable (and the letters kept or taken) but
//! not queued in memory. The request only waits for that task.

use super::{store_err, Broker};
use crate::config::Key;
use crate::delivery::deadletter::DeadLetter;
use crate::delivery::dispatcher::SubShared;
use crate::delivery::queue::{EventData, Pending};
use crate::error::ApiError;
use crate::store::{RetryState, StoredEvent};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

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
    /// 404 for an unknown topic/subscription; 503 when the queue has no room; 507/500 on store
    /// failure (the letters are kept then).
    pub async fn replay_dead_letters(
        &self,
        topic: &str,
        name: &str,
        ids: Option<Vec<u64>>,
    ) -> Result<usize, ApiError> {
        let shared = self.entry(topic, name)?.shared.clone();
        let broker = self.clone();
        // Runs to completion even when the caller stops waiting (see the module docs).
        tokio::spawn(async move { broker.replay_into(&shared, ids).await })
            .await
            .map_err(|e| ApiError::internal(&e))?
    }

    /// The replay itself (see [`Broker::replay_dead_letters`]).
    async fn replay_into(
        &self,
        shared: &SubShared,
        ids: Option<Vec<u64>>,
    ) -> Result<usize, ApiError> {
        let ctx = &self.inner.ctx;
        let persisted = shared.config().sub.persisted;
        if !persisted {
            self.check_replay_room(shared, ids.as_deref())?;
        }
        let _replaying = if persisted {
            Some(self.inner.replays.lock().await)
        } else {
            None
        };
        let mut letters = ctx
            .dead_letters
            .peek(shared.queue_id, ids.as_deref())
            .map_err(store_err)?;
        if !persisted && !letters.is_empty() {
            letters = self.take_for_memory(shared, &letters)?;
        }
        if letters.is_empty() {
            return Ok(0);
        }
        let now_ms = ctx.clock.now_ms();
        let items = self.replayed_items(&letters, now_ms);
        if persisted {
            self.persist_replayed(shared, &letters, &items, now_ms)
                .await?;
        }
        let n = items.len();
        {
            let mut q = shared.queue();
            for p in items {
                q.push(p);
            }
        }
        shared.metrics.enqueued.add(n as u64);
        shared.metrics.dead_letters_replayed.add(n as u64);
        shared.notify.notify_one();
        tracing::info!(topic = %shared.topic, subscription = %shared.name, events = n, "dead letters replayed");
        Ok(n)
    }

    /// An in-memory subscription's queue must have room for every wanted letter.
    fn check_replay_room(&self, shared: &SubShared, ids: Option<&[u64]>) -> Result<(), ApiError> {
        let wanted = match ids {
            Some(v) => v.len(),
            None => self.inner.ctx.dead_letters.count(shared.queue_id),
        };
        if !self.has_room(shared, wanted) {
            return Err(ApiError::unavailable(
                format!(
                    "subscription '{}' has no room for {wanted} more events ({}); replay fewer or later",
                    shared.name,
                    Key::broker__maxPendingEventsPerSubscription.name()
                ),
                Duration::from_secs(10),
            ));
        }
        Ok(())
    }

    /// Replayed into memory: within `broker__maxPendingBytes`, like a publish; the letters are
    /// taken (removed) at once.
    fn take_for_memory(
        &self,
        shared: &SubShared,
        letters: &[DeadLetter],
    ) -> Result<Vec<DeadLetter>, ApiError> {
        let ctx = &self.inner.ctx;
        let bytes: u64 = letters
            .iter()
            .map(|l| crate::delivery::queue::payload_size(&l.body, &l.event_id))
            .sum();
        if !self.has_byte_room(bytes) {
            return Err(ApiError::unavailable(
                format!(
                    "replaying {bytes} bytes would pass {} ({} of {} bytes of undelivered events in memory); replay fewer or later",
                    Key::broker__maxPendingBytes.name(),
                    ctx.pending_bytes.used(),
                    ctx.pending_bytes.limit()
                ),
                Duration::from_secs(10),
            ));
        }
        let ids: Vec<u64> = letters.iter().map(|l| l.id).collect();
        ctx.dead_letters
            .take(shared.queue_id, Some(&ids))
            .map_err(store_err)
    }

    /// New queue entries (fresh sequence numbers, attempts and time to live) for `letters`.
    fn replayed_items(&self, letters: &[DeadLetter], now_ms: u64) -> Vec<Pending> {
        let ctx = &self.inner.ctx;
        let now = Instant::now();
        letters
            .iter()
            .map(|l| Pending {
                seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
                event: Arc::new(EventData::new(
                    l.body.clone(),
                    l.event_id.clone().into_boxed_str(),
                    Some(&ctx.pending_bytes),
                )),
                attempts: 0,
                first_enqueued_ms: now_ms,
                enqueued_at: now,
            })
            .collect()
    }

    /// Append and commit the replayed events, then remove their letters.
    async fn persist_replayed(
        &self,
        shared: &SubShared,
        letters: &[DeadLetter],
        items: &[Pending],
        now_ms: u64,
    ) -> Result<(), ApiError> {
        let ctx = &self.inner.ctx;
        let durable: Vec<_> = items
            .iter()
            .map(|p| {
                (
                    shared.queue_id,
                    StoredEvent {
                        seq: p.seq,
                        id: p.event.id.to_string(),
                        body: p.event.body.clone(),
                        state: RetryState {
                            attempts: 0,
                            first_enqueued_ms: now_ms,
                            due_ms: 0,
                        },
                    },
                )
            })
            .collect();
        // On failure the letters were never taken: they stay dead letters.
        ctx.store.append_commit(durable).await.map_err(store_err)?;
        let ids: Vec<u64> = letters.iter().map(|l| l.id).collect();
        if let Err(e) = ctx.dead_letters.take(shared.queue_id, Some(&ids)) {
            // The events are queued and durable; the letters stay listed as well.
            tracing::error!(subscription = %shared.name, error = %e, "replayed dead letters could not be removed");
        }
        Ok(())
    }
}
