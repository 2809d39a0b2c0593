//! An Event Grid **namespace topic** as a destination: `POST
//! https://{namespace}.{region}-1.eventgrid.azure.net/topics/{topic}:publish?api-version=2024-06-01`
//! with a CloudEvents batch (`application/cloudevents-batch+json`) and `Authorization:
//! SharedAccessKey <key>` (or `SharedAccessSignature <token>`).
//!
//! * **Form.** CloudEvents are sent as published. EventGridSchema events become CloudEvents
//!   ([`to_cloud_event`]): `id` kept, `source` the destination's `topicName` when set (give it
//!   the topic's resource path, `/subscriptions/…/topics/…`, as Microsoft's own events carry
//!   it), else the event's `topic` (the device topic's name), `type` from
//!   `eventType`, `subject`, `time` from `eventTime`, `data` (with `datacontenttype:
//!   application/json`), `dataVersion` as the `dataversion` extension. A custom-schema event has
//!   no CloudEvents form: refused for good ([`FailureKind::Refused`], dead-lettered alone).
//! * **Limits** ([`NamespaceLimits`]): 1 MB per event, 1 MB and 1,000 events per request. A
//!   delivery batch is cut into requests within them, in order; a larger event is dead-lettered
//!   without being sent.
//! * **Answers** (Microsoft's `EventGridSenderClient` documents 200, 400, 401, 403 "quota
//!   exceeded or message is too large", 410 "topic not found", 500):
//!
//! | answer | outcome | decision ([`crate::delivery::classify::classify`]) |
//! |---|---|---|
//! | 200–204 | delivered | |
//! | 413, or 403 whose text is about size | the request is split in halves; one event alone is [`FailureKind::TooLarge`] | dead-lettered, the rest go on |
//! | 403 otherwise (quota) | [`FailureKind::Throttled`] | retried, `Retry-After` honoured |
//! | 410 (topic not found) | [`FailureKind::Refused`] | dead-lettered at once |
//! | 400 | Azure service 400 | dead-lettered at once |
//! | 401, 404 | Azure service 401/404 | retried: a configuration fault (warn, counted) |
//! | 408, 429, 500, 502, 504, others | Azure service status | retried (`Retry-After` on 429/500/503) |
//! | 503, connection refused, DNS failure, connect timeout | Azure service 503 / connect | retried; an uplink outage for endpoint health |
//!
//! A request that fails otherwise fails its events and those of every request not yet sent;
//! events already accepted stay delivered ([`Outcome::PerEvent`]).

use super::super::http::{Endpoint, HttpClient};
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::model::topic::EventSchema;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde_json::{Map, Value};

/// The namespace's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceLimits {
    /// Largest event (its CloudEvents JSON), bytes.
    pub max_event_bytes: usize,
    /// Largest request body, bytes.
    pub max_request_bytes: usize,
    /// Most events per request.
    pub max_events: usize,
}

impl NamespaceLimits {
    /// Event Grid namespaces: 1 MB per event, 1 MB and 1,000 events per publish request.
    pub const AZURE: NamespaceLimits = NamespaceLimits {
        max_event_bytes: 1 << 20,
        max_request_bytes: 1 << 20,
        max_events: 1000,
    };
}

/// How the sink authenticates.
#[derive(Debug, Clone)]
pub enum NamespaceAuth {
    /// `Authorization: SharedAccessKey <key>`.
    Key(String),
    /// `Authorization: SharedAccessSignature <token>` (`r=…&e=…&s=…`).
    Token(String),
}

/// The CloudEvents batch content type.
static BATCH_CONTENT_TYPE: HeaderValue =
    HeaderValue::from_static("application/cloudevents-batch+json; charset=utf-8");

/// Sends to one namespace topic.
pub struct NamespaceSink {
    endpoint: Result<Endpoint, String>,
    auth: Option<HeaderValue>,
    /// Replaces `source` of converted EventGridSchema events (the destination's `topicName`).
    source: Option<String>,
    limits: NamespaceLimits,
}

impl NamespaceSink {
    /// A sink publishing to `url` (a namespace topic's `:publish` URL) through `client`.
    pub fn new(
        client: &HttpClient,
        url: &str,
        auth: &NamespaceAuth,
        source: Option<String>,
        limits: NamespaceLimits,
    ) -> Self {
        let value = match auth {
            NamespaceAuth::Key(k) => format!("SharedAccessKey {k}"),
            NamespaceAuth::Token(t) => format!("SharedAccessSignature {t}"),
        };
        let auth = HeaderValue::from_str(&value).ok().map(|mut v| {
            v.set_sensitive(true);
            v
        });
        Self {
            endpoint: client.endpoint(url).map_err(|e| e.to_string()),
            auth,
            source,
            limits,
        }
    }

