//! Compaction on a real directory: a segment pinned by a few events is replaced by a copy of
//! them, which every kind of restart reads back; segments still worth waiting for are left; the
//! store does it on its own thread.

use super::engine::{Log, LogOptions};
use super::format;
use super::*;
use crate::store::contract::{sub, topic};
use crate::store::fs::{Fs, RealFs};
use crate::store::Settled;
use bytes::Bytes;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn ev(seq: u64) -> StoredEvent {
    StoredEvent {
        seq,
        id: format!("e{seq}"),
        body: Bytes::from(format!("{seq:06}").repeat(160)),
        state: RetryState {
            attempts: 0,
            first_enqueued_ms: 1000 + seq,
            due_ms: 0,
        },
        trace: None,
    }
}

/// Bytes of every [`ev`]'s body.
const SIZE: u32 = 960;

/// What `log` counts pending for queues 1, 2 and 3, in events of [`SIZE`].
fn owed(log: &Log) -> [u64; 3] {
    [1, 2, 3].map(|q| log.pending_bytes(q) / u64::from(SIZE))
}

fn real_opts(dir: &Path) -> LogOptions {
    super::tests::real_opts(dir, 64 << 10)
}

const RETRY: RetryState = RetryState {
    attempts: 3,
    first_enqueued_ms: 1050,
    due_ms: 99_000,
};

/// What queue 2 still owes, with its retry states, read back event by event.
fn check_pinned(log: &Log, pinned: &[u64]) {
    let got = log.plan_get(2, pinned).run().unwrap();
    for (seq, e) in pinned.iter().zip(got) {
        let e = e.unwrap_or_else(|| panic!("pinned event {seq} reads back"));
        assert_eq!(e.body, ev(*seq).body);
        let want = if seq % 100 == 0 { 3 } else { 0 };
        assert_eq!(e.state.attempts, want, "event {seq}");
    }
}

fn check_recovered(rec: &super::engine::Recovered, pinned: &[u64]) {
    assert!(
        rec.get(&1).is_none_or(|r| r.is_empty()),
        "queue 1 owes nothing"
    );
    let q2 = rec[&2].events();
    assert_eq!(q2.iter().map(|(s, _)| *s).collect::<Vec<_>>(), pinned);
    for (seq, st) in q2 {
        if seq % 100 == 0 {
            assert_eq!(st, RETRY, "event {seq}'s retry state");
        }
    }
}

#[test]
fn a_segment_pinned_by_a_few_events_is_replaced_by_their_copy_which_restarts_read() {
    let dir = tempfile::tempdir().unwrap();
    let lo = real_opts(dir.path());
    let known: HashSet<QueueId> = [1, 2, 3].into_iter().collect();
    let fs: Arc<dyn Fs> = Arc::new(RealFs);
    let pinned: Vec<u64> = (1..=600).filter(|s| s % 50 == 0).collect();
    let before;
    {
        let (mut log, _) = Log::open(fs.clone(), lo.clone(), &known, 1).unwrap();
        for seq in 1..=600 {
            // Queue 3 takes the last 40 events and keeps them: more than a quarter of the
            // segment they are in, which is left as it is.
            let mut items = vec![(1, ev(seq)), (2, ev(seq))];
            if seq > 560 {
                items.push((3, ev(seq)));
            }
            log.stage_events(&items, 0).unwrap();
            round::commit(&mut log, seq).unwrap();
        }
        let retried: Vec<u64> = pinned.iter().copied().filter(|s| s % 100 == 0).collect();
        log.stage_retry(2, &retried, RETRY);
        let all: Vec<u64> = (1..=600).collect();
        log.stage_settle(1, &Settled::all(all.iter().copied(), SIZE));
        let rest: Vec<u64> = all.iter().copied().filter(|s| s % 50 != 0).collect();
        log.stage_settle(2, &Settled::all(rest.iter().copied(), SIZE));
        round::commit(&mut log, 700).unwrap();
        assert_eq!(owed(&log), [0, 12, 40], "pending bytes, in events");
        // A checkpoint of the segments as they are now: after the compaction it describes
        // files that were replaced.
        log.checkpoint().unwrap();
        before = log.frame_bytes();
        assert!(log.segments() >= 8, "{} segments", log.segments());
        let mut replaced = 0;
        while log.compact(None, 800).unwrap() {
            replaced += 1;
        }
        assert!(
            replaced + 2 >= log.segments() as u64,
            "{replaced} of {} segments compacted",
            log.segments()
        );
        let after = log.frame_bytes();
        assert!(
            after * 4 < before,
            "frames: {before} bytes before, {after} after"
        );
        check_pinned(&log, &pinned);
        assert_eq!(owed(&log), [0, 12, 40], "compaction keeps the bytes owed");
        // Writing goes on; the copies are settled and given back like any segment.
        log.stage_events(&[(2, ev(601))], 0).unwrap();
        round::commit(&mut log, 900).unwrap();
    }
    // The checkpoint on disk predates the copies: every segment is read.
    let mut with_601 = pinned.clone();
    with_601.push(601);
    let (mut log, rec) = Log::open(fs.clone(), lo.clone(), &known, 1000).unwrap();
    check_recovered(&rec, &with_601);
    check_pinned(&log, &pinned);
    assert_eq!(owed(&log), [0, 13, 40], "every segment read");
    // From a checkpoint taken after the copies.
    log.checkpoint().unwrap();
    drop(log);
    let (mut log, rec) = Log::open(fs.clone(), lo.clone(), &known, 1100).unwrap();
    check_recovered(&rec, &with_601);
    check_pinned(&log, &pinned);
    assert_eq!(owed(&log), [0, 13, 40], "from the checkpoint");
    log.stage_settle(2, &Settled::all(with_601.iter().copied(), SIZE));
    let q3: Vec<u64> = (561..=600).collect();
    log.stage_settle(3, &Settled::all(q3.iter().copied(), SIZE));
    round::commit(&mut log, 1200).unwrap();
    assert_eq!(
        log.segments(),
        1,
        "everything settled: only the head is left"
    );
    assert_eq!(owed(&log), [0, 0, 0]);
}

