//! One endpoint's circuit as a pure state machine, the clock passed in (`now_ms`): the rules of
//! the module docs of [`super`], and its stored record.

use super::HealthConfig;
use crate::clock::WallMs;
use serde_json::{json, Value};
use std::collections::VecDeque;

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
    /// Also read by [`super::EndpointHealth::admit`] (an outage's probe interval).
    pub(super) next_probe_ms: WallMs,
    probe_in_flight: bool,
    attempts: u64,
    failures: u64,
    /// Since when the endpoint has been unreachable (an uplink outage), if it is.
    pub(super) outage_since_ms: Option<WallMs>,
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

    /// An attempt that said nothing about the endpoint ([`super::Verdict::Neither`]) completed: it
    /// ends a probe in flight (the next one is due at the usual interval) and, as the endpoint
    /// answered, an outage.
    pub fn record_neither(&mut self, cfg: &HealthConfig, now_ms: WallMs) {
        self.probe_in_flight = false;
        self.end_outage(cfg, now_ms);
    }

    /// The endpoint could not be reached ([`super::Verdict::Unreachable`]): an outage begins (or goes
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
