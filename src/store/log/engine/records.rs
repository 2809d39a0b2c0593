//! What recovery does with each record it reads: the frame indexed, the record applied to what
//! each segment owes each queue, queues no subscription owns forgotten; and, once every segment
//! is read, each queue's pending list built from runs of set bits ([`Log::recovered`]).

use super::format::Record;
use super::{Bits, Log, Recovered, INDEX_STRIDE};
use crate::store::{QueueId, RetryState};
use std::collections::{HashMap, HashSet};

impl Log {
    /// Index a frame that is about to be applied.
    pub(super) fn note_frame(&mut self, offset: u64, records: &[Record]) {
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
    pub(super) fn apply(&mut self, r: Record, known: &HashSet<QueueId>) {
        match r {
            Record::Event {
                seq,
                first_ms,
                queues,
                body,
                ..
            } => {
                if let Some(seg) = self.segs.last_mut() {
                    seg.note_ms(seq, first_ms);
                }
                let size = body.len() as u64;
                self.add_event(
                    seq,
                    size,
                    queues.iter().filter(|q| known.contains(q)).copied(),
                )
            }
            Record::Settle { queue, seqs, bytes } => self.replay_settle(queue, &seqs, bytes),
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
                let no = seg.hdr.no;
                // A restatement only narrows what the segment owes: an event it lists that the
                // segment does not owe now was settled since, or is not in the file. A
                // compacted copy holds only what was pending at its plan, and a restatement
                // older than the plan may list events settled before it (crashsim damage seeds
                // 16,562 and 56,821: their settle records lost to damage, such events were
                // listed pending, unreadable, their bytes counted nowhere).
                for qs in queues.into_iter().filter(|q| known.contains(&q.queue)) {
                    let mut bits = Bits::from_words(qs.words);
                    bits.and(old.get(&qs.queue));
                    for (s, st) in qs.retries {
                        if s.checked_sub(first_seq).is_some_and(|i| bits.get(i)) {
                            self.retries.insert((qs.queue, s), st);
                        }
                    }
                    // The same events owed: the same bytes. Otherwise (settle records lost
                    // with a deleted segment, a compacted copy) the segment is counted again.
                    match old.get(&qs.queue).filter(|o| o.same_bits(&bits)) {
                        Some(o) => bits.bytes = o.bytes,
                        None if bits.ones > 0 => {
                            self.recount.insert(no);
                        }
                        None => {}
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

    pub(super) fn forget_unknown(&mut self, known: &HashSet<QueueId>) {
        for s in &mut self.segs {
            s.live.retain(|q, _| known.contains(q));
        }
        self.retries.retain(|(q, _), _| known.contains(q));
    }

    /// Per queue, every pending event, in order: those that failed with their retry state, the
    /// others as runs of sequence numbers first enqueued in the same second (from each
    /// segment's `ms_runs`). Built from runs of set bits, not event by event: a segment owed
    /// whole costs a few runs, so a start with a large backlog does not grow with it.
    pub(super) fn recovered(&self) -> Recovered {
        let mut failed: HashMap<QueueId, Vec<(u64, RetryState)>> = HashMap::new();
        for (&(q, seq), st) in &self.retries {
            failed.entry(q).or_default().push((seq, *st));
        }
        for v in failed.values_mut() {
            v.sort_unstable_by_key(|(seq, _)| *seq);
        }
        let mut out: Recovered = HashMap::new();
        // Segments come in sequence order, and so do their bits.
        for s in &self.segs {
            let Some(first) = s.first_seq else { continue };
            for (q, bits) in &s.live {
                let pending = out.entry(*q).or_default();
                let failed = failed.get(q).map_or(&[][..], Vec::as_slice);
                for (i, n) in bits.runs() {
                    push_run(pending, first + i, n, &s.ms_runs, failed);
                }
            }
        }
        out
    }
}

/// Add the pending events `from .. from + n` to `out`: those in `failed` (sorted) with their
/// retry state, the others as fresh runs split where `ms_runs` (`(first seq, ms)`, sorted)
/// changes their first-enqueue time.
fn push_run(
    out: &mut crate::store::PendingRuns,
    from: u64,
    n: u64,
    ms_runs: &[(u64, u64)],
    failed: &[(u64, RetryState)],
) {
    let end = from + n;
    let mut at = from;
    let mut next_failed = failed.partition_point(|(seq, _)| *seq < from);
    while at < end {
        let (stop, retry) = match failed.get(next_failed) {
            Some(&(seq, st)) if seq < end => (seq, Some(st)),
            _ => (end, None),
        };
        // Fresh events `at .. stop`, one run per first-enqueue second.
        while at < stop {
            let run = ms_runs.partition_point(|(f, _)| *f <= at);
            let ms = run
                .checked_sub(1)
                .and_then(|r| ms_runs.get(r))
                .map_or(0, |r| r.1);
            let upto = ms_runs.get(run).map_or(stop, |r| r.0.min(stop));
            out.push_fresh(at, upto - at, ms);
            at = upto;
        }
        if let Some(st) = retry {
            out.push(stop, st);
            at = stop + 1;
            next_failed += 1;
        }
    }
}
