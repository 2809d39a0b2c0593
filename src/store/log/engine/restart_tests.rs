//! What a start with a large backlog costs: the pending lists rebuilt from runs of bits (not
//! event by event), and a drain that empties segments one after another without a checkpoint
//! of every segment left for each one.

use super::segment::Bits;
use super::{Log, LogOptions, Recovered};
use crate::store::fs::sim::SimFs;
use crate::store::log::round;
use crate::store::{PendingRuns, QueueId, RetryState, Settled, StoredEvent};
use bytes::Bytes;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

fn opts(segment_bytes: u64) -> LogOptions {
    LogOptions {
        dir: "/d/log".into(),
        segment_bytes,
        max_disk_bytes: 1 << 30,
        tail_bytes: 0,
        checkpoint_bytes: super::CHECKPOINT_BYTES,
        align: crate::store::fs::DIRECT_ALIGN,
        sector: 0,
        allocate_step: super::ALLOCATE_STEP,
        compact_idle_ms: 0,
        refuse_damage: false,
    }
}

/// Event `seq` of 200 bytes, first enqueued at `ms`.
fn ev(seq: u64, ms: u64) -> StoredEvent {
    StoredEvent {
        seq,
        id: format!("e{seq}"),
        body: Bytes::from(vec![b'x'; 200]),
        state: RetryState {
            attempts: 0,
            first_enqueued_ms: ms,
            due_ms: 0,
        },
        trace: None,
    }
}

fn known() -> HashSet<QueueId> {
    [1, 2].into_iter().collect()
}

/// The pending lists as the open built them before runs: event by event, each with its retry
/// state or its segment's first-enqueue second.
fn per_event(log: &Log) -> Recovered {
    let mut out = Recovered::new();
    for s in &log.segs {
        let Some(first) = s.first_seq else { continue };
        for (q, bits) in &s.live {
            let v = out.entry(*q).or_default();
            for i in bits.iter() {
                let seq = first + i;
                let st = log.retries.get(&(*q, seq)).copied().unwrap_or_else(|| {
                    let run = s.ms_runs.partition_point(|(f, _)| *f <= seq);
                    let ms = run.checked_sub(1).map_or(0, |r| s.ms_runs[r].1);
                    RetryState {
                        attempts: 0,
                        first_enqueued_ms: ms,
                        due_ms: 0,
                    }
                });
                v.push(seq, st);
            }
        }
    }
    out
}

#[test]
fn runs_of_bits_are_the_bits() {
    let patterns: [&[u64]; 6] = [
        &[],
        &[0, 0],
        &[u64::MAX; 3],
        &[1 << 63, 1, 0, u64::MAX, 0b1011 << 60],
        &[0x00ff_00ff_00ff_00ff, u64::MAX, 1],
        &[u64::MAX - 1, u64::MAX, u64::MAX >> 1],
    ];
    for words in patterns {
        let bits = Bits::from_words(words.to_vec());
        let mut expanded = Vec::new();
        for (first, n) in bits.runs() {
            assert!(n > 0);
            expanded.extend(first..first + n);
        }
        assert_eq!(expanded, bits.iter().collect::<Vec<_>>(), "{words:x?}");
        // Maximal: no two runs touch.
        let runs = bits.runs();
        assert!(
            runs.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0),
            "{runs:?}"
        );
    }
    assert_eq!(Bits::from_words(vec![u64::MAX; 3]).runs(), [(0, 192)]);
}

#[test]
fn fresh_runs_join_and_split_at_the_counts_limit() {
    let mut p = PendingRuns::default();
    p.push_fresh(10, 5, 7);
    p.push_fresh(15, 5, 7);
    p.push_fresh(20, 1, 8);
    assert_eq!(p.fresh.len(), 2);
    assert_eq!((p.fresh[0].first, p.fresh[0].count), (10, 10));
    let mut big = PendingRuns::default();
    big.push_fresh(1, u64::from(u32::MAX) + 5, 1);
    assert_eq!(big.len(), u32::MAX as usize + 5);
    assert_eq!(big.fresh[1].first, 1 + u64::from(u32::MAX));
}

