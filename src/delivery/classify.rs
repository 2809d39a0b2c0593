//! Delivery policy as data: **whether** a failed attempt is retried ([`classify`], the one
//! status-code table) apart from **when** ([`Schedule::delay_after`], the one schedule function,
//! plus [`jitter`] and the `Retry-After` cap applied by [`super::retry::next_step`]).
//!
//! Two status-code policies:
//!
//! | outcome | `original` (default) | `standard` |
//! |---|---|---|
//! | 200–204 | delivered | delivered |
//! | 400, 413 | retried | dead-lettered at once when a dead-letter destination exists, else retried |
//! | Azure service 400, 403, 413 | dead-lettered at once | the same |
//! | Azure service 401, 404, 410 | retried; a configuration fault (warn, `gridlet_destination_faults_total`) | the same |
//! | 408, 429, 5xx, other statuses | retried | retried (`Retry-After` honoured on 429/503, capped) |
//! | timeout, connection error, other | retried | retried |
//! | Azure service 429/500/503 | retried, `Retry-After` honoured (capped) | the same |
//! | event too large for the destination | dead-lettered at once | the same |
//! | refused for good (namespace 410, no CloudEvents form) | dead-lettered at once | the same |
//! | throttled (namespace 403 for a quota) | retried, `Retry-After` honoured (capped) | the same |
//! | refused for good (MQTT PUBACK 0x87, 0x90, 0x95, 0x99...) | dead-lettered at once | the same |
//! | delay jitter | none (exact 1-min/10-min queues) | ± `broker__retryJitterPercent` |
//!
//! Three named schedules (delay before the next attempt, by attempts made so far):
//! `oneThenEveryTenMinutes` (1 min, then every 10 min), `tenSecondsToHourly` (10 s, 30 s, 1 m,
//! 5 m, 10 m, 30 m, 1 h, then hourly) and `doublingForFourDays` (`((2^n) - 1) * 84800 ms` for
//! retry n = 1..=11, the last about four days after the first attempt, then exhausted); their
//! old names `original`, `eventGridCloud` and `workfront` are accepted too
//! ([`ScheduleName::NAMES`]). TTL and `maxDeliveryAttempts` apply on top of every schedule.

use super::sink::{FailureKind, Outcome};
pub use crate::policy::{ConfigFault, QueueFullPolicy, Schedule, ScheduleName, StatusCodePolicy};
use std::time::Duration;

/// Whether an attempt's outcome ends delivery, asks for a retry, or refuses the event for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted.
    Delivered,
    /// Retry on the schedule; the endpoint may have asked for at least this delay.
    Retry {
        /// `Retry-After` to honour (already filtered by the policy).
        retry_after: Option<Duration>,
    },
    /// Will never succeed (400/413 under `standard` with a dead-letter destination).
    Refuse,
}

/// The status-code table: the only place that decides *whether* to retry.
pub fn classify(policy: StatusCodePolicy, outcome: &Outcome, dead_letter: bool) -> Verdict {
    let (kind, retry_after) = match outcome {
        Outcome::Delivered => return Verdict::Delivered,
        Outcome::Failed { kind, retry_after } => (kind, *retry_after),
        // The dispatcher settles each event apart; asked for the batch, its summary answers.
        Outcome::PerEvent(_) => return classify(policy, outcome.summary(), dead_letter),
    };
    match kind {
        // Never deliverable, whatever the policy.
        FailureKind::TooLarge(_) | FailureKind::Refused { .. } => return Verdict::Refuse,
        // A quota: back off (Event Grid namespaces' 403), under every policy.
        FailureKind::Throttled { .. } => return Verdict::Retry { retry_after },
        // Azure services ask for a delay when throttling or busy: honoured under every policy.
        FailureKind::Service {
            status: 429 | 500 | 503,
            ..
        } => return Verdict::Retry { retry_after },
        // Event Grid does not retry these from an Azure resource ("Event Grid message delivery
        // and retry": dead-lettered, or dropped without a dead-letter destination; gridlet
        // always keeps the letter locally): under every policy.
        FailureKind::Service {
            status: 400 | 403 | 413,
            ..
        } => return Verdict::Refuse,
        _ => {}
    }
    if policy == StatusCodePolicy::Original {
        return Verdict::Retry { retry_after: None };
    }
    match kind {
        FailureKind::Status(400 | 413)
        | FailureKind::Service {
            status: 400 | 413, ..
        } if dead_letter => Verdict::Refuse,
        FailureKind::Status(429 | 503) => Verdict::Retry { retry_after },
        FailureKind::Status(_)
        | FailureKind::Service { .. }
        | FailureKind::TooLarge(_)
        | FailureKind::Refused { .. }
        | FailureKind::Throttled { .. }
        | FailureKind::CredentialExpired(_)
        | FailureKind::Timeout
        | FailureKind::Connect
        | FailureKind::Unsupported(_)
        | FailureKind::Other(_) => Verdict::Retry { retry_after: None },
    }
}

