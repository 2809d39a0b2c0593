//! Compaction: a closed segment pinned by a few slow events (a subscription retrying, or one
//! whose filter matches few events and whose endpoint is down) is rewritten as a new file that
//! holds only what is still pending, so the disk holds what is owed, not every segment a slow
//! event sits in.
//!
//! The copy keeps the segment's number, and so its place in the log: sequence order
//! (invariant 2 in [`super`]) and everything built on it stay as they are.
//!
//! 1. **Plan**, under the lock ([`Log::plan_compaction`]): the segment's pending events, the
//!    queues they are pending in and their retry states are noted, and every older live segment
//!    is restated in the head (the segment's settle and retry records about older segments go
//!    with the old file, as when a segment is deleted: invariant 5). The caller commits that
//!    frame before the copy.
//! 2. **Copy**, outside the lock ([`Compaction::run`]): the old file's frames are read, the
//!    pending events written again with the queues they are still pending in, their retry states
//!    after them, under a new salt into `<no>.seg.compact`; synced; renamed over the segment; the
//!    directory synced.
//! 3. **Swap**, under the lock ([`Log::finish_compaction`]): the segment's file, salt, length,
//!    index and bits (re-based on the copy's first event) become the copy's; a checkpoint is due
//!    (the last one describes the old file: a start from it would read every segment).
//!
//! Between plan and swap, settlements and retry states go on as usual, into the head. Recovery
//! from the copy gives the state as of the plan, and the records after it in the log apply on
//! top, as they did on the old file's state. Collection deletes neither the segment nor a
//! younger one meanwhile (`collect.rs`), so no settlement made since the plan goes away with its
//! segment before the copy is in place. A crash before the rename's directory sync leaves the
//! old file (a leftover `*.compact` is removed at the next start); after it, the copy.
//!
//! The head is a candidate too, when nothing is staged: it is closed (a new head started) and
//! then compacted, so a drain that leaves a few events in the head does not keep its bytes.
//!
//! **Write cost.** A segment is compacted when at most a quarter of its events are pending and
//! none of them was settled for [`IDLE_MS`] (`LogOptions::compact_idle_ms`) (a subscription draining it in order is left to
//! finish: collection then deletes it for nothing); the copy is abandoned if the pending events
//! hold more than half the segment's bytes, and not tried again before half of them are
//! settled. So a compaction writes at most as many bytes as it frees.

