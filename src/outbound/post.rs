//! HTTP destinations: WebHook and cloud Event Grid topics, over one shared connection pool.
//!
//! Request: `POST` of the JSON array, `Content-Type` per schema, cloud-style headers
//! `aeg-event-type: Notification`, `aeg-subscription-name`, `aeg-delivery-count` (attempts before
//! this one), and for Event Grid `aeg-sas-key`. Redirects are not followed (a 3xx is a failure).
//! Success is 200–204; the response body is read (up to 64 KiB) so the connection can be reused.
//! Opt-in per subscription ([`WebhookSink::with_options`]): Standard Webhooks signing headers and
//! delivery attributes: static headers (secret values are marked sensitive and never logged)
//! and dynamic ones, valued from the batch's first event.

use super::http::{Endpoint, HttpClient, HttpError};
use super::signing::Signer;
use crate::delivery::sink::{DeliveryRequest, FailureKind, OnwardTrace, Outcome, Sink};
use crate::model::attributes::{AttributeValue, DeliveryAttribute};
use crate::model::delivery_options::DeliveryOptions;
use crate::model::topic::EventSchema;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use serde_json::Value;
use std::time::{Duration, SystemTime};

/// How an Event Grid destination rewrites `topic`.
#[derive(Debug, Clone)]
pub enum TopicRewrite {
    /// Leave events as they are (WebHook).
    None,
    /// Set every EventGridSchema event's `topic` to this value (`None` = null).
    Set(Option<String>),
}

/// A webhook or Event Grid endpoint.
pub struct WebhookSink {
    /// The URL parsed once (host, connect target, request target). If it does not parse, every
    /// send fails with that error ([`FailureKind::Other`]).
    endpoint: Result<Endpoint, HttpError>,
    sas_key: Option<HeaderValue>,
    rewrite: TopicRewrite,
    signer: Option<(Signer, String)>,
    /// Static delivery attributes, parsed once.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Dynamic delivery attributes: header and the attribute (valued from the batch's first
    /// event).
    dynamic: Vec<(HeaderName, DeliveryAttribute)>,
    /// `aeg-subscription-name` value: a sink serves one subscription, so it is built once.
    subscription_name: std::sync::OnceLock<HeaderValue>,
}

// Header names parsed once (`&str` names are validated and copied on every request).
static AEG_EVENT_TYPE: HeaderName = HeaderName::from_static("aeg-event-type");
static AEG_SUBSCRIPTION_NAME: HeaderName = HeaderName::from_static("aeg-subscription-name");
static AEG_DELIVERY_COUNT: HeaderName = HeaderName::from_static("aeg-delivery-count");
static AEG_SAS_KEY: HeaderName = HeaderName::from_static("aeg-sas-key");
static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
static WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
static WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

impl WebhookSink {
    /// A sink posting to `url` through `client`.
    pub fn new(
        client: HttpClient,
        url: String,
        sas_key: Option<&str>,
        rewrite: TopicRewrite,
    ) -> Self {
        let sas_key = sas_key
            .and_then(|k| HeaderValue::from_str(k).ok())
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        Self {
            endpoint: client.endpoint(&url),
            sas_key,
            rewrite,
            signer: None,
            headers: Vec::new(),
            dynamic: Vec::new(),
            subscription_name: std::sync::OnceLock::new(),
        }
    }

    fn subscription_header(&self, req: &DeliveryRequest) -> HeaderValue {
        self.subscription_name
            .get_or_init(|| {
                HeaderValue::from_str(&req.subscription.to_ascii_uppercase())
                    .unwrap_or_else(|_| HeaderValue::from_static(""))
            })
            .clone()
    }

    /// Add a subscription's signing secrets and static headers. `id_prefix` makes
    /// `webhook-id` unique across restarts (`msg_<prefix>_<batch id>`); invalid secrets or
    /// headers (already rejected by the API) are skipped.
    pub fn with_options(mut self, o: &DeliveryOptions, id_prefix: &str) -> Self {
        if !o.signing_secrets.is_empty() {
            match Signer::new(&o.signing_secrets) {
                Ok(s) => self.signer = Some((s, id_prefix.to_string())),
                Err(e) => tracing::error!(error = %e, "signing disabled: invalid secret"),
            }
        }
        for a in &o.attributes {
            let Ok(name) = HeaderName::from_bytes(a.name.as_bytes()) else {
                continue;
            };
            match &a.value {
                AttributeValue::Static(v) => {
                    if let Ok(mut v) = HeaderValue::from_str(v) {
                        v.set_sensitive(a.is_secret);
                        self.headers.push((name, v));
                    }
                }
                AttributeValue::Dynamic(_) => self.dynamic.push((name, a.clone())),
            }
        }
        self
    }

