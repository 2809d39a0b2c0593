//! One MQTT broker connection as data, and the rumqttc options made from it.
//!
//! A [`ConnectionSpec`] is parsed from named fields ([`ConnectionSpec::parse`]), so settings
//! (`mqtt__connections__{name}__tls__caFile`) and JSON resources (`tls.caFile`) share one parser:
//! an error names the field in its canonical spelling ([`SpecError::field`]) and the caller
//! turns that into its own (a settings key, a JSON path). The fields ([`FIELDS`]):
//!
//! | field | meaning |
//! |---|---|
//! | `url` | `mqtt://host[:1883]` or `mqtts://host[:8883]` (required) |
//! | `clientId` | MQTT client id (default `gridlet-{name}`); stable, so the session survives restarts |
//! | `protocolVersion` | `5` (default) or `3.1.1` |
//! | `username`, `password` | credentials (the password is a secret) |
//! | `authentication.method` | MQTT 5 enhanced authentication: only `K8S-SAT` |
//! | `authentication.tokenFile` | the service-account token sent as the authentication data; read at every connect |
//! | `tls.caFile` | PEM roots the server certificate must chain to (default: Mozilla's roots and, under IoT Edge, the trust bundle) |
//! | `tls.certFile`, `tls.keyFile` | client certificate chain and key (PEM) |
//! | `tls.clientIdentity` | `IoTEdge`: present the module identity certificate from the workload API |
//! | `keepAliveSeconds` | keep-alive (default 60, 5 to 65535) |
//! | `cleanStart` | start a new session at every connect (default `false`: the broker keeps the session) |
//! | `sessionExpirySeconds` | how long the broker keeps the session while gridlet is away (MQTT 5; default 86400) |
//! | `receiveMaximum` | QoS 1 messages the broker may have in flight to gridlet unacknowledged (MQTT 5; default 100, 1 to 65535) |
//! | `maxPacketBytes` | largest packet either way (default 1 MiB) |
//!
//! TLS runs over rustls with ring ([`crate::tls::provider`]); the server's certificate is always
//! verified, with its host name. Secrets (the password, the token) never appear in `Debug`, logs
//! or errors.

use rustls::client::ResolvesClientCert;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use super::backoff::Backoff;

/// Every field [`ConnectionSpec::parse`] reads, in canonical spelling.
pub const FIELDS: &[&str] = &[
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
    "cleanStart",
    "sessionExpirySeconds",
    "receiveMaximum",
    "maxPacketBytes",
];

/// Fields whose values are secrets (masked wherever the fields are shown).
pub const SECRET_FIELDS: &[&str] = &["password"];

/// The one enhanced-authentication method gridlet speaks (Azure IoT Operations' broker).
pub const K8S_SAT: &str = "K8S-SAT";

/// Default MQTT ports.
pub const MQTT_PORT: u16 = 1883;
/// Default MQTT over TLS port.
pub const MQTTS_PORT: u16 = 8883;

const DEFAULT_KEEP_ALIVE_SECS: u64 = 60;
const DEFAULT_SESSION_EXPIRY_SECS: u64 = 86_400;
const DEFAULT_RECEIVE_MAXIMUM: u64 = 100;
const DEFAULT_MAX_PACKET_BYTES: u64 = 1 << 20;

/// A field that does not parse: which one (canonical spelling) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// The field, as in [`FIELDS`].
    pub field: &'static str,
    /// What is wrong, never containing a secret.
    pub message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> SpecError {
    SpecError {
        field,
        message: message.into(),
    }
}

/// A secret string: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, for the wire only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `mqtt://` or `mqtts://`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain TCP.
    Mqtt,
    /// TLS.
    Mqtts,
}

