//! Client for the IoT Edge workload API (edgelet), HTTP/1.1 over the module's Unix socket.
//!
//! Routes (docs/COMPATIBILITY.md §7), all with `?api-version=`:
//! * `GET  /trust-bundle` → `{"certificate": "<PEM certs>"}`
//! * `POST /modules/{mod}/genid/{gen}/certificate/server` `{"commonName","expiration"}` →
//!   `201 {"certificate","privateKey":{"type":"key","bytes"},"expiration"}`
//! * `POST /modules/{mod}/certificate/identity` `{"expiration"}` → same shape
//! * `POST /modules/{mod}/genid/{gen}/sign` `{"keyId":"primary","algo":"HMACSHA256","data"}` →
//!   `{"digest"}`
//!
//! One request per connection, at most [`MAX_CONCURRENT`] at once: edgelet closes connections
//! beyond ten per socket without a reply. Private keys and digests are never logged; error
//! messages carry the route and the daemon's own message only.

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Concurrent workload requests (edgelet allows ten per socket).
pub const MAX_CONCURRENT: usize = 4;
/// Per-request timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response accepted (certificate chains are a few KiB).
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// RFC 3986 unreserved characters stay; everything else is percent-encoded (Python's
/// `quote(s, safe="")`, what the SDKs use for SAS resources and path segments).
pub const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encode one URI component.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// A workload API failure.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// `IOTEDGE_WORKLOADURI` is not `unix://…` or `http://host:port`.
    #[error("IOTEDGE_WORKLOADURI '{0}' is not unix:///path or http://host:port")]
    BadUri(String),
    /// The socket could not be reached.
    #[error("workload API {route}: cannot connect: {source}")]
    Connect {
        /// Route.
        route: String,
        /// Cause.
        source: std::io::Error,
    },
    /// HTTP-level failure (handshake, body).
    #[error("workload API {route}: {message}")]
    Http {
        /// Route.
        route: String,
        /// What failed.
        message: String,
    },
    /// No answer in time.
    #[error("workload API {route}: no response within {REQUEST_TIMEOUT:?}")]
    Timeout {
        /// Route.
        route: String,
    },
    /// The daemon answered with an error status.
    #[error("workload API {route}: HTTP {status}: {message}")]
    Status {
        /// Route.
        route: String,
        /// Status code.
        status: u16,
        /// The daemon's message.
        message: String,
    },
    /// The response body is not what the API documents.
    #[error("workload API {route}: unexpected response: {message}")]
    Body {
        /// Route.
        route: String,
        /// What was wrong.
        message: String,
    },
}

/// Where the workload API listens.
#[derive(Debug, Clone)]
enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

/// The module's identity as the workload API knows it.
#[derive(Debug, Clone)]
pub struct ModuleIdentity {
    /// `IOTEDGE_MODULEID`.
    pub module_id: String,
    /// `IOTEDGE_MODULEGENERATIONID`.
    pub generation_id: String,
    /// `IOTEDGE_APIVERSION`.
    pub api_version: String,
}

/// A certificate and its private key as issued by the workload API.
#[derive(Clone)]
pub struct IssuedCert {
    /// PEM chain.
    pub certificate_pem: String,
    /// PEM private key (secret; not shown by `Debug`).
    pub private_key_pem: String,
    /// Expiry as Unix seconds, when the daemon said (`expiration`).
    pub expires_at: Option<u64>,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("expires_at", &self.expires_at)
            .field("private_key_pem", &"***")
            .finish()
    }
}

#[derive(Deserialize)]
struct CertResponse {
    certificate: String,
    #[serde(rename = "privateKey")]
    private_key: PrivateKey,
    expiration: Option<String>,
}

#[derive(Deserialize)]
struct PrivateKey {
    bytes: Option<String>,
}

#[derive(Deserialize)]
struct TrustBundleResponse {
    certificate: String,
}

#[derive(Deserialize)]
struct SignResponse {
    digest: String,
}

#[derive(Deserialize)]
struct ErrorResponse {
    message: String,
}

/// A workload API client. Cheap to clone.
#[derive(Clone)]
pub struct WorkloadClient {
    endpoint: Endpoint,
    id: Arc<ModuleIdentity>,
    limit: Arc<Semaphore>,
}

impl std::fmt::Debug for WorkloadClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadClient")
            .field("endpoint", &self.endpoint)
            .field("module", &self.id.module_id)
            .finish()
    }
}

