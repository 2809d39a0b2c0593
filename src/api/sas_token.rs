//! Event Grid's shared access signatures: `r={resource}&e={expiry}&s={signature}`, sent as
//! `aeg-sas-token: <token>` or `Authorization: SharedAccessSignature <token>`, where the
//! signature is base64 HMAC-SHA256, under the key (base64-decoded, as Event Grid's keys are; the
//! key's own bytes when it is not base64), of the token's text before `&s=`. The SDKs'
//! `generate_sas` / `generateSharedAccessSignature` make them.
//!
//! * `e`, the expiry, UTC: Unix seconds, or a date URL-encoded as Event Grid writes it: ISO 8601
//!   (`2026-11-25T20:00:00Z`, Python's `2026-11-25 20:00:00+00:00`) or .NET's
//!   `11/25/2026 8:00:00 PM`. Years past 9999 parse as nothing.
//! * `r`, the resource the token is for: a URL (scheme optional). [`Resource::covers`] is Event
//!   Grid's rule: the token is valid for every path its own path prefixes at a segment boundary,
//!   compared case-insensitively. What a token may do there is decided in [`super::auth`].

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use percent_encoding::percent_decode_str;
use ring::hmac;

/// A token's fields, read before any key is tried.
pub struct Token<'a> {
    /// The text the signature covers (everything before `&s=`).
    signed: &'a str,
    /// The signature's bytes.
    sig: Vec<u8>,
    /// `r`, percent-decoded.
    pub resource: String,
    /// `e`, as Unix seconds.
    pub expiry: u64,
}

impl<'a> Token<'a> {
    /// The fields of `token`, or `None` when one is missing or unreadable.
    pub fn parse(token: &'a str) -> Option<Self> {
        let token = token.trim();
        let (signed, sig) = token.rsplit_once("&s=")?;
        let sig = percent_decode_str(sig).decode_utf8().ok()?;
        let sig = STANDARD.decode(sig.trim()).ok()?;
        let field = |name: &str| {
            signed
                .split('&')
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| percent_decode_str(v).decode_utf8().ok())
        };
        let expiry = expiry(&field("e=")?)?;
        let resource = field("r=")?.into_owned();
        Some(Self {
            signed,
            sig,
            resource,
            expiry,
        })
    }

    /// Whether `key` signed the token.
    pub fn signed_with(&self, key: &str) -> bool {
        let verifies = |k: &[u8]| {
            hmac::verify(
                &hmac::Key::new(hmac::HMAC_SHA256, k),
                self.signed.as_bytes(),
                &self.sig,
            )
            .is_ok()
        };
        let decoded = STANDARD.decode(key).ok().filter(|k| !k.is_empty());
        decoded.as_deref().is_some_and(verifies) | verifies(key.as_bytes())
    }
}

/// The resource a token names: the host and the path it is valid under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The host name or address, lowercase, without port.
    pub host: String,
    /// The path, lowercase, without a trailing `/` (empty: the whole broker).
    path: String,
}

impl Resource {
    /// `r` read as a URL (`https://` assumed when it names no scheme); its query is ignored.
    pub fn parse(r: &str) -> Option<Self> {
        let with_scheme;
        let r = if r.contains("://") {
            r
        } else {
            with_scheme = format!("https://{r}");
            &with_scheme
        };
        let u = url::Url::parse(r).ok()?;
        let host = match u.host()? {
            url::Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
            url::Host::Ipv4(ip) => ip.to_string(),
            url::Host::Ipv6(ip) => format!("[{ip}]"),
        };
        Some(Self {
            host,
            path: u.path().trim_end_matches('/').to_ascii_lowercase(),
        })
    }

    /// The whole broker: `r` names a host and no path.
    pub fn is_root(&self) -> bool {
        self.path.is_empty()
    }

    /// Whether `path` is this resource or under it: the resource's path prefixes it, compared
    /// case-insensitively, at a segment boundary (`/`, or the `:` before a namespace action
    /// such as `:publish`). `/topics/t` covers `/topics/t/events` and `/topics/t:publish`, not
    /// `/topics/t2`.
    pub fn covers(&self, path: &str) -> bool {
        let p = self.path.as_bytes();
        let q = path.as_bytes();
        q.len() >= p.len()
            && q[..p.len()].eq_ignore_ascii_case(p)
            && matches!(q.get(p.len()), None | Some(b'/' | b':'))
    }
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "https://{}{}", self.host, self.path)
    }
}

