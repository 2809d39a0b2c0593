//! Authentication and authorization: the one place both are decided.
//!
//! Who is calling ([`authenticate`]): the `aeg-sas-key` header is checked first (when SAS keys
//! are enabled), then the TLS client certificate (when certificate auth is enabled). With both
//! disabled every request is an administrator (the original's behaviour). No accepted
//! credential: 401 with the documented body. Keys are compared in constant time and never
//! logged.
//!
//! What they may do ([`Role`]), an opt-in split beyond the original:
//! * `key1`/`key2`: administrator;
//! * `inbound__clientAuth__sasKeys__publishOnlyKeys`: publisher;
//! * `inbound__clientAuth__sasKeys__metricsKeys`: `GET /metrics` only (a scraper's key);
//! * a client certificate that chains to the trust bundle: administrator when
//!   `inbound__clientAuth__clientCert__adminIdentities` is empty (the default) or lists its
//!   subject CN, publisher otherwise;
//! * a client certificate that does not (accepted under `allowUnknownCA=true`): publisher. The
//!   original made it administrator; anyone can make one (issue 37).
//!
//! With every credential off (the original's open mode, and the compose example), any request is
//! an administrator, so [`browser_guard`] refuses what only a browser on a hostile page would
//! send: a request the browser marks cross-site (`Sec-Fetch-Site`), an `Origin` other than the
//! `Host` it is sent to, and a `Host` that is not an address, `localhost`, the module id or an
//! `inbound__allowedHostNames` entry (a DNS-rebinding page names its own domain, which it has
//! pointed at gridlet). Tools and modules send neither `Origin` nor `Sec-Fetch-Site`.
//!
//! A publisher may only publish (`POST /topics/{topic}/events[/{id}]`); any other API route
//! answers 403 `Forbidden` with the documented body. When a request carries several credentials
//! it passes if one of them allows it.
//!
//! A Microsoft Entra ID access token (`Authorization: Bearer`, [`super::entra`], when
//! `inbound__clientAuth__entra__enabled`) is verified there; its principal (`tid`/`oid`) gets
//! the rights `inbound__clientAuth__entra__senders` (publish) and `__receivers` (receive and
//! settle any queue subscription) give it. Azure's RBAC roles are evaluated inside Azure and never
//! appear in the token, so gridlet has its own map. No Entra principal manages. A token that
//! fails a check is a 401 naming the check.
//!
//! A shared access signature ([`super::sas_token`]) is its signing key's credential narrowed to
//! its resource `r` (Event Grid's rule, [`token_allows`]) and to a lifetime; `r` must name one of
//! gridlet's host names. Management needs a token for the broker's root (gridlet's own rule).

use super::entra::Keys;
use super::sas_token::{Resource, Token};
use super::ConnInfo;
use crate::config::Principal;
use crate::config::{Config, Inbound, Key};
use crate::error::ApiError;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, Method, StatusCode};

/// Header carrying a SAS key.
pub const SAS_HEADER: &str = "aeg-sas-key";
// Header names looked up on every request, made once: a lookup by `&str` parses the name first
// (about a thousand instructions per request for the few below, measured with callgrind).
static SAS_KEY_HEADER: HeaderName = HeaderName::from_static(SAS_HEADER);
static SAS_TOKEN_HEADER: HeaderName = HeaderName::from_static("aeg-sas-token");
static SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// What an authenticated caller may do. Ordered: the stronger role compares greater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read `GET /metrics`, nothing else (`inbound__clientAuth__sasKeys__metricsKeys`).
    Metrics,
    /// Publish events, nothing else.
    Publisher,
    /// Receive from and settle one queue subscription, nothing else: the index of its entry in
    /// `inbound__clientAuth__sasKeys__receiveKeys`.
    Receiver(usize),
    /// Receive from and settle any queue subscription, nothing else: an Entra principal in
    /// `inbound__clientAuth__entra__receivers`.
    AnyReceiver,
    /// Everything: topics, subscriptions, dead letters, metrics, publishing.
    Admin,
}

