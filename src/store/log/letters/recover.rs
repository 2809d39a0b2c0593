//! Opening the dead-letter log: each segment's frames checked and applied, damage told apart
//! from a write cut by a crash (the event log's rules, `engine/damage.rs`, for a log whose
//! puts are not synced one by one).
//!
//! * A closed segment was synced before the next one started: anything in it that fails its
//!   checksum, or follows its last frame, is **damage**.
//! * The newest segment may end in writes a crash cut or lost: several frames, since puts are
//!   synced per batch, and a lost write may sit before a kept one. What was synced is known from
//!   the [`LetterRecord::Synced`] records: the first frame after each sync says how far the
//!   segment was synced, and a clean stop writes one more frame (synced) to say it of the last
//!   frames too. A frame that fails below the furthest such offset is damage; the first one at
//!   or past it starts the **torn tail**, cut with everything after it (none of it was
//!   synced as far as the file can tell).
//! * Damage loses only its own span: the frames after it are applied, reads never touch it
//!   (letters are read by their own frame's place), and the loss is reported: copied to the
//!   quarantine folder first, an error log line naming the file and the offset, counted in
//!   the store's damage (metrics, `/readyz`). `persistence__onDamage=refuse` stops the open at
//!   the first loss, before anything is changed.
//! * A segment whose header does not read is moved to the quarantine folder (never deleted),
//!   unless it is the newest and holds nothing after the header (a roll cut by a crash).
//!
//! What cannot be told from a torn write: damage to frames of the newest segment synced after
//! the last frame that records a sync, when the process did not stop cleanly.

use super::record::{self, LetterRecord};
use super::{io_err, Inner, Loc, Seg};
use crate::store::log::engine::{self, Keep, Loss};
use crate::store::log::format::{self, Header, HEADER, LETTERS_MAGIC};
use crate::store::StoreError;
use bytes::Bytes;
use std::path::Path;

/// One stretch of a segment file, as read at open.
enum Part {
    /// A frame that checks out, and its records.
    Frame {
        at: u64,
        next: u64,
        recs: Vec<LetterRecord>,
    },
    /// Bytes from `at` to `end` with no frame in them that checks out (`end`: the next frame
    /// that does, or the end of the file).
    Bad { at: u64, end: u64 },
}