/// Two queues over several segments, first-enqueue times changing every few hundred events,
/// settled events (holes) and failed ones (retry states, one of them never attempted): the
/// lists the open builds from runs are the per-event ones, from a checkpoint and from the
/// frames alike, and a segment owed whole costs a run per second, not an entry per event.
#[test]
fn the_pending_lists_built_from_runs_are_the_events_pending() {
    let fs = SimFs::new(7);
    let fs: Arc<dyn crate::store::fs::Fs> = Arc::new(fs);
    let n = 3000u64;
    {
        let (mut log, _) = Log::open(fs.clone(), opts(64 << 10), &known(), 1).unwrap();
        for chunk in (1..=n).collect::<Vec<_>>().chunks(50) {
            let items: Vec<(QueueId, StoredEvent)> = chunk
                .iter()
                .flat_map(|&seq| [(1, ev(seq, 1000 * (seq / 700))), (2, ev(seq, 5))])
                .collect();
            log.stage_events(&items, 0).unwrap();
            round::commit(&mut log, chunk[0]).unwrap();
        }
        assert!(log.segs.len() >= 5, "{} segments", log.segs.len());
        let settled: Vec<Settled> = (100..400)
            .chain([1, 999, 1000, 2500])
            .map(|s| Settled::new(s, 200))
            .collect();
        log.stage_settle(1, &settled);
        let failed = |attempts| RetryState {
            attempts,
            first_enqueued_ms: 3,
            due_ms: 9,
        };
        log.stage_retry(1, &[2, 50, 700, 701, 2999, 3000], failed(2));
        log.stage_retry(2, &[64, 128], failed(1));
        log.stage_retry(2, &[129], failed(0));
        round::commit(&mut log, n + 1).unwrap();
        // A checkpoint, then more settled after it (replayed from the frames at open).
        log.checkpoint().unwrap();
        log.stage_settle(
            2,
            &(1500..1600)
                .map(|s| Settled::new(s, 200))
                .collect::<Vec<_>>(),
        );
        round::commit(&mut log, n + 2).unwrap();
        assert_eq!(log.recovered(), per_event(&log), "as written");
    }
    let (log, recovered) = Log::open(fs.clone(), opts(64 << 10), &known(), 9).unwrap();
    assert_eq!(recovered, per_event(&log), "from the checkpoint");
    let q2 = &recovered[&2];
    assert_eq!(q2.len() as u64, n - 100);
    assert_eq!(q2.retrying.len(), 2);
    // Queue 2's events share one first-enqueue time: a run per stretch between holes and
    // failed events (and segment ends), not one per event.
    assert!(q2.fresh.len() < 20, "{} runs", q2.fresh.len());
    let q1 = &recovered[&1];
    assert_eq!(q1.len() as u64, n - 304);
    let attempts = |seq| {
        q1.retrying
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, st)| st.attempts)
    };
    assert_eq!(
        (attempts(2), attempts(700), attempts(3000)),
        (Some(2), Some(2), Some(2))
    );
    drop(log);
    // Without a usable checkpoint: every segment read, the same lists.
    let removed = ["/d/log/checkpoint.0", "/d/log/checkpoint.1"]
        .into_iter()
        .filter(|p| fs.remove(Path::new(p)).is_ok())
        .count();
    assert!(removed > 0);
    let (log, again) = Log::open(fs, opts(64 << 10), &known(), 10).unwrap();
    assert_eq!(again, per_event(&log), "from the frames");
    assert_eq!(again, recovered);
}

/// Segments emptied by a drain, which the last checkpoint records as owing events, wait until
/// they hold [`super::collect::FREED_PER_CHECKPOINT`] times its size (a checkpoint lists every
/// segment: one per emptied segment made a drain's checkpoints grow with the square of the
/// backlog); a publish that needs their space takes them at once.
#[test]
fn a_drain_takes_a_checkpoint_per_several_segments_and_a_publish_frees_them_at_once() {
    let fs: Arc<dyn crate::store::fs::Fs> = Arc::new(SimFs::new(11));
    let seg = 32 << 10;
    let (mut log, _) = Log::open(fs, opts(seg), &known(), 1).unwrap();
    let n = 24_000u64;
    for chunk in (1..=n).collect::<Vec<_>>().chunks(40) {
        let items: Vec<(QueueId, StoredEvent)> = chunk.iter().map(|&s| (1, ev(s, 5))).collect();
        log.stage_events(&items, 0).unwrap();
        round::commit(&mut log, chunk[0]).unwrap();
    }
    log.checkpoint().unwrap();
    let segments = log.segs.len() as u64;
    assert!(segments > 100, "{segments} segments");
    let ck_len = log.ck_len;
    let before = log.ck_generation;
    // Drain the first four fifths, 100 events a round.
    let mut most_waiting = 0;
    let drained = n * 4 / 5;
    for chunk in (1..=drained).collect::<Vec<_>>().chunks(100) {
        let settled: Vec<Settled> = chunk.iter().map(|&s| Settled::new(s, 200)).collect();
        log.stage_settle(1, &settled);
        round::commit(&mut log, n + chunk[0]).unwrap();
        let waiting: u64 = log
            .segs
            .iter()
            .filter(|s| s.pending() == 0 && s.first_seq.is_some_and(|f| f <= drained))
            .map(|s| s.len)
            .sum();
        most_waiting = most_waiting.max(waiting);
    }
    let emptied = segments - log.segs.len() as u64;
    let checkpoints = log.ck_generation - before;
    assert!(
        emptied * 5 >= segments * 3,
        "{emptied} of {segments} given back"
    );
    assert!(
        checkpoints * 3 <= emptied,
        "{checkpoints} checkpoints for {emptied} segments emptied"
    );
    assert!(
        most_waiting <= super::collect::FREED_PER_CHECKPOINT * log.ck_len.max(ck_len) + seg,
        "{most_waiting} bytes waited for a checkpoint"
    );
    // A publish that fits only with the space of the waiting segments: they go with it.
    let head = log.segs.len() - 1;
    let waiting = log.segs[..head].iter().filter(|s| s.pending() == 0).count();
    assert!(waiting > 0, "segments wait for a checkpoint");
    log.opts.max_disk_bytes = log.bytes() + 1000;
    let more: Vec<(QueueId, StoredEvent)> = (n + 1..=n + 20).map(|s| (1, ev(s, 5))).collect();
    log.stage_events(&more, 0).unwrap();
    round::commit(&mut log, 2 * n).unwrap();
    assert!(
        log.segs
            .iter()
            .take(log.segs.len() - 1)
            .all(|s| s.pending() > 0),
        "every emptied segment went"
    );
    assert!(log.bytes() <= log.opts.max_disk_bytes);
}

