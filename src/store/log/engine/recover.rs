//! Recovery: opening the log rebuilds what each segment owes each queue (see the invariants in
//! [`super`]): from the newest checkpoint and the frames written after it (`checkpoint.rs`),
//! or, without one, by reading every segment once, in order. A frame that fails is a torn
//! tail or damage (`damage.rs`). From a checkpoint, the frames it vouches for are not read
//! here: each segment's header and length are, and the scrub checks the rest in the
//! background (`scrub.rs`); with `persistence__onDamage=refuse`, every frame is checked here.

use super::checkpoint::{Checkpoint, SegState};
use super::damage::{self, Damage, Keep, Loss};
use super::format::{self, Header, HEADER};
use super::replay::{Expect, Span};
use super::scrub::Unverified;
use super::{corrupt, io_err, Log, LogOptions, Recovered, Seg};
use crate::store::fs::{Fs, FsFile};
use crate::store::{QueueId, StoreError};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

impl Log {
    /// Open the log in `opts.dir` (created if missing), recovering every segment. Events of
    /// queues not in `known` (their subscription is gone) are not pending any more. Damage is
    /// recovered around and reported in [`Log::damage`].
    ///
    /// # Errors
    /// I/O failures.
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
        let started = std::time::Instant::now();
        let mut log = Log::empty(fs.clone(), opts.clone());
        log.now_ms = now_ms;
        log.remove_leftovers(&names)?;
        if names.iter().any(|n| n == format::SPARE) {
            let path = opts.dir.join(format::SPARE);
            let file = fs.open(&path).map_err(|e| io_err(&path, e))?;
            log.spare = Some(file.size().map_err(|e| io_err(&path, e))?);
        }
        let ck = log.load_checkpoint()?;
        // Whether it is used or not, a later start may use it: what it records as owed waits
        // for the next checkpoint before it is deleted (`collect.rs`).
        if let Some(ck) = &ck {
            log.note_owed(ck);
        }
        let generation = ck.as_ref().map_or(0, |c| c.generation);
        let read_ck = started.elapsed();
        let files = match &ck {
            Some(c) => log.open_listed(c, &numbers)?,
            None => HashMap::new(),
        };
        let fits = match &ck {
            Some(c) => match log.checkpoint_fits(c, &files) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "the event log's checkpoint does not match its segments: reading every segment");
                    false
                }
            },
            None => false,
        };
        let (ck, from_checkpoint) = match ck {
            Some(c) if fits => {
                log.recover_from(c, &numbers, &files, known)?;
                (None, true)
            }
            other => (other, false),
        };
        if !from_checkpoint {
            // The ends a checkpoint recorded still tell damage from a torn tail where the
            // segment is the file it describes.
            let ends: HashMap<u64, &SegState> = ck
                .iter()
                .flat_map(|c| c.segs.iter())
                .map(|s| (s.no, s))
                .collect();
            let newest = numbers.last().copied();
            for (i, &no) in numbers.iter().enumerate() {
                let st = ends.get(&no).copied();
                let next = numbers.get(i + 1).copied();
                log.recover_segment(no, Some(no) == newest, next, st, known)?;
            }
        }
        log.clear_lost();
        log.recount_bytes()?;
        log.report();
        log.losses_at_open = log.damage.losses.len();
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
        log.quarantine_bytes = damage::quarantine_bytes(&log.fs, &log.quarantine_dir());
        // Compaction waits for segments nobody settled in for a while: a restart counts as
        // activity (a subscription resuming its drain is not raced by a copy).
        log.now_ms = now_ms;
        for s in &mut log.segs {
            s.settled_ms = now_ms;
        }
        if !log.damage.losses.is_empty() {
            // Recovery cut, rewrote, moved or stepped over data the checkpoint on disk
            // describes: a frame written later at an offset it records would be taken as
            // checkpointed and never applied (simulation damage seed 1,525). A checkpoint of
            // the log as recovered goes first, before any frame is written.
            log.checkpoint()?;
        }
        let segments = started.elapsed();
        let recovered = log.recovered();
        let events: usize = recovered.values().map(crate::store::PendingRuns::len).sum();
        tracing::info!(
            segments = log.segs.len(),
            from_checkpoint,
            events,
            checkpoint_ms = read_ck.as_millis() as u64,
            segments_ms = (segments - read_ck).as_millis() as u64,
            pending_ms = (started.elapsed() - segments).as_millis() as u64,
            "event log opened"
        );
        Ok((log, recovered))
    }

    pub(super) fn empty(fs: Arc<dyn Fs>, opts: LogOptions) -> Self {
        Log {
            fs,
            opts,
            segs: Vec::new(),
            retries: HashMap::new(),
            dropped: HashSet::new(),
            staged: Vec::new(),
            pending_events: Vec::new(),
            staged_refs: super::segment::Refs::None,
            restated: 0,
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
            ck_buf: Vec::new(),
            ck_len: 0,
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
            damage: Damage::default(),
            quarantined: HashSet::new(),
            lost: Vec::new(),
            quarantine_bytes: 0,
            ck_owed: HashSet::new(),
            retain: Default::default(),
            recount: HashSet::new(),
            unverified: Vec::new(),
            found: Arc::default(),
            losses_at_open: 0,
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

    /// The segment files `ck` lists that are there, each opened once for the whole open, and
    /// their headers asked of the disk together ([`FsFile::will_need`]): read one after
    /// another, the headers of a 100 M-event backlog's 2,000 segments took half a second.
    fn open_listed(
        &self,
        ck: &Checkpoint<'_>,
        numbers: &[u64],
    ) -> Result<HashMap<u64, Arc<dyn FsFile>>, StoreError> {
        let there: HashSet<u64> = numbers.iter().copied().collect();
        let mut files = HashMap::new();
        for st in ck.segs.iter().filter(|s| there.contains(&s.no)) {
            let path = self.path(st.no);
            let file = self.fs.open(&path).map_err(|e| io_err(&path, e))?;
            file.will_need(0, HEADER as u64);
            files.insert(st.no, file);
        }
        Ok(files)
    }

    /// Whether `ck` describes the segment files there are (`files`, [`Log::open_listed`]): a
    /// listed file whose header reads but differs (a compacted copy has a new salt) makes it
    /// unusable. An unreadable header is damage, read with the checkpoint's salt.
    fn checkpoint_fits(
        &self,
        ck: &Checkpoint<'_>,
        files: &HashMap<u64, Arc<dyn FsFile>>,
    ) -> Result<(), StoreError> {
        for st in &ck.segs {
            let Some(file) = files.get(&st.no) else {
                continue;
            };
            let path = self.path(st.no);
            let mut hb = [0u8; HEADER];
            let read = file.read_at(&mut hb, 0).map_err(|e| io_err(&path, e))?;
            if let Some(h) = hb.get(..read).and_then(Header::decode) {
                if h.no != st.no || h.salt != st.salt {
                    return Err(corrupt(&path, "header differs from the checkpoint's"));
                }
            }
        }
        Ok(())
    }

    /// Recover from checkpoint `ck`: the segments it lists from it, their frames checked, plus
    /// their frames written since; newer segments whole (see `checkpoint.rs`). A listed segment
    /// whose file is gone is restored from the checkpoint so that later frames can settle its
    /// events: what it still owes after them is lost.
    fn recover_from(
        &mut self,
        ck: Checkpoint<'_>,
        numbers: &[u64],
        files: &HashMap<u64, Arc<dyn FsFile>>,
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        self.max_seq = ck.max_seq;
        self.dropped = ck.dropped.iter().copied().collect();
        self.retries = ck.retries.iter().copied().collect();
        let ck_newest = ck.segs.iter().map(|s| s.no).max().unwrap_or(0);
        let mut listed: HashMap<u64, SegState<'_>> =
            ck.segs.into_iter().map(|s| (s.no, s)).collect();
        let newest = numbers.last().copied();
        let there: HashSet<u64> = numbers.iter().copied().collect();
        let all: BTreeSet<u64> = numbers.iter().chain(listed.keys()).copied().collect();
        let mut gone = Vec::new();
        for no in all {
            let newest = Some(no) == newest;
            if let Some(st) = listed.remove(&no) {
                if !there.contains(&no) {
                    let hdr = Header {
                        no,
                        salt: st.salt,
                        base_seq: st.first_seq.map_or(st.last_seq, |f| f.saturating_sub(1)),
                        created_ms: 0,
                        recycled: false,
                    };
                    self.restore_seg(st, hdr, Arc::new(damage::Gone), known);
                    gone.push(no);
                    continue;
                }
                let path = self.path(no);
                let file = match files.get(&no) {
                    Some(f) => f.clone(),
                    None => self.fs.open(&path).map_err(|e| io_err(&path, e))?,
                };
                let size = file.size().map_err(|e| io_err(&path, e))?;
                let head =
                    damage::read_range(&*file, 0, HEADER as u64).map_err(|e| io_err(&path, e))?;
                let decoded = Header::decode(&head);
                // What the checkpoint vouches for is left to the scrub (`scrub.rs`), unless
                // damage must stop the start (`refuse`): then every frame is checked now. A
                // file shorter than recorded, or whose header does not read, is read whole.
                let mut whole = self.opts.refuse_damage || size < st.len || decoded.is_none();
                let mut from = if whole { 0 } else { st.len };
                let mut buf =
                    damage::read_range(&*file, from, size).map_err(|e| io_err(&path, e))?;
                if !whole && newest && straddles(&buf, decoded.as_ref().map_or(st.salt, |h| h.salt))
                {
                    // The first frame after the recorded end fails: a torn write, or damage that
                    // began in the frames the checkpoint vouches for (one sector across the
                    // boundary; crashsim damage seed 20,260). Only a whole read tells them apart:
                    // cut as a torn tail, the acknowledged frames after the checkpoint would be
                    // lost without a word. A crash cut no frame after the checkpoint: rare.
                    whole = true;
                    from = 0;
                    buf = damage::read_range(&*file, 0, size).map_err(|e| io_err(&path, e))?;
                }
                let hdr = match decoded {
                    Some(h) => h,
                    None => self.rewrite_header(&path, &*file, &st)?,
                };
                let (len, last_seq) = (st.len, st.last_seq);
                self.restore_seg(st, hdr, file.clone(), known);
                let expect = Expect {
                    recorded: len,
                    apply_from: len,
                    last_seq: Some(last_seq),
                    newest,
                };
                let span = Span {
                    origin: from,
                    bytes: buf.into(),
                };
                let at = self.segs.len() - 1;
                self.replay(at, &path, &*file, &span, hdr.salt, expect, known)?;
                if !whole && len > HEADER as u64 {
                    self.unverified.push(Unverified {
                        no,
                        salt: hdr.salt,
                        end: len,
                        last_seq,
                        checked: HEADER as u64,
                    });
                }
            } else if no <= ck_newest {
                // Deleted before the checkpoint; a crash undid the removal's directory entry.
                let path = self.path(no);
                self.fs.remove(&path).map_err(|e| io_err(&path, e))?;
                self.fs
                    .sync_dir(&self.opts.dir)
                    .map_err(|e| io_err(&self.opts.dir, e))?;
            } else {
                let next = numbers.iter().find(|n| **n > no).copied();
                self.recover_segment(no, newest, next, None, known)?;
            }
        }
        self.clear_lost();
        for no in gone {
            let Some(i) = self.segs.iter().position(|s| s.hdr.no == no) else {
                continue;
            };
            let seg = self.segs.remove(i);
            let owed = seg.live_events();
            if owed > 0 {
                // Segments owing events when a checkpoint was taken are deleted only after a
                // later checkpoint (`collect.rs`): this one did not go by collection.
                let path = self.path(no);
                self.lose(
                    &path,
                    None,
                    Loss {
                        file: path.clone(),
                        offset: 0,
                        bytes: 0,
                        frames: 1,
                        events: owed,
                        counted: true,
                        what: format!(
                            "segment file missing: the checkpoint records it, owing {owed} events"
                        ),
                    },
                )?;
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

    /// A listed segment whose header does not read: copied aside, then its header written
    /// again from what the checkpoint recorded (its frames are checked with the recorded salt).
    fn rewrite_header(
        &mut self,
        path: &Path,
        file: &dyn FsFile,
        st: &SegState,
    ) -> Result<Header, StoreError> {
        let hdr = Header {
            no: st.no,
            salt: st.salt,
            base_seq: st.first_seq.map_or(st.last_seq, |f| f.saturating_sub(1)),
            created_ms: self.now_ms,
            recycled: false,
        };
        self.lose(
            path,
            Some(Keep::Copy),
            Loss {
                file: path.to_path_buf(),
                offset: 0,
                bytes: HEADER as u64,
                frames: 1,
                events: 0,
                counted: true,
                what: "segment header damaged: written again from the checkpoint".into(),
            },
        )?;
        file.write_at(&hdr.encode(), 0)
            .and_then(|()| file.sync_data())
            .map_err(|e| io_err(path, e))?;
        Ok(hdr)
    }

    /// The base sequence number in segment `no`'s header, if it reads.
    fn base_of(&self, no: u64) -> Option<u64> {
        let file = self.fs.open(&self.path(no)).ok()?;
        let mut hb = [0u8; HEADER];
        let read = file.read_at(&mut hb, 0).ok()?;
        Header::decode(hb.get(..read)?)
            .filter(|h| h.no == no)
            .map(|h| h.base_seq)
    }

    /// The highest sequence number the segments recovered so far hold (an empty one: its
    /// header's base, every event staged before it started). Not [`Log::max_seq`], which a
    /// checkpoint sets to events staged but not yet written when it was taken.
    fn held_before(&self) -> u64 {
        self.segs.iter().map(|s| s.last_seq).max().unwrap_or(0)
    }

    /// Read one segment's frames and apply their records (`st`: what a checkpoint that could
    /// not be used recorded of it).
    fn recover_segment(
        &mut self,
        no: u64,
        newest: bool,
        next: Option<u64>,
        st: Option<&SegState>,
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        let path = self.path(no);
        let file = self.fs.open(&path).map_err(|e| io_err(&path, e))?;
        let size = file.size().map_err(|e| io_err(&path, e))?;
        let buf = damage::read_whole(&*file, size).map_err(|e| io_err(&path, e))?;
        let hdr = match Header::decode(&buf) {
            Some(h) if h.no == no => h,
            other => {
                // Events newer than every segment before it: frames were written after the
                // header was synced, so the header was damaged since. Newer than what those
                // segments hold, not than the checkpoint's `max_seq`: that counts events staged
                // when it was taken, whose frame may have gone into this segment after a roll
                // (crashsim damage seed 18,867: such a segment was removed as a cut roll).
                let floor = self.held_before();
                let newer = damage::first_event_unchecked(&buf).is_some_and(|s| s > floor);
                if newest && !newer {
                    // A header write cut by a crash (on a new file, or a spare renamed to the
                    // head's name): nothing in the file was acknowledged.
                    tracing::warn!(file = %path.display(), "removing a segment whose header was never completed");
                    self.fs.remove(&path).map_err(|e| io_err(&path, e))?;
                    self.fs
                        .sync_dir(&self.opts.dir)
                        .map_err(|e| io_err(&self.opts.dir, e))?;
                    return Ok(());
                }
                // What it held: the frames that still read, or the sequence numbers between
                // the segments before it and the next one's base.
                let bound = next.and_then(|n| self.base_of(n));
                let between = bound.map_or(0, |b| b.saturating_sub(floor));
                let events = damage::events_scanned(&buf, floor).max(between);
                let what = match other {
                    Some(_) => "segment header names another segment: its frames cannot be checked; moved to the quarantine folder",
                    None => "segment header damaged: its frames cannot be checked; moved to the quarantine folder",
                };
                self.lose(
                    &path,
                    Some(Keep::Move),
                    Loss {
                        file: path.clone(),
                        offset: 0,
                        bytes: size,
                        frames: damage::frames_unchecked(&buf).max(1),
                        events,
                        counted: bound.is_some(),
                        what: what.into(),
                    },
                )?;
                return Ok(());
            }
        };
        self.max_seq = self.max_seq.max(hdr.base_seq);
        self.segs.push(Seg::new(hdr, file.clone(), HEADER as u64));
        let expect = match st.filter(|s| s.salt == hdr.salt) {
            Some(st) => Expect {
                recorded: st.len,
                apply_from: HEADER as u64,
                last_seq: Some(st.last_seq),
                newest,
            },
            None => Expect {
                apply_from: HEADER as u64,
                newest,
                last_seq: next.and_then(|n| self.base_of(n)),
                ..Expect::default()
            },
        };
        let at = self.segs.len() - 1;
        self.replay(
            at,
            &path,
            &*file,
            &Span::whole(buf),
            hdr.salt,
            expect,
            known,
        )
    }
}

/// Whether `tail` (a segment from the end its checkpoint recorded) starts with a frame that
/// fails its check: not a frame of `salt`, and not the zeros of a clean end.
fn straddles(tail: &[u8], salt: u64) -> bool {
    !tail.is_empty() && !damage::zeros_after(tail, 0) && damage::frame_at(tail, salt, 0).is_none()
}
