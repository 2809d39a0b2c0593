//! The event log's engine: segments on an [`Fs`], what each one still owes each queue, group
//! commit of frames, recovery, and giving space back. Synchronous and single-owner: the store
//! (`log/mod.rs`) runs it on its committer thread behind a mutex, the simulation (`sim.rs`) calls
//! it step by step.
//!
//! # Invariants
//!
//! 1. **Bodies once.** An event is one [`Record::Event`] listing every queue it is pending in.
//!    What happens to it afterwards is small records: [`Record::Settle`], [`Record::Retry`].
//! 2. **Sequence order.** Event records are appended in increasing sequence number (the broker
//!    submits publishes in the order it numbers them), so the segment of a sequence number is a
//!    binary search and a sparse index per segment finds its frame.
//! 3. **Durable before acknowledged.** [`Log::commit`] writes one frame and `fdatasync`s it before
//!    any event in it is acknowledged. A new segment's header is synced, and its directory entry
//!    too, before a frame goes into it; the old head is synced before it stops being the head,
//!    so only the newest segment can end in a torn frame.
//! 4. **What is owed.** In memory, each segment keeps one bit per sequence number per queue
//!    (set: pending there) and the retry states of pending events that failed. Recovery rebuilds
//!    exactly this from the records, a [`Record::State`] replacing what came before it.
//! 5. **Space back.** A segment with nothing pending is deleted. The oldest one simply goes. A
//!    younger one may hold settle and retry records about older segments still alive, so those
//!    are first restated ([`Record::State`], synced) in the head; then the file is removed and
//!    its directory synced.
//! 6. **Fail-stop.** After a failed write or sync the log refuses every later write: what the
//!    page cache holds is unknown (as PostgreSQL learned), and a restart recovers from the disk.

use super::format::{self, Header, QueueState, Record, FRAME_HEAD, HEADER};
use crate::store::fs::{Fs, FsFile};
use crate::store::{QueueId, RetryState, StoreError, StoredEvent};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A sparse-index entry is added at a frame that starts this many bytes after the last one.
const INDEX_STRIDE: u64 = 32 << 10;
/// Bodies of the most recently written events kept for reads (a subscription's window refills
/// usually ask for what was just published): this many bytes at most, by default.
pub const TAIL_BYTES: usize = 4 << 20;

/// A recently written event, for reads without the disk.
#[derive(Debug, Clone)]
struct Cached {
    seq: u64,
    id: String,
    body: Bytes,
    first_ms: u64,
}

/// Options of the log.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Directory of the segment files.
    pub dir: PathBuf,
    /// A new segment is started once the head has this many bytes.
    pub segment_bytes: u64,
    /// Bound on the bytes of all segments together (`persistence__maxDiskBytes` less what
    /// other parts of the store hold).
    pub max_disk_bytes: u64,
    /// Bodies of recently written events kept in memory for reads ([`TAIL_BYTES`] in the
    /// store; the simulation varies it so reads also go to the disk).
    pub tail_bytes: usize,
}

/// One bit per sequence number from `first`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bits {
    words: Vec<u64>,
    ones: u64,
}

impl Bits {
    fn set(&mut self, i: u64) {
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        if let Some(word) = self.words.get_mut(w) {
            if *word & (1 << b) == 0 {
                *word |= 1 << b;
                self.ones += 1;
            }
        }
    }
    fn clear(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        match self.words.get_mut(w) {
            Some(word) if *word & (1 << b) != 0 => {
                *word &= !(1 << b);
                self.ones -= 1;
                true
            }
            _ => false,
        }
    }
    fn get(&self, i: u64) -> bool {
        self.words
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    fn from_words(words: Vec<u64>) -> Self {
        let ones = words.iter().map(|w| u64::from(w.count_ones())).sum();
        Self { words, ones }
    }
    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(w, word)| {
            (0..64u64)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| w as u64 * 64 + b)
        })
    }
}

/// One segment file and what it still owes.
struct Seg {
    hdr: Header,
    file: Arc<dyn FsFile>,
    /// Bytes of valid frames (the head's next frame goes here).
    len: u64,
    /// Sequence number of bit 0 of every queue's bits (its first event's; `None`: no event yet).
    first_seq: Option<u64>,
    last_seq: u64,
    /// `(first event seq of a frame, frame offset)`, every [`INDEX_STRIDE`] bytes or more.
    index: Vec<(u64, u64)>,
    live: HashMap<QueueId, Bits>,
    /// Recovery only: `(first seq, first-enqueued ms)` of each run of events with the same ms.
    ms_runs: Vec<(u64, u64)>,
}

