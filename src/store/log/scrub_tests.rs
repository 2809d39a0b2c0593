//! The start from a checkpoint reads none of the frames it vouches for, and the scrub finds
//! damage there and reports it as the open would (`engine/scrub.rs`). Measured in bytes read
//! through the simulated disk, not in time.

use super::engine::{Log, LogOptions, ALLOCATE_STEP};
use super::format;
use super::round;
use super::tests::{ev, real_opts};
use crate::store::fs::sim::SimFs;
use crate::store::fs::Fs;
use crate::store::QueueId;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn opts() -> LogOptions {
    LogOptions {
        dir: "/d/log".into(),
        ..real_opts(Path::new("/d"), 64 << 10)
    }
}

fn known() -> HashSet<QueueId> {
    [1].into_iter().collect()
}

/// Events `1..=n` of 500 bytes for queue 1, one frame each, then a checkpoint (as a clean stop
/// leaves one): the bytes of frames written.
fn filled(fs: &SimFs, n: u64) -> u64 {
    let (mut log, _) = Log::open(Arc::new(fs.clone()), opts(), &known(), 1).unwrap();
    for seq in 1..=n {
        log.stage_events(&[(1, ev(seq, 500))], 0).unwrap();
        round::commit(&mut log, seq).unwrap();
    }
    log.checkpoint().unwrap();
    log.frame_bytes()
}

fn segment(no: u64) -> PathBuf {
    Path::new("/d/log").join(format::segment_name(no))
}

/// Flip the byte in the middle of segment `no` (a frame of one event there).
fn flip_middle(fs: &SimFs, no: u64) {
    let file = fs.open(&segment(no)).unwrap();
    let mid = file.size().unwrap() / 2;
    let mut b = [0u8; 1];
    file.read_at(&mut b, mid).unwrap();
    fs.damage(&segment(no), mid, &[b[0] ^ 0xff]).unwrap();
}

/// Every event of queue 1 read back (`None`: not pending, or lost).
fn read_all(log: &Log, n: u64) -> Result<Vec<Option<u64>>, crate::store::StoreError> {
    let seqs: Vec<u64> = (1..=n).collect();
    Ok(log
        .plan_get(1, &seqs)
        .run()?
        .into_iter()
        .map(|e| e.map(|e| e.seq))
        .collect())
}

#[test]
fn a_start_from_a_checkpoint_reads_none_of_the_frames_it_vouches_for() {
    let fs = SimFs::new(1);
    let frames = filled(&fs, 2_000);
    let before = fs.bytes_read();
    let (mut log, rec) = Log::open(Arc::new(fs.clone()), opts(), &known(), 2).unwrap();
    let read = fs.bytes_read() - before;
    assert_eq!(rec[&1].len(), 2_000, "every event pending");
    assert!(log.segments() >= 10, "{} segments", log.segments());
    // The checkpoint, each segment's header, the head's last block (a few KB), and the head's
    // blocks reserved after its last frame (zeros, read to tell a frame written after the
    // checkpoint: at most one reservation step). Before the scrub, the open read every frame
    // (about 1.1 MB here).
    assert!(
        read <= ALLOCATE_STEP + (16 << 10),
        "the open read {read} bytes of a log of {frames} bytes of frames"
    );
    assert!(log.scrub_left() * 10 > frames * 9, "the scrub has them");
    let before = fs.bytes_read();
    round::scrub(&mut log, 3).unwrap();
    assert!(fs.bytes_read() - before >= log.scrub_left() + frames * 9 / 10);
    assert_eq!(log.scrub_left(), 0);
    assert!(log.damage().losses.is_empty(), "{:?}", log.damage());
    assert_eq!(
        read_all(&log, 2_000).unwrap().iter().flatten().count(),
        2_000
    );
}

