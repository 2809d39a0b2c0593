//! The bounds on MQTT connections and routes made through the management API
//! (`mqtt__maxConnections`, `mqtt__maxRoutes`) and the address rule they meet
//! (`outbound__deniedAddressRanges`), and the settings' precedence over stored ones, docs/MQTT.md.

use crate::mosquitto::Mosquitto;
use crate::util::*;
use serde_json::json;

/// `mqtt__maxConnections` and `mqtt__maxRoutes` bound what the API makes, settings and API
/// together: a new one past the bound is a 400 naming the setting, a replacement at the bound is
/// not; settings past it stop the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_and_routes_are_bounded_by_their_settings() {
    let g = start(&[("mqtt__maxConnections", "2"), ("mqtt__maxRoutes", "1")]).await;
    g.topic("t").await;
    let conn = |port: u16| json!({"properties": {"url": format!("mqtt://127.0.0.1:{port}")}});
    assert_eq!(g.put("/mqtt/connections/c1", conn(9)).await.0, 200);
    assert_eq!(g.put("/mqtt/connections/c2", conn(9)).await.0, 200);
    let (s, b) = g.put("/mqtt/connections/c3", conn(9)).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["details"]["code"], "LimitExceeded", "{b}");
    assert!(b.to_string().contains("mqtt__maxConnections"), "{b}");
    assert_eq!(
        g.put("/mqtt/connections/c2", conn(10)).await.0,
        200,
        "a replacement"
    );
    let route = json!({"properties": {"connection": "c1", "topicFilter": "a/#", "topic": "t"}});
    assert_eq!(g.put("/mqtt/routes/r1", route.clone()).await.0, 200);
    let (s, b) = g.put("/mqtt/routes/r2", route.clone()).await;
    assert_eq!(s, 400, "{b}");
    assert!(b.to_string().contains("mqtt__maxRoutes"), "{b}");
    assert_eq!(
        g.put("/mqtt/routes/r1", route).await.0,
        200,
        "a replacement"
    );
    assert_eq!(g.delete("/mqtt/connections/c2").await.0, 200);
    assert_eq!(g.put("/mqtt/connections/c3", conn(9)).await.0, 200);

    let mut env = base_env(g.dir.path());
    env.extend(
        [
            ("mqtt__maxConnections", "1"),
            ("mqtt__connections__a__url", "mqtt://127.0.0.1:9"),
            ("mqtt__connections__b__url", "mqtt://127.0.0.1:9"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let cfg = gridlet::Config::from_vars(env).unwrap();
    let e = gridlet::ingress::plan(&cfg).unwrap_err();
    assert_eq!(e.key, "mqtt__maxConnections", "{e}");
}

/// A connection made through the API meets the destinations' address rule: a host name that
/// resolves into `outbound__deniedAddressRanges` is never dialled (checked before every
/// connect), and its status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_connection_resolving_into_a_denied_range_is_never_dialled() {
    let mdir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(mdir.path()).await;
    let g = start(&[("outbound__deniedAddressRanges", "127.0.0.0/8")]).await;
    let body = json!({"properties": {"url": format!("mqtt://localhost:{}", m.port)}});
    let (s, b) = g.put("/mqtt/connections/local", body).await;
    assert_eq!(s, 200, "{b}");
    let status = eventually("the connection refused", || async {
        let (_, c) = g.get("/mqtt/connections/local").await;
        let st = c["properties"]["status"].clone();
        match st["connectionErrors"].as_u64() {
            Some(n) if n >= 1 => Ok(st),
            _ => Err(c.to_string()),
        }
    })
    .await;
    assert_eq!(status["connected"], false, "{status}");
    let why = status["lastError"].as_str().unwrap_or_default();
    assert!(
        why.contains("denied range 127.0.0.0/8") && why.contains("outbound__deniedAddressRanges"),
        "{status}"
    );
}

/// Settings win over what the API stored: a stored connection whose name a setting takes after
/// a restart is not used (the setting's is, read-only), and comes back once the setting is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_of_the_same_name_shadows_a_stored_connection() {
    let mdir = tempfile::tempdir().unwrap();
    let m = Mosquitto::start(mdir.path()).await;
    let g = start(&[]).await;
    g.topic("t").await;
    let api = json!({"properties": {"url": "mqtt://127.0.0.1:9", "clientId": "from-api"}});
    assert_eq!(g.put("/mqtt/connections/local", api).await.0, 200);
    let TestGridlet {
        g: running, dir, ..
    } = g;
    running.shutdown().await;

    let env = crate::mqtt_source::source_env(&m, "a/#", "t");
    let g = start_in(
        dir,
        &crate::mqtt_source::refs(&env),
        gridlet::Parts::default(),
    )
    .await;
    let (_, c) = g.get("/mqtt/connections/local").await;
    assert_eq!(c["properties"]["managedBy"], "settings", "{c}");
    assert_eq!(c["properties"]["clientId"], "gridlet-test", "{c}");
    g.wait_metric("gridlet_mqtt_connected", "connection=\"local\"", 1)
        .await;
    let TestGridlet {
        g: running, dir, ..
    } = g;
    running.shutdown().await;

    let g = start_in(dir, &[], gridlet::Parts::default()).await;
    let (_, c) = g.get("/mqtt/connections/local").await;
    assert_eq!(c["properties"]["managedBy"], "api", "{c}");
    assert_eq!(c["properties"]["clientId"], "from-api", "{c}");
}
