//! Event Hubs / Service Bus SAS tokens: `SharedAccessSignature sr={enc(uri)}&sig={enc(sig)}&se={expiry}&skn={name}`
//! where `sig = base64(HMAC-SHA256(key, enc(uri) + "\n" + expiry))`, the key's UTF-8 bytes being the
//! HMAC key and `enc` URL component encoding.
//!
//! A [`TokenSource`] signs one token per entity and keeps it until [`RENEW_BEFORE`] its expiry
//! ([`TOKEN_TTL`] after signing), so a request costs one cached header clone, not an HMAC. A
//! token given ready-made in the connection string is used as it is. Tokens are secrets: the
//! header value is marked sensitive and nothing here is `Debug`-printed with its value.

use crate::model::azure::MessagingAuth;
use base64::Engine as _;
use hyper::header::HeaderValue;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::sync::Mutex;

/// Lifetime of a token signed here.
pub const TOKEN_TTL: u64 = 3600;
/// A cached token is replaced this long before it expires (clock skew, long requests).
pub const RENEW_BEFORE: u64 = 300;

/// Everything but unreserved characters (RFC 3986) is encoded.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// URL component encoding.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// The token for `resource_uri` valid until `expiry` (Unix seconds), signed with `key`.
pub fn sign(resource_uri: &str, key_name: &str, key: &str, expiry: u64) -> String {
    let sr = encode(resource_uri);
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    let digest = ring::hmac::sign(&hmac, format!("{sr}\n{expiry}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    format!(
        "SharedAccessSignature sr={sr}&sig={}&se={expiry}&skn={}",
        encode(&sig),
        encode(key_name)
    )
}

/// Tokens for one entity, signed on demand and cached.
pub struct TokenSource {
    resource_uri: String,
    auth: MessagingAuth,
    cached: Mutex<Option<(HeaderValue, u64)>>,
}

impl TokenSource {
    /// Tokens for `resource_uri` from `auth`.
    pub fn new(resource_uri: String, auth: MessagingAuth) -> Self {
        Self {
            resource_uri,
            auth,
            cached: Mutex::new(None),
        }
    }

    /// The `Authorization` value at `now` (Unix seconds): the cached token, or a new one when
    /// the cached one expires within [`RENEW_BEFORE`].
    pub fn header(&self, now: u64) -> Option<HeaderValue> {
        let (name, key) = match &self.auth {
            MessagingAuth::Token(t) => {
                let mut v = HeaderValue::from_str(t).ok()?;
                v.set_sensitive(true);
                return Some(v);
            }
            MessagingAuth::Key { name, key } => (name, key),
        };
        let mut cached = crate::sync::lock(&self.cached);
        if let Some((v, expiry)) = cached.as_ref() {
            if now + RENEW_BEFORE < *expiry {
                return Some(v.clone());
            }
        }
        let expiry = now + TOKEN_TTL;
        let mut v = HeaderValue::from_str(&sign(&self.resource_uri, name, key, expiry)).ok()?;
        v.set_sensitive(true);
        *cached = Some((v.clone(), expiry));
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_the_documented_hmac() {
        let uri = "https://myns.servicebus.windows.net/hub1";
        let t = sign(uri, "send", "secretkey", 1_700_000_000);
        let sr = "https%3A%2F%2Fmyns.servicebus.windows.net%2Fhub1";
        let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"secretkey");
        let d = ring::hmac::sign(&hmac, format!("{sr}\n1700000000").as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(d.as_ref());
        assert_eq!(
            t,
            format!(
                "SharedAccessSignature sr={sr}&sig={}&se=1700000000&skn=send",
                encode(&sig)
            )
        );
    }

    #[test]
    fn tokens_are_cached_and_renewed_before_expiry() {
        let s = TokenSource::new(
            "https://ns/e".into(),
            MessagingAuth::Key {
                name: "n".into(),
                key: "k".into(),
            },
        );
        let a = s.header(1000).unwrap();
        assert!(a.is_sensitive());
        assert_eq!(s.header(1000 + TOKEN_TTL - RENEW_BEFORE - 1).unwrap(), a);
        let b = s.header(1000 + TOKEN_TTL - RENEW_BEFORE).unwrap();
        assert_ne!(a, b, "renewed");
        assert!(b
            .to_str()
            .unwrap()
            .contains(&format!("se={}", 1000 + 2 * TOKEN_TTL - RENEW_BEFORE)));
        let fixed = TokenSource::new(
            "https://ns/e".into(),
            MessagingAuth::Token("SharedAccessSignature sr=a&sig=b&se=1&skn=c".into()),
        );
        assert_eq!(
            fixed.header(5).unwrap(),
            "SharedAccessSignature sr=a&sig=b&se=1&skn=c"
        );
    }
}
