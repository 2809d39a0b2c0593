use super::*;
use std::collections::HashMap;

fn parse(fields: &[(&'static str, &str)]) -> Result<ConnectionSpec, SpecError> {
    let map: HashMap<&'static str, String> =
        fields.iter().map(|(k, v)| (*k, v.to_string())).collect();
    ConnectionSpec::parse("plant", &|f| map.get(f).cloned())
}

fn field_of(fields: &[(&'static str, &str)]) -> &'static str {
    parse(fields).expect_err("should be refused").field
}

#[test]
fn defaults_are_mqtt5_with_a_persistent_session() {
    let s = parse(&[("url", "mqtt://broker")]).unwrap();
    assert_eq!(
        s.endpoint,
        Endpoint {
            scheme: Scheme::Mqtt,
            host: "broker".into(),
            port: 1883
        }
    );
    assert_eq!(s.client_id, "gridlet-plant");
    assert_eq!(s.protocol, Protocol::V5);
    assert!(!s.clean_start);
    assert_eq!(s.session_expiry_secs, 86_400);
    assert_eq!(s.receive_maximum, 100);
    assert_eq!(s.keep_alive, Duration::from_secs(60));
    let o = s.v5_options(None).unwrap();
    assert!(!o.clean_start());
    assert_eq!(o.session_expiry_interval(), Some(86_400));
    assert_eq!(o.receive_maximum(), Some(100));
    assert_eq!(o.broker_address(), ("broker".to_string(), 1883));
    assert!(o.credentials().is_none());
    assert!(o.authentication_method().is_none());
}

#[test]
fn urls_give_host_and_port_and_refuse_other_schemes() {
    let p = |u: &str| Endpoint::parse(u);
    assert_eq!(p("mqtts://aio-broker").unwrap().port, 8883);
    assert_eq!(p("mqtts://aio-broker:18883").unwrap().port, 18883);
    assert_eq!(p("mqtt://[::1]:1884/").unwrap().host, "::1");
    assert_eq!(p("mqtt://10.0.0.5").unwrap().host, "10.0.0.5");
    for bad_url in [
        "http://broker",
        "tcp://broker",
        "ws://broker",
        "broker:1883",
        "mqtt://",
        "mqtt://broker:99999",
        "mqtt://u:p@broker",
        "mqtt://broker/topic",
        "mqtt://broker?x=1",
    ] {
        let e = p(bad_url).expect_err(bad_url);
        assert_eq!(e.field, "url", "{bad_url}");
    }
    let e = p("http://broker").unwrap_err();
    assert!(e.to_string().contains("unknown scheme `http`"), "{e}");
    assert!(e.to_string().starts_with("url: "), "{e}");
}

#[test]
fn bad_fields_are_named() {
    assert_eq!(field_of(&[]), "url");
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("protocolVersion", "6")]),
        "protocolVersion"
    );
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("keepAliveSeconds", "2")]),
        "keepAliveSeconds"
    );
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("receiveMaximum", "0")]),
        "receiveMaximum"
    );
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("cleanStart", "yes")]),
        "cleanStart"
    );
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("sessionExpirySeconds", "-1")]),
        "sessionExpirySeconds"
    );
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("clientId", "a\u{1}b")]),
        "clientId"
    );
    assert_eq!(
        field_of(&[("url", "mqtt://b"), ("tls.caFile", "/ca.pem")]),
        "tls.caFile"
    );
    assert_eq!(
        field_of(&[("url", "mqtts://b"), ("tls.certFile", "/c.pem")]),
        "tls.keyFile"
    );
    assert_eq!(
        field_of(&[("url", "mqtts://b"), ("tls.clientIdentity", "Files")]),
        "tls.clientIdentity"
    );
    assert_eq!(
        field_of(&[
            ("url", "mqtts://b"),
            ("authentication.method", "SCRAM-SHA-1")
        ]),
        "authentication.method"
    );
    assert_eq!(
        field_of(&[("url", "mqtts://b"), ("authentication.method", "K8S-SAT")]),
        "authentication.tokenFile"
    );
    assert_eq!(
        field_of(&[
            ("url", "mqtts://b"),
            ("protocolVersion", "3.1.1"),
            ("authentication.method", "K8S-SAT"),
            ("authentication.tokenFile", "/t")
        ]),
        "authentication.method"
    );
}

