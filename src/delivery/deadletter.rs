//! Dead letters, delivery's side: events that exhausted their attempts, expired, or were refused
//! are kept (bounded per subscription, oldest evicted first) instead of vanishing; the API lists
//! and replays them, and a subscription may also forward them to a dead-letter destination
//! (a webhook or a blob container: [`Forwarder`], in `forward.rs`). What a letter is and where it is kept is the store's
//! (`crate::store::deadletter`, re-exported here).

use super::sink::{FailureKind, Outcome};

pub use crate::store::deadletter::{
    rfc3339, DeadLetter, DeadLetterBound, DeadLetterStore, MemoryDeadLetters,
};

/// The last failure of an outcome, as `(status, description)`, for a [`DeadLetter`].
pub fn describe(outcome: Option<&Outcome>) -> (Option<u16>, Option<String>) {
    match outcome.map(Outcome::summary) {
        Some(Outcome::Failed { kind, .. }) => (
            match kind {
                FailureKind::Status(s) | FailureKind::Service { status: s, .. } => Some(*s),
                _ => None,
            },
            Some(kind.to_string()),
        ),
        _ => (None, None),
    }
}

pub use super::forward::{Forward, Forwarder};
