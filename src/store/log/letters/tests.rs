//! Unit tests of the dead-letter log (the power-cut simulation is `sim.rs`).

use super::*;
use crate::store::deadletter::DropReason;
use crate::store::fs::RealFs;
use crate::store::log::{LogStore, LogStoreOptions};
use crate::store::Store;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};

fn open(dir: &Path, seg: u64, max_disk: u64, log_bytes: Arc<AtomicU64>) -> LogLetters {
    let known: HashSet<QueueId> = (1..=3).collect();
    LogLetters::open(
        Arc::new(RealFs),
        LetterOptions {
            dir: dir.join("dl"),
            segment_bytes: seg,
            max_disk_bytes: max_disk,
            refuse_damage: false,
        },
        &known,
        Box::new(move || log_bytes.load(Ordering::Relaxed)),
    )
    .unwrap()
}

fn letter(seq: u64, body: usize) -> DeadLetter {
    DeadLetter {
        id: 0,
        seq,
        event_id: format!("e{seq}"),
        body: Bytes::from(vec![b'a' + (seq % 26) as u8; body]),
        reason: DropReason::MaxDeliveryAttemptsExceeded,
        last_status: Some(503),
        last_error: Some("HTTP 503".into()),
        attempts: 30,
        first_enqueued_ms: 5,
        dead_lettered_ms: 6,
    }
}

const MANY: DeadLetterBound = DeadLetterBound {
    per_subscription: 100_000,
    max_bytes: u64::MAX,
};

#[test]
fn the_letter_log_passes_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(dir.path(), SEGMENT_BYTES, 1 << 30, Arc::default());
    crate::store::deadletter::contract::run(&d);
    let dir = tempfile::tempdir().unwrap();
    let d = open(dir.path(), SEGMENT_BYTES, 1 << 30, Arc::default());
    crate::store::deadletter::contract::byte_bound(&d);
}

/// Churn through small segments: the files stay within twice the live letters plus a segment
/// (plus one frame), and what is live reads back the same after a reopen.
#[test]
fn compaction_keeps_the_files_near_the_live_letters() {
    let dir = tempfile::tempdir().unwrap();
    let seg = 16 << 10;
    let mut kept: Vec<(QueueId, DeadLetter)> = Vec::new();
    {
        let d = open(dir.path(), seg, 1 << 30, Arc::default());
        for i in 0..2_000u64 {
            let q = 1 + (i % 3) as QueueId;
            d.put(q, letter(i, (i as usize * 37) % 900), MANY).unwrap();
            if i % 4 != 0 {
                // Replay (take) three letters of every four, the newest of its queue.
                let newest = d.list(q, 0, 10_000).unwrap().last().unwrap().id;
                d.take(q, Some(&[newest])).unwrap();
            }
            let files = d.disk_bytes();
            let limit = 2 * d.bytes() + seg + 2048;
            assert!(
                files <= limit,
                "step {i}: {files} bytes of files for {} live",
                d.bytes()
            );
        }
        for q in 1..=3 {
            for l in d.list(q, 0, 10_000).unwrap() {
                kept.push((q, l));
            }
        }
        assert_eq!(kept.len(), 500);
        assert!(
            d.segments() as u64 <= (2 * d.bytes() + seg) / seg + 2,
            "{} segments",
            d.segments()
        );
    }
    let d = open(dir.path(), seg, 1 << 30, Arc::default());
    let mut again = Vec::new();
    for q in 1..=3 {
        for l in d.list(q, 0, 10_000).unwrap() {
            again.push((q, l));
        }
    }
    assert_eq!(
        again, kept,
        "the same letters, ids and bodies after a reopen"
    );
    let next = letter(9_999, 10);
    d.put(1, next, MANY).unwrap();
    let max_before = kept.iter().map(|(_, l)| l.id).max().unwrap();
    assert!(d.list(1, max_before, 10).unwrap()[0].id > max_before);
}

