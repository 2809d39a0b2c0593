//! Giving space back: a segment with nothing pending is deleted, after the older live segments
//! it holds settle and retry records about are restated (invariant 5 in [`super`]).
//!
//! One of them may be kept as the **spare** ([`SPARE`]) instead: the next roll makes it the
//! head. Its blocks are written already, so a frame that reaches a new block overwrites it in
//! place; into a reserved (`fallocate`d) block, the sync after it must also write the inode's
//! extent change. Measured with direct 1,000-byte frames and a sync each: 6.2 KB reached the
//! device per sync into reserved blocks, 5.2 KB into written ones (docs/BENCHMARKS.md). The
//! spare counts in the disk bound, is kept only while the log holds less than half of it, and
//! goes before a publish is refused. Its old frames carry another salt: never read as frames,
//! and cut at recovery like a torn tail.

use super::format::{QueueState, Record, HEADER, SPARE};
use super::segment::Refs;
use super::Log;
use crate::store::StoreError;

/// Segments the last checkpoint records as owing events, and that owe none now, go once their
/// bytes are this many times the last checkpoint's: its cost (a checkpoint lists every segment)
/// stays a sixteenth of the bytes given back, at most, and the space they hold waiting is a
/// small share of the log's (a checkpoint takes 2–3 KB per 16 MiB segment).
pub const FREED_PER_CHECKPOINT: u64 = 16;

impl Log {
    /// Stage what deleting the segments with nothing pending needs, and name them: the
    /// restatement of every older live segment (invariant 5). A segment kept for the retention
    /// horizon (`retain.rs`) is not one of them. The caller commits the frame, then
    /// calls [`Log::remove_segments`].
    pub fn stage_collection(&mut self, now_ms: u64) -> Vec<u64> {
        self.now_ms = self.now_ms.max(now_ms);
        // A head with nothing pending that holds a quarter of a segment is closed, so that it can
        // go too (its bytes count against the disk bound until then).
        let head_done = self.segs.last().is_some_and(|s| {
            s.pending() == 0 && s.len >= (self.opts.segment_bytes / 4).max(HEADER as u64 + 1)
        });
        if head_done && self.pending_events.is_empty() && self.roll(now_ms, false).is_err() {
            return Vec::new();
        }
        let dead: Vec<usize> = (0..self.collectable())
            .filter(|i| {
                self.segs
                    .get(*i)
                    .is_some_and(|s| s.pending() == 0 && !self.kept(s))
            })
            .collect();
        // A segment the last checkpoint records as owing events waits for a checkpoint that
        // records it owing none: a listed segment found missing while owing events is then
        // damage, never a deletion whose settlements were in a segment deleted too.
        // They wait until they hold [`FREED_PER_CHECKPOINT`] times what a checkpoint costs
        // (or a publish needs their space: `stage_events`), so that a long drain, which
        // empties segments one after another, does not write a checkpoint of every segment
        // left for each one it empties.
        let owed = dead.len();
        let mut waiting = 0;
        let dead: Vec<usize> = dead
            .into_iter()
            .filter(|i| match self.segs.get(*i) {
                Some(s) if self.ck_owed.contains(&s.hdr.no) => {
                    waiting += s.len;
                    false
                }
                Some(_) => true,
                None => false,
            })
            .collect();
        if dead.len() < owed && waiting >= FREED_PER_CHECKPOINT * self.ck_len {
            self.ck_asap = true;
        }
        let Some(&newest_dead) = dead.last() else {
            return Vec::new();
        };
        // A segment kept for the checkpoint owes nothing, and the settlements that made it so
        // may be in a younger segment deleted now: it is restated too (plain crashsim seed
        // 1,490 at 60 operations: its events came back after a cut).
        // Only the live segments that the records of those deleted now speak of.
        let refs = dead
            .iter()
            .filter_map(|i| self.segs.get(*i))
            .fold(Refs::None, |r, s| r.union(s.refs));
        self.stage_restatements(newest_dead, dead.len() < owed, refs);
        dead.iter()
            .filter_map(|i| self.segs.get(*i).map(|s| s.hdr.no))
            .collect()
    }

