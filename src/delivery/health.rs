//! Endpoint health per destination URL (Adobe Workfront's rules), as a pure state machine with
//! the clock passed in (`now_ms`), plus a registry shared by every subscription.
//!
//! ```text
//!            failure rate > 70 % over > 100 attempts,            > 2,000 consecutive failures and
//!            or 2,000 consecutive failures                       last success > 72 h ago, or
//!  Closed ───────────────────────────────────────► Disabled ───► > 50,000 consecutive ──► Frozen
//!    ▲  ▲          (one probe every 10 min)            │                                   │
//!    │  └──────────────── probe succeeds ──────────────┘                                   │
//!    └──────────────────────────── re-enabled through the API ─────────────────────────────┘
//! ```
//!
//! * **Closed**: deliveries flow normally.
//! * **Disabled**: one probe batch every `probe_interval`; its success closes the circuit.
//! * **Frozen**: no attempts at all until [`EndpointHealth::enable`] (the API).
//!
//! **What counts** ([`verdict`]): only what says something about the endpoint. Success counts
//! as up; transport errors, timeouts, 5xx, 429, 408, 3xx (redirects are not followed) and the
//! configuration faults 401/403/404/405/410 count as down. Refusals of particular events (every
//! other 4xx: 400, 409, 413, 415, 422 ..., an event too large for the destination, and an MQTT
//! broker's refusal of one message such as PUBACK 0x87 or 0x90) count
//! neither way: one subscription whose events a receiver refuses cannot disable a URL other
//! subscriptions deliver to (a probe answered that way just ends the probe).
//!
//! While an endpoint is disabled or frozen its events stay queued and still expire by TTL into
//! dead letters. Thresholds come from [`HealthConfig`] (module settings).
//!
//! **Persistence.** The [`Tracker`] stays pure; [`EndpointHealth`] writes its
//! [`Tracker::to_record`] to the store (the metadata database with sled) on **state transitions
//! only** (never per attempt): a disabled or frozen endpoint is stored, a closed one is deleted.
//! At start [`HealthRegistry::restore`] loads the records and a URL's tracker begins in its stored
//! state ([`Tracker::from_record`]). Kept: state, consecutive failures at the transition, last
//! success, next probe, attempt/failure totals. Not kept: the failure-rate window and a probe in
//! flight.

use super::sink::{FailureKind, Outcome};
use crate::clock::WallMs;
use crate::store::Store;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

pub use crate::policy::HealthConfig;

/// The circuit state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// Deliveries flow.
    Closed,
    /// One probe every interval.
    Disabled,
    /// No attempts until re-enabled through the API.
    Frozen,
}

impl HealthState {
    /// Wire / metrics name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "Enabled",
            Self::Disabled => "Disabled",
            Self::Frozen => "Frozen",
        }
    }

    /// Gauge value: 0 enabled, 1 disabled, 2 frozen.
    pub fn gauge(self) -> u64 {
        match self {
            Self::Closed => 0,
            Self::Disabled => 1,
            Self::Frozen => 2,
        }
    }
}

/// May a batch be sent now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Yes.
    Send,
    /// Yes, one batch as the disabled endpoint's probe: call [`Tracker::start_probe`] once it is
    /// actually sent, and report its outcome with [`Tracker::record`].
    Probe,
    /// Not before this wall time (disabled; the next probe is due then).
    WaitUntil(WallMs),
    /// Not until the probe in flight completes (disabled).
    ProbeInFlight,
    /// Not until re-enabled (frozen).
    Blocked,
}

/// The pure state machine of one endpoint.
#[derive(Debug, Clone)]
pub struct Tracker {
    state: HealthState,
    window: VecDeque<bool>,
    window_failures: usize,
    consecutive_failures: u64,
    last_success_ms: WallMs,
    next_probe_ms: WallMs,
    probe_in_flight: bool,
    attempts: u64,
    failures: u64,
}

/// A read-only view for the API and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSnapshot {
    /// State.
    pub state: HealthState,
    /// Consecutive failures.
    pub consecutive_failures: u64,
    /// Failure rate over the window (0–1).
    pub failure_rate: f64,
    /// Attempts in the window.
    pub window_attempts: usize,
    /// Last success (or when tracking began), wall ms.
    pub last_success_ms: WallMs,
    /// Next probe (disabled only), wall ms.
    pub next_probe_ms: Option<WallMs>,
    /// Attempts ever recorded.
    pub attempts: u64,
    /// Failures ever recorded.
    pub failures: u64,
}

