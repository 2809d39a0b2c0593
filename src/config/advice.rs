//! Settings that are valid but risky: `gridlet check-config` prints each as a warning and
//! start-up logs it. None stops gridlet.

use super::{Config, Key};

impl Config {
    /// One sentence per risky combination, naming the settings to change.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let inbound = &self.inbound;
        if inbound.client_cert_enabled
            && inbound.tls_policy.https()
            && inbound.admin_identities.is_empty()
        {
            out.push(format!(
                "{} is empty: every client certificate that chains to the IoT Edge trust bundle \
                 (any module on the device) may manage topics and subscriptions; list the module \
                 ids that may (certificates that do not chain to it may only publish)",
                Key::inbound__clientAuth__clientCert__adminIdentities.name()
            ));
        }
        if inbound.entra.is_some() && inbound.tls_policy.http() {
            out.push(format!(
                "{} accepts Entra ID bearer tokens on the plain HTTP port too, where anyone on the \
                 network can copy one and replay it until it expires: set {}=strict",
                Key::inbound__clientAuth__entra__enabled.name(),
                Key::inbound__serverAuth__tlsPolicy.name()
            ));
        }
        let t = &self.telemetry;
        for url in [&t.traces_endpoint, &t.metrics_endpoint]
            .into_iter()
            .flatten()
        {
            if let Some(what) = clear_text_credentials(url, !t.headers.is_empty()) {
                out.push(format!(
                    "{what} would go in clear text over http:// to {}, which is not a loopback \
                     address: use https://",
                    crate::redact::mask_url(url)
                ));
            }
        }
        out
    }
}

/// What credentials an OTLP export to `url` would send unencrypted to another host: the
/// headers, or the URL's user info (sent as basic auth). `None` over https, to a loopback
/// host, or with nothing to send.
fn clear_text_credentials(url: &str, headers: bool) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let loopback = match u.host()? {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    if u.scheme() != "http" || loopback {
        return None;
    }
    let userinfo = !u.username().is_empty() || u.password().is_some();
    match (headers, userinfo) {
        (true, true) => Some(format!(
            "{} and the endpoint's user info",
            Key::OTEL_EXPORTER_OTLP_HEADERS.name()
        )),
        (true, false) => Some(Key::OTEL_EXPORTER_OTLP_HEADERS.name().to_string()),
        (false, true) => Some("the OTLP endpoint's user info".to_string()),
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn warnings(vars: &[(&str, &str)]) -> Vec<String> {
        Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .unwrap()
            .warnings()
    }

    #[test]
    fn no_admin_identities_is_a_warning_while_certificates_are_on() {
        let w = warnings(&[]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("adminIdentities"), "{w:?}");
        assert!(
            warnings(&[("inbound__clientAuth__clientCert__adminIdentities", "ops")]).is_empty()
        );
        assert!(warnings(&[("inbound__clientAuth__clientCert__enabled", "false")]).is_empty());
    }

    #[test]
    fn otlp_credentials_over_plain_http_to_another_host_are_a_warning() {
        let off = ("inbound__clientAuth__clientCert__enabled", "false");
        let w = |vars: &[(&str, &str)]| {
            let mut v = vars.to_vec();
            v.push(off);
            warnings(&v)
        };
        let headers = ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret");
        let remote = (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector.example:4318",
        );
        let got = w(&[remote, headers]);
        assert_eq!(got.len(), 2, "traces and metrics: {got:?}");
        assert!(got[0].contains("OTEL_EXPORTER_OTLP_HEADERS"), "{got:?}");
        assert!(!got.concat().contains("s3cret"));
        let cfg = Config::from_vars([(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
            "https://u:pw@c/?token=t0ken".to_string(),
        )])
        .unwrap();
        let debug = format!("{cfg:?}");
        assert!(!debug.contains("pw") && !debug.contains("t0ken"), "{debug}");
        let userinfo = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://u:pw@10.0.0.9/v1/traces",
        );
        let got = w(&[userinfo]);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains("user info") && !got[0].contains("pw"),
            "{got:?}"
        );
        for quiet in [
            vec![remote],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example"),
                headers,
            ],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
                headers,
            ],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.2:4318"),
                headers,
            ],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1]:4318"),
                headers,
            ],
        ] {
            assert!(w(&quiet).is_empty(), "{quiet:?}");
        }
    }
}
