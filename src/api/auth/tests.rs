use super::*;
use crate::config::Config;
use axum::http::HeaderValue;
use std::sync::Arc;

/// Issue 20, Low 15: keys are compared as fixed-length digests, so neither a length
/// mismatch nor the first differing byte ends the comparison early.
#[test]
fn keys_are_compared_as_fixed_length_digests() {
    assert_eq!(digest(b"k").len(), digest(&[b'k'; 10_000]).len());
    assert!(constant_time_eq(b"secret-key", b"secret-key"));
    assert!(!constant_time_eq(b"secret-key", b"secret-ke"));
    assert!(!constant_time_eq(b"secret-key", b"secret-keyX"));
    assert!(!constant_time_eq(b"", b"x"));
    assert!(any_key_matches(b"b", &["a".into(), "b".into()]));
}

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

fn https(cert: Option<&str>) -> ConnInfo {
    ConnInfo {
        scheme: "https",
        client_cert: cert.is_some(),
        client_identity: cert.filter(|c| !c.is_empty()).map(Arc::from),
    }
}

#[test]
fn defaults_need_a_client_certificate() {
    let c = inbound(&[]);
    assert_eq!(authenticate(&c, &headers(None), Some(&https(None))), None);
    assert_eq!(
        authenticate(&c, &headers(None), Some(&https(Some("any")))),
        Some(Role::Admin)
    );
}

#[test]
fn either_sas_key_or_certificate_suffices() {
    let c = inbound(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "k1"),
        ("inbound__clientAuth__sasKeys__key2", "k2"),
    ]);
    let none = https(None);
    assert_eq!(
        authenticate(&c, &headers(Some("k1")), Some(&none)),
        Some(Role::Admin)
    );
    assert_eq!(
        authenticate(&c, &headers(Some("k2")), Some(&none)),
        Some(Role::Admin)
    );
    assert_eq!(authenticate(&c, &headers(Some("bad")), Some(&none)), None);
    let cert = https(Some("m"));
    assert_eq!(
        authenticate(&c, &headers(Some("bad")), Some(&cert)),
        Some(Role::Admin)
    );
}

#[test]
fn the_namespace_sdks_key_header_is_a_sas_key() {
    let c = inbound(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "k1"),
        ("inbound__clientAuth__sasKeys__publishOnlyKeys", "p1"),
    ]);
    let with = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(v).unwrap());
        authenticate(&c, &h, Some(&https(None)))
    };
    assert_eq!(with("SharedAccessKey k1"), Some(Role::Admin));
    assert_eq!(with("sharedaccesskey p1"), Some(Role::Publisher));
    assert_eq!(with("SharedAccessKey k2"), None);
    assert_eq!(with("Bearer k1"), None);
    assert_eq!(with("SharedAccessKey"), None);
}

#[test]
fn a_receive_key_may_only_pull_from_its_subscription() {
    let c = inbound(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        (
            "inbound__clientAuth__sasKeys__receiveKeys",
            "orders/billing=r1, orders/audit=r2",
        ),
    ]);
    let req = |m: Method, path: &str, key: &str| {
        let mut r = axum::http::Request::builder()
            .method(m)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap();
        r.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("SharedAccessKey {key}")).unwrap(),
        );
        require(&c, &r).map_err(|e| e.status.as_u16())
    };
    assert_eq!(
        req(
            Method::POST,
            "/topics/orders/eventsubscriptions/billing:receive",
            "r1"
        ),
        Ok(())
    );
    assert_eq!(
        req(
            Method::POST,
            "/topics/Orders/eventSubscriptions/Billing:acknowledge",
            "r1"
        ),
        Ok(())
    );
    assert_eq!(
        req(
            Method::POST,
            "/topics/orders/eventsubscriptions/audit:receive",
            "r1"
        ),
        Err(403)
    );
    assert_eq!(
        req(
            Method::POST,
            "/topics/orders/eventsubscriptions/audit:release",
            "r2"
        ),
        Ok(())
    );
    assert_eq!(req(Method::POST, "/topics/orders:publish", "r1"), Err(403));
    assert_eq!(
        req(
            Method::GET,
            "/topics/orders/eventSubscriptions/billing",
            "r1"
        ),
        Err(403)
    );
    assert_eq!(
        req(
            Method::POST,
            "/topics/orders/eventsubscriptions/billing:receive",
            "r3"
        ),
        Err(401)
    );
    let bad = Config::from_vars([(
        "inbound__clientAuth__sasKeys__receiveKeys".to_string(),
        "orders=k".to_string(),
    )]);
    assert!(bad
        .unwrap_err()
        .to_string()
        .contains("topic/subscription=key"));
}

