//! Module configuration: one typed [`Config`] loaded once from the environment.
//!
//! The original module read ASP.NET-Core-style settings: hierarchical keys separated by `__`
//! **or** `:`, keys and boolean/enum values case-insensitive. `envy` cannot do that (it only
//! lowercases keys, rejects `False`, knows no `:` and no nesting), so this loader normalises keys
//! against one canonical table ([`SETTINGS`]) and parses each value with a typed parser whose
//! error names the key and the accepted values. Secrets and URLs keep their case.
//!
//! Nothing else in the crate reads the environment: `main` calls [`Config::from_env`] and passes
//! `Arc<Config>` down.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// One supported setting: canonical key, default (as written in the settings table), meaning.
pub struct Setting {
    /// Canonical spelling (`__` separators, original casing).
    pub key: &'static str,
    /// Default value as text ("" = unset).
    pub default: &'static str,
    /// One-line meaning, used in the README's settings table.
    pub doc: &'static str,
}

impl Setting {
    /// Whether the value is a secret: never logged, printed or echoed (the table marks these
    /// "(secret, never logged)").
    pub fn is_secret(&self) -> bool {
        self.doc.contains("(secret")
    }
}

/// One setting as a list of `KEY=value` pairs sets it: its canonical key, the value in force,
/// and whether that value was given (else it is the default).
pub struct Effective {
    /// The setting.
    pub setting: &'static Setting,
    /// The value in force ("" = unset); `***` for a secret that is set.
    pub value: String,
    /// Given in the variables (as opposed to the default).
    pub given: bool,
}

/// Every setting with the value the variables give it (keys normalised as [`Config::from_vars`]
/// does), secrets masked: for `gridlet check-config` and the start-up log.
pub fn effective(vars: impl IntoIterator<Item = (String, String)>) -> Vec<Effective> {
    let raw = Raw::new(vars);
    SETTINGS
        .iter()
        .map(|setting| {
            let given = raw.values.get(setting.key).map(|v| v.trim().to_string());
            let value = match &given {
                Some(v) if setting.is_secret() && !v.is_empty() => "***".to_string(),
                Some(v) => v.clone(),
                None => setting.default.to_string(),
            };
            Effective {
                setting,
                value,
                given: given.is_some(),
            }
        })
        .collect()
}

macro_rules! settings {
    ($( $key:literal = $default:literal : $doc:literal ;)*) => {
        /// Every setting gridlet understands, in one place. The README's table lists the same keys
        /// (a test checks it).
        pub const SETTINGS: &[Setting] = &[ $( Setting { key: $key, default: $default, doc: $doc } ),* ];
    };
}

