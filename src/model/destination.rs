//! A subscription's destination as the model sees it: an opaque, parsed value ([`Destination`])
//! that knows its `endpointType`, how it echoes its properties, which of them are secret, and
//! the URL it delivers to (if any).
//!
//! The destination types themselves live in `outbound::sinks` (one file each, one registry);
//! the model only sees them through [`DestinationSpec`] (a parsed value) and [`DestinationTypes`]
//! (the parser), so the model never depends on delivery.
//!
//! Secrets: every destination declares its secret properties ([`SecretProperty`]); the stored
//! record keeps them, every output meant for people or the cloud (GET, the module twin, logs)
//! goes through [`mask_properties`] or [`mask_url`]. A masked value is `null` (as Event Grid
//! cloud returns the value of an `isSecret` delivery attribute), or, for URLs and connection
//! strings, the same text with only the secret parts replaced by `***`.

pub use super::attributes::AttributeTarget;
use super::json::Obj;
use super::Invalid;
use crate::config::Config;
pub use crate::redact::{mask_path, mask_url};
use crate::redact::{token_like, MASK};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A bad destination: the model's [`Invalid`] with the code [`Role::invalid`] gives it (a 400
/// naming the field on the wire). The destination types in `outbound::sinks` name it by this alias.
pub type DestinationError = Invalid;

/// How a secret property is masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    /// The whole value (string, array, object) is secret: masked as `null`.
    Whole,
    /// A URL: its password (or a lone user name) and key-bearing query values are secret.
    Url,
    /// A `Key=Value;…` connection string: key, signature and password parts are secret.
    ConnectionString,
    /// `deliveryAttributeMappings`: the `value` of each item marked `isSecret: true`.
    AttributeMappings,
}

/// One secret property of a destination's `properties` (its echoed, camelCase name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretProperty {
    /// The property name as echoed, e.g. `sasKey`.
    pub name: &'static str,
    /// How it is masked.
    pub kind: SecretKind,
}

impl SecretProperty {
    /// A secret property.
    pub const fn new(name: &'static str, kind: SecretKind) -> Self {
        Self { name, kind }
    }
}

/// A parsed destination of one type (implemented next to the type in `outbound::sinks`).
pub trait DestinationSpec: Any + fmt::Debug + Send + Sync {
    /// Echo the properties as stored (secrets in clear; [`mask_properties`] masks them).
    fn echo(&self, props: &mut Map<String, Value>);
    /// The secret properties among those [`DestinationSpec::echo`] writes.
    fn secrets(&self) -> &'static [SecretProperty];
    /// The URL deliveries go to (HTTP destinations); logs show it through [`mask_url`].
    fn url(&self) -> Option<&str> {
        None
    }
    /// What endpoint health is tracked by (`None`: not tracked).
    fn health_key(&self) -> Option<&str> {
        self.url()
    }
    /// Whether `signingSecrets` apply (HTTP POSTs of events).
    fn webhook_options(&self) -> bool {
        false
    }
    /// When a ready-made credential in the properties expires (Unix seconds; a connection
    /// string's `SharedAccessSignature`), if there is one.
    fn credential_expiry(&self) -> Option<u64> {
        None
    }
    /// Where `deliveryAttributeMappings` go (`None`: not taken). Webhook-like destinations:
    /// headers.
    fn attributes(&self) -> Option<AttributeTarget> {
        self.webhook_options().then_some(AttributeTarget::Headers)
    }
}

/// A destination: its canonical `endpointType` and its parsed properties.
#[derive(Clone)]
pub struct Destination {
    endpoint_type: &'static str,
    spec: Arc<dyn DestinationSpec>,
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The masked echo: `Debug` output ends up in logs.
        write!(
            f,
            "{} {}",
            self.endpoint_type,
            Value::Object(self.properties(true))
        )
    }
}

impl PartialEq for Destination {
    fn eq(&self, other: &Self) -> bool {
        self.endpoint_type == other.endpoint_type
            && self.properties(false) == other.properties(false)
    }
}

