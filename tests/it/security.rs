//! docs/COMPATIBILITY.md behaviours 53–56: listeners, authentication, configuration spelling.

use crate::util::*;
use gridlet::{Config, Gridlet, Parts};
use serde_json::json;

#[tokio::test]
async fn default_config_is_https_only_and_needs_a_client_certificate_compat_53() {
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("inbound__httpsPort".to_string(), "0".to_string()),
        ("inbound__bindAddress".to_string(), "127.0.0.1".to_string()),
        (
            "persistence__metadataPath".to_string(),
            dir.path().join("m").display().to_string(),
        ),
        (
            "persistence__eventsPath".to_string(),
            dir.path().join("e").display().to_string(),
        ),
    ];
    let g = Gridlet::start(Config::from_vars(env).unwrap(), Parts::default())
        .await
        .unwrap();
    assert!(g.http_addr.is_none(), "5888 is closed by default");
    let https = g.https_addr.unwrap();
    gridlet::tls::install_default_provider();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let r = client
        .get(format!("https://127.0.0.1:{}/topics?{V}", https.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["error"]["code"], "Unauthorized");
    // With a client certificate (any CA: allowUnknownCA defaults to true) the caller is
    // authenticated, but a certificate that does not chain to the trust bundle may only publish
    // (issue 37; the original made it administrator): 403, not 401.
    let ck = rcgen::generate_simple_self_signed(vec!["client".to_string()]).unwrap();
    let pem = format!("{}{}", ck.cert.pem(), ck.signing_key.serialize_pem());
    let id = reqwest::Identity::from_pem(pem.as_bytes()).unwrap();
    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .identity(id)
        .build()
        .unwrap();
    let r = client
        .get(format!("https://127.0.0.1:{}/topics?{V}", https.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["error"]["code"], "Forbidden");
    g.shutdown().await;
}

#[tokio::test]
async fn sas_keys_compat_54() {
    let t = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "k1"),
        ("inbound__clientAuth__sasKeys__key2", "k2"),
    ])
    .await;
    let get = |key: Option<&'static str>| {
        let t = &t;
        async move {
            let mut r = t.client.put(t.url("/topics/t1")).json(&json!({}));
            if let Some(k) = key {
                r = r.header("aeg-sas-key", k);
            }
            r.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(get(Some("k1")).await, 200);
    assert_eq!(get(Some("k2")).await, 200);
    assert_eq!(get(Some("bad")).await, 401);
    assert_eq!(get(None).await, 401);
}

#[tokio::test]
async fn tls_policy_picks_the_listeners_compat_55() {
    for (policy, http, https) in [
        ("disabled", true, false),
        ("enabled", true, true),
        ("strict", false, true),
    ] {
        let t = start(&[("inbound__serverAuth__tlsPolicy", policy)]).await;
        assert_eq!(t.g.http_addr.is_some(), http, "{policy}");
        assert_eq!(t.g.https_addr.is_some(), https, "{policy}");
    }
}

