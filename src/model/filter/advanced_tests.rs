//! The advanced operators against Microsoft's documented rules, one test per rule ("Event
//! filters for subscriptions to Azure Event Grid namespace topics"), with the edge module's rule
//! for arrays where it differs.

use super::*;
use crate::model::json::lower_keys;

fn parse(v: Value) -> Result<Filter, Invalid> {
    let v = lower_keys(v);
    Filter::parse(&Obj::new(&v, "filter").unwrap(), 256)
}

/// One advanced filter; `arrays`: `enableAdvancedFilteringOnArrays`.
fn one(op: &str, values: Option<Value>, arrays: bool) -> Filter {
    let mut f = json!({"operatorType": op, "key": "data.k"});
    if let Some(v) = values {
        let vk = if v.is_array() { "values" } else { "value" };
        f[vk] = v;
    }
    parse(json!({"advancedFilters": [f], "enableAdvancedFilteringOnArrays": arrays})).unwrap()
}

fn matches(f: &Filter, data: Value) -> bool {
    let ev = json!({ "data": data });
    let object = LazyObject::parsed(ev.as_object().unwrap().clone());
    f.matches(&EventView {
        object: &object,
        subject: None,
        event_type: None,
        lowered: Default::default(),
    })
}

/// Every operator with values that the key's value does and does not satisfy.
fn every_operator() -> Vec<(&'static str, Option<Value>)> {
    vec![
        ("NumberIn", Some(json!([5, 1]))),
        ("NumberNotIn", Some(json!([41, 0]))),
        ("NumberLessThan", Some(json!(100))),
        ("NumberGreaterThan", Some(json!(20))),
        ("NumberLessThanOrEquals", Some(json!(100))),
        ("NumberGreaterThanOrEquals", Some(json!(30))),
        ("NumberInRange", Some(json!([[3.5, 999.95], [3000, 4000]]))),
        (
            "NumberNotInRange",
            Some(json!([[3.5, 999.95], [3000, 4000]])),
        ),
        ("BoolEquals", Some(json!(true))),
        ("StringIn", Some(json!(["contoso", "fabrikam"]))),
        ("StringNotIn", Some(json!(["aws", "bridge"]))),
        ("StringBeginsWith", Some(json!(["event", "message"]))),
        ("StringNotBeginsWith", Some(json!(["event", "message"]))),
        ("StringEndsWith", Some(json!(["jpg", "png"]))),
        ("StringNotEndsWith", Some(json!(["jpg", "png"]))),
        ("StringContains", Some(json!(["microsoft", "azure"]))),
        ("StringNotContains", Some(json!(["contoso", "fabrikam"]))),
        ("IsNullOrUndefined", None),
        ("IsNotNull", None),
    ]
}

#[test]
fn each_new_operator_as_documented() {
    let cases: &[(&str, Value, Value, bool)] = &[
        (
            "NumberInRange",
            json!([[3.5, 999.95], [3000, 4000]]),
            json!(3000),
            true,
        ),
        (
            "NumberInRange",
            json!([[3.5, 999.95], [3000, 4000]]),
            json!(4000),
            true,
        ),
        (
            "NumberInRange",
            json!([[3.5, 999.95], [3000, 4000]]),
            json!(3.4),
            false,
        ),
        (
            "NumberInRange",
            json!([[3.5, 999.95], [3000, 4000]]),
            json!(1000),
            false,
        ),
        (
            "NumberNotInRange",
            json!([[3.5, 999.95], [3000, 4000]]),
            json!(1000),
            true,
        ),
        (
            "NumberNotInRange",
            json!([[3.5, 999.95], [3000, 4000]]),
            json!(500),
            false,
        ),
        (
            "StringNotBeginsWith",
            json!(["event", "message"]),
            json!("hubs"),
            true,
        ),
        (
            "StringNotBeginsWith",
            json!(["event", "message"]),
            json!("Event hubs"),
            false,
        ),
        (
            "StringNotEndsWith",
            json!(["jpg", "png"]),
            json!("a.gif"),
            true,
        ),
        (
            "StringNotEndsWith",
            json!(["jpg", "png"]),
            json!("eventgrid.PNG"),
            false,
        ),
        (
            "StringNotContains",
            json!(["contoso", "fabrikam"]),
            json!("azure"),
            true,
        ),
        (
            "StringNotContains",
            json!(["contoso", "fabrikam"]),
            json!("a FABRIKAM b"),
            false,
        ),
    ];
    for (op, values, value, want) in cases {
        let f = one(op, Some(values.clone()), false);
        assert_eq!(matches(&f, json!({ "k": value })), *want, "{op} {value}");
    }
    let is_null = one("IsNullOrUndefined", None, false);
    assert!(matches(&is_null, json!({"key2": 5})), "missing");
    assert!(matches(&is_null, json!({"k": null})), "null");
    assert!(!matches(&is_null, json!({"k": 0})), "any other value");
    let not_null = one("IsNotNull", None, false);
    assert!(!matches(&not_null, json!({"key2": 5})));
    assert!(!matches(&not_null, json!({"k": null})));
    assert!(matches(&not_null, json!({"k": ""})));
    assert!(
        matches(&not_null, json!({"k": [1]})),
        "an array is not null"
    );
}