/// The scrub reads a chunk after another into one buffer: its allocation is reused, and a
/// frame larger than a chunk (read into it whole) does not leave it larger than a chunk.
#[test]
fn the_scrub_reuses_one_buffer_of_at_most_a_chunk() {
    const CHUNK: u64 = 4 << 10;
    let fs = SimFs::new(6);
    let (mut log, _) = Log::open(Arc::new(fs.clone()), opts(), &known(), 1).unwrap();
    for seq in 1..=60u64 {
        // Every twentieth event's frame is larger than a chunk.
        let size = if seq % 20 == 0 {
            3 * CHUNK as usize
        } else {
            500
        };
        log.stage_events(&[(1, ev(seq, size))], 0).unwrap();
        round::commit(&mut log, seq).unwrap();
    }
    log.checkpoint().unwrap();
    drop(log);
    let (mut log, _) = Log::open(Arc::new(fs.clone()), opts(), &known(), 2).unwrap();
    let left = log.scrub_left();
    assert!(left > 10 * CHUNK, "{left} bytes to check");
    let mut buf = Vec::new();
    let (mut reused, mut big, mut read) = (0, 0, 0);
    while let Some(job) = log.scrub_job(CHUNK) {
        let (ptr, held) = (buf.as_ptr(), buf.capacity());
        let done = job.run(&mut buf).unwrap();
        read += done.bytes;
        if done.bytes > CHUNK {
            big += 1;
        } else if held > 0 {
            assert_eq!(buf.as_ptr(), ptr, "a chunk read into the buffer held");
            reused += 1;
        }
        assert!(
            buf.capacity() as u64 <= CHUNK,
            "{} bytes kept after a job",
            buf.capacity()
        );
        assert!(!log.scrub_done(done), "nothing damaged");
    }
    assert_eq!(log.scrub_left(), 0);
    assert!(read >= left, "every byte checked: {read} of {left}");
    assert!(
        big >= 2 && reused >= 4,
        "{big} large frames, {reused} reuses"
    );
}

#[test]
fn damage_in_a_checkpointed_segment_is_found_by_the_scrub_and_reported_with_counts() {
    let fs = SimFs::new(2);
    filled(&fs, 400);
    flip_middle(&fs, 1);
    let (mut log, rec) = Log::open(Arc::new(fs.clone()), opts(), &known(), 2).unwrap();
    assert!(log.damage().losses.is_empty(), "not read at open");
    assert_eq!(rec[&1].len(), 400);
    round::scrub(&mut log, 3).unwrap();
    let d = log.damage().clone();
    assert_eq!(d.losses.len(), 1, "{d:?}");
    assert_eq!(d.losses[0].file, segment(1));
    assert_eq!(d.events(), 1, "one event per frame: {d:?}");
    assert!(d.losses[0].counted);
    assert_eq!(
        d.quarantined.len(),
        1,
        "the damaged file copied aside first"
    );
    assert!(d.summary().is_some_and(|s| s.contains("1 events lost")));
    let got = read_all(&log, 400).unwrap();
    let lost: Vec<u64> = (1..=400u64)
        .filter(|s| got[*s as usize - 1].is_none())
        .collect();
    assert_eq!(lost.len(), 1, "only the damaged frame's event: {lost:?}");
    assert!(!log.is_pending(1, lost[0]), "no longer pending");
    // Found again by nothing in this run: recorded once.
    round::scrub(&mut log, 4).unwrap();
    round::commit(&mut log, 5).unwrap();
    assert_eq!(log.damage().losses.len(), 1);
}

