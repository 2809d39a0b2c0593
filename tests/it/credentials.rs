//! Issue 37 (trust, third pass), findings 1, 2, 5 and 8: who a credential makes an
//! administrator, what a shared access signature is valid for, which servers get a webhook's
//! secrets, and telemetry credentials in the log. Each test fails on the code before the fix.

use crate::util::free_port;
use crate::util::*;
use serde_json::json;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};

/// The real binary, its stdout's lines on a channel.
struct Process {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Process {
    /// Start the binary in `dir` with `env` and stdout piped (stderr dropped).
    fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gridlet"))
            .current_dir(dir)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Lines logged until one contains `until` (included), or everything within `WAIT`.
    fn lines_until(&self, until: &str) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(WAIT) {
            let done = l.contains(until);
            out.push(l);
            if done {
                break;
            }
        }
        out
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `gridlet check-config` with `args` and `env`: its stdout and exit code.
fn check_config(args: &[&str], env: &[(&str, &str)]) -> (String, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_gridlet"))
        .arg("check-config")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code(),
    )
}

/// A client presenting a self-signed certificate with subject `CN={cn}`.
fn self_signed_client(cn: &str) -> reqwest::Client {
    let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    gridlet::tls::install_default_provider();
    reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap())
        .build()
        .unwrap()
}

