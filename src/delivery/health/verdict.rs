//! What an attempt's outcome says about its endpoint (the table in the module docs of
//! [`super`]).

use crate::delivery::sink::{FailureKind, Outcome};

/// What an attempt says about its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The endpoint works.
    Up,
    /// The endpoint (or its configuration) fails.
    Down,
    /// Nothing about the endpoint: the events were refused.
    Neither,
    /// The endpoint could not be reached (an outage of the way there, or `503`).
    Unreachable,
}

/// The health rule (see the module documentation).
pub fn verdict(outcome: &Outcome) -> Verdict {
    let kind = match outcome {
        Outcome::Delivered => return Verdict::Up,
        // A 503 that names a Retry-After is the endpoint asking for time (below: down, and the
        // retry honours it); a bare 503 is a gateway saying the way on is down.
        Outcome::Failed {
            kind: FailureKind::Status(503) | FailureKind::Service { status: 503, .. },
            retry_after: Some(_),
        } => return Verdict::Down,
        Outcome::Failed { kind, .. } => kind,
        Outcome::PerEvent(each) => {
            return match verdict(outcome.summary()) {
                // Only events' own faults (too large): the endpoint took the others.
                Verdict::Neither if each.contains(&Outcome::Delivered) => Verdict::Up,
                v => v,
            };
        }
    };
    match kind {
        FailureKind::Connect => Verdict::Unreachable,
        FailureKind::Status(s) | FailureKind::Service { status: s, .. } => match *s {
            503 => Verdict::Unreachable,
            401 | 403 | 404 | 405 | 408 | 410 | 429 => Verdict::Down,
            400..=499 => Verdict::Neither,
            _ => Verdict::Down,
        },
        FailureKind::TooLarge(_) | FailureKind::Refused { .. } => Verdict::Neither,
        FailureKind::Throttled { .. }
        | FailureKind::CredentialExpired(_)
        | FailureKind::Timeout
        | FailureKind::Unsupported(_)
        | FailureKind::Other(_) => Verdict::Down,
    }
}
