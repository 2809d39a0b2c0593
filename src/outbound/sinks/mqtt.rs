//! `endpointType: Mqtt`: each event published as an MQTT 5 message on a broker gridlet does not
//! run ([`crate::outbound::mqtt::sink::MqttSink`]; docs/MQTT.md, "MQTT as a destination").
//!
//! Properties: the broker connection, with the fields and rules of
//! [`crate::outbound::mqtt::connection`] (`url` required; `clientId`, `username`, `password`,
//! `authentication.method` / `tokenFile`, `tls.caFile` / `certFile` / `keyFile` /
//! `clientIdentity`, `keepAliveSeconds`, `maxPacketBytes`; MQTT 5 only, the session always
//! clean), `topicTemplate` (required), `qos` (0 or 1, default 1), `retain` (default false),
//! `deliveryAttributeMappings` (MQTT 5 user properties). Checked at PUT, a 400 naming the field:
//! a bad URL or scheme, a wildcard or unknown variable in the template, a CA, certificate, key
//! or token file that cannot be read. Secrets: `password`, `isSecret` attribute values. Health:
//! by broker URL (`mqtt(s)://host:port`). No dead letters.

use super::{mismatched, DestinationKind, ParseContext, SinkContext};
use crate::config::IpRange;
use crate::delivery::sink::Sink;
use crate::model::attributes::AttributeTarget;
use crate::model::destination::{
    Destination, DestinationError, DestinationSpec, SecretKind, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use crate::outbound::mqtt::connection::{ClientIdentity, ConnectionSpec, EdgeTls, Protocol};
use crate::outbound::mqtt::publish::{broker_url, Publishers};
use crate::outbound::mqtt::sink::{MqttSink, MqttTarget};
use crate::outbound::mqtt::topic::TopicTemplate;
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

const SECRETS: [SecretProperty; 2] = [
    SecretProperty::new("password", SecretKind::Whole),
    SecretProperty::new("deliveryAttributeMappings", SecretKind::AttributeMappings),
];

/// The connection fields a destination takes (the rest of
/// [`crate::outbound::mqtt::connection::FIELDS`] are about sessions and subscriptions, which a
/// publishing connection does not keep).
const FIELDS: [&str; 12] = [
    "url",
    "clientId",
    "protocolVersion",
    "username",
    "password",
    "authentication.method",
    "authentication.tokenFile",
    "tls.caFile",
    "tls.certFile",
    "tls.keyFile",
    "tls.clientIdentity",
    "keepAliveSeconds",
];

/// What MQTT sinks share: the broker connections and the PUBACK timeout.
pub struct MqttContext {
    /// One connection per broker and credentials.
    pub publishers: Arc<Publishers>,
    /// How long a publish waits for its PUBACK.
    pub timeout: Duration,
}

impl MqttContext {
    /// No connection yet (see [`Publishers::new`]).
    pub fn new(edge: EdgeTls, id_prefix: &str, denied: Vec<IpRange>, timeout: Duration) -> Self {
        Self {
            publishers: Arc::new(Publishers::new(edge, id_prefix, denied)),
            timeout,
        }
    }
}

/// The type.
pub struct Mqtt;

/// A parsed MQTT destination.
#[derive(Debug)]
pub struct MqttDestination {
    /// The connection fields as given (echoed), by canonical dotted name.
    given: Vec<(&'static str, Value)>,
    /// `topicTemplate` as given.
    template: String,
    /// What the sink needs.
    target: MqttTarget,
    /// `mqtt(s)://host:port`: SSRF checks, endpoint health, logs.
    broker: String,
}

impl DestinationSpec for MqttDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        for (field, v) in &self.given {
            match field.split_once('.') {
                Some((group, key)) => {
                    let g = props
                        .entry(group.to_string())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(g) = g {
                        g.insert(key.to_string(), v.clone());
                    }
                }
                None => {
                    props.insert((*field).to_string(), v.clone());
                }
            }
        }
        props.insert("topicTemplate".into(), json!(self.template));
        props.insert("qos".into(), json!(qos_number(self.target.qos)));
        props.insert("retain".into(), json!(self.target.retain));
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &SECRETS
    }
    fn url(&self) -> Option<&str> {
        Some(&self.broker)
    }
    fn attributes(&self) -> Option<AttributeTarget> {
        Some(AttributeTarget::MqttUserProperties)
    }
}

