//! IoT Edge module tests against real peers on loopback: a Unix-socket workload API speaking the
//! edgelet routes with certificates made here (rcgen), Mosquitto standing in for edgeHub (TLS
//! listener with a test CA), HTTPS receivers for Event Grid and client-certificate checks.
//!
//! Mosquitto comes from Debian (`apt-get install -y mosquitto`); these tests fail with that hint
//! when it is missing.

use crate::mosquitto::{Mosquitto, Options, TlsListener};
use crate::util::free_port;
use crate::util::*;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use bytes::Bytes;
use gridlet::edge::workload::format_rfc3339;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path as FsPath;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

const HUB: &str = "testhub.azure-devices.net";
const DEVICE: &str = "edge-dev-1";
const MODULE: &str = "gridlet";
const SIGNING_KEY: &[u8] = b"module-primary-key-for-tests-000";

// ---------------------------------------------------------------- test PKI

/// A test CA issuing server and client certificates.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// An issued certificate: PEM chain, PEM key, leaf DER.
pub(crate) struct Issued {
    pub(crate) chain_pem: String,
    pub(crate) key_pem: String,
    der: Vec<u8>,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "gridlet test edge CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    pub(crate) fn issue(&self, cn: &str, sans: &[&str], client: bool) -> Issued {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            chain_pem: format!("{}{}", cert.pem(), self.ca_pem),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    fn roots(&self) -> rustls::RootCertStore {
        gridlet::tls::root_store(self.ca_pem.as_bytes()).unwrap()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

// ---------------------------------------------------------------- workload API

#[derive(Default)]
struct WorkloadLog {
    server_common_names: Vec<String>,
    server_certs: Vec<Vec<u8>>,
    identity_certs: Vec<Vec<u8>>,
    signed: Vec<String>,
    missing_api_version: usize,
}

#[derive(Clone)]
struct WorkloadState {
    pki: Arc<Pki>,
    server_lifetime_secs: u64,
    log: Arc<Mutex<WorkloadLog>>,
}

/// A real HTTP server on a Unix socket, speaking the edgelet workload routes.
struct Workload {
    uri: String,
    log: Arc<Mutex<WorkloadLog>>,
    _task: tokio::task::JoinHandle<()>,
}

fn check_version(q: &HashMap<String, String>, s: &WorkloadState) {
    if !q.contains_key("api-version") {
        s.log.lock().unwrap().missing_api_version += 1;
    }
}

fn cert_response(c: &Issued, lifetime: u64) -> (StatusCode, Json<Value>) {
    (
        StatusCode::CREATED,
        Json(json!({
            "certificate": c.chain_pem,
            "privateKey": {"type": "key", "bytes": c.key_pem},
            "expiration": format_rfc3339(now_secs() + lifetime),
        })),
    )
}

async fn wl_trust_bundle(
    State(s): State<WorkloadState>,
    Query(q): Query<HashMap<String, String>>,
) -> Json<Value> {
    check_version(&q, &s);
    Json(json!({ "certificate": s.pki.ca_pem }))
}

async fn wl_server_cert(
    State(s): State<WorkloadState>,
    Path((module, _gen)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    check_version(&q, &s);
    assert_eq!(module, MODULE);
    let cn = body["commonName"].as_str().unwrap_or_default().to_string();
    let c = s.pki.issue(&cn, &[&cn, MODULE, "localhost"], false);
    {
        let mut log = s.log.lock().unwrap();
        log.server_common_names.push(cn);
        log.server_certs.push(c.der.clone());
    }
    cert_response(&c, s.server_lifetime_secs)
}

async fn wl_identity_cert(
    State(s): State<WorkloadState>,
    Path(module): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> (StatusCode, Json<Value>) {
    check_version(&q, &s);
    let c = s.pki.issue(&module, &[&module], true);
    s.log.lock().unwrap().identity_certs.push(c.der.clone());
    cert_response(&c, 7 * 86_400)
}

async fn wl_sign(
    State(s): State<WorkloadState>,
    Path((module, gen)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    check_version(&q, &s);
    assert_eq!((module.as_str(), gen.as_str()), (MODULE, "gen-1"));
    assert_eq!(body["keyId"], "primary");
    assert_eq!(body["algo"], "HMACSHA256");
    let b64 = base64::engine::general_purpose::STANDARD;
    let data = b64.decode(body["data"].as_str().unwrap()).unwrap();
    s.log
        .lock()
        .unwrap()
        .signed
        .push(String::from_utf8(data.clone()).unwrap());
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SIGNING_KEY);
    let digest = ring::hmac::sign(&key, &data);
    (
        StatusCode::OK,
        Json(json!({ "digest": b64.encode(digest.as_ref()) })),
    )
}

impl Workload {
    async fn start(dir: &FsPath, pki: Arc<Pki>, server_lifetime_secs: u64) -> Self {
        let sock = dir.join("workload.sock");
        let log = Arc::new(Mutex::new(WorkloadLog::default()));
        let state = WorkloadState {
            pki,
            server_lifetime_secs,
            log: log.clone(),
        };
        let app = Router::new()
            .route("/trust-bundle", get(wl_trust_bundle))
            .route(
                "/modules/{module}/genid/{gen}/certificate/server",
                post(wl_server_cert),
            )
            .route(
                "/modules/{module}/certificate/identity",
                post(wl_identity_cert),
            )
            .route("/modules/{module}/genid/{gen}/sign", post(wl_sign))
            .with_state(state);
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            uri: format!("unix://{}", sock.display()),
            log,
            _task: task,
        }
    }

    /// The `IOTEDGE_*` variables edgeAgent would give the module.
    fn env(&self, gateway: Option<&str>) -> Vec<(String, String)> {
        let mut v = vec![
            ("IOTEDGE_WORKLOADURI".to_string(), self.uri.clone()),
            ("IOTEDGE_MODULEGENERATIONID".into(), "gen-1".into()),
            ("IOTEDGE_MODULEID".into(), MODULE.into()),
            ("IOTEDGE_DEVICEID".into(), DEVICE.into()),
            ("IOTEDGE_IOTHUBHOSTNAME".into(), HUB.into()),
            ("IOTEDGE_APIVERSION".into(), "2019-01-30".into()),
            ("IOTEDGE_AUTHSCHEME".into(), "sasToken".into()),
        ];
        if let Some(g) = gateway {
            v.push(("IOTEDGE_GATEWAYHOSTNAME".into(), g.into()));
        }
        v
    }
}

async fn start_edge(extra: &[(&str, &str)], env: Vec<(String, String)>) -> TestGridlet {
    let owned: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(env)
        .collect();
    let borrowed: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    start(&borrowed).await
}

// ---------------------------------------------------------------- Mosquitto

/// A Mosquitto broker: a TLS listener (test CA) for gridlet, a plain one for the test's own
/// client. The ACL only lets gridlet's exact IoT Hub username publish, so a wrong username shows
/// up as a missing message.
async fn edgehub_broker(dir: &FsPath, pki: &Pki) -> Mosquitto {
    let server = pki.issue("localhost", &["localhost"], false);
    let username = format!("{HUB}/{DEVICE}/{MODULE}/?api-version=2018-06-30");
    let acl = format!(
        "user {username}\ntopic readwrite devices/{DEVICE}/modules/{MODULE}/#\ntopic readwrite $iothub/#\n\n\
         user observer\ntopic readwrite #\ntopic readwrite $iothub/#\n"
    );
    let opts = Options {
        log_connects: true,
        acl: Some(acl),
        tls: Some(TlsListener {
            ca_pem: pki.ca_pem.clone(),
            chain_pem: server.chain_pem,
            key_pem: server.key_pem,
            require_client_cert: false,
        }),
        ..Options::default()
    };
    Mosquitto::start_opts(dir, opts).await
}

/// The test's own MQTT client on the plain listener: sees gridlet's messages and plays the
/// IoT Hub twin service.
struct Observer {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Publish>,
    _task: tokio::task::JoinHandle<()>,
}

impl Observer {
    async fn connect(port: u16, topics: &[&str]) -> Self {
        let mut opts = MqttOptions::new("observer", "127.0.0.1", port);
        opts.set_credentials("observer", "unused");
        opts.set_keep_alive(Duration::from_secs(5));
        let (client, mut el) = AsyncClient::new(opts, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (sub_tx, mut sub_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = sub_tx.send(());
                    }
                    Ok(_) => {}
                    // Not a wait: the observer's reconnect backoff.
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        for t in topics {
            client.subscribe(*t, QoS::AtLeastOnce).await.unwrap();
        }
        for _ in topics {
            tokio::time::timeout(WAIT, sub_rx.recv())
                .await
                .expect("SUBACK from mosquitto")
                .unwrap();
        }
        Self {
            client,
            rx,
            _task: task,
        }
    }

    /// The next message whose topic starts with `prefix` (others are skipped).
    async fn next_on(&mut self, prefix: &str, m: &Mosquitto) -> Publish {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(p)) if p.topic.starts_with(prefix) => return p,
                Ok(Some(_)) => continue,
                _ => panic!(
                    "no MQTT message on {prefix}* within {WAIT:?}; mosquitto log:\n{}",
                    m.log()
                ),
            }
        }
    }

