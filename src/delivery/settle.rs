//! Settle decides: what an attempt's outcome does to its batch, as data. [`settle`] is a pure
//! function of the subscription's [`Rules`], the batch, the outcome and the wall clock; it
//! answers typed [`Effects`] (remove these, store this retry state, keep these letters then
//! remove their events, forward them, requeue those in memory) and [`super::apply`] does them,
//! in the order they are listed. Events that leave without an attempt deciding it (expired in
//! the queue, a full queue's overflow, expired while gridlet was stopped) get their effects from
//! [`dead_letter`], the other way in.
//!
//! Every outcome × attempt and TTL edge × policy is a line of the table in `settle/tests.rs`,
//! as [`retry::next_step`] (which decides each event's step) is tested in `retry.rs`.
//!
//! An attempt that found the endpoint unreachable (an uplink outage) while its health is
//! tracked is no attempt for its events: they go back due at once, their attempt count and
//! stored state unchanged ([`held`]), and endpoint health gates when they are tried again.
//!
//! Order, and why: a persisted event's retry state is written before it is requeued (a spilled
//! retry is read back with its state, staged before), and its letter is kept before it is
//! removed from the store (after a crash each event is pending, a dead letter, or both, never
//! neither): [`Effects::writes`] lists them in that order and the store writer stages them in
//! it.

use super::classify;
use super::deadletter::{letters, DeadLetter};
use super::health;
use super::payload::{first_trace, Pending};
use super::queue::Batch;
use super::retry::{self, DropReason, Step};
use super::sink::Outcome;
use super::writer::Write;
use crate::clock::WallMs;
use crate::model::subscription::EffectivePolicy;
use crate::store::RetryState;
use crate::telemetry::TraceContext;
use std::time::Duration;

/// What settling needs to know about the subscription.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules<'a> {
    /// Retry limits in force.
    pub policy: &'a EffectivePolicy,
    /// Its events are in the store (removals and retry states are written).
    pub persisted: bool,
    /// It has a dead-letter destination (letters are also forwarded).
    pub forwards: bool,
    /// Its endpoint's health is tracked: an attempt that found the endpoint unreachable (an
    /// outage, [`health::Verdict::Unreachable`]) is not charged to its events, which wait
    /// (due at once; endpoint health holds them until a probe gets through).
    pub hold_outages: bool,
}

/// Events that leave undelivered, and why.
#[derive(Debug)]
pub(super) struct Dropped {
    /// Why.
    pub reason: DropReason,
    /// The events.
    pub items: Vec<Pending>,
    /// The attempt's outcome decided it (`false`: expired or overflowed without one).
    pub by_attempt: bool,
}

/// Events going back into the retry lane.
#[derive(Debug)]
pub(super) struct Requeue {
    /// Due this long from now (the longest of the events' delays: they travel together).
    pub delay: Duration,
    /// The events.
    pub items: Vec<Pending>,
}

/// What an attempt's outcome (or an expiry) does, in the order [`super::apply`] does it.
#[must_use = "effects do nothing until applied"]
#[derive(Debug, Default)]
pub(super) struct Effects {
    /// The attempt's in-flight slot is free again; `Some(true)`: a retry lane slot. `None`: no
    /// attempt.
    pub freed: Option<bool>,
    /// Delivered: they leave the queue.
    pub delivered: Vec<Pending>,
    /// Failed attempts, by outcome, and how many events each (counted, logged).
    pub failed: Vec<(Outcome, usize)>,
    /// Store writes, in the order the writer must run them.
    pub writes: Vec<Write>,
    /// Back into the retry lane (after their state's write is submitted).
    pub requeue: Option<Requeue>,
    /// Dead-lettered, by reason (counted, logged).
    pub dropped: Vec<Dropped>,
    /// The letters also sent to the dead-letter destination.
    pub forward: Vec<DeadLetter>,
    /// The dropped events held places in the queue (given back).
    pub queued: bool,
    /// The trace context that the log lines, store writes and forwards about these events
    /// name: the one the first of them travels in (the dispatcher puts an attempt's recorded
    /// `deliver` span here instead).
    pub trace: Option<TraceContext>,
}

impl Effects {
    /// Events that leave the queue for good, and their body bytes.
    pub fn leaving(&self) -> (usize, u64) {
        let dropped = self.dropped.iter().filter(|_| self.queued);
        let items = self
            .delivered
            .iter()
            .chain(dropped.flat_map(|d| d.items.iter()));
        items.fold((0, 0), |(n, b), p| (n + 1, b + p.event.body.len() as u64))
    }
}

