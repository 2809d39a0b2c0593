//! Azure Storage Shared Key authorisation (the blob and queue scheme of version 2009-09-19 and
//! later): `Authorization: SharedKey {account}:{base64(HMAC-SHA256(base64-decoded key, string to
//! sign))}`, where the string to sign is
//!
//! ```text
//! VERB \n Content-Encoding \n Content-Language \n Content-Length (empty when 0) \n Content-MD5 \n
//! Content-Type \n Date \n If-Modified-Since \n If-Match \n If-None-Match \n If-Unmodified-Since \n
//! Range \n CanonicalizedHeaders CanonicalizedResource
//! ```
//!
//! `CanonicalizedHeaders` are the `x-ms-*` headers, lowercased, sorted, `name:value\n` each;
//! `CanonicalizedResource` is `/{account}{URL path}` then `\n{name}:{value}` per query parameter
//! (names lowercased, sorted). gridlet sends `x-ms-date` (not `Date`) and `x-ms-version`.

use base64::Engine as _;
use hyper::header::HeaderValue;

/// The `x-ms-version` gridlet speaks (Put Message, Put Blob).
pub const VERSION: &str = "2021-12-02";

/// An account's signing key.
pub struct SharedKey {
    account: String,
    key: ring::hmac::Key,
}

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKey")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// The parts of a request the signature covers.
pub struct Signed<'a> {
    /// `GET`, `PUT`, `POST`.
    pub method: &'a str,
    /// URL path as sent (percent-encoded).
    pub path: &'a str,
    /// Query parameters (as sent).
    pub query: &'a [(&'a str, &'a str)],
    /// Body length.
    pub content_length: usize,
    /// `Content-Type`, if sent.
    pub content_type: &'a str,
    /// Every `x-ms-*` header sent (name, value).
    pub ms_headers: &'a [(&'a str, &'a str)],
}

impl SharedKey {
    /// The key of `account`; `None` when `key_b64` is not base64 (refused at parse time).
    pub fn new(account: &str, key_b64: &str) -> Option<Self> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(key_b64)
            .ok()?;
        Some(Self {
            account: account.to_string(),
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &raw),
        })
    }

    /// The exact string signed for `r`.
    pub fn string_to_sign(&self, r: &Signed<'_>) -> String {
        let len = if r.content_length == 0 {
            String::new()
        } else {
            r.content_length.to_string()
        };
        let mut headers: Vec<(String, &str)> = r
            .ms_headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
            .collect();
        headers.sort();
        let mut s = format!(
            "{}\n\n\n{len}\n\n{}\n\n\n\n\n\n\n",
            r.method, r.content_type
        );
        for (n, v) in headers {
            s.push_str(&n);
            s.push(':');
            s.push_str(v);
            s.push('\n');
        }
        s.push('/');
        s.push_str(&self.account);
        s.push_str(r.path);
        let mut query: Vec<(String, &str)> = r
            .query
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), *v))
            .collect();
        query.sort();
        for (n, v) in query {
            s.push('\n');
            s.push_str(&n);
            s.push(':');
            s.push_str(v);
        }
        s
    }

    /// The `Authorization` header for `r` (sensitive).
    pub fn authorization(&self, r: &Signed<'_>) -> Option<HeaderValue> {
        let d = ring::hmac::sign(&self.key, self.string_to_sign(r).as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(d.as_ref());
        let mut v = HeaderValue::from_str(&format!("SharedKey {}:{sig}", self.account)).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_to_sign_has_the_documented_shape() {
        let k = SharedKey::new("acct", "a2V5").unwrap();
        let r = Signed {
            method: "POST",
            path: "/acct/q1/messages",
            query: &[("Timeout", "30"), ("a", "1")],
            content_length: 12,
            content_type: "application/xml",
            ms_headers: &[
                ("x-ms-version", VERSION),
                ("X-MS-Date", "Tue, 24 Nov 2026 12:00:00 GMT"),
            ],
        };
        assert_eq!(
            k.string_to_sign(&r),
            "POST\n\n\n12\n\napplication/xml\n\n\n\n\n\n\nx-ms-date:Tue, 24 Nov 2026 12:00:00 GMT\nx-ms-version:2021-12-02\n/acct/acct/q1/messages\na:1\ntimeout:30"
        );
        let empty = Signed {
            content_length: 0,
            query: &[],
            ..r
        };
        assert!(k.string_to_sign(&empty).starts_with("POST\n\n\n\n\n"));
        let a = k.authorization(&empty).unwrap();
        assert!(a.is_sensitive());
        assert!(a.to_str().unwrap().starts_with("SharedKey acct:"));
        assert!(SharedKey::new("a", "!!").is_none());
    }
}
