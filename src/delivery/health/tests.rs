//! The tracker's rules, the verdict table, outages, records and recovery announcements.

use super::*;
use crate::delivery::sink::FailureKind;
use serde_json::json;

/// Issue 20, Low 10: the health-change log line names the endpoint without the keys
/// webhook URLs carry in their path.
#[test]
fn logged_endpoints_hide_path_tokens() {
    let url = "https://discord.com/api/webhooks/112233445566778899/AbC-dEf_GhIjKlMnOpQrStUvWxYz0123?wait=true";
    assert_eq!(redact_url(url), "https://discord.com/api/webhooks/***/***");
    assert_eq!(
        redact_url("http://h.example:8080/hook?code=k"),
        "http://h.example:8080/hook"
    );
}

#[test]
fn only_what_concerns_the_endpoint_counts() {
    let failed = |k: FailureKind| Outcome::failed(k);
    assert_eq!(verdict(&Outcome::Delivered), Verdict::Up);
    for s in [500, 502, 429, 408, 401, 403, 404, 410, 301] {
        assert_eq!(
            verdict(&failed(FailureKind::Status(s))),
            Verdict::Down,
            "{s}"
        );
    }
    for k in [FailureKind::Timeout, FailureKind::Other("tls".into())] {
        assert_eq!(verdict(&failed(k)), Verdict::Down);
    }
    let busy = Outcome::Failed {
        kind: FailureKind::Status(503),
        retry_after: Some(std::time::Duration::from_secs(5)),
    };
    assert_eq!(verdict(&busy), Verdict::Down, "a 503 asking for time");
    // The way to the endpoint is down: an outage, not a failure.
    for k in [
        FailureKind::Connect,
        FailureKind::Status(503),
        FailureKind::Service {
            status: 503,
            message: String::new(),
        },
    ] {
        assert_eq!(verdict(&failed(k)), Verdict::Unreachable);
    }
    for s in [400, 409, 413, 415, 422] {
        assert_eq!(
            verdict(&failed(FailureKind::Status(s))),
            Verdict::Neither,
            "{s}"
        );
    }
    let service = FailureKind::Service {
        status: 413,
        message: String::new(),
    };
    assert_eq!(verdict(&failed(service)), Verdict::Neither);
    assert_eq!(
        verdict(&failed(FailureKind::TooLarge("64 KiB".into()))),
        Verdict::Neither
    );
}

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;

fn cfg() -> HealthConfig {
    HealthConfig::default()
}

#[test]
fn failure_rate_over_more_than_100_attempts_disables() {
    let c = cfg();
    let mut t = Tracker::new(0);
    // 100 attempts at 80 % failure: not yet (needs *more than* 100).
    for i in 0..100 {
        t.record(&c, i % 5 == 0, 1000);
    }
    assert_eq!(t.state(), HealthState::Closed);
    t.record(&c, false, 1000);
    assert_eq!(t.state(), HealthState::Disabled);
    // 70 % exactly does not trip: rate must exceed it.
    let mut t = Tracker::new(0);
    for i in 0..110 {
        t.record(&c, i % 10 < 3, 1000);
    }
    assert_eq!(t.state(), HealthState::Closed);
}

#[test]
fn closed_disabled_probe_and_reenabled_on_success() {
    let c = HealthConfig {
        disable_min_attempts: u32::MAX,
        ..cfg()
    };
    let mut t = Tracker::new(0);
    for _ in 0..1999 {
        t.record(&c, false, MIN);
    }
    assert_eq!(t.state(), HealthState::Closed);
    assert_eq!(t.record(&c, false, MIN), HealthState::Disabled);
    // Nothing until the probe is due, then exactly one probe.
    assert_eq!(t.admit(MIN + 1), Admission::WaitUntil(11 * MIN));
    assert_eq!(t.admit(11 * MIN), Admission::Probe);
    t.start_probe(&c, 11 * MIN);
    assert_eq!(t.admit(11 * MIN), Admission::ProbeInFlight);
    assert_eq!(
        t.admit(30 * MIN),
        Admission::ProbeInFlight,
        "a hanging probe"
    );
    // A failed probe: next one ten minutes later.
    assert_eq!(t.record(&c, false, 11 * MIN), HealthState::Disabled);
    assert_eq!(t.admit(15 * MIN), Admission::WaitUntil(21 * MIN));
    assert_eq!(t.admit(21 * MIN), Admission::Probe);
    t.start_probe(&c, 21 * MIN);
    assert_eq!(t.record(&c, true, 21 * MIN), HealthState::Closed);
    assert_eq!(t.admit(21 * MIN), Admission::Send);
    assert_eq!(t.snapshot().consecutive_failures, 0);
}

