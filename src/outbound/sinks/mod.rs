//! Every destination type behind one seam: each type is one file here implementing
//! [`DestinationKind`] (its `endpointType` names, how it parses and validates its properties,
//! its secrets, health key, whether it can take dead letters, how it builds its [`Sink`]), and
//! one line in [`DESTINATIONS`]. Nothing else in the code lists destination types: the
//! subscription parser, error messages, GET/twin masking, endpoint health and the sink factory
//! all ask the registry or the parsed [`Destination`]. Recipe: `docs/ARCHITECTURE.md`, "Adding a destination type".
//!
//! Destinations served by a component outside delivery (edgeHub's module outputs) are
//! plugged in by the server through [`DefaultSinks::with_module_outputs`]: delivery never
//! imports `edge`.

pub(crate) mod edgehub;
pub(crate) mod eventgrid;
pub(crate) mod messaging;
pub(crate) mod mqtt;
pub(crate) mod resources;
pub(crate) mod storageblob;
pub(crate) mod storagequeue;
pub(crate) mod webhook;

use super::http::HttpClient;
use super::mqtt::connection::EdgeTls;
use crate::config::{Config, IpRange, Key};
use crate::delivery::sink::{Sink, SinkFactory, UnsupportedSink};
use crate::model::destination::DestinationRecord;
use crate::model::destination::{Destination, DestinationError, DestinationTypes, Role};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// How long an MQTT publish waits for its PUBACK unless the server says otherwise
/// (`broker__deliveryTimeoutInSeconds`'s default).
const DEFAULT_MQTT_TIMEOUT: Duration = Duration::from_secs(60);

/// The destination types of this build, in the order error messages list them.
pub static DESTINATIONS: Registry = Registry {
    kinds: &[
        &webhook::WebHook,
        &edgehub::EdgeHub,
        &eventgrid::EventGrid,
        &messaging::EVENT_HUB,
        &messaging::SERVICE_BUS_QUEUE,
        &messaging::SERVICE_BUS_TOPIC,
        &storagequeue::StorageQueue,
        &storageblob::StorageBlob,
        &mqtt::Mqtt,
    ],
};

/// One destination type.
pub trait DestinationKind: Send + Sync + 'static {
    /// `endpointType` values accepted (any case); the first is canonical (echoed, metrics).
    fn names(&self) -> &'static [&'static str];
    /// Parse and validate the destination's `properties` (lowercased keys). Batching knobs and
    /// `eventDeliverySchema` are read by the subscription parser; webhook options by
    /// `DeliveryOptions` when the parsed value says it takes them.
    ///
    /// # Errors
    /// 400 through [`ParseContext::invalid`], naming the field.
    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError>;
    /// Whether it can be a subscription's `destination`.
    fn delivery(&self) -> bool {
        true
    }
    /// Whether it can be a `deadLetterDestination`.
    fn dead_letter(&self) -> bool {
        false
    }
    /// Whether it takes a `resourceId` in place of its `connectionString` (see [`resources`]).
    fn takes_resource_id(&self) -> bool {
        false
    }
    /// The destination a metadata record holds (`props`: what [`DestinationSpec::echo`] wrote),
    /// read back without the settings: the rules [`DestinationKind::parse`] applies to new
    /// destinations were met when it was created.
    ///
    /// # Errors
    /// The record lacks what the type needs, or holds what it cannot read (e.g. a connection
    /// string that no longer parses).
    ///
    /// [`DestinationSpec::echo`]: crate::model::destination::DestinationSpec::echo
    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String>;
    /// The sink delivering to `sub.destination` (a value this type parsed).
    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink>;
    /// A valid `properties` object with every secret property set, delivering to `base` (an
    /// `http://host:port` receiver; the secrets test runs every type through GET, the twin and
    /// the logs with it).
    fn example(&self, base: &str) -> Value;
}

/// A string property that is present and not blank.
fn non_blank<'p>(props: &Obj<'p>, key: &str) -> Result<Option<&'p str>, DestinationError> {
    Ok(props.str(key)?.filter(|s| !s.trim().is_empty()))
}