impl Eq for Destination {}

impl Destination {
    /// Wrap a parsed value of type `endpoint_type` (canonical name).
    pub fn new(endpoint_type: &'static str, spec: impl DestinationSpec) -> Self {
        Self {
            endpoint_type,
            spec: Arc::new(spec),
        }
    }

    /// Canonical `endpointType`.
    pub fn endpoint_type(&self) -> &'static str {
        self.endpoint_type
    }

    /// The parsed value as its concrete type (for the type's sink builder).
    pub fn spec<T: DestinationSpec>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.spec;
        any.downcast_ref::<T>()
    }

    /// The URL deliveries go to, for HTTP destinations (SSRF checks, logs through [`mask_url`]).
    pub fn url(&self) -> Option<&str> {
        self.spec.url()
    }

    /// What endpoint health is tracked by (`None`: not tracked).
    pub fn health_key(&self) -> Option<&str> {
        self.spec.health_key()
    }

    /// Whether `signingSecrets` apply.
    pub fn webhook_options(&self) -> bool {
        self.spec.webhook_options()
    }

    /// When a ready-made credential in the properties expires (Unix seconds), if there is one.
    pub fn credential_expiry(&self) -> Option<u64> {
        self.spec.credential_expiry()
    }

    /// Where `deliveryAttributeMappings` go, if they apply.
    pub fn attributes(&self) -> Option<AttributeTarget> {
        self.spec.attributes()
    }

    /// The secret properties of this destination.
    pub fn secrets(&self) -> &'static [SecretProperty] {
        self.spec.secrets()
    }

    /// The properties, secrets masked when `masked`.
    pub fn properties(&self, masked: bool) -> Map<String, Value> {
        let mut m = Map::new();
        self.spec.echo(&mut m);
        if masked {
            mask_properties(&mut m, self.secrets());
        }
        m
    }

    /// `{"endpointType": …, "properties": …}`, secrets masked when `masked`.
    pub fn to_json(&self, masked: bool) -> Value {
        let mut m = Map::new();
        m.insert("endpointType".into(), Value::from(self.endpoint_type));
        m.insert("properties".into(), Value::Object(self.properties(masked)));
        Value::Object(m)
    }
}

/// What a destination is parsed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `properties.destination`.
    Delivery,
    /// `properties.deadLetterDestination`.
    DeadLetter,
}

impl Role {
    /// The documented rejection of a bad destination of this role, naming the field in `msg`.
    pub fn invalid(self, msg: impl Into<String>) -> Invalid {
        match self {
            Self::Delivery => Invalid::new(
                "InvalidDestination",
                format!(
                    "EventSubscription.Properties.Destination failed validation. Reason: {}",
                    msg.into()
                ),
            ),
            Self::DeadLetter => Invalid::new(
                "InvalidDeadLetterDestination",
                format!(
                    "EventSubscription.Properties.DeadLetterDestination failed validation. Reason: {}",
                    msg.into()
                ),
            ),
        }
    }
}

/// The destination types a build knows (`outbound::sinks::Registry` in production).
pub trait DestinationTypes: Sync {
    /// Parse `props` (lowercased keys) as a destination of `endpoint_type` (any case) for `role`.
    ///
    /// # Errors
    /// [`Invalid`] ([`Role::invalid`]) naming the bad field, or listing the accepted types.
    fn parse(
        &self,
        endpoint_type: &str,
        props: &Obj<'_>,
        cfg: &Config,
        role: Role,
    ) -> Result<Destination, Invalid>;

    /// The destination a metadata record holds, read back by its type without the settings
    /// (the rules for new destinations were met when it was created).
    ///
    /// # Errors
    /// The type is unknown to this build, or the record lacks what the type needs.
    fn restore(&self, record: &DestinationRecord) -> Result<Destination, String>;
}

/// A stored destination's string property `name` (its echoed name).
///
/// # Errors
/// Missing or not a string.
pub fn stored_str<'a>(props: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    props
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{name} is missing"))
}