/// A fixed-length stand-in for a key: comparing SHA-256 digests takes the same time whatever
/// the given key's length (comparing the keys themselves returned early on a length mismatch,
/// which told a caller the key's length).
fn digest(key: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, key);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Whether `a` and `b` are equal, in time independent of where they differ and of their
/// lengths (digests compared without an early exit).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (digest(a), digest(b));
    a.iter().zip(&b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Every key is compared (no early exit on a match), so timing shows neither which key matched
/// nor how many there are before it.
fn any_key_matches(given: &[u8], keys: &[String]) -> bool {
    keys.iter()
        .fold(false, |hit, k| constant_time_eq(given, k.as_bytes()) | hit)
}

/// The role a SAS key or a client certificate gives the caller, or `None` when neither is
/// accepted. Shared access signatures, which also name a resource, are [`token_grant`]'s.
pub fn authenticate(cfg: &Inbound, headers: &HeaderMap, conn: Option<&ConnInfo>) -> Option<Role> {
    if !cfg.requires_credential() {
        return Some(Role::Admin);
    }
    let mut role = None;
    if cfg.sas_enabled {
        if let Some(given) = sas_key(headers) {
            if any_key_matches(given, &cfg.sas_keys) {
                return Some(Role::Admin);
            }
            if any_key_matches(given, &cfg.publish_only_sas_keys) {
                role = Some(Role::Publisher);
            } else if any_key_matches(given, &cfg.metrics_sas_keys) {
                role = Some(Role::Metrics);
            } else {
                // Every entry compared, as for the other lists.
                role = cfg
                    .receive_sas_keys
                    .iter()
                    .enumerate()
                    .fold(None, |hit, (i, k)| {
                        let m = constant_time_eq(given, k.key.as_bytes());
                        hit.or(m.then_some(Role::Receiver(i)))
                    })
                    .or(role);
            }
        }
    }
    if cfg.client_cert_enabled {
        if let Some(conn) = conn.filter(|c| c.client_cert) {
            role = role.max(Some(certificate_role(cfg, conn)));
        }
    }
    role
}

/// The role of an accepted client certificate. Only a certificate that chains to the trust
/// bundle may manage: with `allowUnknownCA=true` (the original's default, and the shipped
/// deployment's) anyone can make a self-signed one with any subject, so it may only publish
/// (issue 37). A verified one is administrator when `adminIdentities` is empty or lists its CN.
fn certificate_role(cfg: &Inbound, conn: &ConnInfo) -> Role {
    if !conn.client_cert_verified {
        return Role::Publisher;
    }
    let listed = conn.client_identity.as_deref().is_some_and(|id| {
        cfg.admin_identities
            .iter()
            .any(|a| a.eq_ignore_ascii_case(id))
    });
    if cfg.admin_identities.is_empty() || listed {
        Role::Admin
    } else {
        Role::Publisher
    }
}

/// The SAS key a request carries: the `aeg-sas-key` header, or `Authorization: SharedAccessKey
/// <key>` (what Event Grid namespaces' SDKs send for an `AzureKeyCredential`).
fn sas_key(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(k) = headers.get(&SAS_KEY_HEADER) {
        return Some(k.as_bytes());
    }
    let auth = headers.get(axum::http::header::AUTHORIZATION)?.as_bytes();
    let (scheme, key) = auth.split_at(auth.iter().position(|b| *b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"SharedAccessKey")
        .then(|| key.trim_ascii())
}

/// A shared access signature the request carries: `aeg-sas-token`, or `Authorization:
/// SharedAccessSignature <token>` ([`super::sas_token`]).
fn sas_token(headers: &HeaderMap) -> Option<&str> {
    if let Some(t) = headers.get(&SAS_TOKEN_HEADER) {
        return t.to_str().ok();
    }
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("SharedAccessSignature")
        .then(|| token.trim())
}

/// An Entra ID access token the request carries: `Authorization: Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme.eq_ignore_ascii_case("Bearer").then(|| token.trim())
}

/// A refused request: the error to answer, unless a fetch of the Entra signing keys that is
/// coming may change it.
#[derive(Debug)]
pub struct Refused {
    /// 401 or 403 with the documented body.
    pub error: ApiError,
    /// The request's Entra token names an unknown key id and a fetch of the tenant's keys was
    /// asked for ([`super::entra::Keys::ask_for_fetch`]): check again when this changes.
    pub after_fetch: Option<tokio::sync::watch::Receiver<u64>>,
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            after_fetch: None,
        }
    }
}

