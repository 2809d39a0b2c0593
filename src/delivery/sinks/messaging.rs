//! `endpointType: EventHub`, `ServiceBusQueue`, `ServiceBusTopic`: batch-send over the
//! services' REST interface ([`crate::delivery::azure::messaging::MessagingSink`]). The three
//! types differ only in name, so one file declares them (three registry lines).
//!
//! Properties: `connectionString` (required, entity-level: `EntityPath`; parsed at PUT so a bad
//! one is a 400 naming the part; secret: its key and signature parts). Health: by the entity's
//! URL (no credentials). No dead letters.

use super::{DestinationKind, ParseContext, SinkContext};
use crate::delivery::azure::messaging::MessagingSink;
use crate::delivery::sink::Sink;
use crate::model::azure::MessagingConn;
use crate::model::destination::{
    Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use serde_json::{json, Map, Value};
use std::sync::Arc;

const SECRETS: [SecretProperty; 1] = [SecretProperty::new(
    "connectionString",
    SecretKind::ConnectionString,
)];

/// One messaging type.
pub struct Messaging {
    names: &'static [&'static str],
}

/// Azure Event Hubs.
pub const EVENT_HUB: Messaging = Messaging {
    names: &["EventHub"],
};
/// Azure Service Bus queue.
pub const SERVICE_BUS_QUEUE: Messaging = Messaging {
    names: &["ServiceBusQueue"],
};
/// Azure Service Bus topic.
pub const SERVICE_BUS_TOPIC: Messaging = Messaging {
    names: &["ServiceBusTopic"],
};

/// A parsed Event Hubs / Service Bus destination.
#[derive(Debug)]
pub struct MessagingDestination {
    /// The connection string as given (stored and echoed).
    connection_string: String,
    /// Parsed once at PUT.
    conn: MessagingConn,
    /// `{scheme}://{host}/{entity}`: SSRF checks and endpoint health.
    resource_uri: String,
}

impl DestinationSpec for MessagingDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        props.insert("connectionString".into(), json!(self.connection_string));
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.resource_uri)
    }
}

impl DestinationKind for Messaging {
    fn names(&self) -> &'static [&'static str] {
        self.names
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let cs = ctx.required(props, "connectionstring", "connectionString")?;
        let conn =
            MessagingConn::parse(cs).map_err(|e| ctx.invalid(format!("connectionString: {e}")))?;
        let resource_uri = conn.resource_uri();
        ctx.azure_endpoint(&resource_uri, "connectionString Endpoint")?;
        Ok(Destination::new(
            self.names[0],
            MessagingDestination {
                connection_string: cs.to_string(),
                conn,
                resource_uri,
            },
        ))
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<MessagingDestination>() else {
            return super::mismatched(self.names[0]);
        };
        Arc::new(MessagingSink::new(
            &ctx.azure_client,
            &d.conn,
            self.names[0],
        ))
    }

    fn example(&self, base: &str) -> Value {
        let host = base.split("://").nth(1).unwrap_or(base);
        json!({ "connectionString": format!(
            "Endpoint=sb://{host}/;SharedAccessKeyName=send;SharedAccessKey={}-key-secret;EntityPath=entity;UseDevelopmentEmulator=true",
            self.names[0]
        ) })
    }
}