    fn body(&self, req: &DeliveryRequest) -> Bytes {
        match &self.rewrite {
            TopicRewrite::Set(topic) if req.schema == EventSchema::EventGrid => {
                let events: Vec<Bytes> = req
                    .events
                    .iter()
                    .map(|e| match serde_json::from_slice::<Value>(e) {
                        Ok(Value::Object(mut m)) => {
                            m.insert(
                                "topic".into(),
                                topic.clone().map(Value::String).unwrap_or(Value::Null),
                            );
                            serde_json::to_vec(&m)
                                .map(Bytes::from)
                                .unwrap_or_else(|_| e.clone())
                        }
                        _ => e.clone(),
                    })
                    .collect();
                crate::delivery::sink::json_array(&events)
            }
            _ => req.json_array(),
        }
    }
}

/// The W3C Trace Context headers of an HTTP request for an attempt carrying `trace` onward
/// (none without a context): the receiver's span becomes a child of the `deliver` span.
pub fn trace_headers(h: &mut HeaderMap, trace: &OnwardTrace) {
    let Some(t) = trace.request() else {
        return;
    };
    if let Ok(v) = HeaderValue::from_str(&t.traceparent()) {
        h.insert(TRACEPARENT.clone(), v);
    }
    if let Some(v) = t
        .state
        .as_deref()
        .and_then(|s| HeaderValue::from_str(s).ok())
    {
        h.insert(TRACESTATE.clone(), v);
    }
}

/// Parse `Retry-After`: delay-seconds or an HTTP-date.
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

impl Sink for WebhookSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let endpoint = match &self.endpoint {
                Ok(e) => e,
                Err(e) => return Outcome::failed(FailureKind::Other(e.to_string())),
            };
            let body = self.body(req);
            let mut h = HeaderMap::with_capacity(8 + self.headers.len());
            h.append(
                CONTENT_TYPE,
                HeaderValue::from_static(req.schema.delivery_content_type()),
            );
            h.append(
                AEG_EVENT_TYPE.clone(),
                HeaderValue::from_static("Notification"),
            );
            h.append(AEG_SUBSCRIPTION_NAME.clone(), self.subscription_header(req));
            h.append(
                AEG_DELIVERY_COUNT.clone(),
                HeaderValue::from(req.attempt.saturating_sub(1)),
            );
            for (name, value) in &self.headers {
                h.append(name.clone(), value.clone());
            }
            if !self.dynamic.is_empty() {
                // A request carries a batch: dynamic values come from its first event.
                let first = req
                    .events
                    .first()
                    .and_then(|e| serde_json::from_slice::<Value>(e).ok());
                for (name, a) in &self.dynamic {
                    if let Some(v) = a
                        .resolve(first.as_ref())
                        .and_then(|v| HeaderValue::from_str(&v).ok())
                    {
                        h.append(name.clone(), v);
                    }
                }
            }
            if let Some((signer, prefix)) = &self.signer {
                let id = format!("msg_{prefix}_{}", req.batch_id);
                // Wall time of this attempt, as the spec asks (seconds).
                #[allow(clippy::disallowed_methods)]
                let ts = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let mut sig = HeaderValue::from_str(&signer.sign(&id, ts, &body))
                    .unwrap_or_else(|_| HeaderValue::from_static(""));
                sig.set_sensitive(true);
                let id =
                    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static(""));
                h.append(WEBHOOK_ID.clone(), id);
                h.append(WEBHOOK_TIMESTAMP.clone(), HeaderValue::from(ts));
                h.append(WEBHOOK_SIGNATURE.clone(), sig);
            }
            if let Some(k) = &self.sas_key {
                h.append(AEG_SAS_KEY.clone(), k.clone());
            }
            trace_headers(&mut h, &req.trace);
            match endpoint.post(h, body).await {
                Ok(resp) => {
                    let status = resp.status.as_u16();
                    if (200..=204).contains(&status) {
                        Outcome::Delivered
                    } else {
                        // Wall time only to interpret an HTTP-date Retry-After.
                        #[allow(clippy::disallowed_methods)]
                        let retry_after = parse_retry_after(&resp.headers, SystemTime::now());
                        Outcome::Failed {
                            kind: FailureKind::Status(status),
                            retry_after,
                        }
                    }
                }
                Err(HttpError::Timeout) => Outcome::failed(FailureKind::Timeout),
                Err(HttpError::Connect(_)) => Outcome::failed(FailureKind::Connect),
                Err(HttpError::Other(m)) => Outcome::failed(FailureKind::Other(m)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("120"));
        assert_eq!(parse_retry_after(&h, now), Some(Duration::from_secs(120)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        h.insert(RETRY_AFTER, HeaderValue::from_str(&later).unwrap());
        assert_eq!(parse_retry_after(&h, now), Some(Duration::from_secs(30)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(parse_retry_after(&h, now), None);
    }
}
