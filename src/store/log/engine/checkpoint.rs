//! Checkpoints: what every segment owes, written now and then so that opening the log reads
//! only the frames written since, not the whole backlog.
//!
//! ```text
//! checkpoint.0, checkpoint.1   (written in turn, in place)
//!   magic "GRDCKP01" | generation u64 | body len u32 | crc32(body) u32 | body
//!   body: max seq u64 | dropped queues (count u32, queue u32…)
//!       | retry states (count u32, (queue u32, seq u64, attempts u32, first ms u64, due ms u64)…)
//!       | segments (count u32, then each: no u64, salt u64, valid length u64, event records
//!         u64, first seq u64 (0: none), last seq u64, index (count u32, (seq u64, offset u64)…), first-enqueue runs
//!         (count u32, (seq u64, ms u64)…), queues (count u32, then each: queue u32,
//!         word count u32, run count u32, runs: (0 | 1 u8, words u32) for all-zero / all-one
//!         words, (2 u8, word u64) for one mixed word))
//!       | pending bytes (since bytes are counted; absent before): version u8 = 1, count u32,
//!         (segment no u64, queue u32, body bytes u64)… for every queue each segment owes
//! ```
//!
//! The pending-bytes trailer is additive: a checkpoint without it reads as before, and the
//! segments it lists have their pending bytes counted from their frames once (`sizes.rs`).
//!
//! A checkpoint is taken by the committer between frames (no frame in flight), so it describes
//! the log exactly up to every segment's recorded length; settlements staged but not yet written
//! are already in it, which at worst makes a delivery's settlement durable a frame early.
//!
//! Opening with a checkpoint (the newer valid slot; a torn one fails its CRC and the other is
//! used): a segment it lists is restored from it and its frames past the recorded length are
//! replayed; a segment it does not list but numbered below its newest was deleted before it (a
//! removal whose directory sync a crash undid) and is removed again; a newer segment is read
//! whole; a listed segment that is gone was deleted after it. Anything that does not add up
//! (a file shorter than recorded, a header that differs: a compacted segment has a new salt)
//! falls back to reading every segment. A checkpoint of an earlier format (magic `GRDCKP01`)
//! is not read: the next start reads every segment once.

use super::format::Reader;
use super::segment::{Bits, Seg};
use super::{io_err, Log};
use crate::store::fs::FsFile;
use crate::store::{QueueId, RetryState, StoreError};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"GRDCKP02";
/// A checkpoint buffer is kept when its capacity is at most twice the last checkpoint plus this.
const CK_BUF_SLACK: usize = 64 << 10;
const HEAD: usize = 24;
/// Largest checkpoint body read (a longer length is damage).
const MAX_BODY: u32 = 512 << 20;
/// Most bit words one queue of one segment can have (2^30 sequence numbers; a 16 MiB segment
/// holds well under a million events): more is damage. Fits a 32-bit `usize`.
const MAX_WORDS: usize = 1 << 24;

/// One segment as a checkpoint records it: borrowed from the log's segments when one is
/// written (nothing a segment holds is copied to encode it), owned when one is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SegState<'a> {
    pub(super) no: u64,
    pub(super) salt: u64,
    pub(super) len: u64,
    pub(super) events: u64,
    pub(super) first_seq: Option<u64>,
    pub(super) last_seq: u64,
    pub(super) index: Cow<'a, [(u64, u64)]>,
    pub(super) ms_runs: Cow<'a, [(u64, u64)]>,
    pub(super) live: Vec<(QueueId, Cow<'a, [u64]>)>,
    /// Body bytes owed per queue (the trailer); `None`: a checkpoint written before bytes
    /// were counted.
    pub(super) bytes: Option<Vec<(QueueId, u64)>>,
}

/// A checkpoint's content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Checkpoint<'a> {
    pub(super) generation: u64,
    pub(super) max_seq: u64,
    pub(super) dropped: Vec<QueueId>,
    pub(super) retries: Vec<((QueueId, u64), RetryState)>,
    pub(super) segs: Vec<SegState<'a>>,
}

/// A checkpoint prepared under the lock, written outside it.
pub struct CheckpointWrite {
    file: Arc<dyn FsFile>,
    path: PathBuf,
    bytes: Vec<u8>,
}

