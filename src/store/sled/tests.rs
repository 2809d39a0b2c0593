//! Tests of the sled store as a whole: reopen, journal replay, the disk bound, deletes, orphans.

use super::codec::encode_value;
use super::committer::charge_journal;
use super::*;
use crate::store::{RetryState, Store, StoreError, StoredEvent};
use bytes::Bytes;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn opts(dir: &Path, max: u64) -> SledOptions {
    SledOptions {
        metadata_path: dir.join("m"),
        events_path: dir.join("e"),
        max_disk_bytes: max,
        cache_bytes: 4 << 20,
        flush_every_ms: 1000,
        checkpoint_every: CHECKPOINT_EVERY,
    }
}

/// No timed checkpoint during a test: the journal keeps what it was given.
fn opts_untimed(dir: &Path) -> SledOptions {
    SledOptions {
        checkpoint_every: std::time::Duration::from_secs(3600),
        ..opts(dir, 1 << 30)
    }
}

/// A stored event `seq` with a body of `size` bytes.
pub(super) fn ev(seq: u64, size: usize) -> StoredEvent {
    StoredEvent {
        seq,
        id: format!("id{seq}"),
        body: Bytes::from(vec![b'x'; size]),
        state: RetryState {
            attempts: 0,
            first_enqueued_ms: 5,
            due_ms: 0,
        },
    }
}

#[tokio::test]
async fn sled_store_passes_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    crate::store::contract::run(&s).await;
}
#[tokio::test]
async fn everything_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let q;
    {
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        s.put_topic("b", &json!({"name":"b"})).unwrap();
        s.put_topic("a", &json!({"name":"a"})).unwrap();
        q = s.next_queue_id().unwrap();
        s.put_subscription("b", q, &json!({"name":"s"})).unwrap();
        s.append(&[(q, ev(10, 5)), (q, ev(11, 5))]).unwrap();
        s.commit().await.unwrap();
        s.remove(q, &[10]).unwrap();
    }
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    let snap = s.load().unwrap();
    assert_eq!(snap.topics, vec![json!({"name":"b"}), json!({"name":"a"})]);
    assert_eq!(
        snap.subscriptions,
        vec![("b".into(), q, json!({"name":"s"}))]
    );
    assert_eq!(snap.max_seq, 11);
    // The index comes from the scan at open; a write to the queue makes it read afresh.
    s.append(&[(q, ev(12, 5))]).unwrap();
    assert_eq!(
        s.pending_index(q).unwrap(),
        vec![(11, ev(11, 5).state), (12, ev(12, 5).state)]
    );
    s.remove(q, &[12]).unwrap();
    assert_eq!(s.pending(q).unwrap(), vec![ev(11, 5)]);
    assert!(s.next_queue_id().unwrap() > q, "queue ids are not reused");
}

#[tokio::test]
async fn journaled_publishes_are_durable_and_replay_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
    let q;
    let (applied, kept);
    {
        let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
        q = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({"name":"s"})).unwrap();
        s.append_commit(vec![(q, ev(1, 5)), (q, ev(2, 5))])
            .await
            .unwrap();
        // Readable at once (sled holds it), and counted for the disk bound.
        assert_eq!(s.pending(q).unwrap(), vec![ev(1, 5), ev(2, 5)]);
        assert!(s.live_bytes() > 0);
        // Journaled, not yet checkpointed (the checkpoint waits up to 200 ms).
        let (_, recs) = journal::Journal::open(&jpath).unwrap();
        kept = recs;
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].items.len(), 2);
        s.remove(q, &[1]).unwrap();
        applied = kept[0].lsn;
    }
    // A clean close checkpoints and marks the journal empty: the next start reads nothing.
    let (_, recs) = journal::Journal::open(&jpath).unwrap();
    assert!(recs.is_empty());
    // A crash after the checkpoint can leave old records behind (truncation is not synced):
    // they are at or below the applied sequence number and must not resurrect event 1.
    {
        let (mut j, _) = journal::Journal::open(&jpath).unwrap();
        j.append(
            applied,
            kept[0].items.iter().map(|(q, s, v)| (*q, *s, v.as_slice())),
            &[],
        )
        .unwrap();
        // An acknowledged group that sled never got (crash before its checkpoint).
        let v = encode_value(&ev(3, 7));
        j.append(applied + 1, [(q, 3, v.as_slice())].into_iter(), &[])
            .unwrap();
        // An acknowledged event delivered before the crash: its removal rode on the next
        // group and is replayed too (no duplicate).
        let v6 = encode_value(&ev(6, 7));
        j.append(applied + 2, [(q, 6, v6.as_slice())].into_iter(), &[])
            .unwrap();
        j.append(applied + 3, std::iter::empty(), &[(q, 6)])
            .unwrap();
    }
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    assert_eq!(s.pending(q).unwrap(), vec![ev(2, 5), ev(3, 7)]);
    assert_eq!(
        s.load().unwrap().max_seq,
        6,
        "6 was replayed and removed, not reused"
    );
    // The next group continues above the replayed sequence number.
    s.append_commit(vec![(q, ev(4, 5))]).await.unwrap();
    // (Written at the start of the file; the older records behind it are still intact.)
    let (_, recs) = journal::Journal::open(&jpath).unwrap();
    assert_eq!(recs.first().map(|r| r.lsn), Some(applied + 4));
    // A full store refuses a publish before anything is written.
    drop(s);
    let s = SledStore::open(&opts(dir.path(), 100)).unwrap();
    assert!(matches!(
        s.append_commit(vec![(q, ev(5, 5))]).await,
        Err(StoreError::Full { .. })
    ));
    assert_eq!(s.pending(q).unwrap().len(), 3);
}

