//! The configuration loader's unit tests.

use super::*;
use std::path::PathBuf;
use std::time::Duration;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn defaults_match_the_contract() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.inbound.tls_policy, TlsPolicy::Strict);
    assert!(c.inbound.client_cert_enabled);
    assert!(c.inbound.client_cert_allow_unknown_ca);
    assert!(!c.inbound.sas_enabled);
    assert_eq!(c.inbound.http_port, 5888);
    assert_eq!(c.inbound.https_port, 4438);
    assert!(c.outbound.webhook_https_only);
    assert!(!c.outbound.webhook_skip_server_cert_validation);
    assert!(c.outbound.webhook_allow_unknown_ca);
    assert_eq!(c.broker.default_max_delivery_attempts, 30);
    assert_eq!(c.broker.default_event_ttl, Duration::from_secs(7200));
    assert_eq!(c.broker.default_max_batch_size_bytes, 1_058_576);
    assert_eq!(c.broker.default_max_events_per_batch, 10);
    assert_eq!(c.broker.max_request_body_bytes, 1_058_576);
    assert_eq!(c.api.max_events_per_batch, 50);
    assert_eq!(c.api.max_preferred_batch_size_kb, 1033);
    assert_eq!(c.metrics, MetricsReporter::None);
    assert_eq!(c.persistence.metadata_path, PathBuf::from("metadataDb"));
    assert_eq!(c.persistence.events_path, PathBuf::from("eventsDb"));
    assert_eq!(c.persistence.store, StoreKind::Log);
    assert_eq!(c.persistence.max_disk_bytes, 256 << 20);
}

#[test]
fn colon_separators_and_any_case_are_the_same_key() {
    let c = cfg(&[
        ("inbound:serverAuth:tlsPolicy", "Enabled"),
        ("BROKER__DEFAULTEVENTTIMETOLIVEINSECONDS", "1_800"),
        ("Inbound__ClientAuth:SasKeys__Enabled", "True"),
        ("inbound__clientAuth__sasKeys__key1", "MixedCaseSecret"),
        ("metrics:reportertype", "PROMETHEUS"),
    ])
    .unwrap();
    assert_eq!(c.inbound.tls_policy, TlsPolicy::Enabled);
    assert_eq!(c.broker.default_event_ttl, Duration::from_secs(1800));
    assert!(c.inbound.sas_enabled);
    assert_eq!(c.inbound.sas_keys, vec!["MixedCaseSecret".to_string()]);
    assert_eq!(c.metrics, MetricsReporter::Prometheus);
}

#[test]
fn invalid_values_name_the_key_and_the_accepted_values() {
    let e = cfg(&[("inbound__serverAuth__tlsPolicy", "sometimes")]).unwrap_err();
    let line = e.to_string();
    assert!(line.contains("inbound__serverAuth__tlsPolicy"), "{line}");
    assert!(line.contains("strict, enabled, disabled"), "{line}");
    let e = cfg(&[("broker__defaultMaxDeliveryAttempts", "lots")]).unwrap_err();
    assert!(e.to_string().contains("whole number"));
    let e = cfg(&[("outbound__webhook__httpsOnly", "yes")]).unwrap_err();
    assert!(e.to_string().contains("true or false"));
}