#[test]
fn disabled_then_frozen_after_72_hours_without_success() {
    let c = cfg();
    let mut t = Tracker::new(0);
    for _ in 0..2000 {
        t.record(&c, false, HOUR);
    }
    assert_eq!(t.state(), HealthState::Disabled);
    // More than 2,000 consecutive failures but the last "success" (start) is 1 h ago.
    t.record(&c, false, HOUR);
    assert_eq!(t.state(), HealthState::Disabled);
    // Probes keep failing; past 72 h the next failure freezes it.
    assert_eq!(t.record(&c, false, 72 * HOUR), HealthState::Disabled);
    assert_eq!(t.record(&c, false, 72 * HOUR + 1), HealthState::Frozen);
    assert_eq!(t.admit(100 * HOUR), Admission::Blocked);
    // Even a late success (an in-flight request) does not unfreeze it.
    assert_eq!(t.record(&c, true, 100 * HOUR), HealthState::Frozen);
    t.enable(101 * HOUR);
    assert_eq!(t.state(), HealthState::Closed);
    assert_eq!(t.admit(101 * HOUR), Admission::Send);
    assert_eq!(t.snapshot().consecutive_failures, 0);
}

#[test]
fn more_than_50000_consecutive_failures_freeze_whenever_the_last_success_was() {
    let c = HealthConfig {
        disable_consecutive_failures: u64::MAX,
        disable_min_attempts: u32::MAX,
        ..cfg()
    };
    let mut t = Tracker::new(0);
    for _ in 0..50_000 {
        t.record(&c, false, 1);
    }
    assert_eq!(t.state(), HealthState::Closed);
    assert_eq!(t.record(&c, false, 1), HealthState::Frozen);
}

#[test]
fn records_round_trip_and_closed_keeps_none() {
    let c = HealthConfig {
        disable_consecutive_failures: 2,
        freeze_any_consecutive_failures: 3,
        ..cfg()
    };
    let mut t = Tracker::new(5);
    assert_eq!(t.to_record(), None);
    t.record(&c, false, 10);
    t.record(&c, false, 10);
    let disabled = Tracker::from_record(&t.to_record().unwrap()).unwrap();
    assert_eq!(disabled.snapshot().state, HealthState::Disabled);
    assert_eq!(disabled.admit(10), Admission::WaitUntil(10 + 600_000));
    assert_eq!(disabled.snapshot().last_success_ms, 5);
    t.record(&c, false, 10);
    t.record(&c, false, 10);
    let rec = t.to_record().unwrap();
    assert_eq!(rec["state"], "Frozen");
    let mut back = Tracker::from_record(&rec).unwrap();
    assert_eq!(back.admit(u64::MAX), Admission::Blocked);
    assert_eq!(back.snapshot().consecutive_failures, 4);
    assert_eq!(back.snapshot().attempts, 4);
    back.enable(20);
    assert_eq!(back.to_record(), None);
    assert!(Tracker::from_record(&json!({"state": "Odd"})).is_none());
}

