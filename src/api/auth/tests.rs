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

fn config(pairs: &[(&str, &str)]) -> Config {
    Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
}

fn inbound(pairs: &[(&str, &str)]) -> Inbound {
    config(pairs).inbound
}

fn headers(key: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(k) = key {
        h.insert(SAS_HEADER, HeaderValue::from_str(k).unwrap());
    }
    h
}

/// A connection with a verified client certificate naming `cert` (empty: no CN), or none.
fn https(cert: Option<&str>) -> ConnInfo {
    ConnInfo {
        scheme: "https",
        client_cert: cert.is_some(),
        client_cert_verified: cert.is_some(),
        client_identity: cert.filter(|c| !c.is_empty()).map(Arc::from),
    }
}

/// A connection with a certificate accepted under `allowUnknownCA=true` that does not chain to
/// the trust bundle.
fn unverified() -> ConnInfo {
    ConnInfo {
        scheme: "https",
        client_cert: true,
        client_cert_verified: false,
        client_identity: None,
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

/// Issue 37, High 1: a certificate that does not chain to the trust bundle may only publish,
/// whatever `adminIdentities` says; a SAS key on the same request still counts.
#[test]
fn an_unverified_certificate_is_a_publisher() {
    let c = inbound(&[]);
    assert_eq!(
        authenticate(&c, &headers(None), Some(&unverified())),
        Some(Role::Publisher)
    );
    let c = inbound(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "k1"),
    ]);
    assert_eq!(
        authenticate(&c, &headers(Some("k1")), Some(&unverified())),
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
    let c = config(&[
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
        require(&c, None, &r).map_err(|e| e.error.status.as_u16())
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

/// A token `r={resource}&e={expiry}` signed with `key`, URL-encoded as the SDKs write it.
fn token(key: &str, resource: &str, e: &str) -> String {
    use base64::Engine;
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let unsigned = format!("r={}&e={}", enc(resource), enc(e));
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    let s =
        base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&k, unsigned.as_bytes()));
    format!("{unsigned}&s={}", enc(&s))
}

/// `require` for `method path` carrying `header: value`.
fn check(c: &Config, method: Method, path: &str, header: &str, value: &str) -> Result<(), u16> {
    let mut r = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(axum::body::Body::empty())
        .unwrap();
    r.headers_mut().insert(
        axum::http::HeaderName::from_bytes(header.as_bytes()).unwrap(),
        HeaderValue::from_str(value).unwrap(),
    );
    require(c, None, &r).map_err(|e| e.error.status.as_u16())
}

fn in_secs(d: u64) -> String {
    (crate::clock::system_wall_ms() / 1000 + d).to_string()
}

#[test]
fn shared_access_signatures_authenticate_by_the_key_that_signed_them() {
    let c = config(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        ("inbound__clientAuth__sasKeys__publishOnlyKeys", "pub-key"),
    ]);
    let later = in_secs(3600);
    let root = "https://gridlet";
    let put = |h: &str, v: &str| check(&c, Method::PUT, "/topics/t", h, v);
    let publish = |v: &str| check(&c, Method::POST, "/topics/t/events", "aeg-sas-token", v);
    let auth = "authorization";
    let admin = token("admin-key", root, &later);
    assert_eq!(put(auth, &format!("SharedAccessSignature {admin}")), Ok(()));
    assert_eq!(put("aeg-sas-token", &admin), Ok(()));
    assert_eq!(publish(&token("pub-key", root, &later)), Ok(()));
    assert_eq!(
        put("aeg-sas-token", &token("pub-key", root, &later)),
        Err(403)
    );
    assert_eq!(
        put("aeg-sas-token", &token("admin-key", root, "1000")),
        Err(401),
        "expired"
    );
    assert_eq!(
        put("aeg-sas-token", &token("other", root, &later)),
        Err(401)
    );
}

/// Issue 37, Medium 2: a token is valid for the resources its `r` prefixes (at a segment
/// boundary, in any case); a topic's token publishes to it and receives from its subscriptions,
/// nothing else; management needs the broker's root; `r` must name one of gridlet's hosts.
#[test]
fn a_token_is_bound_to_its_resource_and_host() {
    let c = config(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        ("inbound__allowedHostNames", "edge.example"),
    ]);
    let later = in_secs(3600);
    let t = |r: &str| token("admin-key", r, &later);
    let go = |m: Method, path: &str, tok: &str| check(&c, m, path, "aeg-sas-token", tok);
    let topic = t("https://gridlet:4438/topics/t");
    assert_eq!(go(Method::POST, "/topics/t/events", &topic), Ok(()));
    assert_eq!(go(Method::POST, "/topics/T/events/e1", &topic), Ok(()));
    assert_eq!(go(Method::POST, "/topics/t:publish", &topic), Ok(()));
    let receive = "/topics/t/eventsubscriptions/s:receive";
    assert_eq!(go(Method::POST, receive, &topic), Ok(()));
    assert_eq!(go(Method::POST, "/topics/t2/events", &topic), Err(403));
    assert_eq!(go(Method::PUT, "/topics/t", &topic), Err(403), "management");
    assert_eq!(
        go(Method::PUT, "/topics/t/eventSubscriptions/s", &topic),
        Err(403)
    );
    assert_eq!(go(Method::DELETE, "/topics/t", &topic), Err(403));
    assert_eq!(
        go(Method::GET, "/topics/t/eventSubscriptions/s", &topic),
        Err(403)
    );
    // The SDK's publish endpoint as `r`: publishing there, not receiving.
    let events = t("https://GRIDLET/topics/t/events?api-version=2018-01-01");
    assert_eq!(go(Method::POST, "/topics/t/events", &events), Ok(()));
    assert_eq!(go(Method::POST, receive, &events), Err(403));
    // The root: everything the key may do.
    for root in [
        "https://gridlet",
        "https://gridlet:4438/",
        "https://127.0.0.1",
        "localhost",
        "https://edge.example/",
    ] {
        assert_eq!(go(Method::PUT, "/topics/t", &t(root)), Ok(()), "{root}");
    }
    // Another host's token (a cloud topic signed with the same key) is no token for gridlet.
    for other in [
        "https://mytopic.westus2-1.eventgrid.azure.net/api/events",
        "https://mytopic.westus2-1.eventgrid.azure.net",
    ] {
        assert_eq!(
            go(Method::POST, "/topics/t/events", &t(other)),
            Err(401),
            "{other}"
        );
    }
}

