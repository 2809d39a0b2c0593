//! The settings table: every setting gridlet understands, written once. The `settings!` macro
//! makes both the table ([`SETTINGS`], which `gridlet --help`, `check-config` and the README's
//! table read) and [`Key`], one variant per setting named by its canonical key, through which
//! the parser reads values: a mistyped key does not compile.

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

macro_rules! settings {
    ($( $key:ident = $default:literal : $doc:literal ;)*) => {
        /// A setting, named by its canonical key (the variant's name is the key, so it is
        /// written once, in the table below). `Key::k as usize` is its index in [`SETTINGS`].
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Key {
            $( #[doc = $doc] $key, )*
        }

        impl Key {
            /// Every key, in table order.
            pub const ALL: &'static [Key] = &[ $( Key::$key ),* ];
        }

        /// Every setting gridlet understands, in one place. The README's table lists the same keys
        /// (a test checks it).
        pub const SETTINGS: &[Setting] = &[ $( Setting { key: stringify!($key), default: $default, doc: $doc } ),* ];
    };
}

impl Key {
    /// The setting's table entry.
    pub fn setting(self) -> &'static Setting {
        &SETTINGS[self as usize]
    }

    /// The canonical spelling (`inbound__serverAuth__tlsPolicy`).
    pub fn name(self) -> &'static str {
        self.setting().key
    }
}