    /// Whether a closed segment with nothing pending waits for a checkpoint (the last one
    /// records it owing events).
    pub fn owed_dead(&self) -> bool {
        self.segs
            .iter()
            .take(self.collectable())
            .any(|s| s.pending() == 0 && !self.kept(s) && self.ck_owed.contains(&s.hdr.no))
    }

    /// Segments before this position may be deleted: not the head and, while a segment is
    /// being compacted, neither it nor any younger one (the copy holds what that segment owed
    /// when it was planned, and the settlements since are in the younger segments: see
    /// `compact.rs`).
    fn collectable(&self) -> usize {
        let head = self.segs.len().saturating_sub(1);
        let keep_from = self
            .compacting
            .as_ref()
            .and_then(|c| self.segs.iter().position(|s| s.hdr.no == c.no))
            .unwrap_or(head);
        head.min(keep_from)
    }

    /// Stage the [`Log::restatements`] of the segments before `upto` that `refs` names, and
    /// note them in the staged frame's refs (that frame restates them).
    pub(super) fn stage_restatements(&mut self, upto: usize, all: bool, refs: Refs) {
        for r in self.restatements(upto, all, refs) {
            if let Record::State { segment, .. } = &r {
                self.staged_refs.add(*segment);
                self.restated += 1;
            }
            r.encode(&mut self.staged);
        }
    }

    /// A [`Record::State`] for every segment before position `upto` that owes anything (or
    /// every one with events, `all`: those that owe nothing but are still there) and that
    /// `refs` names (the records of the segments about to go speak of it), so that the records
    /// about them in the segments from `upto` on are no longer needed. A segment they do not
    /// name owes what its own records and the records of the segments that stay say.
    pub(super) fn restatements(&self, upto: usize, all: bool, refs: Refs) -> Vec<Record> {
        let mut records = Vec::new();
        for s in self.segs.iter().take(upto) {
            let Some(first) = s.first_seq else { continue };
            if (s.pending() == 0 && !all) || !refs.has(s.hdr.no) {
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
        records
    }

    /// Of the segments `nos` about to go, the one to keep as the spare, with its size: the
    /// largest, when there is no spare yet, it is at least half a segment, and the log with it
    /// stays within half its disk bound (under pressure the spare goes first: `stage_events`).
    fn spare_candidate(&self, nos: &[u64]) -> Option<(u64, u64)> {
        if self.spare.is_some() {
            return None;
        }
        let (no, size) = self
            .segs
            .iter()
            .filter(|s| nos.contains(&s.hdr.no))
            .map(|s| (s.hdr.no, s.file.size().unwrap_or(0)))
            .max_by_key(|(_, size)| *size)?;
        let gone: u64 = self
            .segs
            .iter()
            .filter(|s| nos.contains(&s.hdr.no))
            .map(|s| s.len)
            .sum();
        let after = self.bytes().saturating_sub(gone) + size;
        (size >= self.opts.segment_bytes / 2 && after <= self.opts.max_disk_bytes / 2)
            .then_some((no, size))
    }

    /// Delete the spare segment file (the disk bound needs its bytes).
    ///
    /// # Errors
    /// I/O failure (the log then fails).
    pub(super) fn drop_spare(&mut self) -> Result<(), StoreError> {
        if self.spare.take().is_none() {
            return Ok(());
        }
        let path = self.opts.dir.join(SPARE);
        if let Err(e) = self
            .fs
            .remove(&path)
            .and_then(|()| self.fs.sync_dir(&self.opts.dir))
        {
            self.fail(format!("{}: {e}", path.display()));
            return self.check();
        }
        Ok(())
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
        let keep = self.spare_candidate(nos);
        for no in nos {
            let path = self.path(*no);
            let gone = match &keep {
                Some((k, _)) if k == no => self.fs.rename(&path, &self.opts.dir.join(SPARE)),
                _ => self.fs.remove(&path),
            };
            if let Err(e) = gone {
                self.fail(format!("{}: {e}", path.display()));
                return self.check();
            }
        }
        if let Some((_, size)) = keep {
            self.spare = Some(size);
        }
        self.segs.retain(|s| !nos.contains(&s.hdr.no));
        if let Err(e) = self.fs.sync_dir(&self.opts.dir) {
            self.fail(format!("{}: {e}", self.opts.dir.display()));
            return self.check();
        }
        Ok(())
    }
}
