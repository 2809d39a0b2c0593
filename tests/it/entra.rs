//! Microsoft Entra ID access tokens (issue 35, item 5): `Authorization: Bearer <JWT>` over HTTP
//! against a real gridlet. Each test makes a fresh RSA key (the `openssl` CLI), writes the JWKS
//! file gridlet reads, and signs tokens with ring. Covered: a valid sender and receiver, and the
//! refusals: expired, not yet valid, wrong audience, wrong issuer, unknown `kid`, `alg=none`,
//! HS256 signed with the public key (algorithm confusion), a bad signature, a principal with no
//! rights; and that no Entra principal manages.

use crate::pull::NS;
use crate::util::{start, TestGridlet};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::signature::{RsaKeyPair, RsaPublicKeyComponents, RSA_PKCS1_SHA256};
use serde_json::{json, Value};
use std::process::Command;

pub const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
pub const SENDER: &str = "11111111-1111-1111-1111-111111111111";
pub const RECEIVER: &str = "22222222-2222-2222-2222-222222222222";
pub const ADMIN_KEY: &str = "entra-admin-key";

/// A locally made signing key and its JWKS.
pub struct Signer {
    key: RsaKeyPair,
    /// The JWKS document naming this key `kid`.
    pub jwks: Value,
    /// The public key's DER (SubjectPublicKeyInfo), the HMAC secret of the confusion attack.
    pub public_der: Vec<u8>,
}

impl Signer {
    pub fn new(kid: &str) -> Self {
        let run = |args: &[&str], input: Option<&[u8]>| {
            let mut c = Command::new("openssl");
            c.args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null());
            let mut child = c.spawn().expect("openssl runs");
            if let Some(i) = input {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(i).unwrap();
            } else {
                drop(child.stdin.take());
            }
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "openssl {args:?}");
            out.stdout
        };
        // PKCS#1 DER (openssl 3 writes the traditional form for DER).
        let der = run(
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-outform",
                "DER",
            ],
            None,
        );
        let public_der = run(
            &["pkey", "-inform", "DER", "-pubout", "-outform", "DER"],
            Some(&der),
        );
        let key = RsaKeyPair::from_der(&der).unwrap();
        let c = RsaPublicKeyComponents::<Vec<u8>>::from(key.public());
        let jwks = json!({"keys": [
            {"kty": "EC", "kid": "ignored", "crv": "P-256", "x": "AA", "y": "AA"},
            {"kty": "RSA", "use": "sig", "kid": kid, "x5t": kid,
             "n": B64.encode(&c.n), "e": B64.encode(&c.e)},
        ]});
        Self {
            key,
            jwks,
            public_der,
        }
    }

    /// An RS256 token with `header` (alg and kid added when absent) and `claims`.
    pub fn sign(&self, header: Value, claims: &Value) -> String {
        let mut header = header;
        header
            .as_object_mut()
            .unwrap()
            .entry("alg")
            .or_insert(json!("RS256"));
        let signed = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let mut sig = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                signed.as_bytes(),
                &mut sig,
            )
            .unwrap();
        format!("{signed}.{}", B64.encode(sig))
    }
}

/// Claims of a valid token for `oid`, an hour left.
pub fn claims(oid: &str) -> Value {
    let now = gridlet::clock::system_wall_ms() / 1000;
    json!({
        "aud": "https://eventgrid.azure.net",
        "iss": format!("https://sts.windows.net/{TENANT}/"),
        "iat": now - 60, "nbf": now - 60, "exp": now + 3600,
        "tid": TENANT, "oid": oid, "ver": "1.0",
        "roles": ["EventGrid Data Sender"],
    })
}

/// Settings turning Entra tokens on with `signer`'s JWKS (written under `dir`).
pub fn entra_env(signer: &Signer, dir: &std::path::Path) -> Vec<(&'static str, String)> {
    let path = dir.join("jwks.json");
    std::fs::write(&path, signer.jwks.to_string()).unwrap();
    vec![
        ("inbound__clientAuth__entra__enabled", "true".into()),
        ("inbound__clientAuth__entra__tenantId", TENANT.into()),
        (
            "inbound__clientAuth__entra__jwksPath",
            path.display().to_string(),
        ),
        (
            "inbound__clientAuth__entra__senders",
            format!("{TENANT}/{SENDER}"),
        ),
        (
            "inbound__clientAuth__entra__receivers",
            format!("{}/{RECEIVER}", TENANT.to_uppercase()),
        ),
        // The file's keys only: nothing is fetched (`entra_refresh.rs` fetches from a local peer).
        (
            "inbound__clientAuth__entra__jwksRefreshIntervalInSeconds",
            "0".into(),
        ),
        ("inbound__clientAuth__sasKeys__enabled", "true".into()),
        ("inbound__clientAuth__sasKeys__key1", ADMIN_KEY.into()),
    ]
}