    async fn publish(&self, topic: String, body: Value) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, body.to_string())
            .await
            .unwrap();
    }
}

fn rid_of(topic: &str) -> String {
    topic
        .split(['?', '&'])
        .find_map(|kv| kv.strip_prefix("$rid="))
        .expect("$rid in the topic")
        .to_string()
}

// ---------------------------------------------------------------- HTTPS receivers

/// One request an HTTPS receiver got.
#[derive(Debug)]
struct TlsReceived {
    path_and_query: String,
    headers: axum::http::HeaderMap,
    body: Bytes,
    client_cert: Option<Vec<u8>>,
}

struct TlsReceiver {
    addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<TlsReceived>,
    _task: tokio::task::JoinHandle<()>,
}

impl TlsReceiver {
    /// Serve HTTPS with `cert`; with `client_roots`, a client certificate from them is required.
    async fn start(cert: &Issued, client_roots: Option<rustls::RootCertStore>) -> Self {
        let provider = gridlet::tls::provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_roots {
            Some(roots) => builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap(),
            ),
            None => builder.with_no_client_auth(),
        };
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap();
        let cfg = builder.with_single_cert(chain, key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let client_cert = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.to_vec());
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let tx = tx.clone();
                            let client_cert = client_cert.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = body.collect().await?.to_bytes();
                                let _ = tx.send(TlsReceived {
                                    path_and_query: parts
                                        .uri
                                        .path_and_query()
                                        .map(|p| p.to_string())
                                        .unwrap_or_default(),
                                    headers: parts.headers,
                                    body,
                                    client_cert,
                                });
                                Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::new())))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            rx,
            _task: task,
        }
    }

    async fn next(&mut self) -> TlsReceived {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a delivery within the wait")
            .expect("receiver open")
    }
}

