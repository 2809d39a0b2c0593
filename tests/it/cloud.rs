//! The cloud tier (issue 34, part A): an `EventGrid` destination whose `endpointUrl` is a
//! namespace topic's `:publish` sends CloudEvents batches with `Authorization:
//! SharedAccessKey`, converts EventGridSchema events, splits what the namespace finds too
//! large, dead-letters a 410 at once and backs off on a quota. Against the strict namespace
//! peer (`ns_peer.rs`) and against a second gridlet serving `:publish`.

use crate::azure::{dead_letters, sub};
use crate::ns_peer::{StrictNamespace, NS_KEY};
use crate::pull::{receive, Ns};
use crate::util::{eg_event, eventually, metric, start};

use serde_json::{json, Value};

fn namespace_dest(url: &str) -> Value {
    json!({"endpointType": "EventGrid", "properties": {"endpointUrl": url, "sasKey": NS_KEY}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_grid_events_reach_a_namespace_topic_as_cloud_events() {
    let mut ns = StrictNamespace::start().await;
    let t = start(&ns.settings()).await;
    t.topic("t").await;
    let (s, b) = sub(
        &t,
        "t",
        "up",
        namespace_dest(&ns.url("cloud")),
        json!({"deliveryPolicy": {"maxEventsPerBatch": 10}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert!(
        b["properties"]["destination"]["properties"]["sasKey"].is_null(),
        "the key is masked: {b}"
    );
    let evs: Vec<Value> = (0..3)
        .map(|i| {
            eg_event(
                &format!("e{i}"),
                "dev/1",
                "Contoso.Reading",
                json!({"i": i}),
            )
        })
        .collect();
    t.publish("t", Value::Array(evs)).await;
    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(ns.next().await);
    }
    let log = ns.log();
    assert!(
        log.iter().all(|l| l.status == 200 && l.topic == "cloud"),
        "{log:?}"
    );
    assert!(log[0]
        .content_type
        .starts_with("application/cloudevents-batch+json"));
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["specversion"], "1.0");
        assert_eq!(e["id"], format!("e{i}"));
        assert_eq!(e["type"], "Contoso.Reading");
        assert_eq!(e["subject"], "dev/1");
        assert_eq!(e["time"], "2017-08-10T21:03:07+00:00");
        assert_eq!(e["data"], json!({"i": i}));
        assert_eq!(e["source"], "t", "the event's topic");
    }

    // A CloudEvents topic's events go as published.
    let (s, b) = t
        .put(
            "/topics/ce",
            json!({"properties": {"inputSchema": "CloudEventSchemaV1_0"}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = sub(&t, "ce", "up", namespace_dest(&ns.url("cloud")), json!({})).await;
    assert_eq!(s, 200, "{b}");
    let ce =
        json!({"specversion": "1.0", "id": "c1", "source": "/plant/7", "type": "x.y", "data": 5});
    let (s, b) = t.post_json("/topics/ce/events", &json!([ce])).await;
    assert_eq!(s, 200, "{b}");
    let got = ns.next().await;
    assert_eq!(got, vec![ce]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_urls_and_credentials_are_checked() {
    let ns = StrictNamespace::start().await;
    let t = start(&ns.settings()).await;
    t.topic("t").await;
    let bad = [
        (
            json!({"endpointUrl": ns.url("cloud").replace("2024-06-01", "2018-01-01"), "sasKey": "k"}),
            "api-version=2024-06-01",
        ),
        (
            json!({"endpointUrl": ns.url("cloud")}),
            "sasKey is required",
        ),
        (
            json!({"endpointUrl": ns.url("cloud"), "sasKey": "k", "sasToken": "r=a&e=1&s=x"}),
            "not both",
        ),
        (
            json!({"endpointUrl": format!("https://localhost:{}/api/events?api-version=2018-01-01", ns.port), "sasToken": "r=a&e=1&s=x"}),
            "sasToken is for namespace topics",
        ),
    ];
    for (props, want) in bad {
        let (s, b) = sub(
            &t,
            "t",
            "x",
            json!({"endpointType": "EventGrid", "properties": props}),
            json!({}),
        )
        .await;
        assert_eq!(s, 400, "{b}");
        assert!(b.to_string().contains(want), "{want}: {b}");
    }
    let (s, b) = sub(
        &t,
        "t",
        "tok",
        json!({"endpointType": "EventGrid", "properties": {"endpointUrl": ns.url("cloud"), "sasToken": "r=a&e=1&s=secret-sig"}}),
        json!({}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert!(b["properties"]["destination"]["properties"]["sasToken"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_splits_gone_dead_letters_and_quota_backs_off() {
    let mut ns = StrictNamespace::start().await;
    // The namespace takes 3,000 bytes a request and 2,000 an event.
    ns.state
        .max_body
        .store(3_000, std::sync::atomic::Ordering::SeqCst);
    ns.state
        .max_event
        .store(2_000, std::sync::atomic::Ordering::SeqCst);
    let t = start(&ns.settings()).await;
    t.topic("t").await;
    let (s, b) = sub(
        &t,
        "t",
        "up",
        namespace_dest(&ns.url("cloud")),
        json!({"deliveryPolicy": {"maxEventsPerBatch": 10}}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let evs: Vec<Value> = (0..10)
        .map(|i| {
            let pad = if i == 4 { 2_500 } else { 100 };
            eg_event(&format!("b{i}"), "s", "t", json!({"pad": "x".repeat(pad)}))
        })
        .collect();
    t.publish("t", Value::Array(evs)).await;
    let dl = dead_letters(&t, "t", "up", 1).await;
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0]["eventId"], "b4");
    assert_eq!(dl[0]["reason"], "DeliveryRefused");
    assert_eq!(dl[0]["deliveryAttempts"], 1);
    let mut ids = Vec::new();
    while ids.len() < 9 {
        ids.extend(
            ns.next()
                .await
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string()),
        );
    }
    ids.sort();
    let want: Vec<String> = (0..10)
        .filter(|i| *i != 4)
        .map(|i| format!("b{i}"))
        .collect();
    assert_eq!(ids, want, "each once, the oversized one never");
    let first = &ns.log()[0];
    assert_eq!(
        (first.status, first.events.len()),
        (403, 10),
        "the whole batch first, refused"
    );

    // A topic the namespace lacks: 410, dead-lettered at the first attempt.
    let (s, b) = sub(
        &t,
        "t",
        "gone",
        namespace_dest(&ns.url("missing")),
        json!({}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // A quota: 403 not about size, retried (no dead letter).
    ns.force(403, "Quota exceeded for this namespace");
    t.publish("t", json!([eg_event("q1", "s", "t", json!({}))]))
        .await;
    let dl = dead_letters(&t, "t", "gone", 1).await;
    assert_eq!(dl[0]["eventId"], "q1");
    assert_eq!(dl[0]["deliveryAttempts"], 1);
    eventually("the quota refusal is a retry", || async {
        let m = t.metrics().await;
        let failed = metric(
            &m,
            "DeliveryFailureCounts",
            "topic=\"t\",subscription=\"up\"",
        )
        .unwrap_or(0);
        if failed >= 1 {
            Ok(())
        } else {
            Err(m)
        }
    })
    .await;
    let (_, b) = t.get("/topics/t/eventSubscriptions/up/deadLetters").await;
    assert_eq!(
        b["value"].as_array().map(Vec::len),
        Some(1),
        "only b4: the quota-refused event waits for its retry: {b}"
    );
}

/// A second gridlet serves `:publish`: the device forwards to it as to a namespace, and a
/// namespaces SDK-style receive there gets the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gridlet_is_the_namespace() {
    let cloud = start(&[
        ("inbound__clientAuth__sasKeys__enabled", "true"),
        ("inbound__clientAuth__sasKeys__key1", NS_KEY),
    ])
    .await;
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("aeg-sas-key", NS_KEY.parse().unwrap());
    let client = reqwest::Client::builder()
        .default_headers(h)
        .build()
        .unwrap();
    for (path, body) in [
        (
            "/topics/cloud",
            json!({"properties":{"inputSchema":"CloudEventSchemaV1_0"}}),
        ),
        (
            "/topics/cloud/eventSubscriptions/s",
            json!({"properties":{"deliveryConfiguration":{"deliveryMode":"Queue"}}}),
        ),
    ] {
        let r = client
            .put(cloud.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let device = start(&[
        ("outbound__eventgrid__httpsOnly", "false"),
        ("outbound__eventgrid__allowInvalidHostnames", "true"),
    ])
    .await;
    device.topic("t").await;
    let url = format!("{}/topics/cloud:publish?api-version=2024-06-01", cloud.base);
    let (s, b) = sub(&device, "t", "up", namespace_dest(&url), json!({})).await;
    assert_eq!(s, 200, "{b}");
    device
        .publish(
            "t",
            json!([
                eg_event("d1", "s", "Contoso.A", json!({"v": 1})),
                eg_event("d2", "s", "Contoso.A", json!({"v": 2}))
            ]),
        )
        .await;
    let ns = Ns {
        base: cloud.base.clone(),
        client,
    };
    let mut got = Vec::new();
    for _ in 0..20 {
        got.extend(receive(&ns, "cloud", "s", 10, 2).await);
        if got.len() >= 2 {
            break;
        }
    }
    let mut ids: Vec<&str> = got.iter().map(|(_, _, id)| id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["d1", "d2"]);
}

/// `outbound__eventgrid__allowInvalidHostnames` lets a namespace URL's host lie outside
/// `eventgrid.azure.*` (a local peer); it never lets gridlet talk to a peer whose certificate
/// does not name that host. A trusted certificate for another name: nothing reaches the peer
/// (the key is never sent), the attempt fails and is retried, the event waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_peer_whose_certificate_names_another_host_is_refused() {
    let ns = StrictNamespace::start_as(&["other.example"]).await;
    // Without allowInvalidHostnames the URL's host is refused at PUT.
    let strict = start(&ns.settings()[..1]).await;
    strict.topic("t").await;
    let (s, b) = sub(
        &strict,
        "t",
        "up",
        namespace_dest(&ns.url("cloud")),
        json!({}),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.to_string().contains("eventgrid.azure"), "{b}");

    let t = start(&ns.settings()).await;
    t.topic("t").await;
    let (s, b) = sub(&t, "t", "up", namespace_dest(&ns.url("cloud")), json!({})).await;
    assert_eq!(s, 200, "{b}");
    t.publish("t", json!([eg_event("e0", "s", "x", json!({}))]))
        .await;
    let labels = r#"topic="t",subscription="up""#;
    eventually("the attempt fails", || async {
        let m = t.metrics().await;
        match metric(&m, "DeliveryFailureCounts", labels) {
            Some(n) if n >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        ns.log().is_empty(),
        "nothing reached the peer: {:?}",
        ns.log()
    );
    let m = t.metrics().await;
    assert_eq!(metric(&m, "DeliverySuccessCounts", labels), Some(0));
    assert_eq!(metric(&m, "gridlet_pending_events", labels), Some(1));
}