#[tokio::test]
async fn a_journal_record_larger_than_a_sled_batch_replays_whole() {
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
    let q = {
        let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
        let q = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({"name":"s"})).unwrap();
        q
    };
    // A crash left one acknowledged group of 2.5 sled batches of events, and a second one
    // that settled the first 300 of them (removals crossing a batch boundary too).
    let n = SLED_BATCH as u64 * 5 / 2;
    {
        let (mut j, _) = journal::Journal::open(&jpath).unwrap();
        let values: Vec<(u64, Vec<u8>)> = (1..=n).map(|i| (i, encode_value(&ev(i, 3)))).collect();
        j.append(1, values.iter().map(|(i, v)| (q, *i, v.as_slice())), &[])
            .unwrap();
        let settled: Vec<(QueueId, u64)> = (1..=300).map(|i| (q, i)).collect();
        j.append(2, std::iter::empty(), &settled).unwrap();
    }
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    let seqs: Vec<u64> = s.pending(q).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (301..=n).collect::<Vec<_>>());
    assert_eq!(s.load().unwrap().max_seq, n);
    // Replayed once: a second start finds the same.
    drop(s);
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    assert_eq!(s.pending(q).unwrap().len(), (n - 300) as usize);
}

/// A burst that grows the journal past its preallocated size counts against the disk bound
/// until the checkpoint that cuts the file back. (The journal is driven directly: in a
/// running store the committer checkpoints a grown journal as soon as it can.)
#[test]
fn journal_growth_counts_against_the_disk_bound_until_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut j, _) = journal::Journal::open(&dir.path().join("j")).unwrap();
    let live = AtomicU64::new(1_000);
    let mut charged = 0;
    j.reset();
    let big = vec![b'b'; journal::PREALLOCATED_BYTES as usize + 500_000];
    j.append(1, [(1, 1, big.as_slice())].into_iter(), &[])
        .unwrap();
    charge_journal(&j, &live, &mut charged);
    let excess = j.excess_bytes();
    assert!(excess > 500_000);
    assert_eq!(
        live.load(Ordering::Relaxed),
        1_000 + excess * 10 / SPACE_FACTOR_TENTHS
    );
    // The checkpoint's reset cuts the file back and the charge goes.
    j.reset();
    charge_journal(&j, &live, &mut charged);
    assert_eq!(live.load(Ordering::Relaxed), 1_000);
    assert_eq!(charged, 0);
}

/// A group whose events all belong to a subscription deleted meanwhile still journals the
/// removals noted since the previous record; before, they were dropped with the group, and
/// a crash before the next checkpoint delivered those events again.
#[tokio::test]
async fn removals_ride_a_group_whose_events_were_all_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
    let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
    let q1 = s.next_queue_id().unwrap();
    s.put_subscription("t", q1, &json!({"name":"s1"})).unwrap();
    let q2 = s.next_queue_id().unwrap();
    s.put_subscription("t", q2, &json!({"name":"s2"})).unwrap();
    s.append_commit(vec![(q1, ev(1, 5))]).await.unwrap();
    s.remove(q1, &[1]).unwrap();
    s.delete_subscription(q2).unwrap();
    // Every event of this group belongs to the deleted subscription.
    s.append_commit(vec![(q2, ev(2, 5))]).await.unwrap();
    let (_, recs) = journal::Journal::open(&jpath).unwrap();
    let removed: Vec<_> = recs.iter().flat_map(|r| r.removed.clone()).collect();
    assert_eq!(removed, vec![(q1, 1)], "the removal of q1/1 is journaled");
}

#[tokio::test]
async fn delivered_removals_are_journaled_dropped_ones_wait_for_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let jpath = dir.path().join("e").join(SUBDIR).join("events.journal");
    let s = SledStore::open(&opts_untimed(dir.path())).unwrap();
    let q = s.next_queue_id().unwrap();
    s.put_subscription("t", q, &json!({"name":"s"})).unwrap();
    s.append_commit(vec![(q, ev(1, 5)), (q, ev(2, 5))])
        .await
        .unwrap();
    s.remove(q, &[1]).unwrap();
    // Dead-lettered: its letter is in sled, durable only at the checkpoint; a journaled
    // removal could be replayed without it (neither pending nor a letter).
    s.remove_dropped(q, &[2]).unwrap();
    assert!(s.pending(q).unwrap().is_empty());
    s.append_commit(vec![(q, ev(3, 5))]).await.unwrap();
    let (_, recs) = journal::Journal::open(&jpath).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[1].removed, vec![(q, 1)]);
}

