//! Each destination type's parsing rules, through the real registry.

use super::DESTINATIONS;
use crate::config::Config;
use crate::model::destination::testing::{cfg, topic};
use crate::model::subscription::Subscription;
use serde_json::{json, Value};

fn put(
    body: Value,
    c: &Config,
) -> Result<Subscription, crate::model::destination::DestinationError> {
    Subscription::from_put(&topic(), "s", body, c, &DESTINATIONS)
}

fn webhook(url: &str) -> Value {
    json!({"properties":{"destination":{"endpointType":"WebHook","properties":{"endpointUrl":url}}}})
}

#[test]
fn webhook_https_only_is_enforced_by_default() {
    let c = cfg(&[]);
    assert!(put(webhook("https://subscriber:4430"), &c).is_ok());
    let e = put(webhook("http://subscriber:8080"), &c).unwrap_err();
    assert_eq!(e.code, "InvalidDestination");
    let c = cfg(&[("outbound__webhook__httpsOnly", "false")]);
    assert!(put(webhook("http://subscriber:8080"), &c).is_ok());
    assert!(put(webhook("/relative"), &c).is_err());
}

#[test]
fn eventgrid_destination_rules() {
    let c = cfg(&[]);
    let eg = |url: &str, key: Option<&str>| json!({"properties":{"destination":{"endpointType":"eventGrid","properties":{"endpointUrl":url,"sasKey":key}}}});
    let good = "https://x.westus2-1.eventgrid.azure.net/api/events?api-version=2018-01-01";
    assert!(put(eg(good, Some("k")), &c).is_ok());
    assert!(put(eg(good, None), &c).is_err());
    for bad in [
        "https://x.eventgrid.azure.net/foo?api-version=2018-01-01",
        "https://x.eventgrid.azure.net/api/events",
        "https://example.com/api/events?api-version=2018-01-01",
        "http://x.eventgrid.azure.net/api/events?api-version=2018-01-01",
    ] {
        let e = put(eg(bad, Some("k")), &c).unwrap_err();
        assert_eq!(e.code, "InvalidDestination", "{bad}");
    }
    let c = cfg(&[("outbound__eventgrid__allowInvalidHostnames", "true")]);
    assert!(put(
        eg(
            "https://example.com/api/events?api-version=2018-01-01",
            Some("k")
        ),
        &c
    )
    .is_ok());
}

#[test]
fn eventgrid_namespace_topics_and_their_credentials() {
    use super::eventgrid::EventGridDestination;
    use super::DestinationKind;
    use crate::model::destination::DestinationSpec;
    let c = cfg(&[]);
    let eg = |props: Value| json!({"properties":{"destination":{"endpointType":"EventGrid","properties":props}}});
    let ns = "https://ns1.westus2-1.eventgrid.azure.net/topics/t1:publish?api-version=2024-06-01";
    let s = put(eg(json!({"endpointUrl": ns, "sasKey": "k"})), &c).unwrap();
    let d = s.destination.spec::<EventGridDestination>().unwrap();
    assert!(d.is_namespace());
    assert!(
        !s.destination.webhook_options(),
        "no webhook options: CloudEvents batches"
    );
    for bad in [
        "https://ns1.westus2-1.eventgrid.azure.net/topics/t1:publish?api-version=2018-01-01",
        "https://ns1.westus2-1.eventgrid.azure.net/topics/a/b:publish?api-version=2024-06-01",
        "https://ns1.westus2-1.eventgrid.azure.net/topics/:publish?api-version=2024-06-01",
        "http://ns1.westus2-1.eventgrid.azure.net/topics/t1:publish?api-version=2024-06-01",
        "https://ns1.example.com/topics/t1:publish?api-version=2024-06-01",
    ] {
        let e = put(eg(json!({"endpointUrl": bad, "sasKey": "k"})), &c).unwrap_err();
        assert_eq!(e.code, "InvalidDestination", "{bad}");
    }
    let older = ns.replace("2024-06-01", "2023-11-01");
    assert!(put(eg(json!({"endpointUrl": older, "sasKey": "k"})), &c).is_ok());
    // A SAS token instead of the key, kept through the metadata record.
    let s = put(
        eg(json!({"endpointUrl": ns, "sasToken": "r=x&e=1&s=sig"})),
        &c,
    )
    .unwrap();
    let props = s.properties()["destination"]["properties"].clone();
    assert_eq!(props["sasToken"], "r=x&e=1&s=sig");
    assert!(props.get("sasKey").is_none());
    let back = super::eventgrid::EventGrid
        .restore(props.as_object().unwrap())
        .unwrap();
    let d = back.spec::<EventGridDestination>().unwrap();
    assert_eq!(d.sas_token.as_deref(), Some("r=x&e=1&s=sig"));
    assert_eq!(d.secrets().len(), 2);
}

