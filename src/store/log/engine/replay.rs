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

/// A damaged span whose lost events are counted once the next event after it is known.
struct Gap {
    /// Index of its [`Loss`].
    loss: usize,
    /// The last event sequence number before it.
    before: u64,
}

impl Log {
    /// Walk the frames of the newest segment in memory (`buf`, its whole file): check each,
    /// apply those from `expect.apply_from` on, step over damaged spans (reported), and cut a
    /// torn tail of the newest segment.
    pub(super) fn replay(
        &mut self,
        path: &Path,
        file: &dyn FsFile,
        buf: &bytes::Bytes,
        salt: u64,
        expect: Expect,
        known: &HashSet<QueueId>,
    ) -> Result<(), StoreError> {
        let size = buf.len() as u64;
        // Below every event of the segment: the last of the segment before (events staged before
        // a roll go to the new head, so its header's base is no bound), or the first event the
        // checkpoint recorded.
        let prev = self
            .segs
            .iter()
            .rev()
            .skip(1)
            .find(|s| s.first_seq.is_some())
            .map_or(0, |s| s.last_seq);
        let base = match self.segs.last().and_then(|s| s.first_seq) {
            Some(first) if expect.apply_from > HEADER as u64 => prev.max(first.saturating_sub(1)),
            _ => prev,
        };
        let mut offset = HEADER as u64;
        // The last event seen in a decoded frame, and the good frames only checked since.
        let mut last_event: Option<u64> = None;
        let mut checked: Vec<u64> = Vec::new();
        let mut gap: Option<Gap> = None;
        if let Some(s) = self.segs.last_mut() {
            s.len = offset;
        }
        loop {
            if let Some((_, next)) = damage::frame_at(buf, salt, offset) {
                let applied = offset >= expect.apply_from;
                if applied || gap.is_some() {
                    let payload = buf.slice(offset as usize + format::FRAME_HEAD..next as usize);
                    let records = format::decode_records(&payload).ok_or_else(|| {
                        corrupt(path, format!("unreadable records at offset {offset}"))
                    })?;
                    let seqs = records.iter().filter_map(|r| match r {
                        Record::Event { seq, .. } => Some(*seq),
                        _ => None,
                    });
                    let (first, last) = (seqs.clone().next(), seqs.last());
                    if let (Some(g), Some(first)) = (&gap, first) {
                        self.close_gap(g, first, first.saturating_sub(g.before + 1));
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
                if let Some(s) = self.segs.last_mut() {
                    s.len = offset;
                }
                continue;
            }
            // No frame checks out at `offset`.
            let zeros = damage::zeros_after(buf, offset);
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
                if let Some(at) = damage::next_frame(buf, salt, offset) {
                    let loss = self.lose(
                        path,
                        Some(Keep::Copy),
                        Loss {
                            file: path.to_path_buf(),
                            offset,
                            bytes: at - offset,
                            frames: 1,
                            events: 0,
                            counted: true,
                            what: "damaged frame: the frames after it are recovered".into(),
                        },
                    )?;
                    if let Some(s) = self.segs.last_mut() {
                        s.holes.push((offset, at));
                        s.index.retain(|(_, o)| *o < offset || *o >= at);
                    }
                    gap = Some(Gap { loss, before });
                    offset = at;
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
                    Some(l) => self.close_gap(g, l + 1, l - g.before),
                    None => self.close_gap(g, u64::MAX, 0),
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
                    Some(l) if pending.is_some() => self.close_gap(&g, l + 1, 0),
                    Some(l) => self.close_gap(&g, l + 1, l - before),
                    None => {
                        self.close_gap(&g, u64::MAX, damage::events_unchecked(buf, offset, size))
                    }
                }
            } else {
                let recycled = self.segs.last().is_some_and(|s| s.hdr.recycled);
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
                Some(l) => self.close_gap(&g, l + 1, l - g.before),
                None => self.close_gap(&g, u64::MAX, 0),
            }
        }
        if let Some(s) = self.segs.last_mut() {
            // A checkpoint's sparse index may point into what was cut: new frames go there
            // (damage seed 2,530 read an event written after the restart from the middle of
            // a frame).
            let len = s.len;
            s.index.retain(|(_, o)| *o < len);
        }
        Ok(())
    }

    /// Count the events of loss `g` (sequence numbers after `g.before` and before `after`) and
    /// note them lost in the current segment.
    fn close_gap(&mut self, g: &Gap, after: u64, events: u64) {
        if let Some(l) = self.damage.losses.get_mut(g.loss) {
            l.events += events;
            l.counted &= after != u64::MAX;
        }
        if let Some(no) = self.segs.last().map(|s| s.hdr.no) {
            self.lost.push((no, g.before, after));
        }
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
fn last_event_in(buf: &bytes::Bytes, salt: u64, offsets: &[u64]) -> Option<u64> {
    offsets.iter().rev().find_map(|&o| {
        let (_, next) = damage::frame_at(buf, salt, o)?;
        let payload = buf.slice(o as usize + format::FRAME_HEAD..next as usize);
        format::decode_records(&payload)?
            .iter()
            .filter_map(|r| match r {
                Record::Event { seq, .. } => Some(*seq),
                _ => None,
            })
            .last()
    })
}
