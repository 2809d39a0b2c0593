//! `endpointType: StorageBlob`, as a `deadLetterDestination` only (Event Grid cloud's shape):
//! dead letters are written as blobs in Event Grid's layout and content, or gridlet's own
//! record with `deadLetterFormat: gridlet`
//! ([`crate::outbound::azure::storage::BlobDeadLetterSink`]).
//!
//! Properties: `blobContainerName` (required, container naming rules), `connectionString` or,
//! as Event Grid namespaces name a storage account, `resourceId` resolved through
//! `outbound__resources` ([`super::resources`]; the id is stored, never the connection string)
//! (required, account-level; parsed at PUT; secret: its key and signature parts). Health: not
//! tracked (dead-letter forwarding has its own retries).

use super::storagequeue::{account_example, SECRETS};
use super::{resources, DestinationKind, ParseContext, SinkContext};
use crate::delivery::sink::Sink;
use crate::model::azure::{check_container_name, StorageConn};
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use crate::outbound::azure::blobletters::BlobFormat;
use crate::outbound::azure::storage::BlobDeadLetterSink;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The type.
pub struct StorageBlob;

/// A parsed StorageBlob dead-letter destination.
#[derive(Debug)]
pub struct StorageBlobDestination {
    container: String,
    /// As given, or as `outbound__resources` holds it for `resource_id`.
    connection_string: String,
    /// `resourceId` as given (echoed and stored in place of the connection string).
    resource_id: Option<String>,
    conn: StorageConn,
    /// `{blob endpoint}/{container}`: SSRF checks.
    container_url: String,
    /// `deadLetterFormat` as given (`None`: Event Grid's).
    format: Option<BlobFormat>,
}

impl DestinationSpec for StorageBlobDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        match &self.resource_id {
            Some(id) => props.insert("resourceId".into(), json!(id)),
            None => props.insert("connectionString".into(), json!(self.connection_string)),
        };
        props.insert("blobContainerName".into(), json!(self.container));
        if let Some(f) = self.format {
            props.insert("deadLetterFormat".into(), json!(f.as_str()));
        }
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.container_url)
    }
    fn health_key(&self) -> Option<&str> {
        None
    }
}

impl DestinationKind for StorageBlob {
    fn names(&self) -> &'static [&'static str] {
        &["StorageBlob"]
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let container = ctx.required(props, "blobcontainername", "blobContainerName")?;
        check_container_name(container).map_err(|e| ctx.invalid(e.to_string()))?;
        let format = match props.str("deadletterformat")? {
            None => None,
            Some(v) => Some(
                BlobFormat::parse(v)
                    .ok_or_else(|| ctx.invalid("deadLetterFormat must be eventGrid or gridlet"))?,
            ),
        };
        let cs = ctx.required(props, "connectionstring", "connectionString")?;
        let resource_id = resources::given_id(props)?;
        let what = match resource_id {
            Some(_) => "the connection string of resourceId (outbound__resources)",
            None => "connectionString",
        };
        let d = build(container, cs, resource_id, format)
            .map_err(|e| ctx.invalid(format!("{what}: {e}")))?;
        ctx.azure_endpoint(&d.container_url, "connectionString blob endpoint")?;
        Ok(Destination::new("StorageBlob", d))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        let format = match props.get("deadLetterFormat").and_then(Value::as_str) {
            None => None,
            Some(f) => Some(BlobFormat::parse(f).ok_or("deadLetterFormat is unknown")?),
        };
        let container = stored_str(props, "blobContainerName")?;
        let resource_id = props
            .get("resourceId")
            .and_then(Value::as_str)
            .map(str::to_string);
        let d = build(
            container,
            stored_str(props, "connectionString")?,
            resource_id,
            format,
        )
        .map_err(|e| format!("connectionString: {e}"))?;
        Ok(Destination::new("StorageBlob", d))
    }

    fn delivery(&self) -> bool {
        false
    }

    fn dead_letter(&self) -> bool {
        true
    }

    fn takes_resource_id(&self) -> bool {
        true
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<StorageBlobDestination>() else {
            return super::mismatched("StorageBlob");
        };
        Arc::new(BlobDeadLetterSink::new(
            &ctx.azure_client,
            &d.conn,
            &d.container,
            d.format.unwrap_or_default(),
        ))
    }

    fn example(&self, base: &str) -> Value {
        json!({
            "blobContainerName": "deadletters",
            "connectionString": account_example(base, "storageblob"),
        })
    }
}

/// The destination a container name, connection string and format make (no setting applies
/// here).
fn build(
    container: &str,
    cs: &str,
    resource_id: Option<String>,
    format: Option<BlobFormat>,
) -> Result<StorageBlobDestination, String> {
    let conn = StorageConn::parse(cs).map_err(|e| e.to_string())?;
    if conn.blob_endpoint.is_empty() {
        return Err("a SharedAccessSignature string needs BlobEndpoint=…".into());
    }
    Ok(StorageBlobDestination {
        container_url: format!("{}/{container}", conn.blob_endpoint),
        container: container.to_string(),
        connection_string: cs.to_string(),
        resource_id,
        conn,
        format,
    })
}
