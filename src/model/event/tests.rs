//! Unit tests of `event`.

use super::*;
use axum::http::HeaderValue;

fn run(
    schema: EventSchema,
    ct: Option<&str>,
    body: &str,
) -> Result<Vec<IncomingEvent>, PublishError> {
    let mut headers = HeaderMap::new();
    if let Some(ct) = ct {
        headers.insert("content-type", HeaderValue::from_str(ct).unwrap());
    }
    let body = Bytes::from(body.to_string());
    parse(&PublishInput {
        schema,
        topic: "t1",
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 100,
    })
}

const EV: &str = r#"{"id":"1","subject":"s","eventType":"e","eventTime":"not-a-date","dataVersion":"1.0","data":{"n":1.50}}"#;

#[test]
fn event_grid_gets_topic_and_metadata_version_spliced_in() {
    let evs = run(
        EventSchema::EventGrid,
        Some("application/json"),
        &format!("[{EV}]"),
    )
    .unwrap();
    let s = std::str::from_utf8(&evs[0].body).unwrap();
    assert!(
        s.starts_with(r#"{"topic":"t1","metadataVersion":"1","id":"1""#),
        "{s}"
    );
    assert!(s.contains("1.50"), "numbers keep their text: {s}");
    let v: Value = serde_json::from_slice(&evs[0].body).unwrap();
    assert_eq!(v["topic"], "t1");
}

#[test]
fn event_grid_required_fields() {
    for missing in ["id", "subject", "eventType", "eventTime", "dataVersion"] {
        let mut v: Value = serde_json::from_str(EV).unwrap();
        v.as_object_mut().unwrap().remove(missing);
        let e = run(EventSchema::EventGrid, None, &format!("[{v}]")).unwrap_err();
        assert!(matches!(e, PublishError::Invalid(_)), "{missing}");
    }
    let wrong_topic = EV.replacen('{', r#"{"topic":"t2","#, 1);
    assert!(run(EventSchema::EventGrid, None, &format!("[{wrong_topic}]")).is_err());
    let mv2 = EV.replacen('{', r#"{"metadataVersion":"2","#, 1);
    assert!(run(EventSchema::EventGrid, None, &format!("[{mv2}]")).is_err());
    let mv1 = EV.replacen('{', r#"{"metadataVersion":"1","#, 1);
    assert!(run(EventSchema::EventGrid, None, &format!("[{mv1}]")).is_ok());
    assert!(
        run(EventSchema::EventGrid, None, EV).is_err(),
        "top-level object on /events"
    );
    assert!(run(EventSchema::EventGrid, None, "not json").is_err());
    assert!(run(EventSchema::EventGrid, None, "[]").unwrap().is_empty());
}

#[test]
fn custom_schema_is_forwarded_untouched() {
    let evs = run(EventSchema::Custom, None, r#"[ {"a" : 1.0e2} ]"#).unwrap();
    assert_eq!(&evs[0].body[..], br#"{"a" : 1.0e2}"#);
    assert!(run(EventSchema::Custom, None, "[1]").is_err());
    assert!(run(EventSchema::Custom, None, r#"{"a":1}"#).is_err());
}

#[test]
fn cloud_events_structured_and_binary() {
    let ce = r#"{"id":"1","source":"/s","type":"t","specversion":"1.0","data":{"x":1}}"#;
    assert!(run(
        EventSchema::CloudEventV1_0,
        Some("application/cloudevents-batch+json"),
        &format!("[{ce}]")
    )
    .is_ok());
    assert!(run(
        EventSchema::CloudEventV1_0,
        Some("application/cloudevents+json; charset=utf-8"),
        ce
    )
    .is_ok());
    let no_source = r#"{"id":"1","type":"t","specversion":"1.0"}"#;
    assert!(run(
        EventSchema::CloudEventV1_0,
        Some("application/cloudevents+json"),
        no_source
    )
    .is_err());
    let mut headers = HeaderMap::new();
    for (k, v) in [
        ("ce-id", "9"),
        ("ce-source", "/src"),
        ("ce-type", "x.y"),
        ("ce-specversion", "1.0"),
        ("content-type", "application/json"),
    ] {
        headers.insert(k, HeaderValue::from_static(v));
    }
    let body = Bytes::from_static(br#"{"temp":21}"#);
    let evs = parse(&PublishInput {
        schema: EventSchema::CloudEventV1_0,
        topic: "t",
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 10,
    })
    .unwrap();
    let v: Value = serde_json::from_slice(&evs[0].body).unwrap();
    assert_eq!(v["id"], "9");
    assert_eq!(v["data"]["temp"], 21);
}

proptest::proptest! {
    /// Any bytes, any schema: a clean result or a 4xx, never a panic.
    #[test]
    fn parse_never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), ce in proptest::prelude::any::<bool>()) {
        let body = Bytes::from(body);
        let mut headers = HeaderMap::new();
        if ce {
            headers.insert("ce-specversion", HeaderValue::from_static("1.0"));
        }
        for schema in [EventSchema::EventGrid, EventSchema::Custom, EventSchema::CloudEventV1_0] {
            if let Err(e) = parse(&PublishInput { schema, topic: "t", headers: &headers, body: &body, single_id: Some("x"), max_events: 50 }) {
                proptest::prop_assert!(e.is_client_error());
            }
        }
    }
}

/// The old two-pass path for one element, for comparison with [`fast`].
fn full(schema: EventSchema, raw: &RawValue) -> Result<IncomingEvent, PublishError> {
    match schema {
        EventSchema::EventGrid => event_grid(raw, 0, "t1"),
        EventSchema::Custom => custom(raw, 0),
        EventSchema::CloudEventV1_0 => cloud_event(raw, 0),
    }
}

/// Whenever the one-pass path accepts an element, the full parse accepts it with the same
/// body, id, subject, type and filter object. Returns whether the fast path took it.
fn check_same(schema: EventSchema, text: &str) -> bool {
    let body = Bytes::from(format!("[{text}]"));
    let Ok(raws) = serde_json::from_slice::<Vec<&RawValue>>(&body) else {
        return false;
    };
    let headers = HeaderMap::new();
    let input = PublishInput {
        schema,
        topic: "t1",
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 10,
    };
    let Some(f) = fast(&input, raws[0]) else {
        return false;
    };
    let s = full(schema, raws[0]).unwrap_or_else(|e| panic!("{schema:?} {text}: {e:?}"));
    assert_eq!(f.body, s.body, "{schema:?} {text}");
    assert_eq!(f.id, s.id, "{schema:?} {text}");
    let (fv, sv) = (f.view(), s.view());
    assert_eq!(fv.subject, sv.subject, "{schema:?} {text}");
    assert_eq!(fv.event_type, sv.event_type, "{schema:?} {text}");
    assert_eq!(fv.object.get(), sv.object.get(), "{schema:?} {text}");
    true
}

const SCHEMAS: [EventSchema; 3] = [
    EventSchema::EventGrid,
    EventSchema::Custom,
    EventSchema::CloudEventV1_0,
];

#[test]
fn one_pass_matches_the_full_parse() {
    assert!(check_same(EventSchema::EventGrid, EV));
    let both = EV.replacen('{', r#"{"topic":"T1","metadataVersion":"1","#, 1);
    assert!(check_same(EventSchema::EventGrid, &both));
    let ce =
        r#"{"id":"1","source":"/s","type":"t","specversion":"1.0","subject":"x","data":{"x":1}}"#;
    assert!(check_same(EventSchema::CloudEventV1_0, ce));
    assert!(check_same(
        EventSchema::Custom,
        r#"{"a" : 1.0e2, "subject": "s"}"#
    ));
    assert!(check_same(EventSchema::Custom, "{ }"));
    assert!(check_same(
        EventSchema::EventGrid,
        &EV.replacen('{', "{ ", 1)
    ));
    let spaced = r#" { "id" : "1" , "x" : [ "]" , { "y" : "}," } ] , "subject" : "s" , "eventType" : "e" , "eventTime" : "t" , "dataVersion" : "1" , "n" : -1.5e3 } "#;
    assert!(check_same(EventSchema::EventGrid, spaced));
    assert!(check_same(EventSchema::Custom, r#"{"n":1,"subject":"s"}"#));
    assert!(check_same(
        EventSchema::Custom,
        r#"{"b":true,"eventType":"e","z":null}"#
    ));
    // Left to the full parse: escapes, deep nesting, nulls, other case, duplicates, errors.
    let deep = EV.replace(
        r#"{"n":1.50}"#,
        &format!("{}{}", "[".repeat(130), "]".repeat(130)),
    );
    for (schema, text) in [
        (EventSchema::EventGrid, EV.replace(r#""s""#, r#""\u00e9""#)),
        (EventSchema::EventGrid, deep.clone()),
        (EventSchema::Custom, deep),
        (
            EventSchema::EventGrid,
            EV.replacen('{', r#"{"topic":null,"#, 1),
        ),
        (EventSchema::EventGrid, EV.replace("eventType", "EventType")),
        (EventSchema::EventGrid, EV.replacen('{', r#"{"id":"0","#, 1)),
        (
            EventSchema::EventGrid,
            EV.replacen('{', r#"{"topic":"t2","#, 1),
        ),
        (EventSchema::Custom, r#"{"id":1}"#.to_string()),
        (EventSchema::Custom, "[1]".to_string()),
        (EventSchema::CloudEventV1_0, ce.replace("1.0", "0.3")),
        (
            EventSchema::CloudEventV1_0,
            ce.replace(r#""id":"1""#, r#""id":"""#),
        ),
    ] {
        assert!(!check_same(schema, &text), "{schema:?} {text}");
    }
}

proptest::proptest! {
    /// Events built from the keys the schemas read (in several cases, repeated) and values
    /// of every kind: the one-pass path never disagrees with the full parse.
    #[test]
    fn one_pass_never_disagrees(base in 0usize..3, ws in proptest::prelude::any::<bool>(), members in proptest::collection::vec((0usize..20, 0usize..16), 0..6)) {
        const KEYS: [&str; 20] = ["id", "ID", "subject", "Subject", "eventType", "eventtype",
            "eventTime", "dataVersion", "topic", "Topic", "metadataVersion", "metadataversion",
            "type", "source", "specversion", "SpecVersion", "data", "x", "Id", "TYPE"];
        const VALUES: [&str; 16] = [r#"" } , ] { : ""#, r#"{ "a" : [ "}" , 2, { } ] }"#,r#""1""#, r#""1.0""#, r#""t1""#, r#""T1""#, r#""""#,
            r#""s\u00e9""#, "null", "1", "1.50", r#"{"n":[1,{"m":null}]}"#, "[]", "true",
            r#""2026-01-01T00:00:00Z""#, r#""/a/b""#];
        // Start from a valid event of some schema (or nothing), then add members.
        const BASES: [&str; 3] = ["",
            r#""id":"1","subject":"s","eventType":"e","eventTime":"t","dataVersion":"1.0""#,
            r#""id":"1","source":"/s","type":"t","specversion":"1.0""#];
        let (colon, comma, brace) = if ws { (" :\t", "\r\n ,  ", " ") } else { (":", ",", "") };
        let text = format!("{brace}{{{brace}{}{brace}}}{brace}", std::iter::once(BASES[base].to_string())
            .filter(|b| !b.is_empty())
            .chain(members.iter().map(|&(k, v)| format!(r#""{}"{colon}{}"#, KEYS[k], VALUES[v])))
            .collect::<Vec<_>>()
            .join(comma));
        for schema in SCHEMAS {
            check_same(schema, &text);
        }
    }
}

#[test]
fn limits_and_media_types() {
    let many = format!("[{}]", vec!["{}"; 101].join(","));
    assert!(matches!(
        run(EventSchema::Custom, None, &many).unwrap_err(),
        PublishError::Invalid(e) if e.code == "TooManyEvents"
    ));
    assert!(matches!(
        run(EventSchema::Custom, Some("text/plain"), "[{}]").unwrap_err(),
        PublishError::UnsupportedMediaType(_)
    ));
    let deep = format!("[{}{}]", "[".repeat(200), "]".repeat(200));
    assert!(run(EventSchema::Custom, None, &deep).is_err());
}

#[test]
fn top_level_keys_repeated_in_any_case_are_refused_in_both_paths() {
    let eg = r#""id":"1","subject":"s","eventType":"e","eventTime":"t","dataVersion":"1.0""#;
    for extra in [
        r#""EVENTTYPE":"x""#,
        r#""data":1,"Data":2"#,
        r#""data":1,"data":2"#,
        // Unicode simple folding, as .NET and Go fold: long s, Kelvin sign.
        r#""ſubject":"x""#,
        r#""data":1,"ſ":1,"S":2"#,
        r#""\u0065ventType":"x""#,
    ] {
        for body in [format!("[{{{eg},{extra}}}]"), format!("[{{{extra},{eg}}}]")] {
            let e = run(EventSchema::EventGrid, None, &body).unwrap_err();
            assert!(
                e.to_string().contains("duplicate top-level key"),
                "{body}: {e}"
            );
        }
    }
    // More members than the one-pass compares: the full parse decides, and still refuses.
    let many: String = (0..40).map(|i| format!(r#","k{i}":{i}"#)).collect();
    let body = format!(r#"[{{{eg}{many},"K39":0}}]"#);
    assert!(run(EventSchema::EventGrid, None, &body).is_err());
    let body = format!(r#"[{{{eg}{many}}}]"#);
    assert!(run(EventSchema::EventGrid, None, &body).is_ok());
}

#[test]
fn keys_repeated_in_any_case_inside_data_are_refused_naming_the_path_in_both_paths() {
    let eg = r#""id":"1","subject":"s","eventType":"e","eventTime":"t","dataVersion":"1.0""#;
    let many: String = (0..40).map(|i| format!(r#""k{i}":{i},"#)).collect();
    for (data, later, earlier) in [
        (
            r#"{"make":"Ducati","MAKE":"Evil"}"#,
            "data.MAKE",
            "data.make",
        ),
        (
            r#"{"car":{"make":"D","x":[1],"Make":"E"}}"#,
            "data.car.Make",
            "data.car.make",
        ),
        (
            r#"{"a":{"b":{"c":{"k":1,"K":2}}}}"#,
            "data.a.b.c.K",
            "data.a.b.c.k",
        ),
        (r#"{"ſ":1,"S":2}"#, "data.S", "data.ſ"),
        (r#"{"\u0061":1,"A":2}"#, "data.A", "data.a"),
        (&format!(r#"{{{many}"K39":0}}"#), "data.K39", "data.k39"),
    ] {
        let body = format!(r#"[{{{eg},"data":{data}}}]"#);
        for schema in [EventSchema::EventGrid, EventSchema::Custom] {
            let e = run(schema, None, &body).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "duplicate key '{later}' (also given as '{earlier}')"
                )),
                "{body}: {e}"
            );
        }
        let ce =
            format!(r#"[{{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{data}}}]"#);
        assert!(run(EventSchema::CloudEventV1_0, None, &ce).is_err(), "{ce}");
    }
    // Objects inside arrays are not named by filters: left alone. So are distinct keys.
    for data in [
        r#"{"list":[{"k":1,"K":2}]}"#,
        r#"{"make":"Ducati","model":{"make":"x"}}"#,
        &format!(r#"{{{many}"z":0}}"#),
    ] {
        let body = format!(r#"[{{{eg},"data":{data}}}]"#);
        assert!(
            check_same(EventSchema::EventGrid, &body[1..body.len() - 1]),
            "{data}"
        );
        assert!(run(EventSchema::EventGrid, None, &body).is_ok(), "{data}");
    }
}

#[test]
fn cloud_events_carry_their_traceparent_attribute_only_at_top_level() {
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let ce = |extra: &str| {
        format!(
            r#"{{"specversion":"1.0","id":"1","source":"/s","type":"t"{extra},"data":{{"traceparent":"00-11111111111111111111111111111111-2222222222222222-01"}}}}"#
        )
    };
    let batch = format!(
        "[{},{},{}]",
        ce(&format!(r#","traceparent":"{tp}","tracestate":"a=b""#)),
        ce(""),
        ce(r#","traceparent":"not-a-traceparent""#)
    );
    let evs = run(
        EventSchema::CloudEventV1_0,
        Some("application/cloudevents-batch+json"),
        &batch,
    )
    .unwrap();
    let t = evs[0].trace.as_ref().unwrap();
    assert_eq!(t.traceparent(), tp);
    assert_eq!(t.state.as_deref(), Some("a=b"));
    assert_eq!(evs[1].trace, None, "one inside `data` is not the event's");
    assert_eq!(evs[2].trace, None, "an invalid one is ignored");
    assert!(
        std::str::from_utf8(&evs[0].body).unwrap().contains(tp),
        "the attribute stays"
    );

    // Event Grid's schema defines no trace field: a member of that name is the event's own.
    let eg = format!(
        r#"[{{"id":"1","subject":"s","eventType":"e","eventTime":"t","dataVersion":"1","traceparent":"{tp}","data":{{}}}}]"#
    );
    let evs = run(EventSchema::EventGrid, Some("application/json"), &eg).unwrap();
    assert_eq!(evs[0].trace, None);
}

#[test]
fn binary_mode_ce_traceparent_is_the_events_context() {
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let mut headers = HeaderMap::new();
    for (k, v) in [
        ("ce-specversion", "1.0"),
        ("ce-id", "1"),
        ("ce-source", "/s"),
        ("ce-type", "t"),
        ("ce-traceparent", tp),
        ("content-type", "text/plain"),
    ] {
        headers.insert(k, HeaderValue::from_static(v));
    }
    let body = Bytes::from_static(b"hello");
    let evs = parse(&PublishInput {
        schema: EventSchema::CloudEventV1_0,
        topic: "t1",
        headers: &headers,
        body: &body,
        single_id: None,
        max_events: 100,
    })
    .unwrap();
    let t = evs[0].trace.as_ref().unwrap();
    assert_eq!(t.traceparent(), tp);
    assert!(!t.sampled());
}

/// Parse scenario (a)'s event (the bench's shape, `data` with two members) 20,000 times: run
/// under callgrind to count the instructions of the publish parse (`--ignored`).
#[test]
#[ignore]
fn measure_parse_of_the_bench_event() {
    let body = r#"[{"id":"c1-1","subject":"/bench/1","eventType":"bench.event","eventTime":"2026-01-01T00:00:00Z","dataVersion":"1.0","data":{"bts":1767225600000,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}]"#;
    for _ in 0..20_000 {
        assert_eq!(run(EventSchema::EventGrid, None, body).unwrap().len(), 1);
    }
}
