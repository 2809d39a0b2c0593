//! Recovery: opening the log rebuilds what each segment owes each queue (see the invariants in
//! [`super`]): from the newest checkpoint and the frames written after it (`checkpoint.rs`),
//! or, without one, by reading every segment once, in order.

use super::checkpoint::{Checkpoint, SegState};
use super::format::{self, Header, Record, HEADER};
use super::read::read_frame;
use super::{corrupt, io_err, Bits, Log, LogOptions, Recovered, Seg, INDEX_STRIDE};
use crate::store::fs::{Fs, FsFile};
use crate::store::{QueueId, RetryState, StoreError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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
        let names = fs.list(&opts.dir).map_err(|e| io_err(&opts.dir, e))?;
        let mut numbers: Vec<u64> = names
            .iter()
            .filter_map(|n| format::parse_segment_name(n))
            .collect();
        numbers.sort_unstable();
        let mut log = Log::empty(fs.clone(), opts.clone());
        log.remove_leftovers(&names)?;
        if names.iter().any(|n| n == format::SPARE) {
            let path = opts.dir.join(format::SPARE);
            let file = fs.open(&path).map_err(|e| io_err(&path, e))?;
            log.spare = Some(file.size().map_err(|e| io_err(&path, e))?);
        }
        let ck = log.load_checkpoint()?;
        let generation = ck.as_ref().map_or(0, |c| c.generation);
        let from_checkpoint = match ck {
            Some(ck) => match log.recover_from(&ck, &numbers, known) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "the event log's checkpoint does not match its segments: reading every segment");
                    let spare = log.spare.take();
                    log = Log::empty(fs, opts);
                    log.spare = spare;
                    false
                }
            },
            None => false,
        };
        if !from_checkpoint {
            let count = numbers.len();
            for (i, no) in numbers.into_iter().enumerate() {
                log.recover_segment(no, i + 1 == count, known)?;
            }
        }
        // The next checkpoint goes above every one on disk, whichever was used.
        log.ck_generation = generation;
        if log.segs.is_empty() {
            log.roll(now_ms, true)?;
        }
        log.sector = match log.opts.sector {
            // Asked of the head's file.
            0 => log.segs.last().map_or(1, |s| s.file.direct_align()),
            n => n,
        };
        log.load_head()?;
        log.forget_unknown(known);
        // Compaction waits for segments nobody settled in for a while: a restart counts as
        // activity (a subscription resuming its drain is not raced by a copy).
        log.now_ms = now_ms;
        for s in &mut log.segs {
            s.settled_ms = now_ms;
        }
        let recovered = log.recovered();
        Ok((log, recovered))
    }

    fn empty(fs: Arc<dyn Fs>, opts: LogOptions) -> Self {
        Log {
            fs,
            opts,
            segs: Vec::new(),
            retries: HashMap::new(),
            dropped: HashSet::new(),
            staged: Vec::new(),
            pending_events: Vec::new(),
            tail: std::collections::VecDeque::new(),
            tail_bytes: 0,
            frames: Arc::default(),
            max_seq: 0,
            failed: None,
            syncs: 0,
            written: 0,
            ck_generation: 0,
            ck_written: 0,
            ck_files: HashMap::new(),
            ck_pending: None,
            head_block: Vec::new(),
            head_allocated: 0,
            head_written: 0,
            sector: 1,
            now_ms: 0,
            compacting: None,
            compactions: 0,
            compaction_checked_ms: 0,
            ck_asap: false,
            spare: None,
            recycled: 0,
        }
    }

    /// Read the head's partial last block back and how far its file is reserved, so the next
    /// frame's write starts where [`Log::take_frame`] expects.
    fn load_head(&mut self) -> Result<(), StoreError> {
        let align = self.opts.align.max(1);
        let Some(seg) = self.segs.last() else {
            return Ok(());
        };
        let path = self.path(seg.hdr.no);
        let from = seg.len - seg.len % align;
        let mut block = vec![0u8; (seg.len - from) as usize];
        let read = seg
            .file
            .read_at(&mut block, from)
            .map_err(|e| io_err(&path, e))?;
        if read < block.len() {
            return Err(corrupt(&path, "shorter than its frames"));
        }
        self.head_allocated = seg.file.size().map_err(|e| io_err(&path, e))?;
        // Recovery cut the file after its last frame: what is left is written.
        self.head_written = seg.len.next_multiple_of(align);
        self.head_block = block;
        Ok(())
    }

    /// Recover from checkpoint `ck`: the segments it lists from it plus their frames written
    /// since, newer segments whole (see `checkpoint.rs`). An error means "read everything".
    fn recover_from(
        &mut self,
        ck: &Checkpoint,
        numbers: &[u64],
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        self.max_seq = ck.max_seq;
        self.dropped = ck.dropped.iter().copied().collect();
        self.retries = ck.retries.iter().copied().collect();
        let listed: HashMap<u64, &SegState> = ck.segs.iter().map(|s| (s.no, s)).collect();
        let ck_newest = ck.segs.iter().map(|s| s.no).max().unwrap_or(0);
        let count = numbers.len();
        for (i, &no) in numbers.iter().enumerate() {
            let newest = i + 1 == count;
            if let Some(st) = listed.get(&no) {
                let path = self.path(no);
                let file = self.fs.open(&path).map_err(|e| io_err(&path, e))?;
                let size = file.size().map_err(|e| io_err(&path, e))?;
                let mut hb = [0u8; HEADER];
                let read = file.read_at(&mut hb, 0).map_err(|e| io_err(&path, e))?;
                // A compacted segment has a new salt: the checkpoint describes the file before.
                let hdr = Header::decode(&hb[..read])
                    .filter(|h| h.no == no && h.salt == st.salt)
                    .ok_or_else(|| corrupt(&path, "header differs from the checkpoint's"))?;
                if size < st.len {
                    return Err(corrupt(&path, "shorter than the checkpoint recorded"));
                }
                self.restore_seg(st, hdr, file.clone(), known);
                self.replay(&path, &*file, hdr.salt, st.len, size, newest, known)?;
            } else if no <= ck_newest {
                // Deleted before the checkpoint; a crash undid the removal's directory entry.
                let path = self.path(no);
                self.fs.remove(&path).map_err(|e| io_err(&path, e))?;
                self.fs
                    .sync_dir(&self.opts.dir)
                    .map_err(|e| io_err(&self.opts.dir, e))?;
            } else {
                self.recover_segment(no, newest, known)?;
            }
        }
        // Retry states of events settled (or in segments deleted) since the checkpoint.
        let retries = std::mem::take(&mut self.retries);
        self.retries = retries
            .into_iter()
            .filter(|((q, s), _)| self.is_pending(*q, *s))
            .collect();
        Ok(())
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
        self.segs.push(Seg::new(hdr, file.clone(), HEADER as u64));
        self.replay(&path, &*file, hdr.salt, HEADER as u64, size, newest, known)
    }

    /// Apply the frames of the newest segment in memory (`file`) from `offset` to `size`,
    /// cutting a torn tail of the newest segment.
    #[allow(clippy::too_many_arguments)]
    fn replay(
        &mut self,
        path: &std::path::Path,
        file: &dyn crate::store::fs::FsFile,
        salt: u64,
        mut offset: u64,
        size: u64,
        newest: bool,
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        let path = path.to_path_buf();
        loop {
            let frame = read_frame(file, salt, offset, size).map_err(|e| io_err(&path, e))?;
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
            // Zeros after the last frame are the padding of its block and blocks reserved
            // ahead ([`LogOptions::allocate_step`]), whose cut at the roll a crash may have undone.
            let zeros = zeros_from(file, offset, size).map_err(|e| io_err(&path, e))?;
            if !newest && !zeros {
                return Err(corrupt(
                    &path,
                    format!("damaged frame at offset {offset} of a segment that was complete"),
                ));
            }
            let recycled = self.segs.last().is_some_and(|s| s.hdr.recycled);
            if !zeros && recycled {
                // A recycled segment holds an earlier segment's frames after its own (and
                // maybe a torn write too): cut them all, as below.
                tracing::debug!(file = %path.display(), offset, "cutting what follows the last frame of a recycled segment");
            } else if !zeros {
                // The torn tail of the last group, never acknowledged: cut it so new frames
                // follow the last good one (and never a stale frame left after them).
                tracing::warn!(file = %path.display(), offset, bytes = size - offset, "cutting a torn tail (an unacknowledged write cut short by a crash)");
            }
            if newest || !zeros {
                file.set_len(offset)
                    .and_then(|_| file.sync_data())
                    .map_err(|e| io_err(&path, e))?;
            }
        }
        Ok(())
    }

    /// Index a frame that is about to be applied.
    fn note_frame(&mut self, offset: u64, records: &[Record]) {
        let Some(seg) = self.segs.last_mut() else {
            return;
        };
        let first = records.iter().find_map(|r| match r {
            Record::Event { seq, .. } => Some(*seq),
            _ => None,
        });
        if let Some(seq) = first {
            seg.index_frame(seq, offset, INDEX_STRIDE);
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
                    seg.note_ms(seq, first_ms);
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
                // A compacted copy may end before events the restatement lists: those were
                // settled before the copy was made, and the segment no longer holds them.
                let holds = seg.last_seq.saturating_sub(first_seq) + 1;
                for qs in queues.into_iter().filter(|q| known.contains(&q.queue)) {
                    let mut bits = Bits::from_words(qs.words);
                    bits.truncate(holds);
                    for (s, st) in qs.retries {
                        if s.checked_sub(first_seq).is_some_and(|i| bits.get(i)) {
                            self.retries.insert((qs.queue, s), st);
                        }
                    }
                    seg.live.insert(qs.queue, bits);
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
            let runs = &s.ms_runs;
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
}

/// Whether `file` holds only zero bytes from `from` to `to`.
fn zeros_from(file: &dyn FsFile, mut from: u64, to: u64) -> std::io::Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    while from < to {
        let want = ((to - from) as usize).min(buf.len());
        let chunk = buf.get_mut(..want).unwrap_or_default();
        let n = file.read_at(chunk, from)?;
        if chunk.get(..n).is_some_and(|c| c.iter().any(|b| *b != 0)) {
            return Ok(false);
        }
        if n < want {
            break;
        }
        from += n as u64;
    }
    Ok(true)
}
