//! Reading one segment's frames at recovery: each checked, those past the checkpoint applied,
//! a damaged span stepped over and reported, a torn tail of the newest segment cut (the rules
//! are in `damage.rs`).

use super::damage::{self, Damage, Keep, Loss, Torn};
use super::format::{self, Record, HEADER};
use super::{corrupt, io_err, Log};
use crate::store::fs::FsFile;
use crate::store::{QueueId, StoreError};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// What recovery knows of a segment besides its file.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Expect {
    /// The checkpoint recorded valid frames up to here (0: nothing recorded). Nothing below it
    /// can be torn: a frame failing there is damage.
    pub(super) recorded: u64,
    /// Frames before here are in the checkpoint: checked, not applied.
    pub(super) apply_from: u64,
    /// The last sequence number the segment can hold: the checkpoint's record of it, or the
    /// base of the segment after it (bounds what a damaged tail held).
    pub(super) last_seq: Option<u64>,
    /// The newest segment file: the only one that may end in a torn frame.
    pub(super) newest: bool,
}

/// Bytes of a segment file from `origin` on (the whole file from 0; after a checkpoint, only
/// what was written after the end it recorded: the frames before were checked when written and
/// are scrubbed in the background, `scrub.rs`).
pub(super) struct Span {
    pub(super) origin: u64,
    pub(super) bytes: bytes::Bytes,
}

impl Span {
    /// The whole file.
    pub(super) fn whole(bytes: Vec<u8>) -> Self {
        Span {
            origin: 0,
            bytes: bytes.into(),
        }
    }

    /// Where the file's bytes end.
    fn end(&self) -> u64 {
        self.origin + self.bytes.len() as u64
    }

    /// The checked frame at file offset `offset`: its records' bytes and the next offset.
    fn frame_at(&self, salt: u64, offset: u64) -> Option<(bytes::Bytes, u64)> {
        let rel = offset.checked_sub(self.origin)?;
        let (_, next) = damage::frame_at(&self.bytes, salt, rel)?;
        let payload = self
            .bytes
            .slice(rel as usize + format::FRAME_HEAD..next as usize);
        Some((payload, next + self.origin))
    }

    fn zeros_after(&self, offset: u64) -> bool {
        damage::zeros_after(&self.bytes, offset.saturating_sub(self.origin))
    }

    fn next_frame(&self, salt: u64, offset: u64) -> Option<u64> {
        damage::next_frame(&self.bytes, salt, offset.checked_sub(self.origin)?)
            .map(|r| r + self.origin)
    }

    fn events_unchecked(&self, from: u64, to: u64) -> u64 {
        damage::events_unchecked(
            &self.bytes,
            from.saturating_sub(self.origin),
            to.saturating_sub(self.origin),
        )
    }
}

/// A damaged span whose lost events are counted once the next event after it is known.
struct Gap {
    /// Index of its [`Loss`].
    loss: usize,
    /// The last event sequence number before it.
    before: u64,
}