settings! {
    "inbound__serverAuth__tlsPolicy" = "strict" : "`strict` HTTPS only, `enabled` HTTP and HTTPS, `disabled` HTTP only";
    "inbound__serverAuth__serverCert__source" = "IoTEdge" : "server certificate from the IoT Edge workload API; self-signed (kept in the metadata directory) when not running under IoT Edge";
    "inbound__clientAuth__clientCert__enabled" = "true" : "accept TLS client certificates as authentication";
    "inbound__clientAuth__clientCert__source" = "IoTEdge" : "client certificates are validated against the IoT Edge trust bundle";
    "inbound__clientAuth__clientCert__allowUnknownCA" = "true" : "accept client certificates from unknown / self-signed CAs";
    "inbound__clientAuth__sasKeys__enabled" = "false" : "accept the `aeg-sas-key` header as authentication";
    "inbound__clientAuth__sasKeys__key1" = "" : "accepted SAS key (secret, never logged)";
    "inbound__clientAuth__sasKeys__key2" = "" : "second accepted SAS key, for rotation (secret, never logged)";
    "inbound__clientAuth__sasKeys__publishOnlyKeys" = "" : "comma-separated SAS keys that may only publish (`POST .../events`); anything else gets 403 (secret, never logged; needs `sasKeys__enabled`). Beyond the original, opt-in";
    "inbound__clientAuth__clientCert__adminIdentities" = "" : "comma-separated client identities (the subject CN of the client certificate: the module id of an IoT Edge module identity certificate) that may manage topics and subscriptions; other accepted certificates may only publish. Empty: every accepted certificate is administrator (the original's behaviour)";
    "inbound__httpPort" = "5888" : "plain HTTP port (0 = any free port)";
    "inbound__httpsPort" = "4438" : "HTTPS port (0 = any free port)";
    "inbound__bindAddress" = "0.0.0.0" : "address both listeners bind to";
    "inbound__maxConnections" = "1024" : "open client connections, both listeners together; past it new connections wait in the listen backlog (not accepted) until one closes";
    "inbound__idleTimeoutInSeconds" = "30" : "a connection with no request in progress (never sent one, idle between keep-alive requests, or slow to send its headers) is closed after this long";
    "inbound__requestBodyTimeoutInSeconds" = "60" : "a request body must arrive within this long of being read; slower gets 408 and the connection closes";
    "inbound__responseWriteTimeoutInSeconds" = "30" : "a connection whose client reads none of a pending response for this long is closed";
    "outbound__clientAuth__clientCert__enabled" = "true" : "present the module identity certificate on outgoing calls (needs IoT Edge)";
    "outbound__clientAuth__clientCert__source" = "IoTEdge" : "identity certificate from the workload API";
    "outbound__webhook__httpsOnly" = "true" : "only `https://` webhook endpoints may be subscribed";
    "outbound__webhook__skipServerCertValidation" = "false" : "do not validate webhook server certificates at all";
    "outbound__webhook__allowUnknownCA" = "true" : "accept self-signed / unknown-CA webhook server certificates";
    "outbound__eventgrid__httpsOnly" = "true" : "cloud Event Grid destinations must be `https://`";
    "outbound__eventgrid__allowInvalidHostnames" = "false" : "allow Event Grid destination hosts outside `eventgrid.azure.{net,us,cn}`";
    "outbound__deniedAddressRanges" = "169.254.0.0/16,fe80::/10" : "address ranges (CIDR, comma-separated) no destination may reach: refused at subscription time for an address in the URL, and at connect time for the resolved address; the default denies link-local (cloud metadata services); empty denies none";
    "broker__defaultMaxDeliveryAttempts" = "30" : "delivery attempts per event when the subscription sets no `retryPolicy.maxDeliveryAttempts`";
    "broker__defaultEventTimeToLiveInSeconds" = "7200" : "event time to live when the subscription sets no `retryPolicy.eventExpiryInMinutes`";
    "broker__defaultMaxBatchSizeInBytes" = "1058576" : "batch byte cap when a subscription sets only `maxEventsPerBatch`";
    "broker__defaultMaxEventsPerBatch" = "10" : "batch event cap when a subscription sets only `preferredBatchSizeInKilobytes`";
    "broker__logDeliverySuccess" = "false" : "log every successful delivery (troubleshooting; off keeps the hot path quiet)";
    "broker__defaultIsPersisted" = "false" : "subscriptions without a `persistencePolicy` keep their events on disk";
    "broker__maxRequestBodyBytes" = "1058576" : "largest accepted request body; larger gets 413 before the body is read";
    "broker__maxEventsPerRequest" = "10000" : "most events in one publish request (400 above)";
    "broker__maxPendingEventsPerSubscription" = "100000" : "pending events one in-memory subscription may hold; a publish that would exceed it gets 503 + Retry-After";
    "broker__maxPendingBytes" = "268435456" : "bytes of undelivered events gridlet holds in memory, all subscriptions together (each event counted once, however many subscriptions share it; persisted subscriptions count their in-memory window); a publish to an in-memory subscription that would exceed it gets 503 + Retry-After; 0 = no limit";
    "broker__maxTopics" = "1000" : "most topics";
    "broker__maxSubscriptionsPerTopic" = "100" : "most event subscriptions per topic";
    "broker__maxInFlightPerSubscription" = "32" : "concurrent delivery requests per subscription (a quarter of them, at least 1, may be retries)";
    "broker__maxInFlightTotal" = "1024" : "concurrent delivery requests across all subscriptions (also the idle connections kept per destination host)";
    "broker__deliveryTimeoutInSeconds" = "60" : "how long a delivery waits for the subscriber's response";
    "broker__restartClockAllowanceInSeconds" = "3600" : "after a restart, the downtime counts toward event age (TTL) and retry delays for at most this long, so a clock that jumped forward (NTP after a boot without an RTC) does not expire a backlog, and one that jumped back does not stall retries; gridlet's clock resumes from the last run's heartbeat (docs/SECURITY.md, src/clock.rs)";
    "broker__shutdownDrainTimeoutInSeconds" = "8" : "on SIGTERM, deliveries in flight get this long to complete and be settled (nothing new is sent); keep it below the container's stop grace period (Docker's default is 10 s before SIGKILL; a longer `StopTimeout` in the module's createOptions allows a longer drain); 0 = abandon them (persisted events are redelivered after the restart)";
    "broker__workerThreads" = "0" : "threads of the async runtime; 0 = one per CPU core. `1` keeps gridlet on one core: on a saturated 2-core VM its p99 fell from ~10 ms to ~0.4 ms and its CPU per event at 1,000 events/s by a quarter, for 8–13 % less peak throughput (docs/BENCHMARKS.md)";
    "broker__statusCodePolicy" = "original" : "`original` retries every failure on the schedule; `standard` dead-letters 400/413 at once (with a dead-letter destination), honours `Retry-After` on 429/503 and jitters delays";
    "broker__retrySchedule" = "oneThenEveryTenMinutes" : "retry schedule when a subscription sets no `retryPolicy.schedule`: `oneThenEveryTenMinutes` (1 min, then every 10 min), `tenSecondsToHourly` (10 s, 30 s, 1 m, 5 m, 10 m, 30 m, 1 h, then hourly) or `doublingForFourDays` (11 retries, the delay doubling from 1.4 min to 48.2 h, the last about four days after the first attempt; then it gives up); the old names `original`, `eventGridCloud`, `workfront` are accepted";
    "broker__retryJitterPercent" = "10" : "under `standard`, every retry delay is spread by up to this many percent either way (0 = exact)";
    "broker__retryAfterMaxSeconds" = "3600" : "longest `Retry-After` honoured; longer requests are capped";
    "broker__queueFullPolicy" = "reject" : "when an in-memory subscription holds `broker__maxPendingEventsPerSubscription` events: `reject` the publish with 503 (original), or `deadLetter` that subscription's copies and accept the publish for the others";
    "broker__deadLetter__maxEventsPerSubscription" = "10000" : "dead letters kept per subscription (oldest evicted first; on disk with the sled store); 0 = none kept";
    "broker__endpointHealth__enabled" = "true" : "track each destination URL's health and slow down (disabled) or stop (frozen) deliveries to failing endpoints";
    "broker__endpointHealth__disableFailureRatePercent" = "70" : "an endpoint is disabled when its failure rate exceeds this percentage ...";
    "broker__endpointHealth__disableMinAttempts" = "100" : "... over more than this many recent attempts";
    "broker__endpointHealth__disableConsecutiveFailures" = "2000" : "an endpoint is disabled after this many consecutive failures";
    "broker__endpointHealth__probeIntervalInSeconds" = "600" : "a disabled endpoint gets one probe delivery this often; a success re-enables it";
    "broker__endpointHealth__freezeConsecutiveFailures" = "2000" : "frozen (no attempts until re-enabled through the API) after more consecutive failures than this ...";
    "broker__endpointHealth__freezeNoSuccessInHours" = "72" : "... with the last success longer ago than this";
    "broker__endpointHealth__freezeAnyConsecutiveFailures" = "50000" : "frozen after more consecutive failures than this, whenever the last success was";
    "broker__endpointHealth__windowAttempts" = "1000" : "how many recent attempts the failure rate is computed over";
    "api__deliveryPolicyLimits__maxEventsPerBatch" = "50" : "largest `maxEventsPerBatch` a subscription may set";
    "api__deliveryPolicyLimits__maxpreferredBatchSizeInKilobytes" = "1033" : "largest `preferredBatchSizeInKilobytes` a subscription may set";
    "api__deliveryPolicyLimits__maxBatchSizeInBytes" = "1058576" : "largest `approxBatchSizeInBytes` (older twin knob) a subscription may set";
    "api__filterLimits__maxIncludedEventTypes" = "256" : "most entries in a subscription's `filter.includedEventTypes` (400 above); matched in constant time, this bounds the memory of one subscription's type set";
    "metrics__reporterType" = "none" : "`none`, `prometheus` (serve `/metrics`), `console` (log metrics every 60 s)";
    "log__format" = "text" : "`text`: one line per record with the syslog severity prefix IoT Edge filters on (`<6>` info, `<4>` warn, `<3>` error), colours only on a terminal and never with `NO_COLOR`; `json`: one JSON object per line, for log shippers. Level: `RUST_LOG` (default `info`)";
    "persistence__metadataPath" = "metadataDb" : "directory holding topics, subscriptions and the self-signed certificate";
    "persistence__eventsPath" = "eventsDb" : "directory holding persisted events";
    "persistence__store" = "sled" : "`sled`: metadata, endpoint health, dead letters and the events of persisted subscriptions on disk (files under `gridlet-v1/`); `memory`: everything in memory, lost on restart";
    "persistence__maxDiskBytes" = "268435456" : "bound on the event store: persisted publishes get 507 + Retry-After when live event and dead-letter bytes x 2.5 (sled's files measured at ~2x live data) would exceed it; bounds disk only: a persisted backlog stays on disk, memory holds a window of 2048 events per subscription";
    "persistence__cacheBytes" = "8388608" : "sled page cache of the event store (counts on-disk page bytes; RSS is higher)";
    "persistence__flushEveryMs" = "1000" : "period of sled's own background fsync (`sync_all`); acknowledged events are already fsynced by the publish journal and its 200 ms checkpoints; 0 = off";
}

