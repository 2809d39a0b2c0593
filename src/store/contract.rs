//! The contract every store implementation must pass: [`run`] drives a store through topics,
//! subscriptions, publishes, settlements and dead letters; the helpers build the records.

use super::*;
use crate::model::destination::DestinationRecord;
use crate::model::record::RECORD_VERSION;
use crate::model::topic::EventSchema;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the letters kept.
#[derive(Default)]
pub struct CountKept(AtomicUsize);

impl CountKept {
    /// Letters kept so far.
    pub fn kept(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl deadletter::LetterReport for CountKept {
    fn kept(&self, kept: usize, _evicted: usize) {
        self.0.fetch_add(kept, Ordering::SeqCst);
    }
    fn failed(&self, e: &StoreError) {
        panic!("a letter was not kept: {e}");
    }
}

/// Topic `name`'s record.
pub fn topic(name: &str) -> TopicRecord {
    TopicRecord {
        v: RECORD_VERSION,
        name: name.into(),
        input_schema: EventSchema::EventGrid,
        dedup_window_secs: None,
        event_retention_days: None,
    }
}

/// Subscription `name` of topic `t1`'s record (a webhook, every optional part set so a
/// store that drops one fails).
pub fn sub(name: &str) -> SubscriptionRecord {
    let props = |url: &str| {
        let mut m = serde_json::Map::new();
        m.insert("endpointUrl".into(), url.into());
        m
    };
    SubscriptionRecord {
        v: RECORD_VERSION,
        name: name.into(),
        topic: "t1".into(),
        delivery_schema: EventSchema::EventGrid,
        persisted: true,
        retry_policy: Some(crate::model::record::RetryPolicyRecord {
            max_delivery_attempts: Some(3),
            ..Default::default()
        }),
        destination: DestinationRecord {
            endpoint_type: "WebHook".into(),
            properties: props("https://x/hook?code=secret"),
        },
        batching: crate::model::subscription::Batching {
            max_events_per_batch: Some(10),
            ..Default::default()
        },
        filter: Some(serde_json::json!({"subjectBeginsWith": "a"})),
        signing_secrets: vec!["whsec_c2VjcmV0".into()],
        attributes: Vec::new(),
        dead_letter: Some(DestinationRecord {
            endpoint_type: "WebHook".into(),
            properties: props("https://x/dead"),
        }),
        queue: None,
    }
}

/// Event `seq`: a small JSON body, never attempted.
pub fn ev(seq: u64) -> StoredEvent {
    StoredEvent {
        seq,
        id: format!("e{seq}"),
        body: Bytes::from(format!("{{\"n\":{seq}}}")),
        state: RetryState {
            attempts: 0,
            first_enqueued_ms: 1000,
            due_ms: 0,
        },
        trace: None,
    }
}

/// One queue's pending events, bodies included, through the production calls.
pub fn pending(store: &dyn Store, queue: QueueId) -> Vec<StoredEvent> {
    let seqs: Vec<u64> = store
        .pending_runs(queue)
        .unwrap()
        .events()
        .into_iter()
        .map(|(seq, _)| seq)
        .collect();
    store
        .get(queue, &seqs)
        .unwrap()
        .into_iter()
        .flatten()
        .collect()
}

/// Run the whole contract against a store.
pub async fn run(store: &dyn Store) {
    let snap = store.load().unwrap();
    assert!(snap.topics.is_empty() && snap.subscriptions.is_empty());

    store.put_topic("t1", &topic("t1")).unwrap();
    let q = store.next_queue_id().unwrap();
    let q2 = store.next_queue_id().unwrap();
    assert_ne!(q, q2, "queue ids are unique");
    store.put_subscription(q, &sub("s1")).unwrap();
    store.put_subscription(q2, &sub("s2")).unwrap();

    store
        .submit(vec![(q, ev(1)), (q2, ev(1)), (q, ev(2))])
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(pending(store, q), vec![ev(1), ev(2)]);

    let st = RetryState {
        attempts: 2,
        first_enqueued_ms: 1000,
        due_ms: 61_000,
    };
    store.update(q, &[2], st).unwrap();
    store.commit().await.unwrap();
    assert_eq!(pending(store, q)[1].state, st);

    assert_eq!(
        store.pending_runs(q).unwrap().events(),
        vec![(1, ev(1).state), (2, st)]
    );
    let mut two = ev(2);
    two.state = st;
    assert_eq!(
        store.get(q, &[2, 7, 1]).unwrap(),
        vec![Some(two), None, Some(ev(1))]
    );

    assert_eq!(
        store.pending_bytes(q),
        Some((ev(1).body.len() + ev(2).body.len()) as u64)
    );
    store
        .remove(q, &[Settled::new(1, ev(1).body.len())])
        .unwrap();
    store.commit().await.unwrap();
    assert_eq!(pending(store, q).len(), 1);
    assert_eq!(store.pending_bytes(q), Some(ev(2).body.len() as u64));
    assert_eq!(store.get(q, &[1]).unwrap(), vec![None]);

    // A dead-lettered event: its letter kept, then its removal, waited for as a pull
    // rejection waits: the letter there and the event gone once a commit answers.
    let report = std::sync::Arc::new(CountKept::default());
    let letters = Letters {
        letters: vec![deadletter::contract::letter(2)],
        bound: deadletter::DeadLetterBound {
            per_subscription: 10,
            max_bytes: 1 << 20,
        },
        events: Settled::all([2], 0),
        report: report.clone(),
    };
    let kept = store.stage(Writes::Letters(q, letters), Answer::Nobody);
    drop(kept.unwrap());
    store
        .stage(Writes::Staged, Answer::Frame)
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert!(pending(store, q).is_empty());
    assert_eq!(store.get(q, &[2]).unwrap(), vec![None]);
    assert_eq!(report.kept(), 1);
    let letters = store.dead_letters().expect("a store keeps dead letters");
    assert_eq!(letters.list(q, 0, 10).unwrap().len(), 1);

    let snap = store.load().unwrap();
    assert_eq!(snap.topics, vec![topic("t1")]);
    let mut subs = snap.subscriptions.clone();
    subs.sort_by_key(|(q, _)| *q);
    assert_eq!(
        subs,
        vec![(q, sub("s1")), (q2, sub("s2"))],
        "records as put"
    );
    assert!(snap.max_seq >= 2);

    store.delete_subscription(q2).unwrap();
    assert!(pending(store, q2).is_empty());
    assert_eq!(store.load().unwrap().subscriptions.len(), 1);
    store.delete_subscription(q).unwrap();
    store.delete_topic("t1").unwrap();
    let snap = store.load().unwrap();
    assert!(snap.topics.is_empty() && snap.subscriptions.is_empty());
}