#[test]
fn secrets_are_masked_in_debug() {
    let s = parse(&[
        ("url", "mqtt://b"),
        ("username", "gridlet"),
        ("password", "hunter2-secret"),
    ])
    .unwrap();
    let shown = format!("{s:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("***"), "{shown}");
    let o = s.v5_options(None).unwrap();
    let login = o.credentials().unwrap();
    assert_eq!(
        (login.username.as_str(), login.password.as_str()),
        ("gridlet", "hunter2-secret")
    );
}

#[test]
fn k8s_sat_sends_the_token_file_as_authentication_data_read_at_each_connect() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let s = parse(&[
        ("url", "mqtts://aio-broker:18883"),
        ("authentication.method", "k8s-sat"),
        ("authentication.tokenFile", token.to_str().unwrap()),
    ])
    .unwrap();
    let mut o = s.v5_options(None).unwrap();
    assert_eq!(o.authentication_method().as_deref(), Some("K8S-SAT"));
    assert_eq!(
        o.authentication_data().as_deref(),
        Some(&b"first-token"[..])
    );
    assert!(o.credentials().is_none(), "the token is not a password");
    std::fs::write(&token, "rotated").unwrap();
    s.refresh_v5(&mut o).unwrap();
    assert_eq!(o.authentication_data().as_deref(), Some(&b"rotated"[..]));
    std::fs::remove_file(&token).unwrap();
    let e = s.refresh_v5(&mut o).unwrap_err();
    assert_eq!(e.field, "authentication.tokenFile");
    assert!(!e.to_string().contains("rotated"));
}

fn write_ca(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["broker.local".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let ca = dir.join("ca.pem");
    let c = dir.join("client.pem");
    let k = dir.join("client-key.pem");
    std::fs::write(&ca, cert.pem()).unwrap();
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (ca, c, k)
}

#[test]
fn tls_reads_the_ca_and_client_files_and_names_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = write_ca(dir.path());
    let plain = parse(&[("url", "mqtt://b")]).unwrap();
    assert!(plain.tls_config(&EdgeTls::default()).unwrap().is_none());

    let s = parse(&[
        ("url", "mqtts://broker.local"),
        ("tls.caFile", ca.to_str().unwrap()),
        ("tls.certFile", cert.to_str().unwrap()),
        ("tls.keyFile", key.to_str().unwrap()),
    ])
    .unwrap();
    let cfg = s.tls_config(&EdgeTls::default()).unwrap().unwrap();
    assert!(cfg.client_auth_cert_resolver.has_certs());
    assert!(s.v5_options(Some(cfg)).is_ok());

    let missing = parse(&[
        ("url", "mqtts://broker.local"),
        ("tls.caFile", "/nonexistent/ca.pem"),
    ])
    .unwrap();
    let e = missing.tls_config(&EdgeTls::default()).unwrap_err();
    assert_eq!(e.field, "tls.caFile");
    assert!(e.message.contains("/nonexistent/ca.pem"), "{e}");

    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let e = parse(&[
        ("url", "mqtts://broker.local"),
        ("tls.caFile", garbage.to_str().unwrap()),
    ])
    .unwrap()
    .tls_config(&EdgeTls::default())
    .unwrap_err();
    assert_eq!(e.field, "tls.caFile");
}

#[test]
fn iot_edge_identity_needs_the_edge_runtime() {
    let s = parse(&[("url", "mqtts://b"), ("tls.clientIdentity", "IoTEdge")]).unwrap();
    assert_eq!(s.client_identity, ClientIdentity::IotEdge);
    let e = s.tls_config(&EdgeTls::default()).unwrap_err();
    assert_eq!(e.field, "tls.clientIdentity");
}

#[test]
fn mqtt_311_options() {
    let s = parse(&[
        ("url", "mqtt://b:1885"),
        ("protocolVersion", "3.1.1"),
        ("username", "u"),
        ("password", "p"),
    ])
    .unwrap();
    assert!(s.v5_options(None).is_err());
    let o = s.v311_options(None).unwrap();
    assert!(!o.clean_session());
    assert_eq!(o.broker_address(), ("b".to_string(), 1885));
    assert_eq!(
        field_of(&[
            ("url", "mqtt://b"),
            ("protocolVersion", "3.1.1"),
            ("password", "p")
        ]),
        "password"
    );
}