#[test]
fn an_unfinished_copy_is_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let lo = real_opts(dir.path());
    std::fs::create_dir_all(&lo.dir).unwrap();
    let leftover = lo.dir.join(format!("{}.compact", format::segment_name(1)));
    std::fs::write(&leftover, b"half a copy").unwrap();
    let known: HashSet<QueueId> = [1].into_iter().collect();
    let (_log, _) = Log::open(Arc::new(RealFs), lo, &known, 1).unwrap();
    assert!(!leftover.exists());
}

#[tokio::test]
async fn the_store_compacts_pinned_segments_on_its_own_thread() {
    let dir = tempfile::tempdir().unwrap();
    let o = LogStoreOptions {
        compact_idle_ms: 0,
        refuse_damage: false,
        ..super::tests::opts(dir.path())
    };
    let pinned: Vec<u64> = (1..=600).filter(|s| s % 50 == 0).collect();
    let (q1, q2);
    {
        let s = LogStore::open(&o).unwrap();
        s.put_topic("t", &topic("t")).unwrap();
        q1 = s.next_queue_id().unwrap();
        q2 = s.next_queue_id().unwrap();
        s.put_subscription(q1, &sub("a")).unwrap();
        s.put_subscription(q2, &sub("b")).unwrap();
        for seq in 1..=600 {
            s.submit(vec![(q1, ev(seq)), (q2, ev(seq))])
                .unwrap()
                .wait()
                .await
                .unwrap();
        }
        let before = s.log_bytes();
        let all: Vec<u64> = (1..=600).collect();
        s.remove(q1, &Settled::all(all.iter().copied(), SIZE))
            .unwrap();
        let rest: Vec<u64> = all.iter().copied().filter(|x| x % 50 != 0).collect();
        s.remove(q2, &Settled::all(rest.iter().copied(), SIZE))
            .unwrap();
        // Each round plans at most one compaction; the compactor's swap asks for another.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while s.log_bytes() * 4 > before {
            assert!(
                std::time::Instant::now() < deadline,
                "compactions: {}, bytes {} of {before}",
                s.compactions(),
                s.log_bytes()
            );
            s.commit().await.unwrap();
            tokio::task::yield_now().await;
        }
        assert!(s.compactions() >= 6, "{} compactions", s.compactions());
    }
    let s = LogStore::open(&o).unwrap();
    let owed: Vec<u64> = s
        .pending_index(q2)
        .unwrap()
        .into_iter()
        .map(|(x, _)| x)
        .collect();
    assert_eq!(owed, pinned);
    assert_eq!(
        s.pending_bytes(q2),
        Some(pinned.len() as u64 * u64::from(SIZE)),
        "the copies owe the bytes of the events they hold"
    );
    for (seq, e) in pinned.iter().zip(s.get(q2, &pinned).unwrap()) {
        assert_eq!(e.map(|e| e.body), Some(ev(*seq).body));
    }
}

