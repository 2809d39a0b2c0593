//! Giving space back: a segment with nothing pending is deleted, after the older live segments
//! it holds settle and retry records about are restated (invariant 5 in [`super`]).

use super::format::{QueueState, Record, HEADER};
use super::Log;
use crate::store::StoreError;

impl Log {
    /// Stage what deleting the segments with nothing pending needs, and name them: the
    /// restatement of every older live segment (invariant 5). The caller commits the frame, then
    /// calls [`Log::remove_segments`].
    pub fn stage_collection(&mut self, now_ms: u64) -> Vec<u64> {
        self.now_ms = self.now_ms.max(now_ms);
        // A head with nothing pending that holds a quarter of a segment is closed, so that it can
        // go too (its bytes count against the disk bound until then).
        let head_done = self.segs.last().is_some_and(|s| {
            s.pending() == 0 && s.len >= (self.opts.segment_bytes / 4).max(HEADER as u64 + 1)
        });
        if head_done && self.pending_events.is_empty() && self.roll(now_ms).is_err() {
            return Vec::new();
        }
        let head = self.segs.len().saturating_sub(1);
        // While a segment is being compacted, it and every younger one stay: the copy holds
        // what that segment owed when it was planned, and the settlements since are in the
        // younger segments (see `compact.rs`).
        let keep_from = self
            .compacting
            .as_ref()
            .and_then(|c| self.segs.iter().position(|s| s.hdr.no == c.no))
            .unwrap_or(head);
        let dead: Vec<usize> = (0..head.min(keep_from))
            .filter(|i| self.segs.get(*i).is_some_and(|s| s.pending() == 0))
            .collect();
        let Some(&newest_dead) = dead.last() else {
            return Vec::new();
        };
        let records = self.restatements(newest_dead, false);
        for r in records {
            r.encode(&mut self.staged);
        }
        dead.iter()
            .filter_map(|i| self.segs.get(*i).map(|s| s.hdr.no))
            .collect()
    }

    /// A [`Record::State`] for every segment before position `upto` that owes anything (or
    /// every one with events, `all`: those that owe nothing but are still there), so that the
    /// records about them in the segments from `upto` on are no longer needed.
    pub(super) fn restatements(&self, upto: usize, all: bool) -> Vec<Record> {
        let mut records = Vec::new();
        for s in self.segs.iter().take(upto) {
            let Some(first) = s.first_seq else { continue };
            if s.pending() == 0 && !all {
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

    /// Remove the named segments (after the frame [`Log::stage_collection`] staged is durable)
    /// and sync the directory.
    ///
    /// # Errors
    /// I/O failure (the log then fails: see invariant 6).
    pub fn remove_segments(&mut self, nos: &[u64]) -> Result<(), StoreError> {
        if nos.is_empty() {
            return Ok(());
        }
        for no in nos {
            let path = self.path(*no);
            if let Err(e) = self.fs.remove(&path) {
                self.fail(format!("{}: {e}", path.display()));
                return self.check();
            }
        }
        self.segs.retain(|s| !nos.contains(&s.hdr.no));
        if let Err(e) = self.fs.sync_dir(&self.opts.dir) {
            self.fail(format!("{}: {e}", self.opts.dir.display()));
            return self.check();
        }
        Ok(())
    }
}
