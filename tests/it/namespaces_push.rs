//! Namespace subscriptions in Microsoft's ARM shape, unchanged: push to an Event Hub and dead
//! letters to a Storage Blob container named by `resourceId` (with the managed identity Azure
//! would use), each id resolved through `outbound__resources`. The Event Hub is [`StrictBus`],
//! the storage account Azurite.

use crate::azure::{dead_letters, events, Azurite, StrictBus, BUS_KEY};
use crate::util::{start, Receiver, WAIT};
use serde_json::{json, Value};

const HUB_ID: &str = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/edge/providers/Microsoft.EventHub/namespaces/ns1/eventhubs/hub1";
const ACCOUNT_ID: &str = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/edge/providers/Microsoft.Storage/storageAccounts/letters";

/// `outbound__resources` for these pairs.
fn resources(pairs: &[(&str, String)]) -> String {
    let map: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(id, cs)| (id.to_string(), Value::String(cs.clone())))
        .collect();
    Value::Object(map).to_string()
}

/// A namespace subscription as ARM writes one: push with a system-assigned identity to
/// `destination`, dead letters (when given) to a blob container by resource id.
fn arm_subscription(destination: Value, dead_letter: Option<Value>) -> Value {
    let mut push = json!({
        "maxDeliveryCount": 1,
        "eventTimeToLive": "P1D",
        "deliveryWithResourceIdentity": {
            "identity": {"type": "SystemAssigned"},
            "destination": destination,
        },
    });
    if let Some(dl) = dead_letter {
        push["deadLetterDestinationWithResourceIdentity"] = json!({
            "identity": {"type": "SystemAssigned"},
            "deadLetterDestination": dl,
        });
    }
    json!({"properties": {
        "deliveryConfiguration": {"deliveryMode": "Push", "push": push},
        "filtersConfiguration": {"includedEventTypes": []},
    }})
}

fn event_hub(resource_id: &str) -> Value {
    json!({"endpointType": "EventHub", "properties": {
        "resourceId": resource_id, "deliveryAttributeMappings": []}})
}