impl WorkloadClient {
    /// A client for `uri` (`unix:///var/run/iotedge/workload.sock` or `http://host:port`).
    ///
    /// # Errors
    /// An unsupported URI.
    pub fn new(uri: &str, id: ModuleIdentity) -> Result<Self, WorkloadError> {
        let endpoint = if let Some(path) = uri.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(WorkloadError::BadUri(uri.to_string()));
            }
            Endpoint::Unix(PathBuf::from(path))
        } else if let Some(rest) = uri.strip_prefix("http://") {
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') {
                return Err(WorkloadError::BadUri(uri.to_string()));
            }
            Endpoint::Tcp(authority.to_string())
        } else {
            return Err(WorkloadError::BadUri(uri.to_string()));
        };
        Ok(Self {
            endpoint,
            id: Arc::new(id),
            limit: Arc::new(Semaphore::new(MAX_CONCURRENT)),
        })
    }

    /// The module identity this client speaks for.
    pub fn identity(&self) -> &ModuleIdentity {
        &self.id
    }

    fn module_path(&self) -> String {
        format!(
            "/modules/{}/genid/{}",
            encode(&self.id.module_id),
            encode(&self.id.generation_id)
        )
    }

    /// The IoT Edge trust bundle (PEM).
    ///
    /// # Errors
    /// Transport, status or body problems.
    pub async fn trust_bundle(&self) -> Result<String, WorkloadError> {
        let route = "/trust-bundle".to_string();
        let body = self.call(Method::GET, &route, None).await?;
        let r: TrustBundleResponse = parse(&route, &body)?;
        if r.certificate.trim().is_empty() {
            return Err(WorkloadError::Body {
                route,
                message: "empty trust bundle".into(),
            });
        }
        Ok(r.certificate)
    }

    /// A server certificate for `common_name`, valid until about `expiration` (Unix seconds).
    ///
    /// # Errors
    /// Transport, status or body problems.
    pub async fn server_certificate(
        &self,
        common_name: &str,
        expiration: u64,
    ) -> Result<IssuedCert, WorkloadError> {
        let route = format!("{}/certificate/server", self.module_path());
        let body = json!({ "commonName": common_name, "expiration": format_rfc3339(expiration) });
        let resp = self.call(Method::POST, &route, Some(body)).await?;
        issued(&route, &resp)
    }

    /// The module identity certificate (outbound client authentication).
    ///
    /// # Errors
    /// Transport, status or body problems.
    pub async fn identity_certificate(&self, expiration: u64) -> Result<IssuedCert, WorkloadError> {
        let route = format!(
            "/modules/{}/certificate/identity",
            encode(&self.id.module_id)
        );
        let body = json!({ "expiration": format_rfc3339(expiration) });
        let resp = self.call(Method::POST, &route, Some(body)).await?;
        issued(&route, &resp)
    }

    /// HMAC-SHA256 of `data` with the module's primary key, held by the daemon. Returns the raw
    /// digest bytes.
    ///
    /// # Errors
    /// Transport, status or body problems.
    pub async fn sign(&self, data: &[u8]) -> Result<Vec<u8>, WorkloadError> {
        let route = format!("{}/sign", self.module_path());
        let b64 = base64::engine::general_purpose::STANDARD;
        let body = json!({ "keyId": "primary", "algo": "HMACSHA256", "data": b64.encode(data) });
        let resp = self.call(Method::POST, &route, Some(body)).await?;
        let r: SignResponse = parse(&route, &resp)?;
        b64.decode(r.digest.trim())
            .map_err(|e| WorkloadError::Body {
                route,
                message: format!("digest is not base64: {e}"),
            })
    }

    async fn call(
        &self,
        method: Method,
        route: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Bytes, WorkloadError> {
        let _permit = self
            .limit
            .acquire()
            .await
            .map_err(|_| WorkloadError::Http {
                route: route.to_string(),
                message: "client closed".into(),
            })?;
        let uri = format!("{route}?api-version={}", encode(&self.id.api_version));
        let fut = self.call_once(method, route, &uri, body);
        match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
            Ok(r) => r,
            Err(_) => Err(WorkloadError::Timeout {
                route: route.to_string(),
            }),
        }
    }

    async fn call_once(
        &self,
        method: Method,
        route: &str,
        uri: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Bytes, WorkloadError> {
        let http = |message: String| WorkloadError::Http {
            route: route.to_string(),
            message,
        };
        let connect = |source| WorkloadError::Connect {
            route: route.to_string(),
            source,
        };
        let payload = match &body {
            Some(v) => Bytes::from(serde_json::to_vec(v).map_err(|e| http(e.to_string()))?),
            None => Bytes::new(),
        };
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(hyper::header::HOST, "localhost");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(payload))
            .map_err(|e| http(e.to_string()))?;
        let resp = match &self.endpoint {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(connect)?;
                send(TokioIo::new(stream), req).await
            }
            Endpoint::Tcp(authority) => {
                let stream = tokio::net::TcpStream::connect(authority.as_str())
                    .await
                    .map_err(connect)?;
                send(TokioIo::new(stream), req).await
            }
        }
        .map_err(http)?;
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| http(format!("reading the response: {e}")))?
            .to_bytes();
        if !parts.status.is_success() {
            let message = serde_json::from_slice::<ErrorResponse>(&bytes)
                .map(|e| e.message)
                .unwrap_or_else(|_| {
                    parts
                        .status
                        .canonical_reason()
                        .unwrap_or("error")
                        .to_string()
                });
            return Err(WorkloadError::Status {
                route: route.to_string(),
                status: parts.status.as_u16(),
                message,
            });
        }
        if parts.status == StatusCode::NO_CONTENT {
            return Ok(Bytes::new());
        }
        Ok(bytes)
    }
}

