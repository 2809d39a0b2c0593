//! The scrub: the frames a checkpoint vouches for, checked after the log opened.
//!
//! Opening the log from a checkpoint reads only what the checkpoint cannot vouch for: each
//! segment's header, its length, and the frames written after the end the checkpoint recorded
//! (`recover.rs`). The frames below that end were checked when written, and a crash cannot tear
//! them (invariant 3 in [`super`]); what can hurt them is damage at rest (a flipped bit, a lost
//! sector). Reading them all at open made a 10 M-event backlog's restart 4.9 s instead of 0.17 s,
//! so they are checked here instead, in the background:
//!
//! 1. [`Log::scrub_job`], under the log's lock, names the next chunk of the oldest segment not
//!    yet checked ([`Unverified`]);
//! 2. [`ScrubJob::run`], outside it, reads that chunk and checks its frames (the
//!    `gridlet-scrub` thread, rate-limited, or the simulation in place);
//! 3. [`Log::scrub_done`], under the lock, moves the segment's cursor on, or notes a
//!    [`Finding`] where a frame fails.
//!
//! A read for delivery that meets a failing frame notes a [`Finding`] the same way
//! (`read.rs`). Findings are applied by the committer's round ([`Log::record_findings`], the
//! round's first step): the segment is read whole and walked as recovery walks it
//! (`replay.rs`), so a damaged span found after start is reported exactly as one found at open:
//! the file copied to the quarantine folder, a [`super::Loss`] with its counts (the error log
//! line, `gridlet_store_damaged_events_total`, the readiness detail), the events it held no
//! longer pending, its span stepped over by later reads. A span already known is not reported
//! again, whichever of the scrub or a read met it first.

use super::damage::{self, Damage};
use super::format::{self, FRAME_HEAD};
use super::replay::{Expect, Span};
use super::{io_err, Log, StoreError};
use crate::store::fs::FsFile;
use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex};

/// Bytes the scrub reads at a time (one chunk per job).
pub const SCRUB_CHUNK: u64 = 1 << 20;

/// Bytes per second the store's scrub thread reads at most, by default: a background pass that
/// leaves the disk to publishes and deliveries (a 3.2 GB backlog of 10 M events: under two
/// minutes).
pub const SCRUB_BYTES_PER_SEC: u64 = 32 << 20;

/// A segment whose frames below `end` the checkpoint vouched for and nobody checked yet.
#[derive(Debug, Clone)]
pub(super) struct Unverified {
    pub(super) no: u64,
    pub(super) salt: u64,
    /// The end the checkpoint recorded (the frames after it were checked at open).
    pub(super) end: u64,
    /// The segment's last event then.
    pub(super) last_seq: u64,
    /// Frames below this were checked.
    pub(super) checked: u64,
}

/// A frame that failed its check after open: segment number, salt, offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finding {
    /// The segment's number.
    pub no: u64,
    /// Its salt (a compacted copy under the same number is another file).
    pub salt: u64,
    /// Where the failing frame starts.
    pub offset: u64,
}

/// Findings waiting for the committer's round, shared with reads run outside the lock.
pub(super) type Findings = Arc<Mutex<Vec<Finding>>>;

/// A chunk of one segment to check, outside the lock.
pub struct ScrubJob {
    no: u64,
    salt: u64,
    file: Arc<dyn FsFile>,
    from: u64,
    end: u64,
    chunk: u64,
}

/// What a [`ScrubJob`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scrubbed {
    no: u64,
    salt: u64,
    /// The frames below this checked out.
    upto: u64,
    /// Where a frame failed, if one did (`upto` is there too).
    damaged: Option<u64>,
    /// Bytes read.
    pub bytes: u64,
}

impl ScrubJob {
    /// Read one chunk (at least one whole frame) from the job's offset into `buf` and check
    /// its frames. `buf` is the caller's, reused from one job to the next: a pass reads about
    /// 32 chunks a second, and a fresh 1 MiB buffer for each was zeroed into pages the
    /// allocator had just given back (page faults, and RSS while they waited to go back). A
    /// frame larger than a chunk is read into it whole, and the buffer is then dropped, so that
    /// it keeps at most a chunk's capacity between jobs ([`ScrubJob::run`] never holds more
    /// than one frame or one chunk).
    ///
    /// # Errors
    /// The read failed.
    pub fn run(&self, buf: &mut Vec<u8>) -> io::Result<Scrubbed> {
        let done = self.check(buf);
        if buf.capacity() as u64 > self.chunk.max(FRAME_HEAD as u64) {
            *buf = Vec::new();
        }
        done
    }