impl Inner {
    /// Recover segment `no` (`next`: the number of the segment after it, if any).
    pub(super) fn recover(&mut self, no: u64, next: Option<u64>) -> Result<(), StoreError> {
        let path = self.path(no);
        let file = self.fs.open(&path).map_err(|e| io_err(&path, e))?;
        let size = file.size().map_err(|e| io_err(&path, e))?;
        let buf = Bytes::from(engine::read_whole(&*file, size).map_err(|e| io_err(&path, e))?);
        let size = buf.len() as u64;
        let hdr = match buf
            .get(..HEADER.min(buf.len()))
            .and_then(|h| Header::decode_with(h, LETTERS_MAGIC))
        {
            Some(h) if h.no == no => h,
            _ if next.is_none() && size <= HEADER as u64 => {
                // A roll cut by a crash: no frame goes in before the header is synced.
                self.fs.remove(&path).map_err(|e| io_err(&path, e))?;
                self.fs
                    .sync_dir(&self.opts.dir)
                    .map_err(|e| io_err(&self.opts.dir, e))?;
                return Ok(());
            }
            _ => {
                let bound = next.and_then(|n| self.base_of(n));
                let between = bound.map_or(0, |b| b.saturating_sub(self.next_id));
                let (frames, letters, max_id) = unchecked(&buf, HEADER as u64, size);
                self.next_id = self.next_id.max(max_id).max(bound.unwrap_or(0));
                self.lose(
                    &path,
                    Keep::Move,
                    Loss {
                        file: path.clone(),
                        offset: 0,
                        bytes: size,
                        frames: frames.max(1),
                        events: letters.max(between),
                        counted: bound.is_some(),
                        what: "segment header damaged: its frames cannot be checked; moved to the quarantine folder".into(),
                    },
                )?;
                return Ok(());
            }
        };
        self.next_id = self.next_id.max(hdr.base_seq);
        let newest = next.is_none();
        let parts = parts(&buf, hdr.salt);
        // How far the newest segment is known to have been synced (a closed one: all of it).
        let proven = if newest {
            parts
                .iter()
                .flat_map(|p| match p {
                    Part::Frame { recs, .. } => recs.as_slice(),
                    Part::Bad { .. } => &[],
                })
                .filter_map(|r| match r {
                    LetterRecord::Synced { upto } => Some(*upto),
                    _ => None,
                })
                .max()
                .unwrap_or(HEADER as u64)
        } else {
            u64::MAX
        };
        // The last letter id given before each place: counts what a damaged span held.
        let mut before = hdr.base_seq;
        let mut len = HEADER as u64;
        let mut cut = None;
        for (i, part) in parts.iter().enumerate() {
            match part {
                Part::Frame { at, next, recs } => {
                    for r in recs {
                        if let LetterRecord::Letter { letter, .. } = r {
                            before = before.max(letter.id);
                        }
                    }
                    self.apply(no, *at, *next, recs.clone());
                    len = *next;
                }
                Part::Bad { at, .. } if *at >= proven => {
                    // Past what the file says was synced: a write the crash cut or lost.
                    tracing::warn!(file = %path.display(), offset = at, bytes = size - at, "cutting a torn tail of the dead-letter log (writes not synced before a crash)");
                    cut = Some(*at);
                    break;
                }
                Part::Bad { at, end } => {
                    let after = parts
                        .get(i + 1..)
                        .unwrap_or_default()
                        .iter()
                        .flat_map(|p| match p {
                            Part::Frame { recs, .. } => recs.as_slice(),
                            Part::Bad { .. } => &[],
                        })
                        .filter_map(|r| match r {
                            LetterRecord::Letter { letter, .. } if letter.id > before => {
                                Some(letter.id)
                            }
                            _ => None,
                        })
                        .min()
                        .or_else(|| {
                            next.and_then(|n| self.base_of(n))
                                .map(|b| b.saturating_add(1))
                        });
                    let (letters, counted) = match after {
                        Some(a) => (a.saturating_sub(before + 1), true),
                        None => (unchecked(&buf, *at, *end).1, false),
                    };
                    let what = if *end >= size && newest {
                        "damaged frame below what the segment records as synced"
                    } else if *end >= size {
                        "damaged frame at the end of a segment that was complete"
                    } else {
                        "damaged frame: the frames after it are recovered"
                    };
                    self.lose(
                        &path,
                        Keep::Copy,
                        Loss {
                            file: path.clone(),
                            offset: *at,
                            bytes: end - at,
                            frames: 1,
                            events: letters,
                            counted,
                            what: what.into(),
                        },
                    )?;
                    if *end >= size {
                        // Nothing after it: new frames go after the last good one.
                        cut = newest.then_some(*at);
                    } else {
                        // New frames go after the last one; the span stays, stepped over.
                        len = *end;
                    }
                }
            }
        }
        if newest {
            if let Some(at) = cut.filter(|a| *a < size) {
                file.set_len(at).map_err(|e| io_err(&path, e))?;
                len = at;
            }
            // What is recovered is synced, so that a later `Synced` record tells the truth.
            file.sync_data().map_err(|e| io_err(&path, e))?;
            self.synced = len;
            self.proven = proven.min(len);
        }
        self.segs.insert(no, Seg { hdr, file, len });
        Ok(())
    }

    /// Apply the records of the frame at `at` (up to `next`) of segment `no`.
    fn apply(&mut self, no: u64, at: u64, next: u64, recs: Vec<LetterRecord>) {
        for r in recs {
            match r {
                LetterRecord::Letter { queue, letter } => {
                    let size = letter.size();
                    let loc = Loc {
                        seg: no,
                        at,
                        len: next - at,
                        size,
                    };
                    self.insert(queue, letter.id, loc);
                }
                LetterRecord::Gone { queue, ids } => {
                    for id in ids {
                        self.forget(queue, id);
                    }
                }
                LetterRecord::DropQueue { queue } => self.forget_queue(queue),
                LetterRecord::Synced { .. } => {}
            }
        }
    }