/// What an attempt says about its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The endpoint works.
    Up,
    /// The endpoint (or its configuration) fails.
    Down,
    /// Nothing about the endpoint: the events were refused.
    Neither,
}

/// The health rule (see the module documentation).
pub fn verdict(outcome: &Outcome) -> Verdict {
    let kind = match outcome {
        Outcome::Delivered => return Verdict::Up,
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
        FailureKind::Status(s) | FailureKind::Service { status: s, .. } => match *s {
            401 | 403 | 404 | 405 | 408 | 410 | 429 => Verdict::Down,
            400..=499 => Verdict::Neither,
            _ => Verdict::Down,
        },
        FailureKind::TooLarge(_) | FailureKind::Refused(_) => Verdict::Neither,
        FailureKind::CredentialExpired(_)
        | FailureKind::Timeout
        | FailureKind::Connect
        | FailureKind::Unsupported(_)
        | FailureKind::Other(_) => Verdict::Down,
    }
}

impl Tracker {
    /// A healthy endpoint first seen at `now_ms` (the "last success" clock starts here).
    pub fn new(now_ms: WallMs) -> Self {
        Self {
            state: HealthState::Closed,
            window: VecDeque::new(),
            window_failures: 0,
            consecutive_failures: 0,
            last_success_ms: now_ms,
            next_probe_ms: 0,
            probe_in_flight: false,
            attempts: 0,
            failures: 0,
        }
    }

    /// Current state.
    pub fn state(&self) -> HealthState {
        self.state
    }

    /// Whether a batch may go now (no side effect).
    pub fn admit(&self, now_ms: WallMs) -> Admission {
        match self.state {
            HealthState::Closed => Admission::Send,
            HealthState::Frozen => Admission::Blocked,
            HealthState::Disabled => {
                if self.probe_in_flight {
                    Admission::ProbeInFlight
                } else if now_ms < self.next_probe_ms {
                    Admission::WaitUntil(self.next_probe_ms)
                } else {
                    Admission::Probe
                }
            }
        }
    }

    /// A probe was sent: no other until it completes, the next not before one interval.
    pub fn start_probe(&mut self, cfg: &HealthConfig, now_ms: WallMs) {
        self.probe_in_flight = true;
        self.next_probe_ms = now_ms + cfg.probe_interval.as_millis() as u64;
    }

    /// An attempt that said nothing about the endpoint ([`Verdict::Neither`]) completed: it
    /// only ends a probe in flight (the next one is due at the usual interval).
    pub fn record_neither(&mut self) {
        self.probe_in_flight = false;
    }

    /// Record an attempt's result; returns the state afterwards.
    pub fn record(&mut self, cfg: &HealthConfig, success: bool, now_ms: WallMs) -> HealthState {
        self.attempts += 1;
        self.probe_in_flight = false;
        self.window.push_back(success);
        if !success {
            self.window_failures += 1;
        }
        while self.window.len() > cfg.window_attempts.max(1) {
            if self.window.pop_front() == Some(false) {
                self.window_failures = self.window_failures.saturating_sub(1);
            }
        }
        if success {
            self.consecutive_failures = 0;
            self.last_success_ms = now_ms;
            if self.state == HealthState::Disabled {
                self.reset_window();
                self.state = HealthState::Closed;
            }
            return self.state;
        }
        self.failures += 1;
        self.consecutive_failures += 1;
        if self.state == HealthState::Frozen {
            return self.state;
        }
        let silent_for = now_ms.saturating_sub(self.last_success_ms);
        let freeze = (self.consecutive_failures > cfg.freeze_consecutive_failures
            && silent_for > cfg.freeze_no_success_for.as_millis() as u64)
            || self.consecutive_failures > cfg.freeze_any_consecutive_failures;
        if freeze {
            self.state = HealthState::Frozen;
            return self.state;
        }
        let n = self.window.len();
        let rate_bad = n > cfg.disable_min_attempts as usize
            && (self.window_failures as u64) * 100
                > u64::from(cfg.disable_failure_rate_percent) * n as u64;
        if self.state == HealthState::Closed
            && (rate_bad || self.consecutive_failures >= cfg.disable_consecutive_failures)
        {
            self.state = HealthState::Disabled;
            self.next_probe_ms = now_ms + cfg.probe_interval.as_millis() as u64;
        }
        self.state
    }

    /// Re-enable (the API): closed, counters cleared, the "last success" clock restarted.
    pub fn enable(&mut self, now_ms: WallMs) {
        self.state = HealthState::Closed;
        self.consecutive_failures = 0;
        self.last_success_ms = now_ms;
        self.probe_in_flight = false;
        self.reset_window();
    }

