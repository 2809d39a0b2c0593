//! The Event Grid on IoT Edge REST API.
//!
//! One layer ([`Guard`], a plain tower service: no boxing per request) runs two checks, in this
//! order, before any API handler:
//! 1. [`auth::require`]: the only authentication check (SAS key, then client certificate);
//! 2. `api_version`: `api-version=2019-01-01-preview` everywhere, `2018-01-01` also on publish;
//!    on Event Grid namespaces' data plane (`POST …/{name}:{operation}`, [`pull`]) only
//!    `2023-11-01` and `2024-06-01`;
//!
//! then the handler reads the body under the size limit, parses, calls the broker and maps the
//! result.
//!
//! Health routes (`/healthz`, `/readyz`) sit outside the layer: container health checks carry
//! neither keys nor api-version. So do the operator console's files ([`console`]): they hold no
//! data, and the page calls the API routes below with the operator's credential.

pub mod auth;
pub mod body;
pub mod console;
pub mod deadletters;
pub mod entra;
mod events;
mod health;
pub mod long_poll;
mod mqtt;
mod overview;
mod pull;
mod sas_token;
mod subscriptions;
mod topics;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::model::json::parse_body;
use crate::model::media;
use crate::model::topic::ResourceContext;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use bytes::Bytes;
use futures_util::future::Either;
use serde_json::Value;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use tracing::instrument::{Instrument, Instrumented};

/// The only api-version the edge API ever had.
pub const API_VERSION: &str = "2019-01-01-preview";
/// The cloud data-plane version the official SDKs send when publishing.
pub const SDK_PUBLISH_API_VERSION: &str = "2018-01-01";
/// Event Grid namespaces' data-plane versions (`:publish`, `:receive`, ...; those routes only).
pub const NAMESPACE_API_VERSIONS: [&str; 2] = ["2023-11-01", "2024-06-01"];

/// Per-connection facts the listener attaches to every request.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// A client certificate was presented and accepted by the TLS verifier.
    pub client_cert: bool,
    /// That certificate chains to the trust bundle (IoT Edge's, or every accepted one with
    /// `allowUnknownCA=false`). An unverified certificate may only publish.
    pub client_cert_verified: bool,
    /// That certificate's identity (subject CN), when it has one and its chain was verified
    /// (`tls::IdentityCheck`): an unverified certificate authenticates but names nobody.
    pub client_identity: Option<Arc<str>>,
}

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    /// The broker.
    pub broker: Broker,
    /// `/metrics` is served.
    pub metrics_enabled: bool,
    /// Liveness/readiness flag (false while shutting down).
    pub ready: Arc<std::sync::atomic::AtomicBool>,
    /// Request bodies being read, all connections together (`inbound__maxBodyBytesInFlight`).
    pub bodies: Arc<body::BodyBudget>,
    /// The MQTT sources' connections and routes (`/mqtt/...`).
    pub mqtt: Arc<crate::ingress::manage::Mqtt>,
    /// The caps on waiting receives (`inbound__maxLongPolls*`).
    pub long_polls: Arc<long_poll::LongPolls>,
    /// Turns true when gridlet begins to stop: long polls (the console's tail) answer at once,
    /// so they do not hold the listeners' graceful close.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The Entra ID signing keys, when Entra tokens are enabled.
    pub entra: Option<Arc<entra::Keys>>,
}

/// The connection facts a handler may extract (absent in router tests without a listener).
type Conn = Option<axum::Extension<ConnInfo>>;

impl AppState {
    fn resource_context(&self, headers: &HeaderMap, conn: &Conn) -> ResourceContext {
        let cfg = self.broker.config();
        let scheme = conn.as_ref().map_or("http", |c| c.0.scheme);
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| {
                let port = if scheme == "https" {
                    cfg.inbound.https_port
                } else {
                    cfg.inbound.http_port
                };
                format!("{}:{port}", cfg.edge.module_id)
            });
        ResourceContext {
            id_prefix: format!(
                "/iotHubs/{}/devices/{}/modules/{}",
                cfg.edge.hub_name, cfg.edge.device_id, cfg.edge.module_id
            ),
            base_url: format!("{scheme}://{host}"),
        }
    }
}

