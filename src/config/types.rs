//! The typed configuration's parts, one struct per section, and the enums their settings
//! choose between.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

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

/// `console__*`: the operator console.
#[derive(Debug, Clone)]
pub struct Console {
    /// `/console` is served.
    pub enabled: bool,
    /// A URL with `{traceId}` in it ("" = no trace links).
    pub trace_url_template: String,
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
    /// With auth off: `Host` names accepted besides addresses, `localhost` and the module id.
    pub allowed_host_names: Vec<String>,
    /// Bytes of request bodies being read at once, all connections together.
    pub max_body_bytes_in_flight: usize,
    /// Open client connections from one IP address (0 = no cap).
    pub max_connections_per_peer: usize,
    /// Receives waiting for events at once on one queue subscription.
    pub max_long_polls_per_subscription: usize,
    /// Receives waiting for events at once with one credential.
    pub max_long_polls_per_credential: usize,
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
    /// SAS keys that may only read `/metrics`.
    pub metrics_sas_keys: Vec<String>,
    /// SAS keys that may only receive from (and settle) one queue subscription.
    pub receive_sas_keys: Vec<ReceiveKey>,
    /// Client-certificate identities (subject CN) that may manage; empty = every verified
    /// certificate.
    pub admin_identities: Vec<String>,
    /// Shared access signatures expiring further ahead than this are refused.
    pub max_token_lifetime: Duration,
    /// Microsoft Entra ID bearer tokens, when enabled.
    pub entra: Option<Entra>,
}

impl Inbound {
    /// Whether some credential is required (SAS keys, client certificates or Entra tokens);
    /// with none, every request is an administrator (the original's open mode).
    pub fn requires_credential(&self) -> bool {
        self.sas_enabled || self.client_cert_enabled || self.entra.is_some()
    }
}

/// What an Entra ID access token must satisfy, and the rights of its principal
/// (`inbound__clientAuth__entra__*`).
#[derive(Debug, Clone)]
pub struct Entra {
    /// The accepted `iss` values (the tenant's v1 and v2 issuers).
    pub issuers: Vec<String>,
    /// The accepted `aud` values, without a trailing `/`.
    pub audiences: Vec<String>,
    /// The RSA signing keys of the JWKS file (`jwksPath`; empty without one), trusted besides
    /// the fetched ones.
    pub keys: Vec<Jwk>,
    /// Where the fetched keys come from, when they are fetched.
    pub refresh: Option<JwksRefresh>,
    /// Principals that may publish.
    pub senders: Vec<Principal>,
    /// Principals that may receive and settle.
    pub receivers: Vec<Principal>,
    /// Allowance on `exp` and `nbf`.
    pub clock_skew: Duration,
}

/// Fetching the tenant's signing keys from its OpenID metadata
/// (`inbound__clientAuth__entra__authority`, `__jwksRefreshIntervalInSeconds`).
#[derive(Debug, Clone)]
pub struct JwksRefresh {
    /// `{authority}/{tenantId}/v2.0/.well-known/openid-configuration`, https.
    pub metadata_url: String,
    /// How often the keys are fetched.
    pub every: Duration,
    /// At most one fetch per this interval for tokens naming an unknown key id; also the first
    /// delay after a failed fetch.
    pub min_interval: Duration,
    /// The last fetched key set, on disk (in `persistence__metadataPath`).
    pub cache_path: std::path::PathBuf,
}

/// One RSA signing key of a JSON Web Key Set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwk {
    /// `kid`, which a token's header names.
    pub kid: String,
    /// The modulus, big-endian bytes.
    pub n: Vec<u8>,
    /// The public exponent, big-endian bytes.
    pub e: Vec<u8>,
}

/// A token's principal: its tenant (`tid`) and object (`oid`) ids, lowercase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `tid`.
    pub tenant: String,
    /// `oid`.
    pub object: String,
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
    /// Extra roots (PEM file) for Azure destinations, which always verify chain and host name.
    pub azure_trusted_certs_file: Option<std::path::PathBuf>,
    /// Only https Event Grid destinations.
    pub eventgrid_https_only: bool,
    /// Allow Event Grid destination hosts outside Azure's domains.
    pub eventgrid_allow_invalid_hostnames: bool,
    /// Address ranges no destination may reach (checked on the resolved address).
    pub denied_ranges: Vec<IpRange>,
    /// `outbound__resources`: connection strings by Azure resource id.
    pub resources: Resources,
}

/// Connection strings by Azure resource id (`outbound__resources`), so a subscription can name
/// a resource as Event Grid namespaces do and hold no secret. Ids match without regard to case,
/// as ARM's do. `Debug` shows the ids only.
#[derive(Clone, Default)]
pub struct Resources(std::collections::BTreeMap<String, String>);