settings! {
    inbound__serverAuth__tlsPolicy = "strict" : "`strict` HTTPS only, `enabled` HTTP and HTTPS, `disabled` HTTP only";
    inbound__serverAuth__serverCert__source = "IoTEdge" : "server certificate from the IoT Edge workload API; self-signed (kept in the metadata directory) when not running under IoT Edge";
    inbound__clientAuth__clientCert__enabled = "true" : "accept TLS client certificates as authentication";
    inbound__clientAuth__clientCert__source = "IoTEdge" : "client certificates are validated against the IoT Edge trust bundle";
    inbound__clientAuth__clientCert__allowUnknownCA = "true" : "accept client certificates from unknown / self-signed CAs; such a certificate (one that does not chain to the IoT Edge trust bundle) may only publish: management needs a verified certificate or a SAS key (the original made it administrator)";
    inbound__clientAuth__sasKeys__enabled = "false" : "accept the `aeg-sas-key` header as authentication";
    inbound__clientAuth__sasKeys__key1 = "" : "accepted SAS key (secret, never logged)";
    inbound__clientAuth__sasKeys__key2 = "" : "second accepted SAS key, for rotation (secret, never logged)";
    inbound__clientAuth__sasKeys__publishOnlyKeys = "" : "comma-separated SAS keys that may only publish (`POST .../events`); anything else gets 403 (secret, never logged; needs `sasKeys__enabled`). Beyond the original, opt-in";
    inbound__clientAuth__sasKeys__receiveKeys = "" : "comma-separated `topic/subscription=key` entries: each key may only receive and settle that queue subscription's events (`POST .../eventsubscriptions/{sub}:receive`, `:acknowledge`, `:release`, `:reject`, `:renewLock`; docs/PULL.md); anything else gets 403 (secret, never logged; needs `sasKeys__enabled`). Beyond the original, opt-in";
    inbound__clientAuth__sasKeys__metricsKeys = "" : "comma-separated SAS keys that may only read `GET /metrics` (a Prometheus scraper's credential); anything else gets 403 (secret, never logged; needs `sasKeys__enabled`). Beyond the original, opt-in";
    inbound__clientAuth__sasKeys__maxTokenLifetimeInSeconds = "86400" : "a shared access signature (`aeg-sas-token`, `Authorization: SharedAccessSignature`) whose expiry `e` is further ahead than this is refused (401), however it is signed: a leaked token cannot stay valid for years. Beyond the original, which did not take tokens";
    inbound__clientAuth__entra__enabled = "false" : "accept Microsoft Entra ID access tokens (`Authorization: Bearer <JWT>`, what `DefaultAzureCredential` sends): RS256 only, signature checked against the tenant's signing keys (fetched from its OpenID metadata, `jwksPath`, or both), issuer, audience, `exp` and `nbf` (docs/SECURITY.md). Rights come from `senders` and `receivers`: Azure's RBAC roles never appear in the token. Beyond the original, opt-in";
    inbound__clientAuth__entra__tenantId = "" : "the Entra tenant (directory) id whose tokens are accepted; the issuer must be `https://sts.windows.net/{tenantId}/` (v1 tokens) or `{authority}/{tenantId}/v2.0` (v2; `https://sts.chinacloudapi.cn/{tenantId}/` for v1 under the China authorities)";
    inbound__clientAuth__entra__jwksPath = "" : "JSON Web Key Set file of signing keys trusted besides the fetched ones (a copy of `https://login.microsoftonline.com/{tenantId}/discovery/v2.0/keys`), read at start. Needed when `jwksRefreshIntervalInSeconds=0`; otherwise optional (a device that has never been online verifies with it)";
    inbound__clientAuth__entra__authority = "https://login.microsoftonline.com" : "the Entra authority (`https://login.microsoftonline.us`, `https://login.partner.microsoftonline.cn` for sovereign clouds). The signing keys come from `{authority}/{tenantId}/v2.0/.well-known/openid-configuration`'s `jwks_uri`, over HTTPS only, the certificate verified like Azure destinations' (`outbound__azure__trustedCertificatesFile`)";
    inbound__clientAuth__entra__jwksRefreshIntervalInSeconds = "43200" : "how often the tenant's signing keys are fetched from its OpenID metadata (also at start, and after a failure with back-off from `jwksMinRefreshIntervalInSeconds`). Each fetched set is cached in `persistence__metadataPath`, so a device that starts offline verifies with the last keys. 0 = never fetch: `jwksPath`'s keys only";
    inbound__clientAuth__entra__jwksMinRefreshIntervalInSeconds = "300" : "a token naming an unknown key id (`kid`) makes gridlet fetch the keys at once (the request waits for it), but at most once per this interval: a flood of bad tokens cannot make gridlet hammer the endpoint";
    inbound__clientAuth__entra__audience = "https://eventgrid.azure.net" : "comma-separated accepted token audiences (`aud`, compared without a trailing `/`)";
    inbound__clientAuth__entra__senders = "" : "comma-separated `tenantId/objectId` principals (the token's `tid` and `oid`) that may publish";
    inbound__clientAuth__entra__receivers = "" : "comma-separated `tenantId/objectId` principals that may receive from and settle any queue subscription";
    inbound__clientAuth__entra__clockSkewInSeconds = "300" : "allowance for the difference between the device's clock and Entra's when checking a token's `exp` and `nbf`";
    inbound__clientAuth__clientCert__adminIdentities = "" : "comma-separated client identities (the subject CN of the client certificate: the module id of an IoT Edge module identity certificate) that may manage topics and subscriptions; other accepted certificates may only publish. A CN counts only when the certificate chains to the IoT Edge trust bundle: with `allowUnknownCA=true` a self-signed certificate naming a listed identity may only publish. Empty: every verified certificate is administrator (`check-config` and start-up warn)";
    inbound__allowedHostNames = "" : "comma-separated host names gridlet is addressed by, besides IP addresses, `localhost` and the module id. With every credential off (SAS keys and client certificates disabled) a request's `Host` must be one of them (DNS-rebinding protection; requests a browser marks cross-site are refused too); a shared access signature's resource `r` must name one of them";
    inbound__httpPort = "5888" : "plain HTTP port (0 = any free port)";
    inbound__httpsPort = "4438" : "HTTPS port (0 = any free port)";
    inbound__bindAddress = "0.0.0.0" : "address both listeners bind to";
    inbound__maxConnections = "1024" : "open client connections, both listeners together; at it the least recently used connection with no request in progress is closed for a new one (only when all are busy do new connections wait in the listen backlog); past half of it new connections get a 3 s TLS handshake and at most a 5 s idle timeout";
    inbound__maxConnectionsPerPeer = "256" : "open client connections from one IP address; a peer at it gets its least recently used idle connection closed for a new one, or the new one refused when all of its connections are busy; 0 = no per-peer cap";
    inbound__maxLongPollsPerSubscription = "16" : "receives waiting for events (`:receive` with `maxWaitTime` > 0, pull delivery) on one queue subscription at once; past it a receive gets 429 + Retry-After. Waiting receives never hold the last of `inbound__maxConnections` (kept for `/healthz` and `/readyz`), and are answered early with no events (an empty `value`, as at `maxWaitTime`) when a new connection finds no idle one to close. Beyond the original, which had no pull delivery";
    inbound__maxLongPollsPerCredential = "64" : "receives waiting for events at once with one credential (a SAS key, the key that signed a SAS token, a certificate identity; all requests when every credential is off); past it a receive gets 429 + Retry-After";
    inbound__maxBodyBytesInFlight = "67108864" : "bytes of request bodies being read at once, all connections together (each request reserves its `Content-Length`, or `broker__maxRequestBodyBytes` when it has none); a request that finds the budget taken waits up to 1 s, then gets 503 + Retry-After";
    inbound__idleTimeoutInSeconds = "30" : "a connection with no request in progress (never sent one, idle between keep-alive requests, or slow to send its headers) is closed after this long";
    inbound__requestBodyTimeoutInSeconds = "60" : "a request body must arrive within this long of being read; slower gets 408 and the connection closes";
    inbound__responseWriteTimeoutInSeconds = "30" : "a connection whose client reads none of a pending response for this long is closed";
    outbound__clientAuth__clientCert__enabled = "true" : "present the module identity certificate on outgoing calls (needs IoT Edge)";
    outbound__clientAuth__clientCert__source = "IoTEdge" : "identity certificate from the workload API";
    outbound__webhook__httpsOnly = "true" : "only `https://` webhook endpoints may be subscribed";
    outbound__webhook__skipServerCertValidation = "false" : "do not validate webhook server certificates at all";
    outbound__webhook__allowUnknownCA = "true" : "accept self-signed / unknown-CA webhook server certificates";
    outbound__azure__trustedCertificatesFile = "" : "PEM file of root certificates trusted for Azure destinations (Event Hubs, Service Bus, Storage queues and blobs, cloud Event Grid) besides Mozilla's roots and the IoT Edge trust bundle (a private CA or a TLS-inspecting proxy); those destinations always verify the certificate chain and host name, whatever the `outbound__webhook__*` settings say";
    outbound__eventgrid__httpsOnly = "true" : "cloud Event Grid destinations must be `https://`";
    outbound__eventgrid__allowInvalidHostnames = "false" : "allow Event Grid destination hosts outside `eventgrid.azure.{net,us,cn}`";
    outbound__outageProbeSeconds = "30" : "while a destination cannot be reached (connection refused, DNS failure, connect timeout, 503: an uplink outage), one request per destination URL this often probes it; its events wait, attempts uncounted, within their TTL; the first success makes them all due. Outages never disable or freeze an endpoint (needs `broker__endpointHealth__enabled`)";
    outbound__resources = "" : "Azure resources that namespace subscriptions name by `resourceId` (Event Hubs push, Storage Blob dead letters): a JSON object from each resource id (ARM's, matched without regard to case) to its connection string, e.g. `{\"/subscriptions/…/eventhubs/orders\": \"Endpoint=sb://…;EntityPath=orders\"}`; subscriptions hold the resource id, never the connection string (secret, never logged)";
    outbound__deniedAddressRanges = "169.254.0.0/16,fe80::/10,168.63.129.16/32,fd00:ec2::254/128,0.0.0.0/8,::/128" : "address ranges (CIDR, comma-separated) no destination may reach: refused at subscription time for an address in the URL, and at connect time for the resolved address; the default denies link-local and the other cloud metadata addresses (Azure WireServer 168.63.129.16, AWS's IPv6 fd00:ec2::254) and 0.0.0.0 (this host); empty denies none. gridlet's own listeners are never reachable as destinations, whatever this says";
    broker__defaultMaxDeliveryAttempts = "30" : "delivery attempts per event when the subscription sets no `retryPolicy.maxDeliveryAttempts`";
    broker__defaultEventTimeToLiveInSeconds = "7200" : "event time to live when the subscription sets no `retryPolicy.eventExpiryInMinutes`";
    broker__defaultMaxBatchSizeInBytes = "1058576" : "batch byte cap when a subscription sets only `maxEventsPerBatch`";
    broker__defaultMaxEventsPerBatch = "10" : "batch event cap when a subscription sets only `preferredBatchSizeInKilobytes`";
    broker__logDeliverySuccess = "false" : "log every successful delivery (troubleshooting; off keeps the hot path quiet)";
    broker__defaultIsPersisted = "false" : "subscriptions without a `persistencePolicy` keep their events on disk";
    broker__maxRequestBodyBytes = "1058576" : "largest accepted request body; larger gets 413 before the body is read";
    broker__maxEventsPerRequest = "10000" : "most events in one publish request (400 above)";
    broker__deduplicationWindowSeconds = "0" : "a publish of an event whose identity (CloudEvents `source` + `id`; EventGridSchema topic + `id`) the topic accepted within this many seconds is answered 200 and not routed again; 0 = off (the original's behaviour); a topic's `deduplicationWindowInSeconds` overrides it. The window is in memory, rebuilt at start from the pending events of persisted subscriptions (docs/CLOUD.md)";
    broker__deduplicationMaxIdentities = "1000000" : "identities one topic remembers for deduplication at most (about 78 bytes each at a million: 78 MB); past it the oldest are forgotten before their window ends";
    broker__maxPendingEventsPerSubscription = "100000" : "pending events one in-memory subscription may hold; a publish that would exceed it gets 503 + Retry-After";
    broker__maxPendingBytes = "268435456" : "bytes of undelivered events gridlet holds in memory, all subscriptions together (each event counted once, however many subscriptions share it; persisted subscriptions count their in-memory window); a publish to an in-memory subscription that would exceed it gets 503 + Retry-After; 0 = no limit";
    broker__maxTopics = "1000" : "most topics";
    broker__maxSubscriptionsPerTopic = "100" : "most event subscriptions per topic";
    broker__maxSubscriptions = "10000" : "most event subscriptions, all topics together. Each costs about 4–5 KiB of memory idle (measured: 10,000 persisted webhook subscriptions over 100 topics added 41 MB of RSS), so the default keeps them near 50 MB on a 256 MB device; the original's caps alone (1,000 topics × 100) allowed 100,000, about 450 MB. Beyond the original, which had no such cap";
    broker__maxInFlightPerSubscription = "32" : "concurrent delivery requests per subscription (a quarter of them, at least 1, may be retries)";
    broker__maxInFlightTotal = "1024" : "concurrent delivery requests across all subscriptions (also the idle connections kept per destination host)";
    broker__deliveryTimeoutInSeconds = "60" : "how long a delivery waits for the subscriber's response";
    broker__restartClockAllowanceInSeconds = "3600" : "after a restart, the downtime counts toward event age (TTL) and retry delays for at most this long, so a clock that jumped forward (NTP after a boot without an RTC) does not expire a backlog, and one that jumped back does not stall retries; gridlet's clock resumes from the last run's heartbeat (docs/SECURITY.md, src/clock.rs)";
    broker__shutdownDrainTimeoutInSeconds = "8" : "on SIGTERM, deliveries in flight get this long to complete and be settled (nothing new is sent); keep it below the container's stop grace period (Docker's default is 10 s before SIGKILL; a longer `StopTimeout` in the module's createOptions allows a longer drain); 0 = abandon them (persisted events are redelivered after the restart)";
    broker__workerThreads = "0" : "threads of the async runtime; 0 = one per CPU core. `1` keeps gridlet on one core: on a saturated 2-core VM its p99 fell from ~10 ms to ~0.4 ms and its CPU per event at 1,000 events/s by a quarter, for 8–13 % less peak throughput (docs/BENCHMARKS.md)";
    broker__statusCodePolicy = "original" : "`original` retries every failure on the schedule; `standard` dead-letters 400/413 at once (with a dead-letter destination), honours `Retry-After` on 429/503 and jitters delays. Under both, Azure destinations' 400/403/413 are dead-lettered at once and their `Retry-After` honoured, as Event Grid does (docs/DESTINATIONS.md)";
    broker__retrySchedule = "oneThenEveryTenMinutes" : "retry schedule when a subscription sets no `retryPolicy.schedule`: `oneThenEveryTenMinutes` (1 min, then every 10 min), `tenSecondsToHourly` (10 s, 30 s, 1 m, 5 m, 10 m, 30 m, 1 h, then hourly) or `doublingForFourDays` (11 retries, the delay doubling from 1.4 min to 48.2 h, the last about four days after the first attempt; then it gives up); the old names `original`, `eventGridCloud`, `workfront` are accepted";
    broker__retryJitterPercent = "10" : "under `standard`, every retry delay is spread by up to this many percent either way (0 = exact)";
    broker__retryAfterMaxSeconds = "3600" : "longest `Retry-After` honoured; longer requests are capped";
    broker__maxLocksPerSubscription = "10000" : "events a queue subscription (`deliveryMode: Queue`, pull delivery) may hold received and unsettled at once; a receive past it answers fewer (or no) events until some are settled or their locks expire";
    broker__maxLockedBytesPerSubscription = "67108864" : "body bytes of the events a queue subscription may hold received and unsettled at once (a receive past it answers fewer, or no, events; one event always fits). An in-memory subscription's locked events stay in memory, inside `broker__maxPendingBytes` (each counted once however many subscriptions hold it); a persisted subscription's locks keep no bodies (read back from the event log when needed)";
    broker__queueFullPolicy = "reject" : "when an in-memory subscription holds `broker__maxPendingEventsPerSubscription` events: `reject` the publish with 503 (original), or `deadLetter` that subscription's copies and accept the publish for the others";
    broker__deadLetter__maxEventsPerSubscription = "10000" : "dead letters kept per subscription (oldest evicted first; on disk with the log store); 0 = none kept";
    broker__deadLetter__maxBytes = "33554432" : "bytes of dead letters kept, all subscriptions together (event + id + error + 64 each; in memory with the memory store; on disk with the log store, where they also keep within half of what the event log leaves of persistence__maxDiskBytes): past it the subscription holding the most dead-letter bytes loses its oldest letter first; a letter larger than the bound is not kept; 0 = none kept";
    broker__deadLetter__forwardBatchSeconds = "2" : "dead letters for a dead-letter destination (webhook or blob container) are held this long to go out together (Event Grid holds blob writes up to 300); the local dead-letter store has them meanwhile";
    broker__deadLetter__forwardBatchBytes = "1048576" : "... or until they reach this many bytes";
    broker__deadLetter__forwardPatienceMinutes = "240" : "how long a dead-letter destination that fails is retried (10 s, 30 s, 1 min, 5 min, then every 10 min) before its letters are kept locally only (Event Grid gives up after 4 hours)";
    broker__deadLetter__forwardMaxBytes = "16777216" : "bytes of dead letters waiting to be forwarded (batching or retrying), all destinations together; past it new letters are kept locally only";
    broker__endpointHealth__enabled = "true" : "track each destination URL's health and slow down (disabled) or stop (frozen) deliveries to failing endpoints";
    broker__endpointHealth__disableFailureRatePercent = "70" : "an endpoint is disabled when its failure rate exceeds this percentage ...";
    broker__endpointHealth__disableMinAttempts = "100" : "... over more than this many recent attempts";
    broker__endpointHealth__disableConsecutiveFailures = "2000" : "an endpoint is disabled after this many consecutive failures";
    broker__endpointHealth__probeIntervalInSeconds = "600" : "a disabled endpoint gets one probe delivery this often; a success re-enables it";
    broker__endpointHealth__freezeConsecutiveFailures = "2000" : "frozen (no attempts until re-enabled through the API) after more consecutive failures than this ...";
    broker__endpointHealth__freezeNoSuccessInHours = "72" : "... with the last success longer ago than this";
    broker__endpointHealth__freezeAnyConsecutiveFailures = "50000" : "frozen after more consecutive failures than this, whenever the last success was";
    broker__endpointHealth__windowAttempts = "1000" : "how many recent attempts the failure rate is computed over";
    api__deliveryPolicyLimits__maxEventsPerBatch = "50" : "largest `maxEventsPerBatch` a subscription may set";
    api__deliveryPolicyLimits__maxpreferredBatchSizeInKilobytes = "1033" : "largest `preferredBatchSizeInKilobytes` a subscription may set";
    api__deliveryPolicyLimits__maxBatchSizeInBytes = "1058576" : "largest `approxBatchSizeInBytes` (older twin knob) a subscription may set";
    api__filterLimits__maxIncludedEventTypes = "256" : "most entries in a subscription's `filter.includedEventTypes` (400 above); matched in constant time, this bounds the memory of one subscription's type set";
    mqtt__connections__N__url = "" : "MQTT sources (docs/MQTT.md): the broker of connection `N` (`N`: a name of letters, digits, `-` and single `_`, case-insensitive; it names the connection in the events' `source`, metrics and logs), `mqtt://host[:1883]` or `mqtts://host[:8883]`. Each `mqtt__connections__N__*` setting belongs to connection `N`";
    mqtt__connections__N__clientId = "" : "MQTT client id of connection `N` (default `gridlet-N`); keep it stable: the broker keeps the session under it";
    mqtt__connections__N__protocolVersion = "5" : "`5` or `3.1.1` for a broker without 5 (no properties: payloads arrive as `data_base64`; no enhanced authentication, session expiry or receive maximum)";
    mqtt__connections__N__username = "" : "MQTT user name";
    mqtt__connections__N__password = "" : "MQTT password (secret, never logged)";
    mqtt__connections__N__authentication__method = "" : "MQTT 5 enhanced authentication: `K8S-SAT` (Azure IoT Operations' broker) sends the token of `authentication__tokenFile` as the authentication data";
    mqtt__connections__N__authentication__tokenFile = "" : "Kubernetes service-account token file, read at every connect (the kubelet rotates it)";
    mqtt__connections__N__tls__caFile = "" : "PEM file of the roots the broker's certificate must chain to (default: Mozilla's roots and, under IoT Edge, the trust bundle); the host name is always checked";
    mqtt__connections__N__tls__certFile = "" : "PEM client certificate chain presented to the broker (with `tls__keyFile`)";
    mqtt__connections__N__tls__keyFile = "" : "PEM private key of `tls__certFile`";
    mqtt__connections__N__tls__clientIdentity = "" : "`IoTEdge`: present the module identity certificate from the IoT Edge workload API (instead of `tls__certFile`)";
    mqtt__connections__N__keepAliveSeconds = "60" : "MQTT keep-alive, 5 to 65535";
    mqtt__connections__N__cleanStart = "false" : "`false`: the broker keeps the session (subscriptions and unacknowledged QoS 1 messages) while gridlet is away, so nothing published meanwhile is lost; `true` starts afresh at each connect";
    mqtt__connections__N__sessionExpirySeconds = "86400" : "how long the broker keeps the session after gridlet disconnects (MQTT 5)";
    mqtt__connections__N__receiveMaximum = "100" : "QoS 1 messages the broker may send gridlet before it acknowledges any (MQTT 5): the bound on messages in flight on the connection";
    mqtt__connections__N__maxPacketBytes = "1048576" : "largest MQTT packet accepted (1024 to 268435455)";
    mqtt__routes__N__connection = "" : "MQTT route `N` (each `mqtt__routes__N__*` setting belongs to route `N`): the connection it subscribes on";
    mqtt__routes__N__topicFilter = "" : "MQTT topic filter the route subscribes to (`+` and `#` wildcards; `$share/group/filter` for shared subscriptions)";
    mqtt__routes__N__topic = "" : "the gridlet topic its messages are published to (must exist; its input schema decides the event shape, docs/MQTT.md)";
    mqtt__routes__N__qos = "1" : "subscription QoS: `1` (at least once: acknowledged only once gridlet accepted the event) or `0` (at most once: messages gridlet cannot accept are dropped and counted)";
    mqtt__routes__N__enrichments = "" : "comma-separated `key=value` attributes added to each event: a static value, or `${mqtt.message.userProperties.x}`, `${mqtt.message.topicName}`, `${mqtt.message.contentType}`, `${mqtt.message.pfi}`, `${mqtt.message.responseTopic}`; keys lower-case letters and digits, at most 20 of them, values at most 128 characters (Event Grid namespaces' rules)";
    mqtt__maxConnections = "32" : "most MQTT source connections, of the settings and the management API together: a `PUT /mqtt/connections/{name}` of a new one past it is a 400 (each is a socket, two tasks and up to `receiveMaximum` messages held)";
    mqtt__maxRoutes = "256" : "most MQTT routes, of the settings and the management API together: a `PUT /mqtt/routes/{name}` of a new one past it is a 400";
    console__enabled = "true" : "serve the operator console at `/console` on gridlet's own listeners; its data comes from the management API with the API's authentication (an administrator's SAS key, kept in the browser tab, or client certificate); docs/CONSOLE.md";
    console__traceUrlTemplate = "" : "link from an event's or dead letter's trace id in the console to a trace viewer: a URL in which `{traceId}` is replaced (`http://jaeger:16686/trace/{traceId}`); empty = no links";
    metrics__reporterType = "none" : "`none`, `prometheus` (serve `/metrics`), `console` (log metrics every 60 s)";
    log__format = "text" : "`text`: one line per record with the syslog severity prefix IoT Edge filters on (`<6>` info, `<4>` warn, `<3>` error), colours only on a terminal and never with `NO_COLOR`; `json`: one JSON object per line, for log shippers. Level: `RUST_LOG` (default `info`)";
    OTEL_EXPORTER_OTLP_ENDPOINT = "" : "OpenTelemetry: base URL of an OTLP/HTTP collector (`http://host:4318`); traces go to `<base>/v1/traces`. Both this and `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` unset: no spans are recorded or exported (trace context is still carried to subscribers). docs/OBSERVABILITY.md";
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "" : "OpenTelemetry: full URL for traces (wins over `OTEL_EXPORTER_OTLP_ENDPOINT`)";
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "" : "OpenTelemetry: full URL for metrics (default `<OTEL_EXPORTER_OTLP_ENDPOINT>/v1/metrics`); the families of `/metrics`, every `OTEL_METRIC_EXPORT_INTERVAL`";
    OTEL_METRIC_EXPORT_INTERVAL = "60000" : "OpenTelemetry: milliseconds between metrics exports";
    OTEL_EXPORTER_OTLP_PROTOCOL = "http/protobuf" : "OpenTelemetry: only `http/protobuf` is supported";
    OTEL_EXPORTER_OTLP_HEADERS = "" : "OpenTelemetry: `key=value,…` headers on export requests, values percent-decoded (secret, never logged)";
    OTEL_EXPORTER_OTLP_TIMEOUT = "10000" : "OpenTelemetry: milliseconds one export request may take; its spans are dropped (and counted) after";
    OTEL_SERVICE_NAME = "" : "OpenTelemetry: `service.name` of gridlet's spans (default `gridlet`)";
    OTEL_RESOURCE_ATTRIBUTES = "" : "OpenTelemetry: `key=value,…` resource attributes, values percent-decoded; under IoT Edge the device and module ids are added";
    OTEL_TRACES_SAMPLER = "parentbased_always_on" : "OpenTelemetry: `always_on`, `always_off`, `traceidratio`, `parentbased_always_on`, `parentbased_always_off`, `parentbased_traceidratio`";
    OTEL_TRACES_SAMPLER_ARG = "1.0" : "OpenTelemetry: the ratio (0 to 1) of the `traceidratio` samplers";
    OTEL_BSP_MAX_QUEUE_SIZE = "2048" : "OpenTelemetry: finished spans queued for export; past it new spans are dropped and counted (`gridlet_telemetry_spans_total`, result `dropped`), never waited for";
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE = "512" : "OpenTelemetry: most spans in one export request";
    OTEL_BSP_SCHEDULE_DELAY = "5000" : "OpenTelemetry: milliseconds between exports (sooner when a batch is full)";
    telemetry__eventIdsOnSpans = "false" : "put event ids on spans (`messaging.message.id`, `gridlet.event_ids`); off because ids may be sensitive";
    persistence__metadataPath = "metadataDb" : "directory holding topics, subscriptions (`gridlet-v2/meta.json`, in a directory only gridlet's user can open) and the self-signed certificate; a sled database of an earlier release found here (`gridlet-v1/meta`) is moved to the file at the first start and kept as `gridlet-v1.migrated`";
    persistence__eventsPath = "eventsDb" : "directory holding persisted events";
    persistence__store = "log" : "`log` (also accepted by its earlier name, `sled`): the events of persisted subscriptions in gridlet's append-only event log (`eventsPath/gridlet-v2/log/`), dead letters in a log of their own (`eventsPath/gridlet-v2/dead-letters/`), metadata and endpoint health in one file (`metadataPath/gridlet-v2/meta.json`); `memory`: everything in memory, lost on restart";
    persistence__maxDiskBytes = "268435456" : "bound on the event store: persisted publishes get 507 + Retry-After when the event log's segments plus the dead-letter files plus the new events would exceed it (each event body counts once, however many subscriptions it goes to); bounds disk only: a persisted backlog stays on disk, memory holds a window of 2048 events per subscription";
    persistence__cacheBytes = "8388608" : "accepted and ignored: it sized sled's cache of the dead-letter database; dead letters now live in their own log, and metadata in one file";
    persistence__flushEveryMs = "1000" : "period of the sync of dead letters of non-persisted subscriptions; acknowledged events are already fsynced by the event log's group commit, and every metadata change before it is answered; 0 = off";
    persistence__onDamage = "serve" : "what a start does when the event log or the dead-letter log holds damaged data (a frame failing its checksum that is not a torn tail, an unreadable segment header, a file cut short or missing: docs/DURABILITY.md): `serve` recovers every intact frame, copies the damaged file to `eventsPath/gridlet-v2/quarantine/` (counted in persistence__maxDiskBytes), reports the loss (an error log line, `gridlet_store_damaged_events_total`, the /readyz body) and serves; `refuse` checks every frame at start (the whole log is read, not left to the background scrub) and stops the start with an error naming the file, changing nothing; damage found while running then makes the log refuse writes";
    persistence__compactAfterIdleSeconds = "10" : "a segment of the event log in which at most a quarter of the events are still pending (a few slow or failing events pin it) is rewritten as a copy of those events once none of its events was settled for this long; a copy writes at most the bytes it frees (docs/DURABILITY.md); 0 = as soon as a segment qualifies";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_names_its_own_table_entry() {
        assert_eq!(Key::ALL.len(), SETTINGS.len());
        for (i, k) in Key::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(format!("{k:?}"), k.name());
        }
        let mut keys: Vec<String> = SETTINGS
            .iter()
            .map(|s| s.key.to_ascii_lowercase())
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), SETTINGS.len(), "no key twice, in any case");
    }
}
