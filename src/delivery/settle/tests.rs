//! `settle` from a table: every outcome × attempt and TTL edge × policy, one case a line. Each
//! case's effects are written out as text (`show`), in the order they are applied.

use super::*;
use crate::delivery::payload::EventData;
use crate::delivery::sink::FailureKind;
use crate::policy::StatusCodePolicy;
use crate::store::Settled;
use bytes::Bytes;
use std::sync::Arc;

const MIN: u64 = 60_000;

/// The original module's policy: `max` attempts, `ttl` minutes.
fn original(max: u32, ttl: u64) -> EffectivePolicy {
    EffectivePolicy::original(max, Duration::from_millis(ttl * MIN))
}

/// The standard status-code policy (no jitter, Retry-After up to 5 min), with a dead-letter
/// destination or not.
fn standard(max: u32, ttl: u64, dead_letter: bool) -> EffectivePolicy {
    EffectivePolicy {
        status_codes: StatusCodePolicy::Standard,
        retry_after_cap: Duration::from_secs(300),
        dead_letter,
        ..original(max, ttl)
    }
}

/// Event `seq`, attempted `attempts` times, first enqueued at `first` minutes.
fn ev(seq: u64, attempts: u32, first: u64) -> Pending {
    Pending {
        seq,
        event: Arc::new(EventData::new(
            Bytes::from_static(b"{}"),
            format!("e{seq}").into(),
            None,
            None,
        )),
        attempts,
        first_enqueued_ms: first * MIN,
        enqueued_at: tokio::time::Instant::now(),
    }
}

/// A batch from the ready lane.
fn batch(items: Vec<Pending>) -> Batch {
    Batch {
        items,
        retry: false,
    }
}

fn ok() -> Outcome {
    Outcome::Delivered
}

fn status(code: u16) -> Outcome {
    Outcome::failed(FailureKind::Status(code))
}

fn busy(retry_after_secs: u64) -> Outcome {
    Outcome::Failed {
        kind: FailureKind::Status(429),
        retry_after: Some(Duration::from_secs(retry_after_secs)),
    }
}

fn too_large() -> Outcome {
    Outcome::failed(FailureKind::TooLarge("e".into()))
}

fn seqs(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn seqs_of(items: &[Pending]) -> String {
    seqs(&items.iter().map(|p| p.seq).collect::<Vec<_>>())
}

/// The effects as one line: what is done, in order.
fn show(fx: &Effects) -> String {
    let mut out: Vec<String> = Vec::new();
    if !fx.delivered.is_empty() {
        out.push(format!("delivered {}", seqs_of(&fx.delivered)));
    }
    for (o, n) in &fx.failed {
        let Outcome::Failed { kind, .. } = o else {
            panic!("a failed group's outcome is a failure: {o:?}")
        };
        out.push(format!("failed {kind} x{n}"));
    }
    for w in &fx.writes {
        out.push(match w {
            Write::Remove { events } => format!("remove {}", seqs(&Settled::seqs(events))),
            Write::RetryState { seqs: s, state } => format!(
                "store {} attempts {} first {}m due {}m",
                seqs(s),
                state.attempts,
                state.first_enqueued_ms / MIN,
                state.due_ms / MIN
            ),
            Write::KeepLetters { letters, events } => {
                let s = &Settled::seqs(events);
                let l = &letters[0];
                let why = l.last_error.as_deref().unwrap_or("-");
                let kept = format!(
                    "keep {} {} ({why})",
                    seqs(&letters.iter().map(|l| l.seq).collect::<Vec<_>>()),
                    l.reason.as_str()
                );
                if s.is_empty() {
                    kept
                } else {
                    format!("{kept} then remove {}", seqs(s))
                }
            }
        });
    }
    if !fx.forward.is_empty() {
        let f: Vec<u64> = fx.forward.iter().map(|l| l.seq).collect();
        out.push(format!("forward {}", seqs(&f)));
    }
    if let Some(r) = &fx.requeue {
        out.push(format!(
            "requeue {} in {}s",
            seqs_of(&r.items),
            r.delay.as_secs()
        ));
    }
    out.push(format!("leave {}", fx.leaving().0));
    out.join("; ")
}

/// `(policy, persisted, forwards)`.
type Sub = (EffectivePolicy, bool, bool);

fn rules(s: &Sub) -> Rules<'_> {
    Rules {
        policy: &s.0,
        persisted: s.1,
        forwards: s.2,
        hold_outages: false,
    }
}