async fn gridlet(signer: &Signer) -> TestGridlet {
    let dir = tempfile::tempdir().unwrap();
    let env = entra_env(signer, dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let g = start(&env).await;
    with_queue(g).await
}

/// `g` with the topic `q` and its queue subscription `s`, made with the admin key.
pub async fn with_queue(g: TestGridlet) -> TestGridlet {
    for (path, body) in [
        (
            "/topics/q",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            "/topics/q/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
    ] {
        let r = g
            .client
            .put(g.url(path))
            .header("aeg-sas-key", ADMIN_KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    g
}

/// `(status, error message)` of `method path` with `Authorization: Bearer token`.
pub async fn call(g: &TestGridlet, method: &str, path: &str, token: &str) -> (u16, String) {
    let url = g.url(&format!("{path}?{NS}"));
    let req = match method {
        "GET" => g.client.get(url),
        _ => g.client.post(url),
    };
    let r = req
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/cloudevents-batch+json")
        .body(r#"[{"specversion":"1.0","id":"e1","source":"/t","type":"t"}]"#)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (
        status,
        body["error"]["message"].as_str().unwrap_or("").into(),
    )
}

pub const PUBLISH: &str = "/topics/q:publish";
const RECEIVE: &str = "/topics/q/eventsubscriptions/s:receive";

#[tokio::test]
async fn a_sender_publishes_a_receiver_receives_and_neither_manages() {
    let s = Signer::new("k1");
    let g = gridlet(&s).await;
    let sender = s.sign(json!({"kid": "k1", "typ": "JWT"}), &claims(SENDER));
    let receiver = s.sign(json!({"kid": "k1", "typ": "JWT"}), &claims(RECEIVER));
    assert_eq!(call(&g, "POST", PUBLISH, &sender).await.0, 200);
    let (status, _) = call(&g, "POST", RECEIVE, &receiver).await;
    assert_eq!(status, 200);
    // Each only its own right; neither manages.
    let (status, msg) = call(&g, "POST", RECEIVE, &sender).await;
    assert_eq!(status, 403, "{msg}");
    assert_eq!(call(&g, "POST", PUBLISH, &receiver).await.0, 403);
    for t in [&sender, &receiver] {
        assert_eq!(call(&g, "GET", "/topics", t).await.0, 403);
    }
    // A v2 token (its issuer, an audience array, `x5t` instead of `kid`) is accepted too.
    let mut v2 = claims(SENDER);
    v2["iss"] = json!(format!("https://login.microsoftonline.com/{TENANT}/v2.0"));
    v2["aud"] = json!(["https://eventgrid.azure.net/"]);
    assert_eq!(
        call(&g, "POST", PUBLISH, &s.sign(json!({"x5t": "k1"}), &v2))
            .await
            .0,
        200
    );
    // A valid token for a principal in neither list: 403.
    let nobody = s.sign(
        json!({"kid": "k1"}),
        &claims("33333333-0000-0000-0000-000000000000"),
    );
    let (status, msg) = call(&g, "POST", PUBLISH, &nobody).await;
    assert_eq!(status, 403);
    assert!(msg.contains("neither"), "{msg}");
}

#[tokio::test]
async fn bad_tokens_get_401_naming_the_check() {
    let s = Signer::new("k1");
    let other = Signer::new("k1");
    let g = gridlet(&s).await;
    let now = gridlet::clock::system_wall_ms() / 1000;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims(SENDER);
        f(&mut c);
        s.sign(json!({"kid": "k1"}), &c)
    };
    let unsigned = |alg: &str| {
        format!(
            "{}.{}.",
            B64.encode(json!({"alg": alg, "kid": "k1"}).to_string()),
            B64.encode(claims(SENDER).to_string())
        )
    };
    // HS256 "signed" with the public key as the HMAC secret (algorithm confusion).
    let confused = {
        let signed = format!(
            "{}.{}",
            B64.encode(json!({"alg": "HS256", "kid": "k1"}).to_string()),
            B64.encode(claims(SENDER).to_string())
        );
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &s.public_der);
        let tag = ring::hmac::sign(&k, signed.as_bytes());
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            with(&|c| {
                c["exp"] = json!(now - 301);
                c["nbf"] = json!(now - 4000);
            }),
            "expired",
        ),
        (
            "not yet valid",
            with(&|c| c["nbf"] = json!(now + 301)),
            "not valid yet",
        ),
        (
            "wrong audience",
            with(&|c| c["aud"] = json!("https://storage.azure.com")),
            "audience",
        ),
        (
            "wrong issuer",
            with(&|c| c["iss"] = json!("https://sts.windows.net/another-tenant/")),
            "issuer",
        ),
        (
            "unknown kid",
            s.sign(json!({"kid": "k2"}), &claims(SENDER)),
            "key id k2 is not one of",
        ),
        ("alg none", unsigned("none"), "alg none"),
        (
            "HS256 with the public key",
            confused,
            "alg HS256 is refused",
        ),
        (
            "another key",
            other.sign(json!({"kid": "k1"}), &claims(SENDER)),
            "signature does not verify",
        ),
        ("garbage", "abc".into(), "not a JSON Web Token"),
    ];
    for (what, token, want) in cases {
        let (status, msg) = call(&g, "POST", PUBLISH, &token).await;
        assert_eq!(status, 401, "{what}: {msg}");
        assert!(msg.contains(want), "{what}: {msg}");
        assert!(!msg.contains(&token), "{what}: the token is never echoed");
    }
    // Within the clock skew (300 s by default) a token is still good.
    let late = with(&|c| c["exp"] = json!(now - 200));
    assert_eq!(call(&g, "POST", PUBLISH, &late).await.0, 200);
}

#[tokio::test]
async fn bearer_tokens_are_refused_when_entra_is_off() {
    let g = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", ADMIN_KEY),
    ])
    .await;
    let s = Signer::new("k1");
    let (status, msg) = call(
        &g,
        "POST",
        PUBLISH,
        &s.sign(json!({"kid": "k1"}), &claims(SENDER)),
    )
    .await;
    assert_eq!(status, 401);
    assert!(msg.contains("not enabled"), "{msg}");
}