    async fn post(&self, endpoint: &Endpoint, body: Bytes, req: &DeliveryRequest) -> Outcome {
        let mut h = HeaderMap::with_capacity(4);
        h.insert(CONTENT_TYPE, BATCH_CONTENT_TYPE.clone());
        if let Some(a) = &self.auth {
            h.insert(AUTHORIZATION, a.clone());
        }
        crate::outbound::post::trace_headers(&mut h, &req.trace);
        namespace_outcome(super::outcome(
            endpoint.post(h, body).await,
            "EventGrid namespace topic",
            req,
        ))
    }
}

/// Re-read a generic Azure outcome with the namespace's meanings: a 410 is permanent, a 403
/// that is not about size is a quota (back off). Size answers are left for the splitter.
fn namespace_outcome(o: Outcome) -> Outcome {
    match o {
        Outcome::Failed {
            kind:
                FailureKind::Service {
                    status: 410,
                    message,
                },
            ..
        } => Outcome::failed(FailureKind::Refused {
            status: Some(410),
            message,
        }),
        Outcome::Failed {
            kind:
                FailureKind::Service {
                    status: 403,
                    message,
                },
            retry_after,
        } if !about_size(&message) => Outcome::Failed {
            kind: FailureKind::Throttled {
                status: 403,
                message,
            },
            retry_after,
        },
        o => o,
    }
}

fn about_size(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("too large") || m.contains("size") || m.contains("exceeds the limit")
}

/// The service's text when `o` says the request was too large: 413, or 403 about size.
fn too_large(o: &Outcome) -> Option<&str> {
    match o {
        Outcome::Failed {
            kind: FailureKind::Service { status, message },
            ..
        } if *status == 413 || (*status == 403 && about_size(message)) => Some(message),
        _ => None,
    }
}

/// The CloudEvents form of one event of `schema` (see the module documentation); `source`
/// replaces an EventGridSchema event's `topic` as the CloudEvents `source`.
///
/// # Errors
/// Why the event has no CloudEvents form.
pub fn to_cloud_event(
    event: &Bytes,
    schema: EventSchema,
    source: Option<&str>,
) -> Result<Bytes, String> {
    match schema {
        EventSchema::CloudEventV1_0 => Ok(event.clone()),
        EventSchema::Custom => Err(
            "a custom-schema event has no CloudEvents form; an Event Grid namespace topic takes CloudEvents (deliver as EventGridSchema or CloudEventSchemaV1_0)"
                .into(),
        ),
        EventSchema::EventGrid => {
            let Ok(Value::Object(e)) = serde_json::from_slice::<Value>(event) else {
                return Err("the event is not a JSON object".into());
            };
            let text = |k: &str| e.get(k).and_then(Value::as_str);
            let id = text("id").ok_or("the event has no id")?;
            let source = source
                .or_else(|| text("topic"))
                .filter(|s| !s.is_empty())
                .ok_or("the event has no topic to become its CloudEvents source")?;
            let mut ce = Map::new();
            ce.insert("specversion".into(), "1.0".into());
            ce.insert("id".into(), id.into());
            ce.insert("source".into(), source.into());
            ce.insert("type".into(), text("eventType").unwrap_or_default().into());
            if let Some(s) = text("subject").filter(|s| !s.is_empty()) {
                ce.insert("subject".into(), s.into());
            }
            if let Some(t) = text("eventTime") {
                ce.insert("time".into(), t.into());
            }
            if let Some(v) = text("dataVersion").filter(|v| !v.is_empty()) {
                ce.insert("dataversion".into(), v.into());
            }
            if let Some(d) = e.get("data").filter(|d| !d.is_null()) {
                ce.insert("datacontenttype".into(), "application/json".into());
                ce.insert("data".into(), d.clone());
            }
            Ok(Bytes::from(Value::Object(ce).to_string()))
        }
    }
}

