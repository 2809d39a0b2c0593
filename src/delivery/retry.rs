//! What happens after an attempt: a pure function of the policy, the attempt count, the event's
//! age and the outcome. Every rule of the contract's §4 is a table-driven test below.
//!
//! The original's schedule: attempt 1 immediately; on failure into the **1-minute queue**
//! (attempt 2 one minute later); then the **10-minute queue** (every ten minutes) until success,
//! `maxDeliveryAttempts`, or the time to live. An event is never attempted at or after its TTL.

use super::sink::Outcome;
use crate::clock::WallMs;
use crate::model::subscription::EffectivePolicy;
use std::time::Duration;

/// Delay of the 1-minute queue.
pub const ONE_MINUTE: Duration = Duration::from_secs(60);
/// Delay of the 10-minute queue.
pub const TEN_MINUTES: Duration = Duration::from_secs(600);

/// Why an event left the queue without being delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// `maxDeliveryAttempts` reached.
    MaxAttempts,
    /// Time to live passed.
    Expired,
}

impl DropReason {
    /// Stable name (metrics label, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxAttempts => "MaxDeliveryAttemptsExceeded",
            Self::Expired => "TimeToLiveExceeded",
        }
    }
}

/// The decision after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Delivered: remove it.
    Done,
    /// Try again after this delay.
    Retry(Duration),
    /// Give up.
    Drop(DropReason),
}

/// The delay before attempt `attempts_made + 1` under the original schedule.
pub fn original_delay(attempts_made: u32) -> Duration {
    if attempts_made <= 1 {
        ONE_MINUTE
    } else {
        TEN_MINUTES
    }
}

/// Whether an event first enqueued at `first_ms` is past its TTL at `at_ms`.
pub fn is_expired(policy: &EffectivePolicy, first_ms: WallMs, at_ms: WallMs) -> bool {
    at_ms.saturating_sub(first_ms) >= policy.ttl.as_millis() as u64
}

/// Decide what follows an attempt.
pub fn next_step(
    policy: &EffectivePolicy,
    attempts_made: u32,
    first_enqueued_ms: WallMs,
    now_ms: WallMs,
    outcome: &Outcome,
) -> Step {
    if *outcome == Outcome::Delivered {
        return Step::Done;
    }
    if attempts_made >= policy.max_attempts {
        return Step::Drop(DropReason::MaxAttempts);
    }
    let delay = original_delay(attempts_made);
    if is_expired(policy, first_enqueued_ms, now_ms + delay.as_millis() as u64) {
        return Step::Drop(DropReason::Expired);
    }
    Step::Retry(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::sink::FailureKind;

    fn policy(max: u32, ttl_min: u64) -> EffectivePolicy {
        EffectivePolicy {
            max_attempts: max,
            ttl: Duration::from_secs(ttl_min * 60),
        }
    }

    fn fail() -> Outcome {
        Outcome::failed(FailureKind::Status(500))
    }

    #[test]
    fn success_is_done() {
        assert_eq!(
            next_step(&policy(30, 120), 1, 0, 0, &Outcome::Delivered),
            Step::Done
        );
    }

    #[test]
    fn first_failure_goes_to_the_one_minute_queue_then_ten_minutes() {
        assert_eq!(
            next_step(&policy(30, 120), 1, 0, 0, &fail()),
            Step::Retry(ONE_MINUTE)
        );
        assert_eq!(
            next_step(&policy(30, 120), 2, 0, 60_000, &fail()),
            Step::Retry(TEN_MINUTES)
        );
        assert_eq!(
            next_step(&policy(30, 120), 7, 0, 3_660_000, &fail()),
            Step::Retry(TEN_MINUTES)
        );
    }

    #[test]
    fn max_attempts_drops() {
        assert_eq!(
            next_step(&policy(2, 120), 2, 0, 60_000, &fail()),
            Step::Drop(DropReason::MaxAttempts)
        );
        assert_eq!(
            next_step(&policy(1, 120), 1, 0, 0, &fail()),
            Step::Drop(DropReason::MaxAttempts)
        );
    }

    #[test]
    fn ttl_wins_over_attempts_with_the_defaults() {
        // Defaults: 30 attempts, 120 min: attempts at 0, 1, 11, …, 111 min (13), then dropped.
        let p = policy(30, 120);
        let mut t = 0u64;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match next_step(&p, attempts, 0, t, &fail()) {
                Step::Retry(d) => t += d.as_millis() as u64,
                Step::Drop(r) => {
                    assert_eq!(r, DropReason::Expired);
                    break;
                }
                Step::Done => unreachable!(),
            }
        }
        assert_eq!(attempts, 13);
        assert_eq!(t, 111 * 60_000);
    }

    #[test]
    fn one_minute_ttl_allows_no_retry() {
        assert_eq!(
            next_step(&policy(30, 1), 1, 0, 0, &fail()),
            Step::Drop(DropReason::Expired)
        );
    }
}
