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
        // A head with nothing pending that holds a quarter of a segment is closed, so that it can
        // go too (its bytes count against the disk bound until then).
        let head_done = self.segs.last().is_some_and(|s| {
            s.pending() == 0 && s.len >= (self.opts.segment_bytes / 4).max(HEADER as u64 + 1)
        });
        if head_done && self.pending_events.is_empty() && self.roll(now_ms).is_err() {
            return Vec::new();
        }
        let head = self.segs.len().saturating_sub(1);
        let dead: Vec<usize> = (0..head)
            .filter(|i| self.segs.get(*i).is_some_and(|s| s.pending() == 0))
            .collect();
        let Some(&newest_dead) = dead.last() else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for s in self.segs.iter().take(newest_dead) {
            let Some(first) = s.first_seq else { continue };
            if s.pending() == 0 {
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
        for r in records {
            r.encode(&mut self.staged);
        }
        dead.iter()
            .filter_map(|i| self.segs.get(*i).map(|s| s.hdr.no))
            .collect()
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
