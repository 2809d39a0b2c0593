//! `endpointType: EventGrid`: a cloud Event Grid topic, in either of its two forms, chosen by
//! `endpointUrl`:
//!
//! * a **basic topic** (`…/api/events?api-version=2018-01-01`): POSTed to like a webhook with the
//!   `aeg-sas-key` header, every EventGridSchema event's `topic` rewritten to `topicName`;
//!   webhook options apply.
//! * a **namespace topic** (`…/topics/{topic}:publish?api-version=2024-06-01`, or `2023-11-01`):
//!   CloudEvents batches with `Authorization: SharedAccessKey` (`sasKey`) or
//!   `SharedAccessSignature` (`sasToken`); EventGridSchema events converted, `topicName` their
//!   `source` ([`crate::outbound::azure::namespace`]).
//!
//! Properties: `endpointUrl` (required; https unless `outbound__eventgrid__httpsOnly=false`,
//! host under an Event Grid cloud domain unless `outbound__eventgrid__allowInvalidHostnames=true`),
//! `sasKey` (secret; required for basic topics, it or `sasToken` for namespace topics),
//! `sasToken` (secret; namespace topics), `topicName` (optional). Health: by URL. No dead
//! letters.

use super::webhook::{webhook_sink, with_credentials, HTTP_SECRETS};
use super::{mismatched, DestinationKind, ParseContext, SinkContext};
use crate::config::Key;
use crate::delivery::sink::Sink;
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use crate::outbound::azure::namespace::{NamespaceAuth, NamespaceLimits, NamespaceSink};
use crate::outbound::post::TopicRewrite;
use serde_json::{json, Map, Value};
use std::sync::Arc;

const SECRETS: [SecretProperty; 4] = [
    HTTP_SECRETS[0],
    HTTP_SECRETS[1],
    HTTP_SECRETS[2],
    SecretProperty::new("sasKey", SecretKind::Whole),
];
/// A namespace topic's, with a key.
const NAMESPACE_KEY_SECRETS: [SecretProperty; 2] = [
    HTTP_SECRETS[0],
    SecretProperty::new("sasKey", SecretKind::Whole),
];
/// A namespace topic's, with a SAS token.
const NAMESPACE_TOKEN_SECRETS: [SecretProperty; 2] = [
    HTTP_SECRETS[0],
    SecretProperty::new("sasToken", SecretKind::Whole),
];

/// The data-plane versions of namespace topics' `:publish`.
const NAMESPACE_API_VERSIONS: [&str; 2] = ["2024-06-01", "2023-11-01"];

const CLOUD_DOMAINS: [&str; 3] = [
    "eventgrid.azure.net",
    "eventgrid.azure.us",
    "eventgrid.azure.cn",
];

/// The type.
pub struct EventGrid;

/// A parsed EventGrid destination.
#[derive(Debug)]
pub struct EventGridDestination {
    /// `https://<topic>.<region>.eventgrid.azure.net/api/events?api-version=2018-01-01`, or a
    /// namespace topic's `…/topics/<topic>:publish?api-version=2024-06-01`.
    pub endpoint_url: String,
    /// `aeg-sas-key` value (basic), or the namespace's access key.
    pub sas_key: String,
    /// A namespace SAS token (`r=…&e=…&s=…`), sent instead of a key.
    pub sas_token: Option<String>,
    /// Basic topics: rewrites every EventGridSchema event's `topic` (`None` nulls it).
    /// Namespace topics: the `source` of converted EventGridSchema events (`None`: their
    /// `topic`).
    pub topic_name: Option<String>,
}

impl EventGridDestination {
    /// Whether `endpoint_url` is a namespace topic's `:publish`.
    pub fn is_namespace(&self) -> bool {
        url::Url::parse(&self.endpoint_url).is_ok_and(|u| namespace_path(&u))
    }
}

/// `/topics/{topic}:publish`.
fn namespace_path(url: &url::Url) -> bool {
    let p = url.path();
    let lower = p.to_ascii_lowercase();
    lower.starts_with("/topics/")
        && lower.ends_with(":publish")
        && p.len() > "/topics/:publish".len()
        && !p["/topics/".len()..p.len() - ":publish".len()].contains('/')
}

impl DestinationSpec for EventGridDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        props.insert("endpointUrl".into(), json!(self.endpoint_url));
        match &self.sas_token {
            Some(t) => props.insert("sasToken".into(), json!(t)),
            None => props.insert("sasKey".into(), json!(self.sas_key)),
        };
        props.insert("topicName".into(), json!(self.topic_name));
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        match (self.is_namespace(), &self.sas_token) {
            (false, _) => &SECRETS,
            (true, None) => &NAMESPACE_KEY_SECRETS,
            (true, Some(_)) => &NAMESPACE_TOKEN_SECRETS,
        }
    }
    fn url(&self) -> Option<&str> {
        Some(&self.endpoint_url)
    }
    fn webhook_options(&self) -> bool {
        !self.is_namespace()
    }
}

