//! `/mqtt/connections` and `/mqtt/routes`: the MQTT sources' broker connections and routes at
//! runtime ([`crate::ingress::manage`]; docs/MQTT.md). Administrators only, like every route
//! that is not publishing, receiving or `/metrics` (`auth::require`).

use super::{read_json, AppState, Conn};
use crate::error::ApiError;
use crate::ingress::manage::View;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;

/// `connections` or `routes`: the collection in the path and the resource type.
#[derive(Clone, Copy)]
enum Collection {
    Connections,
    Routes,
}

impl Collection {
    fn segment(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Routes => "routes",
        }
    }
}

/// The resource as the API returns it: `id`, `name`, `type`, and `properties` with who manages
/// it and, for a connection, its live status.
fn resource(s: &AppState, headers: &HeaderMap, conn: &Conn, c: Collection, v: View) -> Value {
    let ctx = s.resource_context(headers, conn);
    let mut props = v.properties;
    props.insert("managedBy".into(), json!(v.origin.as_str()));
    if let Some(m) = &v.status {
        props.insert(
            "status".into(),
            json!({
                "connected": m.is_connected(),
                "paused": m.paused.load(Relaxed) == 1,
                "received": m.received.get(),
                "acknowledged": m.acknowledged.get(),
                "refused": m.refused.get(),
                "dropped": m.dropped.get(),
                "connectionErrors": m.connection_errors.get(),
                "lastError": m.last_error(),
            }),
        );
    }
    json!({
        "id": format!("{}/mqtt/{}/{}", ctx.id_prefix, c.segment(), v.name),
        "name": v.name,
        "type": format!("gridlet.mqtt/{}", c.segment()),
        "properties": props,
    })
}

pub(super) async fn put_connection(
    State(s): State<AppState>,
    Path(name): Path<String>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = read_json(&s, &headers, body).await?;
    let v = s.mqtt.put_connection(&name, &body).await?;
    Ok(Json(resource(
        &s,
        &headers,
        &conn,
        Collection::Connections,
        v,
    )))
}

pub(super) async fn get_connection(
    State(s): State<AppState>,
    Path(name): Path<String>,
    conn: Conn,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let v = s.mqtt.connection(&name)?;
    Ok(Json(resource(
        &s,
        &headers,
        &conn,
        Collection::Connections,
        v,
    )))
}

pub(super) async fn list_connections(
    State(s): State<AppState>,
    conn: Conn,
    headers: HeaderMap,
) -> Json<Value> {
    let all = s.mqtt.connections();
    Json(Value::Array(
        all.into_iter()
            .map(|v| resource(&s, &headers, &conn, Collection::Connections, v))
            .collect(),
    ))
}

pub(super) async fn delete_connection(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    s.mqtt.delete_connection(&name).await?;
    Ok(StatusCode::OK.into_response())
}

pub(super) async fn put_route(
    State(s): State<AppState>,
    Path(name): Path<String>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = read_json(&s, &headers, body).await?;
    let v = s.mqtt.put_route(&name, &body).await?;
    Ok(Json(resource(&s, &headers, &conn, Collection::Routes, v)))
}

pub(super) async fn get_route(
    State(s): State<AppState>,
    Path(name): Path<String>,
    conn: Conn,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let v = s.mqtt.route(&name)?;
    Ok(Json(resource(&s, &headers, &conn, Collection::Routes, v)))
}

pub(super) async fn list_routes(
    State(s): State<AppState>,
    conn: Conn,
    headers: HeaderMap,
) -> Json<Value> {
    let all = s.mqtt.routes();
    Json(Value::Array(
        all.into_iter()
            .map(|v| resource(&s, &headers, &conn, Collection::Routes, v))
            .collect(),
    ))
}

pub(super) async fn delete_route(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    s.mqtt.delete_route(&name).await?;
    Ok(StatusCode::OK.into_response())
}
