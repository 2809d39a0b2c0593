//! Pending bytes at recovery: what each segment owes each queue in body bytes ([`Bits`]'s
//! `bytes`), rebuilt without reading bodies in the common case.
//!
//! - A checkpoint records every segment's bytes per queue; the frames after it add each event's
//!   body size as it is replayed, and subtract each settle record's bytes (kind 7: one segment's
//!   settlements, with their bodies' total, written by [`Log::stage_settle`]).
//! - Where the records cannot tell, the segment is **counted again**: its frames are read and
//!   the bodies of the events still pending summed, once, at the end of the open. That is a
//!   restatement ([`Record::State`]) whose bits differ from those replayed (its settle records
//!   went with a deleted segment, or a compacted copy holds fewer events), events lost to
//!   damage, a settle record without bytes (kind 2, written before bytes were counted), and a
//!   checkpoint without them (the same): the last two only once, after an upgrade.
//!
//! [`Record::State`]: super::format::Record::State

use super::checkpoint::SegState;
use super::format::{self, Reader, Record, HEADER};
use super::segment::{past_hole, Bits};
use super::{damage, io_err, Log};
use crate::store::{QueueId, StoreError};
use std::collections::HashMap;

/// Version of the checkpoint's pending-bytes trailer.
const TRAILER_V1: u8 = 1;

/// Append the pending-bytes trailer of `segs` to a checkpoint's body: version u8, count u32,
/// (segment no u64, queue u32, bytes u64)… Not when a segment's bytes are unknown (only a test
/// writes the earlier format so).
pub(super) fn put_trailer(b: &mut Vec<u8>, segs: &[SegState]) {
    if !segs.iter().all(|s| s.bytes.is_some()) {
        return;
    }
    let owed: Vec<(u64, QueueId, u64)> = segs
        .iter()
        .flat_map(|s| {
            s.bytes
                .iter()
                .flatten()
                .map(move |(q, bytes)| (s.no, *q, *bytes))
        })
        .collect();
    b.push(TRAILER_V1);
    b.extend_from_slice(&(owed.len() as u32).to_le_bytes());
    for (no, q, bytes) in owed {
        b.extend_from_slice(&no.to_le_bytes());
        b.extend_from_slice(&q.to_le_bytes());
        b.extend_from_slice(&bytes.to_le_bytes());
    }
}

/// Read the pending-bytes trailer into `segs` (each segment gets its queues' bytes); `None`
/// when it is not one.
pub(super) fn get_trailer(r: &mut Reader<'_>, segs: &mut [SegState]) -> Option<()> {
    if r.u8()? != TRAILER_V1 {
        return None;
    }
    let n = r.u32()? as usize;
    if n > r.0.len() / 20 {
        return None;
    }
    for s in segs.iter_mut() {
        s.bytes = Some(Vec::new());
    }
    for _ in 0..n {
        let (no, q, bytes) = (r.u64()?, r.u32()?, r.u64()?);
        let seg = segs.iter_mut().find(|s| s.no == no)?;
        seg.bytes.get_or_insert_with(Vec::new).push((q, bytes));
    }
    Some(())
}

impl Log {
    /// Body bytes of the events pending in `queue`: written ones and those staged for the next
    /// frame. One pass over the segments (and the staged events), not over events.
    pub fn pending_bytes(&self, queue: QueueId) -> u64 {
        let written: u64 = self
            .segs
            .iter()
            .filter_map(|s| s.live.get(&queue))
            .map(|b| b.bytes)
            .sum();
        let staged: u64 = self
            .pending_events
            .iter()
            .filter(|(_, qs)| qs.contains(&queue))
            .map(|(c, _)| c.body.len() as u64)
            .sum();
        written + staged
    }

    /// Give the bits restored from checkpoint segment `st` their bytes; a checkpoint without
    /// them (written before bytes were counted) has the segment counted from its frames, once.
    pub(super) fn restore_bytes(&mut self, st: &SegState, live: &mut HashMap<QueueId, Bits>) {
        match &st.bytes {
            Some(owed) => {
                for (q, bytes) in owed {
                    if let Some(bits) = live.get_mut(q) {
                        bits.bytes = *bytes;
                    }
                }
            }
            None if !live.is_empty() => {
                self.recount.insert(st.no);
            }
            None => {}
        }
    }