impl Resources {
    /// From `(resource id, connection string)` pairs.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(id, cs)| (Self::key(&id), cs))
                .collect(),
        )
    }

    fn key(id: &str) -> String {
        id.trim().trim_end_matches('/').to_ascii_lowercase()
    }

    /// The connection string of `resource_id`, if configured.
    pub fn get(&self, resource_id: &str) -> Option<&str> {
        self.0.get(&Self::key(resource_id)).map(String::as_str)
    }
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
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
        if prefix > max {
            return None;
        }
        // `::ffff:a.b.c.d/n`: addresses are matched as IPv4 (`contains`), so the range is too.
        if let std::net::IpAddr::V6(v6) = net {
            if let (Some(v4), true) = (v6.to_ipv4_mapped(), prefix >= 96) {
                return Some(Self {
                    net: v4.into(),
                    prefix: prefix - 96,
                });
            }
        }
        Some(Self { net, prefix })
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
    /// Deduplication window of topics that set none (0 = off).
    pub deduplication_window: Duration,
    /// Identities one topic remembers for deduplication at most.
    pub deduplication_max_identities: usize,
    /// Received, unsettled events per queue subscription.
    pub max_locks_per_subscription: usize,
    /// Body bytes of received, unsettled events per queue subscription.
    pub max_locked_bytes_per_subscription: u64,
    /// Event payload bytes held in memory, all subscriptions (0 = no limit).
    pub max_pending_bytes: u64,
    /// Topic count limit.
    pub max_topics: usize,
    /// Subscriptions per topic.
    pub max_subscriptions_per_topic: usize,
    /// Subscriptions, all topics together.
    pub max_subscriptions: usize,
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
/// health (see `delivery::classify`, `delivery::deadletter`, `delivery::health`).
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
    /// Dead-letter bytes kept, all subscriptions together (0 = none).
    pub dead_letter_max_bytes: u64,
    /// Forwarding to dead-letter destinations: batching, patience, memory bound.
    pub dead_letter_forward: crate::policy::ForwardPolicy,
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
    /// The event log on disk (events and dead letters), with the metadata in one file.
    Log,
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
    /// Accepted and ignored (it sized sled's cache).
    pub cache_bytes: u64,
    /// Period of the sync of dead letters nobody waits for (0 = off).
    pub flush_every_ms: u64,
    /// Idle time before a pinned segment of the event log is compacted.
    pub compact_after_idle_ms: u64,
    /// What a start does with damaged data.
    pub on_damage: OnDamage,
}

/// `persistence__onDamage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDamage {
    /// Recover around it, report it, and serve.
    #[default]
    Serve,
    /// Refuse to start, changing nothing.
    Refuse,
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

/// A trace sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// A span with a parent follows the parent's decision.
    pub parent_based: bool,
    /// Share of new traces sampled (0 to 1), by trace id.
    pub ratio: f64,
}

impl Sampler {
    /// Whether a trace with this id is sampled at `ratio`: the low 56 bits of the id (random
    /// in W3C ids) against the ratio, so every participant decides the same way.
    pub fn samples(&self, trace_id: u128) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        let low = (trace_id & ((1u128 << 56) - 1)) as f64;
        low < self.ratio * (1u64 << 56) as f64
    }
}

/// OpenTelemetry export (the standard `OTEL_*` variables) and what spans carry.
#[derive(Clone)]
pub struct Telemetry {
    /// Full URL spans are posted to (`None`: no spans recorded).
    pub traces_endpoint: Option<String>,
    /// Full URL metrics are posted to (`None`: no metrics export).
    pub metrics_endpoint: Option<String>,
    /// Time between metrics exports.
    pub metrics_interval: Duration,
    /// Headers on export requests (secret values).
    pub headers: Vec<(String, String)>,
    /// Bound on one export request.
    pub timeout: Duration,
    /// `OTEL_SERVICE_NAME`.
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order.
    pub resource_attributes: Vec<(String, String)>,
    /// Sampler.
    pub sampler: Sampler,
    /// Spans queued for export.
    pub max_queue_size: usize,
    /// Spans per export request.
    pub max_export_batch_size: usize,
    /// Time between exports.
    pub schedule_delay: Duration,
    /// Event ids on spans.
    pub event_ids_on_spans: bool,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            traces_endpoint: None,
            metrics_endpoint: None,
            metrics_interval: Duration::from_secs(60),
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            service_name: None,
            resource_attributes: Vec::new(),
            sampler: Sampler {
                parent_based: true,
                ratio: 1.0,
            },
            max_queue_size: 2048,
            max_export_batch_size: 512,
            schedule_delay: Duration::from_secs(5),
            event_ids_on_spans: false,
        }
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values are credentials: names only. Endpoints may carry user info and query
        // tokens: masked.
        let headers: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        let masked = |u: &Option<String>| u.as_deref().map(crate::redact::mask_url);
        f.debug_struct("Telemetry")
            .field("traces_endpoint", &masked(&self.traces_endpoint))
            .field("metrics_endpoint", &masked(&self.metrics_endpoint))
            .field("metrics_interval", &self.metrics_interval)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("service_name", &self.service_name)
            .field("resource_attributes", &self.resource_attributes)
            .field("sampler", &self.sampler)
            .field("max_queue_size", &self.max_queue_size)
            .field("max_export_batch_size", &self.max_export_batch_size)
            .field("schedule_delay", &self.schedule_delay)
            .field("event_ids_on_spans", &self.event_ids_on_spans)
            .finish()
    }
}

/// A SAS key limited to one queue subscription's receive operations
/// (`inbound__clientAuth__sasKeys__receiveKeys`).
#[derive(Clone, PartialEq, Eq)]
pub struct ReceiveKey {
    /// Topic name.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// The key (a secret: `Debug` masks it).
    pub key: String,
}

impl std::fmt::Debug for ReceiveKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}=***", self.topic, self.subscription)
    }
}
