//! `endpointType: StorageQueue`: one Put Message per event
//! ([`crate::outbound::azure::storage::StorageQueueSink`]).
//!
//! Properties: `queueName` (required, Storage naming rules), `connectionString` (required,
//! account-level; parsed at PUT; secret: its key and signature parts), `messageEncoding`
//! (`base64`, the default, or `text`), `queueMessageTimeToLiveInSeconds` (Event Grid's
//! property: seconds each message lives in the queue, -1 = never expires; Put Message's
//! `messagettl`; absent: the service's 7 days). Health: by the queue's URL. No dead letters.

use super::{DestinationKind, ParseContext, SinkContext};
use crate::delivery::sink::Sink;
use crate::model::azure::{check_queue_name, MessageEncoding, StorageConn};
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::sas::expiry as sas_expiry;
use crate::model::subscription::Subscription;
use crate::outbound::azure::storage::StorageQueueSink;
use serde_json::{json, Map, Value};
use std::sync::Arc;

pub(super) const SECRETS: [SecretProperty; 1] = [SecretProperty::new(
    "connectionString",
    SecretKind::ConnectionString,
)];

/// The type.
pub struct StorageQueue;

/// A parsed StorageQueue destination.
#[derive(Debug)]
pub struct StorageQueueDestination {
    queue_name: String,
    connection_string: String,
    /// `None` = not supplied (base64).
    message_encoding: Option<MessageEncoding>,
    /// `queueMessageTimeToLiveInSeconds` (-1 or 1..).
    message_ttl: Option<i64>,
    conn: StorageConn,
    /// `{queue endpoint}/{queue}`: SSRF checks and endpoint health.
    queue_url: String,
}

impl DestinationSpec for StorageQueueDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        props.insert("queueName".into(), json!(self.queue_name));
        props.insert("connectionString".into(), json!(self.connection_string));
        if let Some(e) = self.message_encoding {
            props.insert("messageEncoding".into(), json!(e.as_str()));
        }
        if let Some(t) = self.message_ttl {
            props.insert("queueMessageTimeToLiveInSeconds".into(), json!(t));
        }
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.queue_url)
    }
    fn credential_expiry(&self) -> Option<u64> {
        self.conn.sas.as_deref().and_then(sas_expiry)
    }
}

impl DestinationKind for StorageQueue {
    fn names(&self) -> &'static [&'static str] {
        &["StorageQueue"]
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let queue_name = ctx.required_for(props, "queuename", "queueName", "StorageQueue")?;
        check_queue_name(queue_name).map_err(|e| ctx.invalid(e.to_string()))?;
        let message_encoding = match props.str("messageencoding")? {
            None => None,
            Some(v) => Some(
                MessageEncoding::parse(v)
                    .ok_or_else(|| ctx.invalid("messageEncoding must be base64 or text"))?,
            ),
        };
        let message_ttl = match props.get("queuemessagetimetoliveinseconds") {
            None => None,
            Some(v) => Some(parse_ttl(v).ok_or_else(|| {
                ctx.invalid(
                    "queueMessageTimeToLiveInSeconds must be -1 (never expires) or a whole number of seconds from 1",
                )
            })?),
        };
        let cs = ctx.required(props, "connectionstring", "connectionString")?;
        let d = build(queue_name, cs, message_encoding, message_ttl)
            .map_err(|e| ctx.invalid(format!("connectionString: {e}")))?;
        ctx.azure_endpoint(&d.queue_url, "connectionString queue endpoint")?;
        Ok(Destination::new("StorageQueue", d))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        let encoding = match props.get("messageEncoding").and_then(Value::as_str) {
            None => None,
            Some(e) => Some(MessageEncoding::parse(e).ok_or("messageEncoding is unknown")?),
        };
        let ttl = props
            .get("queueMessageTimeToLiveInSeconds")
            .and_then(Value::as_i64);
        let queue = stored_str(props, "queueName")?;
        let d = build(queue, stored_str(props, "connectionString")?, encoding, ttl)
            .map_err(|e| format!("connectionString: {e}"))?;
        Ok(Destination::new("StorageQueue", d))
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<StorageQueueDestination>() else {
            return super::mismatched("StorageQueue");
        };
        Arc::new(StorageQueueSink::new(
            &ctx.azure_client,
            &d.conn,
            &d.queue_name,
            d.message_encoding.unwrap_or_default(),
            d.message_ttl,
        ))
    }

    fn example(&self, base: &str) -> Value {
        json!({
            "queueName": "events",
            "connectionString": account_example(base, "storagequeue"),
        })
    }
}

/// The destination a queue name, connection string and message options make (no setting
/// applies here).
fn build(
    queue_name: &str,
    cs: &str,
    message_encoding: Option<MessageEncoding>,
    message_ttl: Option<i64>,
) -> Result<StorageQueueDestination, String> {
    let conn = StorageConn::parse(cs).map_err(|e| e.to_string())?;
    if conn.queue_endpoint.is_empty() {
        return Err("a SharedAccessSignature string needs QueueEndpoint=…".into());
    }
    Ok(StorageQueueDestination {
        queue_url: format!("{}/{queue_name}", conn.queue_endpoint),
        queue_name: queue_name.to_string(),
        connection_string: cs.to_string(),
        message_encoding,
        message_ttl,
        conn,
    })
}

/// `queueMessageTimeToLiveInSeconds`: -1, or 1 to `i32::MAX` seconds (a number, or a numeric
/// string as twins send them).
fn parse_ttl(v: &Value) -> Option<i64> {
    let n = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    }?;
    (n == -1 || (1..=i64::from(i32::MAX)).contains(&n)).then_some(n)
}

/// A storage account string for `base` with a distinct (base64) key per `who`.
pub(super) fn account_example(base: &str, who: &str) -> String {
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.encode(format!("{who}-account-key-secret"));
    format!("DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};QueueEndpoint={base}/acct;BlobEndpoint={base}/acct")
}