async fn send<I>(
    io: TokioIo<I>,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // The connection future is owned here: it lives exactly as long as this one request.
    let driver = async move {
        let _ = conn.await;
    };
    let exchange = sender.send_request(req);
    tokio::pin!(driver);
    tokio::select! {
        r = exchange => r.map_err(|e| format!("request: {e}")),
        _ = &mut driver => Err("connection closed before a response".to_string()),
    }
}

fn parse<T: serde::de::DeserializeOwned>(route: &str, body: &[u8]) -> Result<T, WorkloadError> {
    serde_json::from_slice(body).map_err(|e| WorkloadError::Body {
        route: route.to_string(),
        message: e.to_string(),
    })
}

fn issued(route: &str, body: &[u8]) -> Result<IssuedCert, WorkloadError> {
    let r: CertResponse = parse(route, body)?;
    let key = r.private_key.bytes.filter(|k| !k.trim().is_empty());
    let Some(private_key_pem) = key else {
        return Err(WorkloadError::Body {
            route: route.to_string(),
            message: "privateKey.bytes is missing (HSM-backed keys are not supported)".into(),
        });
    };
    Ok(IssuedCert {
        certificate_pem: r.certificate,
        private_key_pem,
        expires_at: r.expiration.as_deref().and_then(parse_rfc3339),
    })
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parse an RFC 3339 timestamp (`2026-11-21T23:46:18Z`, `…+01:00`, fractions allowed) to Unix
/// seconds.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let s = s.trim();
    let num = |a: usize, b: usize| s.get(a..b)?.parse::<i64>().ok();
    if s.len() < 20 || s.get(4..5)? != "-" || s.get(7..8)? != "-" || s.get(13..14)? != ":" {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, se) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !matches!(s.get(10..11)?, "T" | "t" | " ")
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&d)
    {
        return None;
    }
    let mut rest = s.get(19..)?;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = frac.get(digits..)?;
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.get(0..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let oh = rest.get(1..3)?.parse::<i64>().ok()?;
            let om = rest.get(4..6)?.parse::<i64>().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset;
    u64::try_from(secs).ok()
}

/// Format Unix seconds as RFC 3339 UTC (`2026-11-21T23:46:18Z`).
pub fn format_rfc3339(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX / 2);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_accepts_offsets_and_fractions() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        let t = 1_795_304_778; // 2026-11-21T23:46:18Z
        assert_eq!(format_rfc3339(t), "2026-11-21T23:46:18Z");
        assert_eq!(parse_rfc3339("2026-11-21T23:46:18Z"), Some(t));
        assert_eq!(parse_rfc3339("2026-11-22T00:46:18.1234567+01:00"), Some(t));
        assert_eq!(parse_rfc3339("2024-02-29T12:00:00Z"), Some(1_709_208_000));
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_rfc3339("2026-13-01T00:00:00Z"), None);
    }

    #[test]
    fn uri_forms() {
        let id = ModuleIdentity {
            module_id: "m".into(),
            generation_id: "g".into(),
            api_version: "2019-01-30".into(),
        };
        assert!(WorkloadClient::new("unix:///var/run/iotedge/workload.sock", id.clone()).is_ok());
        assert!(WorkloadClient::new("http://127.0.0.1:15581", id.clone()).is_ok());
        assert!(WorkloadClient::new("https://x", id.clone()).is_err());
        assert!(WorkloadClient::new("unix://", id).is_err());
    }

    #[test]
    fn component_encoding_matches_python_quote_safe_empty() {
        assert_eq!(
            encode("hub.azure-devices.net/devices/d1/modules/$edgeHub"),
            "hub.azure-devices.net%2Fdevices%2Fd1%2Fmodules%2F%24edgeHub"
        );
        assert_eq!(encode("a+b=c~_"), "a%2Bb%3Dc~_");
    }
}