/// The roles an Entra ID token gives, or the 401 that refuses it: a sender publishes, a
/// receiver receives and settles; a principal in neither list gets none (403 on any route).
/// A token naming an unknown key id asks `keys` for a fetch (the receiver in the refusal).
fn entra_roles(cfg: &Config, keys: Option<&Keys>, token: &str) -> Result<Vec<Role>, Refused> {
    let refuse = |why: String| ApiError {
        status: StatusCode::UNAUTHORIZED,
        detail: "Unauthorized",
        message: format!("Microsoft Entra ID token refused: {why}"),
        retry_after: None,
    };
    let (Some(entra), Some(keys)) = (cfg.inbound.entra.as_ref(), keys) else {
        return Err(refuse(format!(
            "Entra ID tokens are not enabled ({})",
            Key::inbound__clientAuth__entra__enabled.name()
        ))
        .into());
    };
    let now = crate::clock::system_wall_ms() / 1000;
    let who: Principal = match super::entra::verify(entra, &keys.current(), token, now) {
        Ok(who) => who,
        Err(r) => {
            let after_fetch = r
                .unknown_key
                .then(|| keys.ask_for_fetch(tokio::time::Instant::now()))
                .flatten();
            return Err(Refused {
                error: refuse(r.message),
                after_fetch,
            });
        }
    };
    let mut roles = Vec::new();
    if entra.senders.contains(&who) {
        roles.push(Role::Publisher);
    }
    if entra.receivers.contains(&who) {
        roles.push(Role::AnyReceiver);
    }
    if roles.is_empty() {
        return Err(ApiError {
            status: StatusCode::FORBIDDEN,
            detail: "Forbidden",
            message: format!(
                "the Entra principal {}/{} is in neither {} nor {}",
                who.tenant,
                who.object,
                Key::inbound__clientAuth__entra__senders.name(),
                Key::inbound__clientAuth__entra__receivers.name()
            ),
            retry_after: None,
        }
        .into());
    }
    Ok(roles)
}

/// The role of the key that signed `token` and the resource it names, if one of the keys signed
/// it, it has not expired, it expires within `inbound__clientAuth__sasKeys__maxTokenLifetimeInSeconds`,
/// and its resource's host is one of gridlet's names (an address, `localhost`, the module id or
/// an `inbound__allowedHostNames` entry): a token made for another host (a cloud topic signed
/// with the same key) is not one for gridlet. Every key is tried (no early exit), as for keys.
fn token_grant(cfg: &Config, token: &str) -> Option<(Role, Resource)> {
    let inbound = &cfg.inbound;
    let token = Token::parse(token)?;
    let now = crate::clock::system_wall_ms() / 1000;
    let latest = now.saturating_add(inbound.max_token_lifetime.as_secs());
    if token.expiry <= now || token.expiry > latest {
        return None;
    }
    let resource = Resource::parse(&token.resource).filter(|r| known_host(cfg, &r.host))?;
    let any = |keys: &[String]| keys.iter().fold(false, |hit, k| token.signed_with(k) | hit);
    let admin = any(&inbound.sas_keys);
    let publisher = any(&inbound.publish_only_sas_keys);
    let metrics = any(&inbound.metrics_sas_keys);
    let receiver = inbound
        .receive_sas_keys
        .iter()
        .enumerate()
        .fold(None, |hit, (i, k)| {
            let m = token.signed_with(&k.key);
            hit.or(m.then_some(Role::Receiver(i)))
        });
    let role = if admin {
        Role::Admin
    } else if publisher {
        Role::Publisher
    } else if metrics {
        Role::Metrics
    } else {
        receiver?
    };
    Some((role, resource))
}

/// What a token for `resource` may do with `req`. A token for the broker's root (`r` names the
/// host and no path) is its key's credential. A token for a path (a topic, `…/topics/t`) may
/// only publish and receive there (Event Grid's rule: its `r` prefixes the request's path at a
/// segment boundary). Management always needs a root token: Event Grid's tokens never grant
/// management, so that part is gridlet's own rule.
fn token_allows(resource: &Resource, req: &Request) -> Result<(), ApiError> {
    let data_plane = is_publish(req) || pull_target(req).is_some();
    if resource.is_root() || (data_plane && resource.covers(req.uri().path())) {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::FORBIDDEN,
        detail: "Forbidden",
        message: format!(
            "this shared access signature is for {resource}: it may only publish to and receive \
             under that path; anything else needs a token whose r is the broker's root \
             (https://{}/)",
            resource.host
        ),
        retry_after: None,
    })
}

