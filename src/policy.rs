//! Delivery policy as data, read by the configuration and the subscription model and applied by
//! delivery: the status-code policies, the named retry schedules and the endpoint-health
//! thresholds. Pure: no I/O, no knowledge of sinks. The tables that apply them (`classify`,
//! `next_step`, the health tracker) are in `crate::delivery`; `delivery/classify.rs` documents the
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
        parse_name(&Self::ALL, s)
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Original => "original",
            Self::Standard => "standard",
        }
    }
}

/// A destination configuration fault reported by an Azure service: retried on the schedule
/// like any failure (the entity or key may come back), but logged at warn and counted apart,
/// so a wrong connection string is told from an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigFault {
    /// 401: wrong key, key name or token.
    Unauthorized = 0,
    /// 404: no such entity (Event Hubs, Storage).
    NotFound = 1,
    /// 410: the queue or topic does not exist (Service Bus).
    Gone = 2,
    /// The connection string's ready-made shared access signature has expired.
    SasExpired = 3,
}

impl ConfigFault {
    /// Every fault, in metric order (the discriminant indexes it).
    pub const ALL: [Self; 4] = [
        Self::Unauthorized,
        Self::NotFound,
        Self::Gone,
        Self::SasExpired,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::NotFound => "notFound",
            Self::Gone => "gone",
            Self::SasExpired => "sasExpired",
        }
    }
}

/// How dead letters are forwarded to a dead-letter destination: batched for a while (or up
/// to a size), retried for a bounded time, within a memory bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardPolicy {
    /// Letters for one destination wait this long to go out together.
    pub batch_window: std::time::Duration,
    /// ... or until they reach this many bytes.
    pub batch_max_bytes: usize,
    /// A failing destination is retried this long after the batch's first attempt.
    pub patience: std::time::Duration,
    /// Bytes of letters waiting (batching or retrying), all destinations together.
    pub max_pending_bytes: usize,
}

impl ForwardPolicy {
    /// Delays between a failing batch's attempts; the last repeats until the patience ends.
    pub const RETRY_DELAYS: [std::time::Duration; 5] = [
        std::time::Duration::from_secs(10),
        std::time::Duration::from_secs(30),
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(300),
        std::time::Duration::from_secs(600),
    ];

    /// The delay after the `failures`-th failed attempt (1-based).
    pub fn retry_delay(failures: u32) -> std::time::Duration {
        let i = (failures.max(1) as usize - 1).min(Self::RETRY_DELAYS.len() - 1);
        Self::RETRY_DELAYS[i]
    }
}

impl Default for ForwardPolicy {
    fn default() -> Self {
        Self {
            batch_window: std::time::Duration::from_secs(2),
            batch_max_bytes: 1 << 20,
            patience: std::time::Duration::from_secs(4 * 3600),
            max_pending_bytes: 16 << 20,
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

/// A named retry schedule. Its wire name says what it does; the names earlier releases used
/// (`original`, `eventGridCloud`, `workfront`) stay accepted, in any case (see [`Self::NAMES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleName {
    /// 1 minute, then every 10 minutes until TTL or `maxDeliveryAttempts` (the original module's
    /// 1-minute and 10-minute queues; formerly `original`).
    OneThenEveryTenMinutes = 0,
    /// Azure Event Grid (cloud): 10 s, 30 s, 1 m, 5 m, 10 m, 30 m, 1 h, then hourly (formerly
    /// `eventGridCloud`).
    TenSecondsToHourly = 1,
    /// Adobe Workfront's: `((2^n) - 1) * 84.8 s` for retry n = 1..=11 (1.4 min … 48.2 h), so the
    /// last retry comes about four days (96.2 h) after the first attempt; then it gives up
    /// (formerly `workfront`).
    DoublingForFourDays = 2,
}

impl ScheduleName {
    /// The one table of names: `(wire name, old name, schedule)`, indexed by the discriminant.
    /// The wire name is what GET, the module twin and `gridlet --help` show; the old name is
    /// accepted everywhere a schedule is, and is what the metadata store records, so a store
    /// written by this release still loads in one that knows only the old names.
    pub const NAMES: [(&'static str, &'static str, Self); 3] = [
        (
            "oneThenEveryTenMinutes",
            "original",
            Self::OneThenEveryTenMinutes,
        ),
        (
            "tenSecondsToHourly",
            "eventGridCloud",
            Self::TenSecondsToHourly,
        ),
        (
            "doublingForFourDays",
            "workfront",
            Self::DoublingForFourDays,
        ),
    ];

    /// Every accepted name with its schedule, wire names first, then the old names (for the
    /// settings parser and error messages).
    pub const ACCEPTED: [(&'static str, Self); 6] = {
        let mut out = [("", Self::OneThenEveryTenMinutes); 6];
        let mut i = 0;
        while i < 3 {
            out[i] = (Self::NAMES[i].0, Self::NAMES[i].2);
            out[i + 3] = (Self::NAMES[i].1, Self::NAMES[i].2);
            i += 1;
        }
        out
    };

    /// Parse a wire name or an old name (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        parse_name(&Self::ACCEPTED, s)
    }

    /// Wire name: says what the schedule does.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize].0
    }

    /// The name earlier releases used (what the metadata store records).
    pub fn old_name(self) -> &'static str {
        Self::NAMES[self as usize].1
    }

    /// The schedule's data.
    pub fn schedule(self) -> Schedule {
        match self {
            Self::OneThenEveryTenMinutes => Schedule {
                steps: &ORIGINAL_STEPS,
                then_every: Some(Duration::from_secs(600)),
            },
            Self::TenSecondsToHourly => Schedule {
                steps: &EVENT_GRID_CLOUD_STEPS,
                then_every: Some(Duration::from_secs(3600)),
            },
            Self::DoublingForFourDays => Schedule {
                steps: &WORKFRONT_STEPS,
                then_every: None,
            },
        }
    }
}

/// The entry of `table` named `s` (case-insensitive, surrounding blanks ignored).
fn parse_name<T: Copy>(table: &[(&str, T)], s: &str) -> Option<T> {
    table
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(s.trim()))
        .map(|(_, p)| *p)
}

/// The names of `table`, comma-separated, for "is not one of …" messages.
pub fn names_list<T>(table: &[(&str, T)]) -> String {
    let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    names.join(", ")
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
    /// While a destination is unreachable (an uplink outage), one probe this often.
    pub outage_probe_interval: Duration,
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
            outage_probe_interval: Duration::from_secs(30),
        }
    }
}
