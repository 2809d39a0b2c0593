//! What happens after an attempt: a pure function of the policy, the attempt count, the event's
//! age and the outcome. Every rule of docs/COMPATIBILITY.md §4 (schedule §4.2, limits §4.3) is a table-driven test below.
//!
//! The original's schedule: attempt 1 immediately; on failure into the **1-minute queue**
//! (attempt 2 one minute later); then the **10-minute queue** (every ten minutes) until success,
//! `maxDeliveryAttempts`, or the time to live. An event is never attempted at or after its TTL.
//!
//! Whether an outcome is retried at all comes from the status-code table
//! ([`classify::classify`]); the delay from the subscription's named schedule
//! ([`classify::Schedule::delay_after`]), widened to a capped `Retry-After` and jittered.

use super::classify::{self, Verdict};
use super::sink::Outcome;
use crate::clock::WallMs;
use crate::model::subscription::EffectivePolicy;
use std::time::Duration;

pub use crate::model::reason::DropReason;

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

/// Whether an event first enqueued at `first_ms` is past its TTL at `at_ms`.
pub fn is_expired(policy: &EffectivePolicy, first_ms: WallMs, at_ms: WallMs) -> bool {
    at_ms.saturating_sub(first_ms) >= policy.ttl.as_millis() as u64
}

