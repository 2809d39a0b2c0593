//! `endpointType: WebHook`: an HTTP(S) POST of the events as a JSON array
//! ([`crate::outbound::post::WebhookSink`]).
//!
//! Properties: `endpointUrl` (required; https unless `outbound__webhook__httpsOnly=false`);
//! webhook options (`signingSecrets`, `deliveryAttributeMappings`). Secrets: the URL's
//! credentials, the signing secrets, `isSecret` header values. Health: by URL. Can take dead
//! letters (the batch of dead letters is POSTed as a JSON array).
//!
//! A webhook that carries a secret (anything [`crate::redact::mask_url`] hides in its URL:
//! user info, a query value, a token-like path segment; a signing secret; an `isSecret`
//! attribute; the module identity certificate) is sent only to a server whose chain and host
//! name verify, whatever `outbound__webhook__allowUnknownCA`/`skipServerCertValidation` say
//! (issue 37). `sendSecretsToUnverifiedServer: true` opts a subscription out: dangerous, since
//! anyone who can answer for the address (a spoofed name, a hostile LAN) then gets the secret.

use super::{mismatched, DestinationKind, ParseContext, SinkContext};
use crate::config::Key;
use crate::delivery::sink::Sink;
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use crate::outbound::post::{TopicRewrite, WebhookSink};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The secret properties of HTTP destinations that take webhook options.
pub(super) const HTTP_SECRETS: [SecretProperty; 3] = [
    SecretProperty::new("endpointUrl", SecretKind::Url),
    SecretProperty::new("signingSecrets", SecretKind::Whole),
    SecretProperty::new("deliveryAttributeMappings", SecretKind::AttributeMappings),
];

/// The type.
pub struct WebHook;

/// A parsed WebHook destination.
#[derive(Debug)]
pub struct WebHookDestination {
    /// Absolute URL.
    pub endpoint_url: String,
    /// `sendSecretsToUnverifiedServer`: its secrets may go to a server that does not verify.
    pub unverified_server_allowed: bool,
}

/// The property that opts a webhook out of verifying the server it sends secrets to.
const OPT_OUT: &str = "sendSecretsToUnverifiedServer";

impl DestinationSpec for WebHookDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        props.insert("endpointUrl".into(), json!(self.endpoint_url));
        if self.unverified_server_allowed {
            props.insert(OPT_OUT.into(), json!(true));
        }
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &HTTP_SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.endpoint_url)
    }
    fn webhook_options(&self) -> bool {
        true
    }
}

impl DestinationKind for WebHook {
    fn names(&self) -> &'static [&'static str] {
        &["WebHook"]
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let raw = ctx.required(props, "endpointurl", "EndpointUrl")?;
        ctx.outbound_url(
            raw,
            "EndpointUrl",
            ctx.cfg.outbound.webhook_https_only,
            Key::outbound__webhook__httpsOnly.name(),
        )?;
        let unverified_server_allowed = props
            .bool(&OPT_OUT.to_ascii_lowercase(), OPT_OUT)?
            .unwrap_or(false);
        Ok(Destination::new(
            "WebHook",
            WebHookDestination {
                endpoint_url: raw.to_string(),
                unverified_server_allowed,
            },
        ))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        Ok(Destination::new(
            "WebHook",
            WebHookDestination {
                endpoint_url: stored_str(props, "endpointUrl")?.to_string(),
                unverified_server_allowed: props.get(OPT_OUT) == Some(&Value::Bool(true)),
            },
        ))
    }

    fn dead_letter(&self) -> bool {
        true
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<WebHookDestination>() else {
            return mismatched("WebHook");
        };
        let secret = crate::redact::carries_credentials(&d.endpoint_url)
            || !sub.delivery.signing_secrets.is_empty()
            || sub.delivery.attributes.iter().any(|a| a.is_secret);
        let hooks = &ctx.webhook;
        let client = hooks.for_webhook(secret, d.unverified_server_allowed);
        if hooks.configured_accepts_any && (secret || hooks.presents_certificate) {
            let url = crate::redact::mask_url(&d.endpoint_url);
            if d.unverified_server_allowed {
                tracing::warn!(%url, "this webhook's secrets go to its server unverified ({OPT_OUT}=true): anyone who can answer for the address gets them");
            } else {
                // Once per process: a line per subscription would flood a start with thousands.
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| tracing::info!(%url, "webhooks that carry a secret (this one, and any other) have their server's certificate chain and host name verified, whatever {} says", Key::outbound__webhook__allowUnknownCA.name()));
            }
        }
        webhook_sink(sub, client, ctx, &d.endpoint_url, None, TopicRewrite::None)
    }

    fn example(&self, base: &str) -> Value {
        json!({
            "endpointUrl": with_credentials(base, "/hook?code=webhook-url-code-secret"),
            "signingSecrets": ["whsec_d2ViaG9vay1zaWduaW5nLXNlY3JldC0wMTIzNDU2Nzg5"],
            "deliveryAttributeMappings": [
                {"name": "X-Api-Key", "type": "Static",
                 "properties": {"value": "webhook-header-secret", "isSecret": true}},
                {"name": "X-Tenant", "type": "Static",
                 "properties": {"value": "tenant-a", "isSecret": false}}
            ]
        })
    }
}

/// `base` with user `gridlet`, a password and `path_and_query` (for examples).
/// The HTTP POST sink of a destination that takes webhook options (WebHook, EventGrid): to
/// `url` through `client`, with `aeg-sas-key: sas_key` when given, the subscription's signing
/// and static headers.
pub(super) fn webhook_sink(
    sub: &Subscription,
    client: &crate::outbound::http::HttpClient,
    ctx: &SinkContext,
    url: &str,
    sas_key: Option<&str>,
    rewrite: TopicRewrite,
) -> Arc<dyn Sink> {
    Arc::new(
        WebhookSink::new(client.clone(), url.to_string(), sas_key, rewrite)
            .with_options(&sub.delivery, &ctx.boot_id),
    )
}

pub(super) fn with_credentials(base: &str, path_and_query: &str) -> String {
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
        .unwrap_or(base);
    let scheme = if base.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://gridlet:url-password-secret@{rest}{path_and_query}")
}