#[test]
fn a_missing_key_matches_only_not_in_and_is_null_or_undefined() {
    for (op, values) in every_operator() {
        let want = matches!(op, "NumberNotIn" | "StringNotIn" | "IsNullOrUndefined");
        for arrays in [false, true] {
            let f = one(op, values.clone(), arrays);
            assert_eq!(matches(&f, json!({"other": 1})), want, "{op}: missing key");
            assert_eq!(matches(&f, json!({"k": null})), want, "{op}: null value");
        }
    }
}

#[test]
fn a_key_of_another_type_fails_every_typed_operator() {
    for (op, values) in every_operator() {
        let f = one(op, values, false);
        let other = if op.starts_with("String") {
            json!(5)
        } else {
            json!("5")
        };
        let want = op == "IsNotNull";
        assert_eq!(matches(&f, json!({ "k": other })), want, "{op}");
        assert_eq!(matches(&f, json!({"k": {"x": 1}})), want, "{op}: object");
    }
}

#[test]
fn string_operators_ignore_case() {
    for (op, negated, values, value) in [
        ("StringIn", "StringNotIn", json!(["contoso"]), "CONTOSO"),
        (
            "StringBeginsWith",
            "StringNotBeginsWith",
            json!(["event"]),
            "EVENT hubs",
        ),
        (
            "StringEndsWith",
            "StringNotEndsWith",
            json!(["jpg"]),
            "A.JPG",
        ),
        (
            "StringContains",
            "StringNotContains",
            json!(["azure"]),
            "x AZURE y",
        ),
    ] {
        assert!(
            matches(&one(op, Some(values.clone()), false), json!({ "k": value })),
            "{op}"
        );
        assert!(
            !matches(&one(negated, Some(values), false), json!({ "k": value })),
            "{negated}"
        );
    }
}

