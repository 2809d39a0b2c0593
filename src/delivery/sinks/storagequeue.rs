//! `endpointType: StorageQueue`: one Put Message per event
//! ([`crate::delivery::azure::storage::StorageQueueSink`]).
//!
//! Properties: `queueName` (required, Storage naming rules), `connectionString` (required,
//! account-level; parsed at PUT; secret: its key and signature parts), `messageEncoding`
//! (`base64`, the default, or `text`). Health: by the queue's URL. No dead letters.

use super::{DestinationKind, ParseContext, SinkContext};
use crate::delivery::azure::storage::StorageQueueSink;
use crate::delivery::sink::Sink;
use crate::model::azure::{check_queue_name, MessageEncoding, StorageConn};
use crate::model::destination::{
    Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
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
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.queue_url)
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
        let cs = ctx.required(props, "connectionstring", "connectionString")?;
        let conn =
            StorageConn::parse(cs).map_err(|e| ctx.invalid(format!("connectionString: {e}")))?;
        let queue_url = format!("{}/{queue_name}", conn.queue_endpoint);
        ctx.azure_endpoint(&queue_url, "connectionString queue endpoint")?;
        Ok(Destination::new(
            "StorageQueue",
            StorageQueueDestination {
                queue_url,
                queue_name: queue_name.to_string(),
                connection_string: cs.to_string(),
                message_encoding,
                conn,
            },
        ))
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
        ))
    }

    fn example(&self, base: &str) -> Value {
        json!({
            "queueName": "events",
            "connectionString": account_example(base, "storagequeue"),
        })
    }
}

/// A storage account string for `base` with a distinct (base64) key per `who`.
pub(super) fn account_example(base: &str, who: &str) -> String {
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.encode(format!("{who}-account-key-secret"));
    format!("DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};QueueEndpoint={base}/acct;BlobEndpoint={base}/acct")
}
