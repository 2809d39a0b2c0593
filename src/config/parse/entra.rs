//! `inbound__clientAuth__entra__*`: Microsoft Entra ID access tokens. The JWKS file's keys are
//! read here, at start, so a bad file stops the start (and `check-config`) with an error naming
//! the setting, and requests never touch the disk. The fetched keys are the API's
//! (`api/entra/refresh.rs`); this checks where they come from.

use super::{comma_list, ConfigError, Raw, K};
use crate::config::types::{Entra, Jwk, JwksRefresh, Principal};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;
use std::path::PathBuf;

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
    let authority = authority(raw)?;
    let issuers = vec![
        format!("https://{}/{tenant}/", v1_issuer_host(&authority)),
        format!("{authority}/{tenant}/v2.0"),
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
    let every = raw.secs(
        K::inbound__clientAuth__entra__jwksRefreshIntervalInSeconds,
        0,
        30 * 86_400,
    )?;
    let min_interval = raw.secs(
        K::inbound__clientAuth__entra__jwksMinRefreshIntervalInSeconds,
        1,
        86_400,
    )?;
    let refresh = (!every.is_zero()).then(|| JwksRefresh {
        metadata_url: format!("{authority}/{tenant}/v2.0/.well-known/openid-configuration"),
        every: every.max(min_interval),
        min_interval,
        cache_path: PathBuf::from(raw.text(K::persistence__metadataPath)).join(CACHE_FILE),
    });
    let path = raw.text(K::inbound__clientAuth__entra__jwksPath);
    let key = K::inbound__clientAuth__entra__jwksPath;
    let keys = if path.is_empty() && refresh.is_some() {
        Vec::new()
    } else {
        let text = std::fs::read_to_string(path).map_err(|e| {
            raw.err(
                key,
                &format!(
                    "a readable JSON Web Key Set file when entra__enabled=true and {}=0 ({e})",
                    K::inbound__clientAuth__entra__jwksRefreshIntervalInSeconds.name()
                ),
            )
        })?;
        jwks(&text).map_err(|why| raw.err(key, &format!("a JSON Web Key Set: {why}")))?
    };
    Ok(Some(Entra {
        issuers,
        audiences,
        keys,
        refresh,
        senders: principals(raw, K::inbound__clientAuth__entra__senders)?,
        receivers: principals(raw, K::inbound__clientAuth__entra__receivers)?,
        clock_skew: raw.secs(K::inbound__clientAuth__entra__clockSkewInSeconds, 0, 3600)?,
    }))
}

/// The fetched key set's cache file, in the metadata directory.
const CACHE_FILE: &str = "entra-jwks.json";

/// `inbound__clientAuth__entra__authority` without a trailing `/`: an https URL with a host and
/// nothing after it but a path (no query, user or fragment).
fn authority(raw: &Raw) -> Result<String, ConfigError> {
    let key = K::inbound__clientAuth__entra__authority;
    let text = raw.text(key).trim_end_matches('/');
    let ok = url::Url::parse(text).ok().is_some_and(|u| {
        u.scheme() == "https"
            && u.host().is_some()
            && u.username().is_empty()
            && u.password().is_none()
            && u.query().is_none()
            && u.fragment().is_none()
    });
    if !ok {
        return Err(raw.err(
            key,
            "an https URL such as https://login.microsoftonline.com (keys are fetched over verified HTTPS only)",
        ));
    }
    Ok(text.to_string())
}

/// The host of v1 tokens' issuer (`https://{host}/{tenantId}/`) under `authority`: Microsoft's
/// China cloud has its own, every other cloud (the global one, US Government) `sts.windows.net`.
fn v1_issuer_host(authority: &str) -> &'static str {
    let host = url::Url::parse(authority)
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
        .unwrap_or_default();
    if host.ends_with(".cn") {
        "sts.chinacloudapi.cn"
    } else {
        "sts.windows.net"
    }
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
