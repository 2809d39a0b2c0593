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

mod tracker;
mod verdict;

pub use tracker::{Admission, HealthSnapshot, HealthState, Tracker};
pub use verdict::{verdict, Verdict};

use super::sink::Outcome;
use crate::clock::WallMs;
use crate::store::Store;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use crate::policy::HealthConfig;

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
