//! The API's one error type and the only mapping to HTTP (part of the API layer).
//!
//! The model answers [`Invalid`], a publish [`PublishError`], the broker [`BrokerError`]; none of
//! them knows HTTP. The table below ([`ApiError::from_broker`] and the `From` impls) chooses the
//! status, the detailed code and `Retry-After` for each. Every failure a client can see goes
//! through [`ApiError`], rendered as the documented body
//! `{"error":{"code":"<status name>","message":"…","details":{"code":"<detail>","message":"…"}}}`
//! (`details` is an object, as on the edge; `error.message` is added for cloud-style clients).
//! The namespaces data plane answers in Azure's REST error shape instead, `details` an array, and
//! with the status codes its API documents for a publish ([`ApiError::for_namespaces`]).
//! 5xx bodies never echo internals: the cause is logged, the client gets a generic message.

use crate::broker::BrokerError;
use crate::model::event::PublishError;
use crate::model::Invalid;
use crate::store::StoreError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable detailed code (`details.code`), e.g. `InvalidDestination`.
    pub detail: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `Retry-After` seconds, for 503/507.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    fn new(status: StatusCode, detail: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            detail,
            message: message.into(),
            retry_after: None,
        }
    }

    /// This error as the namespaces data plane answers it: `details` an array, and for a
    /// `:publish` (`publish`) the codes Event Grid namespaces document for one, 403 for a
    /// request or event too large (413 elsewhere) and 410 for a topic that does not exist (404
    /// elsewhere). gridlet's own capacity answers (503 memory, 507 disk, with `Retry-After`)
    /// stay: the SDKs retry 503, and a 403 would make them drop the event.
    pub fn namespaces_response(self, publish: bool) -> Response {
        self.for_namespace_publish(publish).render(true)
    }

    fn for_namespace_publish(mut self, publish: bool) -> Self {
        if publish {
            if self.status == StatusCode::PAYLOAD_TOO_LARGE {
                self.status = StatusCode::FORBIDDEN;
            } else if self.status == StatusCode::NOT_FOUND && self.detail == "TopicNotFound" {
                self.status = StatusCode::GONE;
            }
        }
        self
    }

    /// 400 with a detailed code.
    pub fn bad_request(detail: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail, message)
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "the request carries no valid credential: an aeg-sas-key header, \
             Authorization: SharedAccessKey <key> (what the Azure SDKs send), a shared access \
             signature (aeg-sas-token or Authorization: SharedAccessSignature) or a client certificate",
        )
    }

    /// 404.
    pub fn not_found(detail: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail, message)
    }

    /// 413.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PayloadTooLarge",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    /// 415.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            message,
        )
    }

    /// 503 with `Retry-After`: a bounded queue or resource is full; nothing was accepted.
    pub fn unavailable(message: impl Into<String>, retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        )
        .retry_after(retry_after)
    }

    /// 507 with `Retry-After`: the event store reached its disk bound; nothing was accepted.
    pub fn insufficient_storage(message: impl Into<String>, retry_after: Duration) -> Self {
        Self::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "InsufficientStorage",
            message,
        )
        .retry_after(retry_after)
    }

    fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// 500. The cause is logged here; the client sees a generic message.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(%cause, "internal error answering a request");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the broker failed to process the request; see its log",
        )
    }

    /// Whether this is the client's fault (4xx), for the `UserErrorRequests` metric.
    pub fn is_user_error(&self) -> bool {
        self.status.is_client_error()
    }

    /// The documented JSON body.
    pub fn body(&self) -> serde_json::Value {
        self.body_with(false)
    }

    /// The body, `details` an object (the edge) or an array (Azure's REST convention).
    fn body_with(&self, details_array: bool) -> serde_json::Value {
        let code = status_name(self.status);
        let detail = serde_json::json!({ "code": self.detail, "message": self.message });
        let details = if details_array {
            serde_json::Value::Array(vec![detail])
        } else {
            detail
        };
        serde_json::json!({
            "error": { "code": code, "message": self.message, "details": details }
        })
    }
}

/// How long a client waits before retrying after the store reported itself full.
const STORE_FULL_RETRY_AFTER: Duration = Duration::from_secs(30);