#[test]
fn a_segment_whose_few_pending_events_hold_most_of_its_bytes_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let lo = real_opts(dir.path());
    let known: HashSet<QueueId> = [1, 2].into_iter().collect();
    let (mut log, _) = Log::open(Arc::new(RealFs), lo, &known, 1).unwrap();
    let small = |seq: u64| StoredEvent {
        body: Bytes::from(vec![b's'; 200]),
        ..ev(seq)
    };
    let mut seq = 0;
    let publish = |log: &mut Log, e: StoredEvent, queues: &[QueueId]| {
        let items: Vec<_> = queues.iter().map(|q| (*q, e.clone())).collect();
        log.stage_events(&items, 0).unwrap();
        round::commit(log, e.seq).unwrap();
    };
    for _ in 0..10 {
        seq += 1;
        publish(&mut log, small(seq), &[1]);
    }
    seq += 1;
    let big = StoredEvent {
        body: Bytes::from(vec![b'B'; 50 << 10]),
        ..ev(seq)
    };
    let big_seq = seq;
    publish(&mut log, big, &[1, 2]);
    while log.segments() < 2 {
        seq += 1;
        publish(&mut log, small(seq), &[1]);
    }
    let all: Vec<u64> = (1..=seq).collect();
    log.stage_settle(1, &Settled::all(all.iter().copied(), 0));
    round::commit(&mut log, seq + 1).unwrap();
    let before = log.frame_bytes();
    assert!(!log.compact(None, seq + 2).unwrap(), "not worth copying");
    assert_eq!(log.compactions(), 0);
    assert_eq!(log.frame_bytes(), before, "the file is as it was");
    // Not weighed again before half of what it owes is settled.
    assert!(!log.compact(None, seq + 3).unwrap());
    let got = log.plan_get(2, &[big_seq]).run().unwrap();
    assert_eq!(got[0].as_ref().map(|e| e.body.len()), Some(50 << 10));
}

/// The segment files of `dir` by number, with their headers.
fn headers(dir: &Path) -> Vec<(PathBuf, format::Header)> {
    let mut out: Vec<(PathBuf, format::Header)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| format::parse_segment_name(&e.file_name().to_string_lossy()).is_some())
        .map(|e| {
            let b = std::fs::read(e.path()).unwrap();
            (e.path(), format::Header::decode(&b).unwrap())
        })
        .collect();
    out.sort_by_key(|(_, h)| h.no);
    out
}

/// The frames of segment file `path`: (offset, payload length, records).
fn frames(path: &Path) -> Vec<(usize, usize, Vec<format::Record>)> {
    let b = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = format::HEADER;
    while let Some(head) = b.get(at..at + format::FRAME_HEAD) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let payload = b.get(at + format::FRAME_HEAD..at + format::FRAME_HEAD + len);
        let Some(records) = payload
            .filter(|_| len > 0)
            .and_then(|p| format::decode_records(&Bytes::copy_from_slice(p)))
        else {
            break;
        };
        out.push((at, len, records));
        at += format::FRAME_HEAD + len;
    }
    out
}

/// The events segment file `path` holds.
fn events_in(path: &Path) -> Vec<u64> {
    frames(path)
        .into_iter()
        .flat_map(|(_, _, r)| r)
        .filter_map(|r| match r {
            format::Record::Event { seq, .. } => Some(seq),
            _ => None,
        })
        .collect()
}

/// Where the first frame whose records `want` picks out lies: (file, offset, payload length).
fn frame_where(dir: &Path, want: impl Fn(&format::Record) -> bool) -> (PathBuf, usize, usize) {
    headers(dir)
        .into_iter()
        .find_map(|(path, _)| {
            let (at, len, _) = frames(&path)
                .into_iter()
                .find(|(_, _, r)| r.iter().any(&want))?;
            Some((path, at, len))
        })
        .expect("such a frame")
}

