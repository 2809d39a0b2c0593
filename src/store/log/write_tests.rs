//! How frames reach the disk, on real directories and the simulated disk: the head's partial
//! block rewritten, small writes by sectors and large ones by blocks, reserved blocks after a
//! closed segment's frames, and the spare segment a full head rolls into.

use super::engine::{Log, LogOptions};
use super::tests::{ev, fill_real_log, real_log};
use super::*;
use crate::store::fs::sim::SimFs;
use crate::store::Settled;
use std::collections::HashSet;

#[test]
fn small_frames_rewrite_the_partial_block_and_read_back_after_a_restart() {
    // Many frames far smaller than a block: each write starts at the head's partial block.
    let dir = tempfile::tempdir().unwrap();
    let (fs, lo, known) = real_log(dir.path(), 64 << 10);
    {
        let (mut log, _) = Log::open(fs.clone(), lo.clone(), &known, 1).unwrap();
        for seq in 1..=400 {
            log.stage_events(&[(1, ev(seq, 1 + (seq as usize * 37) % 700))], 0)
                .unwrap();
            round::commit(&mut log, seq).unwrap();
        }
        assert!(log.segments() >= 2, "rolled over: {}", log.segments());
        // Closed segments keep no reserved blocks; the head keeps at most one step.
        let disk = log.disk_bytes();
        assert!(
            disk <= log.frame_bytes() + super::engine::ALLOCATE_STEP + 4096 * log.segments() as u64,
            "disk {disk}, frames {}",
            log.frame_bytes()
        );
    }
    let (mut log, rec) = Log::open(fs.clone(), lo.clone(), &known, 2).unwrap();
    assert_eq!(rec[&1].len(), 400);
    let seqs: Vec<u64> = (1..=400).collect();
    let got = log.plan_get(1, &seqs).run().unwrap();
    for (seq, e) in seqs.iter().zip(got) {
        let e = e.unwrap_or_else(|| panic!("event {seq} reads back"));
        assert_eq!(e.body.len(), 1 + (*seq as usize * 37) % 700);
    }
    // Writing goes on after the restart, in the middle of a block.
    log.stage_events(&[(1, ev(401, 10))], 0).unwrap();
    round::commit(&mut log, 3).unwrap();
    drop(log);
    let (_, rec) = Log::open(fs, lo, &known, 4).unwrap();
    assert_eq!(rec[&1].len(), 401);
}

#[test]
fn zeros_after_a_closed_segments_frames_are_reserved_space_and_anything_else_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, lo, known) = real_log(dir.path(), 4096);
    assert!(fill_real_log(&fs, &lo, &known, 6, 1500) >= 2);
    // A crash undid the cut of the first segment's reserved blocks at its roll.
    let seg = dir.path().join("log").join(format::segment_name(1));
    let len = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(len + 100_000).unwrap();
    let (_, rec) = Log::open(fs.clone(), lo.clone(), &known, 7).unwrap();
    assert_eq!(rec[&1].len(), 6, "zeros are not damage");
    // A stray byte there is: reported, and no event is lost.
    std::os::unix::fs::FileExt::write_all_at(&f, &[7], len + 5000).unwrap();
    let (log, rec) = Log::open(fs, lo, &known, 8).unwrap();
    assert_eq!(rec[&1].len(), 6);
    let d = log.damage();
    assert_eq!(d.losses.len(), 1, "{d:?}");
    assert_eq!(d.losses[0].file, seg);
    // Counted by sequence numbers up to the next segment's base: an upper bound.
    assert!(d.events() <= 1, "{d:?}");
}

