//! The event log's engine: segments on an [`Fs`], what each one still owes each queue, group
//! commit of frames, recovery, and giving space back. Synchronous and single-owner: the store
//! (`log.rs`) holds it behind a mutex, and the committer's round (`round.rs`, one executor for
//! the store's thread, the simulation of the store and the engine's tests) calls it step by
//! step.
//!
//! Files: this one stages events and settlements, and rolls segments; `engine/frame.rs` takes
//! what is staged as a frame and writes it; `engine/segment.rs` is a segment in memory (its bits); `engine/collect.rs` gives dead
//! segments back; `engine/compact.rs` copies the pending events of a pinned segment into a
//! smaller file; `engine/checkpoint.rs` writes and reads checkpoints; `engine/recover.rs`
//! opens the log (`engine/replay.rs` walks a segment's frames, `engine/damage.rs` tells damage
//! from a torn tail); `engine/scrub.rs` checks in the background the frames a checkpoint vouched
//! for; `engine/read.rs` reads events back (tail first, then frames).
//!
//! # Invariants
//!
//! 1. **Bodies once.** An event is one [`Record::Event`] listing every queue it is pending in.
//!    What happens to it afterwards is small records: [`Record::Settle`], [`Record::Retry`].
//! 2. **Sequence order.** Event records are appended in increasing sequence number (the broker
//!    submits publishes in the order it numbers them), so the segment of a sequence number is a
//!    binary search and a sparse index per segment finds its frame.
//! 3. **Durable before acknowledged.** A round (`store/log/round.rs`) writes one frame and `fdatasync`s it before
//!    any event in it is acknowledged. A new segment's header is synced, and its directory entry
//!    too, before a frame goes into it; the old head is synced before it stops being the head,
//!    so only the newest segment can end in a torn frame.
//! 4. **What is owed.** In memory, each segment keeps one bit per sequence number per queue
//!    (set: pending there) and the retry states of pending events that failed. Recovery rebuilds
//!    exactly this from the records, a [`Record::State`] replacing what came before it.
//!    Beside each queue's bits, the bytes of the bodies they stand for ([`Bits`]): added as an
//!    event is written, less each settled event's size (the settling caller has its body),
//!    which the settle record carries, so recovery rebuilds them from the checkpoint and the
//!    records after it without reading a body. Where records cannot tell (a restatement that
//!    changed the bits, damage, a log written before bytes were counted), recovery counts that
//!    segment again from its frames (`engine/sizes.rs`).
//! 5. **Space back.** A segment with nothing pending is deleted. The oldest one simply goes. A
//!    younger one may hold settle and retry records about older segments still alive, so those
//!    its records name ([`segment::Refs`]) are first restated ([`Record::State`], synced) in the
//!    head; then the file is removed and
//!    its directory synced; one of them may instead be renamed to the spare
//!    ([`format::SPARE`]), which the next roll renames to the new head's name before writing
//!    its header (so frames overwrite written blocks: no reserved block converted, no inode
//!    written, at each sync). A segment pinned by a few events is replaced by a copy of them
//!    under the same number (`engine/compact.rs`): the older segments it names are restated first, and
//!    nothing from it on is deleted while the copy is made.
//! 6. **Fail-stop.** After a failed write or sync the log refuses every later write: what the
//!    page cache holds is unknown (as PostgreSQL learned), and a restart recovers from the disk.

mod checkpoint;
mod collect;
mod compact;
mod damage;
mod frame;
mod read;
mod records;
mod recover;
mod replay;
#[cfg(test)]
mod restart_tests;
mod retain;
mod scrub;
mod segment;
mod sizes;
mod stage;

