//! Fetching the tenant's signing keys: `GET {authority}/{tenantId}/v2.0/.well-known/
//! openid-configuration`, then its `jwks_uri`, both over HTTPS with the certificate chain and host
//! name verified (the client the server gives, [`Https`]); never a redirect, never plain HTTP.
//!
//! [`run`] fetches at start, then every `jwksRefreshIntervalInSeconds`; after a failure again
//! after `jwksMinRefreshIntervalInSeconds`, doubling up to the refresh interval; and whenever a
//! token names an unknown key id ([`Keys::ask_for_fetch`] limits those). A fetched set replaces
//! the last one and is written to the cache file ([`write_cache`]), which the next start reads
//! ([`restore_cache`]) before any fetch: a device that starts offline verifies with the last keys.
//! A failure is a warning in the log and the readiness detail; the keys in use stay.

use super::keys::{Fetched, Keys};
use crate::clock::Clock;
use crate::config::Key;
use crate::outbound::http::HttpClient;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Largest OpenID metadata document read.
const MAX_METADATA_BYTES: usize = 64 * 1024;
/// Largest key set read (Microsoft's is about 10 KiB).
const MAX_JWKS_BYTES: usize = 256 * 1024;
/// How long a request whose token names an unknown key id waits for the fetch it asked for.
pub const WAIT_FOR_FETCH: Duration = Duration::from_secs(25);

/// Where key sets come from: [`Https`] in production.
pub trait Source: Send + Sync + 'static {
    /// The tenant's current key set document (JWKS), or why not.
    fn fetch(&self) -> BoxFuture<'_, Result<String, String>>;
}

/// The tenant's OpenID metadata and key set over verified HTTPS.
pub struct Https {
    client: HttpClient,
    metadata_url: String,
}

impl Https {
    /// Fetch from `metadata_url` with `client` (which must verify certificates: the server
    /// gives the Azure destinations' client).
    pub fn new(client: HttpClient, metadata_url: String) -> Self {
        Self {
            client,
            metadata_url,
        }
    }
}

impl Source for Https {
    fn fetch(&self) -> BoxFuture<'_, Result<String, String>> {
        Box::pin(async move {
            let meta = get(&self.client, &self.metadata_url, MAX_METADATA_BYTES)
                .await
                .map_err(|e| format!("the OpenID metadata {}: {e}", self.metadata_url))?;
            let uri = serde_json::from_slice::<Value>(&meta)
                .ok()
                .and_then(|d| d.get("jwks_uri")?.as_str().map(str::to_string))
                .ok_or_else(|| {
                    format!(
                        "the OpenID metadata {} is not JSON naming a jwks_uri",
                        self.metadata_url
                    )
                })?;
            if url::Url::parse(&uri).map_or(true, |u| u.scheme() != "https") {
                return Err(format!(
                    "the OpenID metadata's jwks_uri {} is not an https URL",
                    crate::redact::mask_url(&uri)
                ));
            }
            let body = get(&self.client, &uri, MAX_JWKS_BYTES)
                .await
                .map_err(|e| format!("the key set {}: {e}", crate::redact::mask_url(&uri)))?;
            String::from_utf8(body.to_vec()).map_err(|_| "the key set is not UTF-8".to_string())
        })
    }
}

/// The body of `GET url`, which must answer 200.
async fn get(client: &HttpClient, url: &str, max: usize) -> Result<Bytes, String> {
    let endpoint = client.endpoint(url).map_err(|e| e.to_string())?;
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
    let r = endpoint
        .get(headers, max)
        .await
        .map_err(|e| e.to_string())?;
    if r.status != hyper::StatusCode::OK {
        return Err(format!("HTTP {}", r.status.as_u16()));
    }
    Ok(r.error_body)
}