impl Log {
    /// Walk the frames of segment `at` (of `self.segs`) in memory (`buf`: its file from
    /// `buf.origin` on): check each, apply those from `expect.apply_from` on (only the newest
    /// segment recovered so far applies records), step over damaged spans (reported), and cut a
    /// torn tail of the newest segment. Damaged spans already known ([`Seg::holes`], found
    /// earlier in this run) are stepped over without a second report.
    ///
    /// [`Seg::holes`]: super::segment::Seg::holes
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replay(
        &mut self,
        at: usize,
        path: &Path,
        file: &dyn FsFile,
        buf: &Span,
        salt: u64,
        expect: Expect,
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        let size = buf.end();
        // Below every event of the segment: the last of the segment before (events staged before
        // a roll go to the new head, so its header's base is no bound), or the first event the
        // checkpoint recorded.
        let prev = self
            .segs
            .get(..at)
            .unwrap_or_default()
            .iter()
            .rev()
            .find(|s| s.first_seq.is_some())
            .map_or(0, |s| s.last_seq);
        let first_seq = self.segs.get(at).and_then(|s| s.first_seq);
        let base = match first_seq {
            Some(first) if expect.apply_from > HEADER as u64 => prev.max(first.saturating_sub(1)),
            _ => prev,
        };
        let no = self.segs.get(at).map_or(0, |s| s.hdr.no);
        let known_holes = self
            .segs
            .get(at)
            .map(|s| s.holes.clone())
            .unwrap_or_default();
        let mut offset = buf.origin.max(HEADER as u64);
        // The last event seen in a decoded frame, and the good frames only checked since.
        // Starting after the checkpoint's end: its last event is the checkpoint's.
        let mut last_event: Option<u64> = match first_seq {
            Some(_) if offset > HEADER as u64 => expect.last_seq,
            _ => None,
        };
        let mut checked: Vec<u64> = Vec::new();
        let mut gap: Option<Gap> = None;
        if let Some(s) = self.segs.get_mut(at) {
            s.len = offset;
        }
        loop {
            if let Some(&(_, end)) = known_holes.iter().find(|(s, _)| *s == offset) {
                // Found and reported earlier in this run (a read or the scrub).
                offset = end;
                checked.clear();
                continue;
            }
            if let Some((payload, next)) = buf.frame_at(salt, offset) {
                let applied = offset >= expect.apply_from;
                if applied || gap.is_some() {
                    let records = format::decode_records(&payload).ok_or_else(|| {
                        corrupt(path, format!("unreadable records at offset {offset}"))
                    })?;
                    let seqs = records.iter().filter_map(|r| match r {
                        Record::Event { seq, .. } => Some(*seq),
                        _ => None,
                    });
                    let (first, last) = (seqs.clone().next(), seqs.last());
                    if let (Some(g), Some(first)) = (&gap, first) {
                        self.close_gap(no, g, first, first.saturating_sub(g.before + 1));
                        gap = None;
                    }
                    if applied {
                        self.note_frame(offset, &records);
                        for r in records {
                            self.apply(r, known);
                        }
                    } else {
                        checked.push(offset);
                    }
                    if last.is_some() {
                        last_event = last;
                        checked.clear();
                    }
                } else {
                    checked.push(offset);
                }
                offset = next;
                if let Some(s) = self.segs.get_mut(at) {
                    s.len = offset;
                }
                continue;
            }
            // No frame checks out at `offset`.
            let zeros = buf.zeros_after(offset);
            if offset >= expect.recorded && (offset >= size || zeros) {
                // Zeros after the last frame are the padding of its block and blocks reserved
                // ahead ([`LogOptions::allocate_step`]), whose cut at the roll a crash may have
                // undone.
                if expect.newest && offset < size {
                    file.set_len(offset)
                        .and_then(|_| file.sync_data())
                        .map_err(|e| io_err(path, e))?;
                }
                break;
            }
            let before = last_event
                .max(last_event_in(buf, salt, &checked))
                .unwrap_or(base);
            checked.clear();
            if offset < size {
                if let Some(resume) = buf.next_frame(salt, offset) {
                    let loss = self.lose(
                        path,
                        Some(Keep::Copy),
                        Loss {
                            file: path.to_path_buf(),
                            offset,
                            bytes: resume - offset,
                            frames: 1,
                            events: 0,
                            counted: true,
                            what: "damaged frame: the frames after it are recovered".into(),
                        },
                    )?;
                    if let Some(s) = self.segs.get_mut(at) {
                        s.holes.push((offset, resume));
                        s.holes.sort_unstable();
                        s.index.retain(|(_, o)| *o < offset || *o >= resume);
                    }
                    gap = Some(Gap { loss, before });
                    offset = resume;
                    continue;
                }
            }
            // Nothing after `offset` checks out: the tail. A damaged span before it with no
            // event since is counted now, up to the segment's last event if known (crashsim
            // damage seed 10,707: it was dropped when the tail was torn, its events left
            // pending and unreadable, the loss reported as 0 events).
            let pending = gap.take();
            if let Some(g) = &pending {
                match expect.last_seq.filter(|l| *l > g.before) {
                    Some(l) => self.close_gap(no, g, l + 1, l - g.before),
                    None => self.close_gap(no, g, u64::MAX, 0),
                }
            }
            let end = size.max(expect.recorded);
            if offset < expect.recorded || !expect.newest {
                let what = if offset >= size {
                    "segment shorter than the checkpoint recorded"
                } else if expect.newest {
                    "damaged frame below the end the checkpoint recorded"
                } else {
                    "damaged frame at the end of a segment that was complete"
                };
                let loss = self.lose(
                    path,
                    Some(Keep::Copy),
                    Loss {
                        file: path.to_path_buf(),
                        offset,
                        bytes: end - offset,
                        frames: 1,
                        events: 0,
                        counted: true,
                        what: what.into(),
                    },
                )?;
                let g = Gap { loss, before };
                match expect.last_seq.filter(|l| *l > before) {
                    // The events from `before` on are counted once: by the span before, if any.
                    Some(l) if pending.is_some() => self.close_gap(no, &g, l + 1, 0),
                    Some(l) => self.close_gap(no, &g, l + 1, l - before),
                    None => {
                        let n = buf.events_unchecked(offset, size);
                        self.close_gap(no, &g, u64::MAX, n)
                    }
                }
                if let Some(s) = self.segs.get_mut(at).filter(|_| !expect.newest) {
                    // Reads and a later check in this run step over it (the scrub keeps the
                    // segment's length; the newest segment's frames go on from here).
                    s.holes.push((offset, end));
                    s.holes.sort_unstable();
                }
            } else {
                let recycled = self.segs.get(at).is_some_and(|s| s.hdr.recycled);
                if recycled {
                    // A recycled segment holds an earlier segment's frames after its own (and
                    // maybe a torn write too): cut them all, as below.
                    tracing::debug!(file = %path.display(), offset, "cutting what follows the last frame of a recycled segment");
                } else {
                    // The torn tail of the last group, never acknowledged: cut it so new
                    // frames follow the last good one (and never a stale frame left after them).
                    tracing::warn!(file = %path.display(), offset, bytes = size - offset, "cutting a torn tail (an unacknowledged write cut short by a crash)");
                }
                self.damage.torn.push(Torn {
                    file: path.to_path_buf(),
                    offset,
                    bytes: size - offset,
                });
            }
            if expect.newest && offset < size {
                file.set_len(offset)
                    .and_then(|_| file.sync_data())
                    .map_err(|e| io_err(path, e))?;
            }
            gap = None;
            break;
        }
        if let Some(g) = gap {
            // No event after the damaged span in this segment: it held the events up to the
            // segment's last, if the checkpoint knows it.
            match expect.last_seq.filter(|l| *l > g.before) {
                Some(l) => self.close_gap(no, &g, l + 1, l - g.before),
                None => self.close_gap(no, &g, u64::MAX, 0),
            }
        }
        if let Some(s) = self.segs.get_mut(at) {
            // A checkpoint's sparse index may point into what was cut: new frames go there
            // (damage seed 2,530 read an event written after the restart from the middle of
            // a frame).
            let len = s.len;
            s.index.retain(|(_, o)| *o < len);
        }
        Ok(())
    }