fn blob(resource_id: &str, container: &str) -> Value {
    json!({"endpointType": "StorageBlob", "properties": {
        "resourceId": resource_id, "blobContainerName": container}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_to_an_event_hub_by_resource_id_holds_no_secret() {
    let mut bus = StrictBus::start().await;
    let map = resources(&[(HUB_ID, bus.connection_string("hub1", BUS_KEY))]);
    let t = start(&[bus.trust(), ("outbound__resources", &map)]).await;
    t.topic("t").await;
    // ARM spells ids in any case; they match without regard to it.
    let (s, b) = t
        .put(
            "/topics/t/eventSubscriptions/hub",
            arm_subscription(event_hub(&HUB_ID.to_ascii_uppercase()), None),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    t.publish("t", events("h", 2)).await;
    let mut ids = Vec::new();
    while ids.len() < 2 {
        let (entity, evs) = bus.next().await;
        assert_eq!(entity, "hub1");
        ids.extend(evs.iter().map(|e| e["id"].as_str().unwrap().to_string()));
    }
    ids.sort();
    assert_eq!(ids, ["h0", "h1"]);
    // The subscription names the resource; the connection string stays in the settings.
    for b in [b, t.get("/topics/t/eventSubscriptions/hub").await.1] {
        let dest = &b["properties"]["destination"];
        assert_eq!(dest["endpointType"], "EventHub", "{b}");
        assert_eq!(
            dest["properties"]["resourceId"],
            HUB_ID.to_ascii_uppercase(),
            "{b}"
        );
        let text = b.to_string();
        assert!(
            !text.contains("connectionString") && !text.contains(BUS_KEY),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_resource_id_missing_from_the_settings_is_a_400_naming_it() {
    let t = start(&[(
        "outbound__resources",
        &resources(&[(
            HUB_ID,
            "Endpoint=sb://localhost:9/;SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=hub1"
                .into(),
        )]),
    )])
    .await;
    t.topic("t").await;
    let other = HUB_ID.replace("hub1", "hub2");
    let hook =
        json!({"endpointType": "WebHook", "properties": {"endpointUrl": "http://127.0.0.1:9/x"}});
    for (body, id) in [
        (arm_subscription(event_hub(&other), None), other.as_str()),
        (
            arm_subscription(hook, Some(blob(ACCOUNT_ID, "letters"))),
            ACCOUNT_ID,
        ),
    ] {
        let (s, b) = t.put("/topics/t/eventSubscriptions/s", body).await;
        assert_eq!(s, 400, "{b}");
        let text = b.to_string();
        assert!(
            text.contains(id) && text.contains("outbound__resources"),
            "{text}"
        );
    }
    assert_eq!(t.get("/topics/t/eventSubscriptions/s").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_go_to_a_blob_container_named_by_resource_id() {
    let az = Azurite::start().await;
    az.create_container("letters").await;
    let map = resources(&[(ACCOUNT_ID, az.connection_string())]);
    let t = start(&[("outbound__resources", &map)]).await;
    t.topic("t").await;
    let hook = Receiver::start().await;
    hook.respond_with(404);
    // A webhook by `endpointUrl`, Microsoft's shape without an identity.
    let mut body = arm_subscription(json!(null), Some(blob(ACCOUNT_ID, "letters")));
    let push = &mut body["properties"]["deliveryConfiguration"]["push"];
    push.as_object_mut()
        .unwrap()
        .remove("deliveryWithResourceIdentity");
    push["destination"] =
        json!({"endpointType": "WebHook", "properties": {"endpointUrl": hook.url("/h")}});
    let (s, b) = t.put("/topics/t/eventSubscriptions/s", body).await;
    assert_eq!(s, 200, "{b}");
    let dl = &b["properties"]["deadLetterDestination"];
    assert_eq!(dl["properties"]["resourceId"], ACCOUNT_ID, "{b}");
    assert!(!b.to_string().contains("AccountKey"), "{b}");
    t.publish("t", events("d", 1)).await;
    dead_letters(&t, "t", "s", 1).await;
    let names = crate::wait::poll_within(WAIT, || async {
        let names = az.list_blobs("letters").await;
        if names.is_empty() {
            Err(names)
        } else {
            Ok(names)
        }
    })
    .await
    .expect("a dead-letter blob");
    let v: Value = serde_json::from_str(&az.get_blob("letters", &names[0]).await).unwrap();
    assert_eq!(v[0]["id"], "d0", "{v}");
}

#[tokio::test]
async fn namespace_shaped_topics_take_cloudevents_and_bound_event_ttl_by_retention() {
    let t = start(&[]).await;
    // As ARM writes a namespace topic: no inputSchema, CloudEvents is the default.
    let (s, b) = t
        .put(
            "/topics/ns",
            json!({"properties": {"publisherType": "Custom", "eventRetentionInDays": 1}}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["properties"]["inputSchema"], "CloudEventSchemaV1_0",
        "{b}"
    );
    assert_eq!(b["properties"]["eventRetentionInDays"], 1, "{b}");
    let queue = |ttl: &str| {
        json!({"properties": {"deliveryConfiguration": {"deliveryMode": "Queue",
            "queue": {"eventTimeToLive": ttl}}}})
    };
    let (s, b) = t
        .put("/topics/ns/eventSubscriptions/long", queue("P2D"))
        .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.to_string().contains("eventRetentionInDays"), "{b}");
    let (s, b) = t
        .put("/topics/ns/eventSubscriptions/day", queue("PT24H"))
        .await;
    assert_eq!(s, 200, "{b}");
    // The edge module's shape keeps Event Grid's schema.
    let (s, b) = t.put("/topics/edge", json!({"properties": {}})).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["properties"]["inputSchema"], "EventGridSchema", "{b}");
}
