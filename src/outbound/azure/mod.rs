//! Azure destinations over their documented HTTPS REST interfaces: Event Hubs, Service Bus
//! queues and topics ([`messaging`]), Storage queues and blob dead letters ([`storage`]).
//!
//! They are ordinary [`crate::delivery::sink::Sink`]s: the dispatcher batches, budgets, retries,
//! dead-letters and measures them exactly as it does webhooks. Each sink only sends and reports
//! one [`Outcome`] per delivery batch, mapped from the service's answer by [`outcome`]:
//!
//! | answer | outcome (the decision is [`crate::delivery::classify::classify`]'s) |
//! |---|---|
//! | 200–204 (201 is the services' success) | delivered |
//! | 401, 404, 410 | failed with the service's error text: a configuration fault (warn, `gridlet_destination_faults_total`), retried |
//! | 400, 403 | failed with the error text: not retried, as Event Grid does for Azure resources |
//! | 413 (and Service Bus's 403 "message too large") | the messaging sink splits the batch; a single event is [`FailureKind::TooLarge`] (dead-lettered at once) |
//! | 429, 500, 503 | failed, `Retry-After` honoured |
//! | other statuses | failed with the error text |
//! | timeout, connection error | failed, retried |
//!
//! A batch that needs several requests (split by size, or one Put Message per event) reports
//! each event's own outcome ([`Outcome::PerEvent`]): events a service accepted are delivered,
//! an oversized one is dead-lettered alone, the rest are retried.

pub(crate) mod blobletters;
pub(crate) mod bus;
pub(crate) mod namespace;
pub(crate) mod sas;
pub mod sharedkey;
pub mod storage;

use super::http::{HttpError, HttpResponse};
use super::post::parse_retry_after;
use crate::delivery::sink::{DeliveryRequest, FailureKind, Outcome};
use bytes::Bytes;
use std::time::SystemTime;

/// Longest service error text kept (characters).
const MAX_ERROR_TEXT: usize = 300;

/// Wall time, Unix seconds (token expiry, `x-ms-date`).
pub fn wall_now() -> SystemTime {
    // Tokens and Shared Key dates are wall-clock by definition.
    #[allow(clippy::disallowed_methods)]
    SystemTime::now()
}

/// Unix seconds of [`wall_now`].
pub fn unix_now() -> u64 {
    wall_now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The outcome of one request to an Azure service for attempt `req`. `what` names the
/// destination in the log; the warning lines name the attempt's trace.
pub fn outcome(r: Result<HttpResponse, HttpError>, what: &str, req: &DeliveryRequest) -> Outcome {
    let (trace_id, span_id) = req.trace.log_ids();
    match r {
        Ok(resp) => {
            let status = resp.status.as_u16();
            if (200..=204).contains(&status) {
                return Outcome::Delivered;
            }
            let message = error_text(&resp.error_body);
            match status {
                401 | 404 | 410 => {
                    tracing::warn!(destination = what, status, error = %message, trace_id, span_id, "Azure destination configuration fault (retried): check the connection string's key and the entity");
                }
                400 | 403 | 413 => {
                    tracing::warn!(destination = what, status, error = %message, trace_id, span_id, "Azure destination refused the request; not retried (Event Grid's rule for Azure resources)");
                }
                _ => {}
            }
            Outcome::Failed {
                kind: FailureKind::Service { status, message },
                retry_after: parse_retry_after(&resp.headers, wall_now()),
            }
        }
        Err(HttpError::Timeout) => Outcome::failed(FailureKind::Timeout),
        Err(HttpError::Connect(_)) => Outcome::failed(FailureKind::Connect),
        Err(HttpError::Other(m)) => Outcome::failed(FailureKind::Other(m)),
    }
}

/// A credential past its expiry (`expiry`, Unix seconds, of a connection string's ready-made
/// shared access signature): the outcome that reports it without sending attempt `req`, logged
/// at warn (the line names the attempt's trace).
pub fn expired(expiry: Option<u64>, what: &str, req: &DeliveryRequest) -> Option<Outcome> {
    let se = expiry.filter(|se| *se <= unix_now())?;
    let at = crate::delivery::deadletter::rfc3339(se.saturating_mul(1000));
    let (trace_id, span_id) = req.trace.log_ids();
    tracing::warn!(destination = what, expired = %at, trace_id, span_id, "the connection string's SharedAccessSignature has expired; not sent (replace the connection string)");
    Some(Outcome::failed(FailureKind::CredentialExpired(format!(
        "the connection string's SharedAccessSignature for {what} expired at {at}; replace the connection string"
    ))))
}

/// The readable part of an error body: Azure answers XML (`<Error><Code>…</Code><Message>…`
/// for Storage, `<Error><Code>401</Code><Detail>…` for Service Bus); the tags' text is joined
/// and cut to [`MAX_ERROR_TEXT`] characters.
pub fn error_text(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => {
                in_tag = true;
                if !out.ends_with(' ') && !out.is_empty() {
                    out.push(' ');
                }
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(if c.is_whitespace() { ' ' } else { c }),
            _ => {}
        }
    }
    let mut t: String = out.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((i, _)) = t.char_indices().nth(MAX_ERROR_TEXT) {
        t.truncate(i);
    }
    t
}

/// Send each group of `bodies` (event indices, in order) as one JSON array through `post`,
/// noting each sent event's outcome in `each`. A group the service refuses as too large
/// (`too_large` reads the answer) is sent again as its two halves; a single event refused so
/// becomes `oversized(i, text)`. Any other failure is the outcome of that group and of every
/// group not yet sent (they would fail alike). Event Hubs, Service Bus and Event Grid
/// namespaces batch this way.
pub(crate) async fn send_in_groups<Fut>(
    mut todo: Vec<Vec<usize>>,
    bodies: &[Bytes],
    each: &mut [Option<Outcome>],
    mut post: impl FnMut(Bytes) -> Fut,
    too_large: fn(&Outcome) -> Option<&str>,
    oversized: impl Fn(usize, &str) -> Outcome,
) where
    Fut: std::future::Future<Output = Outcome>,
{
    todo.reverse();
    while let Some(g) = todo.pop() {
        let part: Vec<Bytes> = g.iter().map(|&i| bodies[i].clone()).collect();
        let o = post(crate::delivery::sink::json_array(&part)).await;
        if o == Outcome::Delivered {
            for &i in &g {
                each[i] = Some(Outcome::Delivered);
            }
        } else if let Some(text) = too_large(&o) {
            if let [i] = g[..] {
                each[i] = Some(oversized(i, text));
            } else {
                let (a, b) = g.split_at(g.len() / 2);
                todo.push(b.to_vec());
                todo.push(a.to_vec());
            }
        } else {
            for i in g.into_iter().chain(todo.drain(..).flatten()) {
                each[i] = Some(o.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_keeps_the_words_of_an_xml_error() {
        let b = b"<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthenticationFailed</Code><Message>Server failed to authenticate the request.\nRequestId:1</Message></Error>";
        assert_eq!(
            error_text(b),
            "AuthenticationFailed Server failed to authenticate the request. RequestId:1"
        );
        assert_eq!(error_text(b"plain words"), "plain words");
        assert_eq!(error_text(&[b'x'; 5000]).len(), MAX_ERROR_TEXT);
    }
}