    fn check(&self, buf: &mut Vec<u8>) -> io::Result<Scrubbed> {
        let mut at = self.from;
        let mut bytes = 0;
        let want = (self.end - at).min(self.chunk.max(FRAME_HEAD as u64));
        damage::read_range_into(&*self.file, at, at + want, buf)?;
        bytes += buf.len() as u64;
        let mut rel = 0usize;
        let damaged = loop {
            let offset = at + rel as u64;
            if offset >= self.end {
                break None;
            }
            let Some(head) = buf.get(rel..rel + FRAME_HEAD) else {
                if rel == 0 {
                    // The file ends before the frames the checkpoint recorded.
                    break Some(offset);
                }
                break None;
            };
            let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
            let next = offset + FRAME_HEAD as u64 + u64::from(len);
            if len == 0 || len > format::MAX_FRAME || next > self.end {
                break Some(offset);
            }
            if rel + FRAME_HEAD + len as usize > buf.len() {
                if rel > 0 {
                    break None;
                }
                // A frame larger than a chunk: read it whole.
                damage::read_range_into(&*self.file, offset, next, buf)?;
                bytes += buf.len() as u64;
                at = offset;
                if buf.len() as u64 != next - offset {
                    break Some(offset);
                }
            }
            match damage::frame_at(buf, self.salt, rel as u64) {
                Some((_, end)) => rel = end as usize,
                None => break Some(offset),
            }
        };
        Ok(Scrubbed {
            no: self.no,
            salt: self.salt,
            upto: damaged.unwrap_or(at + rel as u64),
            damaged,
            bytes,
        })
    }
}

impl Log {
    /// The next chunk to check (at most `chunk` bytes, or one frame), of the oldest segment
    /// not checked yet; `None` once every segment is checked. Segments given back or replaced
    /// by a compacted copy since open are forgotten (their new file was written and checked by
    /// this run).
    pub fn scrub_job(&mut self, chunk: u64) -> Option<ScrubJob> {
        loop {
            let u = self.unverified.first()?.clone();
            let seg = self
                .segs
                .iter()
                .find(|s| s.hdr.no == u.no && s.hdr.salt == u.salt);
            match seg {
                Some(seg) if u.checked < u.end => {
                    return Some(ScrubJob {
                        no: u.no,
                        salt: u.salt,
                        file: seg.file.clone(),
                        from: u.checked,
                        end: u.end,
                        chunk,
                    })
                }
                _ => {
                    self.unverified.remove(0);
                }
            }
        }
    }

    /// Note what a [`ScrubJob`] found: the segment's cursor moves on, or a [`Finding`] waits
    /// for the committer ([`Log::record_findings`]). Whether something was found.
    pub fn scrub_done(&mut self, done: Scrubbed) -> bool {
        let Some(i) = self
            .unverified
            .iter()
            .position(|u| u.no == done.no && u.salt == done.salt)
        else {
            return false;
        };
        if let Some(offset) = done.damaged {
            // Checked whole when the finding is recorded.
            self.unverified.remove(i);
            crate::sync::lock(&self.found).push(Finding {
                no: done.no,
                salt: done.salt,
                offset,
            });
            return true;
        }
        if let Some(u) = self.unverified.get_mut(i) {
            u.checked = done.upto.max(u.checked);
            if u.checked >= u.end {
                self.unverified.remove(i);
            }
        }
        false
    }

    /// Bytes of frames the checkpoint vouched for and nobody checked yet.
    pub fn scrub_left(&self) -> u64 {
        self.unverified
            .iter()
            .map(|u| u.end.saturating_sub(u.checked))
            .sum()
    }

    /// Whether segment `no` still waits for the scrub (compaction leaves it alone: a copy is
    /// made of checked frames only).
    pub(super) fn unverified(&self, no: u64) -> bool {
        self.unverified.iter().any(|u| u.no == no)
    }

    /// Whether a read or the scrub found a failing frame that the next round records.
    pub fn has_findings(&self) -> bool {
        !crate::sync::lock(&self.found).is_empty()
    }

    /// Losses recorded since the log opened (the scrub's and reads').
    pub fn losses_since_open(&self) -> usize {
        self.damage.losses.len() - self.losses_at_open
    }