/// The disk, counting the opens of each file and the read-ahead hints.
#[derive(Clone)]
struct Counting {
    inner: SimFs,
    opens: Arc<std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, u32>>>,
    hints: Arc<std::sync::atomic::AtomicU64>,
}

/// A file of [`Counting`]: its hints counted, the rest as the simulated disk's.
struct Hinted(Arc<dyn FsFile>, Arc<std::sync::atomic::AtomicU64>);

use crate::store::fs::{Fs, FsFile};
use std::io;
use std::path::PathBuf;

impl FsFile for Hinted {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn size(&self) -> io::Result<u64> {
        self.0.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn disk_bytes(&self) -> u64 {
        self.0.disk_bytes()
    }
    fn will_need(&self, _offset: u64, _len: u64) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.0.allocate(len)
    }
}

impl Fs for Counting {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        self.inner.create(path)
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        *crate::sync::lock(&self.opens)
            .entry(path.to_path_buf())
            .or_default() += 1;
        let f = self.inner.open(path)?;
        Ok(Arc::new(Hinted(f, self.hints.clone())))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

/// A start from a checkpoint opens each segment once and asks for every header ahead, so that
/// the disk reads them together: read one after another, a 100 M-event backlog's 1,978 headers
/// were 513 ms of a 693 ms restart.
#[test]
fn a_start_opens_each_segment_once_and_asks_for_every_header_ahead() {
    let fs = Counting {
        inner: SimFs::new(5),
        opens: Arc::default(),
        hints: Arc::default(),
    };
    {
        let (mut log, _) = Log::open(Arc::new(fs.clone()), opts(32 << 10), &known(), 1).unwrap();
        for chunk in (1..=2000u64).collect::<Vec<_>>().chunks(40) {
            let items: Vec<(QueueId, StoredEvent)> = chunk.iter().map(|&s| (1, ev(s, 5))).collect();
            log.stage_events(&items, 0).unwrap();
            round::commit(&mut log, chunk[0]).unwrap();
        }
        log.checkpoint().unwrap();
    }
    crate::sync::lock(&fs.opens).clear();
    let (log, recovered) = Log::open(Arc::new(fs.clone()), opts(32 << 10), &known(), 2).unwrap();
    assert_eq!(recovered[&1].len(), 2000);
    let segments = log.segs.len();
    assert!(segments >= 10, "{segments} segments");
    let opens = crate::sync::lock(&fs.opens).clone();
    let seg_opens: Vec<(&PathBuf, &u32)> = opens
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    assert_eq!(seg_opens.len(), segments);
    assert!(seg_opens.iter().all(|(_, n)| **n == 1), "{seg_opens:?}");
    let hints = fs.hints.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(hints, segments as u64, "a header hint per segment");
}

/// A drain after a restart writes its settle records into new heads that hold no events; each
/// such head goes once it fills a quarter of a segment. Deleting it restates only the live
/// segments its records speak of (the few being drained), not every segment behind them: at
/// 100 M events (2,000 segments) restating the whole backlog wrote 12 MB per deleted head, a
/// head of only restatements, deleted at once and restated again, and the committer's round
/// grew with the backlog (`engine/collect.rs`).
#[test]
fn deleting_a_settle_only_head_restates_only_the_segments_it_speaks_of() {
    let fs: Arc<dyn crate::store::fs::Fs> = Arc::new(SimFs::new(12));
    let seg = 32 << 10;
    let n = 24_000u64;
    {
        let (mut log, _) = Log::open(fs.clone(), opts(seg), &known(), 1).unwrap();
        for chunk in (1..=n).collect::<Vec<_>>().chunks(40) {
            let items: Vec<(QueueId, StoredEvent)> = chunk.iter().map(|&s| (1, ev(s, 5))).collect();
            log.stage_events(&items, 0).unwrap();
            round::commit(&mut log, chunk[0]).unwrap();
        }
        log.checkpoint().unwrap();
    }
    let (mut log, recovered) = Log::open(fs.clone(), opts(seg), &known(), 2).unwrap();
    assert_eq!(recovered[&1].len() as u64, n);
    let segments = log.segs.len();
    assert!(segments > 100, "{segments} segments");
    let first_new = log.segs.last().map_or(0, |s| s.hdr.no) + 1;
    // Drain the first tenth, 20 events a round: settle records only, into new heads.
    let drained = n / 10;
    for chunk in (1..=drained).collect::<Vec<_>>().chunks(20) {
        let settled: Vec<Settled> = chunk.iter().map(|&s| Settled::new(s, 200)).collect();
        log.stage_settle(1, &settled);
        round::commit(&mut log, n + chunk[0]).unwrap();
    }
    let gone_new = first_new..log.segs.iter().map(|s| s.hdr.no).max().unwrap_or(0);
    let deleted_new = gone_new
        .filter(|no| !log.segs.iter().any(|s| s.hdr.no == *no))
        .count();
    assert!(
        deleted_new >= 2,
        "settle-only heads were deleted: {deleted_new}"
    );
    // Each deletion restates the segment being drained and those emptied that wait for a
    // checkpoint; before, every segment with events (over 100 here) each time.
    assert!(
        log.restated <= 8 * deleted_new as u64,
        "{} segments restated for {deleted_new} heads deleted ({segments} segments)",
        log.restated
    );
    // What was restated (and what was not) comes back the same after a crash: the frames
    // since the checkpoint, without it too.
    let pending: Vec<u64> = (drained + 1..=n).collect();
    drop(log);
    let (log, recovered) = Log::open(fs.clone(), opts(seg), &known(), 3).unwrap();
    let got: Vec<u64> = recovered[&1].events().iter().map(|(s, _)| *s).collect();
    assert_eq!(got, pending);
    drop(log);
    for slot in 0..2 {
        let _ = fs.remove(&Path::new("/d/log").join(format!("checkpoint.{slot}")));
    }
    let (_, recovered) = Log::open(fs, opts(seg), &known(), 4).unwrap();
    let got: Vec<u64> = recovered[&1].events().iter().map(|(s, _)| *s).collect();
    assert_eq!(got, pending, "from every segment's frames");
}

/// A checkpoint is encoded into the last one's buffer when it fits (no fresh megabytes
/// faulted in at each checkpoint of a long drain), and the buffer kept shrinks with the log:
/// at most twice the last checkpoint written, plus 64 KiB.
#[test]
fn a_checkpoint_reuses_the_last_ones_buffer_and_keeps_it_bounded() {
    let fs: Arc<dyn crate::store::fs::Fs> = Arc::new(SimFs::new(13));
    let (mut log, _) = Log::open(fs, opts(4 << 10), &known(), 1).unwrap();
    let n = 40_000u64;
    // A frame of 20 events (4 KB) a segment: 2,000 segments.
    for chunk in (1..=n).collect::<Vec<_>>().chunks(20) {
        let items: Vec<(QueueId, StoredEvent)> = chunk.iter().map(|&s| (1, ev(s, 5))).collect();
        log.stage_events(&items, 0).unwrap();
        round::commit(&mut log, chunk[0]).unwrap();
    }
    log.checkpoint().unwrap();
    let (ptr, cap) = log.checkpoint_buffer();
    let big = log.ck_len as usize;
    assert!(big > 200 << 10, "a checkpoint of {big} bytes");
    assert!(
        cap >= big && cap <= 2 * big + (64 << 10),
        "{cap} kept for {big}"
    );
    // The same log again: encoded into the same buffer.
    log.checkpoint().unwrap();
    assert_eq!(log.checkpoint_buffer().0, ptr, "the buffer was reused");
    // Most of it drained: the checkpoint shrinks, and so does the buffer kept.
    let settled: Vec<Settled> = (1..=n - 100).map(|s| Settled::new(s, 200)).collect();
    log.stage_settle(1, &settled);
    round::commit(&mut log, 2 * n).unwrap();
    log.checkpoint().unwrap();
    let small = log.ck_len as usize;
    assert!(
        small * 10 < big,
        "{small} bytes after the drain, {big} before"
    );
    let (_, cap) = log.checkpoint_buffer();
    assert!(
        cap <= 2 * small + (64 << 10),
        "{cap} bytes kept for a checkpoint of {small}"
    );
}