    /// Replay a settle record: its events cleared, its bytes subtracted from their segment (or
    /// the segments counted again when the record has none, or did not clear all its events).
    pub(super) fn replay_settle(&mut self, queue: QueueId, seqs: &[u64], bytes: Option<u64>) {
        let mut segs: Vec<usize> = Vec::new();
        let mut cleared = 0;
        for s in seqs {
            if let Some(i) = self.settle_one(queue, *s, 0) {
                cleared += 1;
                if !segs.contains(&i) {
                    segs.push(i);
                }
            }
        }
        match (bytes, segs.as_slice()) {
            (_, []) => {}
            // The segment's bits go with its last event: nothing to subtract from then.
            (Some(b), [i]) if cleared == seqs.len() => {
                if let Some(bits) = self.segs.get_mut(*i).and_then(|s| s.live.get_mut(&queue)) {
                    bits.bytes = bits.bytes.saturating_sub(b);
                }
            }
            _ => {
                for i in segs {
                    if let Some(s) = self.segs.get(i) {
                        self.recount.insert(s.hdr.no);
                    }
                }
            }
        }
    }

    /// Count again the pending bytes of the segments noted in `recount`, from their frames.
    ///
    /// # Errors
    /// A segment could not be read.
    pub(super) fn recount_bytes(&mut self) -> Result<(), StoreError> {
        let mut nos: Vec<u64> = std::mem::take(&mut self.recount).into_iter().collect();
        nos.sort_unstable();
        for no in nos {
            let Some(i) = self.segs.iter().position(|s| s.hdr.no == no) else {
                continue;
            };
            let counted = self.count_segment(i)?;
            if let Some(seg) = self.segs.get_mut(i) {
                for (q, bits) in &mut seg.live {
                    bits.bytes = counted.get(q).copied().unwrap_or(0);
                }
            }
        }
        Ok(())
    }

    /// Body bytes of the events segment `i` owes, per queue, read from its frames (damaged
    /// spans stepped over).
    fn count_segment(&self, i: usize) -> Result<HashMap<QueueId, u64>, StoreError> {
        let mut out: HashMap<QueueId, u64> = HashMap::new();
        let Some(seg) = self.segs.get(i) else {
            return Ok(out);
        };
        if seg.live.values().all(|b| b.ones == 0) {
            return Ok(out);
        }
        let path = self.path(seg.hdr.no);
        let buf: bytes::Bytes = damage::read_whole(&*seg.file, seg.len)
            .map_err(|e| io_err(&path, e))?
            .into();
        let mut offset = HEADER as u64;
        while offset < seg.len {
            offset = past_hole(&seg.holes, offset);
            let Some((_, next)) = damage::frame_at(&buf, seg.hdr.salt, offset) else {
                // A failing frame no hole names yet (checkpointed frames are checked by the
                // scrub after the open): the events after it still count.
                match damage::next_frame(&buf, seg.hdr.salt, offset) {
                    Some(good) => {
                        offset = good;
                        continue;
                    }
                    None => break,
                }
            };
            let payload = buf.slice(offset as usize + format::FRAME_HEAD..next as usize);
            for r in format::decode_records(&payload).unwrap_or_default() {
                if let Record::Event { seq, body, .. } = r {
                    for (q, bits) in &seg.live {
                        if owes(seg.bit(seq), bits) {
                            *out.entry(*q).or_default() += body.len() as u64;
                        }
                    }
                }
            }
            offset = next;
        }
        Ok(out)
    }
}

fn owes(bit: Option<u64>, bits: &Bits) -> bool {
    bit.is_some_and(|b| bits.get(b))
}

#[cfg(test)]
mod tests {
    use super::super::format::Record;
    use super::super::{Log, LogOptions};
    use crate::store::fs::{Fs, RealFs};
    use crate::store::log::round;
    use crate::store::log::tests::{ev, real_opts};
    use crate::store::{QueueId, Settled};
    use std::collections::{BTreeMap, HashSet};
    use std::sync::Arc;

    /// Bodies of several sizes, so that a count by events would not pass.
    fn size(seq: u64) -> usize {
        50 + (seq % 37) as usize * 13
    }

    /// `(queue, seq)` → body bytes of what is pending.
    type Model = BTreeMap<(QueueId, u64), u64>;

    struct Bed {
        _dir: tempfile::TempDir,
        fs: Arc<dyn Fs>,
        lo: LogOptions,
        known: HashSet<QueueId>,
        model: Model,
    }

    impl Bed {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            // Small segments: a backlog spans many.
            let lo = real_opts(dir.path(), 16 << 10);
            Bed {
                _dir: dir,
                fs: Arc::new(RealFs),
                lo,
                known: [1, 2].into_iter().collect(),
                model: Model::new(),
            }
        }

        fn open(&self) -> Log {
            Log::open(self.fs.clone(), self.lo.clone(), &self.known, 1)
                .unwrap()
                .0
        }