/// Fetch keys for `keys` from `source` until `stop` turns true (see the module docs). Times are
/// tokio's (the schedule runs on the paused clock in tests); `clock` dates the fetched sets.
pub async fn run(
    keys: Arc<Keys>,
    source: Arc<dyn Source>,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
) {
    let Some(r) = keys.refresh().cloned() else {
        return;
    };
    let mut next = Instant::now();
    let mut failures = 0u32;
    loop {
        let scheduled = tokio::select! {
            () = tokio::time::sleep_until(next) => true,
            () = keys.asked() => false,
            _ = stop.changed() => return,
        };
        let started = Instant::now();
        if !keys.begin(scheduled) {
            continue;
        }
        let outcome = tokio::select! {
            o = source.fetch() => o,
            _ = stop.changed() => return,
        };
        let outcome = outcome.and_then(|text| {
            crate::config::jwks(&text)
                .map(|list| (text, list))
                .map_err(|why| format!("the fetched key set is not usable: {why}"))
        });
        match outcome {
            Ok((text, list)) => {
                failures = 0;
                next = started + r.every;
                let at_ms = clock.now_ms();
                let kids: Vec<&str> = list.iter().map(|k| k.kid.as_str()).collect();
                if keys.fetched().is_none_or(|f| f.keys != list) {
                    tracing::info!(keys = ?kids, "fetched the Entra signing keys");
                }
                keys.finish(Ok(Fetched {
                    keys: list,
                    at_ms,
                    from_cache: false,
                }));
                let (path, url) = (r.cache_path.clone(), r.metadata_url.clone());
                let written =
                    tokio::task::spawn_blocking(move || write_cache(&path, &url, at_ms, &text))
                        .await;
                if let Ok(Err(e)) = written {
                    tracing::warn!(path = %r.cache_path.display(), error = %e, "cannot write the Entra signing keys' cache: a start without the network will use older keys");
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = backoff(r.min_interval, r.every, failures);
                tracing::warn!(
                    error = %e,
                    retry_in_s = delay.as_secs(),
                    "cannot fetch the Entra signing keys: tokens are verified with the keys already known"
                );
                keys.finish(Err(e));
                next = started + delay;
            }
        }
    }
}

/// The delay after `failures` failed fetches in a row: `min`, doubling, at most `max`.
fn backoff(min: Duration, max: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    min.saturating_mul(1 << doublings).min(max.max(min))
}

/// The cache file's document.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cached {
    metadata_url: String,
    fetched_at_ms: u64,
    jwks: Box<serde_json::value::RawValue>,
}

/// Write the fetched key set `jwks` (fetched at `at_ms` from `metadata_url`) to `path`: aside,
/// synced, then renamed over the last one, so a power cut leaves the old or the new set.
///
/// # Errors
/// The directory cannot be written.
pub fn write_cache(path: &Path, metadata_url: &str, at_ms: u64, jwks: &str) -> std::io::Result<()> {
    use std::io::Write;
    let raw = serde_json::value::RawValue::from_string(jwks.trim().to_string())
        .map_err(std::io::Error::other)?;
    let doc = Cached {
        metadata_url: metadata_url.to_string(),
        fetched_at_ms: at_ms,
        jwks: raw,
    };
    let text = serde_json::to_vec(&doc).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Put the cached key set into `keys`, if the cache holds one fetched from the configured
/// metadata URL. A missing cache is normal (the first start); an unreadable or foreign one is a
/// warning, and ignored.
pub fn restore_cache(keys: &Keys) {
    let Some(r) = keys.refresh() else {
        return;
    };
    let path = &r.cache_path;
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the Entra signing keys' cache");
            return;
        }
    };
    let cached = serde_json::from_slice::<Cached>(&text)
        .map_err(|e| e.to_string())
        .and_then(|c| {
            if c.metadata_url != r.metadata_url {
                return Err(format!(
                    "it was fetched from {}, not from the configured {} ({})",
                    c.metadata_url,
                    r.metadata_url,
                    Key::inbound__clientAuth__entra__authority.name()
                ));
            }
            let keys = crate::config::jwks(c.jwks.get())?;
            Ok(Fetched {
                keys,
                at_ms: c.fetched_at_ms,
                from_cache: true,
            })
        });
    match cached {
        Ok(f) => {
            tracing::info!(
                keys = f.keys.len(),
                fetched_at_ms = f.at_ms,
                "read the Entra signing keys' cache"
            );
            keys.restore(f);
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring the Entra signing keys' cache");
        }
    }
}

#[cfg(test)]
mod tests;
