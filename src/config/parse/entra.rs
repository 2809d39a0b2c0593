//! `inbound__clientAuth__entra__*`: Microsoft Entra ID access tokens. The signing keys are read
//! from the JWKS file here, at start, so a bad file stops the start (and `check-config`) with an
//! error naming the setting, and requests never touch the disk.

use super::{comma_list, ConfigError, Raw, K};
use crate::config::types::{Entra, Jwk, Principal};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;

/// The Entra settings, or `None` when Entra tokens are disabled.
pub(in crate::config) fn entra(raw: &Raw) -> Result<Option<Entra>, ConfigError> {
    if !raw.bool(K::inbound__clientAuth__entra__enabled)? {
        return Ok(None);
    }
    let tenant = raw
        .text(K::inbound__clientAuth__entra__tenantId)
        .to_string();
    if tenant.is_empty()
        || !tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(raw.err(
            K::inbound__clientAuth__entra__tenantId,
            "the tenant (directory) id, a GUID, when entra__enabled=true",
        ));
    }
    let issuers = vec![
        format!("https://sts.windows.net/{tenant}/"),
        format!("https://login.microsoftonline.com/{tenant}/v2.0"),
    ];
    let audiences: Vec<String> =
        comma_list(Some(raw.text(K::inbound__clientAuth__entra__audience)))
            .into_iter()
            .map(|a| a.trim_end_matches('/').to_string())
            .collect();
    if audiences.is_empty() {
        return Err(raw.err(
            K::inbound__clientAuth__entra__audience,
            "at least one audience",
        ));
    }
    let path = raw.text(K::inbound__clientAuth__entra__jwksPath);
    let key = K::inbound__clientAuth__entra__jwksPath;
    let text = std::fs::read_to_string(path).map_err(|e| {
        raw.err(
            key,
            &format!("a readable JSON Web Key Set file when entra__enabled=true ({e})"),
        )
    })?;
    let keys = jwks(&text).map_err(|why| raw.err(key, &format!("a JSON Web Key Set: {why}")))?;
    Ok(Some(Entra {
        issuers,
        audiences,
        keys,
        senders: principals(raw, K::inbound__clientAuth__entra__senders)?,
        receivers: principals(raw, K::inbound__clientAuth__entra__receivers)?,
        clock_skew: raw.secs(K::inbound__clientAuth__entra__clockSkewInSeconds, 0, 3600)?,
    }))
}

/// `tenantId/objectId, ...`, lowercased (GUIDs compare case-insensitively).
fn principals(raw: &Raw, key: K) -> Result<Vec<Principal>, ConfigError> {
    comma_list(Some(raw.text(key)))
        .iter()
        .map(|p| {
            p.split_once('/')
                .filter(|(t, o)| !t.trim().is_empty() && !o.trim().is_empty())
                .map(|(t, o)| Principal {
                    tenant: t.trim().to_ascii_lowercase(),
                    object: o.trim().to_ascii_lowercase(),
                })
                .ok_or_else(|| raw.err(key, "comma-separated tenantId/objectId entries"))
        })
        .collect()
}

/// The RSA signing keys of a JWKS document (`{"keys": [{"kty": "RSA", "kid", "n", "e"}]}`).
/// Keys of other types, or marked for encryption (`"use": "enc"`), are skipped; a set with no
/// usable key is an error.
pub(crate) fn jwks(text: &str) -> Result<Vec<Jwk>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let list = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("no \"keys\" array")?;
    let mut keys = Vec::new();
    for k in list {
        let field = |name: &str| k.get(name).and_then(Value::as_str);
        if field("kty") != Some("RSA") || field("use").is_some_and(|u| u != "sig") {
            continue;
        }
        let kid = field("kid").ok_or("an RSA key without a \"kid\"")?;
        let number = |name: &str| {
            field(name)
                .and_then(|v| URL_SAFE_NO_PAD.decode(v.trim_end_matches('=')).ok())
                .filter(|b| !b.is_empty())
                .ok_or_else(|| format!("key {kid}: \"{name}\" is not base64url"))
        };
        keys.push(Jwk {
            kid: kid.to_string(),
            n: number("n")?,
            e: number("e")?,
        });
    }
    if keys.is_empty() {
        return Err("no RSA signing key".into());
    }
    Ok(keys)
}