impl Seg {
    fn pending(&self) -> u64 {
        self.live.values().map(|b| b.ones).sum()
    }
    fn bit(&self, seq: u64) -> Option<u64> {
        self.first_seq
            .filter(|f| seq >= *f && seq <= self.last_seq)
            .map(|f| seq - f)
    }
}

/// What a store open found, per queue: its pending events (fresh ones as runs), in order.
pub type Recovered = HashMap<QueueId, crate::store::PendingRuns>;

/// A write prepared under the lock, done outside it: one frame at an offset of a file.
pub struct FrameWrite {
    file: Arc<dyn FsFile>,
    offset: u64,
    bytes: Vec<u8>,
}

impl FrameWrite {
    /// Write and `fdatasync` the frame.
    ///
    /// # Errors
    /// I/O failure (the log must then fail-stop: [`Log::fail`]).
    pub fn run(&self) -> std::io::Result<()> {
        self.file.write_at(&self.bytes, self.offset)?;
        self.file.sync_data()
    }
}

/// A point read prepared under the lock: frames of one file from an offset.
struct ReadPlan {
    file: Arc<dyn FsFile>,
    salt: u64,
    from: u64,
    end: u64,
    want: Vec<(usize, u64)>,
}

/// The log. See the module docs.
pub struct Log {
    fs: Arc<dyn Fs>,
    opts: LogOptions,
    segs: Vec<Seg>,
    retries: HashMap<(QueueId, u64), RetryState>,
    dropped: HashSet<QueueId>,
    /// Encoded records waiting for the next frame.
    staged: Vec<u8>,
    /// The events in `staged`, in order: they join the segment their frame goes to when it is
    /// taken ([`Log::take_frame`]), which may be a new head.
    pending_events: Vec<(Cached, Vec<QueueId>)>,
    /// The most recently written events, in sequence order, `opts.tail_bytes` of bodies at most.
    tail: std::collections::VecDeque<Cached>,
    tail_bytes: usize,
    max_seq: u64,
    failed: Option<String>,
    /// Frames written and synced (the group-commit counter).
    pub syncs: u64,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{}: {e}", path.display()))
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{}: {e}", path.display()))
}

/// Read one frame at `offset`: `Some((payload, next offset))`, `None` at the end of the valid
/// frames (short, wrong length, or CRC mismatch).
fn read_frame(
    file: &dyn FsFile,
    salt: u64,
    offset: u64,
    end: u64,
) -> std::io::Result<Option<(Bytes, u64)>> {
    let mut head = [0u8; FRAME_HEAD];
    if offset + FRAME_HEAD as u64 > end || file.read_at(&mut head, offset)? < FRAME_HEAD {
        return Ok(None);
    }
    let mut r = format::Reader(&head);
    let (Some(len), Some(crc)) = (r.u32(), r.u32()) else {
        return Ok(None);
    };
    let next = offset + FRAME_HEAD as u64 + u64::from(len);
    if len > format::MAX_FRAME || next > end {
        return Ok(None);
    }
    let mut payload = vec![0u8; len as usize];
    if file.read_at(&mut payload, offset + FRAME_HEAD as u64)? < payload.len() {
        return Ok(None);
    }
    if format::frame_crc(salt, &payload) != crc {
        return Ok(None);
    }
    Ok(Some((Bytes::from(payload), next)))
}

impl Log {
    /// Open the log in `opts.dir` (created if missing), recovering every segment. Events of
    /// queues not in `known` (their subscription is gone) are not pending any more.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the file when a segment other than the newest is damaged
    /// (a crash cannot do that, see invariant 3); I/O failures.
    pub fn open(
        fs: Arc<dyn Fs>,
        opts: LogOptions,
        known: &HashSet<QueueId>,
        now_ms: u64,
    ) -> Result<(Self, Recovered), StoreError> {
        fs.create_dir_all(&opts.dir)
            .map_err(|e| io_err(&opts.dir, e))?;
        let mut numbers: Vec<u64> = fs
            .list(&opts.dir)
            .map_err(|e| io_err(&opts.dir, e))?
            .iter()
            .filter_map(|n| format::parse_segment_name(n))
            .collect();
        numbers.sort_unstable();
        let mut log = Log {
            fs,
            opts,
            segs: Vec::new(),
            retries: HashMap::new(),
            dropped: HashSet::new(),
            staged: Vec::new(),
            pending_events: Vec::new(),
            tail: std::collections::VecDeque::new(),
            tail_bytes: 0,
            max_seq: 0,
            failed: None,
            syncs: 0,
        };
        let count = numbers.len();
        for (i, no) in numbers.into_iter().enumerate() {
            log.recover_segment(no, i + 1 == count, known)?;
        }
        if log.segs.is_empty() {
            log.roll(now_ms)?;
        }
        log.forget_unknown(known);
        let recovered = log.recovered();
        Ok((log, recovered))
    }

