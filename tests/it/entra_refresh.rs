//! The Entra signing keys fetched from the tenant's OpenID metadata (issue 35, item 5): a local
//! HTTPS peer plays `login.microsoftonline.com` (`inbound__clientAuth__entra__authority`), its
//! certificate trusted through `outbound__azure__trustedCertificatesFile`. Covered: a rolled key
//! verifies after the fetch its first token asks for, and the retired one is refused; a flood of
//! unknown key ids makes one fetch; a start without the network verifies with the cached keys;
//! keys come only over verified HTTPS. The schedule (the interval, back-off, the flood over
//! time) is on the paused clock in `src/api/entra/refresh/tests.rs`.

use crate::entra::{call, claims, with_queue, Signer, ADMIN_KEY, PUBLISH, SENDER, TENANT};
use crate::util::{serve_https_as, start, start_in, TestGridlet};
use crate::wait::eventually;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What the peer serves and counts.
#[derive(Clone, Default)]
struct Served {
    jwks: Arc<Mutex<Value>>,
    /// `jwks_uri` as given, instead of the peer's own https URL.
    jwks_uri: Arc<Mutex<Option<String>>>,
    metadata_gets: Arc<AtomicUsize>,
    key_gets: Arc<AtomicUsize>,
}

/// The tenant's OpenID metadata and key set over HTTPS.
struct Peer {
    served: Served,
    authority: String,
    /// Its certificate (PEM).
    pem: String,
    task: tokio::task::JoinHandle<()>,
}

async fn metadata(State(s): State<Served>, headers: HeaderMap) -> Json<Value> {
    s.metadata_gets.fetch_add(1, Ordering::SeqCst);
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let uri = s.jwks_uri.lock().unwrap().clone();
    Json(json!({
        "issuer": format!("https://{host}/{TENANT}/v2.0"),
        "jwks_uri": uri.unwrap_or_else(|| format!("https://{host}/{TENANT}/discovery/v2.0/keys")),
    }))
}

async fn keys(State(s): State<Served>) -> Json<Value> {
    s.key_gets.fetch_add(1, Ordering::SeqCst);
    let doc = s.jwks.lock().unwrap().clone();
    Json(doc)
}

impl Peer {
    async fn start(jwks: &Value) -> Self {
        let served = Served::default();
        *served.jwks.lock().unwrap() = jwks.clone();
        let app = Router::new()
            .route(
                &format!("/{TENANT}/v2.0/.well-known/openid-configuration"),
                get(metadata),
            )
            .route(&format!("/{TENANT}/discovery/v2.0/keys"), get(keys))
            .with_state(served.clone());
        let (port, task, pem) = serve_https_as(app, &["127.0.0.1", "localhost"]).await;
        Self {
            served,
            authority: format!("https://127.0.0.1:{port}"),
            pem,
            task,
        }
    }

    fn serve(&self, jwks: &Value) {
        *self.served.jwks.lock().unwrap() = jwks.clone();
    }

    fn key_gets(&self) -> usize {
        self.served.key_gets.load(Ordering::SeqCst)
    }

    fn metadata_gets(&self) -> usize {
        self.served.metadata_gets.load(Ordering::SeqCst)
    }
}