fn qos_number(q: QoS) -> u8 {
    match q {
        QoS::AtMostOnce => 0,
        _ => 1,
    }
}

/// A scalar property's text (`None`: absent or null).
fn scalar(v: &Value) -> Result<Option<String>, ()> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Bool(b) => Ok(Some(b.to_string())),
        _ => Err(()),
    }
}

/// Looks a dotted field up in a properties object whose keys may be in any case.
fn lookup<'v>(props: &'v Map<String, Value>, field: &str) -> Option<&'v Value> {
    let mut cur = props;
    let mut parts = field.split('.').peekable();
    while let Some(p) = parts.next() {
        let v = cur.iter().find(|(k, _)| k.eq_ignore_ascii_case(p))?.1;
        if parts.peek().is_none() {
            return Some(v);
        }
        cur = v.as_object()?;
    }
    None
}

/// What [`Mqtt::build`] reads, from a PUT body (lowercased keys) or a stored record (camelCase).
struct Raw {
    given: Vec<(&'static str, Value)>,
    template: Option<String>,
    qos: Option<Value>,
    retain: Option<Value>,
}

impl Raw {
    fn read(props: &Map<String, Value>) -> Result<Self, String> {
        let mut given = Vec::new();
        for f in FIELDS {
            match lookup(props, f) {
                None | Some(Value::Null) => {}
                Some(v) => {
                    scalar(v).map_err(|()| format!("{f}: must be a string, number or boolean"))?;
                    given.push((f, v.clone()));
                }
            }
        }
        let template = match lookup(props, "topicTemplate") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("topicTemplate: must be a string".into()),
        };
        Ok(Self {
            given,
            template,
            qos: lookup(props, "qos").cloned(),
            retain: lookup(props, "retain").cloned(),
        })
    }
}

impl Mqtt {
    /// The destination the properties make; errors name the field. Reads no file.
    fn build(raw: Raw) -> Result<MqttDestination, String> {
        let get = |f: &'static str| {
            raw.given
                .iter()
                .find(|(g, _)| *g == f)
                .and_then(|(_, v)| scalar(v).ok().flatten())
        };
        let spec = ConnectionSpec::parse("destination", &get).map_err(|e| e.to_string())?;
        if spec.protocol != Protocol::V5 {
            return Err("protocolVersion: the MQTT destination speaks MQTT 5 only".into());
        }
        let template = raw
            .template
            .filter(|t| !t.trim().is_empty())
            .ok_or("topicTemplate: required")?;
        let topic = TopicTemplate::parse(&template).map_err(|e| format!("topicTemplate: {e}"))?;
        let qos = match raw.qos.as_ref().map(scalar) {
            None | Some(Ok(None)) => QoS::AtLeastOnce,
            Some(Ok(Some(q))) if q.trim() == "1" => QoS::AtLeastOnce,
            Some(Ok(Some(q))) if q.trim() == "0" => QoS::AtMostOnce,
            Some(_) => return Err("qos: must be 0 or 1".into()),
        };
        let retain = match raw.retain.as_ref() {
            None | Some(Value::Null) => false,
            Some(v) => crate::model::json::loose_bool(v).ok_or("retain: must be true or false")?,
        };
        Ok(MqttDestination {
            broker: broker_url(&spec),
            target: MqttTarget {
                own_client_id: get("clientId").is_some(),
                spec,
                topic,
                qos,
                retain,
            },
            given: raw.given,
            template,
        })
    }
}