    fn path(&self, no: u64) -> PathBuf {
        self.opts.dir.join(format::segment_name(no))
    }

    /// Read one segment's frames and apply their records.
    fn recover_segment(
        &mut self,
        no: u64,
        newest: bool,
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        let path = self.path(no);
        let file = self.fs.open(&path).map_err(|e| io_err(&path, e))?;
        let size = file.size().map_err(|e| io_err(&path, e))?;
        let mut hb = [0u8; HEADER];
        let read = file.read_at(&mut hb, 0).map_err(|e| io_err(&path, e))?;
        let hdr = match Header::decode(&hb[..read]) {
            Some(h) if h.no == no => h,
            // A segment whose header never became durable held no acknowledged frame.
            _ if newest => {
                tracing::warn!(file = %path.display(), "removing a segment whose header was never completed");
                self.fs.remove(&path).map_err(|e| io_err(&path, e))?;
                self.fs
                    .sync_dir(&self.opts.dir)
                    .map_err(|e| io_err(&self.opts.dir, e))?;
                return Ok(());
            }
            _ => return Err(corrupt(&path, "segment header is damaged")),
        };
        self.max_seq = self.max_seq.max(hdr.base_seq);
        self.segs.push(Seg {
            hdr,
            file: file.clone(),
            len: HEADER as u64,
            first_seq: None,
            last_seq: hdr.base_seq,
            index: Vec::new(),
            live: HashMap::new(),
            ms_runs: Vec::new(),
        });
        let mut offset = HEADER as u64;
        loop {
            let frame = read_frame(&*file, hdr.salt, offset, size).map_err(|e| io_err(&path, e))?;
            let Some((payload, next)) = frame else { break };
            let records = format::decode_records(&payload)
                .ok_or_else(|| corrupt(&path, format!("unreadable records at offset {offset}")))?;
            self.note_frame(offset, &records);
            for r in records {
                self.apply(r, known);
            }
            offset = next;
            if let Some(s) = self.segs.last_mut() {
                s.len = offset;
            }
        }
        if offset < size {
            if !newest {
                return Err(corrupt(
                    &path,
                    format!("damaged frame at offset {offset} of a segment that was complete"),
                ));
            }
            // The torn tail of the last group, never acknowledged: cut it so new frames follow
            // the last good one.
            tracing::warn!(file = %path.display(), offset, bytes = size - offset, "cutting a torn tail (an unacknowledged write cut short by a crash)");
            file.set_len(offset)
                .and_then(|_| file.sync_data())
                .map_err(|e| io_err(&path, e))?;
        }
        Ok(())
    }

    /// Index a frame that is about to be applied (recovery) or was just staged.
    fn note_frame(&mut self, offset: u64, records: &[Record]) {
        let Some(seg) = self.segs.last_mut() else {
            return;
        };
        let first = records.iter().find_map(|r| match r {
            Record::Event { seq, .. } => Some(*seq),
            _ => None,
        });
        if let Some(seq) = first {
            let far = seg
                .index
                .last()
                .is_none_or(|(_, o)| offset >= o + INDEX_STRIDE);
            if far {
                seg.index.push((seq, offset));
            }
        }
    }