/// The certificate gridlet's HTTPS listener presents, validated against `roots` for `name`.
async fn served_certificate(addr: SocketAddr, roots: rustls::RootCertStore, name: &str) -> Vec<u8> {
    let cfg = rustls::ClientConfig::builder_with_provider(gridlet::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
        .await
        .expect("the served certificate chains to the IoT Edge trust bundle");
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .expect("a server certificate")
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn https_certificate_comes_from_the_workload_api_and_is_renewed_in_place() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    // Certificates that "expire" after 3 s: renewal is due after 2.4 s.
    let wl = Workload::start(dir.path(), pki.clone(), 3).await;
    let t = start_edge(&[], wl.env(None)).await;
    let addr = t.g.https_addr.expect("HTTPS listens");
    let first = served_certificate(addr, pki.roots(), MODULE).await;
    {
        let log = wl.log.lock().unwrap();
        assert_eq!(log.server_common_names, vec![MODULE.to_string()]);
        assert_eq!(log.server_certs.first(), Some(&first));
        assert_eq!(log.missing_api_version, 0);
    }
    let renewed = eventually("a renewed certificate", || async {
        let now = served_certificate(addr, pki.roots(), MODULE).await;
        if now != first {
            Ok(now)
        } else {
            Err("the first one is served".to_string())
        }
    })
    .await;
    // Same listener, new certificate, and it is the one the workload API issued.
    assert!(wl.log.lock().unwrap().server_certs.contains(&renewed));
    let (s, _) = t.get("/topics").await;
    assert_eq!(s, 200, "the HTTP listener kept serving");
}

/// Issue 20, High 2: with `adminIdentities` set and the default `allowUnknownCA=true`, a
/// listed identity manages only when its certificate chains to the trust bundle; a
/// self-signed certificate naming it may only publish.
#[tokio::test]
async fn only_verified_certificates_carry_admin_identities() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    let t = start_edge(
        &[
            ("inbound__clientAuth__clientCert__enabled", "true"),
            ("inbound__clientAuth__clientCert__adminIdentities", "ops"),
        ],
        wl.env(None),
    )
    .await;
    let https = format!("https://127.0.0.1:{}", t.g.https_addr.unwrap().port());
    let client_with = |chain: String, key: String| {
        let o = gridlet::tls::OutboundTls {
            accept_any_server_cert: true,
            extra_roots_pem: None,
            identity: Some((chain.into_bytes(), key.into_bytes())),
        };
        reqwest::Client::builder()
            .tls_backend_preconfigured(gridlet::tls::client_config(&o).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let ops = pki.issue("ops", &["ops"], true);
    let ops = client_with(ops.chain_pem, ops.key_pem);
    let sensor = pki.issue("sensor", &["sensor"], true);
    let sensor = client_with(sensor.chain_pem, sensor.key_pem);
    let forged = {
        let mut params = CertificateParams::new(vec!["ops".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "ops");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        client_with(cert.pem(), key.serialize_pem())
    };
    let put = |c: &reqwest::Client, name: &str| {
        c.put(format!("{https}/topics/{name}?{V}"))
            .json(&json!({}))
            .send()
    };
    assert_eq!(put(&forged, "x").await.unwrap().status(), 403);
    assert_eq!(put(&sensor, "x").await.unwrap().status(), 403);
    assert_eq!(put(&ops, "x").await.unwrap().status(), 200);
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    for c in [&forged, &sensor, &ops] {
        let r = c
            .post(format!("{https}/topics/x/events?{V}"))
            .json(&events)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "every accepted certificate may publish");
    }
}

/// Issue 37, High 1, under IoT Edge with the shipped certificate settings and no
/// `adminIdentities`: a module's certificate (issued by the trust bundle's CA) manages, a
/// self-signed one with the same CN may only publish (the original made it administrator).
#[tokio::test]
async fn without_admin_identities_only_verified_certificates_manage() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    let t = start_edge(
        &[("inbound__clientAuth__clientCert__enabled", "true")],
        wl.env(None),
    )
    .await;
    let https = format!("https://127.0.0.1:{}", t.g.https_addr.unwrap().port());
    let client_with = |chain: String, key: String| {
        let o = gridlet::tls::OutboundTls {
            accept_any_server_cert: true,
            extra_roots_pem: None,
            identity: Some((chain.into_bytes(), key.into_bytes())),
        };
        reqwest::Client::builder()
            .tls_backend_preconfigured(gridlet::tls::client_config(&o).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let module = pki.issue("ops", &["ops"], true);
    let module = client_with(module.chain_pem, module.key_pem);
    let forged = {
        let mut params = CertificateParams::new(vec!["ops".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "ops");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        client_with(cert.pem(), key.serialize_pem())
    };
    let put = |c: &reqwest::Client| {
        c.put(format!("{https}/topics/x?{V}"))
            .json(&json!({}))
            .send()
    };
    assert_eq!(put(&forged).await.unwrap().status(), 403);
    assert_eq!(put(&module).await.unwrap().status(), 200);
    let events = json!([eg_event("e1", "s", "t", json!({}))]);
    let r = forged
        .post(format!("{https}/topics/x/events?{V}"))
        .json(&events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a self-signed certificate still publishes");
}

#[tokio::test]
async fn client_certificates_are_validated_against_the_trust_bundle() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    let t = start_edge(
        &[
            ("inbound__clientAuth__clientCert__enabled", "true"),
            ("inbound__clientAuth__clientCert__allowUnknownCA", "false"),
            ("inbound__clientAuth__sasKeys__enabled", "true"),
            ("inbound__clientAuth__sasKeys__key1", "sas-key-1"),
        ],
        wl.env(None),
    )
    .await;
    let url = format!(
        "https://127.0.0.1:{}/topics?{V}",
        t.g.https_addr.unwrap().port()
    );
    let client_with = |identity: Option<(Vec<u8>, Vec<u8>)>| {
        let o = gridlet::tls::OutboundTls {
            accept_any_server_cert: true,
            extra_roots_pem: None,
            identity,
        };
        // gridlet's own outbound TLS configuration (identity certificate included), in a
        // general-purpose client.
        reqwest::Client::builder()
            .tls_backend_preconfigured(gridlet::tls::client_config(&o).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let trusted = pki.issue("publisher", &["publisher"], true);
    let c = client_with(Some((
        trusted.chain_pem.clone().into_bytes(),
        trusted.key_pem.clone().into_bytes(),
    )));
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);

    let none = client_with(None);
    assert_eq!(none.get(&url).send().await.unwrap().status(), 401);
    // Either suffices: a SAS key without a certificate.
    let r = none
        .get(&url)
        .header("aeg-sas-key", "sas-key-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A certificate from another CA is refused (at the handshake, or with 401).
    let other = Pki::new().issue("intruder", &["intruder"], true);
    let c = client_with(Some((
        other.chain_pem.into_bytes(),
        other.key_pem.into_bytes(),
    )));
    if let Ok(r) = c.get(&url).send().await {
        assert_eq!(r.status(), 401);
    }
}

#[tokio::test]
async fn webhook_calls_present_the_module_identity_certificate() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    let t = start_edge(
        &[("outbound__clientAuth__clientCert__enabled", "true")],
        wl.env(None),
    )
    .await;
    // The subscriber requires a client certificate issued by the IoT Edge CA. The certificate
    // is a credential, so the subscriber's own certificate must verify, chain and host name,
    // whatever `allowUnknownCA` says (issue 37): one issued by the trust bundle's CA for another
    // name gets nothing, one for the address it is reached at gets the events.
    let other_name = pki.issue("subscriber", &["subscriber"], false);
    let mut wrong = TlsReceiver::start(&other_name, Some(pki.roots())).await;
    let server = pki.issue("subscriber", &["127.0.0.1"], false);
    let mut rx = TlsReceiver::start(&server, Some(pki.roots())).await;
    t.topic("t1").await;
    let wrong_url = format!("https://127.0.0.1:{}/hook", wrong.addr.port());
    t.webhook_sub("t1", "wrong", &wrong_url, json!({})).await;
    let url = format!("https://127.0.0.1:{}/hook", rx.addr.port());
    t.webhook_sub("t1", "s1", &url, json!({})).await;
    t.publish("t1", json!([eg_event("1", "s", "e", json!({}))]))
        .await;
    let labels = "topic=\"t1\",subscription=\"wrong\"";
    t.wait_metric("DeliveryFailureCounts", labels, 1).await;
    assert!(
        wrong.rx.try_recv().is_err(),
        "a host-name mismatch is refused"
    );
    let r = rx.next().await;
    let identity = wl.log.lock().unwrap().identity_certs.clone();
    assert_eq!(identity.len(), 1);
    assert_eq!(r.client_cert.as_ref(), identity.first());
    assert_eq!(
        serde_json::from_slice::<Value>(&r.body).unwrap()[0]["id"],
        "1"
    );
}

#[tokio::test]
async fn eventgrid_destination_posts_batches_with_the_sas_key_and_topic_rewrite() {
    let pki = Pki::new();
    let server = pki.issue(
        "mytopic.westus2-1.eventgrid.azure.net",
        &["localhost"],
        false,
    );
    let mut rx = TlsReceiver::start(&server, None).await;
    // Event Grid keys go only to a verified server: trust the test CA, use the certified name.
    let roots = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(roots.path(), &pki.ca_pem).unwrap();
    let t = start(&[
        ("outbound__eventgrid__allowInvalidHostnames", "true"),
        (
            "outbound__azure__trustedCertificatesFile",
            roots.path().to_str().unwrap(),
        ),
    ])
    .await;
    t.topic("local").await;
    let url = format!(
        "https://localhost:{}/api/events?api-version=2018-01-01",
        rx.addr.port()
    );
    let sub = |topic_name: Value| {
        json!({"properties": {"destination": {"endpointType": "EventGrid", "properties": {
            "endpointUrl": url, "sasKey": "cloud-sas-key", "topicName": topic_name,
            "maxEventsPerBatch": 5}}}})
    };
    let (s, b) = t
        .put(
            "/topics/local/eventSubscriptions/cloud",
            sub(json!("cloudTopic")),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["properties"]["destination"]["endpointType"], "EventGrid");
    let events: Vec<Value> = (1..=3)
        .map(|i| eg_event(&i.to_string(), "s", "e", json!({"i": i})))
        .collect();
    t.publish("local", Value::Array(events)).await;
    let r = rx.next().await;
    assert_eq!(r.path_and_query, "/api/events?api-version=2018-01-01");
    assert_eq!(r.headers["aeg-sas-key"], "cloud-sas-key");
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    let arr = body.as_array().expect("a JSON array");
    assert_eq!(arr.len(), 3, "one batch of three: {body}");
    for e in arr {
        assert_eq!(e["topic"], "cloudTopic");
    }

    // Without topicName the topic is nulled before forwarding.
    let (s, b) = t
        .put("/topics/local/eventSubscriptions/cloud", sub(Value::Null))
        .await;
    assert_eq!(s, 200, "{b}");
    t.publish("local", json!([eg_event("4", "s", "e", json!({}))]))
        .await;
    let r = rx.next().await;
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(body[0]["topic"].is_null(), "{body}");

    // Hosts outside Azure's Event Grid domains are refused without the setting.
    let strict = start(&[]).await;
    strict.topic("local").await;
    let (s, b) = strict
        .put("/topics/local/eventSubscriptions/cloud", sub(json!("x")))
        .await;
    assert_eq!(s, 400, "{b}");
}

#[tokio::test]
async fn edgehub_output_and_module_twin_round_trip_through_mosquitto() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let mosq = edgehub_broker(dir.path(), &pki).await;
    let mut obs = Observer::connect(
        mosq.port,
        &[
            "devices/#",
            "$iothub/twin/GET/#",
            "$iothub/twin/PATCH/properties/reported/#",
        ],
    )
    .await;
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    let gateway = format!("localhost:{}", mosq.tls_port());
    let t = start_edge(&[], wl.env(Some(&gateway))).await;

    // 1. gridlet asks for its twin; the "twin service" answers with desired properties.
    let get = obs.next_on("$iothub/twin/GET/", &mosq).await;
    let rid = rid_of(&get.topic);
    let twin = json!({
        "desired": {
            "topics": {
                "twinTopic1": {},
                "twinTopic2": {"inputSchema": "customEventSchema"},
                "badTopic": {"inputSchema": "noSuchSchema"}
            },
            "eventSubscriptions": {
                "edgeSub": {
                    "topic": "twinTopic1",
                    "destination": {"endpointType": "EdgeHub", "properties": {"outputName": "out1"}},
                    "filter": {"includedEventTypes": "[\"et1\"]"}
                },
                "badSub": {
                    "topic": "twinTopic1",
                    "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": "ftp://nowhere"}}
                }
            },
            "$version": 1
        },
        "reported": {"topics": {"staleTopic": {"inputSchema": "EventGridSchema"}}, "$version": 1}
    });
    obs.publish(format!("$iothub/twin/res/200/?$rid={rid}"), twin)
        .await;

    // 2. Reported properties: state, arrays as strings, errors in the original's words.
    let rep = obs
        .next_on("$iothub/twin/PATCH/properties/reported/", &mosq)
        .await;
    let rep: Value = serde_json::from_slice(&rep.payload).unwrap();
    assert_eq!(
        rep["topics"]["twinTopic1"]["inputSchema"],
        "EventGridSchema"
    );
    assert_eq!(
        rep["topics"]["twinTopic2"]["inputSchema"],
        "CustomEventSchema"
    );
    assert!(rep["topics"]["staleTopic"].is_null(), "{rep}");
    assert!(rep["topics"].get("badTopic").is_none());
    assert_eq!(
        rep["eventSubscriptions"]["edgeSub"]["filter"]["includedEventTypes"],
        "[\"et1\"]"
    );
    let topic_err = rep["errors"]["topics"]["badTopic"].as_str().unwrap();
    assert!(
        topic_err.starts_with("HttpStatusCode='BadRequest' ErrorCode='InvalidSchema'"),
        "{topic_err}"
    );
    let sub_err = rep["errors"]["eventSubscriptions"]["badSub"]
        .as_str()
        .unwrap();
    assert!(
        sub_err.contains("ErrorCode='InvalidDestination'"),
        "{sub_err}"
    );
    let (s, b) = t.get("/topics/twinTopic1/eventSubscriptions/edgeSub").await;
    assert_eq!(s, 200, "{b}");

    // 3. Events matching the twin subscription go to edgeHub output `out1`, QoS 1.
    t.publish(
        "twinTopic1",
        json!([
            eg_event("ev-1", "s", "et1", json!({"n": 1})),
            eg_event("ev-2", "s", "et2", json!({"n": 2}))
        ]),
    )
    .await;
    let msg = obs.next_on("devices/", &mosq).await;
    assert_eq!(
        msg.topic,
        format!(
            "devices/{DEVICE}/modules/{MODULE}/messages/events/%24.on=out1&%24.ct=application%2Fjson&%24.ce=utf-8"
        )
    );
    assert_eq!(msg.qos, QoS::AtLeastOnce);
    let body: Value = serde_json::from_slice(&msg.payload).unwrap();
    let arr = body.as_array().expect("a JSON array, as webhooks get");
    assert_eq!(arr.len(), 1, "{body}");
    assert_eq!(arr[0]["id"], "ev-1");
    assert_eq!(arr[0]["topic"], "twinTopic1");
    // Delivered = PUBACK from the broker.
    t.wait_metric(
        "DeliverySuccessCounts",
        "topic=\"twinTopic1\",subscription=\"edgeSub\"",
        1,
    )
    .await;

    // 4. A desired patch deletes a topic; the reported patch says so.
    obs.publish(
        "$iothub/twin/PATCH/properties/desired/?$version=2".to_string(),
        json!({"topics": {"twinTopic2": null}, "$version": 2}),
    )
    .await;
    let rep = obs
        .next_on("$iothub/twin/PATCH/properties/reported/", &mosq)
        .await;
    let rep: Value = serde_json::from_slice(&rep.payload).unwrap();
    assert_eq!(rep, json!({"topics": {"twinTopic2": null}}));
    let (s, _) = t.get("/topics/twinTopic2").await;
    assert_eq!(s, 404);

    // 5. MQTT connections and routes from the twin, through the management API's code: a
    //    message on this Mosquitto's `plant/#` becomes an event on a twin-made topic, delivered
    //    to edgeHub output `out2`. The password is never reported; a bad route is an error.
    let secret = "twin-mqtt-password-77";
    obs.publish(
        "$iothub/twin/PATCH/properties/desired/?$version=3".to_string(),
        json!({
            "topics": {"mqttIn": {"inputSchema": "CloudEventSchemaV1_0"}},
            "eventSubscriptions": {"mqttSub": {
                "topic": "mqttIn",
                "destination": {"endpointType": "EdgeHub", "properties": {"outputName": "out2"}}
            }},
            "mqtt": {
                "connections": {"site": {
                    "url": format!("mqtt://127.0.0.1:{}", mosq.port),
                    "clientId": "gridlet-twin-source", "username": "observer", "password": secret
                }},
                "routes": {
                    "temps": {"connection": "site", "topicFilter": "plant/#", "topic": "mqttIn"},
                    "badRoute": {"connection": "site", "topicFilter": "x/#", "topic": "noSuchTopic"}
                }
            },
            "$version": 3
        }),
    )
    .await;
    let rep = obs
        .next_on("$iothub/twin/PATCH/properties/reported/", &mosq)
        .await;
    let rep: Value = serde_json::from_slice(&rep.payload).unwrap();
    assert!(!rep.to_string().contains(secret), "{rep}");
    let site = &rep["mqtt"]["connections"]["site"];
    assert_eq!(site["managedBy"], "api", "{rep}");
    assert_eq!(site["username"], "observer", "{rep}");
    assert!(site["password"].is_null(), "{rep}");
    assert_eq!(rep["mqtt"]["routes"]["temps"]["topic"], "mqttIn", "{rep}");
    let route_err = rep["errors"]["mqtt"]["routes"]["badRoute"]
        .as_str()
        .unwrap_or_default();
    assert!(
        route_err.starts_with("HttpStatusCode='BadRequest' ErrorCode='InvalidMqttRoute'")
            && route_err.contains("noSuchTopic"),
        "{rep}"
    );
    let (s, c) = t.get("/mqtt/connections/site").await;
    assert_eq!(s, 200, "{c}");
    assert!(!c.to_string().contains(secret), "{c}");
    t.wait_metric("gridlet_mqtt_connected", "connection=\"site\"", 1)
        .await;
    obs.publish("plant/line1/temp".to_string(), json!({"t": 21.5}))
        .await;
    let msg = obs.next_on("devices/", &mosq).await;
    assert!(msg.topic.contains("%24.on=out2"), "{}", msg.topic);
    let body = String::from_utf8_lossy(&msg.payload);
    assert!(
        body.contains("plant/line1/temp") && body.contains("MQTT.EventPublished"),
        "{body}"
    );

    // `null` deletes: the route, then its connection; the reported patch says so.
    obs.publish(
        "$iothub/twin/PATCH/properties/desired/?$version=4".to_string(),
        json!({"mqtt": {"connections": {"site": null}, "routes": {"temps": null}}, "$version": 4}),
    )
    .await;
    let rep = obs
        .next_on("$iothub/twin/PATCH/properties/reported/", &mosq)
        .await;
    let rep: Value = serde_json::from_slice(&rep.payload).unwrap();
    assert_eq!(
        rep,
        json!({"mqtt": {"connections": {"site": null}, "routes": {"temps": null}}})
    );
    let (s, _) = t.get("/mqtt/connections/site").await;
    assert_eq!(s, 404);

    // 6. The MQTT password was a SAS token over exactly this resource, signed by the workload API.
    let signed = wl.log.lock().unwrap().signed.clone();
    let first = signed.first().expect("a sign call");
    let (resource, expiry) = first.split_once('\n').unwrap();
    assert_eq!(
        resource,
        "testhub.azure-devices.net%2Fdevices%2Fedge-dev-1%2Fmodules%2Fgridlet"
    );
    let expiry: u64 = expiry.parse().unwrap();
    assert!(expiry > now_secs() + 3000 && expiry <= now_secs() + 3600);
}

#[tokio::test]
async fn edgehub_failures_follow_the_retry_rules() {
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    // Nothing listens where edgeHub should be.
    let gateway = format!("localhost:{}", free_port());
    let t = start_edge(&[], wl.env(Some(&gateway))).await;
    t.topic("t1").await;
    let (s, b) = t
        .put(
            "/topics/t1/eventSubscriptions/toHub",
            json!({"properties": {"destination": {"endpointType": "EdgeHub",
                "properties": {"outputName": "out1"}}}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    t.publish("t1", json!([eg_event("1", "s", "e", json!({}))]))
        .await;
    let labels = "topic=\"t1\",subscription=\"toHub\"";
    t.wait_metric("DeliveryFailureCounts", labels, 1).await;
    // Not dropped: the event waits in the retry queue (first retry after one minute).
    let text = t.metrics().await;
    assert_eq!(metric(&text, "gridlet_pending_events", labels), Some(1));
    assert_eq!(metric(&text, "DeliverySuccessCounts", labels), Some(0));
}

#[tokio::test]
async fn edgehub_connection_renews_its_sas_token_before_expiry() {
    use gridlet::edge::edgehub::{output_topic, EdgeHub, HubSettings};
    use gridlet::edge::workload::{ModuleIdentity, WorkloadClient};
    let pki = Arc::new(Pki::new());
    let dir = tempfile::tempdir().unwrap();
    let mosq = edgehub_broker(dir.path(), &pki).await;
    let wl = Workload::start(dir.path(), pki.clone(), 90 * 86_400).await;
    let workload = WorkloadClient::new(
        &wl.uri,
        ModuleIdentity {
            module_id: MODULE.into(),
            generation_id: "gen-1".into(),
            api_version: "2019-01-30".into(),
        },
    )
    .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(gridlet::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    // Tokens live 10 s: renewal (a new token and a new connection) is due after about 8 s.
    let settings = HubSettings {
        host: "localhost".into(),
        port: mosq.tls_port(),
        hub_hostname: HUB.into(),
        device_id: DEVICE.into(),
        module_id: MODULE.into(),
        tls: Some(Arc::new(tls)),
        token_ttl: Duration::from_secs(10),
    };
    let (hub, conn, _twin) = EdgeHub::new(settings, workload, gridlet::clock::Clock::system());
    let _task = gridlet::sync::AbortOnDrop(tokio::spawn(conn.run()));
    let topic = output_topic(DEVICE, MODULE, "o");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut acked_after_renewal = 0;
    while acked_after_renewal < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no acknowledged publish after a token renewal; mosquitto log:\n{}",
            mosq.log()
        );
        // Renewed: a second token signed, and the connection made again with it. (The signing
        // alone comes before the old connection is closed: a publish acknowledged on it then
        // would count, and the check of the new connection below could come too early.)
        let renewed = wl.log.lock().unwrap().signed.len() >= 2
            && mosq.log().matches("New client connected").count() >= 2;
        let rx = hub
            .publish(topic.clone(), Bytes::from_static(b"[]"), QoS::AtLeastOnce)
            .unwrap();
        let acked = matches!(
            tokio::time::timeout(Duration::from_secs(5), rx).await,
            Ok(Ok(Ok(())))
        );
        if acked && renewed {
            acked_after_renewal += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await; // the publish cadence across renewals
    }
    let signed = wl.log.lock().unwrap().signed.clone();
    let expiries: Vec<&str> = signed.iter().filter_map(|s| s.split('\n').nth(1)).collect();
    assert!(expiries.len() >= 2);
    assert_ne!(
        expiries.first(),
        expiries.last(),
        "a fresh token, not the old one"
    );
    assert!(
        mosq.log().matches("New client connected").count() >= 2,
        "{}",
        mosq.log()
    );
}