/// Decide what follows an attempt. `jitter_key` identifies the event and attempt
/// ([`classify::jitter_key`]) so jitter is deterministic.
pub fn next_step(
    policy: &EffectivePolicy,
    attempts_made: u32,
    first_enqueued_ms: WallMs,
    now_ms: WallMs,
    outcome: &Outcome,
    jitter_key: u64,
) -> Step {
    let retry_after = match classify::classify(policy.status_codes, outcome, policy.dead_letter) {
        Verdict::Delivered => return Step::Done,
        Verdict::Refuse => return Step::Drop(DropReason::DeliveryRefused),
        Verdict::Retry { retry_after } => retry_after,
    };
    if attempts_made >= policy.max_attempts {
        return Step::Drop(DropReason::MaxDeliveryAttemptsExceeded);
    }
    let Some(base) = policy.schedule.schedule().delay_after(attempts_made) else {
        return Step::Drop(DropReason::MaxDeliveryAttemptsExceeded);
    };
    let mut delay = classify::jitter(base, policy.jitter_percent, jitter_key);
    if let Some(ra) = retry_after {
        delay = delay.max(ra.min(policy.retry_after_cap));
    }
    if is_expired(policy, first_enqueued_ms, now_ms + delay.as_millis() as u64) {
        return Step::Drop(DropReason::TimeToLiveExceeded);
    }
    Step::Retry(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::sink::FailureKind;

    /// Delays of the original's 1-minute and 10-minute queues.
    const ONE_MINUTE: Duration = Duration::from_secs(60);
    const TEN_MINUTES: Duration = Duration::from_secs(600);

    fn policy(max: u32, ttl_min: u64) -> EffectivePolicy {
        EffectivePolicy::original(max, Duration::from_secs(ttl_min * 60))
    }

    fn fail() -> Outcome {
        Outcome::failed(FailureKind::Status(500))
    }

    #[test]
    fn success_is_done() {
        assert_eq!(
            next_step(&policy(30, 120), 1, 0, 0, &Outcome::Delivered, 0),
            Step::Done
        );
    }

    #[test]
    fn first_failure_goes_to_the_one_minute_queue_then_ten_minutes() {
        assert_eq!(
            next_step(&policy(30, 120), 1, 0, 0, &fail(), 0),
            Step::Retry(ONE_MINUTE)
        );
        assert_eq!(
            next_step(&policy(30, 120), 2, 0, 60_000, &fail(), 0),
            Step::Retry(TEN_MINUTES)
        );
        assert_eq!(
            next_step(&policy(30, 120), 7, 0, 3_660_000, &fail(), 0),
            Step::Retry(TEN_MINUTES)
        );
    }

    #[test]
    fn max_attempts_drops() {
        assert_eq!(
            next_step(&policy(2, 120), 2, 0, 60_000, &fail(), 0),
            Step::Drop(DropReason::MaxDeliveryAttemptsExceeded)
        );
        assert_eq!(
            next_step(&policy(1, 120), 1, 0, 0, &fail(), 0),
            Step::Drop(DropReason::MaxDeliveryAttemptsExceeded)
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
            match next_step(&p, attempts, 0, t, &fail(), 0) {
                Step::Retry(d) => t += d.as_millis() as u64,
                Step::Drop(r) => {
                    assert_eq!(r, DropReason::TimeToLiveExceeded);
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
            next_step(&policy(30, 1), 1, 0, 0, &fail(), 0),
            Step::Drop(DropReason::TimeToLiveExceeded)
        );
    }

    fn standard(max: u32, ttl_min: u64) -> EffectivePolicy {
        EffectivePolicy {
            status_codes: classify::StatusCodePolicy::Standard,
            jitter_percent: 0,
            ..EffectivePolicy::original(max, Duration::from_secs(ttl_min * 60))
        }
    }

    fn status(code: u16, retry_after: Option<u64>) -> Outcome {
        Outcome::Failed {
            kind: FailureKind::Status(code),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn refused_only_under_standard_with_a_dead_letter_destination() {
        let mut p = standard(30, 120);
        assert_eq!(
            next_step(&p, 1, 0, 0, &status(400, None), 0),
            Step::Drop(DropReason::DeliveryRefused)
        );
        p.dead_letter = false;
        assert_eq!(
            next_step(&p, 1, 0, 0, &status(413, None), 0),
            Step::Retry(ONE_MINUTE)
        );
        assert_eq!(
            next_step(&policy(30, 120), 1, 0, 0, &status(400, None), 0),
            Step::Retry(ONE_MINUTE),
            "original: retried"
        );
    }

    #[test]
    fn retry_after_widens_the_delay_up_to_the_cap() {
        let mut p = standard(30, 24 * 60);
        p.retry_after_cap = Duration::from_secs(300);
        assert_eq!(
            next_step(&p, 1, 0, 0, &status(429, Some(120)), 0),
            Step::Retry(Duration::from_secs(120))
        );
        assert_eq!(
            next_step(&p, 1, 0, 0, &status(503, Some(86_400)), 0),
            Step::Retry(Duration::from_secs(300)),
            "capped"
        );
        assert_eq!(
            next_step(&p, 2, 0, 0, &status(503, Some(5)), 0),
            Step::Retry(TEN_MINUTES),
            "never shorter than the schedule"
        );
        assert_eq!(
            next_step(&p, 1, 0, 0, &status(500, Some(120)), 0),
            Step::Retry(ONE_MINUTE),
            "only 429 and 503"
        );
        assert_eq!(
            next_step(&policy(30, 120), 1, 0, 0, &status(429, Some(120)), 0),
            Step::Retry(ONE_MINUTE),
            "original ignores Retry-After"
        );
    }

    #[test]
    fn workfront_schedule_is_exhausted_after_eleven_retries() {
        let p = EffectivePolicy {
            schedule: classify::ScheduleName::DoublingForFourDays,
            ..EffectivePolicy::original(1000, Duration::from_secs(30 * 24 * 3600))
        };
        assert_eq!(
            next_step(&p, 11, 0, 0, &fail(), 0),
            Step::Retry(Duration::from_millis(2047 * 84_800))
        );
        assert_eq!(
            next_step(&p, 12, 0, 0, &fail(), 0),
            Step::Drop(DropReason::MaxDeliveryAttemptsExceeded)
        );
    }

    #[test]
    fn standard_jitter_stays_within_bounds() {
        let mut p = standard(30, 120);
        p.jitter_percent = 10;
        for key in 0..100 {
            let Step::Retry(d) = next_step(&p, 1, 0, 0, &fail(), key) else {
                panic!("retry expected")
            };
            assert!(d >= Duration::from_secs(54) && d < Duration::from_secs(66));
        }
    }
}