        /// Events `seqs` for queue 1, and the odd ones for queue 2 too, a frame each.
        fn publish(&mut self, log: &mut Log, seqs: std::ops::RangeInclusive<u64>) {
            for seq in seqs {
                let e = ev(seq, size(seq));
                let mut items = vec![(1, e.clone())];
                self.model.insert((1, seq), size(seq) as u64);
                if seq % 2 == 1 {
                    items.push((2, e));
                    self.model.insert((2, seq), size(seq) as u64);
                }
                log.stage_events(&items, 0).unwrap();
                round::commit(log, seq).unwrap();
            }
        }

        fn settle(&mut self, log: &mut Log, q: QueueId, seqs: impl Iterator<Item = u64>) {
            let events: Vec<Settled> = seqs.map(|s| Settled::new(s, size(s))).collect();
            for e in &events {
                self.model.remove(&(q, e.seq));
            }
            log.stage_settle(q, &events);
            round::commit(log, 10_000).unwrap();
        }

        fn check(&self, log: &Log, when: &str) {
            for q in [1, 2] {
                let want: u64 = self
                    .model
                    .range((q, 0)..=(q, u64::MAX))
                    .map(|(_, b)| b)
                    .sum();
                assert_eq!(log.pending_bytes(q), want, "queue {q}, {when}");
            }
        }
    }

    #[test]
    fn bytes_follow_writes_and_settlements_and_come_back_from_a_checkpoint_and_replay() {
        let mut b = Bed::new();
        let mut log = b.open();
        b.publish(&mut log, 1..=300);
        assert!(log.segments() > 4, "{} segments", log.segments());
        b.check(&log, "written");
        b.settle(&mut log, 1, 1..=100);
        b.check(&log, "settled");
        // Settled again (a late duplicate): nothing is subtracted twice.
        let again: Vec<Settled> = (50..=60).map(|s| Settled::new(s, size(s))).collect();
        log.stage_settle(1, &again);
        b.check(&log, "settled twice");
        log.checkpoint().unwrap();
        // After the checkpoint: settlements of events before it (every other one, so that
        // their segments still owe the rest), and new events.
        b.settle(&mut log, 1, (101..=150).step_by(2));
        b.settle(&mut log, 2, (1..=99).step_by(4));
        b.publish(&mut log, 301..=350);
        b.check(&log, "after the checkpoint");
        // A crash: the checkpoint, then the frames after it.
        drop(log);
        let mut log = b.open();
        b.check(&log, "after a crash");
        // A clean stop: a checkpoint of everything.
        log.checkpoint().unwrap();
        drop(log);
        let mut log = b.open();
        b.check(&log, "after a clean stop");
        b.settle(&mut log, 1, 101..=350);
        b.settle(&mut log, 2, (1..=350).step_by(2));
        b.check(&log, "all delivered");
        assert_eq!(log.pending_bytes(1) + log.pending_bytes(2), 0);
    }

    #[test]
    fn a_log_written_before_bytes_were_counted_is_counted_from_its_frames_once() {
        let mut b = Bed::new();
        let mut log = b.open();
        b.publish(&mut log, 1..=200);
        b.settle(&mut log, 1, 1..=30);
        log.checkpoint().unwrap();
        // Settle records of the earlier kind (no bytes), after the checkpoint.
        for seq in 31..=40 {
            log.settle_one(1, seq, 0);
            b.model.remove(&(1, seq));
        }
        Record::Settle {
            queue: 1,
            seqs: (31..=40).collect(),
            bytes: None,
        }
        .encode(&mut log.staged);
        round::commit(&mut log, 10_000).unwrap();
        drop(log);
        // The checkpoint as the earlier format wrote it: no bytes.
        let probe = Log::empty(b.fs.clone(), b.lo.clone());
        let mut ck = probe.load_checkpoint().unwrap().unwrap();
        for s in &mut ck.segs {
            s.bytes = None;
        }
        let slot = b.lo.dir.join(format!("checkpoint.{}", ck.generation % 2));
        std::fs::write(&slot, ck.encode()).unwrap();
        assert_eq!(
            probe
                .load_checkpoint()
                .unwrap()
                .map(|c| c.segs[0].bytes.is_none()),
            Some(true)
        );
        let log = b.open();
        b.check(&log, "counted from the frames");
        assert!(log.recount.is_empty());
        // The next checkpoint has them: a later start reads no frame for them.
        let mut log = log;
        log.checkpoint().unwrap();
        drop(log);
        let log = b.open();
        b.check(&log, "from the new checkpoint");
    }
}