impl ApiError {
    /// The table: each broker failure's status, detailed code and `Retry-After`. The module twin
    /// reports its errors through it too (`edge::twin::error_text`).
    pub fn from_broker(e: &BrokerError) -> Self {
        let message = e.to_string();
        match e {
            BrokerError::Invalid(invalid) => Self::from(invalid.clone()),
            BrokerError::TopicNotFound { .. } => Self::not_found("TopicNotFound", message),
            BrokerError::SubscriptionNotFound { .. } => {
                Self::not_found("EventSubscriptionNotFound", message)
            }
            BrokerError::LimitExceeded { .. } => Self::bad_request("LimitExceeded", message),
            BrokerError::SchemaInUse { .. } => Self::bad_request("InvalidSchema", message),
            BrokerError::PersistenceImmutable => {
                Self::bad_request("PersistencePolicyImmutable", message)
            }
            BrokerError::HealthNotTracked => Self::bad_request("EndpointHealthNotTracked", message),
            BrokerError::Unavailable { retry_after, .. } => {
                Self::unavailable(message, *retry_after)
            }
            BrokerError::Store(StoreError::Full { .. }) => {
                Self::insufficient_storage(message, STORE_FULL_RETRY_AFTER)
            }
            BrokerError::Store(_) | BrokerError::Task(_) => Self::internal(e),
        }
    }
}

/// The model's rejections are 400s with their own code.
impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        Self::bad_request(e.code, e.message)
    }
}

impl From<PublishError> for ApiError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::Invalid(invalid) => invalid.into(),
            PublishError::UnsupportedMediaType(message) => Self::unsupported_media_type(message),
            PublishError::Serialize(_) => Self::internal(&e),
        }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        Self::from_broker(&e)
    }
}

/// MQTT connections and routes through the management API (`ingress::manage`).
impl From<crate::ingress::manage::ManageError> for ApiError {
    fn from(e: crate::ingress::manage::ManageError) -> Self {
        use crate::ingress::manage::ManageError;
        use crate::model::record::MqttKind;
        let message = e.to_string();
        match e {
            ManageError::Invalid { kind, .. } => Self::bad_request(
                match kind {
                    MqttKind::Connection => "InvalidMqttConnection",
                    MqttKind::Route => "InvalidMqttRoute",
                },
                message,
            ),
            ManageError::NotFound { kind, .. } => Self::not_found(
                match kind {
                    MqttKind::Connection => "MqttConnectionNotFound",
                    MqttKind::Route => "MqttRouteNotFound",
                },
                message,
            ),
            ManageError::DefinedBySettings { .. } => {
                Self::bad_request("DefinedBySettings", message)
            }
            ManageError::InUse { .. } => Self::bad_request("MqttConnectionInUse", message),
            ManageError::LimitExceeded { .. } => Self::bad_request("LimitExceeded", message),
            ManageError::Broker(b) => Self::from_broker(&b),
        }
    }
}

impl From<crate::delivery::pull::PullError> for ApiError {
    fn from(e: crate::delivery::pull::PullError) -> Self {
        use crate::delivery::pull::PullError;
        match e {
            PullError::NotQueue => Self::bad_request("NotAQueueSubscription", e.to_string()),
            PullError::Store(s) => Self::from_broker(&BrokerError::Store(s)),
        }
    }
}

/// .NET-style status names, as the original put in `error.code` (`BadRequest`, `NotFound`, …).
fn status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Gone",
        413 => "PayloadTooLarge",
        415 => "UnsupportedMediaType",
        503 => "ServiceUnavailable",
        507 => "InsufficientStorage",
        _ => "InternalServerError",
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.detail,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.render(false)
    }
}

impl ApiError {
    fn render(self, details_array: bool) -> Response {
        let mut resp = (self.status, axum::Json(self.body_with(details_array))).into_response();
        if let Some(after) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&after.as_secs().max(1).to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_the_documented_shape() {
        let b = ApiError::bad_request("InvalidDestination", "nope").body();
        assert_eq!(b["error"]["code"], "BadRequest");
        assert_eq!(b["error"]["details"]["code"], "InvalidDestination");
        assert_eq!(b["error"]["details"]["message"], "nope");
    }

    #[test]
    fn namespaces_get_an_array_of_details_and_their_publish_codes() {
        let b = ApiError::bad_request("InvalidSchema", "nope").body_with(true);
        assert_eq!(b["error"]["details"][0]["code"], "InvalidSchema");
        let big = ApiError::payload_too_large(10).for_namespace_publish(true);
        assert_eq!(big.status, StatusCode::FORBIDDEN);
        let elsewhere = ApiError::payload_too_large(10).for_namespace_publish(false);
        assert_eq!(elsewhere.status, StatusCode::PAYLOAD_TOO_LARGE);
        let gone = ApiError::not_found("TopicNotFound", "t").for_namespace_publish(true);
        assert_eq!(gone.status, StatusCode::GONE);
        assert_eq!(gone.body()["error"]["code"], "Gone");
        let full = ApiError::insufficient_storage("full", Duration::from_secs(1))
            .for_namespace_publish(true);
        assert_eq!(full.status, StatusCode::INSUFFICIENT_STORAGE);
    }
}