use super::format::{self, Header, HEADER};
use crate::store::fs::{Fs, FsFile};
use crate::store::{QueueId, RetryState, StoreError};
use bytes::Bytes;
pub use checkpoint::CheckpointWrite;
pub use compact::{Compacted, Compaction, IDLE_MS as COMPACT_IDLE_MS};
pub(crate) use damage::{frame_at, next_frame, quarantine, read_whole, zeros_after};
pub use damage::{Damage, Keep, Loss, Torn, QUARANTINE};
pub use frame::FrameWrite;
pub(crate) use read::read_frame;
pub use read::Reads;
pub use retain::RetainedScan;
pub use scrub::{Finding, ScrubJob, Scrubbed, SCRUB_BYTES_PER_SEC, SCRUB_CHUNK};
pub use segment::Bits;
use segment::Seg;
use std::collections::{HashMap, HashSet};
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
    trace: Option<Arc<crate::telemetry::TraceContext>>,
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
    /// A checkpoint is due once this many bytes of frames were written since the last one
    /// ([`CHECKPOINT_BYTES`] in the store): opening the log reads at most about this much.
    pub checkpoint_bytes: u64,
    /// Frames are written as whole blocks of this many bytes at offsets that are multiples of
    /// it ([`crate::store::fs::DIRECT_ALIGN`] in the store, so they go to the device
    /// directly; 1 = as they are). The head's last partial block is kept in memory and written
    /// again, completed, with the next frame (or its last sectors: [`LogOptions::sector`]).
    pub align: u64,
    /// Writes that stay within blocks written before, or within one block, and are at most
    /// [`SECTOR_WRITE_MAX`], go as whole sectors of this many bytes instead of whole `align`
    /// blocks (0 in the store: the head file's [`FsFile::direct_align`], 512 on most disks;
    /// `align` or more: never). A sync of a few small events then rewrites a sector or two,
    /// not a 4 KiB block. Not larger writes, and not into reserved blocks: there ext4 zeroes
    /// the rest of each block a write ends in, and serialises the write, which measured slower
    /// than whole blocks from 3 KB frames on (docs/BENCHMARKS.md, thirteenth session).
    pub sector: u64,
    /// The head's file is reserved ([`FsFile::allocate`]) in steps of this many bytes, ahead
    /// of its frames ([`ALLOCATE_STEP`] in the store).
    pub allocate_step: u64,
    /// A closed segment is compacted once none of its events was settled for this long
    /// ([`compact::IDLE_MS`] in the store); segments are weighed at most once a second, or at
    /// every frame when this is 0.
    pub compact_idle_ms: u64,
    /// Damage stops the open with [`StoreError::Corrupt`] at the first loss found, before any
    /// file is copied, cut or moved (`persistence__onDamage=refuse`); otherwise it is
    /// recovered around and reported ([`Log::damage`]).
    pub refuse_damage: bool,
}

/// Reservation step of the head segment's file, by default: one `fallocate` per 256 KiB of
/// frames, at most that much reserved and not yet written (counted in the disk bound).
pub const ALLOCATE_STEP: u64 = 256 << 10;

/// Largest write made of sectors rather than blocks ([`LogOptions::sector`]).
pub const SECTOR_WRITE_MAX: u64 = 16 << 10;

/// Bytes of frames between checkpoints, by default.
pub const CHECKPOINT_BYTES: u64 = 64 << 20;

/// What a store open found, per queue: its pending events (fresh ones as runs), in order.
pub type Recovered = HashMap<QueueId, crate::store::PendingRuns>;

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
    /// The segments the records in `staged` speak of: they join the refs of the segment their
    /// frame goes to ([`segment::Refs`]).
    staged_refs: segment::Refs,
    /// Segments restated ([`Record::State`]) since open, before a deletion or a compaction.
    restated: u64,
    /// The most recently written events, in sequence order, `opts.tail_bytes` of bodies at most.
    tail: std::collections::VecDeque<Cached>,
    tail_bytes: usize,
    /// Frames read lately, decoded ([`read::FrameCache`]), shared with reads run outside the
    /// lock.
    frames: Arc<std::sync::Mutex<read::FrameCache>>,
    max_seq: u64,
    failed: Option<String>,
    /// Frames written and synced (the group-commit counter).
    pub syncs: u64,
    /// Bytes of frames taken since open.
    written: u64,
    /// The last checkpoint written: its generation and `written` then.
    ck_generation: u64,
    ck_written: u64,
    /// The checkpoint slot files, once opened.
    ck_files: HashMap<u64, Arc<dyn FsFile>>,
    /// A checkpoint prepared and not yet written: `(generation, written, ck_asap before)`.
    ck_pending: Option<(u64, u64, bool, HashSet<u64>)>,
    /// The last checkpoint's buffer, kept for the next ([`Log::reuse_checkpoint_buffer`]).
    ck_buf: Vec<u8>,
    /// Bytes of the last checkpoint prepared: what taking one costs (`collect.rs` weighs the
    /// segments that wait for one against it).
    ck_len: u64,
    /// The head segment's bytes from its length rounded down to `opts.align` to its length:
    /// the start of the next frame's write.
    head_block: Vec<u8>,
    /// How far the head's file is reserved ([`ALLOCATE_STEP`]).
    head_allocated: u64,
    /// Below this offset the head's blocks hold written data (a recycled file's whole old
    /// length, then every block a frame reached): a write ending there goes by sectors.
    head_written: u64,
    /// [`LogOptions::sector`], resolved when the log opens.
    sector: u64,
    /// Wall ms of the last frame taken or collection (settlements note it in their segment).
    now_ms: u64,
    /// The compaction in flight, if any ([`Log::plan_compaction`]).
    compacting: Option<compact::InFlight>,
    /// Segments replaced by a compacted copy since open.
    compactions: u64,
    /// When segments were last weighed for compaction (wall ms).
    compaction_checked_ms: u64,
    /// A compaction replaced a segment since the last checkpoint: take one now, so that a
    /// restart does not find the checkpoint's record of the old file and read every segment.
    ck_asap: bool,
    /// Bytes of the segment file given back and kept to become the next head
    /// ([`format::SPARE`]), if there is one (known here: `bytes` runs on every publish).
    spare: Option<u64>,
    /// Heads started in a spare since open.
    recycled: u64,
    /// What opening the log found ([`Log::damage`]).
    damage: Damage,
    /// Files put in the quarantine folder by this open.
    quarantined: HashSet<PathBuf>,
    /// Damaged spans' sequence numbers still to be forgotten: `(segment, before, after)`,
    /// both excluded.
    lost: Vec<(u64, u64, u64)>,
    /// Bytes of the quarantine folder (counted in the disk bound).
    quarantine_bytes: u64,
    /// Segments whose pending bytes recovery counts again from their frames (`engine/sizes.rs`).
    recount: HashSet<u64>,
    /// Segments the last checkpoint written (or read) records as owing events: not deleted
    /// before a later checkpoint records them owing none, so that a listed segment found
    /// missing while owing events is damage, never a deletion (see `collect.rs`).
    ck_owed: HashSet<u64>,
    /// Settled segments kept for a reader's horizon (`engine/retain.rs`).
    retain: retain::Retention,
    /// Segments whose checkpointed frames the scrub has not checked yet (`scrub.rs`).
    unverified: Vec<scrub::Unverified>,
    /// Failing frames met by reads and the scrub, for the next round ([`Log::record_findings`]).
    found: scrub::Findings,
    /// Losses the open found (those after are the scrub's and reads').
    losses_at_open: usize,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{}: {e}", path.display()))
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{}: {e}", path.display()))
}