    /// Apply one record to the in-memory state.
    fn apply(&mut self, r: Record, known: &HashSet<QueueId>) {
        match r {
            Record::Event {
                seq,
                first_ms,
                queues,
                ..
            } => {
                if let Some(seg) = self.segs.last_mut() {
                    if seg.ms_runs.last().is_none_or(|(_, ms)| *ms != first_ms) {
                        seg.ms_runs.push((seq, first_ms));
                    }
                }
                self.add_event(seq, queues.iter().filter(|q| known.contains(q)).copied())
            }
            Record::Settle { queue, seqs } => {
                for s in seqs {
                    self.settle_one(queue, s);
                }
            }
            Record::Retry { queue, state, seqs } => {
                for s in seqs {
                    if self.is_pending(queue, s) {
                        self.retries.insert((queue, s), state);
                    }
                }
            }
            Record::DropQueue { queue } => self.drop_queue_state(queue),
            Record::State {
                segment,
                first_seq,
                queues,
            } => {
                let Some(seg) = self.segs.iter_mut().find(|s| s.hdr.no == segment) else {
                    return;
                };
                if seg.first_seq != Some(first_seq) {
                    return;
                }
                // Everything said of this segment before is replaced, every queue.
                let old = std::mem::take(&mut seg.live);
                for qs in queues.into_iter().filter(|q| known.contains(&q.queue)) {
                    seg.live.insert(qs.queue, Bits::from_words(qs.words));
                    for (s, st) in qs.retries {
                        self.retries.insert((qs.queue, s), st);
                    }
                }
                for (q, bits) in old {
                    for i in bits.iter() {
                        if !seg.live.get(&q).is_some_and(|b| b.get(i)) {
                            self.retries.remove(&(q, first_seq + i));
                        }
                    }
                }
            }
        }
    }

    fn add_event(&mut self, seq: u64, queues: impl Iterator<Item = QueueId>) {
        self.max_seq = self.max_seq.max(seq);
        let Some(seg) = self.segs.last_mut() else {
            return;
        };
        let first = *seg.first_seq.get_or_insert(seq);
        seg.last_seq = seg.last_seq.max(seq);
        if seq < first {
            return; // out of order: cannot happen (invariant 2); never indexed
        }
        for q in queues {
            seg.live.entry(q).or_default().set(seq - first);
        }
    }

    fn seg_of(&self, seq: u64) -> Option<usize> {
        // Segments' ranges increase (invariant 2); one without events starts above its base.
        let i = self
            .segs
            .partition_point(|s| s.first_seq.unwrap_or(s.hdr.base_seq + 1) <= seq);
        let i = i.checked_sub(1)?;
        self.segs.get(i).and_then(|s| s.bit(seq)).map(|_| i)
    }

    fn is_pending(&self, queue: QueueId, seq: u64) -> bool {
        self.seg_of(seq)
            .and_then(|i| self.segs.get(i))
            .and_then(|s| Some(s.live.get(&queue)?.get(s.bit(seq)?)))
            .unwrap_or(false)
    }

    /// Clear `(queue, seq)`; true when it was pending.
    fn settle_one(&mut self, queue: QueueId, seq: u64) -> bool {
        self.retries.remove(&(queue, seq));
        let Some(i) = self.seg_of(seq) else {
            return false;
        };
        let Some(seg) = self.segs.get_mut(i) else {
            return false;
        };
        let Some(bit) = seg.bit(seq) else {
            return false;
        };
        let cleared = seg.live.get_mut(&queue).is_some_and(|b| b.clear(bit));
        if seg.live.get(&queue).is_some_and(|b| b.ones == 0) {
            seg.live.remove(&queue);
        }
        cleared
    }

    fn drop_queue_state(&mut self, queue: QueueId) {
        for s in &mut self.segs {
            s.live.remove(&queue);
        }
        self.retries.retain(|(q, _), _| *q != queue);
    }

    fn forget_unknown(&mut self, known: &HashSet<QueueId>) {
        for s in &mut self.segs {
            s.live.retain(|q, _| known.contains(q));
        }
        self.retries.retain(|(q, _), _| known.contains(q));
    }