/// Issue 34: with the endpoint's health tracked, an attempt that found it unreachable (no
/// connection, 503) is not charged: the events go back as they were, due at once, nothing
/// written, even past `maxDeliveryAttempts`' edge; any answer from the endpoint is settled as
/// before. Without health tracking the same outcomes take the schedule.
#[test]
fn outages_are_not_charged_while_health_is_tracked() {
    let p = original(3, 120);
    let held = Rules {
        policy: &p,
        persisted: true,
        forwards: false,
        hold_outages: true,
    };
    let connect = Outcome::failed(FailureKind::Connect);
    #[rustfmt::skip]
    let cases: Vec<(Vec<Pending>, Outcome, &str)> = vec![
        (vec![ev(1, 1, 0), ev(2, 3, 0)], connect.clone(), "failed connection failed x2; requeue 1,2 in 0s; leave 0"),
        (vec![ev(1, 3, 0)], status(503), "failed HTTP 503 x1; requeue 1 in 0s; leave 0"),
        (vec![ev(1, 3, 0)], status(500), "failed HTTP 500 x1; keep 1 MaxDeliveryAttemptsExceeded (HTTP 500) then remove 1; leave 1"),
        (vec![ev(1, 1, 0), ev(2, 1, 0)], Outcome::per_event(vec![ok(), connect.clone()]), "delivered 1; failed connection failed x1; remove 1; requeue 2 in 0s; leave 1"),
    ];
    for (i, (items, outcome, want)) in cases.into_iter().enumerate() {
        let fx = settle(held, batch(items), outcome, 11 * MIN);
        assert_eq!(show(&fx), want, "case {i}");
        if let Some(r) = &fx.requeue {
            let attempts: Vec<u32> = r.items.iter().map(|p| p.attempts).collect();
            assert!(
                attempts == [0, 2] || attempts == [2] || attempts == [0],
                "case {i}: {attempts:?}"
            );
        }
    }
    let untracked = Rules {
        hold_outages: false,
        ..held
    };
    let fx = settle(untracked, batch(vec![ev(1, 1, 0)]), connect, 0);
    assert_eq!(
        show(&fx),
        "failed connection failed x1; store 1 attempts 1 first 0m due 1m; requeue 1 in 60s; leave 0"
    );
}