/// A setting that could not be parsed. Its `Display` is the one line printed at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    key: String,
    value: String,
    expected: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid setting {}={:?}: expected {}",
            self.key, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// `log__format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per record, with the syslog severity prefix.
    Text,
    /// One JSON object per line.
    Json,
}

/// `inbound__serverAuth__tlsPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// HTTPS only.
    Strict,
    /// HTTP and HTTPS.
    Enabled,
    /// HTTP only.
    Disabled,
}

impl TlsPolicy {
    /// Whether the HTTP listener runs.
    pub fn http(self) -> bool {
        matches!(self, Self::Enabled | Self::Disabled)
    }
    /// Whether the HTTPS listener runs.
    pub fn https(self) -> bool {
        matches!(self, Self::Strict | Self::Enabled)
    }
}

/// `metrics__reporterType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsReporter {
    /// No metrics output.
    None,
    /// Prometheus text at `/metrics`.
    Prometheus,
    /// Periodic log line.
    Console,
}

/// Inbound (server side) settings.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// Which listeners run.
    pub tls_policy: TlsPolicy,
    /// Plain HTTP port.
    pub http_port: u16,
    /// HTTPS port.
    pub https_port: u16,
    /// Bind address of both listeners.
    pub bind_address: IpAddr,
    /// Open client connections, both listeners together.
    pub max_connections: usize,
    /// Close a connection with no request in progress after this long.
    pub idle_timeout: Duration,
    /// A request body must arrive within this long of being read.
    pub body_timeout: Duration,
    /// Close a connection whose client reads nothing of a pending response for this long.
    pub write_timeout: Duration,
    /// Client certificates authenticate.
    pub client_cert_enabled: bool,
    /// Client certificates from unknown CAs are accepted.
    pub client_cert_allow_unknown_ca: bool,
    /// `aeg-sas-key` authenticates.
    pub sas_enabled: bool,
    /// Accepted SAS keys (key1, key2). Secrets: never logged (see [`Config`]'s `Debug`).
    pub sas_keys: Vec<String>,
    /// SAS keys that may only publish. Secrets, like `sas_keys`.
    pub publish_only_sas_keys: Vec<String>,
    /// Client-certificate identities (subject CN) that may manage; empty = every certificate.
    pub admin_identities: Vec<String>,
}

/// Outbound (delivery side) settings.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// Present the module identity certificate.
    pub client_cert_enabled: bool,
    /// Only https webhooks may be subscribed.
    pub webhook_https_only: bool,
    /// Skip webhook certificate validation entirely.
    pub webhook_skip_server_cert_validation: bool,
    /// Accept unknown-CA webhook certificates.
    pub webhook_allow_unknown_ca: bool,
    /// Only https Event Grid destinations.
    pub eventgrid_https_only: bool,
    /// Allow Event Grid destination hosts outside Azure's domains.
    pub eventgrid_allow_invalid_hostnames: bool,
    /// Address ranges no destination may reach (checked on the resolved address).
    pub denied_ranges: Vec<IpRange>,
}