/// Finding 1 (High): the shipped settings (client certificates on, `allowUnknownCA=true`, no
/// `adminIdentities`) made any self-signed certificate an administrator: `CN=ops` got 200 on
/// `PUT /topics/x`. The real binary now gives it 403 on every management route and 200 on a
/// publish; a SAS key still manages; `check-config` warns that no admin identity is set, and
/// the shipped template sets one.
#[tokio::test]
async fn a_self_signed_client_certificate_may_only_publish() {
    let dir = tempfile::tempdir().unwrap();
    let (http, https) = (free_port().to_string(), free_port().to_string());
    let _p = Process::start(
        dir.path(),
        &[
            ("inbound__serverAuth__tlsPolicy", "enabled"),
            ("inbound__bindAddress", "127.0.0.1"),
            ("inbound__httpPort", &http),
            ("inbound__httpsPort", &https),
            ("inbound__clientAuth__sasKeys__enabled", "true"),
            ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        ],
    );
    gridlet::tls::install_default_provider();
    let plain = reqwest::Client::new();
    let http = format!("http://127.0.0.1:{http}");
    let up = poll_within(WAIT, || plain.get(format!("{http}/healthz")).send()).await;
    assert!(up.is_ok_and(|r| r.status() == 200), "gridlet did not start");
    let ops = self_signed_client("ops");
    let https = format!("https://127.0.0.1:{https}");
    let r = ops
        .put(format!("{https}/topics/x?{V}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a self-signed certificate does not manage");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "Forbidden", "{body}");
    let r = plain
        .put(format!("{http}/topics/x?{V}"))
        .header("aeg-sas-key", "admin-key")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a SAS key still manages");
    for (method, path) in [
        (reqwest::Method::GET, "/topics"),
        (reqwest::Method::DELETE, "/topics/x"),
        (reqwest::Method::PUT, "/topics/x/eventSubscriptions/s"),
    ] {
        let r = ops
            .request(method, format!("{https}{path}?{V}"))
            .json(
                &json!({"properties": {"destination": {"endpointType": "WebHook",
                "properties": {"endpointUrl": "https://127.0.0.1:1/"}}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{path}");
    }
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    let r = ops
        .post(format!("{https}/topics/x/events?{V}"))
        .json(&events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "it still publishes");

    let (text, code) = check_config(&[], &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("warning: inbound__clientAuth__clientCert__adminIdentities is empty"),
        "{text}"
    );
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/deployment.template.json");
    let (text, code) = check_config(&["--manifest", template], &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("warning:"), "{text}");
}

/// Finding 8 (Low): the start-up settings line printed `OTEL_EXPORTER_OTLP_ENDPOINT` whole,
/// `user:password@` and query token included. The real binary's log now masks them on every
/// line, and warns that the headers would go in clear text to a host that is not loopback;
/// `check-config` masks them too.
#[test]
fn telemetry_credentials_are_masked_in_the_log_and_clear_text_headers_warned() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = "http://otel-user:otel-password@collector.example:4318/?token=otel-query-token";
    let env = [
        ("inbound__serverAuth__tlsPolicy", "disabled"),
        ("inbound__bindAddress", "127.0.0.1"),
        ("inbound__httpPort", "0"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=otel-header-secret"),
    ];
    let p = Process::start(dir.path(), &env);
    let lines = p.lines_until("exporting metrics");
    let text = lines.join("\n");
    assert!(text.contains("gridlet starting"), "{text}");
    assert!(text.contains("exporting metrics"), "{text}");
    for secret in ["otel-password", "otel-query-token", "otel-header-secret"] {
        assert!(!text.contains(secret), "{secret} logged:\n{text}");
    }
    let start = lines
        .iter()
        .find(|l| l.contains("gridlet starting"))
        .unwrap();
    assert!(
        start.contains(
            "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-user:***@collector.example:4318/?token=***"
        ),
        "{start}"
    );
    let warning = lines
        .iter()
        .find(|l| l.contains("in clear text"))
        .unwrap_or_else(|| panic!("no clear-text warning:\n{text}"));
    assert!(warning.starts_with("<4> "), "{warning}");
    assert!(warning.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{warning}");

    let (text, code) = check_config(&[], &env);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("in clear text"), "{text}");
    for secret in ["otel-password", "otel-query-token", "otel-header-secret"] {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
    // Over https, or to a loopback collector, there is nothing to warn about.
    let (text, _) = check_config(
        &[],
        &[
            ("inbound__clientAuth__clientCert__adminIdentities", "ops"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=x"),
        ],
    );
    assert!(!text.contains("warning:"), "{text}");
}

/// A token `r={resource}&e={expiry}` signed with `key`, URL-encoded as the SDKs write it.
fn sas_token(key: &str, resource: &str, e: &str) -> String {
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

fn in_an_hour() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (now + 3600).to_string()
}

/// Finding 2 (Medium): `r` was never checked and any expiry was accepted, so a token made to
/// publish to one topic (or for another host) was a full administrator credential, forever.
/// Now a topic's token publishes to that topic and receives from its subscriptions, nothing
/// else; management needs the broker's root; another host's token and absurd expiries are 401.
#[tokio::test]
async fn a_shared_access_signature_is_bound_to_its_resource_host_and_lifetime() {
    let t = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
    ])
    .await;
    let send = |method: reqwest::Method, path: &str, token: &str, body: serde_json::Value| {
        let r = t
            .client
            .request(method, t.url(path))
            .header("aeg-sas-token", token)
            .json(&body);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let later = in_an_hour();
    let root = sas_token("admin-key", "https://127.0.0.1/", &later);
    let topic = sas_token("admin-key", "https://127.0.0.1/topics/t", &later);
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    use reqwest::Method as M;
    assert_eq!(send(M::PUT, "/topics/t", &topic, json!({})).await, 403);
    assert_eq!(send(M::PUT, "/topics/t", &root, json!({})).await, 200);
    assert_eq!(
        send(M::POST, "/topics/t/events", &topic, events.clone()).await,
        200
    );
    assert_eq!(send(M::PUT, "/topics/t2", &topic, json!({})).await, 403);
    assert_eq!(send(M::DELETE, "/topics/t", &topic, json!({})).await, 403);
    assert_eq!(send(M::GET, "/topics", &topic, json!({})).await, 403);
    // Made for a cloud topic with the same key: not a token for gridlet.
    let cloud = sas_token(
        "admin-key",
        "https://mytopic.westus2-1.eventgrid.azure.net/api/events",
        &later,
    );
    assert_eq!(
        send(M::POST, "/topics/t/events", &cloud, events.clone()).await,
        401
    );
    assert_eq!(send(M::PUT, "/topics/t3", &cloud, json!({})).await, 401);
    for forever in [
        "18446744073709551615",
        "9999-12-31T23:59:59Z",
        "12/31/9999 11:59:59 PM",
    ] {
        let tok = sas_token("admin-key", "https://127.0.0.1/", forever);
        assert_eq!(
            send(M::PUT, "/topics/t3", &tok, json!({})).await,
            401,
            "{forever}"
        );
    }
}

/// Finding 5 (Medium): under the default `outbound__webhook__allowUnknownCA=true` a self-signed
/// `CN=attacker.example` server received `?code=FUNCTIONKEY` and a secret `X-Api-Key` header.
/// Now a webhook that carries a secret (URL query or user info, an `isSecret` attribute, a
/// signing secret) is sent only to a server whose chain and host name verify: this server gets
/// none of them, and each attempt fails. A webhook without secrets still reaches it (the
/// original's `allowUnknownCA`), and so does one that opts out with
/// `sendSecretsToUnverifiedServer: true` (documented as dangerous).
#[tokio::test]
async fn webhook_secrets_go_only_to_a_verified_server() {
    let t = start(&[("outbound__webhook__httpsOnly", "true")]).await;
    let (mut rx, _pem) = https_receiver_as(&["attacker.example"]).await;
    let port = rx.addr.port();
    let url = |path: &str| format!("https://127.0.0.1:{port}{path}");
    let secret_header = json!({"name": "X-Api-Key", "type": "Static",
        "properties": {"value": "API-KEY-SECRET", "isSecret": true}});
    t.topic("t").await;
    let dest = |props: serde_json::Value| json!({"properties": {"destination": {"endpointType": "WebHook", "properties": props}}});
    let subs = [
        ("plain", dest(json!({"endpointUrl": url("/plain")}))),
        (
            "code",
            dest(json!({"endpointUrl": url("/code?code=FUNCTIONKEY")})),
        ),
        (
            "userinfo",
            dest(
                json!({"endpointUrl": format!("https://user:URL-PASSWORD@127.0.0.1:{port}/userinfo")}),
            ),
        ),
        (
            "header",
            dest(
                json!({"endpointUrl": url("/header"), "deliveryAttributeMappings": [secret_header]}),
            ),
        ),
        (
            "signed",
            dest(json!({"endpointUrl": url("/signed"),
                "signingSecrets": ["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]})),
        ),
        (
            "optout",
            dest(json!({"endpointUrl": url("/optout?code=OPTED-OUT-KEY"),
                "sendSecretsToUnverifiedServer": true})),
        ),
    ];
    for (name, body) in &subs {
        let (s, b) = t
            .put(
                &format!("/topics/t/eventSubscriptions/{name}"),
                body.clone(),
            )
            .await;
        assert_eq!(s, 200, "{name}: {b}");
    }
    t.publish("t", json!([eg_event("e1", "s", "t", json!({}))]))
        .await;
    for name in ["code", "userinfo", "header", "signed"] {
        let labels = format!("topic=\"t\",subscription=\"{name}\"");
        t.wait_metric("DeliveryFailureCounts", &labels, 1).await;
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(rx.next().await);
    }
    got.sort_by(|a, b| a.path.cmp(&b.path));
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/optout", "/plain"]);
    assert!(got.iter().all(|r| r.headers.get("x-api-key").is_none()));
    assert!(
        rx.rx.try_recv().is_err(),
        "no secret-carrying webhook reached the server"
    );
    // The opt-out is echoed, and must be a boolean.
    let (s, b) = t.get("/topics/t/eventSubscriptions/optout").await;
    assert_eq!(s, 200);
    assert_eq!(
        b["properties"]["destination"]["properties"]["sendSecretsToUnverifiedServer"], true,
        "{b}"
    );
    let (s, b) = t
        .put(
            "/topics/t/eventSubscriptions/bad",
            dest(json!({"endpointUrl": url("/x"), "sendSecretsToUnverifiedServer": "sometimes"})),
        )
        .await;
    assert_eq!(s, 400, "{b}");
}
