//! Azure connection strings and resource names, parsed once at subscription time (pure data: a
//! malformed string is a [`ConnError`] naming the missing or bad part, never a delivery-time
//! surprise).
//!
//! * Event Hubs / Service Bus take an **entity-level** string: `Endpoint=sb://NS/;` plus
//!   `SharedAccessKeyName=…;SharedAccessKey=…` or `SharedAccessSignature=…`, plus
//!   `EntityPath=…`. A namespace-level string (no `EntityPath`) is refused.
//! * Storage takes an **account** string: `DefaultEndpointsProtocol=…;AccountName=…;AccountKey=…`
//!   with `EndpointSuffix=…` (default `core.windows.net`) or explicit `QueueEndpoint=` /
//!   `BlobEndpoint=`; or `UseDevelopmentStorage=true` (Azurite's well-known account on
//!   `127.0.0.1:10000/10001`, optionally `DevelopmentStorageProxyUri=`).
//! * `UseDevelopmentEmulator=true` in an Event Hubs / Service Bus string means plain HTTP to the
//!   host given in `Endpoint` (Microsoft's own emulator convention).
//!
//! Keys are secrets: [`MessagingConn`] and [`StorageConn`] hide them in `Debug`.

use std::fmt;

/// Azurite's (and the old storage emulator's) well-known development account.
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// The development account's published key (not a secret: it is in Microsoft's docs).
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Why a connection string or name is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnError(pub String);

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnError {}

fn err(m: impl Into<String>) -> ConnError {
    ConnError(m.into())
}

/// `Key=Value;…` pairs; keys compared case-insensitively, values kept as given (a value may
/// contain `=`, e.g. base64 padding).
struct Pairs<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Pairs<'a> {
    fn parse(s: &'a str) -> Result<Self, ConnError> {
        let mut v = Vec::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            // Never echo the part: it may be a key.
            let (k, val) = part
                .split_once('=')
                .ok_or_else(|| err("connection string: every part must be Key=Value"))?;
            v.push((k.trim(), val.trim()));
        }
        if v.is_empty() {
            return Err(err("connection string is empty"));
        }
        Ok(Self(v))
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| *v)
            .filter(|v| !v.is_empty())
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// How an Event Hubs / Service Bus request is authorised.
#[derive(Clone, PartialEq, Eq)]
pub enum MessagingAuth {
    /// A shared access policy: tokens are signed here and renewed before they expire.
    Key {
        /// `SharedAccessKeyName`.
        name: String,
        /// `SharedAccessKey` (its UTF-8 bytes are the HMAC key).
        key: String,
    },
    /// A ready-made `SharedAccessSignature sr=…` token (used until it expires).
    Token(String),
}

impl fmt::Debug for MessagingAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key { name, .. } => write!(f, "Key {{ name: {name:?}, key: *** }}"),
            Self::Token(_) => f.write_str("Token(***)"),
        }
    }
}

/// An entity-level Event Hubs / Service Bus connection string.
#[derive(Clone, PartialEq, Eq)]
pub struct MessagingConn {
    /// `https` (or `http` with `UseDevelopmentEmulator=true`).
    pub scheme: &'static str,
    /// Namespace host, with `:port` when one was given (`NS.servicebus.windows.net`).
    pub host: String,
    /// `EntityPath`: the event hub, queue or topic.
    pub entity: String,
    /// Credentials.
    pub auth: MessagingAuth,
}

impl fmt::Debug for MessagingConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessagingConn")
            .field("scheme", &self.scheme)
            .field("host", &self.host)
            .field("entity", &self.entity)
            .field("auth", &"***")
            .finish()
    }
}