/// Whether this request is a publish (`POST /topics/{topic}/events`, `.../events/{id}`, or a
/// namespace topic's `POST /topics/{topic}:publish`).
fn is_publish(req: &Request) -> bool {
    if req.method() != Method::POST {
        return false;
    }
    let path = req.uri().path();
    if let Some(topic) = path
        .strip_prefix("/topics/")
        .and_then(|t| t.strip_suffix(":publish"))
    {
        return !topic.is_empty() && !topic.contains('/');
    }
    let mut segments = req.uri().path().trim_start_matches('/').split('/');
    matches!(
        (
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next()
        ),
        (
            Some("topics"),
            Some(_),
            Some("events"),
            None | Some(_),
            None
        )
    )
}

/// The queue subscription a pull operation (`POST /topics/{t}/eventsubscriptions/{s}:{op}`,
/// `op` one of receive, acknowledge, release, reject, renewLock) is for.
fn pull_target(req: &Request) -> Option<(&str, &str)> {
    if req.method() != Method::POST {
        return None;
    }
    let rest = req.uri().path().strip_prefix("/topics/")?;
    let (topic, rest) = rest.split_once('/')?;
    let (coll, last) = rest.split_once('/')?;
    let (sub, op) = last.rsplit_once(':')?;
    let ops = ["receive", "acknowledge", "release", "reject", "renewLock"];
    (coll.eq_ignore_ascii_case("eventsubscriptions")
        && ops.iter().any(|o| o.eq_ignore_ascii_case(op)))
    .then_some((topic, sub))
}

/// 403 for a publisher on anything but publishing.
fn forbidden() -> ApiError {
    ApiError {
        status: StatusCode::FORBIDDEN,
        detail: "Forbidden",
        message: "this credential may only publish events (POST /topics/{topic}/events)".into(),
        retry_after: None,
    }
}

/// With every credential off, refuse browser requests from other sites and DNS-rebinding
/// pages (see the module docs); with a credential required, nothing (a page cannot send it).
///
/// # Errors
/// 403 with the documented body.
pub fn browser_guard(cfg: &Config, req: &Request) -> Result<(), ApiError> {
    let inbound = &cfg.inbound;
    if inbound.requires_credential() {
        return Ok(());
    }
    let h = req.headers();
    let text = |name: &HeaderName| h.get(name).and_then(|v| v.to_str().ok());
    let refuse = |why: String| ApiError {
        status: StatusCode::FORBIDDEN,
        detail: "Forbidden",
        message: why,
        retry_after: None,
    };
    if let Some(site) = text(&SEC_FETCH_SITE) {
        if !matches!(site, "same-origin" | "none") {
            return Err(refuse(format!(
                "a {site} browser request is refused while no credential is required"
            )));
        }
    }
    let host = text(&header::HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
    if let Some(origin) = h.get(header::ORIGIN) {
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest.trim_end_matches('/'));
        let same = matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h));
        if !same {
            return Err(refuse(
                "a request from another origin is refused while no credential is required".into(),
            ));
        }
    }
    match host {
        Some(host) if !known_host(cfg, host) => Err(refuse(format!(
            "Host '{host}' is not one of gridlet's names; add it to {} (or require a credential)",
            Key::inbound__allowedHostNames.name()
        ))),
        _ => Ok(()),
    }
}

