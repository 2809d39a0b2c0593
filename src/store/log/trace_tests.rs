//! An event's trace context in the log (record kind 6): written only for events that have one,
//! read back from the tail and from the disk, and kept across a restart.

use super::format::{decode_records, Record};
use super::*;
use crate::telemetry::TraceContext;
use bytes::Bytes;

fn ctx(state: Option<&str>) -> Arc<TraceContext> {
    Arc::new(
        TraceContext::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            state,
        )
        .unwrap(),
    )
}

fn ev(seq: u64, trace: Option<Arc<TraceContext>>) -> StoredEvent {
    StoredEvent {
        trace,
        ..crate::store::contract::ev(seq)
    }
}

fn record(trace: Option<Arc<TraceContext>>) -> Record {
    Record::Event {
        seq: 7,
        first_ms: 1000,
        queues: vec![1, 2],
        id: "e7".into(),
        body: Bytes::from_static(b"{\"a\":1}"),
        trace,
    }
}

#[test]
fn an_event_without_a_context_is_the_same_record_as_before_and_one_with_it_reads_back() {
    let mut plain = Vec::new();
    record(None).encode(&mut plain);
    assert_eq!(
        plain[0], 1,
        "kind 1: the bytes of the format before trace contexts"
    );
    assert_eq!(plain.len(), Record::event_len(2, 2, 7));
    for state in [None, Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")] {
        let mut traced = Vec::new();
        record(Some(ctx(state))).encode(&mut traced);
        assert_eq!(traced[0], 6);
        assert_eq!(
            traced.len(),
            Record::event_len(2, 2, 7) + Record::trace_len(Some(&ctx(state)))
        );
        assert_eq!(
            &traced[1..plain.len()],
            &plain[1..],
            "kind 6 is kind 1 plus the context"
        );
        let both: Vec<u8> = [traced.as_slice(), plain.as_slice()].concat();
        assert_eq!(
            decode_records(&Bytes::from(both)).unwrap(),
            vec![record(Some(ctx(state))), record(None)]
        );
        // Cut anywhere inside the context: not a record.
        for cut in plain.len()..traced.len() {
            assert_eq!(decode_records(&Bytes::from(traced[..cut].to_vec())), None);
        }
    }
}

#[tokio::test]
async fn an_events_trace_context_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogStoreOptions {
        metadata_path: dir.path().join("m"),
        events_path: dir.path().join("e"),
        max_disk_bytes: 1 << 30,
        cache_bytes: 4 << 20,
        flush_every_ms: 1000,
        segment_bytes: 64 << 10,
        compact_idle_ms: crate::store::log::engine::COMPACT_IDLE_MS,
        refuse_damage: false,
    };
    let q = {
        let s = LogStore::open(&o).unwrap();
        s.put_topic("t", &crate::store::contract::topic("t"))
            .unwrap();
        let q = s.next_queue_id().unwrap();
        s.put_subscription(q, &crate::store::contract::sub("a"))
            .unwrap();
        s.submit(vec![(q, ev(1, Some(ctx(Some("k=v"))))), (q, ev(2, None))])
            .unwrap()
            .wait()
            .await
            .unwrap();
        // From the tail of recent bodies.
        let got = s.get(q, &[1, 2]).unwrap();
        assert_eq!(got[0].as_ref().unwrap().trace, Some(ctx(Some("k=v"))));
        assert_eq!(got[1].as_ref().unwrap().trace, None);
        q
    };
    // From the disk.
    let s = LogStore::open(&o).unwrap();
    let got = s.get(q, &[1, 2]).unwrap();
    assert_eq!(got[0].as_ref().unwrap().trace, Some(ctx(Some("k=v"))));
    assert_eq!(got[1].as_ref().unwrap().trace, None);
    assert_eq!(
        s.pending(q).unwrap(),
        vec![ev(1, Some(ctx(Some("k=v")))), ev(2, None)]
    );
}