impl DestinationKind for Mqtt {
    fn names(&self) -> &'static [&'static str] {
        &["Mqtt"]
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let d = Raw::read(props.map())
            .and_then(Self::build)
            .map_err(|e| ctx.invalid(format!("properties.{e}")))?;
        // An address literal in a denied range (a host name is checked on its resolved
        // addresses before every connect). `mqtt:` is not a special scheme to the URL parser,
        // so its host is checked as an HTTP URL's would be.
        let host = &d.target.spec.endpoint.host;
        let as_http = match host.contains(':') {
            true => format!("http://[{host}]/"),
            false => format!("http://{host}/"),
        };
        if let Ok(u) = url::Url::parse(&as_http) {
            ctx.check_address(&u, "properties.url")?;
        }
        // The files the connection reads at every connect must be there now (the IoT Edge
        // identity comes from the runtime: not checked here).
        let mut probe = d.target.spec.clone();
        if probe.client_identity == ClientIdentity::IotEdge {
            probe.client_identity = ClientIdentity::None;
        }
        probe
            .tls_config(&EdgeTls::default())
            .and_then(|_| probe.authentication_data())
            .map_err(|e| ctx.invalid(format!("properties.{e}")))?;
        Ok(Destination::new("Mqtt", d))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        let d = Raw::read(props).and_then(Self::build)?;
        Ok(Destination::new("Mqtt", d))
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<MqttDestination>() else {
            return mismatched("Mqtt");
        };
        Arc::new(MqttSink::new(
            ctx.mqtt.publishers.clone(),
            d.target.clone(),
            sub.delivery.attributes.clone(),
            ctx.mqtt.timeout,
        ))
    }

    fn example(&self, base: &str) -> Value {
        let host = base.split("://").nth(1).unwrap_or(base);
        json!({
            "url": format!("mqtt://{host}"),
            "username": "gridlet",
            "password": "mqtt-password-secret",
            "topicTemplate": "devices/${subject}",
            "qos": 1,
            "deliveryAttributeMappings": [
                {"name": "Tenant", "type": "Static",
                 "properties": {"value": "mqtt-attribute-secret", "isSecret": true}},
                {"name": "Kind", "type": "Dynamic", "properties": {"sourceField": "eventType"}}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::model::destination::testing::{cfg, topic};
    use crate::model::subscription::Subscription;
    use crate::outbound::sinks::DESTINATIONS;
    use serde_json::{json, Value};

    fn put(props: Value) -> Result<Subscription, String> {
        let body =
            json!({"properties": {"destination": {"endpointType": "mqtt", "properties": props}}});
        Subscription::from_put(&topic(), "s", body, &cfg(&[]), &DESTINATIONS).map_err(|e| e.message)
    }

    #[test]
    fn a_destination_round_trips_with_its_secrets_masked() {
        let s = put(json!({"url": "mqtt://broker:1884", "topicTemplate": "d/${subject}",
            "username": "u", "password": "p", "tls": null, "keepAliveSeconds": 30,
            "deliveryAttributeMappings": [{"name": "k", "type": "Static", "properties": {"value": "v", "isSecret": true}}]}))
        .unwrap();
        let shown = s.public_properties();
        let d = &shown["destination"]["properties"];
        assert_eq!(d["url"], "mqtt://broker:1884");
        assert_eq!(d["password"], Value::Null);
        assert_eq!(d["topicTemplate"], "d/${subject}");
        assert_eq!(d["qos"], 1);
        assert_eq!(d["retain"], false);
        assert_eq!(d["keepAliveSeconds"], 30);
        assert_eq!(s.destination.url(), Some("mqtt://broker:1884"));
        assert_eq!(s.destination.health_key(), Some("mqtt://broker:1884"));
        let echoed = s.properties()["destination"]["properties"].clone();
        let restored = DESTINATIONS
            .find("Mqtt")
            .unwrap()
            .restore(echoed.as_object().unwrap())
            .unwrap();
        assert_eq!(restored, s.destination);
    }

    #[test]
    fn bad_properties_name_the_field() {
        let base = json!({"url": "mqtt://broker", "topicTemplate": "d/${subject}"});
        let with = |k: &str, v: Value| {
            let mut p = base.clone();
            p[k] = v;
            p
        };
        for (props, field) in [
            (with("url", json!("http://broker")), "url"),
            (with("url", Value::Null), "url"),
            (with("topicTemplate", json!("d/+/x")), "topicTemplate"),
            (with("topicTemplate", json!("d/${nope}")), "topicTemplate"),
            (with("topicTemplate", Value::Null), "topicTemplate"),
            (with("qos", json!(2)), "qos"),
            (with("retain", json!("maybe")), "retain"),
            (with("protocolVersion", json!("3.1.1")), "protocolVersion"),
            (
                json!({"url": "mqtts://broker", "topicTemplate": "t", "tls": {"caFile": "/nonexistent/ca.pem"}}),
                "tls.caFile",
            ),
            (
                json!({"url": "mqtt://broker", "topicTemplate": "t", "authentication": {"method": "K8S-SAT", "tokenFile": "/nonexistent/token"}}),
                "authentication.tokenFile",
            ),
        ] {
            let e = put(props.clone()).unwrap_err();
            assert!(e.contains(&format!("properties.{field}")), "{props}: {e}");
        }
    }
}