/// What a type's parser gets besides its properties.
pub struct ParseContext<'a> {
    /// Module settings (https-only rules, denied address ranges, limits).
    pub cfg: &'a Config,
    /// Destination or dead-letter destination.
    pub role: Role,
}

impl ParseContext<'_> {
    /// The documented 400 for this role, with `msg` naming the field.
    pub fn invalid(&self, msg: impl Into<String>) -> DestinationError {
        self.role.invalid(msg)
    }

    /// A required, non-blank string property (`key` lowercase, `display` as documented).
    ///
    /// # Errors
    /// 400 naming `display`.
    pub fn required<'p>(
        &self,
        props: &Obj<'p>,
        key: &str,
        display: &str,
    ) -> Result<&'p str, DestinationError> {
        non_blank(props, key)?.ok_or_else(|| self.invalid(format!("{display} is required")))
    }

    /// As [`ParseContext::required`], the message naming the destination type `kind`.
    ///
    /// # Errors
    /// 400: `{display} is required for {kind} destinations`.
    pub fn required_for<'p>(
        &self,
        props: &Obj<'p>,
        key: &str,
        display: &str,
        kind: &str,
    ) -> Result<&'p str, DestinationError> {
        non_blank(props, key)?
            .ok_or_else(|| self.invalid(format!("{display} is required for {kind} destinations")))
    }

    /// The rules every outbound URL meets: absolute `http(s)` with a host, `https` when
    /// `https_only` (the setting named `setting`) is on, no address in a denied range
    /// ([`ParseContext::check_address`]).
    ///
    /// # Errors
    /// 400 naming `display`.
    pub fn outbound_url(
        &self,
        raw: &str,
        display: &str,
        https_only: bool,
        setting: &str,
    ) -> Result<Url, DestinationError> {
        let url = Url::parse(raw)
            .map_err(|_| self.invalid(format!("{display} must be an absolute URL")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(self.invalid(format!("{display} must be an absolute http(s) URL")));
        }
        if https_only && url.scheme() != "https" {
            return Err(self.invalid(format!("{display} must be https while {setting}=true")));
        }
        self.check_address(&url, display)?;
        Ok(url)
    }

    /// An endpoint derived from an Azure connection string (Event Hubs / Service Bus namespace,
    /// Storage queue or blob service): the webhook rules of [`ParseContext::outbound_url`] under
    /// `outbound__webhook__httpsOnly`, except that plain HTTP may reach a loopback host (the
    /// emulators: `UseDevelopmentStorage`, `UseDevelopmentEmulator`). Shared Key signatures and
    /// SAS tokens never cross the network in clear text while `httpsOnly` is on.
    ///
    /// # Errors
    /// 400 naming `display`.
    pub fn azure_endpoint(&self, raw: &str, display: &str) -> Result<Url, DestinationError> {
        let loopback = match Url::parse(raw).ok().as_ref().and_then(Url::host) {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            None => false,
        };
        self.outbound_url(
            raw,
            display,
            self.cfg.outbound.webhook_https_only && !loopback,
            Key::outbound__webhook__httpsOnly.name(),
        )
    }

    /// Refuse a URL whose host is an address in `outbound__deniedAddressRanges` (host names are
    /// checked on their resolved address at connect time, by the HTTP client).
    ///
    /// # Errors
    /// 400 naming `display` and the range.
    pub fn check_address(&self, url: &Url, display: &str) -> Result<(), DestinationError> {
        let ip: std::net::IpAddr = match url.host() {
            Some(url::Host::Ipv4(a)) => a.into(),
            Some(url::Host::Ipv6(a)) => a.into(),
            _ => return Ok(()),
        };
        match self
            .cfg
            .outbound
            .denied_ranges
            .iter()
            .find(|r| r.contains(ip))
        {
            Some(r) => Err(self.invalid(format!(
                "{display} address {ip} is in the denied range {r} ({})",
                Key::outbound__deniedAddressRanges.name()
            ))),
            None => Ok(()),
        }
    }
}