impl DestinationKind for EventGrid {
    fn names(&self) -> &'static [&'static str] {
        &["EventGrid"]
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let raw = ctx.required(props, "endpointurl", "EndpointUrl")?;
        let url = ctx.outbound_url(raw, "EndpointUrl", false, "")?;
        let namespace = namespace_path(&url);
        if !namespace && !url.path().to_ascii_lowercase().contains("/api/events") {
            return Err(ctx.invalid(
                "EndpointUrl must target the /api/events API of an Azure Event Grid topic, or a namespace topic's /topics/{topic}:publish",
            ));
        }
        let versions: &[&str] = if namespace {
            &NAMESPACE_API_VERSIONS
        } else {
            &["2018-01-01"]
        };
        let has_version = url
            .query_pairs()
            .any(|(k, v)| k.eq_ignore_ascii_case("api-version") && versions.contains(&v.as_ref()));
        if !has_version {
            return Err(ctx.invalid(format!(
                "EndpointUrl must have the query api-version={}",
                versions.join(" or api-version=")
            )));
        }
        let out = &ctx.cfg.outbound;
        ctx.outbound_url(
            raw,
            "EndpointUrl",
            out.eventgrid_https_only,
            Key::outbound__eventgrid__httpsOnly.name(),
        )?;
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let azure = CLOUD_DOMAINS
            .iter()
            .any(|d| host.ends_with(&format!(".{d}")));
        if !azure && !out.eventgrid_allow_invalid_hostnames {
            return Err(ctx.invalid(format!(
                "EndpointUrl host must be under {}",
                CLOUD_DOMAINS.join(", ")
            )));
        }
        let sas_token = props
            .str("sastoken")?
            .filter(|t| !t.trim().is_empty())
            .map(str::to_string);
        let sas_key = match (&sas_token, namespace) {
            (Some(_), false) => {
                return Err(ctx.invalid(
                    "sasToken is for namespace topics (/topics/{topic}:publish); a basic topic takes sasKey",
                ))
            }
            (Some(_), true) => {
                if props.str("saskey")?.is_some_and(|k| !k.trim().is_empty()) {
                    return Err(ctx.invalid("give sasKey or sasToken, not both"));
                }
                String::new()
            }
            (None, _) => ctx
                .required_for(props, "saskey", "sasKey", "EventGrid")?
                .to_string(),
        };
        Ok(Destination::new(
            "EventGrid",
            EventGridDestination {
                endpoint_url: raw.to_string(),
                sas_key,
                sas_token,
                topic_name: props.str("topicname")?.map(str::to_string),
            },
        ))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        Ok(Destination::new(
            "EventGrid",
            EventGridDestination {
                endpoint_url: stored_str(props, "endpointUrl")?.to_string(),
                sas_token: props
                    .get("sasToken")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                sas_key: match props.get("sasToken") {
                    Some(_) => String::new(),
                    None => stored_str(props, "sasKey")?.to_string(),
                },
                topic_name: props
                    .get("topicName")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
        ))
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<EventGridDestination>() else {
            return mismatched("EventGrid");
        };
        // A cloud Event Grid key: the always-verifying client, whatever the webhook settings.
        if d.is_namespace() {
            let auth = match &d.sas_token {
                Some(t) => NamespaceAuth::Token(t.clone()),
                None => NamespaceAuth::Key(d.sas_key.clone()),
            };
            return Arc::new(NamespaceSink::new(
                &ctx.azure_client,
                &d.endpoint_url,
                &auth,
                d.topic_name.clone(),
                NamespaceLimits::AZURE,
            ));
        }
        webhook_sink(
            sub,
            &ctx.azure_client,
            ctx,
            &d.endpoint_url,
            Some(&d.sas_key),
            TopicRewrite::Set(d.topic_name.clone()),
        )
    }

    fn example(&self, base: &str) -> Value {
        json!({
            "endpointUrl": with_credentials(base, "/api/events?api-version=2018-01-01&sig=eventgrid-url-sig-secret"),
            "sasKey": "eventgrid-sas-key-secret",
            "topicName": "cloud-topic",
            "signingSecrets": ["whsec_ZXZlbnRncmlkLXNpZ25pbmctc2VjcmV0LTAxMjM0NTY3ODk="],
            "deliveryAttributeMappings": [
                {"name": "X-Api-Key", "type": "Static",
                 "properties": {"value": "eventgrid-header-secret", "isSecret": true}}
            ]
        })
    }
}