/// Letters keep within half of what the event log leaves of the disk bound: with the log
/// holding 600 KiB of a 1 MiB bound, 200 KiB of letters at most; a letter that cannot fit even
/// alone is not kept.
#[test]
fn letters_share_the_disk_bound_with_the_event_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AtomicU64::new(600 << 10));
    let d = open(dir.path(), 64 << 10, 1 << 20, log.clone());
    let mut evicted = 0;
    for i in 0..100 {
        evicted += d.put(1, letter(i, 10_000), MANY).unwrap();
    }
    assert!(d.bytes() <= 212_992, "{}", d.bytes());
    assert!(d.bytes() > 180_000, "{}", d.bytes());
    assert_eq!(evicted, 100 - d.count(1));
    assert!(d.disk_bytes() <= (1 << 20) - (600 << 10) + (64 << 10) + 11_000);
    // The log grows to the bound: the next letter has no room at all.
    log.store(1 << 20, Ordering::Relaxed);
    assert_eq!(d.put(1, letter(200, 10), MANY).unwrap(), 1);
}

#[test]
fn letters_of_deleted_subscriptions_go_and_ids_continue_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        metadata_path: dir.path().join("m"),
        events_path: dir.path().join("e"),
        max_disk_bytes: 1 << 30,
        cache_bytes: 4 << 20,
        flush_every_ms: 1000,
        segment_bytes: crate::store::log::SEGMENT_BYTES,
        compact_idle_ms: crate::store::log::engine::COMPACT_IDLE_MS,
        refuse_damage: false,
    };
    let ten = DeadLetterBound {
        per_subscription: 10,
        max_bytes: u64::MAX,
    };
    let last;
    {
        let s = LogStore::open(&opts).unwrap();
        for _ in 0..3 {
            let q = s.next_queue_id().unwrap();
            s.put_subscription(q, &crate::store::contract::sub(&format!("s{q}")))
                .unwrap();
        }
        let d = s.dead_letters().unwrap();
        d.put(1, letter(1, 10), ten).unwrap();
        d.put(2, letter(2, 10), ten).unwrap();
        d.put(3, letter(3, 10), ten).unwrap();
        d.take(3, None).unwrap();
        last = d.list(2, 0, 10).unwrap()[0].id;
        d.sync().unwrap();
        assert!(s.letter_disk_bytes() > 0);
        assert!(s.size_on_disk() >= s.letter_disk_bytes());
        s.delete_subscription(2).unwrap();
        // A late put for the deleted subscription leaves nothing behind.
        assert_eq!(d.put(2, letter(9, 10), ten).unwrap(), 1);
        assert_eq!(d.count(2), 0);
    }
    let s = LogStore::open(&opts).unwrap();
    let d = s.dead_letters().unwrap();
    assert_eq!((d.count(1), d.count(2), d.count(3)), (1, 0, 0));
    assert_eq!(
        d.list(1, 0, 10).unwrap()[0].last_error.as_deref(),
        Some("HTTP 503")
    );
    d.put(3, letter(4, 10), ten).unwrap();
    assert!(d.list(3, 0, 10).unwrap()[0].id > last + 1);
}

#[test]
fn dead_letters_of_the_earlier_sled_format_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LogStoreOptions {
        metadata_path: dir.path().join("m"),
        events_path: dir.path().join("e"),
        max_disk_bytes: 1 << 30,
        cache_bytes: 4 << 20,
        flush_every_ms: 1000,
        segment_bytes: crate::store::log::SEGMENT_BYTES,
        compact_idle_ms: crate::store::log::engine::COMPACT_IDLE_MS,
        refuse_damage: false,
    };
    let old = opts.events_path.join("gridlet-v2/letters");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("conf"), b"x").unwrap();
    let err = LogStore::open(&opts).err().unwrap().to_string();
    assert!(err.contains("dead letters of an earlier"), "{err}");
    assert!(err.contains("delete"), "{err}");
}