    fn reset_window(&mut self) {
        self.window.clear();
        self.window_failures = 0;
    }

    /// What survives a restart: `None` when closed (nothing worth keeping), else the state,
    /// consecutive failures, last success, next probe and totals as JSON.
    pub fn to_record(&self) -> Option<Value> {
        (self.state != HealthState::Closed).then(|| {
            json!({
                "state": self.state.as_str(),
                "consecutiveFailures": self.consecutive_failures,
                "lastSuccessMs": self.last_success_ms,
                "nextProbeMs": self.next_probe_ms,
                "attempts": self.attempts,
                "failures": self.failures,
            })
        })
    }

    /// A tracker in the state of a [`Tracker::to_record`] record (empty window, no probe in
    /// flight); `None` when the record is not one.
    pub fn from_record(rec: &Value) -> Option<Self> {
        let n = |k: &str| rec.get(k).and_then(Value::as_u64);
        let state = match rec.get("state").and_then(Value::as_str)? {
            "Disabled" => HealthState::Disabled,
            "Frozen" => HealthState::Frozen,
            "Enabled" => HealthState::Closed,
            _ => return None,
        };
        Some(Self {
            state,
            window: VecDeque::new(),
            window_failures: 0,
            consecutive_failures: n("consecutiveFailures")?,
            last_success_ms: n("lastSuccessMs")?,
            next_probe_ms: n("nextProbeMs")?,
            probe_in_flight: false,
            attempts: n("attempts").unwrap_or(0),
            failures: n("failures").unwrap_or(0),
        })
    }

    /// A view for the API and metrics.
    pub fn snapshot(&self) -> HealthSnapshot {
        let n = self.window.len();
        HealthSnapshot {
            state: self.state,
            consecutive_failures: self.consecutive_failures,
            failure_rate: if n == 0 {
                0.0
            } else {
                self.window_failures as f64 / n as f64
            },
            window_attempts: n,
            last_success_ms: self.last_success_ms,
            next_probe_ms: (self.state == HealthState::Disabled).then_some(self.next_probe_ms),
            attempts: self.attempts,
            failures: self.failures,
        }
    }
}

/// Where trackers write their records (the broker's store).
#[derive(Clone)]
struct Persist(Arc<dyn Store>);

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Persist")
    }
}

/// One endpoint's tracker, shared by every subscription delivering to its URL.
#[derive(Debug)]
pub struct EndpointHealth {
    /// The destination URL.
    pub url: String,
    tracker: Mutex<Tracker>,
    persist: Option<Persist>,
    /// Held while a transition is written: taken before the tracker's lock is released, so
    /// transitions of one URL reach the store in order, while deliveries recording outcomes
    /// (the tracker's lock only) do not wait for the write.
    saving: Mutex<()>,
}

impl EndpointHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        // Every critical section is a few field updates without panics.
        crate::sync::lock(&self.tracker)
    }

    /// See [`Tracker::admit`].
    pub fn admit(&self, cfg: &HealthConfig, now_ms: WallMs) -> Admission {
        if !cfg.enabled {
            return Admission::Send;
        }
        self.lock().admit(now_ms)
    }

    /// See [`Tracker::start_probe`].
    pub fn start_probe(&self, cfg: &HealthConfig, now_ms: WallMs) {
        self.lock().start_probe(cfg, now_ms);
    }

    /// Record an attempt's outcome by its [`verdict`].
    pub fn record_outcome(&self, cfg: &HealthConfig, outcome: &Outcome, now_ms: WallMs) {
        match verdict(outcome) {
            Verdict::Up => self.record(cfg, true, now_ms),
            Verdict::Down => self.record(cfg, false, now_ms),
            Verdict::Neither => self.lock().record_neither(),
        }
    }

    /// See [`Tracker::record`]; logs and persists transitions.
    pub fn record(&self, cfg: &HealthConfig, success: bool, now_ms: WallMs) {
        if !cfg.enabled {
            return;
        }
        let mut t = self.lock();
        let before = t.state();
        let after = t.record(cfg, success, now_ms);
        if before != after {
            // Transitions are rare (at most one per probe interval once disabled); the write is
            // one small metadata insert and flush.
            self.save(t);
            tracing::warn!(endpoint = %redact_url(&self.url), from = before.as_str(), to = after.as_str(), "endpoint health changed");
        }
    }

    /// Re-enable through the API (clears the stored record).
    pub fn enable(&self, now_ms: WallMs) {
        let mut t = self.lock();
        t.enable(now_ms);
        self.save(t);
        tracing::info!(endpoint = %redact_url(&self.url), "endpoint re-enabled through the API");
    }

    /// Write the tracker's record and release its lock first: the metadata flush can take
    /// milliseconds on an SD card, and on a runtime worker it runs through `block_in_place`, so
    /// that worker's other tasks move to another thread instead of waiting.
    fn save(&self, t: std::sync::MutexGuard<'_, Tracker>) {
        let Some(Persist(store)) = &self.persist else {
            return;
        };
        let record = t.to_record();
        let _in_order = crate::sync::lock(&self.saving);
        drop(t);
        let written = off_runtime_thread(|| store.put_endpoint_health(&self.url, record.as_ref()));
        if let Err(e) = written {
            tracing::error!(endpoint = %redact_url(&self.url), error = %e, "could not store the endpoint's health; a restart may forget it");
        }
    }

    /// Current view.
    pub fn snapshot(&self) -> HealthSnapshot {
        self.lock().snapshot()
    }
}

