//! Event Grid's shared access signatures: `r={resource}&e={expiry}&s={signature}`, sent as
//! `aeg-sas-token: <token>` or `Authorization: SharedAccessSignature <token>`, where the
//! signature is base64 HMAC-SHA256, under the key (base64-decoded, as Event Grid's keys are; the
//! key's own bytes when it is not base64), of the token's text before `&s=`. The SDKs'
//! `generate_sas` / `generateSharedAccessSignature` make them; the expiry is UTC as Unix
//! seconds, ISO 8601 (`2026-11-25T20:00:00Z`, `2026-11-25 20:00:00+00:00`) or .NET's
//! `11/25/2026 8:00:00 PM`. Which resource `r` names is not checked: the key is gridlet's.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use percent_encoding::percent_decode_str;
use ring::hmac;

/// The token's expiry (Unix seconds) and whether `key` signed it.
pub fn signed_with(token: &str, key: &str) -> Option<u64> {
    let token = token.trim();
    let (signed, sig) = token.rsplit_once("&s=")?;
    let sig = percent_decode_str(sig).decode_utf8().ok()?;
    let sig = STANDARD.decode(sig.trim()).ok()?;
    let e = signed.split('&').find_map(|kv| kv.strip_prefix("e="))?;
    let expiry = expiry(&percent_decode_str(e).decode_utf8().ok()?)?;
    let decoded = STANDARD.decode(key).ok().filter(|k| !k.is_empty());
    let verifies = |k: &[u8]| {
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, k),
            signed.as_bytes(),
            &sig,
        )
        .is_ok()
    };
    let ok = decoded.as_deref().is_some_and(verifies) || verifies(key.as_bytes());
    ok.then_some(expiry)
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

    fn make(key: &[u8], e: &str) -> String {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let unsigned = format!(
            "r={}&e={}",
            enc("https://gridlet/api/events?apiVersion=2018-01-01"),
            enc(e)
        );
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), unsigned.as_bytes());
        format!("{unsigned}&s={}", enc(&STANDARD.encode(tag.as_ref())))
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
    }
}