#[test]
fn arrays_compare_each_element_when_on_and_fail_when_off() {
    // Positive operators: any element matching any value. Elements of another type are ignored.
    let cases: &[(&str, Value, Value, bool)] = &[
        ("NumberIn", json!([5, 1]), json!(["5", 7, 1]), true),
        ("NumberIn", json!([5, 1]), json!(["5", 7]), false),
        ("NumberNotIn", json!([41, 0]), json!([1, 2, "41"]), true),
        ("NumberNotIn", json!([41, 0]), json!([1, 41]), false),
        ("NumberGreaterThan", json!(20), json!([1, 21]), true),
        ("NumberLessThan", json!(100), json!([100, 200]), false),
        ("NumberInRange", json!([[1, 2]]), json!([0, 1.5]), true),
        ("NumberNotInRange", json!([[1, 2]]), json!([0, 1.5]), false),
        ("NumberNotInRange", json!([[1, 2]]), json!([0, 3]), true),
        ("BoolEquals", json!(true), json!([false, true]), true),
        ("BoolEquals", json!(true), json!([false, "true"]), false),
        ("StringIn", json!(["a"]), json!(["B", "A"]), true),
        ("StringNotIn", json!(["a"]), json!(["B", "A"]), false),
        ("StringNotIn", json!(["a"]), json!(["B", 1]), true),
        ("StringContains", json!(["zu"]), json!(["x", "AZURE"]), true),
        (
            "StringNotContains",
            json!(["zu"]),
            json!(["x", "AZURE"]),
            false,
        ),
        (
            "StringBeginsWith",
            json!(["ev"]),
            json!(["x", "Event"]),
            true,
        ),
        (
            "StringNotBeginsWith",
            json!(["ev"]),
            json!(["x", "y"]),
            true,
        ),
        ("StringEndsWith", json!(["g"]), json!(["x", "jpG"]), true),
        ("StringNotEndsWith", json!(["g"]), json!(["jpG"]), false),
        // An empty array holds no element that matches.
        ("StringIn", json!(["a"]), json!([]), false),
        ("StringNotIn", json!(["a"]), json!([]), true),
    ];
    for (op, values, value, want) in cases {
        let on = one(op, Some(values.clone()), true);
        assert_eq!(
            matches(&on, json!({ "k": value })),
            *want,
            "{op} {value} (arrays on)"
        );
        let off = one(op, Some(values.clone()), false);
        assert!(
            !matches(&off, json!({ "k": value })),
            "{op} {value} (arrays off: fails)"
        );
    }
}

#[test]
fn ranges_and_nullary_operators_are_checked_at_creation_and_echoed() {
    for bad in [
        json!([[1]]),
        json!([[1, 2, 3]]),
        json!([1, 2]),
        json!([["a", 2]]),
        json!([[3, 2]]),
    ] {
        let e = parse(json!({"advancedFilters":[{"operatorType":"NumberInRange","key":"data.k","values":bad}]}))
            .unwrap_err();
        assert!(
            e.to_string().contains("advancedFilters[0].values[0]"),
            "{e}"
        );
    }
    let f = parse(
        json!({"enableAdvancedFilteringOnArrays": true, "advancedFilters":[
        {"operatorType":"NumberInRange","key":"data.k","values":[[1, 2]]},
        {"operatorType":"isnotnull","key":"data.k"},
        {"operatorType":"StringNotContains","key":"data.s","values":["X"]}]}),
    )
    .unwrap();
    let echo = f.to_json();
    assert_eq!(echo["enableAdvancedFilteringOnArrays"], true);
    assert_eq!(
        echo["advancedFilters"][1],
        json!({"operatorType":"IsNotNull","key":"data.k"})
    );
    let again = Filter::from_record(&echo).unwrap();
    assert_eq!(again.to_json(), echo);
    assert!(matches(&again, json!({"k": [0, 1.5], "s": "y"})));
}

#[test]
fn limits_at_their_edge() {
    let values = |n: usize| -> Vec<String> { (0..n).map(|i| format!("v{i}")).collect() };
    let with = |n: usize| {
        parse(
            json!({"advancedFilters":[{"operatorType":"StringNotIn","key":"data.k","values":values(n)}]}),
        )
    };
    assert!(with(MAX_VALUES).is_ok());
    assert!(with(MAX_VALUES + 1).is_err());
    let filters = |n: usize| {
        let fs: Vec<Value> = (0..n)
            .map(|_| json!({"operatorType":"IsNotNull","key":"data.k"}))
            .collect();
        parse(json!({ "advancedFilters": fs }))
    };
    assert!(filters(MAX_ADVANCED_FILTERS).is_ok());
    assert!(filters(MAX_ADVANCED_FILTERS + 1).is_err());
    let long = |n: usize| {
        parse(
            json!({"advancedFilters":[{"operatorType":"StringNotContains","key":"data.k","values":["x".repeat(n)]}]}),
        )
    };
    assert!(long(MAX_STRING_LEN).is_ok());
    assert!(long(MAX_STRING_LEN + 1).is_err());
}
