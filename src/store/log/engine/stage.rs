//! Staging for the next frame: a publish's events (each body once, for all its queues, within
//! the disk bound), settlements, retry states and dropped queues, as records; what is staged
//! waits for the committer's next frame.

use super::format::Record;
use super::{Cached, Log};
use crate::store::{QueueId, RetryState, Settled, StoreError, StoredEvent};
use std::collections::BTreeMap;

impl Log {
    /// Stage events (one publish's copies: `(queue, event)` pairs, the same event once per
    /// queue, in sequence order) for the next frame: each body once. Queues deleted are left out.
    ///
    /// # Errors
    /// [`StoreError::Full`] when the disk bound would be passed (nothing staged then); an earlier
    /// write failure.
    pub fn stage_events(
        &mut self,
        items: &[(QueueId, StoredEvent)],
        reserved: u64,
    ) -> Result<(), StoreError> {
        self.check()?;
        let mut events: BTreeMap<u64, (&StoredEvent, Vec<QueueId>)> = BTreeMap::new();
        for (q, e) in items {
            if !self.dropped.contains(q) {
                events.entry(e.seq).or_insert((e, Vec::new())).1.push(*q);
            }
        }
        if let Some((&first, _)) = events.first_key_value() {
            if first <= self.max_seq {
                return Err(StoreError::Io(format!(
                    "event {first} submitted out of order (the log is at {})",
                    self.max_seq
                )));
            }
        }
        let bytes: u64 = events
            .values()
            .map(|(e, qs)| {
                let trace = Record::trace_len(e.trace.as_deref());
                (Record::event_len(qs.len(), e.id.len(), e.body.len()) + trace) as u64
            })
            .sum();
        // Segments with nothing pending are deleted by the next collection (right after this
        // frame): they do not hold the bound. Weighed only near it (a pass over every segment);
        // those that wait for a checkpoint to go (`collect.rs`) then go with one in this round.
        let mut used = self.bytes() + reserved;
        if used + bytes > self.opts.max_disk_bytes {
            used = used.saturating_sub(self.reclaimable());
            self.ck_asap |= self.owed_dead();
        }
        if used + bytes > self.opts.max_disk_bytes && self.spare.is_some() {
            // The spare is a convenience: it goes before a publish is refused.
            self.drop_spare()?;
            used = (self.bytes() + reserved).saturating_sub(self.reclaimable());
        }
        if used + bytes > self.opts.max_disk_bytes {
            // Then segments kept only for the retention horizon, oldest first (counted).
            let need = used + bytes - self.opts.max_disk_bytes;
            if self.release_kept(need) > 0 {
                used = (self.bytes() + reserved).saturating_sub(self.reclaimable());
            }
        }
        if used + bytes > self.opts.max_disk_bytes {
            return Err(StoreError::Full {
                used,
                limit: self.opts.max_disk_bytes,
            });
        }
        for (e, queues) in events.into_values() {
            self.add_staged_event(e, queues);
        }
        Ok(())
    }

    fn add_staged_event(&mut self, e: &StoredEvent, queues: Vec<QueueId>) {
        let rec = Record::Event {
            seq: e.seq,
            first_ms: e.state.first_enqueued_ms,
            queues,
            id: e.id.clone(),
            body: e.body.clone(),
            trace: e.trace.clone(),
        };
        rec.encode(&mut self.staged);
        if let Record::Event {
            seq,
            first_ms,
            queues,
            id,
            body,
            trace,
        } = rec
        {
            self.max_seq = self.max_seq.max(seq);
            let cached = Cached {
                seq,
                id,
                body,
                first_ms,
                trace,
            };
            self.pending_events.push((cached, queues));
        }
    }

    /// Stage the settlement of events of `queue` (delivered, dropped, dead-lettered), each with
    /// its body's size. Those still pending are written as one settle record per segment,
    /// carrying their bytes; the others are left out.
    pub fn stage_settle(&mut self, queue: QueueId, events: &[Settled]) {
        // The run of settled events in one segment: (segment index, seqs, bytes). Settlements
        // come in sequence order, so mostly one.
        let mut run: Option<(usize, Vec<u64>, u64)> = None;
        for e in events {
            let bytes = u64::from(e.bytes);
            let Some(i) = self.settle_one(queue, e.seq, bytes) else {
                continue;
            };
            match &mut run {
                Some((seg, seqs, total)) if *seg == i => {
                    seqs.push(e.seq);
                    *total += bytes;
                }
                _ => {
                    self.stage_settled(queue, run.take());
                    let mut seqs = Vec::with_capacity(events.len());
                    seqs.push(e.seq);
                    run = Some((i, seqs, bytes));
                }
            }
        }
        self.stage_settled(queue, run);
    }

    /// The settle record of one segment's run of settled events.
    fn stage_settled(&mut self, queue: QueueId, run: Option<(usize, Vec<u64>, u64)>) {
        if let Some((i, seqs, bytes)) = run {
            self.stage_ref(Some(i));
            Record::Settle {
                queue,
                seqs,
                bytes: Some(bytes),
            }
            .encode(&mut self.staged);
        }
    }

    /// Note that the records staged speak of the segment at `seg` (any, when not known).
    fn stage_ref(&mut self, seg: Option<usize>) {
        match seg.and_then(|i| self.segs.get(i)) {
            Some(s) => self.staged_refs.add(s.hdr.no),
            None => self.staged_refs = super::segment::Refs::All,
        }
    }

    /// Stage a new retry state for events of `queue`.
    pub fn stage_retry(&mut self, queue: QueueId, seqs: &[u64], state: RetryState) {
        let live: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| self.is_pending(queue, *s))
            .collect();
        for s in &live {
            self.retries.insert((queue, *s), state);
            self.stage_ref(self.seg_of(*s));
        }
        if !live.is_empty() {
            Record::Retry {
                queue,
                state,
                seqs: live,
            }
            .encode(&mut self.staged);
        }
    }

    /// Stage the deletion of a queue: nothing of it is pending any more, and later appends to it
    /// are left out.
    pub fn stage_drop_queue(&mut self, queue: QueueId) {
        self.dropped.insert(queue);
        self.drop_queue_state(queue);
        self.staged_refs = super::segment::Refs::All;
        Record::DropQueue { queue }.encode(&mut self.staged);
    }

    /// Bytes of records staged for the next frame.
    pub fn staged_bytes(&self) -> usize {
        self.staged.len()
    }

    /// Whether anything waits for the next frame.
    pub fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }
}