/// Decide what `outcome` does to `batch` at `now_ms`: each event by its own outcome when the
/// sink reported them apart ([`Outcome::PerEvent`]), else the whole batch alike; each failed
/// event by [`retry::next_step`].
pub(super) fn settle(rules: Rules<'_>, batch: Batch, outcome: Outcome, now_ms: WallMs) -> Effects {
    let mut fx = Effects {
        freed: Some(batch.retry),
        queued: true,
        trace: first_trace(&batch.items).cloned(),
        ..Effects::default()
    };
    for (o, items) in outcome.group(batch.items) {
        if o == Outcome::Delivered {
            if rules.persisted {
                fx.writes.push(Write::Remove {
                    events: items.iter().map(Pending::settled).collect(),
                });
            }
            if fx.delivered.is_empty() {
                fx.delivered = items; // the common case: no copy
            } else {
                fx.delivered.extend(items);
            }
        } else if rules.hold_outages && health::verdict(&o) == health::Verdict::Unreachable {
            fx.failed.push((o.clone(), items.len()));
            held(&mut fx, items);
        } else {
            fx.failed.push((o.clone(), items.len()));
            failed(rules, &mut fx, items, &o, now_ms);
        }
    }
    fx
}

/// Events an outage failed: back into the retry lane as they were before the attempt (not
/// charged an attempt, nothing written), due at once: endpoint health decides when they go.
fn held(fx: &mut Effects, mut items: Vec<Pending>) {
    for p in &mut items {
        p.attempts = p.attempts.saturating_sub(1);
    }
    match &mut fx.requeue {
        Some(r) => r.items.extend(items),
        None => {
            fx.requeue = Some(Requeue {
                delay: Duration::ZERO,
                items,
            })
        }
    }
}

/// Failed events: retried (state stored first, persisted only), or dead-lettered by reason.
fn failed(rules: Rules<'_>, fx: &mut Effects, items: Vec<Pending>, o: &Outcome, now_ms: WallMs) {
    let mut retry: Vec<Pending> = Vec::new();
    let mut delay = Duration::ZERO;
    let mut dropped: Vec<(DropReason, Vec<Pending>)> = Vec::new();
    for p in items {
        let jitter = classify::jitter_key(p.seq, p.attempts);
        match retry::next_step(
            rules.policy,
            p.attempts,
            p.first_enqueued_ms,
            now_ms,
            o,
            jitter,
        ) {
            Step::Retry(d) => {
                delay = delay.max(d);
                retry.push(p);
            }
            Step::Drop(r) => match dropped.iter_mut().find(|(x, _)| *x == r) {
                Some((_, v)) => v.push(p),
                None => dropped.push((r, vec![p])),
            },
            // Only a delivery is done (never a failed group's step).
            Step::Done => fx.delivered.push(p),
        }
    }
    if !retry.is_empty() {
        if rules.persisted {
            fx.writes.push(Write::RetryState {
                seqs: retry.iter().map(|p| p.seq).collect(),
                state: RetryState {
                    attempts: retry.first().map(|p| p.attempts).unwrap_or(0),
                    first_enqueued_ms: retry
                        .iter()
                        .map(|p| p.first_enqueued_ms)
                        .min()
                        .unwrap_or(now_ms),
                    due_ms: now_ms + delay.as_millis() as u64,
                },
            });
        }
        match &mut fx.requeue {
            // Several failed groups (per-event outcomes): one due time, the latest.
            Some(r) => {
                r.delay = r.delay.max(delay);
                r.items.extend(retry);
            }
            None => {
                fx.requeue = Some(Requeue {
                    delay,
                    items: retry,
                })
            }
        }
    }
    for (reason, items) in dropped {
        keep(rules, fx, items, reason, Some(o), now_ms);
    }
}

/// Events that leave undelivered without an attempt deciding it (`reason`: expired, or a full
/// queue's overflow): their letters kept, then their events removed from the store; `queued`:
/// they held places in the queue.
pub(super) fn dead_letter(
    rules: Rules<'_>,
    items: Vec<Pending>,
    reason: DropReason,
    now_ms: WallMs,
    queued: bool,
) -> Effects {
    decided(rules, items, reason, None, now_ms, queued)
}

/// [`dead_letter`] for events a receiver's answer sent there (pull delivery's reject, with its
/// words as the letter's last error).
pub(super) fn decided(
    rules: Rules<'_>,
    items: Vec<Pending>,
    reason: DropReason,
    last: Option<&Outcome>,
    now_ms: WallMs,
    queued: bool,
) -> Effects {
    let mut fx = Effects {
        queued,
        trace: first_trace(&items).cloned(),
        ..Effects::default()
    };
    if !items.is_empty() {
        keep(rules, &mut fx, items, reason, last, now_ms);
    }
    fx
}

/// Keep `items` as letters (then remove their events from the store), forward them.
fn keep(
    rules: Rules<'_>,
    fx: &mut Effects,
    items: Vec<Pending>,
    reason: DropReason,
    last: Option<&Outcome>,
    now_ms: WallMs,
) {
    let kept = letters(&items, reason, last, now_ms);
    if rules.forwards {
        fx.forward.extend(kept.iter().cloned());
    }
    fx.writes.push(Write::KeepLetters {
        letters: kept,
        events: if rules.persisted {
            items.iter().map(Pending::settled).collect()
        } else {
            Vec::new()
        },
    });
    fx.dropped.push(Dropped {
        reason,
        items,
        by_attempt: last.is_some(),
    });
}

#[cfg(test)]
mod tests;
