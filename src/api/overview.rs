//! `GET /broker/overview`: what the console's overview page shows (docs/CONSOLE.md). An
//! administrator's read, like every management route: version, uptime, the settings given a
//! value other than their default (secrets masked), the bounds the charts are drawn against,
//! the ring of samples of the last 15 minutes ([`crate::metrics::ring`]), and the broker's
//! connections: its MQTT sources' sessions, and the subscriptions whose endpoint is in an
//! outage (an uplink down: their events wait, RESILIENCE.md).

use super::AppState;
use crate::delivery::deadletter::rfc3339;
use crate::metrics::ring::SAMPLE_EVERY_SECS;
use crate::model::reason::DropReason;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

pub(super) async fn get(State(s): State<AppState>) -> Json<Value> {
    let cfg = s.broker.config();
    let now = s.broker.now_ms();
    let started = s.broker.started_ms();
    let reasons: Vec<&str> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
    let samples: Vec<Value> = s
        .broker
        .samples()
        .iter()
        .map(|x| {
            json!([
                x.at_ms,
                x.events_in,
                x.events_out,
                x.failed_attempts,
                x.dropped,
                x.pending_bytes,
                x.disk_bytes
            ])
        })
        .collect();
    let settings: Vec<Value> = cfg
        .changed
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mqtt: Vec<Value> = s
        .broker
        .mqtt_connections()
        .iter()
        .map(|(name, m)| {
            json!({
                "name": name,
                "connected": m.is_connected(),
                "paused": m.paused.load(std::sync::atomic::Ordering::Relaxed) == 1,
                "received": m.received.get(),
                "acknowledged": m.acknowledged.get(),
                "refused": m.refused.get(),
                "dropped": m.dropped.get(),
                "lastError": m.last_error(),
            })
        })
        .collect();
    let destinations: Vec<Value> = s
        .broker
        .mqtt_destinations()
        .iter()
        .map(|(broker, client_id, m)| {
            json!({
                "broker": broker,
                "clientId": client_id,
                "connected": m.is_connected(),
                "published": m.published.get(),
                "acknowledged": m.acknowledged.get(),
                "refused": m.refused.get(),
                "connectionErrors": m.connection_errors.get(),
                "lastError": m.last_error(),
            })
        })
        .collect();
    let mut outages: Vec<Value> = Vec::new();
    for topic in s.broker.topics() {
        let name = topic.topic().name;
        for sub in topic.subscriptions().iter() {
            let Some(h) = sub.endpoint_health() else {
                continue;
            };
            if let Some(since) = h.outage_since_ms {
                outages.push(json!({
                    "topic": name,
                    "subscription": sub.name(),
                    "since": rfc3339(since),
                    "lastSuccessTime": rfc3339(h.last_success_ms),
                }));
            }
        }
    }
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "startedTime": rfc3339(started),
        "uptimeSeconds": now.saturating_sub(started) / 1000,
        "settings": settings,
        "bounds": {
            "maxPendingBytes": cfg.broker.max_pending_bytes,
            "maxDiskBytes": cfg.persistence.max_disk_bytes,
        },
        "traceUrlTemplate": cfg.console.trace_url_template,
        "sampleEverySeconds": SAMPLE_EVERY_SECS,
        "dropReasons": reasons,
        "sampleFields": ["time", "eventsIn", "eventsOut", "failedAttempts", "deadLettered", "pendingBytes", "diskBytes"],
        "samples": samples,
        "mqttConnections": mqtt,
        "mqttDestinations": destinations,
        "outages": outages,
    }))
}