impl MessagingConn {
    /// Parse an entity-level string.
    ///
    /// # Errors
    /// A missing `Endpoint`, `EntityPath` (namespace-level string) or credential, or a bad
    /// endpoint URL; the message names the part.
    pub fn parse(s: &str) -> Result<Self, ConnError> {
        let p = Pairs::parse(s)?;
        let endpoint = p
            .get("Endpoint")
            .ok_or_else(|| err("connection string has no Endpoint=sb://NAMESPACE/"))?;
        let url = url::Url::parse(endpoint)
            .map_err(|_| err("connection string Endpoint is not a URL (sb://NAMESPACE/)"))?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| err("connection string Endpoint has no host"))?
            .to_ascii_lowercase();
        let host = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host,
        };
        let entity = p.get("EntityPath").ok_or_else(|| {
            err("connection string has no EntityPath: use the entity-level connection string (of the event hub, queue or topic), not the namespace's")
        })?;
        if entity.contains(['/', '?', '#', ' ']) {
            return Err(err(
                "connection string EntityPath must be a plain entity name",
            ));
        }
        let auth = match (
            p.get("SharedAccessSignature"),
            p.get("SharedAccessKeyName"),
            p.get("SharedAccessKey"),
        ) {
            (Some(sas), _, _) => {
                if !sas.starts_with("SharedAccessSignature ") {
                    return Err(err(
                        "connection string SharedAccessSignature must start with 'SharedAccessSignature sr='",
                    ));
                }
                MessagingAuth::Token(sas.to_string())
            }
            (None, Some(name), Some(key)) => MessagingAuth::Key {
                name: name.to_string(),
                key: key.to_string(),
            },
            (None, None, _) => {
                return Err(err(
                    "connection string has no SharedAccessKeyName (or SharedAccessSignature)",
                ))
            }
            (None, Some(_), None) => return Err(err("connection string has no SharedAccessKey")),
        };
        let scheme = if p.flag("UseDevelopmentEmulator") {
            "http"
        } else {
            "https"
        };
        Ok(Self {
            scheme,
            host,
            entity: entity.to_string(),
            auth,
        })
    }

    /// `{scheme}://{host}/{entity}`: the resource a token is signed for, and the messages URL's
    /// base.
    pub fn resource_uri(&self) -> String {
        format!("{}://{}/{}", self.scheme, self.host, self.entity)
    }

    /// The batch-send URL.
    pub fn messages_url(&self) -> String {
        format!(
            "{}/messages?timeout=60&api-version=2014-01",
            self.resource_uri()
        )
    }
}

/// A storage account connection string, resolved to service endpoints.
#[derive(Clone, PartialEq, Eq)]
pub struct StorageConn {
    /// Account name.
    pub account: String,
    /// Account key, base64 (decoded when signing).
    pub key: String,
    /// Queue service base URL, no trailing `/` (`https://ACCOUNT.queue.core.windows.net`, or
    /// path-style `http://127.0.0.1:10001/devstoreaccount1`).
    pub queue_endpoint: String,
    /// Blob service base URL, no trailing `/`.
    pub blob_endpoint: String,
    /// `SharedAccessSignature=` (the query string, no `?`): sent on each request's URL instead
    /// of Shared Key (`key` is then empty).
    pub sas: Option<String>,
}

impl fmt::Debug for StorageConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConn")
            .field("account", &self.account)
            .field("key", &"***")
            .field("queue_endpoint", &self.queue_endpoint)
            .field("blob_endpoint", &self.blob_endpoint)
            .field("sas", &self.sas.as_ref().map(|_| "***"))
            .finish()
    }
}

impl StorageConn {
    /// Parse an account string.
    ///
    /// # Errors
    /// A missing `AccountName`/`AccountKey`, an undecodable key, or no way to find the queue or
    /// blob endpoint; the message names the part.
    pub fn parse(s: &str) -> Result<Self, ConnError> {
        let p = Pairs::parse(s)?;
        if p.flag("UseDevelopmentStorage") {
            let base = p
                .get("DevelopmentStorageProxyUri")
                .unwrap_or("http://127.0.0.1")
                .trim_end_matches('/');
            return Ok(Self {
                account: DEV_ACCOUNT.into(),
                key: DEV_KEY.into(),
                queue_endpoint: format!("{base}:10001/{DEV_ACCOUNT}"),
                blob_endpoint: format!("{base}:10000/{DEV_ACCOUNT}"),
                sas: None,
            });
        }
        // A SAS instead of a key: `BlobEndpoint=…;QueueEndpoint=…;SharedAccessSignature=sv=…`.
        let sas = p
            .get("SharedAccessSignature")
            .map(|s| s.trim_start_matches('?').to_string());
        if sas.as_deref().is_some_and(|s| !s.contains("sig=")) {
            return Err(err(
                "connection string SharedAccessSignature must be a SAS query (sv=…&sig=…)",
            ));
        }
        let account = match (p.get("AccountName"), &sas) {
            (Some(a), _) => a,
            // Endpoints must then be explicit (checked below).
            (None, Some(_)) => "",
            (None, None) => return Err(err("connection string has no AccountName")),
        };
        let key = match (p.get("AccountKey"), &sas) {
            (_, Some(_)) => "",
            (Some(k), None) => k,
            (None, None) => {
                return Err(err(
                    "connection string has no AccountKey (or SharedAccessSignature)",
                ))
            }
        };
        use base64::Engine as _;
        if base64::engine::general_purpose::STANDARD
            .decode(key)
            .is_err()
        {
            return Err(err("connection string AccountKey is not base64"));
        }
        let protocol = p.get("DefaultEndpointsProtocol").unwrap_or("https");
        if !protocol.eq_ignore_ascii_case("https") && !protocol.eq_ignore_ascii_case("http") {
            return Err(err(
                "connection string DefaultEndpointsProtocol must be https or http",
            ));
        }
        let suffix = p.get("EndpointSuffix").unwrap_or("core.windows.net");
        let endpoint = |explicit: &str, service: &str| -> Result<String, ConnError> {
            match p.get(explicit) {
                Some(u) => {
                    let parsed = url::Url::parse(u).map_err(|_| {
                        err(format!(
                            "connection string {explicit} is not an absolute URL"
                        ))
                    })?;
                    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                        return Err(err(format!(
                            "connection string {explicit} must be an http(s) URL with a host"
                        )));
                    }
                    Ok(u.trim_end_matches('/').to_string())
                }
                None if account.is_empty() => Err(err(format!(
                    "connection string has no {explicit} (a SharedAccessSignature string names its endpoints, or its AccountName)"
                ))),
                None => Ok(format!(
                    "{}://{account}.{service}.{suffix}",
                    protocol.to_ascii_lowercase()
                )),
            }
        };
        // A SAS string may name only the service it is for: the other endpoint is checked
        // when a destination uses it.
        let either = |explicit: &str, service: &str| match (endpoint(explicit, service), &sas) {
            (Err(_), Some(_)) if p.get(explicit).is_none() => Ok(String::new()),
            (r, _) => r,
        };
        let (queue_endpoint, blob_endpoint) = (
            either("QueueEndpoint", "queue")?,
            either("BlobEndpoint", "blob")?,
        );
        if queue_endpoint.is_empty() && blob_endpoint.is_empty() {
            return Err(err(
                "connection string has no QueueEndpoint or BlobEndpoint (a SharedAccessSignature string names its endpoints)",
            ));
        }
        Ok(Self {
            account: account.to_string(),
            key: key.to_string(),
            queue_endpoint,
            blob_endpoint,
            sas,
        })
    }
}

