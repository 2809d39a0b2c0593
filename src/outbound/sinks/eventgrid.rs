//! `endpointType: EventGrid`: a cloud Event Grid topic, POSTed to like a webhook with the
//! `aeg-sas-key` header, every EventGridSchema event's `topic` rewritten to `topicName`.
//!
//! Properties: `endpointUrl` (required: `/api/events`, `api-version=2018-01-01`, https unless
//! `outbound__eventgrid__httpsOnly=false`, host under an Event Grid cloud domain unless
//! `outbound__eventgrid__allowInvalidHostnames=true`), `sasKey` (required, secret),
//! `topicName` (optional); webhook options. Health: by URL. No dead letters.

use super::webhook::{webhook_sink, with_credentials, HTTP_SECRETS};
use super::{mismatched, DestinationKind, ParseContext, SinkContext};
use crate::config::Key;
use crate::delivery::sink::Sink;
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use crate::outbound::post::TopicRewrite;
use serde_json::{json, Map, Value};
use std::sync::Arc;

const SECRETS: [SecretProperty; 4] = [
    HTTP_SECRETS[0],
    HTTP_SECRETS[1],
    HTTP_SECRETS[2],
    SecretProperty::new("sasKey", SecretKind::Whole),
];

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
    /// `https://<topic>.<region>.eventgrid.azure.net/api/events?api-version=2018-01-01`.
    pub endpoint_url: String,
    /// `aeg-sas-key` value.
    pub sas_key: String,
    /// Rewrites every EventGridSchema event's `topic`; `None` nulls it.
    pub topic_name: Option<String>,
}

impl DestinationSpec for EventGridDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        props.insert("endpointUrl".into(), json!(self.endpoint_url));
        props.insert("sasKey".into(), json!(self.sas_key));
        props.insert("topicName".into(), json!(self.topic_name));
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.endpoint_url)
    }
    fn webhook_options(&self) -> bool {
        true
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
        if !url.path().to_ascii_lowercase().contains("/api/events") {
            return Err(ctx.invalid(
                "EndpointUrl must target the /api/events API of Azure Event Grid in the cloud.",
            ));
        }
        let has_version = url
            .query_pairs()
            .any(|(k, v)| k.eq_ignore_ascii_case("api-version") && v == "2018-01-01");
        if !has_version {
            return Err(ctx.invalid("EndpointUrl must have the query api-version=2018-01-01"));
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
        let sas_key = ctx.required_for(props, "saskey", "sasKey", "EventGrid")?;
        Ok(Destination::new(
            "EventGrid",
            EventGridDestination {
                endpoint_url: raw.to_string(),
                sas_key: sas_key.to_string(),
                topic_name: props.str("topicname")?.map(str::to_string),
            },
        ))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        Ok(Destination::new(
            "EventGrid",
            EventGridDestination {
                endpoint_url: stored_str(props, "endpointUrl")?.to_string(),
                sas_key: stored_str(props, "sasKey")?.to_string(),
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