use super::format::{self, Header, Record, HEADER};
use super::read::read_frame;
use super::segment::{Bits, Seg};
use super::{Log, INDEX_STRIDE};
use crate::store::fs::{Fs, FsFile};
use crate::store::{QueueId, RetryState, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A segment is compacted only once no event of it was settled for this long.
pub const IDLE_MS: u64 = 10_000;
/// Segments are weighed for compaction at most this often.
const CHECK_EVERY_MS: u64 = 1_000;
/// Payload of the copy's frames.
const FRAME_BYTES: usize = 256 << 10;
/// Suffix of a copy being written.
const SUFFIX: &str = ".compact";

/// The compaction in flight (see [`Log::plan_compaction`]).
pub(super) struct InFlight {
    pub(super) no: u64,
    /// Bytes the copy may take, counted in the disk bound until it is done.
    pub(super) reserve: u64,
}

/// A compaction planned under the log's lock, run outside it ([`Compaction::run`]).
pub struct Compaction {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    hdr: Header,
    src: Arc<dyn FsFile>,
    len: u64,
    /// Damaged spans of the source, stepped over (the copy has none).
    holes: Vec<(u64, u64)>,
    /// Pending events at the plan: sequence number → the queues it is pending in.
    live: BTreeMap<u64, Vec<QueueId>>,
    retries: Vec<Record>,
    /// The copy is abandoned past this many bytes.
    max_copy: u64,
}

/// What a compaction did, for [`Log::finish_compaction`].
pub struct Compacted {
    no: u64,
    live: u64,
    outcome: Outcome,
}

enum Outcome {
    /// The copy replaced the segment (its bits are left empty: the swap re-bases the log's).
    Replaced(Box<Seg>),
    /// The pending events hold too much of the segment to be worth copying.
    Skipped,
    /// An I/O failure; after the rename the log's state is unknown and it fails.
    Failed { error: String, renamed: bool },
}

impl Compacted {
    /// Bytes of the new file, if the segment was replaced.
    pub fn replaced_bytes(&self) -> Option<u64> {
        match &self.outcome {
            Outcome::Replaced(s) => Some(s.len),
            _ => None,
        }
    }
}

/// Close the copy's frame under way (indexed by its first event) into `out`.
fn emit(payload: &mut Vec<u8>, first: Option<u64>, out: &mut Vec<u8>, seg: &mut Seg) {
    if payload.is_empty() {
        return;
    }
    if let Some(f) = first {
        seg.index_frame(f, out.len() as u64, INDEX_STRIDE);
    }
    format::frame(seg.hdr.salt, payload, out);
    payload.clear();
}

fn tmp_path(dir: &Path, no: u64) -> PathBuf {
    dir.join(format!("{}{SUFFIX}", format::segment_name(no)))
}

/// Whether `name` is a copy a compaction left unfinished.
fn is_leftover(name: &str) -> bool {
    name.strip_suffix(SUFFIX)
        .is_some_and(|n| format::parse_segment_name(n).is_some())
}

impl Log {
    /// Plan the compaction of one closed segment that is worth it (see the module docs), or of
    /// segment `only` whatever it holds (tests, the simulation). Stages the restatement of the
    /// older live segments: commit it before [`Compaction::run`].
    pub fn plan_compaction(&mut self, only: Option<u64>) -> Option<Compaction> {
        if self.compacting.is_some() || self.failed.is_some() {
            return None;
        }
        let head = self.segs.len().checked_sub(1)?;
        let now = self.now_ms;
        if only.is_none() {
            // Weighing every segment costs a pass over its bits: once a second is enough.
            let every = CHECK_EVERY_MS.min(self.opts.compact_idle_ms);
            if now < self.compaction_checked_ms + every {
                return None;
            }
            self.compaction_checked_ms = now;
        }
        let pick = self.pick_for_compaction(only, head)?;
        if pick == head && self.roll(now, false).is_err() {
            return None;
        }
        let seg = self.segs.get(pick)?;
        let live = seg.live_seqs();
        let retries = self.retry_records(&live);
        // Forced: copied whatever it costs.
        let max_copy = if only.is_some() {
            u64::MAX
        } else {
            seg.len / 2
        };
        let job = Compaction {
            fs: self.fs.clone(),
            dir: self.opts.dir.clone(),
            hdr: seg.hdr,
            src: seg.file.clone(),
            len: seg.len,
            holes: seg.holes.clone(),
            live,
            retries,
            max_copy,
        };
        // Segments that owe nothing too: they are deleted later, and the old file may hold the
        // settlements that made them so.
        let (refs, reserve) = (seg.refs, max_copy.min(seg.len));
        self.stage_restatements(pick, true, refs);
        self.compacting = Some(InFlight {
            no: job.hdr.no,
            reserve,
        });
        Some(job)
    }

    /// Position of the segment to compact: `only`'s if it owes anything, else the one that frees
    /// the most among those worth it (see the module docs); the head (`head`) only when nothing
    /// is staged for it.
    fn pick_for_compaction(&self, only: Option<u64>, head: usize) -> Option<usize> {
        if let Some(no) = only {
            return self
                .segs
                .iter()
                .take(head)
                .position(|s| s.hdr.no == no && s.pending() > 0 && !self.unverified(no));
        }
        let min_len = (self.opts.segment_bytes / 4).max(HEADER as u64 + 1);
        // A head pinned by a few events after a drain would otherwise hold its bytes until
        // traffic fills it.
        let head_too = self.staged.is_empty() && self.pending_events.is_empty();
        let upto = if head_too { head + 1 } else { head };
        self.segs
            .iter()
            .take(upto)
            .enumerate()
            .filter(|(_, s)| {
                s.pending() > 0
                    && !self.kept(s)
                    && !self.unverified(s.hdr.no)
                    && s.len >= min_len
                    && self.now_ms.saturating_sub(s.settled_ms) >= self.opts.compact_idle_ms
            })
            .filter_map(|(i, s)| {
                let live = s.live_events();
                let worth = live * 4 <= s.events && (s.skip_floor == 0 || live * 2 <= s.skip_floor);
                // By event count: the most bytes back.
                worth.then(|| (i, s.len - s.len * live / s.events.max(1)))
            })
            .max_by_key(|(_, gain)| *gain)
            .map(|(i, _)| i)
    }

    /// The retry states of the pending events `live`, as records for the copy (one per queue
    /// and state).
    fn retry_records(&self, live: &BTreeMap<u64, Vec<QueueId>>) -> Vec<Record> {
        let mut grouped: HashMap<(QueueId, RetryState), Vec<u64>> = HashMap::new();
        for (seq, queues) in live {
            for q in queues {
                if let Some(st) = self.retries.get(&(*q, *seq)) {
                    grouped.entry((*q, *st)).or_default().push(*seq);
                }
            }
        }
        // In a fixed order: by queue, then first event (each list is in sequence order).
        let mut grouped: Vec<_> = grouped.into_iter().collect();
        grouped.sort_unstable_by_key(|((q, _), seqs)| (*q, seqs.first().copied()));
        grouped
            .into_iter()
            .map(|((queue, state), seqs)| Record::Retry { queue, state, seqs })
            .collect()
    }

    /// Put what [`Compaction::run`] did in place (see the module docs).
    pub fn finish_compaction(&mut self, done: Compacted) {
        self.compacting = None;
        let Some(seg) = self.segs.iter_mut().find(|s| s.hdr.no == done.no) else {
            return; // cannot happen: collection keeps it while compacting
        };
        match done.outcome {
            Outcome::Replaced(copy) => match rebase(seg, &copy) {
                Ok(live) => {
                    let copy = *copy;
                    seg.hdr = copy.hdr;
                    seg.file = copy.file;
                    seg.len = copy.len;
                    seg.first_seq = copy.first_seq;
                    seg.last_seq = copy.last_seq;
                    seg.index = copy.index;
                    seg.ms_runs = copy.ms_runs;
                    seg.events = copy.events;
                    seg.skip_floor = 0;
                    // The copy holds none of the old file's damaged spans.
                    seg.holes = copy.holes;
                    seg.live = live;
                    self.compactions += 1;
                    self.ck_asap = true;
                }
                Err(seq) => self.fail(format!(
                    "compaction of segment {} left out pending event {seq}",
                    done.no
                )),
            },
            Outcome::Skipped => seg.skip_floor = done.live.max(1),
            Outcome::Failed {
                error,
                renamed: true,
            } => self.fail(error),
            Outcome::Failed { error, .. } => {
                // Not tried again every second (a full disk): only once half of it is settled.
                seg.skip_floor = done.live.max(1);
                tracing::warn!(segment = done.no, error = %error, "could not compact a segment of the event log; it stays as it is");
            }
        }
    }

    /// Closed segments with something pending: what [`Log::plan_compaction`] may take.
    pub fn closed_pending_segments(&self) -> Vec<u64> {
        let head = self.segs.len().saturating_sub(1);
        self.segs
            .iter()
            .take(head)
            .filter(|s| s.pending() > 0)
            .map(|s| s.hdr.no)
            .collect()
    }

    /// The wall clock moved on without a frame (an idle committer weighing compactions).
    pub fn note_time(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// Bytes a compaction in flight may add (counted in the disk bound).
    pub(super) fn compaction_reserve(&self) -> u64 {
        self.compacting.as_ref().map_or(0, |c| c.reserve)
    }

    /// Segments replaced by their compacted copy since open.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Plan, commit, run and finish a compaction in one call (tests, the simulation): whether a
    /// segment was replaced.
    ///
    /// # Errors
    /// A write or sync failed (the log has failed then), or the compaction failed.
    pub fn compact(&mut self, only: Option<u64>, now_ms: u64) -> Result<bool, StoreError> {
        let Some(job) = self.plan_compaction(only) else {
            return Ok(false);
        };
        if let Err(e) = self.write_staged(now_ms) {
            self.compacting = None;
            return Err(e);
        }
        let done = job.run();
        let replaced = done.replaced_bytes().is_some();
        let failed = match &done.outcome {
            Outcome::Failed { error, .. } => Some(error.clone()),
            _ => None,
        };
        self.finish_compaction(done);
        match failed {
            Some(e) => Err(StoreError::Io(e)),
            None => Ok(replaced),
        }
    }

    /// Remove copies a compaction left unfinished (a crash before their rename).
    pub(super) fn remove_leftovers(&self, names: &[String]) -> Result<(), StoreError> {
        let mut removed = false;
        for n in names.iter().filter(|n| is_leftover(n)) {
            let path = self.opts.dir.join(n);
            self.fs.remove(&path).map_err(|e| super::io_err(&path, e))?;
            removed = true;
        }
        if removed {
            self.fs
                .sync_dir(&self.opts.dir)
                .map_err(|e| super::io_err(&self.opts.dir, e))?;
        }
        Ok(())
    }
}

/// `seg`'s bits re-based on the copy's first event; `Err(seq)`: a pending event the copy does
/// not hold (cannot happen: what is pending now was pending at the plan).
fn rebase(seg: &Seg, copy: &Seg) -> Result<HashMap<QueueId, Bits>, u64> {
    let mut live = HashMap::new();
    for (q, bits) in &seg.live {
        // The same events: the same bytes.
        let mut moved = Bits {
            bytes: bits.bytes,
            ..Bits::default()
        };
        for i in bits.iter() {
            let seq = seg.first_seq.unwrap_or(0) + i;
            moved.set(copy.bit(seq).ok_or(seq)?);
        }
        if moved.ones > 0 {
            live.insert(*q, moved);
        }
    }
    Ok(live)
}

impl Compaction {
    /// Segment being compacted.
    pub fn segment(&self) -> u64 {
        self.hdr.no
    }

    /// Copy, sync, rename, sync the directory (see the module docs).
    pub fn run(self) -> Compacted {
        let no = self.hdr.no;
        let live = self.live.len() as u64;
        let outcome = match self.copy() {
            Ok(Some(copy)) => self.replace(copy),
            Ok(None) => Outcome::Skipped,
            Err(error) => Outcome::Failed {
                error,
                renamed: false,
            },
        };
        Compacted { no, live, outcome }
    }

    /// The copy's bytes and its segment in memory; `None` when it would pass `max_copy`.
    fn copy(&self) -> Result<Option<(Vec<u8>, Seg)>, String> {
        let path = self.dir.join(format::segment_name(self.hdr.no));
        let hdr = Header {
            salt: super::rand_u64(),
            // A new file, written whole: nothing of an earlier segment follows its frames.
            recycled: false,
            ..self.hdr
        };
        let mut out = hdr.encode().to_vec();
        let mut seg = Seg::new(hdr, self.src.clone(), HEADER as u64);
        let mut payload = Vec::new();
        let mut frame_first = None;
        let mut offset = HEADER as u64;
        let mut found = 0usize;
        while offset < self.len {
            offset = super::segment::past_hole(&self.holes, offset);
            if offset >= self.len {
                break;
            }
            let frame = read_frame(&*self.src, self.hdr.salt, offset, self.len)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let Some((bytes, next)) = frame else {
                return Err(format!("{}: unreadable frame at {offset}", path.display()));
            };
            let records = format::decode_records(&bytes)
                .ok_or_else(|| format!("{}: unreadable records at {offset}", path.display()))?;
            for r in records {
                let Record::Event {
                    seq,
                    first_ms,
                    id,
                    body,
                    trace,
                    ..
                } = r
                else {
                    continue;
                };
                let Some(queues) = self.live.get(&seq) else {
                    continue;
                };
                found += 1;
                frame_first.get_or_insert(seq);
                Record::Event {
                    seq,
                    first_ms,
                    queues: queues.clone(),
                    id,
                    body,
                    trace,
                }
                .encode(&mut payload);
                seg.first_seq.get_or_insert(seq);
                seg.last_seq = seq;
                seg.events += 1;
                seg.note_ms(seq, first_ms);
                if payload.len() >= FRAME_BYTES {
                    emit(&mut payload, frame_first.take(), &mut out, &mut seg);
                }
                if (out.len() + payload.len()) as u64 > self.max_copy {
                    return Ok(None);
                }
            }
            offset = next;
        }
        if found != self.live.len() {
            return Err(format!(
                "{}: {} pending events were not found in the segment",
                path.display(),
                self.live.len() - found
            ));
        }
        for r in &self.retries {
            r.encode(&mut payload);
        }
        emit(&mut payload, frame_first.take(), &mut out, &mut seg);
        seg.len = out.len() as u64;
        Ok(Some((out, seg)))
    }

    fn replace(&self, (bytes, mut seg): (Vec<u8>, Seg)) -> Outcome {
        let tmp = tmp_path(&self.dir, self.hdr.no);
        let path = self.dir.join(format::segment_name(self.hdr.no));
        let failed = |e: std::io::Error, p: &Path, renamed: bool| Outcome::Failed {
            error: format!("{}: {e}", p.display()),
            renamed,
        };
        // A leftover of an earlier attempt in this run (its rename failed).
        let _ = self.fs.remove(&tmp);
        let written = self.fs.create(&tmp).and_then(|f| {
            f.write_at(&bytes, 0)?;
            f.sync_data()?;
            Ok(f)
        });
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = self.fs.remove(&tmp);
                return failed(e, &tmp, false);
            }
        };
        if let Err(e) = self.fs.rename(&tmp, &path) {
            let _ = self.fs.remove(&tmp);
            return failed(e, &path, false);
        }
        if let Err(e) = self.fs.sync_dir(&self.dir) {
            return failed(e, &self.dir, true);
        }
        file.done_writing();
        seg.file = file;
        Outcome::Replaced(Box::new(seg))
    }
}
