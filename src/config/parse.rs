//! From `KEY=value` pairs to the typed sections: [`Raw`] normalises keys against the settings
//! table and parses one value at a time (errors name the key and the accepted values); one
//! function per section reads its settings through [`Key`], in the order start-up reports the
//! first invalid one.

use super::settings::Key as K;
use super::types::{
    ApiLimits, Broker, Console, EdgeEnv, Inbound, IpRange, LogFormat, MetricsReporter, OnDamage,
    Outbound, Persistence, ReceiveKey, Resilience, Resources, StoreKind, TlsPolicy,
};
use super::ConfigError;

mod entra;
pub(crate) use entra::jwks;
mod raw;
mod telemetry;
pub(in crate::config) use raw::{template, Raw};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;
pub(super) use telemetry::telemetry;

const U32_MAX: u64 = u32::MAX as u64;

/// The non-empty, trimmed items of a comma-separated setting.
fn comma_list(v: Option<&str>) -> Vec<String> {
    v.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The certificate sources, which only name IoT Edge (checked, nothing to keep).
fn sources(raw: &Raw) -> Result<(), ConfigError> {
    for key in [
        K::inbound__serverAuth__serverCert__source,
        K::inbound__clientAuth__clientCert__source,
        K::outbound__clientAuth__clientCert__source,
    ] {
        raw.choice(key, &[("IoTEdge", ())])?;
    }
    Ok(())
}

/// SAS authentication: whether it is on, the accepted keys, the publish-only keys.
/// `(enabled, admin keys, publish-only keys, metrics keys, receive keys)`.
type SasKeys = (bool, Vec<String>, Vec<String>, Vec<String>, Vec<ReceiveKey>);

/// `topic/subscription=key, ...`.
fn receive_keys(raw: &Raw) -> Result<Vec<ReceiveKey>, ConfigError> {
    let key = K::inbound__clientAuth__sasKeys__receiveKeys;
    let text = raw.secret(key);
    comma_list(text.as_deref())
        .into_iter()
        .map(|entry| {
            let parsed = entry.split_once('=').and_then(|(names, k)| {
                let (topic, sub) = names.trim().split_once('/')?;
                (!topic.is_empty() && !sub.is_empty() && !k.is_empty()).then(|| ReceiveKey {
                    topic: topic.trim().to_string(),
                    subscription: sub.trim().to_string(),
                    key: k.to_string(),
                })
            });
            parsed.ok_or_else(|| ConfigError {
                key: key.name().into(),
                // A secret: never echoed.
                value: "***".into(),
                expected: "comma-separated topic/subscription=key entries".into(),
            })
        })
        .collect()
}

fn sas(raw: &Raw) -> Result<SasKeys, ConfigError> {
    let enabled = raw.bool(K::inbound__clientAuth__sasKeys__enabled)?;
    let keys: Vec<String> = [
        raw.secret(K::inbound__clientAuth__sasKeys__key1),
        raw.secret(K::inbound__clientAuth__sasKeys__key2),
    ]
    .into_iter()
    .flatten()
    .collect();
    let publish_only = comma_list(
        raw.secret(K::inbound__clientAuth__sasKeys__publishOnlyKeys)
            .as_deref(),
    );
    let metrics = comma_list(
        raw.secret(K::inbound__clientAuth__sasKeys__metricsKeys)
            .as_deref(),
    );
    let receive = receive_keys(raw)?;
    if enabled
        && keys.is_empty()
        && publish_only.is_empty()
        && metrics.is_empty()
        && receive.is_empty()
    {
        return Err(ConfigError {
            key: K::inbound__clientAuth__sasKeys__key1.name().into(),
            value: String::new(),
            expected: format!(
                "a key (key1 and/or key2) when {}=true",
                K::inbound__clientAuth__sasKeys__enabled.name()
            ),
        });
    }
    Ok((enabled, keys, publish_only, metrics, receive))
}

/// `inbound__*` (and the outbound certificate source, checked with the inbound ones).
pub(super) fn inbound(raw: &Raw) -> Result<Inbound, ConfigError> {
    let tls_policy = raw.choice(
        K::inbound__serverAuth__tlsPolicy,
        &[
            ("strict", TlsPolicy::Strict),
            ("enabled", TlsPolicy::Enabled),
            ("disabled", TlsPolicy::Disabled),
        ],
    )?;
    sources(raw)?;
    let bind_address = raw
        .text(K::inbound__bindAddress)
        .parse::<IpAddr>()
        .map_err(|_| raw.err(K::inbound__bindAddress, "an IPv4 or IPv6 address"))?;
    let (sas_enabled, sas_keys, publish_only_sas_keys, metrics_sas_keys, receive_sas_keys) =
        sas(raw)?;
    Ok(Inbound {
        tls_policy,
        http_port: raw.int(K::inbound__httpPort, 0, 65535)? as u16,
        https_port: raw.int(K::inbound__httpsPort, 0, 65535)? as u16,
        bind_address,
        max_connections: raw.int(K::inbound__maxConnections, 1, 1_000_000)? as usize,
        allowed_host_names: comma_list(Some(raw.text(K::inbound__allowedHostNames))),
        max_body_bytes_in_flight: raw.int(K::inbound__maxBodyBytesInFlight, 1024, 1 << 40)?
            as usize,
        max_connections_per_peer: raw.int(K::inbound__maxConnectionsPerPeer, 0, 1_000_000)?
            as usize,
        max_long_polls_per_subscription: raw.int(
            K::inbound__maxLongPollsPerSubscription,
            1,
            1_000_000,
        )? as usize,
        max_long_polls_per_credential: raw.int(
            K::inbound__maxLongPollsPerCredential,
            1,
            1_000_000,
        )? as usize,
        idle_timeout: raw.secs(K::inbound__idleTimeoutInSeconds, 1, 86_400)?,
        body_timeout: raw.secs(K::inbound__requestBodyTimeoutInSeconds, 1, 86_400)?,
        write_timeout: raw.secs(K::inbound__responseWriteTimeoutInSeconds, 1, 86_400)?,
        client_cert_enabled: raw.bool(K::inbound__clientAuth__clientCert__enabled)?,
        client_cert_allow_unknown_ca: raw
            .bool(K::inbound__clientAuth__clientCert__allowUnknownCA)?,
        sas_enabled,
        sas_keys,
        publish_only_sas_keys,
        metrics_sas_keys,
        receive_sas_keys,
        admin_identities: comma_list(Some(
            raw.text(K::inbound__clientAuth__clientCert__adminIdentities),
        )),
        max_token_lifetime: raw.secs(
            K::inbound__clientAuth__sasKeys__maxTokenLifetimeInSeconds,
            60,
            31_536_000,
        )?,
        entra: entra::entra(raw)?,
    })
}

/// `outbound__*`.
pub(super) fn outbound(raw: &Raw) -> Result<Outbound, ConfigError> {
    Ok(Outbound {
        client_cert_enabled: raw.bool(K::outbound__clientAuth__clientCert__enabled)?,
        webhook_https_only: raw.bool(K::outbound__webhook__httpsOnly)?,
        webhook_skip_server_cert_validation: raw
            .bool(K::outbound__webhook__skipServerCertValidation)?,
        webhook_allow_unknown_ca: raw.bool(K::outbound__webhook__allowUnknownCA)?,
        azure_trusted_certs_file: Some(raw.text(K::outbound__azure__trustedCertificatesFile))
            .filter(|p| !p.trim().is_empty())
            .map(|p| std::path::PathBuf::from(p.trim())),
        eventgrid_https_only: raw.bool(K::outbound__eventgrid__httpsOnly)?,
        eventgrid_allow_invalid_hostnames: raw
            .bool(K::outbound__eventgrid__allowInvalidHostnames)?,
        denied_ranges: comma_list(Some(raw.text(K::outbound__deniedAddressRanges)))
            .iter()
            .map(|r| {
                IpRange::parse(r).ok_or_else(|| {
                    raw.err(
                        K::outbound__deniedAddressRanges,
                        "comma-separated CIDR ranges, e.g. 169.254.0.0/16,fe80::/10",
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        resources: resources(raw)?,
    })
}

/// `outbound__resources`: a JSON object of resource id to connection string (the error never
/// quotes the value: it holds secrets).
fn resources(raw: &Raw) -> Result<Resources, ConfigError> {
    let text = raw.text(K::outbound__resources).trim();
    if text.is_empty() {
        return Ok(Resources::default());
    }
    let expected = "a JSON object from resource id to connection string, e.g. {\"/subscriptions/…/eventhubs/orders\": \"Endpoint=sb://…\"}";
    let err = || ConfigError {
        key: K::outbound__resources.name().to_string(),
        value: "(secret, not shown)".into(),
        expected: expected.to_string(),
    };
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|_| err())?;
    let mut pairs = Vec::with_capacity(map.len());
    for (id, cs) in map {
        match cs {
            serde_json::Value::String(cs) if !id.trim().is_empty() && !cs.trim().is_empty() => {
                pairs.push((id, cs));
            }
            _ => return Err(err()),
        }
    }
    Ok(Resources::new(pairs))
}

/// `broker__*` delivery defaults and limits (the resilience ones are [`resilience`]'s).
pub(super) fn broker(raw: &Raw) -> Result<Broker, ConfigError> {
    Ok(Broker {
        default_max_delivery_attempts: raw.int(K::broker__defaultMaxDeliveryAttempts, 1, U32_MAX)?
            as u32,
        default_event_ttl: raw.secs(K::broker__defaultEventTimeToLiveInSeconds, 1, U32_MAX)?,
        default_max_batch_size_bytes: raw.int(K::broker__defaultMaxBatchSizeInBytes, 1, U32_MAX)?
            as usize,
        default_max_events_per_batch: raw.int(K::broker__defaultMaxEventsPerBatch, 1, 100_000)?
            as usize,
        log_delivery_success: raw.bool(K::broker__logDeliverySuccess)?,
        default_is_persisted: raw.bool(K::broker__defaultIsPersisted)?,
        max_request_body_bytes: raw.int(K::broker__maxRequestBodyBytes, 1024, 256 << 20)? as usize,
        max_events_per_request: raw.int(K::broker__maxEventsPerRequest, 1, 10_000_000)? as usize,
        max_pending_events_per_subscription: raw.int(
            K::broker__maxPendingEventsPerSubscription,
            1,
            U32_MAX,
        )? as usize,
        max_locks_per_subscription: raw.int(K::broker__maxLocksPerSubscription, 1, 10_000_000)?
            as usize,
        deduplication_window: raw.secs(K::broker__deduplicationWindowSeconds, 0, 604_800)?,
        deduplication_max_identities: raw.int(
            K::broker__deduplicationMaxIdentities,
            1,
            100_000_000,
        )? as usize,
        max_locked_bytes_per_subscription: raw.int(
            K::broker__maxLockedBytesPerSubscription,
            1024,
            1 << 40,
        )?,
        max_pending_bytes: raw.int(K::broker__maxPendingBytes, 0, u64::MAX)?,
        max_topics: raw.int(K::broker__maxTopics, 1, 1_000_000)? as usize,
        max_subscriptions_per_topic: raw.int(K::broker__maxSubscriptionsPerTopic, 1, 100_000)?
            as usize,
        max_subscriptions: raw.int(K::broker__maxSubscriptions, 1, 10_000_000)? as usize,
        max_in_flight_per_subscription: raw.int(K::broker__maxInFlightPerSubscription, 1, 10_000)?
            as usize,
        max_in_flight_total: raw.int(K::broker__maxInFlightTotal, 1, 1_000_000)? as usize,
        delivery_timeout: raw.secs(K::broker__deliveryTimeoutInSeconds, 1, 3600)?,
        shutdown_drain: raw.secs(K::broker__shutdownDrainTimeoutInSeconds, 0, 3600)?,
        restart_clock_allowance: raw.secs(
            K::broker__restartClockAllowanceInSeconds,
            0,
            100 * 365 * 86_400,
        )?,
        worker_threads: raw.int(K::broker__workerThreads, 0, 1024)? as usize,
    })
}

/// `api__*`: creation-time limits on subscriptions.
pub(super) fn api_limits(raw: &Raw) -> Result<ApiLimits, ConfigError> {
    Ok(ApiLimits {
        max_events_per_batch: raw.int(
            K::api__deliveryPolicyLimits__maxEventsPerBatch,
            1,
            100_000,
        )? as u32,
        max_preferred_batch_size_kb: raw.int(
            K::api__deliveryPolicyLimits__maxpreferredBatchSizeInKilobytes,
            1,
            1 << 20,
        )? as u32,
        max_batch_size_bytes: raw.int(
            K::api__deliveryPolicyLimits__maxBatchSizeInBytes,
            1,
            1 << 30,
        )?,
        max_included_event_types: raw.int(
            K::api__filterLimits__maxIncludedEventTypes,
            1,
            100_000,
        )? as usize,
    })
}

/// The resilience `broker__*` settings: status codes, schedule, dead letters, queue-full policy,
/// endpoint health.
pub(super) fn resilience(raw: &Raw) -> Result<Resilience, ConfigError> {
    use crate::policy::{QueueFullPolicy, ScheduleName, StatusCodePolicy};
    Ok(Resilience {
        status_code_policy: raw.choice(K::broker__statusCodePolicy, &StatusCodePolicy::ALL)?,
        retry_schedule: raw.choice(K::broker__retrySchedule, &ScheduleName::ACCEPTED)?,
        jitter_percent: raw.int(K::broker__retryJitterPercent, 0, 50)? as u8,
        retry_after_cap: raw.secs(K::broker__retryAfterMaxSeconds, 0, U32_MAX)?,
        dead_letter_capacity: raw.int(
            K::broker__deadLetter__maxEventsPerSubscription,
            0,
            10_000_000,
        )? as usize,
        dead_letter_max_bytes: raw.int(K::broker__deadLetter__maxBytes, 0, u64::MAX)?,
        dead_letter_forward: crate::policy::ForwardPolicy {
            batch_window: raw.secs(K::broker__deadLetter__forwardBatchSeconds, 0, 3600)?,
            batch_max_bytes: raw.int(K::broker__deadLetter__forwardBatchBytes, 1024, 1 << 30)?
                as usize,
            patience: raw.secs(K::broker__deadLetter__forwardPatienceMinutes, 0, 10_080)? * 60,
            max_pending_bytes: raw.int(K::broker__deadLetter__forwardMaxBytes, 1024, 1 << 40)?
                as usize,
        },
        queue_full_policy: raw.choice(K::broker__queueFullPolicy, &QueueFullPolicy::ALL)?,
        health: health(raw)?,
    })
}

/// `broker__endpointHealth__*`.
fn health(raw: &Raw) -> Result<crate::policy::HealthConfig, ConfigError> {
    Ok(crate::policy::HealthConfig {
        enabled: raw.bool(K::broker__endpointHealth__enabled)?,
        disable_failure_rate_percent: raw.int(
            K::broker__endpointHealth__disableFailureRatePercent,
            1,
            100,
        )? as u32,
        disable_min_attempts: raw.int(K::broker__endpointHealth__disableMinAttempts, 1, U32_MAX)?
            as u32,
        disable_consecutive_failures: raw.int(
            K::broker__endpointHealth__disableConsecutiveFailures,
            1,
            U32_MAX,
        )?,
        probe_interval: raw.secs(
            K::broker__endpointHealth__probeIntervalInSeconds,
            1,
            U32_MAX,
        )?,
        freeze_consecutive_failures: raw.int(
            K::broker__endpointHealth__freezeConsecutiveFailures,
            1,
            u64::MAX,
        )?,
        freeze_no_success_for: Duration::from_secs(
            raw.int(
                K::broker__endpointHealth__freezeNoSuccessInHours,
                1,
                1_000_000,
            )? * 3600,
        ),
        freeze_any_consecutive_failures: raw.int(
            K::broker__endpointHealth__freezeAnyConsecutiveFailures,
            1,
            u64::MAX,
        )?,
        window_attempts: raw.int(K::broker__endpointHealth__windowAttempts, 1, 1_000_000)? as usize,
        outage_probe_interval: raw.secs(K::outbound__outageProbeSeconds, 1, 86_400)?,
    })
}

/// `metrics__reporterType`.
pub(super) fn metrics(raw: &Raw) -> Result<MetricsReporter, ConfigError> {
    raw.choice(
        K::metrics__reporterType,
        &[
            ("none", MetricsReporter::None),
            ("prometheus", MetricsReporter::Prometheus),
            ("console", MetricsReporter::Console),
        ],
    )
}

/// `console__*`.
pub(super) fn console(raw: &Raw) -> Result<Console, ConfigError> {
    let template = raw.text(K::console__traceUrlTemplate).to_string();
    let ok = template.is_empty()
        || ((template.starts_with("http://") || template.starts_with("https://"))
            && template.contains("{traceId}"));
    if !ok {
        return Err(raw.err(
            K::console__traceUrlTemplate,
            "an http:// or https:// URL containing {traceId}, or nothing",
        ));
    }
    Ok(Console {
        enabled: raw.bool(K::console__enabled)?,
        trace_url_template: template,
    })
}

/// `log__format`.
pub(super) fn log_format(raw: &Raw) -> Result<LogFormat, ConfigError> {
    raw.choice(
        K::log__format,
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
    )
}

/// `persistence__*`.
pub(super) fn persistence(raw: &Raw) -> Result<Persistence, ConfigError> {
    Ok(Persistence {
        metadata_path: PathBuf::from(raw.text(K::persistence__metadataPath)),
        events_path: PathBuf::from(raw.text(K::persistence__eventsPath)),
        store: raw.choice(
            K::persistence__store,
            &[
                ("log", StoreKind::Log),
                ("sled", StoreKind::Log),
                ("memory", StoreKind::Memory),
            ],
        )?,
        max_disk_bytes: raw.int(K::persistence__maxDiskBytes, 1 << 16, u64::MAX)?,
        cache_bytes: raw.int(K::persistence__cacheBytes, 1 << 16, 1 << 40)?,
        flush_every_ms: raw.int(K::persistence__flushEveryMs, 0, 3_600_000)?,
        compact_after_idle_ms: raw.int(K::persistence__compactAfterIdleSeconds, 0, 86_400)? * 1000,
        on_damage: raw.choice(
            K::persistence__onDamage,
            &[("serve", OnDamage::Serve), ("refuse", OnDamage::Refuse)],
        )?,
    })
}

/// The `IOTEDGE_*` identity (defaults outside IoT Edge); nothing here can be invalid.
pub(super) fn edge(raw: &Raw) -> EdgeEnv {
    let edge_var = |name: &str| {
        raw.edge
            .get(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let iothub_hostname = edge_var("iotedge_iothubhostname");
    EdgeEnv {
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
    }
}