#[test]
fn shared_access_signatures_authenticate_by_the_key_that_signed_them() {
    use base64::Engine;
    let c = inbound(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        ("inbound__clientAuth__sasKeys__publishOnlyKeys", "pub-key"),
    ]);
    let token = |key: &str, e: u64| {
        let unsigned = format!("r=https%3A%2F%2Fgridlet&e={e}");
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
        let s = base64::engine::general_purpose::STANDARD
            .encode(ring::hmac::sign(&k, unsigned.as_bytes()));
        format!(
            "{unsigned}&s={}",
            s.replace('+', "%2B")
                .replace('/', "%2F")
                .replace('=', "%3D")
        )
    };
    let later = crate::clock::system_wall_ms() / 1000 + 3600;
    let with = |name: &str, v: String| {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(&v).unwrap(),
        );
        authenticate(&c, &h, Some(&https(None)))
    };
    let auth = "authorization";
    assert_eq!(
        with(
            auth,
            format!("SharedAccessSignature {}", token("admin-key", later))
        ),
        Some(Role::Admin)
    );
    assert_eq!(
        with("aeg-sas-token", token("pub-key", later)),
        Some(Role::Publisher)
    );
    assert_eq!(
        with("aeg-sas-token", token("admin-key", 1_000)),
        None,
        "expired"
    );
    assert_eq!(with("aeg-sas-token", token("other", later)), None);
}

#[test]
fn all_off_allows_everything() {
    let c = inbound(&[("inbound__clientAuth__clientCert__enabled", "false")]);
    assert_eq!(authenticate(&c, &headers(None), None), Some(Role::Admin));
}

#[test]
fn publish_only_keys_and_admin_identities() {
    let c = inbound(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin"),
        ("inbound__clientAuth__sasKeys__publishOnlyKeys", "p1, p2"),
        (
            "inbound__clientAuth__clientCert__adminIdentities",
            "ops,Manager",
        ),
    ]);
    let none = https(None);
    let role = |key: Option<&str>, conn: &ConnInfo| authenticate(&c, &headers(key), Some(conn));
    assert_eq!(role(Some("p2"), &none), Some(Role::Publisher));
    assert_eq!(role(Some("admin"), &none), Some(Role::Admin));
    assert_eq!(role(Some("p3"), &none), None);
    assert_eq!(role(None, &https(Some("sensor"))), Some(Role::Publisher));
    assert_eq!(role(None, &https(Some("manager"))), Some(Role::Admin));
    assert_eq!(role(None, &https(Some(""))), Some(Role::Publisher));
    // The strongest credential counts.
    assert_eq!(role(Some("p1"), &https(Some("ops"))), Some(Role::Admin));
}

#[test]
fn publishers_may_only_publish() {
    let req = |m: Method, path: &str| {
        axum::http::Request::builder()
            .method(m)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    assert!(is_publish(&req(
        Method::POST,
        "/topics/t/events?api-version=x"
    )));
    assert!(is_publish(&req(Method::POST, "/topics/t/events/id1")));
    assert!(is_publish(&req(
        Method::POST,
        "/topics/t:publish?api-version=x"
    )));
    assert!(!is_publish(&req(
        Method::POST,
        "/topics/t/eventsubscriptions/s:receive"
    )));
    assert!(!is_publish(&req(Method::PUT, "/topics/t")));
    assert!(!is_publish(&req(Method::GET, "/topics/t/events")));
    assert!(!is_publish(&req(
        Method::POST,
        "/topics/events/eventSubscriptions/s/deadLetters/replay"
    )));
    assert!(!is_publish(&req(
        Method::POST,
        "/topics/t/eventSubscriptions/s/deadLetters/replay"
    )));
    assert!(!is_publish(&req(Method::POST, "/topics/t/events/id/x")));
}
