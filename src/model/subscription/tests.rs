use super::*;
use crate::model::destination::testing::{cfg, topic, TestTypes};

fn webhook(url: &str) -> Value {
    json!({"properties":{"destination":{"endpointType":"WebHook","properties":{"endpointUrl":url}}}})
}

#[test]
fn batching_limits_apply_at_creation() {
    let c = cfg(&[]);
    let with = |k: &str, v: u32| json!({"properties":{"destination":{"endpointType":"webhook","properties":{"endpointUrl":"https://x", k: v}}}});
    assert!(
        Subscription::from_put(&topic(), "s", with("maxEventsPerBatch", 51), &c, &TestTypes)
            .is_err()
    );
    assert!(Subscription::from_put(
        &topic(),
        "s",
        with("preferredBatchSizeInKilobytes", 1034),
        &c,
        &TestTypes
    )
    .is_err());
    let s = Subscription::from_put(&topic(), "s", with("maxEventsPerBatch", 10), &c, &TestTypes)
        .unwrap();
    assert_eq!(
        s.batching.caps(&c),
        BatchCaps {
            max_events: 10,
            max_bytes: 1_058_576
        }
    );
    let s = Subscription::from_put(
        &topic(),
        "s",
        with("preferredBatchSizeInKilobytes", 64),
        &c,
        &TestTypes,
    )
    .unwrap();
    assert_eq!(
        s.batching.caps(&c),
        BatchCaps {
            max_events: 10,
            max_bytes: 64 * 1024
        }
    );
}

#[test]
fn persistence_policy_shapes_are_all_accepted() {
    let c = cfg(&[]);
    for pp in [
        json!({"isPersisted":"true"}),
        json!({"isPersisted":true}),
        json!("true"),
        json!(true),
    ] {
        let mut b = webhook("https://x");
        b["properties"]["persistencePolicy"] = pp;
        assert!(
            Subscription::from_put(&topic(), "s", b, &c, &TestTypes)
                .unwrap()
                .persisted
        );
    }
}

#[test]
fn record_round_trips() {
    let c = cfg(&[]);
    let mut b = webhook("https://x");
    b["properties"]["retryPolicy"] = json!({"eventExpiryInMinutes":30,"maxDeliveryAttempts":3});
    b["properties"]["filter"] = json!({"subjectBeginsWith":"a","advancedFilters":[{"operatorType":"NumberIn","key":"data.n","values":[1,2]}]});
    let s = Subscription::from_put(&topic(), "s", b, &c, &TestTypes).unwrap();
    let again = Subscription::from_record(s.to_record(), &TestTypes).unwrap();
    assert_eq!(s.properties(), again.properties());
    assert_eq!(
        s.effective_policy(&c),
        EffectivePolicy::original(3, Duration::from_secs(1800))
    );
}