    /// Per queue, `(seq, retry state)` of every pending event, in order (a fresh event's state:
    /// 0 attempts, first enqueued `first_ms` from its record).
    fn recovered(&mut self) -> Recovered {
        let mut out: Recovered = HashMap::new();
        for s in &mut self.segs {
            let runs = std::mem::take(&mut s.ms_runs);
            let Some(first) = s.first_seq else { continue };
            for (q, bits) in &s.live {
                let v = out.entry(*q).or_default();
                // Segments come in sequence order, and so do their bits.
                for i in bits.iter() {
                    let seq = first + i;
                    let st = self.retries.get(&(*q, seq)).copied().unwrap_or_else(|| {
                        let run = runs.partition_point(|(f, _)| *f <= seq);
                        let ms = run
                            .checked_sub(1)
                            .and_then(|r| runs.get(r))
                            .map_or(0, |r| r.1);
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

    /// `(seq, retry state)` of every pending event of `queue`, in order, reading the log for the
    /// first-enqueued times (after start-up; recovery answers the first call per queue).
    ///
    /// # Errors
    /// Unreadable data.
    pub fn index_of(&self, queue: QueueId) -> Result<Vec<(u64, RetryState)>, StoreError> {
        let seqs: Vec<u64> = self
            .segs
            .iter()
            .filter_map(|s| Some((s.first_seq?, s.live.get(&queue)?)))
            .flat_map(|(first, bits)| bits.iter().map(move |i| first + i))
            .collect();
        Ok(self
            .plan_get(queue, &seqs)
            .run()?
            .into_iter()
            .flatten()
            .map(|e| (e.seq, e.state))
            .collect())
    }

    /// Highest sequence number ever appended (or reserved by a segment header).
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// Bytes of every segment file.
    pub fn bytes(&self) -> u64 {
        self.segs.iter().map(|s| s.len).sum::<u64>() + self.staged.len() as u64
    }

    /// Bytes of segments the next collection deletes (see [`Log::stage_collection`]).
    fn reclaimable(&self) -> u64 {
        let n = self.segs.len();
        self.segs
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.pending() == 0
                    && (i + 1 < n || s.len >= (self.opts.segment_bytes / 4).max(HEADER as u64 + 1))
            })
            .map(|(_, s)| s.len)
            .sum()
    }

    /// Bytes the segment files occupy on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.segs.iter().map(|s| s.file.disk_bytes()).sum()
    }

    /// Segment files.
    pub fn segments(&self) -> usize {
        self.segs.len()
    }

    /// Refuse writes from now on (a write or sync failed).
    pub fn fail(&mut self, why: String) {
        tracing::error!(error = %why, "event log write failed: refusing writes until gridlet restarts");
        self.failed.get_or_insert(why);
    }

    fn check(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(why) => Err(StoreError::Io(format!(
                "the event log failed earlier ({why}); restart gridlet"
            ))),
            None => Ok(()),
        }
    }

    /// Stage events (one publish's copies: `(queue, event)` pairs, the same event once per
    /// queue, in sequence order) for the next frame: each body once. Queues deleted are left out.
    ///
    /// # Errors
    /// [`StoreError::Full`] when the disk bound would be passed (nothing staged then); an earlier
    /// write failure.
    pub fn stage_events(
        &mut self,
        items: &[(QueueId, StoredEvent)],
        reserved: u64,
    ) -> Result<(), StoreError> {
        self.check()?;
        let mut events: BTreeMap<u64, (&StoredEvent, Vec<QueueId>)> = BTreeMap::new();
        for (q, e) in items {
            if !self.dropped.contains(q) {
                events.entry(e.seq).or_insert((e, Vec::new())).1.push(*q);
            }
        }
        if let Some((&first, _)) = events.first_key_value() {
            if first <= self.max_seq {
                return Err(StoreError::Io(format!(
                    "event {first} submitted out of order (the log is at {})",
                    self.max_seq
                )));
            }
        }
        let bytes: u64 = events
            .values()
            .map(|(e, qs)| Record::event_len(qs.len(), e.id.len(), e.body.len()) as u64)
            .sum();
        // Segments with nothing pending are deleted by the next collection (right after this
        // frame): they do not hold the bound.
        let used = (self.bytes() + reserved).saturating_sub(self.reclaimable());
        if used + bytes > self.opts.max_disk_bytes {
            return Err(StoreError::Full {
                used,
                limit: self.opts.max_disk_bytes,
            });
        }
        for (e, queues) in events.into_values() {
            self.add_staged_event(e, queues);
        }
        Ok(())
    }

    fn add_staged_event(&mut self, e: &StoredEvent, queues: Vec<QueueId>) {
        let rec = Record::Event {
            seq: e.seq,
            first_ms: e.state.first_enqueued_ms,
            queues,
            id: e.id.clone(),
            body: e.body.clone(),
        };
        rec.encode(&mut self.staged);
        if let Record::Event {
            seq,
            first_ms,
            queues,
            id,
            body,
        } = rec
        {
            self.max_seq = self.max_seq.max(seq);
            let cached = Cached {
                seq,
                id,
                body,
                first_ms,
            };
            self.pending_events.push((cached, queues));
        }
    }

    /// Stage the settlement of events of `queue` (delivered, dropped, dead-lettered).
    pub fn stage_settle(&mut self, queue: QueueId, seqs: &[u64]) {
        let done: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| self.settle_one(queue, *s))
            .collect();
        if !done.is_empty() {
            Record::Settle { queue, seqs: done }.encode(&mut self.staged);
        }
    }

    /// Stage a new retry state for events of `queue`.
    pub fn stage_retry(&mut self, queue: QueueId, seqs: &[u64], state: RetryState) {
        let live: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| self.is_pending(queue, *s))
            .collect();
        for s in &live {
            self.retries.insert((queue, *s), state);
        }
        if !live.is_empty() {
            Record::Retry {
                queue,
                state,
                seqs: live,
            }
            .encode(&mut self.staged);
        }
    }