/// How an event becomes a queue message's text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MessageEncoding {
    /// base64 of the event's JSON (the default).
    #[default]
    Base64,
    /// The event's JSON, XML-escaped.
    Text,
}

impl MessageEncoding {
    /// Parse a `messageEncoding` value (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "base64" => Some(Self::Base64),
            "text" => Some(Self::Text),
            _ => None,
        }
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Base64 => "base64",
            Self::Text => "text",
        }
    }
}

/// Storage queue naming rules: 3–63 characters, lowercase letters, digits and single hyphens,
/// beginning and ending with a letter or digit.
///
/// # Errors
/// The rule broken.
pub fn check_queue_name(name: &str) -> Result<(), ConnError> {
    check_dns_like(name, "queueName")
}

/// Blob container naming rules: the same as queues (`$root`, `$logs` and `$web` are refused:
/// dead letters do not go to system containers).
///
/// # Errors
/// The rule broken.
pub fn check_container_name(name: &str) -> Result<(), ConnError> {
    check_dns_like(name, "blobContainerName")
}

fn check_dns_like(name: &str, what: &str) -> Result<(), ConnError> {
    let n = name.len();
    if !(3..=63).contains(&n) {
        return Err(err(format!(
            "{what} must be 3 to 63 characters long (got {n})"
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(err(format!(
            "{what} may contain only lowercase letters, digits and hyphens"
        )));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(err(format!(
            "{what} must begin and end with a letter or a digit"
        )));
    }
    if name.contains("--") {
        return Err(err(format!("{what} must not contain consecutive hyphens")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EH: &str = "Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=abc=;EntityPath=hub1";

    #[test]
    fn entity_level_strings_parse() {
        let c = MessagingConn::parse(EH).unwrap();
        assert_eq!(c.scheme, "https");
        assert_eq!(c.host, "myns.servicebus.windows.net");
        assert_eq!(c.entity, "hub1");
        assert_eq!(
            c.auth,
            MessagingAuth::Key {
                name: "send".into(),
                key: "abc=".into()
            }
        );
        assert_eq!(
            c.messages_url(),
            "https://myns.servicebus.windows.net/hub1/messages?timeout=60&api-version=2014-01"
        );
        assert!(!format!("{c:?}").contains("abc="), "the key is hidden");
        // Case-insensitive keys, a ready-made token, the emulator switch with a port.
        let c = MessagingConn::parse(
            "endpoint=sb://127.0.0.1:5671;sharedaccesssignature=SharedAccessSignature sr=x&sig=y&se=1&skn=k;entitypath=q;UseDevelopmentEmulator=true",
        )
        .unwrap();
        assert_eq!(c.scheme, "http");
        assert_eq!(c.host, "127.0.0.1:5671");
        assert!(matches!(c.auth, MessagingAuth::Token(_)));
    }

    #[test]
    fn malformed_messaging_strings_name_the_missing_part() {
        let cases = [
            ("", "empty"),
            ("garbage", "Key=Value"),
            (
                "SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=e",
                "Endpoint",
            ),
            (
                "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=a;SharedAccessKey=b",
                "EntityPath",
            ),
            (
                "Endpoint=sb://ns.servicebus.windows.net/;EntityPath=e",
                "SharedAccessKeyName",
            ),
            (
                "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=a;EntityPath=e",
                "SharedAccessKey",
            ),
            (
                "Endpoint=not a url;SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=e",
                "Endpoint",
            ),
            (
                "Endpoint=sb://ns/;SharedAccessSignature=sig=x;EntityPath=e",
                "SharedAccessSignature",
            ),
        ];
        for (s, part) in cases {
            let e = MessagingConn::parse(s).unwrap_err();
            assert!(e.0.contains(part), "{s:?} -> {e}");
        }
    }

    #[test]
    fn storage_strings_resolve_endpoints() {
        let c = StorageConn::parse(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn",
        )
        .unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.chinacloudapi.cn");
        assert_eq!(c.blob_endpoint, "https://acct.blob.core.chinacloudapi.cn");
        assert!(!format!("{c:?}").contains("a2V5"));
        let c = StorageConn::parse("AccountName=acct;AccountKey=a2V5").unwrap();
        assert_eq!(c.queue_endpoint, "https://acct.queue.core.windows.net");
        let c = StorageConn::parse(&format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};QueueEndpoint=http://127.0.0.1:4000/{DEV_ACCOUNT}/;BlobEndpoint=http://127.0.0.1:4001/{DEV_ACCOUNT}"
        ))
        .unwrap();
        assert_eq!(c.queue_endpoint, "http://127.0.0.1:4000/devstoreaccount1");
        assert_eq!(c.blob_endpoint, "http://127.0.0.1:4001/devstoreaccount1");
        let c = StorageConn::parse("UseDevelopmentStorage=true").unwrap();
        assert_eq!(c.queue_endpoint, "http://127.0.0.1:10001/devstoreaccount1");
        assert_eq!(c.blob_endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        assert_eq!(c.key, DEV_KEY);
    }

    #[test]
    fn malformed_storage_strings_name_the_missing_part() {
        let cases = [
            ("AccountKey=a2V5", "AccountName"),
            ("AccountName=a", "AccountKey"),
            ("AccountName=a;AccountKey=!!!", "base64"),
            (
                "DefaultEndpointsProtocol=ftp;AccountName=a;AccountKey=a2V5",
                "DefaultEndpointsProtocol",
            ),
            (
                "AccountName=a;AccountKey=a2V5;QueueEndpoint=nope",
                "QueueEndpoint",
            ),
            (
                "Endpoint=sb://ns/;SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=e",
                "AccountName",
            ),
        ];
        for (s, part) in cases {
            let e = StorageConn::parse(s).unwrap_err();
            assert!(e.0.contains(part), "{s:?} -> {e}");
        }
    }

    #[test]
    fn storage_strings_may_carry_a_sas_instead_of_a_key() {
        let c = StorageConn::parse(
            "BlobEndpoint=https://a.blob.core.windows.net;QueueEndpoint=https://a.queue.core.windows.net;SharedAccessSignature=sv=2021-12-02&ss=bq&se=2026-11-25T20:00:00Z&sig=abc%3D",
        )
        .unwrap();
        assert_eq!(c.queue_endpoint, "https://a.queue.core.windows.net");
        assert_eq!(
            c.sas.as_deref(),
            Some("sv=2021-12-02&ss=bq&se=2026-11-25T20:00:00Z&sig=abc%3D")
        );
        assert!(c.key.is_empty());
        assert!(!format!("{c:?}").contains("sig="), "hidden in Debug");
        let only_queue = StorageConn::parse(
            "QueueEndpoint=https://a.queue.core.windows.net;SharedAccessSignature=?sv=1&sig=x",
        )
        .unwrap();
        assert_eq!(only_queue.blob_endpoint, "");
        assert!(
            StorageConn::parse("SharedAccessSignature=sv=1&sig=x").is_err(),
            "no endpoint"
        );
        assert!(
            StorageConn::parse("QueueEndpoint=https://q;SharedAccessSignature=sv=1").is_err(),
            "no sig"
        );
    }

    #[test]
    fn queue_and_container_names_follow_the_storage_rules() {
        for ok in ["abc", "my-queue-1", "a1b", &"a".repeat(63)] {
            check_queue_name(ok).unwrap();
            check_container_name(ok).unwrap();
        }
        for (bad, why) in [
            ("ab", "3 to 63"),
            (&"a".repeat(64) as &str, "3 to 63"),
            ("MyQueue", "lowercase"),
            ("my_queue", "lowercase"),
            ("-abc", "begin and end"),
            ("abc-", "begin and end"),
            ("a--b", "consecutive"),
            ("$root", "lowercase"),
        ] {
            let e = check_queue_name(bad).unwrap_err();
            assert!(e.0.contains(why), "{bad} -> {e}");
        }
    }
}
