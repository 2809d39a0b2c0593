//! Destinations named by Azure resource id, as Event Grid namespaces name them
//! (`properties.resourceId`: an Event Hub to push to, a storage account for blob dead letters).
//! gridlet cannot use Azure's managed identities on a device, so each id resolves through
//! `outbound__resources` to a connection string held in the settings.
//!
//! The subscription keeps the resource id and never the connection string: the id is resolved
//! when the destination is parsed (an id missing from the settings is a 400 naming it) and
//! again when its record is read back at start-up, so a key rotated in the settings applies
//! after a restart without touching a subscription. The types that take a `resourceId`
//! (`EventHub`, `StorageBlob`) read the connection string as if it had been given and echo the
//! id in its place.

use crate::config::{Key, Resources};
use crate::model::destination::{Destination, DestinationRecord, DestinationTypes, Role};
use crate::model::json::Obj;
use crate::model::Invalid;
use serde_json::{Map, Value};

/// `props` with the connection string of its `resourceId` added, when it names a resource and
/// gives no connection string itself (`id_key`, `cs_key`: the keys as spelled in `props`).
/// `Ok(None)`: nothing to resolve.
///
/// # Errors
/// The id is not in `outbound__resources` (the message names it).
pub fn resolve(
    props: &Map<String, Value>,
    id_key: &str,
    cs_key: &str,
    resources: &Resources,
) -> Result<Option<Map<String, Value>>, String> {
    let Some(Value::String(id)) = props.get(id_key) else {
        return Ok(None);
    };
    if props.contains_key(cs_key) {
        return Ok(None);
    }
    let cs = resources.get(id).ok_or_else(|| {
        format!(
            "resourceId '{id}' is not configured: add it to {} with its connection string",
            Key::outbound__resources.name()
        )
    })?;
    let mut with = props.clone();
    with.insert(cs_key.to_string(), Value::String(cs.to_string()));
    Ok(Some(with))
}

/// A resource id given on a destination (`props` lowercase-keyed), for the types that take one.
///
/// # Errors
/// Not a string.
pub fn given_id(props: &Obj<'_>) -> Result<Option<String>, Invalid> {
    Ok(props
        .str("resourceid")?
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string))
}

/// The destination types with records read back through `outbound__resources`
/// ([`DestinationTypes::restore`] otherwise reads a record without the settings).
pub struct Resolving<'a> {
    /// The types.
    pub types: &'a dyn DestinationTypes,
    /// `outbound__resources`.
    pub resources: &'a Resources,
}

impl DestinationTypes for Resolving<'_> {
    fn parse(
        &self,
        endpoint_type: &str,
        props: &Obj<'_>,
        cfg: &crate::config::Config,
        role: Role,
    ) -> Result<Destination, Invalid> {
        self.types.parse(endpoint_type, props, cfg, role)
    }

    fn restore(&self, record: &DestinationRecord) -> Result<Destination, String> {
        match resolve(
            &record.properties,
            "resourceId",
            "connectionString",
            self.resources,
        )? {
            None => self.types.restore(record),
            Some(properties) => self.types.restore(&DestinationRecord {
                endpoint_type: record.endpoint_type.clone(),
                properties,
            }),
        }
    }
}