/// Mask `secrets` in `props` (echoed names) in place.
pub fn mask_properties(props: &mut Map<String, Value>, secrets: &[SecretProperty]) {
    for s in secrets {
        let Some(v) = props.get_mut(s.name) else {
            continue;
        };
        match (s.kind, &*v) {
            (_, Value::Null) => {}
            (SecretKind::Url, Value::String(u)) => *v = Value::String(mask_url(u)),
            (SecretKind::ConnectionString, Value::String(c)) => {
                *v = Value::String(mask_connection_string(c))
            }
            (SecretKind::AttributeMappings, Value::Array(_)) => mask_attribute_values(v),
            _ => *v = Value::Null,
        }
    }
}

fn mask_attribute_values(v: &mut Value) {
    let Value::Array(items) = v else { return };
    for item in items {
        let Some(p) = item.get_mut("properties").and_then(Value::as_object_mut) else {
            continue;
        };
        let secret = p
            .get("isSecret")
            .is_some_and(|s| s.as_bool() == Some(true) || s.as_str() == Some("true"));
        if secret {
            p.insert("value".into(), Value::Null);
        }
    }
}

fn secret_name(name: &str, parts: &[&str]) -> bool {
    let n = name.to_ascii_lowercase();
    parts.iter().any(|p| n.contains(p))
}

/// A `Key=Value;…` connection string with key, signature and password values replaced by `***`
/// (`SharedAccessKeyName`, `Endpoint`, `EntityPath`, `AccountName` stay readable).
pub fn mask_connection_string(cs: &str) -> String {
    cs.split(';')
        .map(|part| match part.split_once('=') {
            Some((k, _)) => {
                let n = k.trim().to_ascii_lowercase();
                let secret = (n.contains("key") && !n.ends_with("keyname"))
                    || secret_name(&n, &["signature", "secret", "password", "pwd", "token"]);
                if secret {
                    format!("{k}={MASK}")
                } else {
                    part.to_string()
                }
            }
            None => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// The secret text in `props` (echoed names) that masking hides: what must never appear in GET
/// output, the twin or logs.
pub fn secret_fragments(props: &Map<String, Value>, secrets: &[SecretProperty]) -> Vec<String> {
    let mut out = Vec::new();
    for s in secrets {
        let Some(v) = props.get(s.name) else { continue };
        match (s.kind, v) {
            (SecretKind::Url, Value::String(u)) => url_fragments(u, &mut out),
            (SecretKind::ConnectionString, Value::String(c)) => {
                for part in c.split(';') {
                    if let Some((_, val)) = part.split_once('=') {
                        if mask_connection_string(part) != part {
                            out.push(val.to_string());
                        }
                    }
                }
            }
            (SecretKind::AttributeMappings, Value::Array(items)) => {
                for item in items {
                    let p = item.get("properties");
                    let secret = p
                        .and_then(|p| p.get("isSecret"))
                        .is_some_and(|s| s.as_bool() == Some(true) || s.as_str() == Some("true"));
                    if let (true, Some(Value::String(val))) =
                        (secret, p.and_then(|p| p.get("value")))
                    {
                        out.push(val.clone());
                    }
                }
            }
            (_, v) => string_leaves(v, &mut out),
        }
    }
    out.retain(|f| !f.is_empty());
    out
}

fn url_fragments(url: &str, out: &mut Vec<String>) {
    let Ok(u) = url::Url::parse(url) else {
        out.push(url.to_string());
        return;
    };
    match u.password() {
        Some(p) => out.push(p.to_string()),
        None => out.push(u.username().to_string()),
    }
    for pair in u.query().unwrap_or_default().split('&') {
        if let Some((k, v)) = pair.split_once('=') {
            if !k.eq_ignore_ascii_case("api-version") {
                out.push(v.to_string());
            }
        }
    }
    out.extend(
        u.path()
            .split('/')
            .filter(|s| token_like(s))
            .map(String::from),
    );
}

fn string_leaves(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| string_leaves(v, out)),
        Value::Object(m) => m.values().for_each(|v| string_leaves(v, out)),
        _ => {}
    }
}

/// A destination as stored: its type and the type's own record of it (its properties, secrets
/// in clear: only the metadata store keeps them; `Debug` shows the property names only).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRecord {
    /// Canonical `endpointType`.
    pub endpoint_type: String,
    /// The properties as the type echoes them.
    pub properties: Map<String, Value>,
}