impl CheckpointWrite {
    /// Write and sync the checkpoint into its slot.
    ///
    /// # Errors
    /// I/O failure (the previous checkpoint in the other slot stays valid).
    pub fn run(&self) -> Result<(), StoreError> {
        self.file
            .write_at(&self.bytes, 0)
            .and_then(|()| self.file.set_len(self.bytes.len() as u64))
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_err(&self.path, e))
    }

    /// Bytes written.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it is empty (never: a checkpoint has a header).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

fn put_words(out: &mut Vec<u8>, words: &[u64]) {
    let mut runs: Vec<(u8, u64)> = Vec::new();
    for w in words {
        let tag = match *w {
            0 => 0,
            u64::MAX => 1,
            _ => 2,
        };
        match runs.last_mut() {
            Some((t, n)) if *t == tag && tag != 2 && *n < u64::from(u32::MAX) => *n += 1,
            _ => runs.push((tag, if tag == 2 { *w } else { 1 })),
        }
    }
    out.extend_from_slice(&(words.len() as u32).to_le_bytes());
    out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for (tag, v) in runs {
        out.push(tag);
        if tag == 2 {
            out.extend_from_slice(&v.to_le_bytes());
        } else {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
    }
}

fn get_words(r: &mut Reader<'_>) -> Option<Vec<u64>> {
    let n = r.u32()? as usize;
    let runs = r.u32()? as usize;
    if runs > r.0.len() / 5 || n > MAX_WORDS {
        return None;
    }
    let mut words = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..runs {
        match r.u8()? {
            2 => words.push(r.u64()?),
            t @ (0 | 1) => {
                let k = r.u32()? as usize;
                if words.len() + k > n {
                    return None;
                }
                words.resize(words.len() + k, if t == 1 { u64::MAX } else { 0 });
            }
            _ => return None,
        }
    }
    (words.len() == n).then_some(words)
}

fn put_pairs(out: &mut Vec<u8>, v: &[(u64, u64)]) {
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    for (a, b) in v {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
}

fn get_pairs(r: &mut Reader<'_>) -> Option<Vec<(u64, u64)>> {
    let n = r.u32()? as usize;
    if n > r.0.len() / 16 {
        return None;
    }
    (0..n).map(|_| Some((r.u64()?, r.u64()?))).collect()
}

impl Checkpoint<'_> {
    /// Its bytes: the header, then the body written once into the same buffer, sized ahead
    /// (a checkpoint of a large backlog is megabytes: no second copy, no doubling growth).
    #[cfg(test)]
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        self.encode_into(&mut b);
        b
    }

    /// [`Checkpoint::encode`] into `b`, whose allocation is reused when it holds the size
    /// foreseen (the log keeps the last checkpoint's buffer: [`Log::reuse_checkpoint_buffer`]).
    pub(super) fn encode_into(&self, b: &mut Vec<u8>) {
        let want = HEAD + self.size_hint();
        b.clear();
        if b.capacity() < want {
            // Not `reserve`: a reallocation would copy the old buffer's bytes for nothing.
            *b = Vec::with_capacity(want);
        }
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.generation.to_le_bytes());
        // Body length and CRC, filled in below.
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&self.max_seq.to_le_bytes());
        b.extend_from_slice(&(self.dropped.len() as u32).to_le_bytes());
        for q in &self.dropped {
            b.extend_from_slice(&q.to_le_bytes());
        }
        b.extend_from_slice(&(self.retries.len() as u32).to_le_bytes());
        for ((q, seq), st) in &self.retries {
            b.extend_from_slice(&q.to_le_bytes());
            b.extend_from_slice(&seq.to_le_bytes());
            b.extend_from_slice(&st.attempts.to_le_bytes());
            b.extend_from_slice(&st.first_enqueued_ms.to_le_bytes());
            b.extend_from_slice(&st.due_ms.to_le_bytes());
        }
        b.extend_from_slice(&(self.segs.len() as u32).to_le_bytes());
        for s in &self.segs {
            b.extend_from_slice(&s.no.to_le_bytes());
            b.extend_from_slice(&s.salt.to_le_bytes());
            b.extend_from_slice(&s.len.to_le_bytes());
            b.extend_from_slice(&s.events.to_le_bytes());
            b.extend_from_slice(&s.first_seq.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&s.last_seq.to_le_bytes());
            put_pairs(b, &s.index);
            put_pairs(b, &s.ms_runs);
            b.extend_from_slice(&(s.live.len() as u32).to_le_bytes());
            for (q, words) in &s.live {
                b.extend_from_slice(&q.to_le_bytes());
                put_words(b, words);
            }
        }
        super::sizes::put_trailer(b, &self.segs);
        let body = b.get(HEAD..).unwrap_or_default();
        let (len, crc) = (
            (body.len() as u32).to_le_bytes(),
            crc32fast::hash(body).to_le_bytes(),
        );
        for (to, from) in b.iter_mut().skip(16).zip(len.iter().chain(&crc)) {
            *to = *from;
        }
    }

    /// About the body's length (the words of a queue at their longest, as if none were runs).
    fn size_hint(&self) -> usize {
        let retries = self.retries.len() * 36;
        let segs: usize = self
            .segs
            .iter()
            .map(|s| {
                let live: usize = s.live.iter().map(|(_, w)| 12 + w.len().min(64) * 9).sum();
                60 + (s.index.len() + s.ms_runs.len()) * 16 + live + s.live.len() * 20
            })
            .sum();
        16 + self.dropped.len() * 4 + retries + segs + 5
    }

    /// Decode a slot's bytes; `None` when they are not a whole, valid checkpoint.
    pub(super) fn decode(bytes: &[u8]) -> Option<Checkpoint<'static>> {
        let mut h = Reader(bytes.get(..HEAD)?);
        if h.take(8)? != MAGIC {
            return None;
        }
        let generation = h.u64()?;
        let len = h.u32()?;
        let crc = h.u32()?;
        if len > MAX_BODY {
            return None;
        }
        let body = bytes.get(HEAD..HEAD + len as usize)?;
        if crc32fast::hash(body) != crc {
            return None;
        }
        let mut r = Reader(body);
        let max_seq = r.u64()?;
        let nd = r.u32()? as usize;
        if nd > r.0.len() / 4 {
            return None;
        }
        let dropped = (0..nd).map(|_| r.u32()).collect::<Option<Vec<_>>>()?;
        let nr = r.u32()? as usize;
        if nr > r.0.len() / 36 {
            return None;
        }
        let retries = (0..nr)
            .map(|_| {
                let q = r.u32()?;
                let seq = r.u64()?;
                Some((
                    (q, seq),
                    RetryState {
                        attempts: r.u32()?,
                        first_enqueued_ms: r.u64()?,
                        due_ms: r.u64()?,
                    },
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        let ns = r.u32()? as usize;
        if ns > r.0.len() / 48 {
            return None;
        }
        let mut segs = Vec::with_capacity(ns);
        for _ in 0..ns {
            let no = r.u64()?;
            let salt = r.u64()?;
            let len = r.u64()?;
            let events = r.u64()?;
            let first = r.u64()?;
            let last_seq = r.u64()?;
            let index = get_pairs(&mut r)?;
            let ms_runs = get_pairs(&mut r)?;
            let nq = r.u32()? as usize;
            if nq > r.0.len() / 12 {
                return None;
            }
            let live = (0..nq)
                .map(|_| Some((r.u32()?, Cow::Owned(get_words(&mut r)?))))
                .collect::<Option<Vec<_>>>()?;
            segs.push(SegState {
                no,
                salt,
                len,
                events,
                first_seq: (first != 0).then_some(first),
                last_seq,
                index: Cow::Owned(index),
                ms_runs: Cow::Owned(ms_runs),
                live,
                bytes: None,
            });
        }
        if !r.is_empty() {
            super::sizes::get_trailer(&mut r, &mut segs)?;
        }
        r.is_empty().then_some(Checkpoint {
            generation,
            max_seq,
            dropped,
            retries,
            segs,
        })
    }
}

impl Log {
    fn slot_path(&self, slot: u64) -> PathBuf {
        self.opts.dir.join(format!("checkpoint.{slot}"))
    }

    /// The newest valid checkpoint of the two slots, if any.
    pub(super) fn load_checkpoint(&self) -> Result<Option<Checkpoint<'static>>, StoreError> {
        let names = self
            .fs
            .list(&self.opts.dir)
            .map_err(|e| io_err(&self.opts.dir, e))?;
        let mut best: Option<Checkpoint> = None;
        for slot in 0..2u64 {
            let path = self.slot_path(slot);
            if !names.iter().any(|n| *n == format!("checkpoint.{slot}")) {
                continue;
            }
            let file = self.fs.open(&path).map_err(|e| io_err(&path, e))?;
            let size = file.size().map_err(|e| io_err(&path, e))?;
            if size > u64::from(MAX_BODY) + HEAD as u64 {
                continue;
            }
            let mut buf = vec![0u8; size as usize];
            let n = file.read_at(&mut buf, 0).map_err(|e| io_err(&path, e))?;
            buf.truncate(n);
            if let Some(c) = Checkpoint::decode(&buf) {
                if best.as_ref().is_none_or(|b| c.generation > b.generation) {
                    best = Some(c);
                }
            }
        }
        Ok(best)
    }

    /// The segments the newest checkpoint in `opts.dir` records, `number -> (salt, valid
    /// length)`, and the newest of them (the simulation's damage faults).
    ///
    /// # Errors
    /// The directory cannot be read.
    pub fn recorded(
        fs: Arc<dyn crate::store::fs::Fs>,
        opts: super::LogOptions,
    ) -> Result<(Recorded, Option<u64>), StoreError> {
        let ck = Log::empty(fs, opts).load_checkpoint()?;
        let segs = ck.map(|c| c.segs).unwrap_or_default();
        let newest = segs.iter().map(|s| s.no).max();
        Ok((
            segs.iter().map(|s| (s.no, (s.salt, s.len))).collect(),
            newest,
        ))
    }

    /// Segments of `ck` owing events.
    pub(super) fn note_owed(&mut self, ck: &Checkpoint) {
        self.ck_owed = owed_in(ck);
    }

    /// What the log owes now, as a checkpoint (the caller makes sure no frame is in flight),
    /// borrowing the segments' bits, index and runs.
    fn snapshot(&self) -> Checkpoint<'_> {
        let mut dropped: Vec<QueueId> = self.dropped.iter().copied().collect();
        dropped.sort_unstable();
        let mut retries: Vec<((QueueId, u64), RetryState)> =
            self.retries.iter().map(|(k, v)| (*k, *v)).collect();
        retries.sort_unstable_by_key(|(k, _)| *k);
        Checkpoint {
            generation: self.ck_generation + 1,
            max_seq: self.max_seq,
            dropped,
            retries,
            segs: self
                .segs
                .iter()
                .map(|s| {
                    let mut live: Vec<(QueueId, Cow<'_, [u64]>)> = s
                        .live
                        .iter()
                        .map(|(q, b)| (*q, Cow::Borrowed(b.words.as_slice())))
                        .collect();
                    live.sort_unstable_by_key(|(q, _)| *q);
                    let mut bytes: Vec<(QueueId, u64)> =
                        s.live.iter().map(|(q, b)| (*q, b.bytes)).collect();
                    bytes.sort_unstable_by_key(|(q, _)| *q);
                    SegState {
                        no: s.hdr.no,
                        salt: s.hdr.salt,
                        len: s.len,
                        events: s.events,
                        first_seq: s.first_seq,
                        last_seq: s.last_seq,
                        index: Cow::Borrowed(s.index.as_slice()),
                        ms_runs: Cow::Borrowed(s.ms_runs.as_slice()),
                        live,
                        bytes: Some(bytes),
                    }
                })
                .collect(),
        }
    }

    /// Bytes written to segments since the last checkpoint.
    pub fn since_checkpoint(&self) -> u64 {
        self.written.saturating_sub(self.ck_written)
    }

    /// Whether a checkpoint is due: [`LogOptions::checkpoint_bytes`] of frames since the last
    /// one, or a segment was compacted since.
    ///
    /// [`LogOptions::checkpoint_bytes`]: super::LogOptions::checkpoint_bytes
    pub fn checkpoint_due(&self) -> bool {
        self.ck_asap || self.since_checkpoint() >= self.opts.checkpoint_bytes
    }

    /// Prepare a checkpoint for the slot its generation goes to (created on first use, its
    /// directory entry synced). Write it with [`CheckpointWrite::run`] outside any lock, then
    /// call [`Log::checkpoint_done`].
    ///
    /// # Errors
    /// The slot file could not be created.
    pub fn prepare_checkpoint(&mut self) -> Result<CheckpointWrite, StoreError> {
        let generation = self.ck_generation + 1;
        let slot = generation % 2;
        let path = self.slot_path(slot);
        let file = match self.ck_files.get(&slot) {
            Some(f) => f.clone(),
            None => {
                let f = match self.fs.open(&path) {
                    Ok(f) => f,
                    Err(_) => {
                        let f = self.fs.create(&path).map_err(|e| io_err(&path, e))?;
                        self.fs
                            .sync_dir(&self.opts.dir)
                            .map_err(|e| io_err(&self.opts.dir, e))?;
                        f
                    }
                };
                self.ck_files.insert(slot, f.clone());
                f
            }
        };
        let mut bytes = std::mem::take(&mut self.ck_buf);
        let owed = {
            let ck = self.snapshot();
            ck.encode_into(&mut bytes);
            owed_in(&ck)
        };
        // Taken back if this checkpoint is not written.
        let asap = std::mem::take(&mut self.ck_asap);
        self.ck_pending = Some((generation, self.written, asap, owed));
        self.ck_len = bytes.len() as u64;
        Ok(CheckpointWrite { file, path, bytes })
    }

    /// Keep `w`'s buffer for the next checkpoint, unless it holds more than twice what was
    /// written in it ([`CK_BUF_SLACK`] aside): a drain takes a checkpoint every few segments
    /// it empties, each megabytes at 100 M events, and a fresh buffer each time was faulted in
    /// page by page and given back 10 ms later (a quarter of a 100 M drain's page faults). The
    /// buffer kept is the last checkpoint's size, at most twice: it shrinks with the log.
    pub fn reuse_checkpoint_buffer(&mut self, w: CheckpointWrite) {
        let keep = 2 * w.bytes.len() + CK_BUF_SLACK;
        if w.bytes.capacity() <= keep {
            self.ck_buf = w.bytes;
        } else {
            self.ck_buf = Vec::new();
        }
    }

    /// Capacity of the checkpoint buffer kept (tests).
    #[cfg(test)]
    pub(super) fn checkpoint_buffer(&self) -> (*const u8, usize) {
        (self.ck_buf.as_ptr(), self.ck_buf.capacity())
    }

    /// A checkpoint prepared by [`Log::prepare_checkpoint`] was written (`ok`) or not.
    pub fn checkpoint_done(&mut self, ok: bool) {
        if let Some((generation, written, asap, owed)) = self.ck_pending.take() {
            if ok {
                self.ck_generation = generation;
                self.ck_written = written;
                self.ck_owed = owed;
            } else {
                self.ck_asap |= asap;
            }
        }
    }

    /// Prepare, write and finish a checkpoint in one call (the simulation, shutdown).
    ///
    /// # Errors
    /// I/O failure (the older checkpoint stays valid; the log goes on).
    pub fn checkpoint(&mut self) -> Result<(), StoreError> {
        let w = self.prepare_checkpoint()?;
        let r = w.run();
        self.reuse_checkpoint_buffer(w);
        self.checkpoint_done(r.is_ok());
        r
    }

    /// Restore segment `no` from a checkpoint's record of it (its file open, header read).
    pub(super) fn restore_seg(
        &mut self,
        mut st: SegState<'_>,
        hdr: super::Header,
        file: Arc<dyn FsFile>,
        known: &HashSet<QueueId>,
    ) {
        // The decoded words, index and runs move into the segment (a checkpoint of a large
        // backlog holds megabytes of them: not copied).
        let mut live: HashMap<QueueId, Bits> = std::mem::take(&mut st.live)
            .into_iter()
            .filter(|(q, _)| known.contains(q))
            .map(|(q, w)| (q, Bits::from_words(w.into_owned())))
            .collect();
        self.restore_bytes(&st, &mut live);
        self.max_seq = self.max_seq.max(hdr.base_seq).max(st.last_seq);
        let mut seg = Seg::new(hdr, file, st.len);
        seg.first_seq = st.first_seq;
        seg.last_seq = st.last_seq;
        seg.index = std::mem::take(&mut st.index).into_owned();
        seg.live = live;
        seg.ms_runs = std::mem::take(&mut st.ms_runs).into_owned();
        seg.events = st.events;
        self.segs.push(seg);
    }
}

/// Segments a checkpoint records: number -> (salt, valid length).
pub type Recorded = HashMap<u64, (u64, u64)>;

/// The segments `ck` records as owing events.
fn owed_in(ck: &Checkpoint<'_>) -> HashSet<u64> {
    ck.segs
        .iter()
        .filter(|s| s.live.iter().any(|(_, w)| w.iter().any(|w| *w != 0)))
        .map(|s| s.no)
        .collect()
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