#[tokio::test]
async fn the_index_at_open_matches_the_stored_events() {
    let dir = tempfile::tempdir().unwrap();
    let q;
    {
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        q = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({})).unwrap();
        s.append(&[(q, ev(1, 5)), (q, ev(2, 5)), (q, ev(3, 5))])
            .unwrap();
        s.update(
            q,
            &[2],
            RetryState {
                attempts: 2,
                first_enqueued_ms: 5,
                due_ms: 77,
            },
        )
        .unwrap();
        s.commit().await.unwrap();
    }
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    let idx = s.pending_index(q).unwrap();
    assert_eq!(idx.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(idx[1].1.due_ms, 77);
    assert_eq!(s.pending_index(q).unwrap(), idx, "a second call scans");
    assert_eq!(s.get(q, &[3]).unwrap(), vec![Some(ev(3, 5))]);
}

#[tokio::test]
async fn full_store_refuses_whole_appends_and_recovers_after_removal() {
    let dir = tempfile::tempdir().unwrap();
    // Budget: 2 events of ~1 KiB (live bytes × 2.5 ≤ 6000).
    let s = SledStore::open(&opts(dir.path(), 6000)).unwrap();
    let q = s.next_queue_id().unwrap();
    s.put_subscription("t", q, &json!({})).unwrap();
    s.append(&[(q, ev(1, 1000)), (q, ev(2, 1000))]).unwrap();
    let err = s.append(&[(q, ev(3, 1000))]).unwrap_err();
    assert!(matches!(err, StoreError::Full { .. }), "{err}");
    assert_eq!(
        s.pending(q).unwrap().len(),
        2,
        "nothing of the refused call written"
    );
    s.remove(q, &[1]).unwrap();
    s.append(&[(q, ev(3, 1000))]).unwrap();
    s.delete_subscription(q).unwrap();
    assert_eq!(
        s.live_bytes(),
        0,
        "deleting a subscription frees its events"
    );
}

#[tokio::test]
async fn deleting_a_subscription_removes_more_events_than_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let n = SLED_BATCH as u64 * 3 + 7;
    let (q, other) = {
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        let q = s.next_queue_id().unwrap();
        let other = s.next_queue_id().unwrap();
        s.put_subscription("t", q, &json!({})).unwrap();
        s.put_subscription("t", other, &json!({})).unwrap();
        // Most in sled (a checkpoint at close), the last ones still in the journal's map.
        s.append(&(1..=n).map(|i| (q, ev(i, 10))).collect::<Vec<_>>())
            .unwrap();
        s.append(&[(other, ev(n + 1, 10))]).unwrap();
        s.commit().await.unwrap();
        (q, other)
    };
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    s.append_commit(vec![(q, ev(n + 2, 10))]).await.unwrap();
    assert_eq!(s.pending(q).unwrap().len(), n as usize + 1);
    s.delete_subscription(q).unwrap();
    assert!(s.pending(q).unwrap().is_empty());
    assert_eq!(
        s.pending(other).unwrap().len(),
        1,
        "other queues keep theirs"
    );
    drop(s);
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    assert!(s.pending(q).unwrap().is_empty(), "gone after a restart too");
    assert_eq!(s.pending(other).unwrap().len(), 1);
}

#[tokio::test]
async fn orphan_events_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
        s.append(&[(42, ev(1, 10))]).unwrap();
        s.commit().await.unwrap();
    }
    let s = SledStore::open(&opts(dir.path(), 1 << 30)).unwrap();
    assert!(s.pending(42).unwrap().is_empty());
    assert_eq!(s.live_bytes(), 0);
}

#[tokio::test]
async fn concurrent_commits_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(SledStore::open(&opts(dir.path(), 1 << 30)).unwrap());
    let q = s.next_queue_id().unwrap();
    s.put_subscription("t", q, &json!({})).unwrap();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.append(&[(q, ev(i + 1, 100))]).unwrap();
            s.commit().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let st = s.commit_counters().unwrap();
    assert_eq!(st.commits, 64);
    assert!(st.checkpoints <= 64);
    assert_eq!(s.pending(q).unwrap().len(), 64);
}

#[test]
fn damaged_or_replaced_database_is_an_error_not_an_empty_start() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(&opts(dir.path(), 1 << 30)).unwrap());
    let db_dir = dir.path().join("e").join(SUBDIR).join("events");
    std::fs::remove_dir_all(&db_dir).unwrap();
    std::fs::create_dir_all(&db_dir).unwrap();
    let err = SledStore::open(&opts(dir.path(), 1 << 30))
        .err()
        .expect("refuses to start");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("events"), "{err}");
}
