//! Delivery policy as data, read by the configuration and the subscription model and applied by
//! delivery: the status-code policies, the named retry schedules and the endpoint-health
//! thresholds. Pure: no I/O, no knowledge of sinks. The tables that apply them (`classify`,
//! `next_step`, the health tracker) are in `crate::delivery`; `delivery/policy.rs` documents the
//! status-code table.

use std::time::Duration;

/// Which status-code table applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCodePolicy {
    /// The original module: every failure is retried on the schedule; no `Retry-After`, no
    /// jitter.
    Original,
    /// Event Grid cloud semantics: 400/413 refused when a dead-letter destination exists,
    /// `Retry-After` honoured on 429/503, jitter on every delay.
    Standard,
}

impl StatusCodePolicy {
    /// Every policy with its wire name.
    pub const ALL: [(&'static str, Self); 2] =
        [("original", Self::Original), ("standard", Self::Standard)];

    /// Parse a name (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s.trim()))
            .map(|(_, p)| *p)
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Original => "original",
            Self::Standard => "standard",
        }
    }
}

/// What a publish does when a matching in-memory subscription's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueFullPolicy {
    /// The original: the whole publish is refused with 503 + `Retry-After` (nothing accepted).
    Reject,
    /// The full subscription's copies become dead letters (`QueueFull`); the publish succeeds
    /// for every other subscription, so one dead endpoint cannot stop a shared topic.
    DeadLetter,
}

impl QueueFullPolicy {
    /// Every policy with its wire name.
    pub const ALL: [(&'static str, Self); 2] =
        [("reject", Self::Reject), ("deadLetter", Self::DeadLetter)];
}

/// A named retry schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleName {
    /// Immediate, 1-minute queue, then the 10-minute queue (the original module).
    Original,
    /// Azure Event Grid (cloud): 10 s, 30 s, 1 m, 5 m, 10 m, 30 m, 1 h, then hourly.
    EventGridCloud,
    /// Adobe Workfront: `((2^n) - 1) * 84800 ms` for retry n = 1..=11.
    Workfront,
}

impl ScheduleName {
    /// Every schedule with its wire name.
    pub const ALL: [(&'static str, Self); 3] = [
        ("original", Self::Original),
        ("eventGridCloud", Self::EventGridCloud),
        ("workfront", Self::Workfront),
    ];

    /// Parse a name (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s.trim()))
            .map(|(_, p)| *p)
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Original => "original",
            Self::EventGridCloud => "eventGridCloud",
            Self::Workfront => "workfront",
        }
    }

    /// The schedule's data.
    pub fn schedule(self) -> Schedule {
        match self {
            Self::Original => Schedule {
                steps: &ORIGINAL_STEPS,
                then_every: Some(Duration::from_secs(600)),
            },
            Self::EventGridCloud => Schedule {
                steps: &EVENT_GRID_CLOUD_STEPS,
                then_every: Some(Duration::from_secs(3600)),
            },
            Self::Workfront => Schedule {
                steps: &WORKFRONT_STEPS,
                then_every: None,
            },
        }
    }
}

const ORIGINAL_STEPS: [Duration; 1] = [Duration::from_secs(60)];

const EVENT_GRID_CLOUD_STEPS: [Duration; 7] = [
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(300),
    Duration::from_secs(600),
    Duration::from_secs(1800),
    Duration::from_secs(3600),
];

/// Workfront's base delay.
const WORKFRONT_UNIT_MS: u64 = 84_800;

const fn workfront(n: u32) -> Duration {
    Duration::from_millis(((1u64 << n) - 1) * WORKFRONT_UNIT_MS)
}

const WORKFRONT_STEPS: [Duration; 11] = [
    workfront(1),
    workfront(2),
    workfront(3),
    workfront(4),
    workfront(5),
    workfront(6),
    workfront(7),
    workfront(8),
    workfront(9),
    workfront(10),
    workfront(11),
];

/// A retry schedule: explicit steps, then optionally a fixed interval forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Delay before attempt `i + 2` after `i + 1` attempts failed.
    pub steps: &'static [Duration],
    /// Delay once the steps are used up; `None` = the schedule is exhausted.
    pub then_every: Option<Duration>,
}

impl Schedule {
    /// Delay before the next attempt when `attempts_made` (≥ 1) attempts failed; `None` when the
    /// schedule has no further attempt.
    pub fn delay_after(&self, attempts_made: u32) -> Option<Duration> {
        let i = attempts_made.saturating_sub(1) as usize;
        self.steps.get(i).copied().or(self.then_every)
    }
}

/// Thresholds (module configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// Health tracking on.
    pub enabled: bool,
    /// Disabled when the failure rate exceeds this percentage …
    pub disable_failure_rate_percent: u32,
    /// … over more than this many attempts (in the window).
    pub disable_min_attempts: u32,
    /// Disabled after this many consecutive failures.
    pub disable_consecutive_failures: u64,
    /// A disabled endpoint is probed this often.
    pub probe_interval: Duration,
    /// Frozen after more consecutive failures than this …
    pub freeze_consecutive_failures: u64,
    /// … with the last success longer ago than this.
    pub freeze_no_success_for: Duration,
    /// Frozen after more consecutive failures than this, regardless.
    pub freeze_any_consecutive_failures: u64,
    /// Attempts the failure rate is computed over.
    pub window_attempts: usize,
}

impl Default for HealthConfig {
    /// Workfront's numbers.
    fn default() -> Self {
        Self {
            enabled: true,
            disable_failure_rate_percent: 70,
            disable_min_attempts: 100,
            disable_consecutive_failures: 2000,
            probe_interval: Duration::from_secs(600),
            freeze_consecutive_failures: 2000,
            freeze_no_success_for: Duration::from_secs(72 * 3600),
            freeze_any_consecutive_failures: 50_000,
            window_attempts: 1000,
        }
    }
}