impl fmt::Debug for DestinationRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestinationRecord")
            .field("endpoint_type", &self.endpoint_type)
            .field("properties", &self.properties.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Destination {
    /// The stored form.
    pub fn to_record(&self) -> DestinationRecord {
        DestinationRecord {
            endpoint_type: self.endpoint_type().to_string(),
            properties: self.properties(false),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A stand-in registry for model tests (the real types live in `outbound::sinks`): a
    //! `WebHook` with `endpointUrl` (secret as a URL) and an `EdgeHub` with `outputName`; and
    //! the settings and topic subscription tests parse against.
    use super::*;
    use crate::model::topic::{EventSchema, Topic};

    /// Settings from `name=value` pairs (defaults for the rest).
    pub fn cfg(pairs: &[(&str, &str)]) -> Config {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
    }

    /// An EventGridSchema topic `t1`.
    pub fn topic() -> Topic {
        Topic {
            name: "t1".into(),
            input_schema: EventSchema::EventGrid,
            dedup_window_secs: None,
            event_retention_days: None,
        }
    }

    const HOOK_SECRETS: [SecretProperty; 3] = [
        SecretProperty::new("endpointUrl", SecretKind::Url),
        SecretProperty::new("signingSecrets", SecretKind::Whole),
        SecretProperty::new("deliveryAttributeMappings", SecretKind::AttributeMappings),
    ];

    #[derive(Debug)]
    struct Hook(String);
    impl DestinationSpec for Hook {
        fn echo(&self, props: &mut Map<String, Value>) {
            props.insert("endpointUrl".into(), Value::from(self.0.clone()));
        }
        fn secrets(&self) -> &'static [SecretProperty] {
            &HOOK_SECRETS
        }
        fn url(&self) -> Option<&str> {
            Some(&self.0)
        }
        fn webhook_options(&self) -> bool {
            true
        }
    }

    #[derive(Debug)]
    struct Output(String);
    impl DestinationSpec for Output {
        fn echo(&self, props: &mut Map<String, Value>) {
            props.insert("outputName".into(), Value::from(self.0.clone()));
        }
        fn secrets(&self) -> &'static [SecretProperty] {
            &[]
        }
    }

    /// The test registry.
    pub struct TestTypes;

    impl DestinationTypes for TestTypes {
        fn parse(
            &self,
            endpoint_type: &str,
            props: &Obj<'_>,
            _cfg: &Config,
            role: Role,
        ) -> Result<Destination, Invalid> {
            match endpoint_type.to_ascii_lowercase().as_str() {
                "webhook" => {
                    let u = props
                        .str("endpointurl")?
                        .ok_or_else(|| role.invalid("EndpointUrl is required"))?;
                    Ok(Destination::new("WebHook", Hook(u.to_string())))
                }
                "edgehub" if role == Role::Delivery => {
                    let o = props
                        .str("outputname")?
                        .ok_or_else(|| role.invalid("outputName is required"))?;
                    Ok(Destination::new("EdgeHub", Output(o.to_string())))
                }
                other => Err(role.invalid(format!("endpointType '{other}' is not supported"))),
            }
        }

        fn restore(&self, r: &DestinationRecord) -> Result<Destination, String> {
            match r.endpoint_type.as_str() {
                "WebHook" => Ok(Destination::new(
                    "WebHook",
                    Hook(stored_str(&r.properties, "endpointUrl")?.to_string()),
                )),
                "EdgeHub" => Ok(Destination::new(
                    "EdgeHub",
                    Output(stored_str(&r.properties, "outputName")?.to_string()),
                )),
                other => Err(format!("endpointType '{other}' is not known")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn urls_keep_everything_but_their_credentials() {
        assert_eq!(
            mask_url("https://user:pw@h.example/p?api-version=1&code=abc&sv=2020&sig=xyz"),
            "https://user:***@h.example/p?api-version=1&code=***&sv=***&sig=***"
        );
        assert_eq!(mask_url("https://tok@h.example/"), "https://***@h.example/");
        assert_eq!(mask_url("https://h.example/x"), "https://h.example/x");
        assert_eq!(mask_url("https://h.example:4430"), "https://h.example:4430");
        assert_eq!(mask_url("not a url"), "***");
    }

    /// Issue 20, Low 10: masked by rule, not by a list of names: every query value (but
    /// `api-version`) and every path segment that looks like a token.
    #[test]
    fn key_bearing_paths_and_every_query_value_are_masked() {
        for (url, secret) in [
            ("https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/aBcDeFgHiJkLmNoPqRsTuVwX", "aBcDeFgHiJkLmNoPqRsTuVwX"),
            ("https://contoso.webhook.office.com/webhookb2/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0@72f988bf-86f1-41af-91ab-2d7cd011db47/IncomingWebhook/5d1c8e0f2a3b4c5d6e7f8091a2b3c4d5/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "5d1c8e0f2a3b4c5d6e7f8091a2b3c4d5"),
            ("https://discord.com/api/webhooks/112233445566778899/AbC-dEf_GhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOpQrStUvWxYz01234", "AbC-dEf_GhIjKlMnOpQrStUvWxYz0123456789"),
            ("https://h.example/x?sas=opaque-sas-value", "opaque-sas-value"),
            ("https://h.example/x?hmac=deadbeef", "deadbeef"),
            ("https://h.example/x?s=abc&sig=xyz", "abc"),
            ("https://fn.azurewebsites.net/api/f?code=functionkey", "functionkey"),
        ] {
            let masked = mask_url(url);
            assert!(!masked.contains(secret), "{url} -> {masked}");
        }
        // Ordinary paths and the API version stay readable.
        assert_eq!(
            mask_url("https://h.example/api/events/order-created?api-version=2018-01-01"),
            "https://h.example/api/events/order-created?api-version=2018-01-01"
        );
    }

    #[test]
    fn connection_strings_keep_their_names() {
        assert_eq!(
            mask_connection_string(
                "Endpoint=sb://ns/;SharedAccessKeyName=send;SharedAccessKey=abc=;EntityPath=hub"
            ),
            "Endpoint=sb://ns/;SharedAccessKeyName=send;SharedAccessKey=***;EntityPath=hub"
        );
        assert_eq!(
            mask_connection_string("AccountName=a;AccountKey=k==;SharedAccessSignature=sv=1&sig=2"),
            "AccountName=a;AccountKey=***;SharedAccessSignature=***"
        );
    }

    #[test]
    fn properties_are_masked_by_declaration() {
        let mut p = json!({
            "sasKey": "k", "signingSecrets": ["whsec_a"], "topicName": null, "other": "x",
            "deliveryAttributeMappings": [
                {"name": "A", "properties": {"value": "open", "isSecret": false}},
                {"name": "B", "properties": {"value": "hidden", "isSecret": true}}]
        });
        let secrets = [
            SecretProperty::new("sasKey", SecretKind::Whole),
            SecretProperty::new("signingSecrets", SecretKind::Whole),
            SecretProperty::new("topicName", SecretKind::Whole),
            SecretProperty::new("deliveryAttributeMappings", SecretKind::AttributeMappings),
        ];
        let Value::Object(m) = &mut p else { panic!() };
        mask_properties(m, &secrets);
        assert_eq!(
            p,
            json!({
                "sasKey": null, "signingSecrets": null, "topicName": null, "other": "x",
                "deliveryAttributeMappings": [
                    {"name": "A", "properties": {"value": "open", "isSecret": false}},
                    {"name": "B", "properties": {"value": null, "isSecret": true}}]
            })
        );
    }
}