    /// Count the events of loss `g` (sequence numbers after `g.before` and before `after`) and
    /// note them lost in segment `no`.
    fn close_gap(&mut self, no: u64, g: &Gap, after: u64, events: u64) {
        if let Some(l) = self.damage.losses.get_mut(g.loss) {
            l.events += events;
            l.counted &= after != u64::MAX;
        }
        self.lost.push((no, g.before, after));
    }

    /// Forget what the damaged spans held: a checkpoint's bits, or a later restatement, may
    /// still list those events as pending.
    pub(super) fn clear_lost(&mut self) {
        for (no, before, after) in std::mem::take(&mut self.lost) {
            let Some(seg) = self.segs.iter_mut().find(|s| s.hdr.no == no) else {
                continue;
            };
            let Some(first) = seg.first_seq else { continue };
            let from = before.saturating_add(1).max(first) - first;
            let to = after
                .min(seg.last_seq.saturating_add(1))
                .saturating_sub(first);
            for (q, bits) in &mut seg.live {
                for i in from..to.max(from) {
                    if bits.clear(i) {
                        self.retries.remove(&(*q, first + i));
                        // The lost events' sizes are not readable: count what is left.
                        self.recount.insert(no);
                    }
                }
            }
        }
    }

    /// Record a loss, the damaged file first put in the quarantine folder (once per open).
    pub(super) fn lose(
        &mut self,
        path: &Path,
        how: Option<Keep>,
        loss: Loss,
    ) -> Result<usize, StoreError> {
        if self.opts.refuse_damage {
            return Err(StoreError::Corrupt(format!(
                "{}: {} (at offset {}); not starting because persistence__onDamage=refuse, and \
                 nothing was changed: persistence__onDamage=serve recovers every intact frame, \
                 keeps a copy of the damaged file and reports the loss (docs/DURABILITY.md)",
                loss.file.display(),
                loss.what,
                loss.offset
            )));
        }
        if let Some(how) = how.filter(|_| !self.quarantined.contains(path)) {
            let dir = self.quarantine_dir();
            let copy = damage::quarantine(&self.fs, path, &dir, self.now_ms, how).map_err(|e| {
                io_err(
                    &dir,
                    format!("cannot keep a copy of {}: {e}", path.display()),
                )
            })?;
            self.quarantined.insert(path.to_path_buf());
            self.damage.quarantined.push(copy);
        }
        self.damage.losses.push(loss);
        Ok(self.damage.losses.len() - 1)
    }

    /// Log what the open found: each loss at error level, naming the file and where.
    pub(super) fn report(&self) {
        self.damage.log_errors("event log", "events");
    }

    /// The quarantine folder: beside the log's folder.
    pub(super) fn quarantine_dir(&self) -> PathBuf {
        self.opts
            .dir
            .parent()
            .unwrap_or(&self.opts.dir)
            .join(damage::QUARANTINE)
    }

    /// What opening the log found: losses (damage), torn tails cut, copies kept.
    pub fn damage(&self) -> &Damage {
        &self.damage
    }
}

/// The last event sequence number in the frames at `offsets` (checked before), latest first.
fn last_event_in(buf: &Span, salt: u64, offsets: &[u64]) -> Option<u64> {
    offsets.iter().rev().find_map(|&o| {
        let (payload, _) = buf.frame_at(salt, o)?;
        format::decode_records(&payload)?
            .iter()
            .filter_map(|r| match r {
                Record::Event { seq, .. } => Some(*seq),
                _ => None,
            })
            .last()
    })
}
