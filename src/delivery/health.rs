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
//! as up; timeouts after a connection was made, 5xx other than 503, 429, 408, 3xx (redirects
//! are not followed), TLS failures the peer answered and the configuration faults
//! 401/403/404/405/410 count as down. Refusals of particular events (every other 4xx: 400, 409,
//! 413, 415, 422 ..., an event too large for the destination, and an MQTT broker's refusal of
//! one message such as PUBACK 0x87 or 0x90) count neither way: one
//! subscription whose events a receiver refuses cannot disable a URL other subscriptions
//! deliver to (a probe answered that way just ends the probe).
//!
//! **Outages are not failures.** No connection (refused, DNS failure, no connection or TLS
//! handshake within the connect timeout: [`FailureKind::Connect`]) and a `503` without
//! `Retry-After` (a gateway's answer) say the way to the endpoint is down, not that the endpoint fails ([`Verdict::Unreachable`]). They never count
//! towards disabling or freezing, whatever the outage's length: the tracker notes an **outage**
//! instead, beside its state. While it lasts the endpoint gets one probe batch every
//! `outbound__outageProbeSeconds` (default 30) across all subscriptions delivering to it; any
//! answer from the endpoint ends the outage, and a success also bumps the endpoint's recovery
//! count ([`EndpointHealth::recoveries`]), which makes every subscription's waiting retries due
//! at once. The events an outage failed are not charged an attempt (`settle` puts them back
//! as they were), so they wait for as long as their TTL allows.
//!
//! While an endpoint is disabled or frozen its events stay queued and still expire by TTL into
//! dead letters. Thresholds come from [`HealthConfig`] (module settings).
//!
//! **Persistence.** The [`Tracker`] stays pure; [`EndpointHealth`] writes its
//! [`Tracker::to_record`] to the store (the metadata database with sled) on **state transitions
//! only** (never per attempt): a disabled or frozen endpoint, or one in an outage, is stored, a
//! closed one is deleted. An outage therefore survives a restart: the next probe is due when it
//! was, and no recovered event goes out before it.
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
    /// Since when the endpoint has been unreachable (an uplink outage), if it is.
    outage_since_ms: Option<WallMs>,
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
    /// Unreachable (an uplink outage) since, wall ms.
    pub outage_since_ms: Option<WallMs>,
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
            outage_since_ms: None,
        }
    }

    /// Current state.
    pub fn state(&self) -> HealthState {
        self.state
    }

    /// Since when the endpoint has been unreachable, if it is.
    pub fn outage_since(&self) -> Option<WallMs> {
        self.outage_since_ms
    }

    /// Whether a batch may go now (no side effect). During an outage (not frozen) only probes.
    pub fn admit(&self, now_ms: WallMs) -> Admission {
        match self.state {
            HealthState::Frozen => Admission::Blocked,
            HealthState::Closed if self.outage_since_ms.is_none() => Admission::Send,
            HealthState::Closed | HealthState::Disabled => {
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

    /// A probe was sent: no other until it completes, the next not before one interval (the
    /// outage's while there is one).
    pub fn start_probe(&mut self, cfg: &HealthConfig, now_ms: WallMs) {
        self.probe_in_flight = true;
        self.next_probe_ms = now_ms + self.probe_every(cfg).as_millis() as u64;
    }

    fn probe_every(&self, cfg: &HealthConfig) -> std::time::Duration {
        match self.outage_since_ms {
            Some(_) => cfg.outage_probe_interval,
            None => cfg.probe_interval,
        }
    }

    /// An attempt that said nothing about the endpoint ([`Verdict::Neither`]) completed: it
    /// ends a probe in flight (the next one is due at the usual interval) and, as the endpoint
    /// answered, an outage.
    pub fn record_neither(&mut self, cfg: &HealthConfig, now_ms: WallMs) {
        self.probe_in_flight = false;
        self.end_outage(cfg, now_ms);
    }

    /// The endpoint could not be reached ([`Verdict::Unreachable`]): an outage begins (or goes
    /// on), the next probe one outage interval away. Nothing counts towards disabling or
    /// freezing.
    pub fn record_unreachable(&mut self, cfg: &HealthConfig, now_ms: WallMs) {
        self.attempts += 1;
        self.probe_in_flight = false;
        self.outage_since_ms.get_or_insert(now_ms);
        self.next_probe_ms = now_ms + cfg.outage_probe_interval.as_millis() as u64;
    }

    /// The endpoint answered: no outage any more (a disabled endpoint's next probe at its
    /// usual interval).
    fn end_outage(&mut self, cfg: &HealthConfig, now_ms: WallMs) {
        if self.outage_since_ms.take().is_some() && self.state == HealthState::Disabled {
            self.next_probe_ms = now_ms + cfg.probe_interval.as_millis() as u64;
        }
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
        self.end_outage(cfg, now_ms);
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
        self.outage_since_ms = None;
        self.reset_window();
    }

    fn reset_window(&mut self) {
        self.window.clear();
        self.window_failures = 0;
    }

    /// What survives a restart: `None` when closed without an outage (nothing worth keeping),
    /// else the state, consecutive failures, last success, next probe, totals and the outage's
    /// start as JSON.
    pub fn to_record(&self) -> Option<Value> {
        (self.state != HealthState::Closed || self.outage_since_ms.is_some()).then(|| {
            json!({
                "state": self.state.as_str(),
                "consecutiveFailures": self.consecutive_failures,
                "lastSuccessMs": self.last_success_ms,
                "nextProbeMs": self.next_probe_ms,
                "attempts": self.attempts,
                "failures": self.failures,
                "outageSinceMs": self.outage_since_ms,
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
            outage_since_ms: n("outageSinceMs"),
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
            next_probe_ms: (self.state == HealthState::Disabled
                || (self.state == HealthState::Closed && self.outage_since_ms.is_some()))
            .then_some(self.next_probe_ms),
            attempts: self.attempts,
            failures: self.failures,
            outage_since_ms: self.outage_since_ms,
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
    /// Outages ended by a success: every subscription delivering here watches it and makes its
    /// waiting retries due when it moves.
    recovered: tokio::sync::watch::Sender<u64>,
}

impl EndpointHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        // Every critical section is a few field updates without panics.
        crate::sync::lock(&self.tracker)
    }

    /// See [`Tracker::admit`]. An outage's next probe is never further away than one outage
    /// interval (a restored record from before `outbound__outageProbeSeconds` was lowered).
    pub fn admit(&self, cfg: &HealthConfig, now_ms: WallMs) -> Admission {
        if !cfg.enabled {
            return Admission::Send;
        }
        let mut t = self.lock();
        if t.outage_since_ms.is_some() {
            let latest = now_ms + cfg.outage_probe_interval.as_millis() as u64;
            t.next_probe_ms = t.next_probe_ms.min(latest);
        }
        t.admit(now_ms)
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
            Verdict::Neither => self.update(cfg, false, now_ms, |t| t.record_neither(cfg, now_ms)),
            Verdict::Unreachable => {
                self.update(cfg, false, now_ms, |t| t.record_unreachable(cfg, now_ms))
            }
        }
    }

    /// See [`Tracker::record`]; logs and persists transitions.
    pub fn record(&self, cfg: &HealthConfig, success: bool, now_ms: WallMs) {
        self.update(cfg, success, now_ms, |t| {
            t.record(cfg, success, now_ms);
        });
    }

    /// Apply `f` to the tracker; log and persist a change of state or outage, and announce a
    /// recovery (an outage ended by a success: `success`).
    fn update(
        &self,
        cfg: &HealthConfig,
        success: bool,
        now_ms: WallMs,
        f: impl FnOnce(&mut Tracker),
    ) {
        if !cfg.enabled {
            return;
        }
        let mut t = self.lock();
        let (before, was_out) = (t.state(), t.outage_since());
        f(&mut t);
        let (after, out) = (t.state(), t.outage_since());
        if before == after && was_out.is_some() == out.is_some() {
            return;
        }
        // Transitions are rare (at most one per probe interval once disabled or out); the
        // write is one small metadata insert and flush.
        self.save(t);
        let endpoint = redact_url(&self.url);
        if before != after {
            tracing::warn!(endpoint = %endpoint, from = before.as_str(), to = after.as_str(), "endpoint health changed");
        }
        match (was_out, out) {
            (None, Some(_)) => {
                tracing::warn!(endpoint = %endpoint, probe_every_s = cfg.outage_probe_interval.as_secs(), "destination unreachable: an outage, not a failing endpoint; its events wait and one request probes it at a time")
            }
            (Some(since), None) => {
                tracing::info!(endpoint = %endpoint, outage_ms = now_ms.saturating_sub(since), "destination reachable again");
                if success {
                    self.recovered.send_modify(|n| *n += 1);
                }
            }
            _ => {}
        }
    }

    /// A receiver that changes each time an outage of this endpoint ends with a success.
    pub fn recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recovered.subscribe()
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
                    recovered: tokio::sync::watch::Sender::new(0),
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
mod tests;