#[test]
fn every_outcome_attempt_and_ttl_edge_and_policy() {
    let mem: Sub = (original(30, 120), false, false);
    let disk: Sub = (original(30, 120), true, false);
    let disk_fwd: Sub = (original(30, 120), true, true);
    let three: Sub = (original(3, 120), true, false);
    let std_dl: Sub = (standard(30, 24 * 60, true), true, false);
    let std_no_dl: Sub = (standard(30, 24 * 60, false), false, false);
    #[rustfmt::skip]
    let cases: Vec<(&Sub, Vec<Pending>, Outcome, u64, &str)> = vec![
        // Delivered: removed (persisted only), the queue gives the places back.
        (&mem, vec![ev(1, 1, 0), ev(2, 1, 0)], ok(), 0, "delivered 1,2; leave 2"),
        (&disk, vec![ev(1, 1, 0), ev(2, 1, 0)], ok(), 0, "delivered 1,2; remove 1,2; leave 2"),
        (&disk, vec![ev(1, 13, 0)], ok(), 119 * MIN, "delivered 1; remove 1; leave 1"),
        // First failure: the 1-minute lane, its state stored first when persisted.
        (&mem, vec![ev(1, 1, 0)], status(500), 0, "failed HTTP 500 x1; requeue 1 in 60s; leave 0"),
        (&disk, vec![ev(1, 1, 0), ev(2, 1, 0)], status(500), 0, "failed HTTP 500 x2; store 1,2 attempts 1 first 0m due 1m; requeue 1,2 in 60s; leave 0"),
        // Later failures: every 10 minutes; the state keeps the oldest first enqueue.
        (&disk, vec![ev(1, 2, 5), ev(2, 2, 3)], status(503), 6 * MIN, "failed HTTP 503 x2; store 1,2 attempts 2 first 3m due 16m; requeue 1,2 in 600s; leave 0"),
        // Attempt edges: max - 1 retries, max drops (original: 500 is retried until then).
        (&three, vec![ev(1, 2, 0)], status(500), MIN, "failed HTTP 500 x1; store 1 attempts 2 first 0m due 11m; requeue 1 in 600s; leave 0"),
        (&three, vec![ev(1, 3, 0)], status(500), 11 * MIN, "failed HTTP 500 x1; keep 1 MaxDeliveryAttemptsExceeded (HTTP 500) then remove 1; leave 1"),
        (&mem, vec![ev(1, 30, 0)], status(500), 0, "failed HTTP 500 x1; keep 1 MaxDeliveryAttemptsExceeded (HTTP 500); leave 1"),
        // TTL edges: a retry due before the TTL goes; one due at or after it is dropped now.
        (&disk, vec![ev(1, 2, 0)], status(500), 109 * MIN, "failed HTTP 500 x1; store 1 attempts 2 first 0m due 119m; requeue 1 in 600s; leave 0"),
        (&disk, vec![ev(1, 2, 0)], status(500), 110 * MIN, "failed HTTP 500 x1; keep 1 TimeToLiveExceeded (HTTP 500) then remove 1; leave 1"),
        // A batch splits by each event's own step: retried, over its attempts, past its TTL.
        (&three, vec![ev(1, 1, 100), ev(2, 3, 100), ev(3, 1, 0)], status(500), 119 * MIN, "failed HTTP 500 x3; store 1 attempts 1 first 100m due 120m; keep 2 MaxDeliveryAttemptsExceeded (HTTP 500) then remove 2; keep 3 TimeToLiveExceeded (HTTP 500) then remove 3; requeue 1 in 60s; leave 2"),
        // Status-code policies: 400 is retried by the original, refused by standard with a
        // dead-letter destination, retried by standard without one.
        (&disk, vec![ev(1, 1, 0)], status(400), 0, "failed HTTP 400 x1; store 1 attempts 1 first 0m due 1m; requeue 1 in 60s; leave 0"),
        (&std_dl, vec![ev(1, 1, 0)], status(400), 0, "failed HTTP 400 x1; keep 1 DeliveryRefused (HTTP 400) then remove 1; leave 1"),
        (&std_no_dl, vec![ev(1, 1, 0)], status(413), 0, "failed HTTP 413 x1; requeue 1 in 60s; leave 0"),
        // Retry-After: widens the delay up to the cap (standard), ignored by the original.
        (&std_dl, vec![ev(1, 1, 0)], busy(120), 0, "failed HTTP 429 x1; store 1 attempts 1 first 0m due 2m; requeue 1 in 120s; leave 0"),
        (&std_dl, vec![ev(1, 1, 0)], busy(86_400), 0, "failed HTTP 429 x1; store 1 attempts 1 first 0m due 5m; requeue 1 in 300s; leave 0"),
        (&disk, vec![ev(1, 1, 0)], busy(120), 0, "failed HTTP 429 x1; store 1 attempts 1 first 0m due 1m; requeue 1 in 60s; leave 0"),
        // Too large: refused under every policy; forwarded when there is a destination.
        (&disk, vec![ev(1, 1, 0)], too_large(), 0, "failed too large: e x1; keep 1 DeliveryRefused (too large: e) then remove 1; leave 1"),
        (&disk_fwd, vec![ev(1, 1, 0)], too_large(), 0, "failed too large: e x1; keep 1 DeliveryRefused (too large: e) then remove 1; forward 1; leave 1"),
        // Per-event outcomes: each event by its own, groups in first-seen order.
        (&disk_fwd, vec![ev(1, 1, 0), ev(2, 1, 0), ev(3, 1, 0), ev(4, 1, 0)],
            Outcome::per_event(vec![ok(), too_large(), status(503), ok()]), 0,
            "delivered 1,4; failed too large: e x1; failed HTTP 503 x1; remove 1,4; keep 2 DeliveryRefused (too large: e) then remove 2; store 3 attempts 1 first 0m due 1m; forward 2; requeue 3 in 60s; leave 3"),
        // Two failed groups that both retry travel as one requeue, due with the later.
        (&std_dl, vec![ev(1, 1, 0), ev(2, 2, 0)],
            Outcome::per_event(vec![busy(120), status(500)]), 0,
            "failed HTTP 429 x1; failed HTTP 500 x1; store 1 attempts 1 first 0m due 2m; store 2 attempts 2 first 0m due 10m; requeue 1,2 in 600s; leave 0"),
        // A sink that miscounted: its summary for every event.
        (&mem, vec![ev(1, 1, 0), ev(2, 1, 0)], Outcome::PerEvent(vec![status(500)]), 0, "failed HTTP 500 x2; requeue 1,2 in 60s; leave 0"),
    ];
    for (i, (sub, items, outcome, now, want)) in cases.into_iter().enumerate() {
        let fx = settle(rules(sub), batch(items), outcome, now);
        assert_eq!(fx.freed, Some(false), "case {i}");
        assert_eq!(show(&fx), want, "case {i}");
    }
}

