//! Unit tests of `filter`.

use super::*;
use crate::model::json::lower_keys;
use proptest::prelude::*;

fn filter(v: Value) -> Filter {
    let v = lower_keys(v);
    Filter::parse(&Obj::new(&v, "filter").unwrap(), 256).unwrap()
}

fn event(v: &Value) -> EventView<'_> {
    let o = v.as_object().unwrap();
    // Leaked: a test-only view needs an owner for the object it borrows.
    let object: &'static LazyObject = Box::leak(Box::new(LazyObject::parsed(o.clone())));
    EventView {
        object,
        subject: o.get("subject").and_then(Value::as_str),
        event_type: o.get("eventType").and_then(Value::as_str),
        lowered: Default::default(),
    }
}

fn adv(op: &str, key: &str, vk: &str, v: Value) -> Filter {
    filter(json!({"advancedFilters":[{"operatorType":op,"key":key,vk:v}]}))
}

#[test]
fn compat_43_filter_semantics() {
    let ev = json!({"subject":"/blobServices/default/containers/container1/blobs/x","eventType":"Blob",
                    "data":{"key1":3,"n":4.56,"arr":[1,2],"s":"Hello","b":true}});
    assert!(adv("StringContains", "Subject", "values", json!(["CONTAINER1"])).matches(&event(&ev)));
    let cs = filter(json!({"isSubjectCaseSensitive":true,"subjectBeginsWith":"A"}));
    assert!(!cs.matches(&event(&json!({"subject":"abc"}))));
    assert!(cs.matches(&event(&json!({"subject":"Abc"}))));
    let not_in = adv("NumberNotIn", "data.key1", "values", json!([2, 3]));
    assert!(!not_in.matches(&event(&ev)));
    assert!(not_in.matches(&event(&json!({"data":{"key1":4}}))));
    assert!(adv("NumberIn", "data.n", "values", json!([4.56])).matches(&event(&ev)));
    assert!(!adv("NumberIn", "data.arr", "values", json!([1])).matches(&event(&ev)));
    assert!(adv("NumberIn", "Data.Key1", "values", json!([3])).matches(&event(&ev)));
    assert!(adv("BoolEquals", "data.b", "value", json!(true)).matches(&event(&ev)));
    assert!(adv("StringIn", "data.s", "values", json!(["hello"])).matches(&event(&ev)));
    assert!(!adv("StringNotIn", "data.s", "values", json!(["x", "HELLO"])).matches(&event(&ev)));
    assert!(!adv("StringIn", "data.missing", "values", json!(["x"])).matches(&event(&ev)));
    assert!(!adv("NumberGreaterThan", "data.s", "value", json!(1)).matches(&event(&ev)));
}

#[test]
fn decimals_do_not_round_like_floats() {
    // As f64 these two are the same number; as decimals they differ.
    let ev: Value = serde_json::from_str(r#"{"data":{"x":0.30000000000000001}}"#).unwrap();
    let f = |op: &str, vk: &str, v: &str| {
        filter(
            serde_json::from_str(&format!(
                r#"{{"advancedFilters":[{{"operatorType":"{op}","key":"data.x","{vk}":{v}}}]}}"#
            ))
            .unwrap(),
        )
    };
    assert!(!f("NumberIn", "values", "[0.3]").matches(&event(&ev)));
    assert!(f("NumberGreaterThan", "value", "0.3").matches(&event(&ev)));
    assert!(f("NumberIn", "values", "[0.30000000000000001]").matches(&event(&ev)));
}

#[test]
fn included_event_types_are_capped_and_hashed() {
    let types = |n: usize| -> Vec<String> { (0..n).map(|i| format!("Type.{i}")).collect() };
    let parse = |n: usize, max: usize| {
        let v = json!({"includedeventtypes": types(n)});
        Filter::parse(&Obj::new(&v, "filter").unwrap(), max)
    };
    let e = parse(4, 3).unwrap_err();
    assert!(e.to_string().contains("at most 3"), "{e}");
    let f = parse(3, 3).unwrap();
    // The set routing asks: one hash lookup per event, whatever the list's length.
    let set: &HashSet<String> = f.included_event_types.as_ref().unwrap();
    assert!(set.contains("type.2"));
    let object = LazyObject::parsed(Map::new());
    let view = |t: &'static str| EventView {
        subject: None,
        event_type: Some(t),
        object: &object,
        lowered: Default::default(),
    };
    assert!(f.matches(&view("TYPE.2")));
    assert!(f.matches(&view("type.0")));
    assert!(!f.matches(&view("type.3")));
    // The echo keeps the list as supplied.
    assert_eq!(f.to_json()["includedEventTypes"], json!(types(3)));
}

