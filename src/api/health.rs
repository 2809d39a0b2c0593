//! Health and metrics routes.

use super::AppState;
use crate::config::Key;
use crate::error::ApiError;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;

/// Liveness: the process serves HTTP.
pub(super) async fn live() -> &'static str {
    "ok"
}

/// Readiness: the broker accepts work (503 while shutting down). The body says so, names any
/// data the store found damaged at start (`persistence__onDamage=serve`), and adds one line per
/// MQTT source connection and per MQTT destination connection (their state does not change
/// readiness: publishing over HTTP works whatever the brokers do) and one for the Entra signing
/// keys (stale keys do not either: tokens signed with the keys known still verify).
pub(super) async fn ready(State(s): State<AppState>) -> Response {
    if s.ready.load(Ordering::Relaxed) {
        let mut body = String::from("ready");
        if let Some(damage) = s.broker.store_damage() {
            body.push('\n');
            body.push_str(&damage.to_string());
            body.push('\n');
        }
        for (name, m) in s.broker.mqtt_connections() {
            body.push_str(&mqtt_line(&name, &m));
        }
        for (broker, client_id, m) in s.broker.mqtt_destinations() {
            body.push_str(&destination_line(&broker, &client_id, &m));
        }
        if let Some(keys) = &s.entra {
            body.push('\n');
            body.push_str(&keys.line(s.broker.now_ms()));
        }
        (StatusCode::OK, body).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    }
}

/// Prometheus exposition, when `metrics__reporterType=prometheus`.
pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    if !s.metrics_enabled {
        return ApiError::not_found(
            "NotFound",
            format!(
                "metrics are off ({}=prometheus enables them)",
                Key::metrics__reporterType.name()
            ),
        )
        .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.broker.render_metrics(),
    )
        .into_response()
}

/// `\nmqtt plant: connected, received 10, acknowledged 9, refused 1, dropped 0[, paused][; last
/// error: ...]`.
fn mqtt_line(name: &str, m: &crate::metrics::MqttConnectionMetrics) -> String {
    let state = if m.is_connected() {
        "connected"
    } else {
        "disconnected"
    };
    let mut line = format!(
        "\nmqtt {name}: {state}, received {}, acknowledged {}, refused {}, dropped {}",
        m.received.get(),
        m.acknowledged.get(),
        m.refused.get(),
        m.dropped.get()
    );
    if m.paused.load(Ordering::Relaxed) == 1 {
        line.push_str(", paused (gridlet cannot accept its messages now)");
    }
    if let Some(e) = m.last_error() {
        line.push_str("; last error: ");
        line.push_str(&e.replace('\n', " "));
    }
    line
}

/// `\nmqtt destination mqtt://b:1883 (gridlet-x-0): connected, published 2, acknowledged 2,
/// refused 0[; last error: ...]`.
fn destination_line(
    broker: &str,
    client_id: &str,
    m: &crate::metrics::MqttDestinationMetrics,
) -> String {
    let state = if m.is_connected() {
        "connected"
    } else {
        "disconnected"
    };
    let mut line = format!(
        "\nmqtt destination {broker} ({client_id}): {state}, published {}, acknowledged {}, refused {}",
        m.published.get(),
        m.acknowledged.get(),
        m.refused.get()
    );
    if let Some(e) = m.last_error() {
        line.push_str("; last error: ");
        line.push_str(&e.replace('\n', " "));
    }
    line
}