/// Crashsim damage seeds 16,562 and 56,821, step by step on a real directory: a restatement of
/// segment 1 (written when segment 2 was deleted), then most of segment 1 settled, then segment
/// 1 compacted. The settle record is damaged, and the start reads every segment (the checkpoint
/// names the file the copy replaced). The restatement lists events settled before the copy was
/// made: they must not be pending again (the copy does not hold them: unreadable, and their
/// bytes in no count), only what the copy holds.
#[test]
fn a_restatement_older_than_a_compaction_lists_nothing_the_copy_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let lo = real_opts(dir.path());
    let known: HashSet<QueueId> = [2].into_iter().collect();
    let fs: Arc<dyn Fs> = Arc::new(RealFs);
    let (mut log, _) = Log::open(fs.clone(), lo.clone(), &known, 1).unwrap();
    let mut seq = 0;
    let mut early = false;
    while log.segments() < 4 {
        seq += 1;
        log.stage_events(&[(2, ev(seq))], 0).unwrap();
        if log.segments() == 2 && !early {
            // Event 3 (of segment 1) settled in a frame of segment 2: segment 2 speaks of
            // segment 1, so its deletion restates it.
            log.stage_settle(2, &Settled::all([3], SIZE));
            early = true;
        }
        round::commit(&mut log, seq).unwrap();
    }
    let segs = headers(&lo.dir);
    let (one, two) = (segs[0].1, segs[1].1);
    let in_one = events_in(&segs[0].0);
    let in_two = events_in(&segs[1].0);
    let later = in_two.last().copied().unwrap() + 1;
    // Segment 2 delivered: its deletion restates segment 1, all of it pending but event 3.
    log.stage_settle(2, &Settled::all(in_two.iter().copied(), SIZE));
    round::commit(&mut log, 1_000).unwrap();
    round::commit(&mut log, 1_001).unwrap();
    assert!(
        headers(&lo.dir).iter().all(|(_, h)| h.no != two.no),
        "segment 2 deleted"
    );
    // Then most of segment 1 delivered, and one more event written after that.
    // The first is kept: the copy starts where the segment did, so the restatement names it.
    let keep = |s: &u64| *s == in_one[0] || s.is_multiple_of(10);
    let kept: Vec<u64> = in_one.iter().copied().filter(keep).collect();
    let done: Vec<u64> = in_one.iter().copied().filter(|s| !keep(s)).collect();
    log.stage_settle(2, &Settled::all(done.iter().copied(), SIZE));
    round::commit(&mut log, 1_002).unwrap();
    seq += 1;
    log.stage_events(&[(2, ev(seq))], 0).unwrap();
    round::commit(&mut log, 1_003).unwrap();
    // Segment 1 compacted: the copy holds the events kept, under a new salt.
    assert!(log.compact(Some(one.no), 1_004).unwrap());
    assert_ne!(headers(&lo.dir)[0].1.salt, one.salt, "segment 1 is a copy");
    // A crash: no checkpoint of the copy. Then the settle record of segment 1's events is
    // damaged (a flipped byte in its frame).
    drop(log);
    let restated = frame_where(
        &lo.dir,
        |r| matches!(r, format::Record::State { segment, .. } if *segment == one.no),
    );
    let (path, at, len) = frame_where(
        &lo.dir,
        |r| matches!(r, format::Record::Settle { seqs, .. } if seqs.contains(&done[0])),
    );
    assert!(
        restated.0 != path || restated.1 < at,
        "the restatement comes first"
    );
    let mut b = std::fs::read(&path).unwrap();
    b[at + format::FRAME_HEAD + len / 2] ^= 0x40;
    std::fs::write(&path, b).unwrap();

    let (log, rec) = Log::open(fs, lo, &known, 2_000).unwrap();
    assert!(!log.damage().losses.is_empty(), "the damage is reported");
    let want: Vec<u64> = kept.iter().copied().chain(later..=seq).collect();
    let listed: Vec<u64> = rec[&2].events().iter().map(|(s, _)| *s).collect();
    assert_eq!(listed, want, "what the copy holds, and the later segments");
    assert_eq!(log.pending_bytes(2), want.len() as u64 * u64::from(SIZE));
    let got = log.plan_get(2, &listed).run().unwrap();
    assert!(got.iter().all(Option::is_some), "every pending event reads");
}