/// Where the broker listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Scheme.
    pub scheme: Scheme,
    /// Host name or IP address (no brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl Endpoint {
    /// Parse `mqtt://host[:port]` or `mqtts://host[:port]` (nothing after the authority but an
    /// optional `/`; no user info: credentials have fields of their own).
    ///
    /// # Errors
    /// Another scheme, no host, a bad port, or a path, query or user info.
    pub fn parse(url: &str) -> Result<Self, SpecError> {
        let u = url::Url::parse(url.trim()).map_err(|e| bad("url", format!("not a URL: {e}")))?;
        let (scheme, default_port) = match u.scheme() {
            "mqtt" => (Scheme::Mqtt, MQTT_PORT),
            "mqtts" => (Scheme::Mqtts, MQTTS_PORT),
            other => {
                return Err(bad(
                    "url",
                    format!("unknown scheme `{other}`: expected mqtt:// or mqtts://"),
                ))
            }
        };
        let host = match u.host() {
            Some(url::Host::Domain(d)) if !d.is_empty() => d.to_string(),
            Some(url::Host::Ipv4(a)) => a.to_string(),
            Some(url::Host::Ipv6(a)) => a.to_string(),
            _ => return Err(bad("url", "no host")),
        };
        if !u.username().is_empty() || u.password().is_some() {
            return Err(bad(
                "url",
                "credentials in the URL are not accepted: use username and password",
            ));
        }
        if !matches!(u.path(), "" | "/") || u.query().is_some() || u.fragment().is_some() {
            return Err(bad("url", "only scheme, host and port are accepted"));
        }
        Ok(Self {
            scheme,
            host,
            port: u.port().unwrap_or(default_port),
        })
    }
}

/// MQTT protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// MQTT 5 (the default).
    V5,
    /// MQTT 3.1.1, for brokers without 5.
    V311,
}

/// The client certificate presented in the TLS handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientIdentity {
    /// None.
    None,
    /// A PEM chain and key from files.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// The module identity certificate from the IoT Edge workload API (renewed in place).
    IotEdge,
}

/// MQTT 5 enhanced authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnhancedAuth {
    /// `K8S-SAT`: a Kubernetes service-account token, read from this file at every connect (the
    /// kubelet rotates it), is the authentication data.
    K8sSat {
        /// Token file.
        token_file: PathBuf,
    },
}

/// One broker connection. Build with [`ConnectionSpec::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSpec {
    /// The connection's name (settings, metrics, the events' `source`).
    pub name: String,
    /// Where the broker listens.
    pub endpoint: Endpoint,
    /// MQTT client id.
    pub client_id: String,
    /// Protocol version.
    pub protocol: Protocol,
    /// User name.
    pub username: Option<String>,
    /// Password (secret).
    pub password: Option<Secret>,
    /// Enhanced authentication (MQTT 5).
    pub enhanced_auth: Option<EnhancedAuth>,
    /// Roots the server certificate must chain to, instead of the default roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate.
    pub client_identity: ClientIdentity,
    /// Keep-alive.
    pub keep_alive: Duration,
    /// New session at every connect.
    pub clean_start: bool,
    /// Session expiry interval (MQTT 5), seconds.
    pub session_expiry_secs: u32,
    /// Receive maximum (MQTT 5).
    pub receive_maximum: u16,
    /// Largest packet either way.
    pub max_packet_bytes: u32,
}

/// What IoT Edge adds to outbound TLS: the trust bundle as extra roots, the module identity.
#[derive(Clone, Default)]
pub struct EdgeTls {
    /// The IoT Edge trust bundle (PEM).
    pub trust_bundle_pem: Option<Vec<u8>>,
    /// The module identity certificate (swapped in place on renewal).
    pub identity: Option<Arc<dyn ResolvesClientCert>>,
}

impl fmt::Debug for EdgeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EdgeTls")
            .field("trust_bundle", &self.trust_bundle_pem.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

fn number(
    get: &dyn Fn(&'static str) -> Option<String>,
    field: &'static str,
    default: u64,
    min: u64,
    max: u64,
) -> Result<u64, SpecError> {
    match get(field) {
        None => Ok(default),
        Some(v) => match v.trim().replace('_', "").parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(bad(
                field,
                format!("`{v}` is not a whole number from {min} to {max}"),
            )),
        },
    }
}

/// A client id MQTT 5 and 3.1.1 brokers all accept: 1 to 23 (3.1.1's guaranteed minimum) is not
/// enforced, but it must be non-empty UTF-8 without control characters and at most 256 bytes.
fn client_id(v: &str) -> Result<String, SpecError> {
    let v = v.trim();
    if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
        return Err(bad(
            "clientId",
            "must be 1 to 256 bytes without control characters",
        ));
    }
    Ok(v.to_string())
}