    /// The next letter id recorded in segment `no`'s header, if it reads.
    fn base_of(&self, no: u64) -> Option<u64> {
        let file = self.fs.open(&self.path(no)).ok()?;
        let mut hb = [0u8; HEADER];
        let read = file.read_at(&mut hb, 0).ok()?;
        Header::decode_with(hb.get(..read)?, LETTERS_MAGIC)
            .filter(|h| h.no == no)
            .map(|h| h.base_seq)
    }

    /// Record a loss, the damaged file first put in the quarantine folder (once per open).
    fn lose(&mut self, path: &Path, how: Keep, loss: Loss) -> Result<(), StoreError> {
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
        if !self.quarantined.contains(path) {
            let dir = self
                .opts
                .dir
                .parent()
                .unwrap_or(&self.opts.dir)
                .join(engine::QUARANTINE);
            let now = crate::clock::system_wall_ms();
            let copy = engine::quarantine(&self.fs, path, &dir, now, how).map_err(|e| {
                io_err(
                    &dir,
                    format!("cannot keep a copy of {}: {e}", path.display()),
                )
            })?;
            self.quarantined.insert(path.to_path_buf());
            self.damage.quarantined.push(copy);
        }
        self.damage.losses.push(loss);
        Ok(())
    }

    /// Log what the open found: each loss at error level, naming the file and where.
    pub(super) fn report(&self) {
        self.damage.log_errors("dead-letter log", "dead letters");
    }
}

/// The frames of a segment file (`buf`, whole) that check out with `salt`, and the spans
/// between them that do not. Zeros after the last frame end the file (no span).
fn parts(buf: &Bytes, salt: u64) -> Vec<Part> {
    let size = buf.len() as u64;
    let mut out = Vec::new();
    let mut at = HEADER as u64;
    while at < size {
        if let Some((_, next)) = engine::frame_at(buf, salt, at) {
            let payload = buf.slice(at as usize + format::FRAME_HEAD..next as usize);
            match record::decode(&payload) {
                Some(recs) => out.push(Part::Frame { at, next, recs }),
                // Its checksum holds and its records do not read: written so, never torn.
                None => out.push(Part::Bad { at, end: next }),
            }
            at = next;
            continue;
        }
        if engine::zeros_after(buf, at) {
            // Nothing was written here, or it was written as zeros: a span only when it is
            // below a `Synced` record or in a closed segment (the caller decides; see there).
            out.push(Part::Bad { at, end: size });
            break;
        }
        let end = engine::next_frame(buf, salt, at).unwrap_or(size);
        out.push(Part::Bad { at, end });
        at = end;
    }
    out
}

/// Frames, letters and the largest letter id between `from` and `to` of `buf`, read by their
/// lengths without their checksums (what a damaged span or file held, as far as it reads).
fn unchecked(buf: &Bytes, from: u64, to: u64) -> (u64, u64, u64) {
    let mut at = usize::try_from(from).unwrap_or(usize::MAX);
    let to = usize::try_from(to).unwrap_or(usize::MAX).min(buf.len());
    let (mut frames, mut letters, mut max_id) = (0, 0, 0);
    while let Some(head) = buf
        .get(at..at + format::FRAME_HEAD)
        .filter(|_| at + format::FRAME_HEAD <= to)
    {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let end = at + format::FRAME_HEAD + len;
        if len == 0 || end > to {
            break;
        }
        frames += 1;
        let Some(recs) = record::decode(&buf.slice(at + format::FRAME_HEAD..end)) else {
            break;
        };
        for r in recs {
            if let LetterRecord::Letter { letter, .. } = r {
                letters += 1;
                max_id = max_id.max(letter.id);
            }
        }
        at = end;
    }
    (frames, letters, max_id)
}
