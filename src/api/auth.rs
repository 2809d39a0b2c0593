//! Authentication: the one place it is decided (docs/COMPATIBILITY.md §5.1).
//!
//! Order: the `aeg-sas-key` header is checked first (when SAS keys are enabled), then the TLS
//! client certificate (when certificate auth is enabled); either suffices. With both disabled
//! every request is allowed. Failure is 401 with the documented body. Keys are compared in
//! constant time and never logged.

use super::ConnInfo;
use crate::config::Inbound;
use crate::error::ApiError;
use axum::extract::Request;
use axum::http::HeaderMap;

/// Header carrying a SAS key.
pub const SAS_HEADER: &str = "aeg-sas-key";

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a request with these headers on this connection is authenticated.
pub fn is_authorized(cfg: &Inbound, headers: &HeaderMap, conn: Option<ConnInfo>) -> bool {
    if !cfg.sas_enabled && !cfg.client_cert_enabled {
        return true;
    }
    if cfg.sas_enabled {
        if let Some(given) = headers.get(SAS_HEADER) {
            if cfg
                .sas_keys
                .iter()
                .any(|k| constant_time_eq(given.as_bytes(), k.as_bytes()))
            {
                return true;
            }
        }
    }
    cfg.client_cert_enabled && conn.is_some_and(|c| c.client_cert)
}

/// 401 unless the request is authenticated. The API's one layer ([`super::Guard`]) calls this
/// first on every API route.
///
/// # Errors
/// 401 with the documented body.
pub fn require(cfg: &Inbound, req: &Request) -> Result<(), ApiError> {
    let conn = req.extensions().get::<ConnInfo>().copied();
    if is_authorized(cfg, req.headers(), conn) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use axum::http::HeaderValue;

    fn inbound(pairs: &[(&str, &str)]) -> Inbound {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .unwrap()
            .inbound
    }

    fn headers(key: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(k) = key {
            h.insert(SAS_HEADER, HeaderValue::from_str(k).unwrap());
        }
        h
    }

    const HTTPS_CERT: Option<ConnInfo> = Some(ConnInfo {
        scheme: "https",
        client_cert: true,
    });
    const HTTPS_NONE: Option<ConnInfo> = Some(ConnInfo {
        scheme: "https",
        client_cert: false,
    });

    #[test]
    fn defaults_need_a_client_certificate() {
        let c = inbound(&[]);
        assert!(!is_authorized(&c, &headers(None), HTTPS_NONE));
        assert!(is_authorized(&c, &headers(None), HTTPS_CERT));
    }

    #[test]
    fn either_sas_key_or_certificate_suffices() {
        let c = inbound(&[
            ("inbound__clientAuth__sasKeys__enabled", "true"),
            ("inbound__clientAuth__sasKeys__key1", "k1"),
            ("inbound__clientAuth__sasKeys__key2", "k2"),
        ]);
        assert!(is_authorized(&c, &headers(Some("k1")), HTTPS_NONE));
        assert!(is_authorized(&c, &headers(Some("k2")), HTTPS_NONE));
        assert!(!is_authorized(&c, &headers(Some("bad")), HTTPS_NONE));
        assert!(is_authorized(&c, &headers(Some("bad")), HTTPS_CERT));
    }

    #[test]
    fn all_off_allows_everything() {
        let c = inbound(&[("inbound__clientAuth__clientCert__enabled", "false")]);
        assert!(is_authorized(&c, &headers(None), None));
    }
}
