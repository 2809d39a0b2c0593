use super::*;
use crate::model::destination::testing::{cfg, topic, TestTypes};
use serde_json::json;

/// A subscription using every part a record keeps, created under `c`.
fn full(c: &crate::config::Config) -> Subscription {
    let body = json!({"properties": {
        "destination": {"endpointType": "WebHook", "properties": {
            "endpointUrl": "https://user:pw@x/hook?code=abc",
            "maxEventsPerBatch": 80,
            "drainOrder": "liveFirst",
            "signingSecrets": ["whsec_c2VjcmV0LXNpZ25pbmcta2V5LTAxMjM0NTY3"],
            "deliveryAttributeMappings": [
                {"name": "X-Key", "type": "Static", "properties": {"value": "hidden", "isSecret": true}},
                {"name": "X-Subject", "type": "Dynamic", "properties": {"sourceField": "subject"}}]}},
        "retryPolicy": {"maxDeliveryAttempts": 7, "eventExpiryInMinutes": 45,
            "schedule": "tenSecondsToHourly", "statusCodePolicy": "standard"},
        "persistencePolicy": {"isPersisted": true},
        "filter": {"includedEventTypes": ["a", "b", "c"], "subjectEndsWith": ".jpg",
            "advancedFilters": [{"operatorType": "NumberIn", "key": "data.n", "values": [1, 2.50]}]},
        "deadLetterDestination": {"endpointType": "WebHook", "properties": {"endpointUrl": "https://x/dead"}}
    }});
    Subscription::from_put(&topic(), "Sub1", body, c, &TestTypes).unwrap()
}

#[test]
fn a_subscription_reads_back_from_its_record_as_created() {
    let s = full(&cfg(&[(
        "api__deliveryPolicyLimits__maxEventsPerBatch",
        "100",
    )]));
    let bytes = serde_json::to_vec(&s.to_record()).unwrap();
    check_version(&bytes).unwrap();
    let back =
        Subscription::from_record(serde_json::from_slice(&bytes).unwrap(), &TestTypes).unwrap();
    assert_eq!(back.properties(), s.properties());
    assert_eq!(back.to_record(), s.to_record());
    assert_eq!((back.name.as_str(), back.topic.as_str()), ("Sub1", "t1"));
    assert_eq!(back.batching.max_events_per_batch, Some(80));
    assert!(back.batching.live_first());
    assert_eq!(
        back.properties()["destination"]["properties"]["drainOrder"],
        "LiveFirst"
    );
    let c = cfg(&[]);
    assert_eq!(back.effective_policy(&c), s.effective_policy(&c));
    // The settings in force now would refuse it as a new PUT (80 > the default limit of 50):
    // the record is read without them, unchanged.
    let again = json!({ "properties": s.properties() });
    assert!(Subscription::from_put(&topic(), "Sub1", again, &c, &TestTypes).is_err());
}

#[test]
fn topics_read_back_from_their_records() {
    let t = Topic {
        name: "Orders".into(),
        input_schema: EventSchema::CloudEventV1_0,
        dedup_window_secs: None,
        event_retention_days: None,
    };
    let bytes = serde_json::to_vec(&t.to_record()).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap(),
        json!({"v": 1, "name": "Orders", "inputSchema": "CloudEventSchemaV1_0"})
    );
    assert_eq!(
        Topic::from_record(serde_json::from_slice(&bytes).unwrap()),
        t
    );
}

/// What "adding a field" relies on: a record written before a field existed is read with the
/// field's default.
#[test]
fn a_record_without_the_optional_parts_reads_with_their_defaults() {
    let minimal = json!({"v": 1, "name": "s", "topic": "t1", "deliverySchema": "EventGridSchema",
        "persisted": false,
        "destination": {"endpointType": "EdgeHub", "properties": {"outputName": "out"}}});
    let r: SubscriptionRecord = serde_json::from_value(minimal).unwrap();
    let s = Subscription::from_record(r, &TestTypes).unwrap();
    assert!(s.retry_policy.is_none() && s.filter.is_none() && !s.persisted);
    assert_eq!(s.batching, Batching::default());
    assert_eq!(s.delivery, DeliveryOptions::default());
    assert_eq!(s.destination.endpoint_type(), "EdgeHub");
}

#[test]
fn records_of_another_format_are_refused_saying_what_to_do() {
    let newer = check_version(br#"{"v": 2, "name": "s"}"#).unwrap_err();
    assert!(
        newer.contains("version 2") && newer.contains("move the metadata"),
        "{newer}"
    );
    // The earlier development format: the API's JSON, no version.
    let old = check_version(br#"{"topic": "t1", "record": {"name": "s", "properties": {}}}"#)
        .unwrap_err();
    assert!(old.contains("earlier development format"), "{old}");
    assert!(
        old.contains("create the topics and subscriptions again"),
        "{old}"
    );
    let old_topic =
        check_version(br#"{"name":"t1","properties":{"inputSchema":"EventGridSchema"}}"#);
    assert!(old_topic
        .unwrap_err()
        .contains("earlier development format"));
    assert!(check_version(b"\xa5\xa5")
        .unwrap_err()
        .contains("unreadable"));
}

#[test]
fn a_record_naming_what_this_build_does_not_know_is_an_error() {
    let mut r = full(&cfg(&[(
        "api__deliveryPolicyLimits__maxEventsPerBatch",
        "100",
    )]))
    .to_record();
    r.destination.endpoint_type = "Carrier pigeon".into();
    let e = Subscription::from_record(r.clone(), &TestTypes).unwrap_err();
    assert_eq!(e.code, "InvalidRecord");
    assert!(e.message.contains("Carrier pigeon"), "{}", e.message);
    r.destination.endpoint_type = "WebHook".into();
    r.retry_policy = Some(RetryPolicyRecord {
        schedule: Some("fortnightly".into()),
        ..Default::default()
    });
    let e = Subscription::from_record(r, &TestTypes).unwrap_err();
    assert!(e.message.contains("fortnightly"), "{}", e.message);
}

#[test]
fn debug_output_leaves_the_secrets_out() {
    let r = full(&cfg(&[(
        "api__deliveryPolicyLimits__maxEventsPerBatch",
        "100",
    )]))
    .to_record();
    let d = format!("{r:?}");
    for secret in ["pw", "code=abc", "whsec_", "hidden"] {
        assert!(!d.contains(secret), "{secret} in {d}");
    }
    assert!(d.contains("Sub1") && d.contains("endpointUrl"), "{d}");
}
