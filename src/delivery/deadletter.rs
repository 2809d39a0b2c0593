//! Dead letters, delivery's side, in one place: events that exhausted their attempts, expired,
//! or were refused are kept (bounded per subscription, oldest evicted first) instead of
//! vanishing; the API lists and replays them, and a subscription may also forward them to a
//! dead-letter destination (a webhook or a blob container: [`Forwarder`], in `forward.rs`).
//!
//! * *That* an event becomes a letter, and what follows (kept, then removed from the store,
//!   forwarded), is decided by `settle` (`settle::settle` after an attempt,
//!   `settle::dead_letter` for expiry and overflow), as data.
//! * *What* a letter holds is [`letters`], here.
//! * Counting and logging them is `apply`'s; handing them to the store, the store writer's
//!   (`writer::Write::KeepLetters` becomes a `Writes::Letters`); putting them is the store's
//!   (`crate::store::deadletter::keep`, the only place letters are put: in the log store's
//!   committer round, or at once in the memory store), and where a letter is kept too
//!   (`crate::store::deadletter`, re-exported here).

use super::payload::Pending;
use super::retry::DropReason;
use super::sink::{FailureKind, Outcome};
use crate::clock::WallMs;

pub use super::forward::Forwarder;
pub use crate::store::deadletter::{rfc3339, DeadLetter, MemoryDeadLetters};

/// The last failure of an outcome, as `(status, description)`, for a [`DeadLetter`].
pub fn describe(outcome: Option<&Outcome>) -> (Option<u16>, Option<String>) {
    match outcome.map(Outcome::summary) {
        Some(Outcome::Failed { kind, .. }) => (
            match kind {
                FailureKind::Status(s)
                | FailureKind::Service { status: s, .. }
                | FailureKind::Throttled { status: s, .. } => Some(*s),
                FailureKind::Refused { status, .. } => *status,
                _ => None,
            },
            Some(kind.to_string()),
        ),
        _ => (None, None),
    }
}

/// The letters `items` become, dead-lettered at `now_ms` for `reason`; `last`: the attempt
/// that decided it, if any (its status and failure are kept).
pub(super) fn letters(
    items: &[Pending],
    reason: DropReason,
    last: Option<&Outcome>,
    now_ms: WallMs,
) -> Vec<DeadLetter> {
    let (last_status, last_error) = describe(last);
    items
        .iter()
        .map(|p| DeadLetter {
            id: 0,
            seq: p.seq,
            event_id: p.event.id.to_string(),
            body: p.event.body.clone(),
            reason,
            last_status,
            last_error: last_error.clone(),
            attempts: p.attempts,
            first_enqueued_ms: p.first_enqueued_ms,
            dead_lettered_ms: now_ms,
        })
        .collect()
}