    /// Stage the deletion of a queue: nothing of it is pending any more, and later appends to it
    /// are left out.
    pub fn stage_drop_queue(&mut self, queue: QueueId) {
        self.dropped.insert(queue);
        self.drop_queue_state(queue);
        Record::DropQueue { queue }.encode(&mut self.staged);
    }

    /// Whether anything waits for the next frame.
    pub fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Take what is staged as one frame for the head segment (starting a new head first when it
    /// is full). Write it with [`FrameWrite::run`], outside any lock.
    ///
    /// # Errors
    /// Starting a new segment failed, or an earlier write failure.
    pub fn take_frame(&mut self, now_ms: u64) -> Result<Option<FrameWrite>, StoreError> {
        self.check()?;
        if self.staged.is_empty() {
            return Ok(None);
        }
        let head_full = self
            .segs
            .last()
            .is_none_or(|s| s.len >= self.opts.segment_bytes && s.len > HEADER as u64);
        if head_full {
            self.roll(now_ms)?;
        }
        let payload = std::mem::take(&mut self.staged);
        let pending = std::mem::take(&mut self.pending_events);
        let first_event = pending.first().map(|(c, _)| c.seq);
        for (cached, queues) in pending {
            self.add_event(cached.seq, queues.into_iter());
            self.tail_bytes += cached.body.len();
            self.tail.push_back(cached);
        }
        while self.tail_bytes > self.opts.tail_bytes {
            match self.tail.pop_front() {
                Some(c) => self.tail_bytes -= c.body.len(),
                None => break,
            }
        }
        let Some(seg) = self.segs.last_mut() else {
            return Err(StoreError::Io("event log has no segment".into()));
        };
        let offset = seg.len;
        let mut bytes = Vec::with_capacity(FRAME_HEAD + payload.len());
        format::frame(seg.hdr.salt, &payload, &mut bytes);
        seg.len += bytes.len() as u64;
        if let Some(first) = first_event {
            let far = seg
                .index
                .last()
                .is_none_or(|(_, o)| offset >= o + INDEX_STRIDE);
            if far {
                seg.index.push((first, offset));
            }
        }
        Ok(Some(FrameWrite {
            file: seg.file.clone(),
            offset,
            bytes,
        }))
    }

    /// Start a new head segment: sync the old head, create the file, write and sync its header,
    /// sync the directory.
    fn roll(&mut self, now_ms: u64) -> Result<(), StoreError> {
        if let Some(old) = self.segs.last() {
            let p = self.path(old.hdr.no);
            if let Err(e) = old.file.sync_data() {
                self.fail(format!("{}: {e}", p.display()));
                return self.check();
            }
        }
        let no = self.segs.last().map_or(1, |s| s.hdr.no + 1);
        let path = self.path(no);
        let hdr = Header {
            no,
            salt: rand_u64(),
            base_seq: self.max_seq,
            created_ms: now_ms,
        };
        let made = self.fs.create(&path).and_then(|f| {
            f.write_at(&hdr.encode(), 0)?;
            f.sync_data()?;
            self.fs.sync_dir(&self.opts.dir)?;
            Ok(f)
        });
        let file = match made {
            Ok(f) => f,
            Err(e) => {
                self.fail(format!("{}: {e}", path.display()));
                return self.check();
            }
        };
        // A head that was pending adopts no more events: its bits stop at its last sequence.
        self.segs.push(Seg {
            hdr,
            file,
            len: HEADER as u64,
            first_seq: None,
            last_seq: hdr.base_seq,
            index: Vec::new(),
            live: HashMap::new(),
            ms_runs: Vec::new(),
        });
        Ok(())
    }

    /// Stage what deleting the segments with nothing pending needs, and name them: the
    /// restatement of every older live segment (invariant 5). The caller commits the frame, then
    /// calls [`Log::remove_segments`].
    pub fn stage_collection(&mut self, now_ms: u64) -> Vec<u64> {
        // A head with nothing pending that holds a quarter of a segment is closed, so that it can
        // go too (its bytes count against the disk bound until then).
        let head_done = self.segs.last().is_some_and(|s| {
            s.pending() == 0 && s.len >= (self.opts.segment_bytes / 4).max(HEADER as u64 + 1)
        });
        if head_done && self.pending_events.is_empty() && self.roll(now_ms).is_err() {
            return Vec::new();
        }
        let head = self.segs.len().saturating_sub(1);
        let dead: Vec<usize> = (0..head)
            .filter(|i| self.segs.get(*i).is_some_and(|s| s.pending() == 0))
            .collect();
        let Some(&newest_dead) = dead.last() else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for s in self.segs.iter().take(newest_dead) {
            let Some(first) = s.first_seq else { continue };
            if s.pending() == 0 {
                continue;
            }
            let queues = s
                .live
                .iter()
                .map(|(q, bits)| QueueState {
                    queue: *q,
                    words: bits.words.clone(),
                    retries: bits
                        .iter()
                        .filter_map(|i| {
                            let seq = first + i;
                            self.retries.get(&(*q, seq)).map(|st| (seq, *st))
                        })
                        .collect(),
                })
                .collect();
            records.push(Record::State {
                segment: s.hdr.no,
                first_seq: first,
                queues,
            });
        }
        for r in records {
            r.encode(&mut self.staged);
        }
        dead.iter()
            .filter_map(|i| self.segs.get(*i).map(|s| s.hdr.no))
            .collect()
    }

    /// Remove the named segments (after the frame [`Log::stage_collection`] staged is durable)
    /// and sync the directory.
    ///
    /// # Errors
    /// I/O failure (the log then fails: see invariant 6).
    pub fn remove_segments(&mut self, nos: &[u64]) -> Result<(), StoreError> {
        if nos.is_empty() {
            return Ok(());
        }
        for no in nos {
            let path = self.path(*no);
            if let Err(e) = self.fs.remove(&path) {
                self.fail(format!("{}: {e}", path.display()));
                return self.check();
            }
        }
        self.segs.retain(|s| !nos.contains(&s.hdr.no));
        if let Err(e) = self.fs.sync_dir(&self.opts.dir) {
            self.fail(format!("{}: {e}", self.opts.dir.display()));
            return self.check();
        }
        Ok(())
    }

    /// Stage, write and sync one frame, then give back dead segments: the whole group-commit
    /// step in one call (the simulation and tests use it; the store splits it around its lock).
    ///
    /// # Errors
    /// A write or sync failed (the log has failed then).
    pub fn commit(&mut self, now_ms: u64) -> Result<(), StoreError> {
        self.write_staged(now_ms)?;
        let dead = self.stage_collection(now_ms);
        if !dead.is_empty() {
            self.write_staged(now_ms)?;
            self.remove_segments(&dead)?;
        }
        Ok(())
    }

    fn write_staged(&mut self, now_ms: u64) -> Result<(), StoreError> {
        if let Some(w) = self.take_frame(now_ms)? {
            if let Err(e) = w.run() {
                self.fail(e.to_string());
                return self.check();
            }
            self.syncs += 1;
        }
        Ok(())
    }

    /// Plan reading events of `queue` by sequence number (run it with [`Reads::run`], outside
    /// the lock); `None` for one not pending.
    pub fn plan_get(&self, queue: QueueId, seqs: &[u64]) -> Reads {
        let states = seqs
            .iter()
            .filter_map(|s| self.retries.get(&(queue, *s)).map(|st| (*s, *st)))
            .collect();
        let mut cached = Vec::new();
        let mut from_disk = Vec::new();
        for (pos, seq) in seqs.iter().enumerate() {
            if !self.is_pending(queue, *seq) {
                continue;
            }
            match self.cached(*seq) {
                Some(c) => cached.push((pos, c.clone())),
                None => from_disk.push((pos, *seq)),
            }
        }
        Reads {
            plans: self.plan_reads(&from_disk),
            cached,
            states,
            n: seqs.len(),
        }
    }

    /// A recently written event, if the tail still holds it.
    fn cached(&self, seq: u64) -> Option<&Cached> {
        let i = self.tail.partition_point(|c| c.seq < seq);
        self.tail.get(i).filter(|c| c.seq == seq)
    }

    /// Reads of pending events (`(position asked, seq)`) from their segments.
    fn plan_reads(&self, wanted: &[(usize, u64)]) -> Vec<ReadPlan> {
        // Group the wanted events by the index entry they start from.
        let mut groups: BTreeMap<(usize, u64), Vec<(usize, u64)>> = BTreeMap::new();
        for &(pos, seq) in wanted {
            let seq = &seq;
            let Some(i) = self.seg_of(*seq) else { continue };
            let Some(seg) = self.segs.get(i) else {
                continue;
            };
            let at = seg.index.partition_point(|(s, _)| *s <= *seq);
            let from = at
                .checked_sub(1)
                .and_then(|k| seg.index.get(k))
                .map_or(HEADER as u64, |(_, o)| *o);
            groups.entry((i, from)).or_default().push((pos, *seq));
        }
        groups
            .into_iter()
            .filter_map(|((i, from), want)| {
                let seg = self.segs.get(i)?;
                Some(ReadPlan {
                    file: seg.file.clone(),
                    salt: seg.hdr.salt,
                    from,
                    end: seg.len,
                    want,
                })
            })
            .collect()
    }
}

/// Reads planned under the log's lock ([`Log::plan_get`]).
pub struct Reads {
    plans: Vec<ReadPlan>,
    /// Events the tail held: `(position asked, event)`.
    cached: Vec<(usize, Cached)>,
    /// Retry states of the wanted events that have one.
    states: HashMap<u64, RetryState>,
    n: usize,
}

impl Reads {
    /// Read the events, in the order asked.
    ///
    /// # Errors
    /// Unreadable data.
    pub fn run(self) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        let mut out: Vec<Option<StoredEvent>> = vec![None; self.n];
        for (pos, c) in &self.cached {
            let state = self.states.get(&c.seq).copied().unwrap_or(RetryState {
                attempts: 0,
                first_enqueued_ms: c.first_ms,
                due_ms: 0,
            });
            if let Some(slot) = out.get_mut(*pos) {
                *slot = Some(StoredEvent {
                    seq: c.seq,
                    id: c.id.clone(),
                    body: c.body.clone(),
                    state,
                });
            }
        }
        for p in &self.plans {
            self.run_read(p, &mut out)?;
        }
        Ok(out)
    }