#[test]
fn a_retry_lane_batch_frees_a_retry_slot() {
    let sub: Sub = (original(30, 120), false, false);
    let b = Batch {
        items: vec![ev(1, 2, 0)],
        retry: true,
    };
    assert_eq!(settle(rules(&sub), b, ok(), 0).freed, Some(true));
}

#[test]
fn events_leaving_without_an_attempt_are_kept_then_removed() {
    let mem: Sub = (original(30, 120), false, false);
    let disk_fwd: Sub = (original(30, 120), true, true);
    #[rustfmt::skip]
    let cases: Vec<(&Sub, Vec<Pending>, DropReason, bool, &str)> = vec![
        // Expired in the queue: their places are given back.
        (&disk_fwd, vec![ev(1, 0, 0), ev(2, 4, 0)], DropReason::TimeToLiveExceeded, true, "keep 1,2 TimeToLiveExceeded (-) then remove 1,2; forward 1,2; leave 2"),
        (&mem, vec![ev(1, 0, 0)], DropReason::TimeToLiveExceeded, true, "keep 1 TimeToLiveExceeded (-); leave 1"),
        // Never queued (a full queue's overflow, expired while stopped): no places to give back.
        (&mem, vec![ev(1, 0, 0)], DropReason::QueueFull, false, "keep 1 QueueFull (-); leave 0"),
        (&disk_fwd, vec![ev(7, 2, 0)], DropReason::TimeToLiveExceeded, false, "keep 7 TimeToLiveExceeded (-) then remove 7; forward 7; leave 0"),
        (&disk_fwd, vec![], DropReason::TimeToLiveExceeded, true, "leave 0"),
    ];
    for (i, (sub, items, reason, queued, want)) in cases.into_iter().enumerate() {
        let fx = dead_letter(rules(sub), items, reason, 5 * MIN, queued);
        assert_eq!(fx.freed, None, "case {i}");
        assert!(fx.dropped.iter().all(|d| !d.by_attempt), "case {i}");
        assert_eq!(show(&fx), want, "case {i}");
    }
}

#[test]
fn letters_carry_the_deciding_attempt() {
    let sub: Sub = (original(1, 120), true, false);
    let fx = settle(rules(&sub), batch(vec![ev(9, 1, 2)]), status(502), 3 * MIN);
    let Some(Write::KeepLetters { letters, .. }) = fx.writes.first() else {
        panic!("a letter is kept: {}", show(&fx))
    };
    let l = &letters[0];
    assert_eq!(
        (l.seq, &*l.event_id, l.attempts, l.last_status),
        (9, "e9", 1, Some(502))
    );
    assert_eq!(
        (l.first_enqueued_ms, l.dead_lettered_ms),
        (2 * MIN, 3 * MIN)
    );
    assert!(fx.dropped[0].by_attempt);
}