/// The whole router.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/topics", get(topics::list))
        .route("/topics/", get(topics::list))
        .route(
            "/topics/{topic}",
            put(topics::put)
                .get(topics::get)
                .delete(topics::delete)
                .post(pull::topic_post),
        )
        .route(
            "/topics/{topic}/eventSubscriptions",
            get(subscriptions::list),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/",
            get(subscriptions::list),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}",
            put(subscriptions::put)
                .get(subscriptions::get)
                .delete(subscriptions::delete)
                .post(pull::subscription_post),
        )
        .route(
            "/topics/{topic}/eventsubscriptions/{sub}",
            post(pull::subscription_post),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}/deadLetters",
            get(deadletters::list).merge(delete(deadletters::purge)),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}/deadLetters/replay",
            post(deadletters::replay),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}/deadLetters/{id}/replay",
            post(deadletters::replay_one),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}/endpointHealth",
            get(deadletters::health),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}/endpointHealth/enable",
            post(deadletters::enable),
        )
        .route(
            "/topics/{topic}/eventSubscriptions/{sub}/status",
            get(subscriptions::status),
        )
        .route("/topics/{topic}/tail", get(topics::tail))
        .route("/broker/overview", get(overview::get))
        .route("/mqtt/connections", get(mqtt::list_connections))
        .route("/mqtt/connections/", get(mqtt::list_connections))
        .route(
            "/mqtt/connections/{name}",
            put(mqtt::put_connection)
                .get(mqtt::get_connection)
                .delete(mqtt::delete_connection),
        )
        .route("/mqtt/routes", get(mqtt::list_routes))
        .route("/mqtt/routes/", get(mqtt::list_routes))
        .route(
            "/mqtt/routes/{name}",
            put(mqtt::put_route)
                .get(mqtt::get_route)
                .delete(mqtt::delete_route),
        )
        .route("/topics/{topic}/events", post(events::publish))
        .route(
            "/topics/{topic}/events/{event_id}",
            post(events::publish_single),
        )
        .route("/metrics", get(health::metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(GuardLayer {
            broker: state.broker.clone(),
            entra: state.entra.clone(),
        });
    Router::new()
        .route("/healthz", get(health::live))
        .route("/readyz", get(health::ready))
        .route("/console", get(console::index))
        .route("/console/", get(console::index))
        .route("/console/{file}", get(console::asset))
        .merge(api)
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("NotFound", "no such route")
}

async fn method_not_allowed() -> Response {
    let mut e = ApiError::bad_request(
        "MethodNotAllowed",
        "this method is not supported on this route",
    );
    e.status = axum::http::StatusCode::METHOD_NOT_ALLOWED;
    e.into_response()
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        k.eq_ignore_ascii_case(name).then_some(v)
    })
}

/// The API routes' layer: [`Guard`] around each route.
#[derive(Clone)]
struct GuardLayer {
    broker: Broker,
    entra: Option<Arc<entra::Keys>>,
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            broker: self.broker.clone(),
            entra: self.entra.clone(),
        }
    }
}

/// Authentication, then api-version, then the route (see the module docs). A hand-written
/// service rather than two `from_fn` middlewares, which box the inner service and a future per
/// request each. The one boxed future: a request whose Entra token names an unknown key id
/// waits (at most [`entra::refresh::WAIT_FOR_FETCH`]) for the fetch of the tenant's keys it asked
/// for, then is checked again.
#[derive(Clone)]
pub struct Guard<S> {
    inner: S,
    broker: Broker,
    entra: Option<Arc<entra::Keys>>,
}

type Answer = Result<Response, Infallible>;

impl<S> tower::Service<Request> for Guard<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<
        Ready<Answer>,
        Either<Instrumented<S::Future>, futures_util::future::BoxFuture<'static, Answer>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        match check(self.broker.config(), self.entra.as_deref(), &req) {
            Ok(()) => {
                let span = request_span(&req);
                Either::Right(Either::Left(self.inner.call(req).instrument(span)))
            }
            Err(auth::Refused {
                after_fetch: Some(mut fetched),
                ..
            }) => {
                // The ready service goes with the request; a clone stays (tower's rule).
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let (broker, keys) = (self.broker.clone(), self.entra.clone());
                Either::Right(Either::Right(Box::pin(async move {
                    let wait = entra::refresh::WAIT_FOR_FETCH;
                    let _ = tokio::time::timeout(wait, fetched.changed()).await;
                    match check(broker.config(), keys.as_deref(), &req) {
                        Ok(()) => {
                            let span = request_span(&req);
                            inner.call(req).instrument(span).await
                        }
                        Err(r) => Ok(r.error.into_response()),
                    }
                })))
            }
            Err(r) => Either::Left(ready(Ok(r.error.into_response()))),
        }
    }
}

/// The guard's checks, in order.
fn check(
    cfg: &crate::config::Config,
    keys: Option<&entra::Keys>,
    req: &Request,
) -> Result<(), auth::Refused> {
    auth::require(cfg, keys, req)?;
    auth::browser_guard(cfg, req)
        .and_then(|()| api_version(req))
        .map_err(auth::Refused::from)
}

/// The span every accepted request runs in: method, route template and topic, so what the
/// broker and the store log while serving it names the request. At `debug`: with the default
/// `info` level the span is disabled, and costs a callsite check per request.
fn request_span(req: &Request) -> tracing::Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("", |p| p.as_str());
    let topic = req
        .uri()
        .path()
        .strip_prefix("/topics/")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("");
    tracing::debug_span!("request", method = %req.method(), route, topic)
}

/// Whether `req` is one of Event Grid namespaces' data-plane operations: a POST whose last
/// path segment is `{name}:{operation}`.
pub fn is_namespace_op(req: &Request) -> bool {
    req.method() == axum::http::Method::POST
        && req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
}