#[tokio::test]
async fn colon_separated_keys_behave_like_double_underscores_compat_56() {
    let dir = tempfile::tempdir().unwrap();
    let env: Vec<(String, String)> = [
        ("inbound:serverAuth:tlsPolicy", "Enabled"),
        ("INBOUND:CLIENTAUTH:CLIENTCERT:ENABLED", "False"),
        ("inbound__httpPort", "0"),
        ("inbound__httpsPort", "0"),
        ("inbound:bindAddress", "127.0.0.1"),
        ("outbound:webhook:httpsOnly", "false"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([
        (
            "persistence__metadataPath".to_string(),
            dir.path().join("m").display().to_string(),
        ),
        (
            "persistence__eventsPath".to_string(),
            dir.path().join("e").display().to_string(),
        ),
    ])
    .collect();
    let g = Gridlet::start(Config::from_vars(env).unwrap(), Parts::default())
        .await
        .unwrap();
    let base = format!(
        "http://{}",
        g.http_addr
            .expect("HTTP listener from the colon-spelled policy")
    );
    let r = reqwest::Client::new()
        .put(format!("{base}/topics/t?{V}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "client certs disabled through the colon spelling"
    );
    g.shutdown().await;
}

#[tokio::test]
async fn metrics_are_off_by_default_compat_62() {
    let t = start(&[("metrics__reporterType", "none")]).await;
    assert_eq!(t.get("/metrics").await.0, 404);
}

#[tokio::test]
async fn health_routes_need_no_auth() {
    let t = start(&[("inbound__clientAuth__clientCert__enabled", "true")]).await;
    let r = t
        .client
        .get(format!("{}/healthz", t.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = t
        .client
        .get(format!("{}/readyz", t.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(t.get("/topics").await.0, 401);
}

/// A publish-only SAS key (`inbound__clientAuth__sasKeys__publishOnlyKeys`) publishes, and gets
/// 403 Forbidden in the documented error body on everything else; key1 stays administrator.
#[tokio::test]
async fn publish_only_sas_keys_may_only_publish() {
    let t = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
        (
            "inbound__clientAuth__sasKeys__publishOnlyKeys",
            "pub-a,pub-b",
        ),
    ])
    .await;
    let mut rx = Receiver::start().await;
    let send = |r: reqwest::RequestBuilder, key: &'static str| async move {
        let r = r.header("aeg-sas-key", key).send().await.unwrap();
        let status = r.status().as_u16();
        (
            status,
            r.json::<serde_json::Value>().await.unwrap_or_default(),
        )
    };
    let put_topic = |name: &str| {
        t.client
            .put(t.url(&format!("/topics/{name}")))
            .json(&json!({}))
    };
    let (s, b) = send(put_topic("t1"), "pub-a").await;
    assert_eq!(s, 403, "{b}");
    assert_eq!(b["error"]["code"], "Forbidden", "{b}");
    assert_eq!(b["error"]["details"]["code"], "Forbidden", "{b}");
    assert!(b["error"]["details"]["message"].is_string(), "{b}");
    assert_eq!(send(put_topic("t1"), "admin-key").await.0, 200);
    let sub = json!({"properties": {"destination": {"endpointType": "WebHook",
        "properties": {"endpointUrl": rx.url("/p")}}}});
    let put_sub = || {
        t.client
            .put(t.url("/topics/t1/eventSubscriptions/s"))
            .json(&sub)
    };
    assert_eq!(send(put_sub(), "pub-b").await.0, 403);
    assert_eq!(send(put_sub(), "admin-key").await.0, 200);
    for path in [
        "/topics",
        "/topics/t1",
        "/topics/t1/eventSubscriptions/s",
        "/metrics",
    ] {
        assert_eq!(
            send(t.client.get(t.url(path)), "pub-a").await.0,
            403,
            "{path}"
        );
    }
    assert_eq!(
        send(t.client.delete(t.url("/topics/t1")), "pub-a").await.0,
        403
    );
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    let publish = t.client.post(t.url("/topics/t1/events")).json(&events);
    assert_eq!(send(publish, "pub-b").await.0, 200);
    assert_eq!(rx.next().await.json()[0]["id"], "e1");
    let publish = t.client.post(t.url("/topics/t1/events")).json(&events);
    assert_eq!(send(publish, "unknown").await.0, 401);
}

/// With `inbound__clientAuth__clientCert__adminIdentities` set, only a certificate whose chain
/// was verified (against the IoT Edge trust bundle) can carry a listed identity: outside IoT
/// Edge, with `allowUnknownCA=true`, a self-signed certificate naming the listed CN may only
/// publish, like any other accepted certificate (issue 20, High 2; the verified case is
/// `edge::only_verified_certificates_carry_admin_identities`).
#[tokio::test]
async fn a_self_signed_certificate_naming_an_admin_identity_may_only_publish() {
    let t = start(&[
        ("inbound__clientAuth__clientCert__enabled", "true"),
        (
            "inbound__clientAuth__clientCert__adminIdentities",
            "opsmodule",
        ),
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", "admin-key"),
    ])
    .await;
    let https = t.https_base.clone().unwrap();
    let client_as = |cn: &str| {
        let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = format!("{}{}", cert.pem(), key.serialize_pem());
        reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap())
            .build()
            .unwrap()
    };
    let (forged, sensor) = (client_as("opsmodule"), client_as("sensor"));
    let topic = format!("{https}/topics/t1?{V}");
    for c in [&forged, &sensor] {
        let r = c.put(&topic).json(&json!({})).send().await.unwrap();
        assert_eq!(
            r.status(),
            403,
            "an unverified certificate is not an identity"
        );
    }
    let r = t
        .client
        .put(t.url("/topics/t1"))
        .header("aeg-sas-key", "admin-key");
    assert_eq!(r.json(&json!({})).send().await.unwrap().status(), 200);
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    let publish = format!("{https}/topics/t1/events?{V}");
    for c in [&forged, &sensor] {
        let r = c.post(&publish).json(&events).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    // No certificate at all: 401, as before.
    let r = t.client.post(&publish).json(&events).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

/// Open `n` TCP connections to `addr` that never send a byte.
async fn idle_sockets(addr: std::net::SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    v
}

/// Whether the server has closed `s` (a read returns end-of-file at once).
async fn closed_by_server(s: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(std::time::Duration::from_millis(50), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// 3,000 idle sockets (never sending a byte) against the default cap of 1,024 connections and a
/// 1 s idle timeout: the server closes them, and meanwhile publishing, delivery and `/healthz`
/// on fresh connections go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_sockets_leave_publishing_and_health_alone() {
    let t = start(&[("inbound__idleTimeoutInSeconds", "1")]).await;
    let mut rx = Receiver::start().await;
    t.topic("t").await;
    t.webhook_sub("t", "s", &rx.url("/s"), json!({})).await;
    let addr = t.g.http_addr.unwrap();
    let mut idle = idle_sockets(addr, 3_000).await;
    // Fresh connections for every request, as a health probe or a new publisher would make.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for i in 0..3 {
        let r = tokio::time::timeout(WAIT, fresh.get(format!("{}/healthz", t.base)).send())
            .await
            .expect("/healthz answers within the wait")
            .unwrap();
        assert_eq!(r.status(), 200);
        let events = json!([eg_event(&format!("e{i}"), "s", "t", json!({}))]);
        let r = tokio::time::timeout(
            WAIT,
            fresh.post(t.url("/topics/t/events")).json(&events).send(),
        )
        .await
        .expect("a publish is answered within the wait")
        .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(rx.next().await.json()[0]["id"], format!("e{i}"));
    }
    // The idle ones were closed by the server, not left to pile up.
    let mut still_open = 0;
    for s in idle.iter_mut().take(1_024) {
        if !closed_by_server(s).await {
            still_open += 1;
        }
    }
    assert_eq!(still_open, 0, "the first 1,024 idle sockets are closed");
}

/// `inbound__maxConnections`: at the cap a new connection is served at once, in the place of
/// the least recently used connection with no request in progress (closed for it), well before
/// the idle timeout.
#[tokio::test]
async fn at_the_cap_the_oldest_idle_connection_makes_room() {
    let t = start(&[
        ("inbound__maxConnections", "2"),
        ("inbound__idleTimeoutInSeconds", "60"),
    ])
    .await;
    let mut idle = idle_sockets(t.g.http_addr.unwrap(), 2).await;
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        t.client.get(format!("{}/healthz", t.base)).send(),
    )
    .await
    .expect("served within 2 s, not at the idle timeout")
    .unwrap();
    assert_eq!(r.status(), 200);
    assert!(closed_by_server(&mut idle[0]).await, "the oldest made room");
}

/// A client that sends its headers and then trickles (here: stops sending) its body gets 408 at
/// `inbound__requestBodyTimeoutInSeconds` and the connection ends.
#[tokio::test]
async fn a_slow_body_is_cut_at_the_body_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = start(&[("inbound__requestBodyTimeoutInSeconds", "1")]).await;
    t.topic("t").await;
    let mut s = tokio::net::TcpStream::connect(t.g.http_addr.unwrap())
        .await
        .unwrap();
    let head = format!(
        "POST /topics/t/events?{V} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[{{\"id\":"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut response))
        .await
        .expect("the server answers and closes within the wait")
        .unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("RequestTimeout"), "{text}");
}

/// A client that pipelines requests and never reads the responses: once its socket accepts
/// nothing more for `inbound__responseWriteTimeoutInSeconds`, gridlet drops the connection (the
/// client's next writes fail) instead of holding it forever.
#[tokio::test]
async fn a_client_that_never_reads_is_dropped_at_the_write_timeout() {
    use tokio::io::AsyncWriteExt;
    let t = start(&[
        ("inbound__responseWriteTimeoutInSeconds", "1"),
        ("inbound__idleTimeoutInSeconds", "60"),
    ])
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(t.g.http_addr.unwrap()).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1_000);
    let writer = async {
        loop {
            if let Err(e) = s.write_all(&request).await {
                return e;
            }
        }
    };
    let e = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the server drops the connection within the wait");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{e}"
    );
}