/// An address range in CIDR notation (`169.254.0.0/16`, `fe80::/10`; a bare address is one
/// host). IPv4-mapped IPv6 addresses match as their IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    net: std::net::IpAddr,
    prefix: u8,
}

impl IpRange {
    /// Parse `a.b.c.d/n`, `x::y/n` or a bare address.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p.trim().parse::<u8>().ok()?)),
            None => (s.trim(), None),
        };
        let net: std::net::IpAddr = addr.trim().parse().ok()?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Self { net, prefix })
    }

    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |n: u32, width: u32| -> u128 {
            if n == 0 {
                0
            } else {
                (u128::MAX << (128 - n)) >> (128 - width)
            }
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let m = bits(u32::from(self.prefix), 32);
                u128::from(u32::from(n)) & m == u128::from(u32::from(a)) & m
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let m = bits(u32::from(self.prefix), 128);
                u128::from(n) & m == u128::from(a) & m
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// Broker-wide delivery defaults and limits.
#[derive(Debug, Clone)]
pub struct Broker {
    /// Default `maxDeliveryAttempts`.
    pub default_max_delivery_attempts: u32,
    /// Default time to live.
    pub default_event_ttl: Duration,
    /// Default batch byte cap.
    pub default_max_batch_size_bytes: usize,
    /// Default batch event cap.
    pub default_max_events_per_batch: usize,
    /// Log every successful delivery.
    pub log_delivery_success: bool,
    /// Subscriptions without a persistence policy are persisted.
    pub default_is_persisted: bool,
    /// Request body limit.
    pub max_request_body_bytes: usize,
    /// Events per publish request.
    pub max_events_per_request: usize,
    /// Pending events per in-memory subscription.
    pub max_pending_events_per_subscription: usize,
    /// Event payload bytes held in memory, all subscriptions (0 = no limit).
    pub max_pending_bytes: u64,
    /// Topic count limit.
    pub max_topics: usize,
    /// Subscriptions per topic.
    pub max_subscriptions_per_topic: usize,
    /// Concurrent deliveries per subscription.
    pub max_in_flight_per_subscription: usize,
    /// Concurrent deliveries in total.
    pub max_in_flight_total: usize,
    /// Response timeout of one delivery request.
    pub delivery_timeout: Duration,
    /// On shutdown, in-flight deliveries get this long to complete.
    pub shutdown_drain: Duration,
    /// Downtime counted toward age and delays across a restart, at most.
    pub restart_clock_allowance: Duration,
    /// Async runtime worker threads (0 = one per core); read by `main` before the runtime starts.
    pub worker_threads: usize,
}

/// Delivery resilience beyond the original: status codes, schedules, dead letters, endpoint
/// health (see `delivery::policy`, `delivery::deadletter`, `delivery::health`).
#[derive(Debug, Clone)]
pub struct Resilience {
    /// Module default status-code policy.
    pub status_code_policy: crate::policy::StatusCodePolicy,
    /// Module default retry schedule.
    pub retry_schedule: crate::policy::ScheduleName,
    /// Jitter under the `standard` policy (percent either way).
    pub jitter_percent: u8,
    /// Cap on honoured `Retry-After`.
    pub retry_after_cap: Duration,
    /// Dead letters kept per subscription (0 = none).
    pub dead_letter_capacity: usize,
    /// Full in-memory queue: reject the publish or dead-letter the copy.
    pub queue_full_policy: crate::policy::QueueFullPolicy,
    /// Endpoint health thresholds.
    pub health: crate::policy::HealthConfig,
}

/// Creation-time limits on subscription batching knobs.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    /// Largest `maxEventsPerBatch`.
    pub max_events_per_batch: u32,
    /// Largest `preferredBatchSizeInKilobytes`.
    pub max_preferred_batch_size_kb: u32,
    /// Largest `approxBatchSizeInBytes`.
    pub max_batch_size_bytes: u64,
    /// Most entries in `filter.includedEventTypes`.
    pub max_included_event_types: usize,
}

/// `persistence__store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// sled databases on disk.
    Sled,
    /// Maps in memory.
    Memory,
}

/// Storage locations and the event store's bounds.
#[derive(Debug, Clone)]
pub struct Persistence {
    /// Metadata directory.
    pub metadata_path: PathBuf,
    /// Events directory.
    pub events_path: PathBuf,
    /// Which store.
    pub store: StoreKind,
    /// Disk bound of the event store.
    pub max_disk_bytes: u64,
    /// sled page cache of the event store.
    pub cache_bytes: u64,
    /// sled's background fsync period (0 = off).
    pub flush_every_ms: u64,
}

/// The identity IoT Edge gives the module through `IOTEDGE_*` variables; defaults outside IoT Edge.
#[derive(Debug, Clone)]
pub struct EdgeEnv {
    /// First DNS label of `IOTEDGE_IOTHUBHOSTNAME` (for resource ids).
    pub hub_name: String,
    /// `IOTEDGE_IOTHUBHOSTNAME`.
    pub iothub_hostname: Option<String>,
    /// `IOTEDGE_DEVICEID`.
    pub device_id: String,
    /// `IOTEDGE_MODULEID`.
    pub module_id: String,
    /// `IOTEDGE_MODULEGENERATIONID`.
    pub generation_id: Option<String>,
    /// `IOTEDGE_WORKLOADURI`.
    pub workload_uri: Option<String>,
    /// `IOTEDGE_GATEWAYHOSTNAME`.
    pub gateway_hostname: Option<String>,
    /// `IOTEDGE_APIVERSION` (workload API version).
    pub api_version: String,
}

