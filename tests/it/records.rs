//! Metadata records (issue 23, item 3): topics and subscriptions are stored as typed, versioned
//! records and read back without the API parser or the settings: a setting changed since a
//! subscription was created neither rejects nor alters it, and metadata of another format is
//! one clear start-up error.

use crate::node::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_outlives_a_tightened_setting_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(
        dir.path(),
        &[("api__deliveryPolicyLimits__maxEventsPerBatch", "100")],
        None,
    )
    .await;
    assert_eq!(n.put("/topics/t1", json!({})).await.0, 200);
    let body = json!({"properties": {
        "destination": {"endpointType": "WebHook", "properties": {
            "endpointUrl": "http://127.0.0.1:9/hook", "maxEventsPerBatch": 80}},
        "persistencePolicy": {"isPersisted": true},
        "retryPolicy": {"maxDeliveryAttempts": 5}}});
    let (s, b) = n
        .put("/topics/t1/eventSubscriptions/s1", body.clone())
        .await;
    assert_eq!(s, 200, "{b}");
    let before = n.get("/topics/t1/eventSubscriptions/s1").await;
    n.stop().await;

    // The limit is back to its default (50) and plain-HTTP webhooks are refused now: a new PUT
    // of the same body fails, the stored subscription is restored as it was.
    let strict = [("outbound__webhook__httpsOnly", "true")];
    let n = node(dir.path(), &strict, None).await;
    assert_eq!(n.get("/topics/t1/eventSubscriptions/s1").await, before);
    let props = &before["properties"]["destination"]["properties"];
    assert_eq!(props["maxEventsPerBatch"], 80);
    assert_eq!(
        before["properties"]["retryPolicy"]["maxDeliveryAttempts"],
        5
    );
    let (s, _) = n.put("/topics/t1/eventSubscriptions/s2", body).await;
    assert_eq!(s, 400, "the settings in force apply to new subscriptions");
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_of_the_earlier_format_is_one_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        // What builds before typed records wrote, in the sled database of earlier releases: the
        // subscription's API JSON. The start migrates sled's records, and refuses this one.
        let root = dir.path().join("metadataDb").join("gridlet-v1");
        let db = gridlet::store::sled::open_db(&root, "meta", 1 << 20, 0).unwrap();
        let subs = db.open_tree("subs").unwrap();
        let old = json!({"topic": "t1", "record": {"name": "s1", "properties": {
            "destination": {"endpointType": "WebHook", "properties": {"endpointUrl": "http://x/"}}}}});
        subs.insert(1u32.to_be_bytes(), old.to_string().as_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let e = start_err(dir.path()).await;
    eprintln!("start-up error: {e}");
    assert!(e.contains("gridlet-v1/meta"), "names the database: {e}");
    assert!(e.contains("subscription 1"), "names the record: {e}");
    assert!(e.contains("earlier development format"), "{e}");
    assert!(
        e.contains("move the metadata directory aside"),
        "says what to do: {e}"
    );
    assert!(
        dir.path().join("metadataDb/gridlet-v1/meta").is_dir(),
        "the database is left where it was"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_another_version_in_the_metadata_file_is_one_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let n = node(dir.path(), &[], None).await;
    assert_eq!(n.put("/topics/t1", json!({})).await.0, 200);
    n.stop().await;
    let file = dir.path().join("metadataDb/gridlet-v2/meta.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    v["topics"][0][1]["v"] = 2.into();
    std::fs::write(&file, v.to_string()).unwrap();
    let e = start_err(dir.path()).await;
    assert!(e.contains("gridlet-v2/meta.json"), "names the file: {e}");
    assert!(e.contains("topic 't1'") && e.contains("version 2"), "{e}");
}

async fn start_err(dir: &std::path::Path) -> String {
    match try_node(dir, &[], None).await {
        Ok(n) => {
            n.stop().await;
            panic!("started on metadata this build does not read");
        }
        Err(e) => e.to_string(),
    }
}