    /// Record the findings of reads and the scrub (the committer's round, first step): each
    /// segment with a failing frame not already known is read whole and checked as recovery
    /// checks it; every damaged span is reported and its events stop being pending. A damaged
    /// head is closed (no frame goes after damaged data). Returns the losses recorded.
    ///
    /// With `persistence__onDamage=refuse` the log fails instead (every later write refused
    /// until gridlet restarts, and the restart refuses to start), the finding reported.
    ///
    /// # Errors
    /// The damaged file could not be read or copied, or the new head not started (the log has
    /// failed then).
    pub fn record_findings(&mut self, now_ms: u64) -> Result<usize, StoreError> {
        let found = std::mem::take(&mut *crate::sync::lock(&self.found));
        if found.is_empty() {
            return Ok(0);
        }
        let before = self.damage.losses.len();
        let copies = self.damage.quarantined.len();
        self.now_ms = self.now_ms.max(now_ms);
        let mut head_hit = false;
        let mut done = HashSet::new();
        for f in found {
            let Some(i) = self
                .segs
                .iter()
                .position(|s| s.hdr.no == f.no && s.hdr.salt == f.salt)
            else {
                continue; // given back or replaced since
            };
            let known = self
                .segs
                .get(i)
                .is_some_and(|s| s.holes.iter().any(|(a, b)| f.offset >= *a && f.offset < *b));
            if known || !done.insert((f.no, f.salt)) {
                continue; // reported already
            }
            let losses = self.damage.losses.len();
            if let Err(e) = self.check_segment(i) {
                if self.opts.refuse_damage {
                    let path = self.path(f.no);
                    self.damage.losses.push(super::Loss {
                        file: path,
                        offset: f.offset,
                        bytes: 0,
                        frames: 1,
                        events: 0,
                        counted: false,
                        what: "damaged frame found after start: with persistence__onDamage=refuse \
                               the log refuses writes until gridlet restarts"
                            .into(),
                    });
                }
                self.report_since(before, copies);
                self.fail(e.to_string());
                return Err(e);
            }
            head_hit |= i + 1 == self.segs.len() && self.damage.losses.len() > losses;
        }
        self.clear_lost();
        // The lost events' sizes are not readable: count again what the segments still owe.
        self.recount_bytes()?;
        let n = self.damage.losses.len() - before;
        self.report_since(before, copies);
        if head_hit {
            self.roll(now_ms, false)?;
        }
        Ok(n)
    }

    /// Log the losses from `before` on, and the copies from `copies` on.
    fn report_since(&self, before: usize, copies: usize) {
        Damage {
            losses: self
                .damage
                .losses
                .get(before..)
                .unwrap_or_default()
                .to_vec(),
            torn: Vec::new(),
            quarantined: self
                .damage
                .quarantined
                .get(copies..)
                .unwrap_or_default()
                .to_vec(),
        }
        .log_errors("event log", "events");
    }

    /// Check segment `i` whole, as recovery would (its frames are only checked, never applied):
    /// up to the end its checkpoint recorded while the scrub had not reached it, else its
    /// length. The segment keeps its length and its index outside the damaged spans.
    fn check_segment(&mut self, i: usize) -> Result<(), StoreError> {
        let Some(seg) = self.segs.get(i) else {
            return Ok(());
        };
        let (no, salt, len, file) = (seg.hdr.no, seg.hdr.salt, seg.len, seg.file.clone());
        let (end, last_seq) = match self.unverified.iter().position(|u| u.no == no) {
            Some(k) => {
                let u = self.unverified.remove(k);
                (u.end, u.last_seq)
            }
            None => (len, seg.last_seq),
        };
        let index = seg.index.clone();
        let path = self.path(no);
        let buf = damage::read_range(&*file, 0, end).map_err(|e| io_err(&path, e))?;
        let expect = Expect {
            recorded: end,
            apply_from: u64::MAX,
            last_seq: Some(last_seq),
            newest: false,
        };
        let result = self.replay(
            i,
            &path,
            &*file,
            &Span::whole(buf),
            salt,
            expect,
            &HashSet::new(),
        );
        if let Some(s) = self.segs.get_mut(i) {
            s.len = len;
            let holes = s.holes.clone();
            s.index = index
                .into_iter()
                .filter(|(_, o)| !holes.iter().any(|(a, b)| o >= a && o < b))
                .collect();
        }
        result
    }
}