impl EdgeEnv {
    /// Whether the module runs under an IoT Edge runtime (a workload socket is given).
    pub fn is_iot_edge(&self) -> bool {
        self.workload_uri.is_some()
    }
}

/// The whole configuration, parsed and validated.
#[derive(Clone)]
pub struct Config {
    /// Inbound settings.
    pub inbound: Inbound,
    /// Outbound settings.
    pub outbound: Outbound,
    /// Broker settings.
    pub broker: Broker,
    /// API limits.
    pub api: ApiLimits,
    /// Delivery resilience settings.
    pub resilience: Resilience,
    /// Metrics reporter.
    pub metrics: MetricsReporter,
    /// How log records are written (`log__format`).
    pub log_format: LogFormat,
    /// Storage paths.
    pub persistence: Persistence,
    /// IoT Edge identity.
    pub edge: EdgeEnv,
    /// Keys that looked like settings but are not known (reported as a warning at start-up).
    pub unknown_keys: Vec<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAS keys are secrets: show how many there are, never their values.
        let mut inbound = self.inbound.clone();
        inbound.sas_keys = inbound.sas_keys.iter().map(|_| "***".to_string()).collect();
        inbound.publish_only_sas_keys = inbound
            .publish_only_sas_keys
            .iter()
            .map(|_| "***".to_string())
            .collect();
        f.debug_struct("Config")
            .field("inbound", &inbound)
            .field("outbound", &self.outbound)
            .field("broker", &self.broker)
            .field("api", &self.api)
            .field("resilience", &self.resilience)
            .field("metrics", &self.metrics)
            .field("persistence", &self.persistence)
            .field("edge", &self.edge)
            .finish()
    }
}

const SETTING_PREFIXES: &[&str] = &[
    "inbound__",
    "outbound__",
    "broker__",
    "api__",
    "metrics__",
    "persistence__",
    "log__",
];

/// Normalised settings: canonical key → raw value, plus the `IOTEDGE_*` variables.
struct Raw {
    values: HashMap<&'static str, String>,
    edge: HashMap<String, String>,
    unknown: Vec<String>,
}

impl Raw {
    fn new(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let canon: HashMap<String, &'static str> = SETTINGS
            .iter()
            .map(|s| (s.key.to_ascii_lowercase(), s.key))
            .collect();
        let mut values = HashMap::new();
        let mut edge = HashMap::new();
        let mut unknown = Vec::new();
        for (k, v) in vars {
            let norm = k.replace(':', "__").to_ascii_lowercase();
            if let Some(key) = canon.get(&norm) {
                values.insert(*key, v);
            } else if norm.starts_with("iotedge_") {
                edge.insert(norm, v);
            } else if SETTING_PREFIXES.iter().any(|p| norm.starts_with(p)) {
                unknown.push(k);
            }
        }
        unknown.sort();
        Self {
            values,
            edge,
            unknown,
        }
    }

    fn text(&self, key: &'static str) -> &str {
        match self.values.get(key) {
            Some(v) => v.trim(),
            None => SETTINGS
                .iter()
                .find(|s| s.key == key)
                .map(|s| s.default)
                .unwrap_or(""),
        }
    }

    fn err(&self, key: &'static str, expected: &str) -> ConfigError {
        ConfigError {
            key: key.to_string(),
            value: self.text(key).to_string(),
            expected: expected.to_string(),
        }
    }

    fn bool(&self, key: &'static str) -> Result<bool, ConfigError> {
        match self.text(key).to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(self.err(key, "true or false")),
        }
    }

    fn int(&self, key: &'static str, min: u64, max: u64) -> Result<u64, ConfigError> {
        // The docs print 1_058_576 for readability; accept underscores.
        let cleaned: String = self.text(key).chars().filter(|c| *c != '_').collect();
        match cleaned.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.err(key, &format!("a whole number from {min} to {max}"))),
        }
    }

    fn choice<T: Copy>(&self, key: &'static str, options: &[(&str, T)]) -> Result<T, ConfigError> {
        let v = self.text(key);
        options
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(v))
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.err(key, &format!("one of {}", names.join(", ")))
            })
    }

    fn secret(&self, key: &'static str) -> Option<String> {
        self.values
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }
}