/// Issue 37, Medium 2: expiries beyond the maximum lifetime (default one day) are refused,
/// including 2^64-1 and year 9999; dates are read as Event Grid writes them.
#[test]
fn a_token_expiring_beyond_the_maximum_lifetime_is_refused() {
    let c = config(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
    ]);
    let put = |e: &str| {
        let tok = token("admin-key", "https://gridlet", e);
        check(&c, Method::PUT, "/topics/t", "aeg-sas-token", &tok)
    };
    assert_eq!(put(&in_secs(86_400 - 60)), Ok(()));
    assert_eq!(put(&in_secs(86_400 + 60)), Err(401));
    assert_eq!(put("18446744073709551615"), Err(401));
    assert_eq!(put("9999-12-31T23:59:59Z"), Err(401));
    assert_eq!(put("12/31/9999 11:59:59 PM"), Err(401));
    // A date an hour ahead, in .NET's and Python's forms.
    let secs = crate::clock::system_wall_ms() / 1000 + 3600;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (h12, ampm) = match h {
        0 => (12, "AM"),
        1..=11 => (h, "AM"),
        12 => (12, "PM"),
        _ => (h - 12, "PM"),
    };
    assert_eq!(
        put(&format!("{m}/{d}/{y} {h12}:{mi:02}:{s:02} {ampm}")),
        Ok(())
    );
    assert_eq!(
        put(&format!("{y}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}+00:00")),
        Ok(())
    );
    // The setting.
    let short = config(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        (
            "inbound__clientAuth__sasKeys__maxTokenLifetimeInSeconds",
            "600",
        ),
    ]);
    let tok = token("admin-key", "https://gridlet", &in_secs(3600));
    assert_eq!(
        check(&short, Method::PUT, "/topics/t", "aeg-sas-token", &tok),
        Err(401)
    );
}

/// The civil date of a day number (days since 1970-01-01): Howard Hinnant's algorithm.
fn civil(days: u64) -> (i64, u64, u64) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
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