#[test]
fn included_event_types_and_twin_encoding() {
    let f = filter(json!({"includedEventTypes":"[\"et1\",\"ET2\"]"}));
    assert!(f.matches(&event(&json!({"eventType":"et2"}))));
    assert!(!f.matches(&event(&json!({"eventType":"et3"}))));
    let all = filter(json!({"includedEventTypes":["all"]}));
    assert!(all.matches(&event(&json!({"eventType":"anything"}))));
    let tw = filter(
        json!({"advancedFilters":"[{\"value\":true,\"operatorType\":\"BoolEquals\",\"key\":\"data.b\"}]"}),
    );
    assert!(tw.matches(&event(&json!({"data":{"b":true}}))));
}

#[test]
fn pascal_case_keys_and_unknown_operator() {
    let f = filter(
        json!({"advancedFilters":[{"OperatorType":"NumberGreaterThanOrEquals","Key":"Data.Key1","Value":5}]}),
    );
    assert!(f.matches(&event(&json!({"data":{"key1":5}}))));
    let v = lower_keys(
        json!({"advancedFilters":[{"operatorType":"NumberBetween","key":"a","value":1}]}),
    );
    assert!(Filter::parse(&Obj::new(&v, "filter").unwrap(), 256).is_err());
}

#[test]
fn echo_reparses_to_the_same_echo() {
    let f = filter(json!({"subjectBeginsWith":"a","includedEventTypes":["x"],
        "advancedFilters":[{"operatorType":"StringIn","key":"data.s","values":["A"]},
                           {"operatorType":"NumberLessThan","key":"data.n","value":10}]}));
    let again = filter(f.to_json());
    assert_eq!(f.to_json(), again.to_json());
}

proptest! {
    /// NotIn is exactly the negation of In for any present number.
    #[test]
    fn number_not_in_is_the_negation_of_in(x in -1000i64..1000, vals in proptest::collection::vec(-1000i64..1000, 1..8)) {
        let ev = json!({"data":{"x":x}});
        let a = adv("NumberIn", "data.x", "values", json!(vals)).matches(&event(&ev));
        let b = adv("NumberNotIn", "data.x", "values", json!(vals)).matches(&event(&ev));
        prop_assert_ne!(a, b);
    }

    /// Strings compare case-insensitively: changing the event's case never changes the result.
    #[test]
    fn string_ops_ignore_case(s in "[a-zA-Z]{0,12}", v in "[a-zA-Z]{1,4}") {
        for op in ["StringIn", "StringBeginsWith", "StringEndsWith", "StringContains", "StringNotIn"] {
            let f = adv(op, "data.s", "values", json!([v]));
            let lower = f.matches(&event(&json!({"data":{"s": s.to_lowercase()}})));
            let upper = f.matches(&event(&json!({"data":{"s": s.to_uppercase()}})));
            prop_assert_eq!(lower, upper);
        }
    }

    /// Advanced filters AND: the combination matches iff each alone matches.
    #[test]
    fn advanced_filters_are_anded(x in -50i64..50, a in -50i64..50, b in -50i64..50) {
        let ev = json!({"data":{"x":x}});
        let fa = adv("NumberGreaterThan", "data.x", "value", json!(a)).matches(&event(&ev));
        let fb = adv("NumberLessThan", "data.x", "value", json!(b)).matches(&event(&ev));
        let both = filter(json!({"advancedFilters":[
            {"operatorType":"NumberGreaterThan","key":"data.x","value":a},
            {"operatorType":"NumberLessThan","key":"data.x","value":b}]})).matches(&event(&ev));
        prop_assert_eq!(both, fa && fb);
    }

    /// Any JSON under an advanced key never panics, and arrays never match.
    #[test]
    fn arrays_never_match(vals in proptest::collection::vec(-5i64..5, 0..4)) {
        let ev = json!({"data":{"x": vals}});
        for (op, vk, v) in [("NumberIn","values",json!([1])),("NumberNotIn","values",json!([1])),
                            ("StringNotIn","values",json!(["a"])),("BoolEquals","value",json!(true))] {
            prop_assert!(!adv(op, "data.x", vk, v).matches(&event(&ev)));
        }
    }
}