/// Requests of at most `lim.max_request_bytes` and `lim.max_events` each, in order.
fn requests(sizes: &[usize], lim: &NamespaceLimits) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 2; // []
    for (i, &n) in sizes.iter().enumerate() {
        let add = n + usize::from(i > start);
        if i > start && (bytes + add > lim.max_request_bytes || i - start >= lim.max_events) {
            out.push(start..i);
            start = i;
            bytes = 2 + n;
        } else {
            bytes += add;
        }
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

impl Sink for NamespaceSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let endpoint = match &self.endpoint {
                Ok(e) => e,
                Err(e) => return Outcome::failed(FailureKind::Other(e.clone())),
            };
            let lim = self.limits;
            let mut each: Vec<Option<Outcome>> = vec![None; req.events.len()];
            let mut bodies: Vec<Bytes> = Vec::with_capacity(req.events.len());
            let mut sendable: Vec<usize> = Vec::with_capacity(req.events.len());
            for (i, e) in req.events.iter().enumerate() {
                match to_cloud_event(e, req.schema, self.source.as_deref()) {
                    Ok(ce) if ce.len() > lim.max_event_bytes => {
                        each[i] = Some(Outcome::failed(FailureKind::TooLarge(format!(
                            "the event is {} bytes as a CloudEvent; a namespace topic takes {} per event",
                            ce.len(),
                            lim.max_event_bytes
                        ))));
                        bodies.push(Bytes::new());
                    }
                    Ok(ce) => {
                        sendable.push(i);
                        bodies.push(ce);
                    }
                    Err(why) => {
                        each[i] = Some(Outcome::failed(FailureKind::Refused {
                            status: None,
                            message: why,
                        }));
                        bodies.push(Bytes::new());
                    }
                }
            }
            let sizes: Vec<usize> = sendable.iter().map(|&i| bodies[i].len()).collect();
            let groups: Vec<Vec<usize>> = requests(&sizes, &lim)
                .into_iter()
                .map(|r| sendable[r].to_vec())
                .collect();
            super::send_in_groups(
                groups,
                &bodies,
                &mut each,
                |body| self.post(endpoint, body, req),
                too_large,
                |i, text| {
                    Outcome::failed(FailureKind::TooLarge(format!(
                        "the namespace topic refused the event of {} bytes as too large ({text})",
                        bodies[i].len()
                    )))
                },
            )
            .await;
            Outcome::per_event(
                each.into_iter()
                    .map(|o| o.unwrap_or(Outcome::Delivered))
                    .collect(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(status: u16, message: &str) -> Outcome {
        Outcome::failed(FailureKind::Service {
            status,
            message: message.into(),
        })
    }

    #[test]
    fn event_grid_events_become_cloud_events() {
        let e = Bytes::from(
            json!({"id": "e1", "topic": "/subscriptions/s/resourceGroups/g/providers/Microsoft.EventGrid/topics/t",
                   "subject": "a/b", "eventType": "Contoso.Item", "eventTime": "2026-01-01T00:00:00Z",
                   "dataVersion": "2.0", "metadataVersion": "1", "data": {"x": 1}})
            .to_string(),
        );
        let ce: Value =
            serde_json::from_slice(&to_cloud_event(&e, EventSchema::EventGrid, None).unwrap())
                .unwrap();
        assert_eq!(
            ce,
            json!({"specversion": "1.0", "id": "e1",
                   "source": "/subscriptions/s/resourceGroups/g/providers/Microsoft.EventGrid/topics/t",
                   "type": "Contoso.Item", "subject": "a/b", "time": "2026-01-01T00:00:00Z",
                   "dataversion": "2.0", "datacontenttype": "application/json", "data": {"x": 1}})
        );
        let renamed: Value = serde_json::from_slice(
            &to_cloud_event(&e, EventSchema::EventGrid, Some("cloud-topic")).unwrap(),
        )
        .unwrap();
        assert_eq!(renamed["source"], "cloud-topic");
        let ce_in = Bytes::from_static(
            b"{\"specversion\":\"1.0\",\"id\":\"c\",\"source\":\"s\",\"type\":\"t\"}",
        );
        assert_eq!(
            to_cloud_event(&ce_in, EventSchema::CloudEventV1_0, None).unwrap(),
            ce_in,
            "CloudEvents go as published"
        );
        assert!(to_cloud_event(&ce_in, EventSchema::Custom, None).is_err());
        let no_id = Bytes::from_static(b"{\"topic\":\"t\"}");
        assert!(to_cloud_event(&no_id, EventSchema::EventGrid, None).is_err());
    }

    #[test]
    fn requests_keep_to_bytes_and_count() {
        let lim = NamespaceLimits {
            max_event_bytes: 100,
            max_request_bytes: 25,
            max_events: 3,
        };
        // 10-byte events: two fit 25 bytes ([a,b] = 23), three do not (34).
        assert_eq!(requests(&[10, 10, 10, 10, 10], &lim), [0..2, 2..4, 4..5]);
        let lim = NamespaceLimits {
            max_request_bytes: 1000,
            ..lim
        };
        assert_eq!(requests(&[1; 7], &lim), [0..3, 3..6, 6..7]);
        assert_eq!(requests(&[], &lim), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(
            NamespaceLimits::AZURE,
            NamespaceLimits {
                max_event_bytes: 1_048_576,
                max_request_bytes: 1_048_576,
                max_events: 1000
            }
        );
    }

    #[test]
    fn namespace_answers_have_their_own_meanings() {
        assert_eq!(
            namespace_outcome(svc(410, "topic not found")),
            Outcome::failed(FailureKind::Refused {
                status: Some(410),
                message: "topic not found".into()
            })
        );
        assert!(matches!(
            namespace_outcome(svc(403, "Quota exceeded")),
            Outcome::Failed {
                kind: FailureKind::Throttled { status: 403, .. },
                ..
            }
        ));
        let size = svc(403, "The request is too large");
        assert_eq!(
            namespace_outcome(size.clone()),
            size,
            "left to the splitter"
        );
        assert!(too_large(&size).is_some());
        assert!(too_large(&svc(413, "")).is_some());
        assert!(too_large(&svc(403, "Quota exceeded")).is_none());
        assert_eq!(namespace_outcome(svc(401, "x")), svc(401, "x"));
    }
}