#[test]
fn denied_address_ranges_parse_and_match() {
    let c = cfg(&[]).unwrap();
    let denied = |ip: &str| {
        let ip: std::net::IpAddr = ip.parse().unwrap();
        c.outbound.denied_ranges.iter().any(|r| r.contains(ip))
    };
    assert!(denied("169.254.169.254"));
    assert!(denied("fe80::1"));
    assert!(denied("::ffff:169.254.0.1"));
    assert!(!denied("10.0.0.1") && !denied("127.0.0.1") && !denied("192.168.1.1"));
    let c = cfg(&[(
        "outbound__deniedAddressRanges",
        " 127.0.0.0/8 , ::1,10.1.2.3",
    )])
    .unwrap();
    assert_eq!(c.outbound.denied_ranges.len(), 3);
    assert!(c.outbound.denied_ranges[0].contains("127.9.9.9".parse().unwrap()));
    assert!(c.outbound.denied_ranges[2].contains("10.1.2.3".parse().unwrap()));
    assert!(!c.outbound.denied_ranges[2].contains("10.1.2.4".parse().unwrap()));
    assert!(cfg(&[("outbound__deniedAddressRanges", "")])
        .unwrap()
        .outbound
        .denied_ranges
        .is_empty());
    for bad in ["169.254.0.0/33", "fe80::/129", "localhost", "1.2.3.4/x"] {
        let e = cfg(&[("outbound__deniedAddressRanges", bad)]).unwrap_err();
        assert!(
            e.to_string().contains("outbound__deniedAddressRanges"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn sas_enabled_without_a_key_is_refused() {
    let e = cfg(&[("inbound__clientAuth__sasKeys__enabled", "true")]).unwrap_err();
    assert!(e.to_string().contains("key1"));
}

#[test]
fn entra_settings_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let path = jwks.display().to_string();
    let on = |extra: &[(&str, &str)]| {
        let mut v = vec![
            ("inbound__clientAuth__entra__enabled", "true"),
            ("inbound__clientAuth__entra__tenantId", "t-1"),
            ("inbound__clientAuth__entra__jwksPath", path.as_str()),
        ];
        v.extend_from_slice(extra);
        cfg(&v)
    };
    let err = |extra: &[(&str, &str)]| on(extra).unwrap_err().to_string();
    assert!(err(&[]).contains("jwksPath"), "no file");
    for (doc, why) in [
        ("not json", "not JSON"),
        (r#"{"keys": []}"#, "no RSA signing key"),
        (
            r#"{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#,
            "kid",
        ),
        (
            r#"{"keys": [{"kty": "RSA", "kid": "a", "n": "*", "e": "AQAB"}]}"#,
            "base64url",
        ),
        (
            r#"{"keys": [{"kty": "RSA", "use": "enc", "kid": "a", "n": "AQAB", "e": "AQAB"}]}"#,
            "no RSA signing key",
        ),
    ] {
        std::fs::write(&jwks, doc).unwrap();
        let e = err(&[]);
        assert!(e.contains("jwksPath") && e.contains(why), "{doc}: {e}");
    }
    std::fs::write(
        &jwks,
        r#"{"keys": [{"kty": "RSA", "kid": "a", "n": "AQAB", "e": "AQAB"}]}"#,
    )
    .unwrap();
    assert!(err(&[("inbound__clientAuth__entra__tenantId", "")]).contains("tenantId"));
    assert!(err(&[("inbound__clientAuth__entra__senders", "no-slash")]).contains("senders"));
    let c = on(&[("inbound__clientAuth__entra__receivers", "T-1/ABC")]).unwrap();
    let e = c.inbound.entra.as_ref().unwrap();
    assert_eq!(e.issuers[0], "https://sts.windows.net/t-1/");
    assert_eq!(e.audiences, ["https://eventgrid.azure.net"]);
    assert_eq!(
        (
            e.receivers[0].tenant.as_str(),
            e.receivers[0].object.as_str()
        ),
        ("t-1", "abc")
    );
    assert!(
        c.inbound.requires_credential(),
        "Entra alone ends the open mode"
    );
    assert!(cfg(&[]).unwrap().inbound.entra.is_none());
    // Where fetched keys come from: an https authority; the file is optional when fetching.
    let r = e.refresh.as_ref().expect("fetched by default");
    assert_eq!(
        r.metadata_url,
        "https://login.microsoftonline.com/t-1/v2.0/.well-known/openid-configuration"
    );
    assert_eq!((r.every.as_secs(), r.min_interval.as_secs()), (43200, 300));
    assert!(r.cache_path.ends_with("metadataDb/entra-jwks.json"));
    for bad in [
        "http://login.example",
        "login.example",
        "https://u:p@h",
        "https://h/?q=1",
    ] {
        let e = err(&[("inbound__clientAuth__entra__authority", bad)]);
        assert!(
            e.contains("authority") && e.contains("https URL"),
            "{bad}: {e}"
        );
    }
    let china = on(&[(
        "inbound__clientAuth__entra__authority",
        "https://login.partner.microsoftonline.cn/",
    )])
    .unwrap();
    let issuers = &china.inbound.entra.as_ref().unwrap().issuers;
    assert_eq!(
        issuers,
        &[
            "https://sts.chinacloudapi.cn/t-1/",
            "https://login.partner.microsoftonline.cn/t-1/v2.0"
        ]
    );
    let fetch_only = on(&[("inbound__clientAuth__entra__jwksPath", "")]).unwrap();
    assert!(fetch_only.inbound.entra.as_ref().unwrap().keys.is_empty());
    let e = err(&[
        ("inbound__clientAuth__entra__jwksPath", ""),
        (
            "inbound__clientAuth__entra__jwksRefreshIntervalInSeconds",
            "0",
        ),
    ]);
    assert!(
        e.contains("jwksPath") && e.contains("jwksRefreshIntervalInSeconds=0"),
        "{e}"
    );
    let file_only = on(&[(
        "inbound__clientAuth__entra__jwksRefreshIntervalInSeconds",
        "0",
    )]);
    assert!(file_only.unwrap().inbound.entra.unwrap().refresh.is_none());
}

#[test]
fn secrets_never_show_in_debug_output() {
    let c = cfg(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "topsecret"),
    ])
    .unwrap();
    assert!(!format!("{c:?}").contains("topsecret"));
}

#[test]
fn unknown_setting_keys_are_reported() {
    let c = cfg(&[("broker__defaultMaxDeliveryAtempts", "3"), ("PATH", "/bin")]).unwrap();
    assert_eq!(
        c.unknown_keys,
        vec![super::UnknownKey {
            key: "broker__defaultMaxDeliveryAtempts".to_string(),
            closest: Some(super::Key::broker__defaultMaxDeliveryAttempts),
        }]
    );
}

#[test]
fn iot_edge_identity_is_read() {
    let c = cfg(&[
        (
            "IOTEDGE_IOTHUBHOSTNAME",
            "eg-iot-edge-hub.azure-devices.net",
        ),
        ("IOTEDGE_DEVICEID", "eg-edge-device"),
        ("IOTEDGE_MODULEID", "eventgridmodule"),
    ])
    .unwrap();
    assert_eq!(c.edge.hub_name, "eg-iot-edge-hub");
    assert_eq!(c.edge.device_id, "eg-edge-device");
    assert_eq!(c.edge.module_id, "eventgridmodule");
    assert!(!c.edge.is_iot_edge());
}

/// Issue 20, Low 11: the defaults deny the other metadata addresses and 0.0.0.0; a range
/// written as an IPv4-mapped IPv6 range matches (it never did).
#[test]
fn denied_defaults_cover_wireserver_aws_ipv6_and_this_host_and_mapped_ranges_match() {
    let c = cfg(&[]).unwrap();
    let denied = |ip: &str| {
        let ip: std::net::IpAddr = ip.parse().unwrap();
        c.outbound.denied_ranges.iter().any(|r| r.contains(ip))
    };
    for ip in [
        "168.63.129.16",
        "fd00:ec2::254",
        "0.0.0.0",
        "::",
        "::ffff:168.63.129.16",
    ] {
        assert!(denied(ip), "{ip}");
    }
    assert!(!denied("168.63.129.17") && !denied("fd00:ec2::253"));
    let c = cfg(&[("outbound__deniedAddressRanges", "::ffff:10.0.0.0/104")]).unwrap();
    let r = c.outbound.denied_ranges[0];
    assert!(r.contains("10.1.2.3".parse().unwrap()));
    assert!(r.contains("::ffff:10.1.2.3".parse().unwrap()));
    assert!(!r.contains("11.0.0.1".parse().unwrap()));
}