/// The non-empty, trimmed items of a comma-separated setting.
fn comma_list(v: Option<&str>) -> Vec<String> {
    v.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Config {
    /// Load from the process environment.
    ///
    /// # Errors
    /// The first setting that does not parse.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// Load from any list of `KEY=value` pairs (tests pass their own).
    ///
    /// # Errors
    /// The first setting that does not parse, or a combination that cannot work.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let raw = Raw::new(vars);
        let u32_max = u64::from(u32::MAX);
        let tls_policy = raw.choice(
            "inbound__serverAuth__tlsPolicy",
            &[
                ("strict", TlsPolicy::Strict),
                ("enabled", TlsPolicy::Enabled),
                ("disabled", TlsPolicy::Disabled),
            ],
        )?;
        raw.choice(
            "inbound__serverAuth__serverCert__source",
            &[("IoTEdge", ())],
        )?;
        raw.choice(
            "inbound__clientAuth__clientCert__source",
            &[("IoTEdge", ())],
        )?;
        raw.choice(
            "outbound__clientAuth__clientCert__source",
            &[("IoTEdge", ())],
        )?;
        let bind_address = raw
            .text("inbound__bindAddress")
            .parse::<IpAddr>()
            .map_err(|_| raw.err("inbound__bindAddress", "an IPv4 or IPv6 address"))?;
        let sas_enabled = raw.bool("inbound__clientAuth__sasKeys__enabled")?;
        let sas_keys: Vec<String> = [
            raw.secret("inbound__clientAuth__sasKeys__key1"),
            raw.secret("inbound__clientAuth__sasKeys__key2"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let publish_only_sas_keys = comma_list(
            raw.secret("inbound__clientAuth__sasKeys__publishOnlyKeys")
                .as_deref(),
        );
        if sas_enabled && sas_keys.is_empty() && publish_only_sas_keys.is_empty() {
            return Err(ConfigError {
                key: "inbound__clientAuth__sasKeys__key1".into(),
                value: String::new(),
                expected:
                    "a key (key1 and/or key2) when inbound__clientAuth__sasKeys__enabled=true"
                        .into(),
            });
        }
        let inbound = Inbound {
            tls_policy,
            http_port: raw.int("inbound__httpPort", 0, 65535)? as u16,
            https_port: raw.int("inbound__httpsPort", 0, 65535)? as u16,
            bind_address,
            max_connections: raw.int("inbound__maxConnections", 1, 1_000_000)? as usize,
            idle_timeout: Duration::from_secs(raw.int(
                "inbound__idleTimeoutInSeconds",
                1,
                86_400,
            )?),
            body_timeout: Duration::from_secs(raw.int(
                "inbound__requestBodyTimeoutInSeconds",
                1,
                86_400,
            )?),
            write_timeout: Duration::from_secs(raw.int(
                "inbound__responseWriteTimeoutInSeconds",
                1,
                86_400,
            )?),
            client_cert_enabled: raw.bool("inbound__clientAuth__clientCert__enabled")?,
            client_cert_allow_unknown_ca: raw
                .bool("inbound__clientAuth__clientCert__allowUnknownCA")?,
            sas_enabled,
            sas_keys,
            publish_only_sas_keys,
            admin_identities: comma_list(Some(
                raw.text("inbound__clientAuth__clientCert__adminIdentities"),
            )),
        };
        let outbound = Outbound {
            client_cert_enabled: raw.bool("outbound__clientAuth__clientCert__enabled")?,
            webhook_https_only: raw.bool("outbound__webhook__httpsOnly")?,
            webhook_skip_server_cert_validation: raw
                .bool("outbound__webhook__skipServerCertValidation")?,
            webhook_allow_unknown_ca: raw.bool("outbound__webhook__allowUnknownCA")?,
            eventgrid_https_only: raw.bool("outbound__eventgrid__httpsOnly")?,
            eventgrid_allow_invalid_hostnames: raw
                .bool("outbound__eventgrid__allowInvalidHostnames")?,
            denied_ranges: comma_list(Some(raw.text("outbound__deniedAddressRanges")))
                .iter()
                .map(|r| {
                    IpRange::parse(r).ok_or_else(|| {
                        raw.err(
                            "outbound__deniedAddressRanges",
                            "comma-separated CIDR ranges, e.g. 169.254.0.0/16,fe80::/10",
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let broker = Broker {
            default_max_delivery_attempts: raw.int(
                "broker__defaultMaxDeliveryAttempts",
                1,
                u32_max,
            )? as u32,
            default_event_ttl: Duration::from_secs(raw.int(
                "broker__defaultEventTimeToLiveInSeconds",
                1,
                u32_max,
            )?),
            default_max_batch_size_bytes: raw.int(
                "broker__defaultMaxBatchSizeInBytes",
                1,
                u32_max,
            )? as usize,
            default_max_events_per_batch: raw.int("broker__defaultMaxEventsPerBatch", 1, 100_000)?
                as usize,
            log_delivery_success: raw.bool("broker__logDeliverySuccess")?,
            default_is_persisted: raw.bool("broker__defaultIsPersisted")?,
            max_request_body_bytes: raw.int("broker__maxRequestBodyBytes", 1024, 256 << 20)?
                as usize,
            max_events_per_request: raw.int("broker__maxEventsPerRequest", 1, 10_000_000)? as usize,
            max_pending_events_per_subscription: raw.int(
                "broker__maxPendingEventsPerSubscription",
                1,
                u32_max,
            )? as usize,
            max_pending_bytes: raw.int("broker__maxPendingBytes", 0, u64::MAX)?,
            max_topics: raw.int("broker__maxTopics", 1, 1_000_000)? as usize,
            max_subscriptions_per_topic: raw.int("broker__maxSubscriptionsPerTopic", 1, 100_000)?
                as usize,
            max_in_flight_per_subscription: raw.int(
                "broker__maxInFlightPerSubscription",
                1,
                10_000,
            )? as usize,
            max_in_flight_total: raw.int("broker__maxInFlightTotal", 1, 1_000_000)? as usize,
            delivery_timeout: Duration::from_secs(raw.int(
                "broker__deliveryTimeoutInSeconds",
                1,
                3600,
            )?),
            shutdown_drain: Duration::from_secs(raw.int(
                "broker__shutdownDrainTimeoutInSeconds",
                0,
                3600,
            )?),
            restart_clock_allowance: Duration::from_secs(raw.int(
                "broker__restartClockAllowanceInSeconds",
                0,
                100 * 365 * 86_400,
            )?),
            worker_threads: raw.int("broker__workerThreads", 0, 1024)? as usize,
        };
        let api = ApiLimits {
            max_events_per_batch: raw.int(
                "api__deliveryPolicyLimits__maxEventsPerBatch",
                1,
                100_000,
            )? as u32,
            max_preferred_batch_size_kb: raw.int(
                "api__deliveryPolicyLimits__maxpreferredBatchSizeInKilobytes",
                1,
                1 << 20,
            )? as u32,
            max_batch_size_bytes: raw.int(
                "api__deliveryPolicyLimits__maxBatchSizeInBytes",
                1,
                1 << 30,
            )?,
            max_included_event_types: raw.int(
                "api__filterLimits__maxIncludedEventTypes",
                1,
                100_000,
            )? as usize,
        };
        let resilience = Resilience {
            status_code_policy: raw.choice(
                "broker__statusCodePolicy",
                &crate::policy::StatusCodePolicy::ALL,
            )?,
            retry_schedule: raw.choice(
                "broker__retrySchedule",
                &crate::policy::ScheduleName::ACCEPTED,
            )?,
            jitter_percent: raw.int("broker__retryJitterPercent", 0, 50)? as u8,
            retry_after_cap: Duration::from_secs(raw.int(
                "broker__retryAfterMaxSeconds",
                0,
                u32_max,
            )?),
            dead_letter_capacity: raw.int(
                "broker__deadLetter__maxEventsPerSubscription",
                0,
                10_000_000,
            )? as usize,
            queue_full_policy: raw.choice(
                "broker__queueFullPolicy",
                &crate::policy::QueueFullPolicy::ALL,
            )?,
            health: crate::policy::HealthConfig {
                enabled: raw.bool("broker__endpointHealth__enabled")?,
                disable_failure_rate_percent: raw.int(
                    "broker__endpointHealth__disableFailureRatePercent",
                    1,
                    100,
                )? as u32,
                disable_min_attempts: raw.int(
                    "broker__endpointHealth__disableMinAttempts",
                    1,
                    u32_max,
                )? as u32,
                disable_consecutive_failures: raw.int(
                    "broker__endpointHealth__disableConsecutiveFailures",
                    1,
                    u32_max,
                )?,
                probe_interval: Duration::from_secs(raw.int(
                    "broker__endpointHealth__probeIntervalInSeconds",
                    1,
                    u32_max,
                )?),
                freeze_consecutive_failures: raw.int(
                    "broker__endpointHealth__freezeConsecutiveFailures",
                    1,
                    u64::MAX,
                )?,
                freeze_no_success_for: Duration::from_secs(
                    raw.int(
                        "broker__endpointHealth__freezeNoSuccessInHours",
                        1,
                        1_000_000,
                    )? * 3600,
                ),
                freeze_any_consecutive_failures: raw.int(
                    "broker__endpointHealth__freezeAnyConsecutiveFailures",
                    1,
                    u64::MAX,
                )?,
                window_attempts: raw.int("broker__endpointHealth__windowAttempts", 1, 1_000_000)?
                    as usize,
            },
        };
        let metrics = raw.choice(
            "metrics__reporterType",
            &[
                ("none", MetricsReporter::None),
                ("prometheus", MetricsReporter::Prometheus),
                ("console", MetricsReporter::Console),
            ],
        )?;
        let persistence = Persistence {
            metadata_path: PathBuf::from(raw.text("persistence__metadataPath")),
            events_path: PathBuf::from(raw.text("persistence__eventsPath")),
            store: raw.choice(
                "persistence__store",
                &[("sled", StoreKind::Sled), ("memory", StoreKind::Memory)],
            )?,
            max_disk_bytes: raw.int("persistence__maxDiskBytes", 1 << 16, u64::MAX)?,
            cache_bytes: raw.int("persistence__cacheBytes", 1 << 16, 1 << 40)?,
            flush_every_ms: raw.int("persistence__flushEveryMs", 0, 3_600_000)?,
        };
        let edge_var = |name: &str| {
            raw.edge
                .get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let iothub_hostname = edge_var("iotedge_iothubhostname");
        let edge = EdgeEnv {
            hub_name: iothub_hostname
                .as_deref()
                .and_then(|h| h.split('.').next())
                .unwrap_or("localhub")
                .to_string(),
            iothub_hostname,
            device_id: edge_var("iotedge_deviceid").unwrap_or_else(|| "localdevice".into()),
            module_id: edge_var("iotedge_moduleid").unwrap_or_else(|| "gridlet".into()),
            generation_id: edge_var("iotedge_modulegenerationid"),
            workload_uri: edge_var("iotedge_workloaduri"),
            gateway_hostname: edge_var("iotedge_gatewayhostname"),
            api_version: edge_var("iotedge_apiversion").unwrap_or_else(|| "2019-01-30".into()),
        };
        let log_format = raw.choice(
            "log__format",
            &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        )?;
        Ok(Self {
            inbound,
            outbound,
            broker,
            api,
            resilience,
            metrics,
            log_format,
            persistence,
            edge,
            unknown_keys: raw.unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.inbound.tls_policy, TlsPolicy::Strict);
        assert!(c.inbound.client_cert_enabled);
        assert!(c.inbound.client_cert_allow_unknown_ca);
        assert!(!c.inbound.sas_enabled);
        assert_eq!(c.inbound.http_port, 5888);
        assert_eq!(c.inbound.https_port, 4438);
        assert!(c.outbound.webhook_https_only);
        assert!(!c.outbound.webhook_skip_server_cert_validation);
        assert!(c.outbound.webhook_allow_unknown_ca);
        assert_eq!(c.broker.default_max_delivery_attempts, 30);
        assert_eq!(c.broker.default_event_ttl, Duration::from_secs(7200));
        assert_eq!(c.broker.default_max_batch_size_bytes, 1_058_576);
        assert_eq!(c.broker.default_max_events_per_batch, 10);
        assert_eq!(c.broker.max_request_body_bytes, 1_058_576);
        assert_eq!(c.api.max_events_per_batch, 50);
        assert_eq!(c.api.max_preferred_batch_size_kb, 1033);
        assert_eq!(c.metrics, MetricsReporter::None);
        assert_eq!(c.persistence.metadata_path, PathBuf::from("metadataDb"));
        assert_eq!(c.persistence.events_path, PathBuf::from("eventsDb"));
        assert_eq!(c.persistence.store, StoreKind::Sled);
        assert_eq!(c.persistence.max_disk_bytes, 256 << 20);
    }

    #[test]
    fn colon_separators_and_any_case_are_the_same_key() {
        let c = cfg(&[
            ("inbound:serverAuth:tlsPolicy", "Enabled"),
            ("BROKER__DEFAULTEVENTTIMETOLIVEINSECONDS", "1_800"),
            ("Inbound__ClientAuth:SasKeys__Enabled", "True"),
            ("inbound__clientAuth__sasKeys__key1", "MixedCaseSecret"),
            ("metrics:reportertype", "PROMETHEUS"),
        ])
        .unwrap();
        assert_eq!(c.inbound.tls_policy, TlsPolicy::Enabled);
        assert_eq!(c.broker.default_event_ttl, Duration::from_secs(1800));
        assert!(c.inbound.sas_enabled);
        assert_eq!(c.inbound.sas_keys, vec!["MixedCaseSecret".to_string()]);
        assert_eq!(c.metrics, MetricsReporter::Prometheus);
    }

    #[test]
    fn invalid_values_name_the_key_and_the_accepted_values() {
        let e = cfg(&[("inbound__serverAuth__tlsPolicy", "sometimes")]).unwrap_err();
        let line = e.to_string();
        assert!(line.contains("inbound__serverAuth__tlsPolicy"), "{line}");
        assert!(line.contains("strict, enabled, disabled"), "{line}");
        let e = cfg(&[("broker__defaultMaxDeliveryAttempts", "lots")]).unwrap_err();
        assert!(e.to_string().contains("whole number"));
        let e = cfg(&[("outbound__webhook__httpsOnly", "yes")]).unwrap_err();
        assert!(e.to_string().contains("true or false"));
    }

    #[test]
    fn denied_address_ranges_parse_and_match() {
        let c = cfg(&[]).unwrap();
        let denied = |ip: &str| {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            c.outbound.denied_ranges.iter().any(|r| r.contains(ip))
        };
        assert!(denied("169.254.169.254"));
        assert!(denied("fe80::1"));
        assert!(denied("::ffff:169.254.0.1"));
        assert!(!denied("10.0.0.1") && !denied("127.0.0.1") && !denied("192.168.1.1"));
        let c = cfg(&[(
            "outbound__deniedAddressRanges",
            " 127.0.0.0/8 , ::1,10.1.2.3",
        )])
        .unwrap();
        assert_eq!(c.outbound.denied_ranges.len(), 3);
        assert!(c.outbound.denied_ranges[0].contains("127.9.9.9".parse().unwrap()));
        assert!(c.outbound.denied_ranges[2].contains("10.1.2.3".parse().unwrap()));
        assert!(!c.outbound.denied_ranges[2].contains("10.1.2.4".parse().unwrap()));
        assert!(cfg(&[("outbound__deniedAddressRanges", "")])
            .unwrap()
            .outbound
            .denied_ranges
            .is_empty());
        for bad in ["169.254.0.0/33", "fe80::/129", "localhost", "1.2.3.4/x"] {
            let e = cfg(&[("outbound__deniedAddressRanges", bad)]).unwrap_err();
            assert!(
                e.to_string().contains("outbound__deniedAddressRanges"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn sas_enabled_without_a_key_is_refused() {
        let e = cfg(&[("inbound__clientAuth__sasKeys__enabled", "true")]).unwrap_err();
        assert!(e.to_string().contains("key1"));
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let c = cfg(&[
            ("inbound__clientAuth__sasKeys__enabled", "true"),
            ("inbound__clientAuth__sasKeys__key1", "topsecret"),
        ])
        .unwrap();
        assert!(!format!("{c:?}").contains("topsecret"));
    }

    #[test]
    fn unknown_setting_keys_are_reported() {
        let c = cfg(&[("broker__defaultMaxDeliveryAtempts", "3"), ("PATH", "/bin")]).unwrap();
        assert_eq!(
            c.unknown_keys,
            vec!["broker__defaultMaxDeliveryAtempts".to_string()]
        );
    }

    #[test]
    fn iot_edge_identity_is_read() {
        let c = cfg(&[
            (
                "IOTEDGE_IOTHUBHOSTNAME",
                "eg-iot-edge-hub.azure-devices.net",
            ),
            ("IOTEDGE_DEVICEID", "eg-edge-device"),
            ("IOTEDGE_MODULEID", "eventgridmodule"),
        ])
        .unwrap();
        assert_eq!(c.edge.hub_name, "eg-iot-edge-hub");
        assert_eq!(c.edge.device_id, "eg-edge-device");
        assert_eq!(c.edge.module_id, "eventgridmodule");
        assert!(!c.edge.is_iot_edge());
    }
}

#[cfg(test)]
mod readme_tests {
    /// The README's settings table is generated from [`super::SETTINGS`]
    /// (`scripts/settings-table.py`); this keeps the two from drifting apart.
    #[test]
    fn readme_lists_every_setting_with_its_default() {
        let readme = include_str!("../README.md");
        for s in super::SETTINGS {
            let default = if s.default.is_empty() {
                "—".to_string()
            } else {
                format!("`{}`", s.default)
            };
            let row = format!("| `{}` | {} |", s.key, default);
            assert!(
                readme.contains(&row),
                "README settings table lacks or misstates {}",
                s.key
            );
        }
    }
}
