//! Microsoft Entra ID access tokens: the JSON Web Tokens a client built with
//! `DefaultAzureCredential` sends as `Authorization: Bearer <token>`. [`verify`] checks one
//! against the tenant's settings ([`Entra`]) and returns its principal; what that principal may
//! do is decided in [`super::auth`].
//!
//! A token is `base64url(header).base64url(claims).base64url(signature)`. Only RS256 (RSASSA
//! PKCS#1 v1.5 with SHA-256, a 2048 to 8192-bit key) is accepted, the algorithm Entra signs
//! access tokens with. The header's `alg` is checked before any key is used: `none` and every
//! other algorithm are refused, so an HS256 token "signed" with the public key as an HMAC secret
//! (algorithm confusion) never reaches a verifier. The key is the JWKS entry the header's `kid`
//! (v1 tokens: also `x5t`) names; an unknown id is refused. Then the claims: `iss` must be the
//! tenant's v1 or v2 issuer, `aud` one of the configured audiences, `exp` not past and `nbf` not
//! ahead, both with the configured clock skew; `tid` and `oid` name the principal.
//!
//! Refusals say which check failed, never echo the token, and echo header values only when they
//! are short and plain.
//!
//! The keys ([`Keys`]) are the JWKS file's (`jwksPath`, read at start) and the tenant's current
//! set, fetched from its OpenID metadata by [`refresh`] periodically, at once when a token names
//! an unknown key id (at most once per `jwksMinRefreshIntervalInSeconds`), and cached on disk for
//! a start without the network.

mod keys;
pub mod refresh;

pub use keys::Keys;

use crate::config::{Entra, Jwk, Principal};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{RsaPublicKeyComponents, RSA_PKCS1_2048_8192_SHA256};
use serde_json::Value;

/// Why a token was refused: a sentence for the 401's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The sentence.
    pub message: String,
    /// The token names a key id that none of the keys has (a fetch of the tenant's current keys
    /// may know it).
    pub unknown_key: bool,
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Self {
            message,
            unknown_key: false,
        }
    }
}

/// The principal of `token` if it passes every check in the module docs at `now` (Unix
/// seconds), its signature made by one of `keys`.
///
/// # Errors
/// Which check failed.
pub fn verify(cfg: &Entra, keys: &[Jwk], token: &str, now: u64) -> Result<Principal, Refusal> {
    let mut parts = token.trim().split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JSON Web Token (three base64url parts separated by '.')".into());
    };
    let header = json_part(h, "header")?;
    let text = |name: &str| header.get(name).and_then(Value::as_str);
    match text("alg") {
        Some("RS256") => {}
        Some(alg) if alg.eq_ignore_ascii_case("none") => {
            return Err("alg none (an unsigned token) is refused: only RS256 is accepted".into())
        }
        Some(alg) => {
            return Err(format!("alg {} is refused: only RS256 is accepted", shown(alg)).into())
        }
        None => return Err("the header names no alg".into()),
    }
    let kid = text("kid")
        .or_else(|| text("x5t"))
        .ok_or("the header names no signing key (kid)")?;
    let key = keys.iter().find(|k| k.kid == kid).ok_or_else(|| Refusal {
        message: format!(
            "key id {} is not one of the tenant's signing keys (fetched from {}, or in {})",
            shown(kid),
            crate::config::Key::inbound__clientAuth__entra__authority.name(),
            crate::config::Key::inbound__clientAuth__entra__jwksPath.name()
        ),
        unknown_key: true,
    })?;
    let signature = decode(s).ok_or("the signature is not base64url")?;
    // The signed text is the first two parts exactly as sent.
    let signed = &token.trim()[..h.len() + 1 + c.len()];
    if !signature_verifies(key, signed.as_bytes(), &signature) {
        return Err("the signature does not verify under the tenant's key".into());
    }
    let claims = json_part(c, "claims")?;
    let claim = |name: &str| claims.get(name).and_then(Value::as_str);
    let iss = claim("iss").unwrap_or_default();
    if !cfg.issuers.iter().any(|i| i == iss) {
        return Err(format!(
            "the issuer is not the configured tenant's ({})",
            crate::config::Key::inbound__clientAuth__entra__tenantId.name()
        )
        .into());
    }
    let audience_ok = |a: &Value| {
        a.as_str().is_some_and(|a| {
            let a = a.trim_end_matches('/');
            cfg.audiences.iter().any(|w| w.eq_ignore_ascii_case(a))
        })
    };
    let aud_ok = match claims.get("aud") {
        Some(Value::Array(list)) => list.iter().any(audience_ok),
        Some(a) => audience_ok(a),
        None => false,
    };
    if !aud_ok {
        return Err(format!(
            "the audience is not one of {} (get the token for the scope https://eventgrid.azure.net/.default)",
            cfg.audiences.join(", ")
        )
        .into());
    }
    let skew = cfg.clock_skew.as_secs();
    let time = |name: &str| claims.get(name).and_then(Value::as_f64).map(|t| t as u64);
    let exp = time("exp").ok_or("the token has no expiry (exp)")?;
    if now >= exp.saturating_add(skew) {
        return Err("the token has expired".into());
    }
    if time("nbf").is_some_and(|nbf| now.saturating_add(skew) < nbf) {
        return Err("the token is not valid yet (nbf)".into());
    }
    match (claim("tid"), claim("oid")) {
        (Some(t), Some(o)) if !t.is_empty() && !o.is_empty() => Ok(Principal {
            tenant: t.to_ascii_lowercase(),
            object: o.to_ascii_lowercase(),
        }),
        _ => Err("the token names no principal (tid and oid)".into()),
    }
}