#[test]
fn a_read_that_meets_damage_first_reports_it_and_the_scrub_does_not_count_it_again() {
    let fs = SimFs::new(3);
    filled(&fs, 400);
    flip_middle(&fs, 1);
    let (mut log, _) = Log::open(Arc::new(fs.clone()), opts(), &known(), 2).unwrap();
    let err = read_all(&log, 400).unwrap_err();
    assert!(
        matches!(err, crate::store::StoreError::Corrupt(_)),
        "{err:?}"
    );
    assert!(log.has_findings());
    // The committer's next round records it.
    round::commit(&mut log, 3).unwrap();
    assert_eq!(log.damage().losses.len(), 1, "{:?}", log.damage());
    assert_eq!(log.damage().events(), 1);
    let got = read_all(&log, 400).unwrap();
    assert_eq!(got.iter().flatten().count(), 399, "read again: the others");
    round::scrub(&mut log, 4).unwrap();
    assert_eq!(
        log.damage().losses.len(),
        1,
        "counted once: {:?}",
        log.damage()
    );
    assert_eq!(log.damage().events(), 1);
    assert_eq!(log.scrub_left(), 0);
}

#[test]
fn with_refuse_the_open_checks_every_frame_and_refuses() {
    let fs = SimFs::new(4);
    filled(&fs, 400);
    flip_middle(&fs, 1);
    let refuse = LogOptions {
        refuse_damage: true,
        ..opts()
    };
    let Err(e) = Log::open(Arc::new(fs.clone()), refuse, &known(), 2) else {
        panic!("opened over damage with refuse");
    };
    assert!(
        e.to_string().contains("persistence__onDamage=refuse"),
        "{e}"
    );
}

#[test]
fn a_segment_shorter_than_its_checkpoint_is_damage_found_at_open() {
    let fs = SimFs::new(5);
    filled(&fs, 400);
    let file = fs.open(&segment(1)).unwrap();
    let size = file.size().unwrap();
    // The file's last 2,000 bytes gone (as a file system check might leave it).
    file.set_len(size - 2_000).unwrap();
    file.sync_data().unwrap();
    let (log, _) = Log::open(Arc::new(fs.clone()), opts(), &known(), 2).unwrap();
    let d = log.damage();
    assert_eq!(d.losses.len(), 1, "{d:?}");
    assert!(d.events() >= 3, "{d:?}");
}

/// The store as shipped: `gridlet-scrub` finds damage in a checkpointed segment with no read
/// meeting it, and the store reports it (counters, readiness line); the queue recovered at
/// open no longer lists the lost event.
#[tokio::test]
async fn the_store_scrub_thread_reports_damage_no_read_met() {
    use crate::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let opts = super::tests::opts(dir.path());
    let q;
    {
        let s = super::LogStore::open(&opts).unwrap();
        q = s.next_queue_id().unwrap();
        s.put_subscription(q, &crate::store::contract::sub("a"))
            .unwrap();
        for seq in 1..=50u64 {
            s.submit(vec![(q, ev(seq, 100))])
                .unwrap()
                .wait()
                .await
                .unwrap();
        }
        // Dropped: a clean stop, its checkpoint covers every frame.
    }
    let seg = opts
        .events_path
        .join("gridlet-v2/log")
        .join(format::segment_name(1));
    let mut bytes = std::fs::read(&seg).unwrap();
    // Inside the frames (about 7 KB of them; the file's blocks reserved after them are zeros).
    bytes[3_000] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let s = super::LogStore::open(&opts).unwrap();
    // The scrub ends on its own (a few KB at 32 MiB/s); waited for, not timed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while s.damage().losses.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let d = s.damage();
    assert_eq!(d.losses.len(), 1, "{d:?}");
    assert_eq!(d.events(), 1);
    assert_eq!(d.losses[0].file, seg);
    let c = s.commit_counters().unwrap();
    assert_eq!((c.damaged_frames, c.damaged_events), (1, 1));
    assert!(s
        .damage_summary()
        .is_some_and(|l| l.contains("1 events lost")));
    let pending = s.pending_runs(q).unwrap().events();
    assert_eq!(
        pending.len(),
        49,
        "the lost event is not handed to the queue"
    );
    let seqs: Vec<u64> = pending.iter().map(|(s, _)| *s).collect();
    let read = s.get(q, &seqs).unwrap();
    assert_eq!(read.iter().flatten().count(), 49);
    assert_eq!(s.damage().losses.len(), 1, "the reads met nothing new");
}
