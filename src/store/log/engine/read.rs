//! Reads: events by sequence number, from the in-memory tail of recent bodies or from their
//! segment's frames (a sparse index finds the frame to start from). Planned under the log's
//! lock ([`Log::plan_get`]), run outside it ([`Reads::run`]).

use super::format::{self, Record, FRAME_HEAD, HEADER};
use super::{Cached, Log};
use crate::store::fs::FsFile;
use crate::store::{QueueId, RetryState, StoreError, StoredEvent};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Bytes of frames [`FrameCache`] keeps at most (a frame's payload plus what each of its events
/// costs besides: its [`Cached`] and its id); a frame over half of it is kept alone.
pub const FRAME_CACHE_BYTES: usize = 2 << 20;
/// What the allocator spends on an id besides its bytes (rounding, header).
const ID_OVERHEAD: usize = 16;

/// Frames read lately, checked and decoded (their events only). A drain asks for its events a
/// chunk at a time (the refill's 64), and a frame of batched publishes holds hundreds: without
/// this every chunk read, checked and decoded its frame again. A frame is kept only when it holds
/// events after the last one asked for (the next chunk's); oldest out first. Frames never change
/// once written, and a compacted segment keeps its number with a new salt, so `(segment number,
/// salt, offset)` names one.
#[derive(Default)]
pub struct FrameCache {
    frames: HashMap<FrameKey, Arc<Decoded>>,
    order: VecDeque<FrameKey>,
    bytes: usize,
}

/// Segment number, salt, offset.
type FrameKey = (u64, u64, u64);

/// A frame's events, decoded (each body a slice of the frame's payload), and where the next
/// frame starts.
pub struct Decoded {
    events: Vec<Cached>,
    next: u64,
    bytes: usize,
}

impl FrameCache {
    fn get(&self, key: FrameKey) -> Option<Arc<Decoded>> {
        self.frames.get(&key).cloned()
    }

    fn remove(&mut self, key: FrameKey) {
        if let Some(f) = self.frames.remove(&key) {
            self.bytes -= f.bytes;
            self.order.retain(|k| *k != key);
        }
    }

    /// Keep `frame`, the oldest out first. A frame over half the bound is kept alone (every
    /// other one out), until the next frame put or a read of its last event: a frame written while a sync was slow holds
    /// megabytes of events, and a drain reads it 64 events at a time. Not kept, each of those
    /// reads read, checked and decoded it whole again, and each read's copy stayed alive while
    /// its events waited in the window or in a delivery (several copies of one large frame: the
    /// drain's largest transient). Kept, it is read once; its payload is held as long as its
    /// events are anyway, so the cache adds only the decoded events.
    fn put(&mut self, key: FrameKey, frame: Arc<Decoded>) {
        if self.frames.contains_key(&key) {
            return;
        }
        let limit = FRAME_CACHE_BYTES.max(frame.bytes);
        while self.bytes + frame.bytes > limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(f) = self.frames.remove(&old) {
                self.bytes -= f.bytes;
            }
        }
        self.bytes += frame.bytes;
        self.order.push_back(key);
        self.frames.insert(key, frame);
    }

    /// Bytes kept (tests).
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A point read prepared under the lock: frames of one file from an offset.
struct ReadPlan {
    file: Arc<dyn FsFile>,
    no: u64,
    salt: u64,
    from: u64,
    end: u64,
    want: Vec<(usize, u64)>,
    /// The segment's damaged spans ([`super::segment::Seg::holes`]), stepped over.
    holes: Vec<(u64, u64)>,
}

/// Read one frame at `offset`: `Some((payload, next offset))`, `None` at the end of the valid
/// frames (short, wrong length, or CRC mismatch).
pub(crate) fn read_frame(
    file: &dyn FsFile,
    salt: u64,
    offset: u64,
    end: u64,
) -> std::io::Result<Option<(Bytes, u64)>> {
    let mut head = [0u8; FRAME_HEAD];
    if offset + FRAME_HEAD as u64 > end || file.read_at(&mut head, offset)? < FRAME_HEAD {
        return Ok(None);
    }
    let mut r = format::Reader(&head);
    let (Some(len), Some(crc)) = (r.u32(), r.u32()) else {
        return Ok(None);
    };
    let next = offset + FRAME_HEAD as u64 + u64::from(len);
    // Length 0: zeros after the last frame (padding, reserved blocks), never a frame.
    if len == 0 || len > format::MAX_FRAME || next > end {
        return Ok(None);
    }
    let mut payload = vec![0u8; len as usize];
    if file.read_at(&mut payload, offset + FRAME_HEAD as u64)? < payload.len() {
        return Ok(None);
    }
    if format::frame_crc(salt, &payload) != crc {
        return Ok(None);
    }
    Ok(Some((Bytes::from(payload), next)))
}

impl Log {
    /// `(seq, retry state)` of every pending event of `queue`, in order, reading the log for the
    /// first-enqueued times (after start-up; recovery answers the first call per queue).
    ///
    /// # Errors
    /// Unreadable data.
    pub fn index_of(&self, queue: QueueId) -> Result<Vec<(u64, RetryState)>, StoreError> {
        let seqs: Vec<u64> = self
            .segs
            .iter()
            .filter_map(|s| Some((s.first_seq?, s.live.get(&queue)?)))
            .flat_map(|(first, bits)| bits.iter().map(move |i| first + i))
            .collect();
        Ok(self
            .plan_get(queue, &seqs)
            .run()?
            .into_iter()
            .flatten()
            .map(|e| (e.seq, e.state))
            .collect())
    }

    /// Plan reading events of `queue` by sequence number (run it with [`Reads::run`], outside
    /// the lock); `None` for one not pending.
    pub fn plan_get(&self, queue: QueueId, seqs: &[u64]) -> Reads {
        let states = seqs
            .iter()
            .filter_map(|s| self.retries.get(&(queue, *s)).map(|st| (*s, *st)))
            .collect();
        let mut cached = Vec::new();
        let mut from_disk = Vec::new();
        for (pos, seq) in seqs.iter().enumerate() {
            if !self.is_pending(queue, *seq) {
                continue;
            }
            match self.cached(*seq) {
                Some(c) => cached.push((pos, c.clone())),
                None => from_disk.push((pos, *seq)),
            }
        }
        Reads {
            plans: self.plan_reads(&from_disk),
            cached,
            states,
            n: seqs.len(),
            frames: self.frames.clone(),
            found: self.found.clone(),
        }
    }

    /// Bytes the frame cache holds (tests).
    #[cfg(test)]
    pub fn frame_cache_bytes(&self) -> usize {
        crate::sync::lock(&self.frames).bytes()
    }

    /// A recently written event, if the tail still holds it.
    fn cached(&self, seq: u64) -> Option<&Cached> {
        let i = self.tail.partition_point(|c| c.seq < seq);
        self.tail.get(i).filter(|c| c.seq == seq)
    }

    /// Reads of pending events (`(position asked, seq)`) from their segments.
    fn plan_reads(&self, wanted: &[(usize, u64)]) -> Vec<ReadPlan> {
        // Group the wanted events by the index entry they start from.
        let mut groups: BTreeMap<(usize, u64), Vec<(usize, u64)>> = BTreeMap::new();
        for &(pos, seq) in wanted {
            let seq = &seq;
            let Some(i) = self.seg_of(*seq) else { continue };
            let Some(seg) = self.segs.get(i) else {
                continue;
            };
            let at = seg.index.partition_point(|(s, _)| *s <= *seq);
            let from = at
                .checked_sub(1)
                .and_then(|k| seg.index.get(k))
                .map_or(HEADER as u64, |(_, o)| *o);
            groups.entry((i, from)).or_default().push((pos, *seq));
        }
        groups
            .into_iter()
            .filter_map(|((i, from), want)| {
                let seg = self.segs.get(i)?;
                Some(ReadPlan {
                    file: seg.file.clone(),
                    no: seg.hdr.no,
                    salt: seg.hdr.salt,
                    from,
                    end: seg.len,
                    want,
                    holes: seg.holes.clone(),
                })
            })
            .collect()
    }
}

/// Reads planned under the log's lock ([`Log::plan_get`]).
pub struct Reads {
    plans: Vec<ReadPlan>,
    /// Events the tail held: `(position asked, event)`.
    cached: Vec<(usize, Cached)>,
    /// Retry states of the wanted events that have one.
    states: HashMap<u64, RetryState>,
    n: usize,
    frames: Arc<Mutex<FrameCache>>,
    /// Where a failing frame met is noted for the committer ([`Log::record_findings`]).
    found: super::scrub::Findings,
}

impl Reads {
    /// Read the events, in the order asked.
    ///
    /// # Errors
    /// Unreadable data; [`StoreError::Corrupt`] when a frame fails its check (noted for the
    /// committer's next round, which records the damage: read again after it).
    pub fn run(self) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        let mut out: Vec<Option<StoredEvent>> = vec![None; self.n];
        for (pos, c) in &self.cached {
            if let Some(slot) = out.get_mut(*pos) {
                *slot = Some(self.answer(c));
            }
        }
        for p in &self.plans {
            self.run_read(p, &mut out)?;
        }
        Ok(out)
    }

    fn run_read(&self, p: &ReadPlan, out: &mut [Option<StoredEvent>]) -> Result<(), StoreError> {
        let mut want: HashMap<u64, usize> = p.want.iter().map(|(pos, s)| (*s, *pos)).collect();
        let last = p.want.iter().map(|(_, s)| *s).max().unwrap_or(0);
        let mut offset = p.from;
        while !want.is_empty() {
            offset = super::segment::past_hole(&p.holes, offset);
            let Some(frame) = self.frame(p, offset, last)? else {
                break;
            };
            let mut past = false;
            for e in &frame.events {
                past |= e.seq > last;
                if let Some(slot) = want.remove(&e.seq).and_then(|pos| out.get_mut(pos)) {
                    *slot = Some(self.answer(e));
                }
            }
            if past {
                break;
            }
            offset = frame.next;
        }
        Ok(())
    }

    /// `c` as a read answers it: with its retry state, or a fresh one from its first enqueue.
    fn answer(&self, c: &Cached) -> StoredEvent {
        let state = self.states.get(&c.seq).copied().unwrap_or(RetryState {
            attempts: 0,
            first_enqueued_ms: c.first_ms,
            due_ms: 0,
        });
        StoredEvent {
            seq: c.seq,
            id: c.id.clone(),
            body: c.body.clone(),
            state,
            trace: c.trace.clone(),
        }
    }

    /// The frame at `offset` of `p`'s file, decoded: from the cache, or read, checked and kept
    /// there when it holds events after `last`. `None` past the valid frames.
    fn frame(
        &self,
        p: &ReadPlan,
        offset: u64,
        last: u64,
    ) -> Result<Option<Arc<Decoded>>, StoreError> {
        let key = (p.no, p.salt, offset);
        {
            let mut cache = crate::sync::lock(&self.frames);
            if let Some(f) = cache.get(key) {
                // A frame kept over the bound goes once a read reaches its last event: held
                // only while a reader is inside it, never while the log idles.
                if f.bytes > FRAME_CACHE_BYTES / 2 && f.events.last().is_none_or(|e| e.seq <= last)
                {
                    cache.remove(key);
                }
                return Ok(Some(f));
            }
        }
        let frame = read_frame(&*p.file, p.salt, offset, p.end)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let Some((payload, next)) = frame else {
            if offset >= p.end {
                return Ok(None);
            }
            // Below the segment's end a frame must check out: damage that the scrub has not
            // reached yet (or that came after it). The next round records it; the read fails
            // meanwhile, and read again steps over what was lost (`LogStore::get`).
            crate::sync::lock(&self.found).push(super::scrub::Finding {
                no: p.no,
                salt: p.salt,
                offset,
            });
            return Err(StoreError::Corrupt(format!(
                "damaged frame at offset {offset} of event log segment {}",
                p.no
            )));
        };
        let events: Vec<Cached> = format::decode_records(&payload)
            .ok_or_else(|| StoreError::Corrupt(format!("unreadable records at {offset}")))?
            .into_iter()
            .filter_map(|r| match r {
                Record::Event {
                    seq,
                    first_ms,
                    id,
                    body,
                    trace,
                    ..
                } => Some(Cached {
                    seq,
                    first_ms,
                    id,
                    body,
                    trace,
                }),
                _ => None,
            })
            .collect();
        let later = events.last().is_some_and(|e| e.seq > last);
        let bytes = payload.len()
            + events.capacity() * std::mem::size_of::<Cached>()
            + events
                .iter()
                .map(|e| e.id.capacity() + ID_OVERHEAD)
                .sum::<usize>();
        let frame = Arc::new(Decoded {
            bytes,
            events,
            next,
        });
        if later {
            crate::sync::lock(&self.frames).put((p.no, p.salt, offset), frame.clone());
        }
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(bytes: usize) -> Arc<Decoded> {
        Arc::new(Decoded {
            events: Vec::new(),
            next: 0,
            bytes,
        })
    }

    #[test]
    fn the_frame_cache_keeps_its_bound_oldest_out_first() {
        let mut c = FrameCache::default();
        c.put((1, 1, 100), frame(FRAME_CACHE_BYTES / 4));
        c.put((1, 1, 0), frame(3 * FRAME_CACHE_BYTES));
        assert_eq!(
            c.bytes(),
            3 * FRAME_CACHE_BYTES,
            "a frame over the bound is kept alone"
        );
        assert!(c.get((1, 1, 0)).is_some() && c.get((1, 1, 100)).is_none());
        c.put((3, 1, 1), frame(FRAME_CACHE_BYTES / 4));
        assert_eq!(c.bytes(), FRAME_CACHE_BYTES / 4, "until the next frame");
        for i in 0..10u64 {
            c.put((1, 1, i), frame(FRAME_CACHE_BYTES / 4));
            assert!(c.bytes() <= FRAME_CACHE_BYTES);
        }
        assert_eq!(c.bytes(), FRAME_CACHE_BYTES);
        assert!(c.get((1, 1, 5)).is_none() && c.get((1, 1, 6)).is_some());
        assert!(
            c.get((1, 2, 9)).is_none(),
            "another salt is another file (a compacted copy)"
        );
        assert!(
            c.get((2, 1, 9)).is_none(),
            "another number is another segment"
        );
        c.put((1, 1, 9), frame(1));
        assert_eq!(c.bytes(), FRAME_CACHE_BYTES, "kept once");
    }
}