impl ConnectionSpec {
    /// Parse the fields of connection `name`; `get(field)` answers a field's value as given
    /// (`None`: not given; an empty value counts as not given).
    ///
    /// # Errors
    /// The first field that is missing, malformed, or contradicts another.
    pub fn parse(
        name: &str,
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> Result<Self, SpecError> {
        let get = |f: &'static str| get(f).filter(|v| !v.trim().is_empty());
        let url = get("url").ok_or_else(|| bad("url", "required"))?;
        let endpoint = Endpoint::parse(&url)?;
        let protocol = match get("protocolVersion").as_deref().map(str::trim) {
            None | Some("5" | "5.0") => Protocol::V5,
            Some("3.1.1" | "4") => Protocol::V311,
            Some(other) => {
                return Err(bad(
                    "protocolVersion",
                    format!("`{other}`: expected 5 or 3.1.1"),
                ))
            }
        };
        let client_id = match get("clientId") {
            Some(v) => client_id(&v)?,
            None => format!("gridlet-{name}"),
        };
        let username = get("username");
        let password = get("password").map(Secret);
        if password.is_some() && username.is_none() && protocol == Protocol::V311 {
            return Err(bad("password", "MQTT 3.1.1 needs a username with it"));
        }
        let enhanced_auth = match (
            get("authentication.method"),
            get("authentication.tokenFile"),
        ) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(bad("authentication.method", "required with a tokenFile"));
            }
            (Some(m), token) => {
                if !m.trim().eq_ignore_ascii_case(K8S_SAT) {
                    return Err(bad(
                        "authentication.method",
                        format!("`{m}`: only {K8S_SAT} is supported"),
                    ));
                }
                if protocol != Protocol::V5 {
                    return Err(bad(
                        "authentication.method",
                        "enhanced authentication needs MQTT 5 (protocolVersion 5)",
                    ));
                }
                let token_file = token.ok_or_else(|| {
                    bad(
                        "authentication.tokenFile",
                        format!("required with {K8S_SAT}"),
                    )
                })?;
                Some(EnhancedAuth::K8sSat {
                    token_file: PathBuf::from(token_file.trim()),
                })
            }
        };
        let ca_file = get("tls.caFile").map(|p| PathBuf::from(p.trim()));
        let client_identity = match (
            get("tls.clientIdentity"),
            get("tls.certFile"),
            get("tls.keyFile"),
        ) {
            (None, None, None) => ClientIdentity::None,
            (None, Some(cert), Some(key)) => ClientIdentity::Files {
                cert: PathBuf::from(cert.trim()),
                key: PathBuf::from(key.trim()),
            },
            (None, Some(_), None) => return Err(bad("tls.keyFile", "required with tls.certFile")),
            (None, None, Some(_)) => return Err(bad("tls.certFile", "required with tls.keyFile")),
            (Some(id), None, None) if id.trim().eq_ignore_ascii_case("IoTEdge") => {
                ClientIdentity::IotEdge
            }
            (Some(id), None, None) => {
                return Err(bad(
                    "tls.clientIdentity",
                    format!("`{id}`: expected IoTEdge"),
                ))
            }
            (Some(_), _, _) => {
                return Err(bad(
                    "tls.clientIdentity",
                    "give either tls.clientIdentity or tls.certFile and tls.keyFile, not both",
                ))
            }
        };
        if endpoint.scheme == Scheme::Mqtt {
            let tls_field = if ca_file.is_some() {
                Some("tls.caFile")
            } else if client_identity != ClientIdentity::None {
                Some("tls.clientIdentity")
            } else {
                None
            };
            if let Some(field) = tls_field {
                return Err(bad(field, "TLS settings need an mqtts:// url"));
            }
        }
        let clean_start = match get("cleanStart").as_deref().map(str::trim) {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(v) => return Err(bad("cleanStart", format!("`{v}`: expected true or false"))),
        };
        Ok(Self {
            name: name.to_string(),
            endpoint,
            client_id,
            protocol,
            username,
            password,
            enhanced_auth,
            ca_file,
            client_identity,
            keep_alive: Duration::from_secs(number(
                &get,
                "keepAliveSeconds",
                DEFAULT_KEEP_ALIVE_SECS,
                5,
                u64::from(u16::MAX),
            )?),
            clean_start,
            session_expiry_secs: number(
                &get,
                "sessionExpirySeconds",
                DEFAULT_SESSION_EXPIRY_SECS,
                0,
                u64::from(u32::MAX),
            )? as u32,
            receive_maximum: number(
                &get,
                "receiveMaximum",
                DEFAULT_RECEIVE_MAXIMUM,
                1,
                u64::from(u16::MAX),
            )? as u16,
            max_packet_bytes: number(
                &get,
                "maxPacketBytes",
                DEFAULT_MAX_PACKET_BYTES,
                1024,
                268_435_455,
            )? as u32,
        })
    }
}

mod options;

#[cfg(test)]
mod tests;
