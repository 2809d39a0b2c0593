//! Unit tests of `deadletters`.

use super::*;
use crate::store::log::{LogStore as SledStore, LogStoreOptions as SledOptions};
use crate::store::Store;
use std::path::Path;

fn opts(dir: &Path) -> SledOptions {
    SledOptions {
        metadata_path: dir.join("m"),
        events_path: dir.join("e"),
        max_disk_bytes: 1 << 30,
        cache_bytes: 4 << 20,
        flush_every_ms: 1000,
        segment_bytes: crate::store::log::SEGMENT_BYTES,
    }
}

const TEN: DeadLetterBound = DeadLetterBound {
    per_subscription: 10,
    max_bytes: u64::MAX,
};

fn letter(seq: u64, err: Option<&str>) -> DeadLetter {
    DeadLetter {
        id: 0,
        seq,
        event_id: format!("e{seq}"),
        body: Bytes::from(format!("{{\"n\":{seq}}}")),
        reason: DropReason::DeliveryRefused,
        last_status: err.map(|_| 400),
        last_error: err.map(str::to_string),
        attempts: 2,
        first_enqueued_ms: 10,
        dead_lettered_ms: 20,
    }
}

/// A store whose queues 1, 2 and 3 belong to subscriptions (orphans are removed at open).
fn with_queues(dir: &Path) -> SledStore {
    let s = SledStore::open(&opts(dir)).unwrap();
    for _ in 0..3 {
        let q = s.next_queue_id().unwrap();
        s.put_subscription(q, &crate::store::contract::sub("s"))
            .unwrap();
    }
    s
}

#[test]
fn sled_dead_letters_pass_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let s = with_queues(dir.path());
    crate::store::deadletter::contract::run(s.dead_letters().unwrap().as_ref());
    assert_eq!(s.live_bytes(), 0, "every letter's bytes given back");
    let dir = tempfile::tempdir().unwrap();
    let s = with_queues(dir.path());
    crate::store::deadletter::contract::byte_bound(s.dead_letters().unwrap().as_ref());
    assert_eq!(s.live_bytes(), 0, "evicted letters' bytes given back");
}

/// The byte bound's counts are rebuilt at open: after a restart the same letters count,
/// and the next put evicts as if the store had never closed.
#[test]
fn letter_bytes_are_recounted_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let b = DeadLetterBound {
        per_subscription: 100,
        max_bytes: 1000,
    };
    let (bytes, live) = {
        let s = with_queues(dir.path());
        let d = s.dead_letters().unwrap();
        for i in 1..=20 {
            d.put(1 + (i % 2) as u32, letter(i, Some("HTTP 500")), b)
                .unwrap();
        }
        assert!(d.bytes() <= 1000 && d.bytes() > 800, "{}", d.bytes());
        (d.bytes(), s.live_bytes())
    };
    let s = SledStore::open(&opts(dir.path())).unwrap();
    let d = s.dead_letters().unwrap();
    assert_eq!((d.bytes(), s.live_bytes()), (bytes, live));
    let before = d.count(1) + d.count(2);
    assert_eq!(d.put(2, letter(21, Some("HTTP 500")), b).unwrap(), 1);
    assert_eq!(d.count(1) + d.count(2), before);
    let listed: u64 = [1, 2]
        .iter()
        .flat_map(|q| d.list(*q, 0, 100).unwrap())
        .map(|l| l.size())
        .sum();
    assert_eq!(d.bytes(), listed);
    assert!(d.bytes() <= 1000);
    // Same number of letters: the live bytes moved exactly as the letter bytes did.
    assert_eq!(s.live_bytes() - d.bytes(), live - bytes);
}

#[test]
fn values_round_trip() {
    for l in [letter(7, Some("HTTP 400")), letter(8, None)] {
        let mut want = l.clone();
        want.id = 5;
        assert_eq!(decode(5, &encode(&l)), Some(want));
    }
    assert_eq!(decode(1, b"\x02junk"), None);
    for l in [letter(7, Some("HTTP 400")), letter(8, None)] {
        assert_eq!(
            stored_size(&encode(&l)),
            l.size(),
            "sizes agree without decoding"
        );
    }
    assert_eq!(decode(1, &encode(&letter(1, None))[..20]), None);
}

#[test]
fn letters_and_ids_survive_reopen_and_orphans_go() {
    let dir = tempfile::tempdir().unwrap();
    let last;
    {
        let s = with_queues(dir.path());
        let d = s.dead_letters().unwrap();
        d.put(1, letter(1, Some("HTTP 500")), TEN).unwrap();
        d.put(2, letter(2, None), TEN).unwrap();
        let gone = d.put(3, letter(3, None), TEN).unwrap();
        assert_eq!(gone, 0);
        d.take(3, None).unwrap();
        last = d.list(2, 0, 10).unwrap()[0].id;
        s.delete_subscription(2).unwrap(); // record gone, letters left behind (a crash)
    }
    let s = SledStore::open(&opts(dir.path())).unwrap();
    let d = s.dead_letters().unwrap();
    let kept = d.list(1, 0, 10).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(d.count(1), 1);
    assert_eq!(d.count(2), 0, "orphan letters removed at open");
    assert!(d.list(2, 0, 10).unwrap().is_empty());
    d.put(3, letter(4, None), TEN).unwrap();
    let id = d.list(3, 0, 10).unwrap()[0].id;
    assert!(id > last + 1, "ids continue above every id ever used: {id}");
    let before = s.live_bytes();
    assert!(before > 0, "letters count in the live bytes");
    d.delete_queue(1).unwrap();
    assert!(s.live_bytes() < before);
    d.delete_queue(3).unwrap();
    assert_eq!(s.live_bytes(), 0);
    // A late put for a deleted subscription (its task still settling) leaves nothing behind.
    d.put(3, letter(5, None), TEN).unwrap();
    assert_eq!((d.count(3), s.live_bytes()), (0, 0));
}