/// Whether `signature` is `key`'s RS256 signature of `signed`.
fn signature_verifies(key: &Jwk, signed: &[u8], signature: &[u8]) -> bool {
    RsaPublicKeyComponents {
        n: &key.n,
        e: &key.e,
    }
    .verify(&RSA_PKCS1_2048_8192_SHA256, signed, signature)
    .is_ok()
}

/// A base64url part (padding tolerated).
fn decode(part: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).ok()
}

/// A base64url part holding a JSON object.
fn json_part(part: &str, what: &str) -> Result<Value, Refusal> {
    decode(part)
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .filter(Value::is_object)
        .ok_or_else(|| format!("the {what} is not base64url JSON").into())
}

/// A header value fit to echo: short and plain, else a placeholder.
fn shown(v: &str) -> &str {
    let plain = v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=+/.".contains(&b));
    if plain {
        v
    } else {
        "(not shown)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg() -> Entra {
        Entra {
            issuers: vec!["https://sts.windows.net/t/".into()],
            audiences: vec!["https://eventgrid.azure.net".into()],
            keys: vec![Jwk {
                kid: "k".into(),
                n: vec![1; 256],
                e: vec![1, 0, 1],
            }],
            refresh: None,
            senders: vec![],
            receivers: vec![],
            clock_skew: Duration::from_secs(300),
        }
    }

    fn token(header: &str, claims: &str, sig: &str) -> String {
        format!(
            "{}.{}.{sig}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims)
        )
    }

    /// What is refused before any key is used (the signed cases are `tests/it/entra.rs`).
    #[test]
    fn malformed_and_unsupported_tokens_are_refused_before_the_signature() {
        let c = cfg();
        let refusal = |t: &str| verify(&c, &c.keys, t, 1000).unwrap_err().message;
        assert!(refusal("a.b").contains("not a JSON Web Token"));
        assert!(refusal("a.b.c.d").contains("not a JSON Web Token"));
        assert!(refusal(&token("[1]", "{}", "")).contains("header is not base64url JSON"));
        assert!(refusal(&token("{}", "{}", "")).contains("no alg"));
        assert!(refusal(&token(r#"{"alg":"NONE"}"#, "{}", "")).contains("alg none"));
        for alg in ["HS256", "RS384", "PS256", "ES256"] {
            let h = format!(r#"{{"alg":"{alg}","kid":"k"}}"#);
            assert!(refusal(&token(&h, "{}", "AA")).contains(&format!("alg {alg} is refused")));
        }
        // A header value that is not plain is not echoed.
        let h = r#"{"alg":"<script>","kid":"k"}"#;
        assert!(refusal(&token(h, "{}", "")).contains("alg (not shown)"));
        assert!(refusal(&token(r#"{"alg":"RS256"}"#, "{}", "")).contains("no signing key"));
        let e = refusal(&token(r#"{"alg":"RS256","kid":"other"}"#, "{}", ""));
        assert!(e.contains("key id other is not one of"), "{e}");
        let unknown = verify(
            &c,
            &c.keys,
            &token(r#"{"alg":"RS256","kid":"o"}"#, "{}", ""),
            0,
        );
        assert!(unknown.unwrap_err().unknown_key);
        let known = verify(
            &c,
            &c.keys,
            &token(r#"{"alg":"RS256","kid":"k"}"#, "{}", ""),
            0,
        );
        assert!(!known.unwrap_err().unknown_key);
        let e = refusal(&token(r#"{"alg":"RS256","kid":"k"}"#, "{}", "!!"));
        assert!(e.contains("signature is not base64url"), "{e}");
        let e = refusal(&token(r#"{"alg":"RS256","x5t":"k"}"#, "{}", "AAAA"));
        assert!(e.contains("does not verify"), "{e}");
    }
}