/// The configuration fault an outcome reports, if any (Azure services only: a webhook's
/// 401/404 is the receiver's business). Retried like any failure, but logged at warn and
/// counted apart (`gridlet_destination_faults_total`).
pub fn config_fault(outcome: &Outcome) -> Option<ConfigFault> {
    match outcome.summary() {
        Outcome::Failed {
            kind: FailureKind::Service { status, .. },
            ..
        } => match status {
            401 => Some(ConfigFault::Unauthorized),
            404 => Some(ConfigFault::NotFound),
            410 => Some(ConfigFault::Gone),
            _ => None,
        },
        Outcome::Failed {
            kind: FailureKind::CredentialExpired(_),
            ..
        } => Some(ConfigFault::SasExpired),
        _ => None,
    }
}

/// `d` spread by ± `percent` %, deterministically from `key` (an event's sequence number and
/// attempt): no RNG state, so tests and restarts reproduce the same delays, while different
/// events spread out.
pub fn jitter(d: Duration, percent: u8, key: u64) -> Duration {
    if percent == 0 || d.is_zero() {
        return d;
    }
    // splitmix64: a well-mixed 64-bit value from the key.
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // u in [0, 1) with 53 bits; factor in [1 - p, 1 + p).
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    let p = f64::from(percent.min(100)) / 100.0;
    d.mul_f64((1.0 - p) + 2.0 * p * u)
}

