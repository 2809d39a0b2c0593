//! Settled segments kept for a reader's horizon (`engine/retain.rs`): kept while their newest
//! event is younger than it, read back (settled events included) after a restart, given back
//! once the horizon passes them, not compacted meanwhile, and given back first, counted, when
//! the disk bound needs the space.

use super::engine::Log;
use super::tests::{ev, real_log};
use super::*;
use crate::store::{RetainedEvent, Settled};

/// Events `from..` of `len` bytes for queue 1, one frame each, until the log has `segments`
/// segments; returns the last sequence number.
fn fill(log: &mut Log, from: u64, len: usize, segments: usize) -> u64 {
    let mut seq = from;
    loop {
        log.stage_events(&[(1, ev(seq, len))], 0).unwrap();
        round::commit(log, seq).unwrap();
        if log.segments() >= segments {
            return seq;
        }
        seq += 1;
    }
}

fn retained(log: &Log, since: u64) -> Vec<RetainedEvent> {
    let mut out = Vec::new();
    log.plan_retained(since).run(&mut |e| out.push(e)).unwrap();
    out
}

/// `ev(seq, _)` was accepted at `1000 + seq`.
fn accepted(seq: u64) -> u64 {
    1000 + seq
}

#[test]
fn settled_segments_are_kept_for_the_horizon_read_back_after_a_restart_then_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, lo, known) = real_log(dir.path(), 64 << 10);
    let (mut log, _) = Log::open(fs.clone(), lo.clone(), &known, 1).unwrap();
    log.retain_since(Some(accepted(1)));
    let last = fill(&mut log, 1, 900, 4);
    // Everything is delivered: without the horizon three segments would go.
    log.stage_settle(1, &Settled::all(1..=last, 900));
    round::commit(&mut log, last).unwrap();
    assert_eq!(log.segments(), 4, "kept for the horizon");
    assert!(log.kept_bytes() > 3 * (48 << 10), "{}", log.kept_bytes());
    drop(log);

    // A restart (no checkpoint since the first segments: they are read whole) keeps them as
    // long as the horizon is set again before anything is collected.
    let (mut log, rec) = Log::open(fs.clone(), lo.clone(), &known, 2).unwrap();
    assert!(rec.get(&1).is_none_or(|r| r.is_empty()), "nothing pending");
    log.retain_since(Some(accepted(1)));
    round::commit(&mut log, 3).unwrap();
    assert_eq!(log.segments(), 4);
    // Every event, settled, read back once, in order, with the time it was accepted.
    let all = retained(&log, accepted(1));
    assert_eq!(all.len() as u64, last);
    for (e, seq) in all.iter().zip(1..) {
        assert_eq!((e.seq, e.accepted_ms), (seq, accepted(seq)));
        assert_eq!(e.id, format!("e{seq}"));
        assert_eq!(e.queues, [1]);
        assert_eq!(e.body.len(), 900);
    }
    // From a later time, only what was accepted since.
    let since = accepted(last - 5);
    let tail: Vec<u64> = retained(&log, since).iter().map(|e| e.seq).collect();
    assert_eq!(tail, (last - 5..=last).collect::<Vec<_>>());

    // The horizon passes the oldest segments: they go with the next round.
    assert!(log.retain_since(Some(since)));
    round::commit(&mut log, 4).unwrap();
    assert_eq!(
        log.segments(),
        2,
        "the head and the segment holding `since`"
    );
    assert_eq!(retained(&log, since).len(), 6);
    // Off: nothing is kept past what is pending.
    assert!(log.retain_since(None));
    round::commit(&mut log, 5).unwrap();
    assert_eq!(log.segments(), 1, "the head");
}

#[test]
fn a_kept_segment_is_not_compacted_until_the_horizon_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, lo, known) = real_log(dir.path(), 64 << 10);
    let (mut log, _) = Log::open(fs, lo, &known, 1).unwrap();
    log.retain_since(Some(accepted(1)));
    let last = fill(&mut log, 1, 900, 3);
    // One event in the first segment stays pending: compaction would copy only it and drop
    // the records of the settled ones, which the horizon still needs.
    log.stage_settle(1, &Settled::all(2..=last, 900));
    round::commit(&mut log, last).unwrap();
    assert!(log.plan_compaction(None).is_none(), "kept: not compacted");
    log.retain_since(Some(accepted(last)));
    assert!(
        log.plan_compaction(None).is_some(),
        "past the horizon: compacted"
    );
}

#[test]
fn the_disk_bound_gives_back_the_oldest_kept_segments_first_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, mut lo, known) = real_log(dir.path(), 64 << 10);
    lo.max_disk_bytes = 512 << 10;
    lo.allocate_step = 16 << 10;
    let (mut log, _) = Log::open(fs, lo.clone(), &known, 1).unwrap();
    log.retain_since(Some(accepted(1)));
    // Publish and deliver until the bound is reached by kept segments alone.
    let mut seq = 0;
    let mut first_kept = None;
    loop {
        seq += 1;
        match log.stage_events(&[(1, ev(seq, 900))], 0) {
            Ok(()) => {}
            Err(e) => panic!("refused with segments kept only for the horizon: {e}"),
        }
        round::commit(&mut log, seq).unwrap();
        log.stage_settle(1, &Settled::all([seq], 900));
        round::commit(&mut log, seq).unwrap();
        if log.kept_evicted() > 0 {
            first_kept.get_or_insert(seq);
        }
        if seq > 2 * (lo.max_disk_bytes / 900) {
            break;
        }
    }
    // The bound held, the oldest went first, and each release was counted.
    assert!(log.bytes() <= lo.max_disk_bytes, "{}", log.bytes());
    assert!(log.kept_evicted() >= 4, "{}", log.kept_evicted());
    let oldest = retained(&log, 0).first().map(|e| e.seq).unwrap();
    assert!(oldest > 1, "the oldest events went first");
    let newest: Vec<u64> = retained(&log, 0).iter().map(|e| e.seq).collect();
    assert_eq!(newest.last(), Some(&seq), "the newest are kept");
    assert!(
        newest.windows(2).all(|w| w[1] == w[0] + 1),
        "what is kept is one run up to the newest"
    );
    // Pending events are never given back for the bound: with nothing kept, a publish that
    // does not fit is refused as before.
    log.retain_since(None);
    round::commit(&mut log, seq).unwrap();
    let mut refused = false;
    for s in seq + 1..seq + 1000 {
        if let Err(e) = log.stage_events(&[(1, ev(s, 900))], 0) {
            assert!(matches!(e, StoreError::Full { .. }), "{e}");
            refused = true;
            break;
        }
        round::commit(&mut log, s).unwrap();
    }
    assert!(refused);
}