/// Enforce `api-version`.
fn api_version(req: &Request) -> Result<(), ApiError> {
    let query = req.uri().query().unwrap_or("");
    let version = query_param(query, "api-version");
    if is_namespace_op(req) {
        return match version {
            Some(v) if NAMESPACE_API_VERSIONS.contains(&v) => Ok(()),
            _ => Err(ApiError::bad_request(
                "InvalidApiVersion",
                format!(
                    "the query parameter api-version={} is required",
                    NAMESPACE_API_VERSIONS.join(" or ")
                ),
            )),
        };
    }
    let is_publish =
        req.method() == axum::http::Method::POST && req.uri().path().contains("/events");
    let ok = match version {
        Some(API_VERSION) => true,
        Some(SDK_PUBLISH_API_VERSION) => is_publish,
        _ => false,
    };
    if !ok {
        let expected = if is_publish {
            format!("{API_VERSION} (or {SDK_PUBLISH_API_VERSION})")
        } else {
            API_VERSION.to_string()
        };
        return Err(ApiError::bad_request(
            "InvalidApiVersion",
            format!("the query parameter api-version={} is required", expected),
        ));
    }
    Ok(())
}

/// Read a request body up to `limit` bytes: 413 before reading when `Content-Length` is larger,
/// 413 as soon as a chunked body passes the limit, 408 when it does not arrive in time
/// ([`body::DeadlineBody`]).
///
/// # Errors
/// 413 over the limit; 408 past the body deadline; 400 when the body cannot be read.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    budget: &body::BodyBudget,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    let reserve = declared.map_or(limit, |len| len as usize);
    let Some(_reserved) = budget.reserve(reserve).await else {
        return Err(ApiError::unavailable(
            format!(
                "request bodies being read fill {}; retry later",
                crate::config::Key::inbound__maxBodyBytesInFlight.name()
            ),
            std::time::Duration::from_secs(1),
        ));
    };
    match axum::body::to_bytes(body, limit).await {
        Ok(b) => Ok(b),
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            let timed_out = std::iter::successors(std::error::Error::source(&e), |s| s.source())
                .find_map(|s| s.downcast_ref::<body::BodyTimedOut>());
            if too_large {
                Err(ApiError::payload_too_large(limit))
            } else if let Some(t) = timed_out {
                Err(ApiError {
                    status: axum::http::StatusCode::REQUEST_TIMEOUT,
                    detail: "RequestTimeout",
                    message: t.to_string(),
                    retry_after: None,
                })
            } else {
                Err(ApiError::bad_request(
                    "InvalidBody",
                    "the request body could not be read",
                ))
            }
        }
    }
}

/// A management request's JSON body: a JSON content type (when one is given), within
/// `broker__maxRequestBodyBytes`, parsed (an empty body is `{}`).
async fn read_json(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    require_json(headers)?;
    let limit = s.broker.config().broker.max_request_body_bytes;
    let bytes = read_body(headers, body, limit, &s.bodies).await?;
    Ok(parse_body(&bytes)?)
}

/// Management bodies must be JSON when a content type is given.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        None => Ok(()),
        Some(ct) if media::is_json(&media::essence(ct)) => Ok(()),
        Some(ct) => Err(ApiError::unsupported_media_type(format!(
            "Content-Type '{ct}' is not supported; use application/json"
        ))),
    }
}

#[cfg(test)]
mod tests {
    /// Records the fields of every span created, as `name: field=value ...`.
    #[derive(Clone, Default)]
    struct Spans(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl tracing::Subscriber for Spans {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            struct Fields(String);
            impl tracing::field::Visit for Fields {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    self.0.push_str(&format!(" {}={:?}", f.name(), v));
                }
                fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                    self.0.push_str(&format!(" {}={}", f.name(), v));
                }
            }
            let mut fields = Fields(format!("{}:", attrs.metadata().name()));
            attrs.record(&mut fields);
            let mut spans = self.0.lock().unwrap();
            spans.push(fields.0);
            tracing::span::Id::from_u64(spans.len() as u64)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn each_request_gets_a_span_with_method_route_and_topic() {
        let spans = Spans::default();
        let req = Request::builder()
            .method("POST")
            .uri("/topics/sensors/events?api-version=2019-01-01-preview")
            .body(Body::empty())
            .unwrap();
        tracing::subscriber::with_default(spans.clone(), || {
            let _span = request_span(&req);
        });
        let got = spans.0.lock().unwrap().clone();
        assert_eq!(
            got,
            vec!["request: method=POST route= topic=sensors".to_string()]
        );
    }

    use super::{query_param, request_span, Body, Request};

    #[test]
    fn query_params_are_found_case_insensitively() {
        assert_eq!(query_param("a=1&API-VERSION=x", "api-version"), Some("x"));
        assert_eq!(query_param("", "api-version"), None);
    }
}