#[test]
fn unknown_types_are_refused_with_the_registry_list() {
    let c = cfg(&[]);
    let b = json!({"properties":{"destination":{"endpointType":"Kafka","properties":{}}}});
    let e = put(b, &c).unwrap_err();
    assert_eq!(e.code, "InvalidDestination");
    assert!(
        e.message.contains("use WebHook, EdgeHub, EventGrid, EventHub, ServiceBusQueue, ServiceBusTopic, StorageQueue or Mqtt"),
        "{}",
        e.message
    );
    let mut b = webhook("https://x/hook");
    b["properties"]["deadLetterDestination"] =
        json!({"endpointType": "EdgeHub", "properties": {"outputName": "o"}});
    let e = put(b, &c).unwrap_err();
    assert_eq!(e.code, "InvalidDeadLetterDestination");
    assert!(
        e.message.ends_with("use WebHook or StorageBlob"),
        "{}",
        e.message
    );
}

#[test]
fn every_example_parses_and_round_trips() {
    let c = cfg(&[
        ("outbound__webhook__httpsOnly", "false"),
        ("outbound__eventgrid__httpsOnly", "false"),
        ("outbound__eventgrid__allowInvalidHostnames", "true"),
    ]);
    for kind in DESTINATIONS.kinds() {
        let name = kind.names()[0];
        let dest = json!({"endpointType": name.to_ascii_lowercase(),
            "properties": kind.example("http://127.0.0.1:9")});
        let b = if kind.delivery() {
            json!({"properties":{"destination": dest}})
        } else {
            let mut b = webhook("https://x/hook");
            b["properties"]["deadLetterDestination"] = dest;
            b
        };
        let s = put(b, &c).unwrap_or_else(|e| panic!("{name}: {}", e.message));
        let d = if kind.delivery() {
            &s.destination
        } else {
            s.delivery.dead_letter.as_ref().unwrap()
        };
        assert_eq!(d.endpoint_type(), name);
        // The metadata record reads back by the type alone (no settings), through its JSON.
        let json = serde_json::to_vec(&s.to_record()).unwrap();
        let again =
            Subscription::from_record(serde_json::from_slice(&json).unwrap(), &DESTINATIONS)
                .unwrap_or_else(|e| panic!("{name}: {}", e.message));
        assert_eq!(again.properties(), s.properties(), "{name}");
        assert_eq!(again.to_record(), s.to_record(), "{name}");
        let (a, b) = if kind.delivery() {
            (&again.destination, &s.destination)
        } else {
            (
                again.delivery.dead_letter.as_ref().unwrap(),
                s.delivery.dead_letter.as_ref().unwrap(),
            )
        };
        assert_eq!(a, b, "{name}");
        assert_eq!(
            (a.url(), a.health_key(), a.webhook_options()),
            (b.url(), b.health_key(), b.webhook_options()),
            "{name}: what the type derives is derived again"
        );
        assert_eq!(
            (a.attributes(), a.credential_expiry()),
            (b.attributes(), b.credential_expiry()),
            "{name}"
        );
    }
}

#[test]
fn a_resource_id_is_stored_alone_and_resolved_again_when_read_back() {
    use super::resources::Resolving;
    let id =
        "/subscriptions/0/resourceGroups/g/providers/Microsoft.EventHub/namespaces/n/eventhubs/h";
    // A SAS token's expiry tells which connection string a destination was built from.
    let cs = |se: u64| {
        format!("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=x&sig=y&se={se}&skn=a;EntityPath=h")
    };
    let map = |se: u64| json!({ id: cs(se) }).to_string();
    let c = cfg(&[("outbound__resources", &map(4_000_000_000))]);
    let body = json!({"properties":{"destination":{"endpointType":"EventHub","properties":{"resourceId":id}}}});
    let s = put(body, &c).unwrap();
    let record = serde_json::to_string(&s.to_record()).unwrap();
    assert!(
        record.contains(id) && !record.contains("SharedAccess"),
        "{record}"
    );
    assert!(!serde_json::to_string(&s.properties())
        .unwrap()
        .contains("SharedAccess"));
    // Without the settings the record cannot be read; with them, a rotated key applies.
    let rec = || serde_json::from_str(&record).unwrap();
    assert!(Subscription::from_record(rec(), &DESTINATIONS).is_err());
    let rotated = cfg(&[("outbound__resources", &map(4_100_000_000))]);
    let types = Resolving {
        types: &DESTINATIONS,
        resources: &rotated.outbound.resources,
    };
    let again = Subscription::from_record(rec(), &types).unwrap();
    assert_eq!(again.to_record(), s.to_record());
    assert_eq!(s.destination.credential_expiry(), Some(4_000_000_000));
    assert_eq!(
        again.destination.credential_expiry(),
        Some(4_100_000_000),
        "a credential rotated in the settings applies when the record is read back"
    );
    let empty = cfg(&[]);
    let types = Resolving {
        types: &DESTINATIONS,
        resources: &empty.outbound.resources,
    };
    let e = Subscription::from_record(rec(), &types).unwrap_err();
    assert!(e.message.contains(id), "{}", e.message);
}