/// A segment given back is kept as the spare and becomes the next head: its frames overwrite
/// the earlier segment's written blocks (no reserved block to convert at every sync). What
/// follows its own frames after a restart is the earlier segment's: never read as events.
#[test]
fn a_segment_given_back_becomes_the_next_head_and_its_old_frames_are_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, lo, known) = real_log(dir.path(), 64 << 10);
    let spare = lo.dir.join(format::SPARE);
    let (mut log, _) = Log::open(fs.clone(), lo.clone(), &known, 1).unwrap();
    let mut seq = 0;
    while log.segments() < 3 {
        seq += 1;
        log.stage_events(&[(1, ev(seq, 900))], 0).unwrap();
        round::commit(&mut log, seq).unwrap();
    }
    let first_life = seq;
    // Everything delivered: the closed segments go, the largest is kept.
    log.stage_settle(1, &Settled::all(1..=first_life, 0));
    round::commit(&mut log, seq).unwrap();
    assert!(spare.exists(), "a spare is kept");
    let spare_len = std::fs::metadata(&spare).unwrap().len();
    assert!(spare_len >= 64 << 10);
    assert!(log.disk_bytes() >= spare_len, "the spare counts on disk");
    // A few events into the next head, the recycled file.
    let before = log.recycled();
    while log.recycled() == before {
        seq += 1;
        log.stage_events(&[(1, ev(seq, 900))], 0).unwrap();
        round::commit(&mut log, seq).unwrap();
    }
    assert!(!spare.exists(), "the spare became the head");
    let second_life: Vec<u64> = (first_life + 1..=seq).collect();
    for _ in 0..3 {
        seq += 1;
        log.stage_events(&[(1, ev(seq, 300))], 0).unwrap();
        round::commit(&mut log, seq).unwrap();
    }
    let head = std::fs::read_dir(&lo.dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max()
        .unwrap();
    assert!(
        std::fs::metadata(&head).unwrap().len() >= spare_len,
        "the head reuses the spare's blocks"
    );
    drop(log);
    // Reopened (no checkpoint: every segment read): exactly the events since the first life.
    let (mut log, rec) = Log::open(fs.clone(), lo.clone(), &known, 2).unwrap();
    let got: Vec<u64> = rec[&1].events().iter().map(|(s, _)| *s).collect();
    let want: Vec<u64> = second_life.iter().copied().chain(seq - 2..=seq).collect();
    assert_eq!(got, want, "no event of the earlier segment comes back");
    let read = log.plan_get(1, &want).run().unwrap();
    assert!(read.iter().all(Option::is_some));
    // Writing goes on after the cut of the old frames, and survives another restart.
    log.stage_events(&[(1, ev(seq + 1, 10))], 0).unwrap();
    round::commit(&mut log, 3).unwrap();
    drop(log);
    let (_, rec) = Log::open(fs, lo, &known, 4).unwrap();
    assert_eq!(rec[&1].len(), want.len() + 1);
}

/// The spare holds disk the bound counts: a publish that fits only without it deletes it
/// first, and is taken.
#[test]
fn the_spare_goes_before_a_publish_is_refused_for_space() {
    let dir = tempfile::tempdir().unwrap();
    let (fs, mut lo, known) = real_log(dir.path(), 64 << 10);
    lo.max_disk_bytes = 1 << 20;
    let (mut log, _) = Log::open(fs, lo.clone(), &known, 1).unwrap();
    let mut seq = 0;
    while log.segments() < 3 {
        seq += 1;
        log.stage_events(&[(1, ev(seq, 900))], 0).unwrap();
        round::commit(&mut log, seq).unwrap();
    }
    log.stage_settle(1, &Settled::all(1..=seq, 0));
    round::commit(&mut log, seq).unwrap();
    let spare = lo.dir.join(format::SPARE);
    assert!(spare.exists());
    let free = lo.max_disk_bytes - log.bytes();
    let spare_len = std::fs::metadata(&spare).unwrap().len();
    // More than is free beside the spare, less than is free without it.
    let body = (free + spare_len / 2) as usize;
    log.stage_events(&[(1, ev(seq + 1, body))], 0)
        .expect("taken once the spare is gone");
    assert!(!spare.exists(), "the spare was deleted");
    round::commit(&mut log, seq + 1).unwrap();
    // Now the bound refuses as before.
    let err = log.stage_events(&[(1, ev(seq + 2, 300 << 10))], 0);
    assert!(matches!(err, Err(StoreError::Full { .. })), "{err:?}");
}