/// An IP address, `localhost`, the module id or a configured name (`host` may carry a port).
fn known_host(cfg: &Config, host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(n, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                n
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.');
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || name.eq_ignore_ascii_case(&cfg.edge.module_id)
        || cfg
            .inbound
            .allowed_host_names
            .iter()
            .any(|a| a.eq_ignore_ascii_case(name))
}

/// Which credential a request used, as a key for per-credential limits (long polls,
/// `super::long_poll`): a SAS key (its digest), the role of the key that signed a SAS token
/// (tokens signed with one key share a limit however many are minted), a certificate's
/// verified identity (all unverified certificates share one), or none (every credential off).
pub fn credential(cfg: &Inbound, headers: &HeaderMap, conn: Option<&ConnInfo>) -> [u8; 16] {
    let mut material: Vec<u8> = Vec::with_capacity(64);
    if cfg.sas_enabled && sas_token(headers).is_some() {
        let role = authenticate(cfg, headers, conn);
        material.extend_from_slice(format!("token:{role:?}").as_bytes());
    } else if let Some(key) = sas_key(headers).filter(|_| cfg.sas_enabled) {
        material.extend_from_slice(b"key:");
        material.extend_from_slice(key);
    } else if let Some(c) = conn.filter(|c| cfg.client_cert_enabled && c.client_cert) {
        material.extend_from_slice(b"certificate:");
        material.extend_from_slice(c.client_identity.as_deref().unwrap_or("").as_bytes());
    } else {
        material.extend_from_slice(b"none");
    }
    let d = digest(&material);
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// 401 unless the request is authenticated; 403 when its credential may not use this route.
/// The API's one layer ([`super::Guard`]) calls this first on every API route. When a request
/// carries several credentials, it passes if one of them allows it.
///
/// # Errors
/// 401 or 403 with the documented body; when the request's Entra token names an unknown key id,
/// what to wait for before checking again.
pub fn require(cfg: &Config, keys: Option<&Keys>, req: &Request) -> Result<(), Refused> {
    let inbound = &cfg.inbound;
    let conn = req.extensions().get::<ConnInfo>();
    let role = authenticate(inbound, req.headers(), conn);
    let token = sas_token(req.headers())
        .filter(|_| inbound.sas_enabled)
        .and_then(|t| token_grant(cfg, t));
    let mut denied = None;
    if let Some(role) = role {
        match role_allows(inbound, role, req) {
            Ok(()) => return Ok(()),
            Err(e) => denied = Some(e),
        }
    }
    if let Some((role, resource)) = token {
        match token_allows(&resource, req).and_then(|()| role_allows(inbound, role, req)) {
            Ok(()) => return Ok(()),
            Err(e) => denied = denied.or(Some(e)),
        }
    }
    let mut after_fetch = None;
    if let Some(token) = bearer(req.headers()) {
        match entra_roles(cfg, keys, token) {
            Ok(roles) => {
                let mut refusal = None;
                for role in roles {
                    match role_allows(inbound, role, req) {
                        Ok(()) => return Ok(()),
                        Err(e) => refusal = refusal.or(Some(e)),
                    }
                }
                denied = denied.or(refusal);
            }
            // A 401 for the token yields to another credential's 403.
            Err(e) => {
                denied = denied.or(Some(e.error));
                after_fetch = e.after_fetch;
            }
        }
    }
    Err(Refused {
        error: denied.unwrap_or_else(ApiError::unauthorized),
        after_fetch,
    })
}

/// What `role` may do with `req`.
fn role_allows(cfg: &Inbound, role: Role, req: &Request) -> Result<(), ApiError> {
    match role {
        Role::Admin => Ok(()),
        Role::Publisher if is_publish(req) => Ok(()),
        Role::Publisher => Err(forbidden()),
        Role::Receiver(i) => {
            let allowed = cfg.receive_sas_keys.get(i).is_some_and(|k| {
                pull_target(req).is_some_and(|(t, s)| {
                    t.eq_ignore_ascii_case(&k.topic) && s.eq_ignore_ascii_case(&k.subscription)
                })
            });
            if allowed {
                Ok(())
            } else {
                Err(ApiError {
                    status: StatusCode::FORBIDDEN,
                    detail: "Forbidden",
                    message: "this credential may only receive from and settle its own queue subscription (POST /topics/{topic}/eventsubscriptions/{subscription}:receive, ...)".into(),
                    retry_after: None,
                })
            }
        }
        Role::AnyReceiver if pull_target(req).is_some() => Ok(()),
        Role::AnyReceiver => Err(ApiError {
            status: StatusCode::FORBIDDEN,
            detail: "Forbidden",
            message: "this credential may only receive from and settle queue subscriptions (POST /topics/{topic}/eventsubscriptions/{subscription}:receive, ...)".into(),
            retry_after: None,
        }),
        Role::Metrics if req.method() == Method::GET && req.uri().path() == "/metrics" => Ok(()),
        Role::Metrics => Err(ApiError {
            status: StatusCode::FORBIDDEN,
            detail: "Forbidden",
            message: "this credential may only read GET /metrics".into(),
            retry_after: None,
        }),
    }
}

#[cfg(test)]
mod tests;