/// Entra on, keys fetched from `authority` only (no JWKS file), `trusted` PEM written to
/// `dir` as the Azure roots when given.
fn env(authority: &str, trusted: Option<&str>, dir: &std::path::Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("inbound__clientAuth__entra__enabled", "true".to_string()),
        ("inbound__clientAuth__entra__tenantId", TENANT.into()),
        ("inbound__clientAuth__entra__authority", authority.into()),
        (
            "inbound__clientAuth__entra__senders",
            format!("{TENANT}/{SENDER}"),
        ),
        ("inbound__clientAuth__sasKeys__enabled", "true".into()),
        ("inbound__clientAuth__sasKeys__key1", ADMIN_KEY.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(pem) = trusted {
        let path = dir.join("azure-roots.pem");
        std::fs::write(&path, pem).unwrap();
        env.push((
            "outbound__azure__trustedCertificatesFile".into(),
            path.display().to_string(),
        ));
    }
    env
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The readiness detail's Entra line.
async fn keys_line(g: &TestGridlet) -> String {
    let body = g
        .client
        .get(g.url("/readyz"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find(|l| l.starts_with("entra signing keys"))
        .unwrap_or_default()
        .to_string()
}

/// Wait until the readiness detail's Entra line contains each of `parts`.
async fn wait_line(g: &TestGridlet, parts: &[&str]) -> String {
    eventually("the Entra keys' readiness line", || async {
        let line = keys_line(g).await;
        if parts.iter().all(|p| line.contains(p)) {
            Ok(line)
        } else {
            Err(line)
        }
    })
    .await
}

/// The value of the series `series` (its name and labels as written) in `/metrics`.
async fn metric(g: &TestGridlet, series: &str) -> Option<u64> {
    let text = g
        .client
        .get(g.url("/metrics"))
        .header("aeg-sas-key", ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn token(s: &Signer, kid: &str) -> String {
    s.sign(json!({"kid": kid, "typ": "JWT"}), &claims(SENDER))
}

#[tokio::test]
async fn a_rolled_key_verifies_after_the_fetch_its_first_token_asks_for() {
    let k1 = Signer::new("k1");
    let peer = Peer::start(&k1.jwks).await;
    let dir = tempfile::tempdir().unwrap();
    let env = env(&peer.authority, Some(&peer.pem), dir.path());
    let g = with_queue(start(&pairs(&env)).await).await;
    wait_line(&g, &["entra signing keys: 1, fetched"]).await;
    assert_eq!(call(&g, "POST", PUBLISH, &token(&k1, "k1")).await.0, 200);
    assert_eq!((peer.metadata_gets(), peer.key_gets()), (1, 1));
    // Microsoft rolls its keys: k1 retired, k2 signs. The first k2 token waits for the fetch.
    let k2 = Signer::new("k2");
    peer.serve(&k2.jwks);
    let (status, msg) = call(&g, "POST", PUBLISH, &token(&k2, "k2")).await;
    assert_eq!(status, 200, "{msg}");
    assert_eq!(peer.key_gets(), 2);
    let (status, msg) = call(&g, "POST", PUBLISH, &token(&k1, "k1")).await;
    assert_eq!(status, 401, "the retired key no longer verifies");
    assert!(msg.contains("key id k1 is not one of"), "{msg}");
    assert_eq!(peer.key_gets(), 2, "within the interval, no fetch for k1");
    let fetches = r#"gridlet_entra_signing_key_fetches_total{result="succeeded"}"#;
    assert_eq!(metric(&g, fetches).await, Some(2));
    assert_eq!(metric(&g, "gridlet_entra_signing_keys").await, Some(1));
    assert_eq!(
        metric(&g, "gridlet_entra_signing_keys_stale").await,
        Some(0)
    );
    // The fetched set is on disk for the next start.
    let cache = g.dir.path().join("metadataDb/entra-jwks.json");
    let cached = eventually("the cache holds k2", || async {
        let doc: Value = std::fs::read(&cache)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if doc["jwks"] == k2.jwks {
            Ok(doc)
        } else {
            Err(doc.to_string())
        }
    })
    .await;
    assert_eq!(
        cached["metadataUrl"],
        format!(
            "{}/{TENANT}/v2.0/.well-known/openid-configuration",
            peer.authority
        )
    );
}

#[tokio::test]
async fn a_flood_of_unknown_key_ids_makes_one_fetch() {
    let k1 = Signer::new("k1");
    let peer = Peer::start(&k1.jwks).await;
    let dir = tempfile::tempdir().unwrap();
    let env = env(&peer.authority, Some(&peer.pem), dir.path());
    let g = with_queue(start(&pairs(&env)).await).await;
    wait_line(&g, &["entra signing keys: 1, fetched"]).await;
    let tokens: Vec<String> = (0..40).map(|i| token(&k1, &format!("bad-{i}"))).collect();
    let answers =
        futures_util::future::join_all(tokens.iter().map(|t| call(&g, "POST", PUBLISH, t))).await;
    for (status, msg) in answers {
        assert_eq!(status, 401, "{msg}");
        assert!(
            msg.contains("is not one of the tenant's signing keys"),
            "{msg}"
        );
    }
    assert_eq!(
        (peer.metadata_gets(), peer.key_gets()),
        (2, 2),
        "the start's fetch and one for the 40 tokens: {}",
        keys_line(&g).await
    );
    assert_eq!(call(&g, "POST", PUBLISH, &token(&k1, "k1")).await.0, 200);
}

#[tokio::test]
async fn a_start_without_the_network_verifies_with_the_cached_keys() {
    let k1 = Signer::new("k1");
    let peer = Peer::start(&k1.jwks).await;
    let dir = tempfile::tempdir().unwrap();
    let env = env(&peer.authority, Some(&peer.pem), dir.path());
    let g = start(&pairs(&env)).await;
    wait_line(&g, &["entra signing keys: 1, fetched"]).await;
    let cache = g.dir.path().join("metadataDb/entra-jwks.json");
    eventually("the cache is written", || async {
        cache.exists().then_some(()).ok_or_else(String::new)
    })
    .await;
    let TestGridlet { g, dir: data, .. } = g;
    g.shutdown().await;
    // The uplink is gone: nothing answers at the authority.
    peer.task.abort();
    let _ = peer.task.await;
    let g = with_queue(start_in(data, &pairs(&env), Default::default()).await).await;
    let line = wait_line(&g, &["from the cache", "last fetch failed"]).await;
    assert!(line.starts_with("entra signing keys: 1"), "{line}");
    assert_eq!(call(&g, "POST", PUBLISH, &token(&k1, "k1")).await.0, 200);
    let ready = g.client.get(g.url("/readyz")).send().await.unwrap();
    assert_eq!(
        ready.status(),
        200,
        "stale or unreachable keys do not make gridlet unready"
    );
}

#[tokio::test]
async fn keys_come_only_over_verified_https() {
    let k1 = Signer::new("k1");
    // A peer whose certificate nothing trusts: no request is made over its TLS.
    let untrusted = Peer::start(&k1.jwks).await;
    let dir = tempfile::tempdir().unwrap();
    let g = start(&pairs(&env(&untrusted.authority, None, dir.path()))).await;
    let line = wait_line(&g, &["none fetched yet", "last fetch failed", "TLS"]).await;
    assert!(line.contains("stale"), "{line}");
    assert_eq!(
        metric(&g, "gridlet_entra_signing_keys_stale").await,
        Some(1)
    );
    let failed = r#"gridlet_entra_signing_key_fetches_total{result="failed"}"#;
    assert_eq!(metric(&g, failed).await, Some(1));
    assert_eq!(
        metric(&g, "gridlet_entra_signing_keys_age_seconds").await,
        None
    );
    assert_eq!(untrusted.metadata_gets(), 0);
    let (status, msg) = call(&g, "POST", PUBLISH, &token(&k1, "k1")).await;
    assert_eq!(status, 401, "{msg}");
    // A trusted peer whose metadata names a plain-HTTP key set: not fetched.
    let peer = Peer::start(&k1.jwks).await;
    *peer.served.jwks_uri.lock().unwrap() =
        Some(format!("http://127.0.0.1:1/{TENANT}/discovery/v2.0/keys"));
    let g = start(&pairs(&env(&peer.authority, Some(&peer.pem), dir.path()))).await;
    wait_line(&g, &["none fetched yet", "is not an https URL"]).await;
    assert_eq!((peer.metadata_gets(), peer.key_gets()), (1, 0));
}
