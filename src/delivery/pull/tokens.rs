//! What a client does with its lock tokens: acknowledge (the event leaves, answered once the
//! removal is durable), release (due again, now or after a delay, its count kept), reject (a
//! dead letter, answered once durable) and renew (the lock's expiry moved). Each token is
//! checked first; one that names no lock of this subscription that holds fails alone. A request
//! that settled or renewed some makes a span ([`SettleTrace`]).

use super::locks::{Lock, Locks, Lost};
use super::trace::{Settle, SettleTrace};
use super::{
    drop_events, requeue, token, with_bodies, PullError, Puller, TokenFailure, TokenResults,
};
use crate::delivery::lock_token::TokenId;
use crate::delivery::retry::DropReason;
use crate::delivery::sink::{FailureKind, Outcome};
use crate::delivery::writer::Write;
use crate::store::{Answer, RetryState, Settled, Settlement, StoreError, Writes};
use std::time::Duration;
use tokio::time::Instant;

impl Puller<'_> {
    /// Stage `settlements` (none: nothing new) behind every store write submitted so far (all
    /// staged when they were submitted, dead letters handed to the committer's next round), and
    /// wait until they are durable: one commit answered once their frame is synced
    /// ([`Answer::Frame`]), after the letters handed over before it.
    async fn durable(&self, settlements: &[Settlement<'_>]) -> Result<(), StoreError> {
        let writes = match settlements {
            [] => Writes::Staged,
            s => Writes::Settle(self.shared.queue_id, s),
        };
        self.ctx.store.stage(writes, Answer::Frame)?.wait().await
    }

    /// The span of a settle request beginning now.
    fn settle_trace(&self, op: Settle) -> SettleTrace<'_> {
        SettleTrace::begin(&self.ctx.tracer, op, self.caller)
    }

    /// Record `span` (its request answered `out`, its durable write `done`), then answer.
    fn answer(
        &self,
        span: SettleTrace<'_>,
        out: TokenResults,
        done: Result<(), StoreError>,
    ) -> Result<TokenResults, PullError> {
        let failed = done.as_ref().err().map(|e| e as &dyn std::fmt::Display);
        span.record(&self.ctx.tracer, self.shared, &out, failed);
        done?;
        Ok(out)
    }

    /// Check each token; for those that name a lock of this subscription that holds, `op`
    /// runs on the lock table (under its mutex) and answers the event it settles, if any.
    fn settle_with(
        &self,
        tokens: &[String],
        mut op: impl FnMut(&mut Locks, TokenId, Instant) -> Result<Option<Lock>, Lost>,
    ) -> (TokenResults, Vec<Lock>) {
        let now = Instant::now();
        let mut out = TokenResults::default();
        let mut items = Vec::new();
        let mut locks = self.pull.locks();
        for t in tokens {
            let r = match self.pull.key.open(t) {
                Err(token::Refused::Malformed) => Err(TokenFailure::Malformed),
                Err(token::Refused::Unverified) => Err(TokenFailure::Unknown),
                Ok(id) if id.queue != self.shared.queue_id => Err(TokenFailure::Foreign),
                Ok(id) => op(&mut locks, id, now).map_err(TokenFailure::from),
            };
            match r {
                Ok(item) => {
                    out.succeeded.push(t.clone());
                    items.extend(item);
                }
                Err(f) => out.failed.push((t.clone(), f)),
            }
        }
        (out, items)
    }

    /// Acknowledge: the events are delivered; answered once their removal is durable.
    ///
    /// # Errors
    /// [`PullError::NotQueue`]; the store could not make the removal durable (the events may
    /// then be received again after a restart).
    pub async fn acknowledge(&self, tokens: &[String]) -> Result<TokenResults, PullError> {
        let (_, _, persisted) = self.settings()?;
        let mut span = self.settle_trace(Settle::Acknowledge);
        let (out, items) = self.settle_with(tokens, |l, id, now| {
            l.take(id.seq, id.attempt, now).map(Some)
        });
        if items.is_empty() {
            return Ok(out);
        }
        span.took(&items);
        let n = items.len();
        let events: Vec<Settled> = items
            .iter()
            .map(|l| Settled::new(l.seq, l.size as usize))
            .collect();
        let bytes = items.iter().map(|l| l.size).sum();
        self.shared.queue().settle(n, bytes);
        self.shared.metrics.delivery_success_counts.add(n as u64);
        self.shared.metrics.acknowledged.add(n as u64);
        drop(items);
        // Places in the lock table came free: a receive waiting at the bound may go on.
        self.pull.arrived.notify_waiters();
        let done = match persisted {
            true => self.durable(&[Settlement::Remove(&events)]).await,
            false => Ok(()),
        };
        self.answer(span, out, done)
    }

    /// Release: the events are available again now, or after `delay`, with their delivery
    /// counts kept. Released now, a persisted subscription's events are read back from the
    /// store before the answer (so the next receive finds them); released for later, they stay
    /// there until due.
    ///
    /// # Errors
    /// [`PullError::NotQueue`].
    pub async fn release(
        &self,
        tokens: &[String],
        delay: Duration,
    ) -> Result<TokenResults, PullError> {
        let (_, _, persisted) = self.settings()?;
        let mut span = self.settle_trace(Settle::Release(delay));
        let (out, items) = self.settle_with(tokens, |l, id, now| {
            l.take(id.seq, id.attempt, now).map(Some)
        });
        if items.is_empty() {
            return Ok(out);
        }
        span.took(&items);
        self.shared.metrics.released.add(items.len() as u64);
        if persisted {
            let due_ms = self.ctx.clock.now_ms() + delay.as_millis() as u64;
            self.write_states(
                items
                    .iter()
                    .map(|l| (l.seq, l.attempts, l.first_enqueued_ms)),
                due_ms,
            );
        }
        let due = Instant::now() + delay;
        if delay.is_zero() {
            let items = with_bodies(self.shared, self.ctx, items).await;
            let mut q = self.shared.queue();
            for p in items {
                q.schedule_retry(due, vec![p]);
            }
        } else {
            requeue(&self.shared.queue, due, items);
        }
        // Waiting receivers look now; the task sets its timer for a delayed release.
        self.pull.arrived.notify_waiters();
        self.shared.notify.notify_one();
        self.answer(span, out, Ok(()))
    }

    /// Reject: the events become dead letters at once (reason `DeliveryRefused`, last error
    /// "rejected by the receiver"); answered once that is durable (persisted subscriptions).
    ///
    /// # Errors
    /// [`PullError::NotQueue`]; the store could not make the removal durable (the events may
    /// then be received again after a restart).
    pub async fn reject(&self, tokens: &[String]) -> Result<TokenResults, PullError> {
        let (_, _, persisted) = self.settings()?;
        let mut span = self.settle_trace(Settle::Reject);
        let (out, locks) = self.settle_with(tokens, |l, id, now| {
            l.take(id.seq, id.attempt, now).map(Some)
        });
        if locks.is_empty() {
            return Ok(out);
        }
        span.took(&locks);
        self.shared.metrics.rejected.add(locks.len() as u64);
        let items = with_bodies(self.shared, self.ctx, locks).await;
        let why = Outcome::failed(FailureKind::Other("rejected by the receiver".into()));
        drop_events(
            self.shared,
            self.ctx,
            items,
            DropReason::DeliveryRefused,
            Some(&why),
        );
        self.pull.arrived.notify_waiters();
        let done = match persisted {
            true => self.durable(&[]).await,
            false => Ok(()),
        };
        self.answer(span, out, done)
    }

    /// Renew: each lock holds for another lock duration from now.
    ///
    /// # Errors
    /// [`PullError::NotQueue`].
    pub fn renew(&self, tokens: &[String]) -> Result<TokenResults, PullError> {
        let (q, _, persisted) = self.settings()?;
        let mut span = self.settle_trace(Settle::RenewLock(q.lock_duration));
        let mut renewed: Vec<(u64, u32, u64)> = Vec::new();
        let (out, _) = self.settle_with(tokens, |l, id, now| {
            let lock = l.renew(id.seq, id.attempt, now, now + q.lock_duration)?;
            span.settled(lock.trace.as_ref());
            renewed.push((id.seq, lock.attempts, lock.first_enqueued_ms));
            Ok(None)
        });
        if persisted && !renewed.is_empty() {
            let due_ms = self.ctx.clock.now_ms() + q.lock_duration.as_millis() as u64;
            for (seq, attempts, first_enqueued_ms) in renewed {
                self.ctx.writer.submit(
                    self.shared.owner(None),
                    vec![Write::RetryState {
                        seqs: vec![seq],
                        state: RetryState {
                            attempts,
                            first_enqueued_ms,
                            due_ms,
                        },
                    }],
                )
            }
        }
        self.answer(span, out, Ok(()))
    }
}
