use super::*;
use crate::ingress::route::parse_enrichments;

fn env<'a>(schema: EventSchema, enrichments: &'a [(String, Value)]) -> Envelope<'a> {
    Envelope {
        schema,
        topic: "plant",
        source: "site-broker",
        id: "11111111-2222-4333-8444-555555555555".into(),
        time: "2026-11-28T07:00:00.000Z",
        enrichments,
    }
}

fn body(m: &Message, e: &Envelope<'_>) -> Json {
    let ev = to_event(m, e).expect("a valid event");
    serde_json::from_slice(&ev.body).unwrap()
}

fn msg(payload: &str) -> Message {
    Message {
        topic: "site/line1/temp".into(),
        payload: Bytes::from(payload.to_string()),
        ..Message::default()
    }
}

#[test]
fn an_unmarked_payload_is_data_base64_in_the_namespaces_envelope() {
    let v = body(&msg("{\"t\":21}"), &env(EventSchema::CloudEventV1_0, &[]));
    assert_eq!(v["specversion"], "1.0");
    assert_eq!(v["type"], "MQTT.EventPublished");
    assert_eq!(v["source"], "site-broker");
    assert_eq!(v["subject"], "site/line1/temp");
    assert_eq!(v["time"], "2026-11-28T07:00:00.000Z");
    assert_eq!(v["id"], "11111111-2222-4333-8444-555555555555");
    assert_eq!(v["data_base64"], b64(b"{\"t\":21}"));
    assert!(v.get("data").is_none());
}

#[test]
fn a_payload_marked_utf8_or_json_is_data() {
    let mut m = msg("{\"t\":21}");
    m.pfi = Some(1);
    assert_eq!(
        body(&m, &env(EventSchema::CloudEventV1_0, &[]))["data"]["t"],
        21
    );
    let mut m = msg("21.5 degrees");
    m.content_type = Some("text/plain".into());
    let v = body(&m, &env(EventSchema::CloudEventV1_0, &[]));
    assert_eq!(v["data"], "21.5 degrees");
    assert_eq!(v["datacontenttype"], "text/plain");
    let mut m = msg("[1,2]");
    m.content_type = Some("application/json; charset=utf-8".into());
    assert_eq!(
        body(&m, &env(EventSchema::CloudEventV1_0, &[]))["data"][1],
        2
    );
    // Marked as text but not UTF-8: base64 all the same.
    let mut m = msg("");
    m.payload = Bytes::from_static(&[0xff, 0xfe]);
    m.pfi = Some(1);
    assert!(body(&m, &env(EventSchema::CloudEventV1_0, &[]))
        .get("data_base64")
        .is_some());
}

#[test]
fn a_message_that_is_a_cloud_event_keeps_its_attributes() {
    let mut m = msg(
        r#"{"specversion":"1.0","id":"own","source":"/dev/7","type":"Reading","data":{"t":1}}"#,
    );
    m.content_type = Some("application/cloudevents+json".into());
    let v = body(&m, &env(EventSchema::CloudEventV1_0, &[]));
    assert_eq!(
        (v["id"].as_str(), v["type"].as_str()),
        (Some("own"), Some("Reading"))
    );
    assert!(v.get("subject").is_none());

    // Binary mode: attributes are user properties.
    let mut m = msg("{\"t\":2}");
    m.content_type = Some("application/json".into());
    m.user_properties = vec![
        ("specversion".into(), "1.0".into()),
        ("id".into(), "b1".into()),
        ("source".into(), "/dev/8".into()),
        ("type".into(), "Reading".into()),
        ("Not-An-Attribute".into(), "x".into()),
    ];
    let v = body(&m, &env(EventSchema::CloudEventV1_0, &[]));
    assert_eq!(v["id"], "b1");
    assert_eq!(v["data"]["t"], 2);
    assert_eq!(v["datacontenttype"], "application/json");
    assert!(v.get("Not-An-Attribute").is_none());

    // Structured mode with a payload that is not an event: refused.
    let mut m = msg("not json");
    m.content_type = Some("application/cloudevents+json".into());
    assert!(to_event(&m, &env(EventSchema::CloudEventV1_0, &[])).is_err());
}

#[test]
fn user_properties_become_attributes_only_through_enrichments() {
    let e = parse_enrichments("site=plant4,line=${mqtt.message.userProperties.line},missing=${mqtt.message.userProperties.nope},subj=${mqtt.message.topicName}").unwrap();
    let mut m = msg("x");
    m.user_properties = vec![("line".into(), "L1".into()), ("other".into(), "o".into())];
    let v = body(&m, &env(EventSchema::CloudEventV1_0, &e));
    assert_eq!(v["site"], "plant4");
    assert_eq!(v["line"], "L1");
    assert_eq!(v["subj"], "site/line1/temp");
    assert!(v.get("missing").is_none());
    assert!(v.get("other").is_none());
}

#[test]
fn an_event_grid_topic_gets_the_event_grid_event() {
    let mut m = msg("{\"t\":21}");
    m.pfi = Some(1);
    let v = body(&m, &env(EventSchema::EventGrid, &[]));
    assert_eq!(v["eventType"], "MQTT.EventPublished");
    assert_eq!(v["subject"], "site/line1/temp");
    assert_eq!(v["data"]["t"], 21);
    assert_eq!(v["topic"], "plant");
    let v = body(&msg("raw"), &env(EventSchema::EventGrid, &[]));
    assert_eq!(v["data"], b64(b"raw"));
}

#[test]
fn a_custom_topic_takes_the_payload_as_the_event() {
    let v = body(&msg("{\"reading\":3}"), &env(EventSchema::Custom, &[]));
    assert_eq!(v["reading"], 3);
    assert!(to_event(&msg("not json"), &env(EventSchema::Custom, &[])).is_err());
    assert!(to_event(&msg("{\"a\":1},{\"b\":2}"), &env(EventSchema::Custom, &[])).is_err());
    assert!(to_event(&msg("[{\"a\":1}]"), &env(EventSchema::Custom, &[])).is_err());
}

#[test]
fn ids_are_distinct_v4_uuids() {
    let a = new_id();
    let b = new_id();
    assert_ne!(a, b);
    assert_eq!(a.len(), 36);
    assert_eq!(&a[14..15], "4");
}