impl Log {
    fn path(&self, no: u64) -> PathBuf {
        self.opts.dir.join(format::segment_name(no))
    }

    /// Note event `seq`, of `size` body bytes, pending in `queues`, in the head.
    fn add_event(&mut self, seq: u64, size: u64, queues: impl Iterator<Item = QueueId>) {
        self.max_seq = self.max_seq.max(seq);
        let Some(seg) = self.segs.last_mut() else {
            return;
        };
        let first = *seg.first_seq.get_or_insert(seq);
        seg.last_seq = seg.last_seq.max(seq);
        if seq < first {
            return; // out of order: cannot happen (invariant 2); never indexed
        }
        seg.events += 1;
        for q in queues {
            let bits = seg.live.entry(q).or_default();
            if bits.set(seq - first) {
                bits.bytes += size;
            }
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

    /// Whether event `seq` is pending in `queue`.
    pub fn is_pending(&self, queue: QueueId, seq: u64) -> bool {
        self.seg_of(seq)
            .and_then(|i| self.segs.get(i))
            .and_then(|s| Some(s.live.get(&queue)?.get(s.bit(seq)?)))
            .unwrap_or(false)
    }

    /// Clear `(queue, seq)`, `bytes` less owed in its segment; the segment's index when it was
    /// pending. A queue's bits and bytes go together once its last event there is settled.
    fn settle_one(&mut self, queue: QueueId, seq: u64, bytes: u64) -> Option<usize> {
        self.retries.remove(&(queue, seq));
        let i = self.seg_of(seq)?;
        let seg = self.segs.get_mut(i)?;
        let bit = seg.bit(seq)?;
        let bits = seg.live.get_mut(&queue)?;
        let cleared = bits.clear(bit);
        if cleared {
            bits.bytes = bits.bytes.saturating_sub(bytes);
        }
        if bits.ones == 0 {
            seg.live.remove(&queue);
        }
        if !cleared {
            return None;
        }
        seg.settled_ms = self.now_ms;
        Some(i)
    }

    fn drop_queue_state(&mut self, queue: QueueId) {
        for s in &mut self.segs {
            s.live.remove(&queue);
        }
        self.retries.retain(|(q, _), _| *q != queue);
    }

    /// Highest sequence number ever appended (or reserved by a segment header).
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// Bytes of the frames in every segment (without reserved blocks).
    pub fn frame_bytes(&self) -> u64 {
        self.segs.iter().map(|s| s.len).sum()
    }

    /// Bytes of every segment file (the head's with its blocks reserved ahead, and the spare).
    pub fn bytes(&self) -> u64 {
        let reserved = self
            .segs
            .last()
            .map_or(0, |h| self.head_allocated.saturating_sub(h.len));
        self.segs.iter().map(|s| s.len).sum::<u64>()
            + self.quarantine_bytes
            + self.staged.len() as u64
            + reserved
            + self.compaction_reserve()
            + self.spare_bytes()
    }

    /// Bytes of segments the next collection deletes (see [`Log::stage_collection`]).
    fn reclaimable(&self) -> u64 {
        let n = self.segs.len();
        self.segs
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.pending() == 0
                    && !self.kept(s)
                    && (i + 1 < n || s.len >= (self.opts.segment_bytes / 4).max(HEADER as u64 + 1))
            })
            .map(|(_, s)| s.len)
            .sum()
    }