/// Run a blocking call without holding up a runtime worker: on a multi-thread runtime
/// `block_in_place` (which just runs it on a blocking-pool thread); elsewhere (a current-thread
/// runtime, or none) directly.
fn off_runtime_thread<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The URL without query string or user info, token-like path segments masked (query strings
/// and webhook paths often carry keys).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            u.set_query(None);
            let _ = u.set_password(None);
            let _ = u.set_username("");
            let path = crate::model::destination::mask_path(u.path());
            u.set_path("");
            format!("{}{}", u.as_str().trim_end_matches('/'), path)
        }
        Err(_) => "<invalid url>".into(),
    }
}

/// Trackers by destination URL.
#[derive(Debug, Default)]
pub struct HealthRegistry {
    map: Mutex<HashMap<String, Arc<EndpointHealth>>>,
    /// Records loaded at start and not yet claimed by a subscription.
    restored: Mutex<HashMap<String, Tracker>>,
    persist: Option<Persist>,
}

impl HealthRegistry {
    /// A registry that keeps disabled/frozen states in `store` and starts from the records
    /// stored there. Unreadable records are skipped with a warning (the endpoint starts
    /// healthy).
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn restore(store: Arc<dyn Store>) -> Result<Self, crate::store::StoreError> {
        let mut restored = HashMap::new();
        for (url, rec) in store.endpoint_health()? {
            match Tracker::from_record(&rec) {
                Some(t) => {
                    restored.insert(url, t);
                }
                None => {
                    tracing::warn!(endpoint = %redact_url(&url), "unreadable endpoint health record ignored")
                }
            }
        }
        Ok(Self {
            map: Mutex::default(),
            restored: Mutex::new(restored),
            persist: Some(Persist(store)),
        })
    }

    /// The tracker for `url`: its restored state, or healthy at `now_ms` when first seen.
    pub fn get(&self, url: &str, now_ms: WallMs) -> Arc<EndpointHealth> {
        let mut m = crate::sync::lock(&self.map);
        m.entry(url.to_string())
            .or_insert_with(|| {
                let restored = self
                    .restored
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(url);
                if let Some(t) = &restored {
                    tracing::info!(endpoint = %redact_url(url), state = t.state().as_str(), "endpoint health restored");
                }
                Arc::new(EndpointHealth {
                    url: url.to_string(),
                    tracker: Mutex::new(restored.unwrap_or_else(|| Tracker::new(now_ms))),
                    persist: self.persist.clone(),
                    saving: Mutex::new(()),
                })
            })
            .clone()
    }

    /// Delete the stored records no subscription claimed (their URLs are no longer used).
    pub fn prune_unclaimed(&self) {
        let left = std::mem::take(&mut *crate::sync::lock(&self.restored));
        if let Some(Persist(store)) = &self.persist {
            for url in left.keys() {
                if let Err(e) = store.put_endpoint_health(url, None) {
                    tracing::warn!(endpoint = %redact_url(url), error = %e, "could not delete an unused endpoint health record");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for s in [500, 502, 503, 429, 408, 401, 403, 404, 410, 301] {
            assert_eq!(
                verdict(&failed(FailureKind::Status(s))),
                Verdict::Down,
                "{s}"
            );
        }
        for k in [
            FailureKind::Timeout,
            FailureKind::Connect,
            FailureKind::Other("tls".into()),
        ] {
            assert_eq!(verdict(&failed(k)), Verdict::Down);
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
        assert_eq!(
            verdict(&failed(FailureKind::Refused("0x90".into()))),
            Verdict::Neither,
            "a refusal says nothing about the endpoint"
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
}