/// Issue 34: days of outage never disable or freeze; one probe per outage interval; any
/// answer ends the outage; a restart keeps it.
#[test]
fn an_outage_of_days_neither_disables_nor_freezes_and_probes_every_interval() {
    let c = cfg();
    let probe = c.outage_probe_interval.as_millis() as u64;
    assert_eq!(probe, 30_000);
    let mut t = Tracker::new(0);
    t.record_unreachable(&c, MIN);
    assert_eq!(t.outage_since(), Some(MIN));
    assert_eq!(t.admit(MIN + 1), Admission::WaitUntil(MIN + probe));
    // Five days of probes, every one unreachable.
    let mut now = MIN + probe;
    while now < 5 * 24 * HOUR {
        assert_eq!(t.admit(now), Admission::Probe, "at {now}");
        t.start_probe(&c, now);
        assert_eq!(t.admit(now + 1), Admission::ProbeInFlight);
        t.record_unreachable(&c, now + 10);
        assert_eq!(t.admit(now + 10), Admission::WaitUntil(now + 10 + probe));
        now += 10 + probe;
    }
    let s = t.snapshot();
    assert_eq!(s.state, HealthState::Closed, "never disabled or frozen");
    assert_eq!(s.consecutive_failures, 0);
    assert!(s.attempts > 14_000, "{}", s.attempts);
    assert_eq!(s.outage_since_ms, Some(MIN));
    // The record keeps the outage across a restart.
    let back = Tracker::from_record(&t.to_record().unwrap()).unwrap();
    assert_eq!(back.outage_since(), Some(MIN));
    assert_eq!(back.admit(now - probe), Admission::WaitUntil(now));
    // The probe gets through.
    t.start_probe(&c, now);
    assert_eq!(t.record(&c, true, now + 5), HealthState::Closed);
    assert_eq!(t.outage_since(), None);
    assert_eq!(t.admit(now + 5), Admission::Send);
    assert_eq!(t.to_record(), None);
    // An answer that is an error also ends the outage, and counts as usual.
    t.record_unreachable(&c, now + 6);
    t.record_neither(&c, now + 7);
    assert_eq!(t.outage_since(), None);
    t.record_unreachable(&c, now + 8);
    t.record(&c, false, now + 9);
    assert_eq!(
        (t.outage_since(), t.snapshot().consecutive_failures),
        (None, 1)
    );
}

#[test]
fn a_disabled_endpoint_in_an_outage_is_probed_at_the_outage_interval_and_frozen_stays_frozen() {
    let c = HealthConfig {
        disable_consecutive_failures: 2,
        disable_min_attempts: u32::MAX,
        freeze_any_consecutive_failures: 4,
        ..cfg()
    };
    let mut t = Tracker::new(0);
    t.record(&c, false, 0);
    t.record(&c, false, 0);
    assert_eq!(t.state(), HealthState::Disabled);
    t.record_unreachable(&c, 1000);
    assert_eq!(t.admit(1000), Admission::WaitUntil(31_000));
    // The endpoint answers (an error): back to its 10-minute probes.
    t.record(&c, false, 31_000);
    assert_eq!(t.admit(31_001), Admission::WaitUntil(31_000 + 600_000));
    t.record(&c, false, 40_000);
    t.record(&c, false, 40_000);
    assert_eq!(t.state(), HealthState::Frozen);
    t.record_unreachable(&c, 50_000);
    assert_eq!(t.admit(u64::MAX), Admission::Blocked);
}

#[tokio::test]
async fn a_success_after_an_outage_announces_the_recovery() {
    let reg = HealthRegistry::default();
    let c = cfg();
    let h = reg.get("https://ns.example/topics/t:publish", 0);
    let mut rx = h.recoveries();
    let connect = Outcome::failed(FailureKind::Connect);
    h.record_outcome(&c, &connect, 10);
    h.record_outcome(&c, &Outcome::failed(FailureKind::Status(503)), 20);
    assert!(!rx.has_changed().unwrap());
    h.record_outcome(&c, &Outcome::Delivered, 30);
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), 1);
    // Success without an outage, or an outage ended by an error answer: no announcement.
    h.record_outcome(&c, &Outcome::Delivered, 40);
    h.record_outcome(&c, &connect, 50);
    h.record_outcome(&c, &Outcome::failed(FailureKind::Status(500)), 60);
    assert!(!rx.has_changed().unwrap());
}

#[test]
fn successes_reset_consecutive_failures_and_the_window_slides() {
    let c = HealthConfig {
        window_attempts: 200,
        ..cfg()
    };
    let mut t = Tracker::new(0);
    for _ in 0..150 {
        t.record(&c, true, 0);
    }
    for _ in 0..60 {
        t.record(&c, false, 0);
    }
    // Window of 200: 140 successes, 60 failures = 30 %.
    let s = t.snapshot();
    assert_eq!(s.window_attempts, 200);
    assert!((s.failure_rate - 0.3).abs() < 1e-9);
    assert_eq!(s.consecutive_failures, 60);
    t.record(&c, true, 0);
    assert_eq!(t.snapshot().consecutive_failures, 0);
}