    /// Bytes the segment files occupy on disk (the spare's included).
    pub fn disk_bytes(&self) -> u64 {
        self.segs.iter().map(|s| s.file.disk_bytes()).sum::<u64>()
            + self.spare_bytes()
            + self.quarantine_bytes
    }

    /// Bytes of the spare segment file (0: none).
    fn spare_bytes(&self) -> u64 {
        self.spare.unwrap_or(0)
    }

    /// Heads started in a spare segment file since open (the counter of `collect.rs`'s reuse).
    pub fn recycled(&self) -> u64 {
        self.recycled
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

    /// Start a new head segment: sync the old head, create the file (or take the spare, when
    /// `reuse`: the head filled up, so frames keep coming), write and sync its header, sync the
    /// directory. A head closed because it owes nothing (or to compact it) starts a fresh file:
    /// an idle log keeps the spare and a small head, not two segments' worth of blocks.
    fn roll(&mut self, now_ms: u64, reuse: bool) -> Result<(), StoreError> {
        if let Some(old) = self.segs.last() {
            // Its reserved blocks past the last frame go back, before a newer segment exists
            // (recovery also accepts zeros there, if this cut was lost).
            let p = self.path(old.hdr.no);
            if let Err(e) = old
                .file
                .set_len(old.len)
                .and_then(|()| old.file.sync_data())
            {
                self.fail(format!("{}: {e}", p.display()));
                return self.check();
            }
            old.file.done_writing();
        }
        let no = self.segs.last().map_or(1, |s| s.hdr.no + 1);
        let path = self.path(no);
        let hdr = Header {
            no,
            salt: rand_u64(),
            base_seq: self.max_seq,
            created_ms: now_ms,
            recycled: false,
        };
        let spare = if reuse { self.spare.take() } else { None };
        let hdr = Header {
            recycled: spare.is_some(),
            ..hdr
        };
        let align = self.opts.align.max(1) as usize;
        let block = hdr.encode().to_vec();
        let mut first = block.clone();
        first.resize(first.len().next_multiple_of(align), 0);
        let reserve = (first.len() as u64).next_multiple_of(self.opts.allocate_step.max(1));
        // A spare becomes the head under its new name before its header is written: a crash
        // in between leaves a newest segment whose header is not its own, which recovery
        // removes like one whose header was never completed.
        let opened = match spare {
            Some(_) => {
                self.recycled += 1;
                self.fs
                    .rename(&self.opts.dir.join(format::SPARE), &path)
                    .and_then(|()| self.fs.open(&path))
            }
            None => self.fs.create(&path),
        };
        let made = opened.and_then(|f| {
            f.allocate(reserve)?;
            f.write_at(&first, 0)?;
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
        self.head_block = if align > 1 { block } else { Vec::new() };
        // A spare's blocks are all written already: the head is reserved as far as it goes.
        let size = file.size().unwrap_or(0);
        self.head_allocated = reserve.max(size);
        self.head_written = if hdr.recycled { size } else { 0 }.max(first.len() as u64);
        // A head that was pending adopts no more events: its bits stop at its last sequence.
        let mut head = Seg::new(hdr, file, HEADER as u64);
        head.refs = segment::Refs::None;
        self.segs.push(head);
        Ok(())
    }

    /// After an open that found damage: start a new head, so that no frame is ever written
    /// after damaged data in the same segment. Frames appended behind a damaged frame of the
    /// newest segment were lost without a report at the next open (the store's power-cut
    /// simulation with damage, seed 349).
    ///
    /// # Errors
    /// Starting the segment failed (the log has failed then).
    pub fn start_clean_head(&mut self, now_ms: u64) -> Result<(), StoreError> {
        self.roll(now_ms, false)
    }

    /// Take, write and sync one frame of what is staged (no round: a test helper's step).
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
}

/// 64 random bits for a segment's salt (time and address entropy are enough: the salt only has
/// to differ between segment incarnations, it is no secret).
pub(crate) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        return crate::clock::system_wall_ms().rotate_left(17) ^ 0x5bd1_e995;
    }
    u64::from_le_bytes(b)
}