/// The webhook HTTP clients. Under `outbound__webhook__allowUnknownCA=true` (the default) or
/// `skipServerCertValidation=true` the configured one accepts any server certificate; a webhook
/// that carries a secret goes through the verifying one instead (issue 37), unless the
/// subscription opts out (`sendSecretsToUnverifiedServer`, documented as dangerous).
#[derive(Clone)]
pub struct WebhookClients {
    /// As the `outbound__webhook__*` settings say.
    pub configured: HttpClient,
    /// Always checks the server's chain (Mozilla's roots, the IoT Edge trust bundle) and host
    /// name; the same client as `configured` when the settings already verify.
    pub verified: HttpClient,
    /// `configured` accepts any server certificate.
    pub configured_accepts_any: bool,
    /// Webhook calls present the module identity certificate
    /// (`outbound__clientAuth__clientCert__enabled` under IoT Edge): a credential every webhook
    /// carries, so every one is verified.
    pub presents_certificate: bool,
}

impl WebhookClients {
    /// The client for a webhook that carries a secret (`secret`) or not, and whether its
    /// subscription opted out of verification for it (`opted_out`).
    pub fn for_webhook(&self, secret: bool, opted_out: bool) -> &HttpClient {
        if (secret || self.presents_certificate) && !opted_out {
            &self.verified
        } else {
            &self.configured
        }
    }
}

/// What sink builders share.
pub struct SinkContext {
    /// The webhook HTTP clients (`outbound__webhook__*` TLS settings, and verifying).
    pub webhook: WebhookClients,
    /// The client of credentialed Azure destinations: always verifies the server's chain and
    /// host name (the server builds it from `outbound__azure__trustedCertificatesFile`).
    pub azure_client: HttpClient,
    /// A random per-process id: Standard Webhooks `webhook-id`s stay unique across restarts
    /// (batch ids are sequence numbers, which restart with a memory store).
    pub boot_id: String,
    /// edgeHub's module outputs with the time each attempt waits for an acknowledgement
    /// (under IoT Edge).
    pub module_outputs: Option<(Arc<dyn edgehub::ModuleOutputs>, Duration)>,
    /// The MQTT destinations' shared broker connections.
    pub mqtt: mqtt::MqttContext,
}

/// The destination types, looked up by `endpointType`.
pub struct Registry {
    kinds: &'static [&'static dyn DestinationKind],
}

impl Registry {
    /// Every type.
    pub fn kinds(&self) -> &'static [&'static dyn DestinationKind] {
        self.kinds
    }

    /// The type named `endpoint_type` (any case, any of its names).
    pub fn find(&self, endpoint_type: &str) -> Option<&'static dyn DestinationKind> {
        self.kinds.iter().copied().find(|k| {
            k.names()
                .iter()
                .any(|n| n.eq_ignore_ascii_case(endpoint_type))
        })
    }

    fn list(&self, role: Role) -> String {
        let names: Vec<&str> = self
            .kinds
            .iter()
            .filter(|k| match role {
                Role::Delivery => k.delivery(),
                Role::DeadLetter => k.dead_letter(),
            })
            .filter_map(|k| k.names().first().copied())
            .collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            Some((last, _)) => (*last).to_string(),
            None => String::new(),
        }
    }
}