/// Microsoft's Python SDK, unmodified, with a token credential returning locally signed tokens:
/// publish as the sender, receive and acknowledge as the receiver, each refused the other's
/// right, and an expired token refused. Over https: azure-core sends bearer tokens only there;
/// `REQUESTS_CA_BUNDLE` trusts gridlet's self-signed certificate (what a device would do with
/// its IoT Edge CA).
#[tokio::test]
async fn the_python_sdk_authenticates_with_a_token_credential() {
    let s = Signer::new("k1");
    let g = gridlet(&s).await;
    let now = gridlet::clock::system_wall_ms() / 1000;
    let sign = |c: &Value| s.sign(json!({"kid": "k1", "typ": "JWT"}), c);
    let mut expired = claims(SENDER);
    expired["exp"] = json!(now - 3600);
    let args = [
        g.https_base.clone().expect("https listener"),
        "q".into(),
        "s".into(),
        sign(&claims(SENDER)),
        sign(&claims(RECEIVER)),
        sign(&expired),
    ];
    let ca = g.dir.path().join("metadataDb/tls/server-cert.pem");
    let script = format!("{}/tests/pull/sdk_entra.py", env!("CARGO_MANIFEST_DIR"));
    let program = crate::pull_sdk::python();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&program)
            .arg(&script)
            .args(&args)
            .env("REQUESTS_CA_BUNDLE", ca)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{program} could not run ({e}): run scripts/test.sh once to install the SDKs"
                )
            })
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got["scopes"],
        json!(["https://eventgrid.azure.net/.default"]),
        "{got}"
    );
    assert_eq!(got["received"], json!(["e0", "e1"]), "{got}");
    assert_eq!(got["acknowledged"], 2, "{got}");
    assert_eq!(got["receiver_publishes"], 403, "{got}");
    assert_eq!(got["sender_receives"], 403, "{got}");
    assert_eq!(got["expired_publishes"], 401, "{got}");
}