#[test]
fn a_torn_letter_is_cut_and_writing_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = open(dir.path(), SEGMENT_BYTES, 1 << 30, Arc::default());
        d.put(1, letter(1, 100), MANY).unwrap();
        d.put(1, letter(2, 100), MANY).unwrap();
        d.sync().unwrap();
        // A crash: no clean stop (which records that the frames were synced).
        std::mem::forget(d);
    }
    let file = dir.path().join("dl").join(seg_name(1));
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 7).unwrap();
    let d = open(dir.path(), SEGMENT_BYTES, 1 << 30, Arc::default());
    assert_eq!(
        d.count(1),
        1,
        "the torn letter is not there; the whole one is"
    );
    d.put(1, letter(3, 100), MANY).unwrap();
    d.sync().unwrap();
    drop(d);
    let d = open(dir.path(), SEGMENT_BYTES, 1 << 30, Arc::default());
    let seqs: Vec<u64> = d.list(1, 0, 10).unwrap().iter().map(|l| l.seq).collect();
    assert_eq!(seqs, vec![1, 3]);
}

/// 20 letters (a sync every 5), a clean stop, then one byte of the frame of letter
/// `victim + 1` flipped: answers the file.
fn fill_and_flip(dir: &Path, victim: usize) -> PathBuf {
    {
        let d = open(dir, SEGMENT_BYTES, 1 << 30, Arc::default());
        for seq in 1..=20 {
            d.put(1, letter(seq, 100), MANY).unwrap();
            if seq % 5 == 0 {
                d.sync().unwrap();
            }
        }
    }
    let file = dir.join("dl").join(seg_name(1));
    let mut bytes = std::fs::read(&file).unwrap();
    // Frames in order; the letter's frame is the one whose body is its own letter's.
    let mut at = HEADER;
    let mut frames = Vec::new();
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        frames.push(at);
        at += 8 + len;
    }
    assert_eq!(frames.len(), 21, "20 letters and the clean stop's record");
    bytes[frames[victim] + 40] ^= 0x5a;
    std::fs::write(&file, bytes).unwrap();
    file
}

fn damaged(dir: &Path, victim: usize) -> (LogLetters, PathBuf) {
    let file = fill_and_flip(dir, victim);
    (open(dir, SEGMENT_BYTES, 1 << 30, Arc::default()), file)
}

#[test]
fn a_damaged_letter_in_the_newest_segment_loses_that_letter_only_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (d, file) = damaged(dir.path(), 7);
    let seqs: Vec<u64> = d.list(1, 0, 100).unwrap().iter().map(|l| l.seq).collect();
    let want: Vec<u64> = (1..=20).filter(|s| *s != 8).collect();
    assert_eq!(seqs, want, "the letters after it are recovered");
    let dmg = d.damage();
    assert_eq!(dmg.losses.len(), 1, "{dmg:?}");
    assert_eq!(dmg.losses[0].file, file);
    assert_eq!((dmg.events(), dmg.losses[0].counted), (1, true));
    assert_eq!(dmg.quarantined.len(), 1, "a copy is kept first");
    // Writing goes on after the damaged span; the next open finds the same damage only.
    d.put(1, letter(21, 100), MANY).unwrap();
    drop(d);
    let d = open(dir.path(), SEGMENT_BYTES, 1 << 30, Arc::default());
    assert_eq!(d.count(1), 20);
    assert_eq!(d.damage().losses.len(), 1);
}

#[test]
fn after_a_clean_stop_damage_to_the_last_letter_is_no_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = damaged(dir.path(), 19);
    assert_eq!(d.count(1), 19);
    assert_eq!(
        d.damage().losses.len(),
        1,
        "reported, not cut as a torn write"
    );
}

#[test]
fn on_damage_refuse_stops_the_open_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = fill_and_flip(dir.path(), 3);
    let before = std::fs::read(&file).unwrap();
    let known: HashSet<QueueId> = (1..=3).collect();
    let r = LogLetters::open(
        Arc::new(RealFs),
        LetterOptions {
            dir: dir.path().join("dl"),
            segment_bytes: SEGMENT_BYTES,
            max_disk_bytes: 1 << 30,
            refuse_damage: true,
        },
        &known,
        Box::new(|| 0),
    );
    let err = r.err().expect("refused").to_string();
    assert!(
        err.contains(&seg_name(1)) && err.contains("onDamage=refuse"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), before, "nothing changed");
    assert!(!dir
        .path()
        .join(crate::store::log::engine::QUARANTINE)
        .exists());
}