impl DestinationTypes for Registry {
    fn parse(
        &self,
        endpoint_type: &str,
        props: &Obj<'_>,
        cfg: &Config,
        role: Role,
    ) -> Result<Destination, DestinationError> {
        let kind = self.find(endpoint_type).filter(|k| match role {
            Role::Delivery => k.delivery(),
            Role::DeadLetter => k.dead_letter(),
        });
        let Some(kind) = kind else {
            let what = match role {
                Role::Delivery => "",
                Role::DeadLetter => {
                    " as a dead-letter destination (dead letters are always kept locally too)"
                }
            };
            return Err(role.invalid(format!(
                "endpointType '{endpoint_type}' is not supported{what}; use {}",
                self.list(role)
            )));
        };
        let ctx = ParseContext { cfg, role };
        let resolved = match kind.takes_resource_id() {
            true => resources::resolve(
                props.map(),
                "resourceid",
                "connectionstring",
                &cfg.outbound.resources,
            )
            .map_err(|e| role.invalid(e))?
            .map(Value::Object),
            false => None,
        };
        let props = match &resolved {
            Some(v) => Obj::new(v, props.path())?,
            None => *props,
        };
        let d = kind.parse(&props, &ctx)?;
        // Every type's outbound URL, whether or not its parser checked it.
        if let Some(url) = d.url().and_then(|u| Url::parse(u).ok()) {
            ctx.check_address(&url, "the destination URL")?;
        }
        Ok(d)
    }

    fn restore(&self, record: &DestinationRecord) -> Result<Destination, String> {
        match self.find(&record.endpoint_type) {
            Some(kind) => kind.restore(&record.properties),
            None => Err(format!(
                "endpointType '{}' is not known to this build",
                record.endpoint_type
            )),
        }
    }
}

/// The production [`SinkFactory`]: every type's sink over one shared context.
pub struct DefaultSinks {
    ctx: SinkContext,
}

impl DefaultSinks {
    /// Sinks sharing `webhook` for webhooks and `azure_client` for Azure destinations (see
    /// [`crate::outbound::http::HttpClient::new`] over [`crate::tls::client_config`]).
    pub fn new(webhook: WebhookClients, azure_client: HttpClient) -> Self {
        let mut b = [0u8; 6];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
        let boot_id: String = b.iter().map(|x| format!("{x:02x}")).collect();
        Self {
            ctx: SinkContext {
                webhook,
                azure_client,
                mqtt: mqtt::MqttContext::new(
                    EdgeTls::default(),
                    &boot_id,
                    Vec::new(),
                    DEFAULT_MQTT_TIMEOUT,
                ),
                boot_id,
                module_outputs: None,
            },
        }
    }

    /// MQTT destinations connect with `edge` (under IoT Edge: its trust bundle and module
    /// identity), never to a broker resolving into `denied`, and wait up to `timeout` for each
    /// PUBACK.
    pub fn with_mqtt(mut self, edge: EdgeTls, denied: Vec<IpRange>, timeout: Duration) -> Self {
        self.ctx.mqtt = mqtt::MqttContext::new(edge, &self.ctx.boot_id, denied, timeout);
        self
    }

    /// Deliver `EdgeHub` destinations to these module outputs (under IoT Edge); each attempt
    /// waits up to `timeout` for the acknowledgement.
    pub fn with_module_outputs(
        mut self,
        outputs: Arc<dyn edgehub::ModuleOutputs>,
        timeout: Duration,
    ) -> Self {
        self.ctx.module_outputs = Some((outputs, timeout));
        self
    }
}

impl SinkFactory for DefaultSinks {
    fn create(&self, sub: &Subscription) -> Arc<dyn Sink> {
        match DESTINATIONS.find(sub.destination.endpoint_type()) {
            Some(kind) => kind.sink(sub, &self.ctx),
            None => Arc::new(UnsupportedSink(format!(
                "{} destinations are not known to this build",
                sub.destination.endpoint_type()
            ))),
        }
    }

    fn mqtt_destinations(&self) -> Vec<crate::delivery::sink::MqttDestinationStatus> {
        self.ctx.mqtt.publishers.statuses()
    }
}

/// An [`UnsupportedSink`] for a value a type's builder did not recognise (never expected: the
/// registry hands each type only values it parsed).
pub(crate) fn mismatched(endpoint_type: &str) -> Arc<dyn Sink> {
    Arc::new(UnsupportedSink(format!(
        "internal error: the {endpoint_type} destination could not be built"
    )))
}

#[cfg(test)]
mod tests;