/// Small writes within written blocks (or one block) go by sectors; larger ones, and ones that
/// would end in reserved blocks past the first, by whole blocks (LogOptions::sector).
#[test]
fn small_frames_go_by_sectors_large_ones_by_blocks() {
    let fs = SimFs::new(5);
    let lo = opts_on("/s/log");
    let known: HashSet<QueueId> = [1].into_iter().collect();
    let (mut log, _) = Log::open(Arc::new(fs.clone()), lo, &known, 1).unwrap();
    let frame = |log: &mut Log, seq: u64, len: usize| {
        log.stage_events(&[(1, ev(seq, len))], 0).unwrap();
        let w = log.take_frame(seq).unwrap().unwrap();
        w.run().unwrap();
        w.span()
    };
    // Within the header's block: from the sector of the frame's offset, whole sectors.
    let (off, len) = frame(&mut log, 1, 300);
    assert!(off % 512 == 0 && len % 512 == 0, "{off} {len}");
    assert!(len < 4096, "sectors, not the block: {off} {len}");
    // 5 KB more: past the block, into a reserved one: whole blocks.
    let (off, len) = frame(&mut log, 2, 5000);
    assert!(off % 4096 == 0 && len % 4096 == 0, "{off} {len}");
    // Back within one block: sectors again.
    let (off, len) = frame(&mut log, 3, 100);
    assert!(
        len <= 4096 && (off % 4096 != 0 || len < 4096),
        "{off} {len}"
    );
    // A large frame: whole blocks whatever is below.
    let (off, len) = frame(&mut log, 4, 20_000);
    assert!(off % 4096 == 0 && len % 4096 == 0, "{off} {len}");
    drop(log);
    let (log, rec) = Log::open(Arc::new(fs), opts_on("/s/log"), &known, 2).unwrap();
    assert_eq!(rec[&1].len(), 4);
    let got = log.plan_get(1, &[1, 2, 3, 4]).run().unwrap();
    assert!(got.iter().all(Option::is_some));
}

/// Options of a log on the simulated disk in `dir`: 4 KiB blocks, 512-byte sectors.
fn opts_on(dir: &str) -> LogOptions {
    LogOptions {
        dir: dir.into(),
        segment_bytes: 1 << 20,
        max_disk_bytes: 1 << 30,
        tail_bytes: 0,
        checkpoint_bytes: super::engine::CHECKPOINT_BYTES,
        align: crate::store::fs::DIRECT_ALIGN,
        sector: 512,
        allocate_step: super::engine::ALLOCATE_STEP,
        compact_idle_ms: 0,
        refuse_damage: false,
    }
}

/// A frame of megabytes (a sync was slow while publishes kept coming) read 64 events at a time,
/// as a drain's refills read it: read from the disk once (the frame cache keeps a frame over
/// its bound alone), not once per 64 events, each read's copy alive while its events wait.
#[test]
fn a_large_frame_is_read_once_by_a_drain_reading_it_in_chunks() {
    let fs = SimFs::new(21);
    let lo = LogOptions {
        dir: "/d/log".into(),
        tail_bytes: 0,
        ..super::tests::real_opts(std::path::Path::new("/d"), 64 << 10)
    };
    let known: HashSet<crate::store::QueueId> = [1].into_iter().collect();
    let n = 6_000u64;
    {
        let (mut log, _) = Log::open(Arc::new(fs.clone()), lo.clone(), &known, 1).unwrap();
        let items: Vec<_> = (1..=n).map(|s| (1, ev(s, 500))).collect();
        log.stage_events(&items, 0).unwrap();
        round::commit(&mut log, 1).unwrap();
        log.checkpoint().unwrap();
    }
    let (log, _) = Log::open(Arc::new(fs.clone()), lo, &known, 2).unwrap();
    let frame = log.frame_bytes();
    assert!(frame > 3 << 20, "one frame of {frame} bytes");
    let before = fs.bytes_read();
    let seqs: Vec<u64> = (1..=n).collect();
    for chunk in seqs.chunks(64) {
        let got = log.plan_get(1, chunk).run().unwrap();
        assert!(got.iter().all(Option::is_some));
    }
    let read = fs.bytes_read() - before;
    // Before: 94 reads of the whole frame (about 300 MB).
    assert!(read < frame * 2, "{read} bytes read for a frame of {frame}");
    // Its last event read, the frame is not held any more.
    assert_eq!(log.frame_cache_bytes(), 0);
}