    fn run_read(&self, p: &ReadPlan, out: &mut [Option<StoredEvent>]) -> Result<(), StoreError> {
        let mut want: HashMap<u64, usize> = p.want.iter().map(|(pos, s)| (*s, *pos)).collect();
        let last = p.want.iter().map(|(_, s)| *s).max().unwrap_or(0);
        let mut offset = p.from;
        while !want.is_empty() {
            let frame = read_frame(&*p.file, p.salt, offset, p.end)
                .map_err(|e| StoreError::Io(e.to_string()))?;
            let Some((payload, next)) = frame else { break };
            let records = format::decode_records(&payload)
                .ok_or_else(|| StoreError::Corrupt(format!("unreadable records at {offset}")))?;
            let mut past = false;
            for r in records {
                if let Record::Event {
                    seq,
                    first_ms,
                    id,
                    body,
                    ..
                } = r
                {
                    past |= seq > last;
                    if let Some(pos) = want.remove(&seq) {
                        let state = self.states.get(&seq).copied().unwrap_or(RetryState {
                            attempts: 0,
                            first_enqueued_ms: first_ms,
                            due_ms: 0,
                        });
                        if let Some(slot) = out.get_mut(pos) {
                            *slot = Some(StoredEvent {
                                seq,
                                id,
                                body,
                                state,
                            });
                        }
                    }
                }
            }
            if past {
                break;
            }
            offset = next;
        }
        Ok(())
    }
}

/// 64 random bits for a segment's salt (time and address entropy are enough: the salt only has
/// to differ between segment incarnations, it is no secret).
fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        return crate::clock::system_wall_ms().rotate_left(17) ^ 0x5bd1_e995;
    }
    u64::from_le_bytes(b)
}
