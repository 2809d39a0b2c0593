//! `endpointType: EventHub`, `ServiceBusQueue`, `ServiceBusTopic`: batch-send over the
//! services' REST interface ([`crate::outbound::azure::bus::MessagingSink`]). The three
//! types differ only in name, so one file declares them (three registry lines).
//!
//! Properties: `connectionString` or, as Event Grid namespaces name an Event Hub, `resourceId`
//! resolved through `outbound__resources` ([`super::resources`]; the id is echoed and stored,
//! the connection string never is) (required, entity-level: `EntityPath`; parsed at PUT so a bad
//! one is a 400 naming the part; secret: its key and signature parts) and
//! `maxBatchSizeInKilobytes` (optional, 1–1024: the namespace tier's batch limit; default the
//! Standard tier's, 256 for Service Bus, 1024 for Event Hubs). Health: by the entity's URL (no
//! credentials). No dead letters. `deliveryAttributeMappings` (static or dynamic) become
//! message properties: Event Grid's reserved names (`PartitionKey`; Service Bus also
//! `MessageId`, `SessionId`, `CorrelationId`, `Label`, `ReplyTo`, `ReplyToSessionId`, `To`,
//! `ViaPartitionKey`) broker properties, every other name an application property.

use super::{resources, DestinationKind, ParseContext, SinkContext};
use crate::delivery::sink::Sink;
use crate::model::attributes::AttributeTarget;
use crate::model::azure::{MessagingAuth, MessagingConn};
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::sas::expiry as sas_expiry;
use crate::model::subscription::Subscription;
use crate::outbound::azure::bus::{MessagingLimits, MessagingSink, Service};
use serde_json::{json, Map, Value};
use std::sync::Arc;

const SECRETS: [SecretProperty; 2] = [
    SecretProperty::new("connectionString", SecretKind::ConnectionString),
    SecretProperty::new("deliveryAttributeMappings", SecretKind::AttributeMappings),
];

/// One messaging type.
pub struct Messaging {
    names: &'static [&'static str],
    service: Service,
}

/// Azure Event Hubs.
pub const EVENT_HUB: Messaging = Messaging {
    names: &["EventHub"],
    service: Service::EventHubs,
};
/// Azure Service Bus queue.
pub const SERVICE_BUS_QUEUE: Messaging = Messaging {
    names: &["ServiceBusQueue"],
    service: Service::ServiceBus,
};
/// Azure Service Bus topic.
pub const SERVICE_BUS_TOPIC: Messaging = Messaging {
    names: &["ServiceBusTopic"],
    service: Service::ServiceBus,
};

/// A parsed Event Hubs / Service Bus destination.
#[derive(Debug)]
pub struct MessagingDestination {
    /// The connection string as given, or as `outbound__resources` holds it for `resource_id`.
    connection_string: String,
    /// `resourceId` as given (echoed and stored in place of the connection string).
    resource_id: Option<String>,
    /// Parsed once at PUT.
    conn: MessagingConn,
    /// `{scheme}://{host}/{entity}`: SSRF checks and endpoint health.
    resource_uri: String,
    /// `maxBatchSizeInKilobytes` as given (echoed when set).
    max_batch_kib: Option<u64>,
    /// What one request may hold.
    limits: MessagingLimits,
    /// Which service (where delivery attributes go).
    limits_service: Service,
}

impl DestinationSpec for MessagingDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        match &self.resource_id {
            Some(id) => props.insert("resourceId".into(), json!(id)),
            None => props.insert("connectionString".into(), json!(self.connection_string)),
        };
        if let Some(k) = self.max_batch_kib {
            props.insert("maxBatchSizeInKilobytes".into(), json!(k));
        }
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.resource_uri)
    }
    fn credential_expiry(&self) -> Option<u64> {
        match &self.conn.auth {
            MessagingAuth::Token(t) => sas_expiry(t),
            MessagingAuth::Key { .. } => None,
        }
    }
    fn attributes(&self) -> Option<AttributeTarget> {
        Some(match self.limits_service {
            Service::EventHubs => AttributeTarget::EventHubs,
            Service::ServiceBus => AttributeTarget::ServiceBus,
        })
    }
}

impl Messaging {
    /// The destination a connection string and batch size make (no setting applies here).
    fn build(
        &self,
        cs: &str,
        resource_id: Option<String>,
        max_batch_kib: Option<u64>,
    ) -> Result<MessagingDestination, String> {
        let conn = MessagingConn::parse(cs).map_err(|e| e.to_string())?;
        Ok(MessagingDestination {
            connection_string: cs.to_string(),
            resource_id,
            resource_uri: conn.resource_uri(),
            conn,
            max_batch_kib,
            limits: MessagingLimits::from_kib(
                max_batch_kib.unwrap_or_else(|| self.service.default_batch_kib()),
            ),
            limits_service: self.service,
        })
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
        let max_batch_kib = props.int(
            "maxbatchsizeinkilobytes",
            "maxBatchSizeInKilobytes",
            1,
            1024,
        )?;
        let resource_id = resources::given_id(props)?;
        let what = match resource_id {
            Some(_) => "the connection string of resourceId (outbound__resources)",
            None => "connectionString",
        };
        let d = self
            .build(cs, resource_id, max_batch_kib)
            .map_err(|e| ctx.invalid(format!("{what}: {e}")))?;
        ctx.azure_endpoint(&d.resource_uri, "connectionString Endpoint")?;
        Ok(Destination::new(self.names[0], d))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        let max_batch_kib = props.get("maxBatchSizeInKilobytes").and_then(Value::as_u64);
        let resource_id = props
            .get("resourceId")
            .and_then(Value::as_str)
            .map(str::to_string);
        let d = self
            .build(
                stored_str(props, "connectionString")?,
                resource_id,
                max_batch_kib,
            )
            .map_err(|e| format!("connectionString: {e}"))?;
        Ok(Destination::new(self.names[0], d))
    }

    fn takes_resource_id(&self) -> bool {
        true
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<MessagingDestination>() else {
            return super::mismatched(self.names[0]);
        };
        Arc::new(MessagingSink::new(
            &ctx.azure_client,
            &d.conn,
            self.names[0],
            self.service,
            d.limits,
            sub.delivery.attributes.clone(),
        ))
    }

    fn example(&self, base: &str) -> Value {
        let host = base.split("://").nth(1).unwrap_or(base);
        json!({ "connectionString": format!(
            "Endpoint=sb://{host}/;SharedAccessKeyName=send;SharedAccessKey={}-key-secret;EntityPath=entity;UseDevelopmentEmulator=true",
            self.names[0]
        ),
        "deliveryAttributeMappings": [
            {"name": "Tenant", "type": "Static",
             "properties": {"value": format!("{}-attribute-secret", self.names[0]), "isSecret": true}},
            {"name": "PartitionKey", "type": "Dynamic", "properties": {"sourceField": "subject"}}
        ] })
    }
}