/// The jitter key of one event's `attempts_made`-th failure.
pub fn jitter_key(seq: u64, attempts_made: u32) -> u64 {
    seq.rotate_left(17) ^ u64::from(attempts_made)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(code: u16) -> Outcome {
        Outcome::failed(FailureKind::Status(code))
    }

    fn svc(status: u16, retry_after: Option<Duration>) -> Outcome {
        Outcome::Failed {
            kind: FailureKind::Service {
                status,
                message: "AuthorizationFailure".into(),
            },
            retry_after,
        }
    }

    fn refused() -> Outcome {
        Outcome::failed(FailureKind::Refused {
            status: None,
            message: "PUBACK 0x87 not authorized".into(),
        })
    }

    fn too_large() -> Outcome {
        Outcome::failed(FailureKind::TooLarge("event e1 is 70000 bytes".into()))
    }

    #[test]
    fn schedules_are_the_documented_data() {
        let o = ScheduleName::OneThenEveryTenMinutes.schedule();
        assert_eq!(o.delay_after(1), Some(Duration::from_secs(60)));
        assert_eq!(o.delay_after(2), Some(Duration::from_secs(600)));
        assert_eq!(o.delay_after(29), Some(Duration::from_secs(600)));
        let eg = ScheduleName::TenSecondsToHourly.schedule();
        let secs: Vec<u64> = (1..=9)
            .map(|n| eg.delay_after(n).unwrap().as_secs())
            .collect();
        assert_eq!(secs, [10, 30, 60, 300, 600, 1800, 3600, 3600, 3600]);
        let wf = ScheduleName::DoublingForFourDays.schedule();
        assert_eq!(wf.delay_after(1), Some(Duration::from_millis(84_800)));
        assert_eq!(wf.delay_after(2), Some(Duration::from_millis(254_400)));
        assert_eq!(
            wf.delay_after(11),
            Some(Duration::from_millis(2047 * 84_800))
        );
        assert_eq!(wf.delay_after(12), None, "11 retries, then exhausted");
    }

    #[test]
    fn names_parse_in_any_case() {
        assert_eq!(
            ScheduleName::parse("EVENTGRIDCLOUD"),
            Some(ScheduleName::TenSecondsToHourly)
        );
        assert_eq!(ScheduleName::parse("nope"), None);
        assert_eq!(ScheduleName::parse(""), None);
        assert_eq!(
            StatusCodePolicy::parse("Standard"),
            Some(StatusCodePolicy::Standard)
        );
    }

    #[test]
    fn every_schedule_name_and_old_name_parses_in_any_case() {
        use ScheduleName::*;
        let expected = [
            ("oneThenEveryTenMinutes", "original", OneThenEveryTenMinutes),
            ("tenSecondsToHourly", "eventGridCloud", TenSecondsToHourly),
            ("doublingForFourDays", "workfront", DoublingForFourDays),
        ];
        assert_eq!(ScheduleName::NAMES, expected, "the documented names");
        for (name, old, schedule) in expected {
            for s in [
                name.to_string(),
                old.to_string(),
                name.to_uppercase(),
                old.to_lowercase(),
                format!(" {old} "),
            ] {
                assert_eq!(ScheduleName::parse(&s), Some(schedule), "{s:?}");
            }
            assert_eq!(schedule.as_str(), name, "the wire name says what it does");
            assert_eq!(schedule.old_name(), old);
        }
        let accepted: Vec<&str> = ScheduleName::ACCEPTED.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            accepted,
            [
                "oneThenEveryTenMinutes",
                "tenSecondsToHourly",
                "doublingForFourDays",
                "original",
                "eventGridCloud",
                "workfront"
            ]
        );
        assert_eq!(
            crate::policy::names_list(&ScheduleName::ACCEPTED),
            accepted.join(", ")
        );
        assert_eq!(ScheduleName::parse("originals"), None);
        assert_eq!(ScheduleName::parse("tenSeconds"), None);
    }

    #[test]
    fn the_status_code_table() {
        use StatusCodePolicy::*;
        let ra = Some(Duration::from_secs(7));
        let with_ra = |code| Outcome::Failed {
            kind: FailureKind::Status(code),
            retry_after: ra,
        };
        let retry = Verdict::Retry { retry_after: None };
        // (policy, outcome, dead letter exists, verdict)
        let table: Vec<(StatusCodePolicy, Outcome, bool, Verdict)> = vec![
            (Standard, Outcome::Delivered, true, Verdict::Delivered),
            (Original, Outcome::Delivered, true, Verdict::Delivered),
            (Standard, st(400), true, Verdict::Refuse),
            (Standard, st(413), true, Verdict::Refuse),
            (Standard, st(400), false, retry),
            (Standard, st(413), false, retry),
            (Original, st(400), true, retry),
            (Standard, st(408), true, retry),
            (Standard, st(404), true, retry),
            (Standard, st(500), true, retry),
            (Standard, st(302), true, retry),
            (
                Standard,
                with_ra(429),
                true,
                Verdict::Retry { retry_after: ra },
            ),
            (
                Standard,
                with_ra(503),
                true,
                Verdict::Retry { retry_after: ra },
            ),
            (Standard, with_ra(500), true, retry),
            (Original, with_ra(429), true, retry),
            (Standard, Outcome::failed(FailureKind::Timeout), true, retry),
            (Standard, Outcome::failed(FailureKind::Connect), true, retry),
            // Azure destinations: the service's Retry-After on 429/500/503 under both
            // policies; an event too large for the destination is refused under both.
            (
                Original,
                svc(429, ra),
                false,
                Verdict::Retry { retry_after: ra },
            ),
            (
                Original,
                svc(500, ra),
                true,
                Verdict::Retry { retry_after: ra },
            ),
            (
                Standard,
                svc(503, ra),
                true,
                Verdict::Retry { retry_after: ra },
            ),
            // Event Grid's no-retry codes for Azure resources: 400, 403, 413 under both
            // policies, with or without a dead-letter destination.
            (Original, svc(403, ra), true, Verdict::Refuse),
            (Original, svc(403, None), false, Verdict::Refuse),
            (Standard, svc(403, None), false, Verdict::Refuse),
            (Original, svc(400, None), false, Verdict::Refuse),
            (Original, svc(413, None), false, Verdict::Refuse),
            (Standard, svc(413, None), false, Verdict::Refuse),
            (Standard, svc(400, None), true, Verdict::Refuse),
            // Configuration faults: retried.
            (Standard, svc(404, ra), true, retry),
            (Original, svc(401, None), true, retry),
            (Standard, svc(410, None), false, retry),
            (Original, too_large(), false, Verdict::Refuse),
            (Standard, too_large(), false, Verdict::Refuse),
            (Original, refused(), false, Verdict::Refuse),
            (Standard, refused(), true, Verdict::Refuse),
        ];
        for (p, o, dl, v) in table {
            assert_eq!(classify(p, &o, dl), v, "{p:?} {o:?} dl={dl}");
        }
    }

    #[test]
    fn jitter_is_bounded_deterministic_and_spread() {
        let d = Duration::from_secs(100);
        assert_eq!(jitter(d, 0, 42), d);
        let mut seen = std::collections::HashSet::new();
        for key in 0..1000u64 {
            let j = jitter(d, 10, key);
            assert!(j >= Duration::from_secs(90) && j < Duration::from_secs(110));
            assert_eq!(j, jitter(d, 10, key));
            seen.insert(j.as_millis());
        }
        assert!(seen.len() > 500, "delays spread out");
    }
}