/// An expiry in one of the forms the module docs list, as Unix seconds.
fn expiry(e: &str) -> Option<u64> {
    let e = e.trim();
    if let Ok(n) = e.parse::<u64>() {
        return Some(n);
    }
    // .NET en-US: M/d/yyyy h:mm:ss AM|PM
    if let Some((date, rest)) = e.split_once(' ').filter(|(d, _)| d.contains('/')) {
        let mut d = date.split('/');
        let (mo, day, y) = (d.next()?, d.next()?, d.next()?);
        let (time, ampm) = rest.trim().split_once(' ').unwrap_or((rest.trim(), ""));
        let mut t = time.split(':');
        let mut h: u32 = t.next()?.parse().ok()?;
        let (mi, s) = (t.next()?, t.next().unwrap_or("0"));
        match ampm.to_ascii_uppercase().as_str() {
            "PM" if h < 12 => h += 12,
            "AM" if h == 12 => h = 0,
            _ => {}
        }
        let iso = format!("{y:0>4}-{mo:0>2}-{day:0>2}T{h:02}:{mi:0>2}:{s:0>2}Z");
        return crate::model::sas::expiry(&format!("se={iso}"));
    }
    // ISO 8601 / Python's str(datetime), UTC only.
    let mut iso = e.replacen(' ', "T", 1);
    for utc in ["+00:00", "+0000"] {
        if let Some(stripped) = iso.strip_suffix(utc) {
            iso = format!("{stripped}Z");
        }
    }
    if !iso.ends_with('Z') {
        iso.push('Z');
    }
    crate::model::sas::expiry(&format!("se={iso}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(s: &str) -> String {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    }

    fn make(key: &[u8], e: &str) -> String {
        let unsigned = format!(
            "r={}&e={}",
            enc("https://gridlet/topics/t/events?api-version=2018-01-01"),
            enc(e)
        );
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), unsigned.as_bytes());
        format!("{unsigned}&s={}", enc(&STANDARD.encode(tag.as_ref())))
    }

    fn signed_with(token: &str, key: &str) -> Option<u64> {
        Token::parse(token)
            .filter(|t| t.signed_with(key))
            .map(|t| t.expiry)
    }

    #[test]
    fn tokens_verify_under_the_key_that_signed_them() {
        let key = STANDARD.encode(b"0123456789abcdef0123456789abcdef");
        let t = make(
            b"0123456789abcdef0123456789abcdef",
            "2026-11-25 20:00:00+00:00",
        );
        assert_eq!(signed_with(&t, &key), Some(1_795_636_800));
        assert_eq!(signed_with(&t, &STANDARD.encode(b"another key")), None);
        // A key that is not base64 signs with its own bytes.
        let t = make(b"plain key!", "1800000000");
        assert_eq!(signed_with(&t, "plain key!"), Some(1_800_000_000));
        let t = make(b"plain key!", "11/25/2026 8:00:00 PM");
        assert_eq!(signed_with(&t, "plain key!"), Some(1_795_636_800));
        let t = make(b"plain key!", "2026-11-25T20:00:00Z");
        assert_eq!(signed_with(&t, "plain key!"), Some(1_795_636_800));
        assert_eq!(signed_with("r=x&e=1&s=", "k"), None);
        assert_eq!(signed_with("junk", "k"), None);
        assert_eq!(signed_with("e=1&s=AAAA", "k"), None, "no r");
    }

    /// Issue 37, Medium 2: absurd expiries are read as what they are (or as nothing), so the
    /// lifetime check in `auth` refuses them; none overflows.
    #[test]
    fn absurd_expiries_parse_as_far_future_or_not_at_all() {
        assert_eq!(expiry("18446744073709551615"), Some(u64::MAX));
        assert_eq!(expiry("9999-12-31T23:59:59Z"), Some(253_402_300_799));
        assert_eq!(expiry("12/31/9999 11:59:59 PM"), Some(253_402_300_799));
        assert_eq!(expiry("99999999999-01-01T00:00:00Z"), None);
        assert_eq!(expiry("18446744073709551616"), None);
        assert_eq!(expiry("soon"), None);
    }

    #[test]
    fn a_resource_covers_the_paths_it_prefixes_at_a_segment_boundary() {
        let r = Resource::parse("https://Gridlet:4438/Topics/T/?api-version=1").unwrap();
        assert_eq!(r.host, "gridlet");
        assert_eq!(r.to_string(), "https://gridlet/topics/t");
        assert!(!r.is_root());
        for yes in [
            "/topics/t",
            "/topics/t/events",
            "/TOPICS/t:publish",
            "/topics/t/",
        ] {
            assert!(r.covers(yes), "{yes}");
        }
        for no in ["/topics/t2", "/topics", "/", "/topics/tx/events", ""] {
            assert!(!r.covers(no), "{no}");
        }
        let root = Resource::parse("https://gridlet").unwrap();
        assert!(root.is_root() && root.covers("/topics/t"));
        assert_eq!(Resource::parse("gridlet/topics/t").unwrap().host, "gridlet");
        assert_eq!(
            Resource::parse("https://10.0.0.1/").unwrap().host,
            "10.0.0.1"
        );
        assert_eq!(
            Resource::parse("https://[::1]:4438/").unwrap().host,
            "[::1]"
        );
        assert!(Resource::parse("https://").is_none());
    }
}
