//! Reads: events by sequence number, from the in-memory tail of recent bodies or from their
//! segment's frames (a sparse index finds the frame to start from). Planned under the log's
//! lock ([`Log::plan_get`]), run outside it ([`Reads::run`]).

use super::format::{self, Record, FRAME_HEAD, HEADER};
use super::{Cached, Log};
use crate::store::fs::FsFile;
use crate::store::{QueueId, RetryState, StoreError, StoredEvent};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A point read prepared under the lock: frames of one file from an offset.
struct ReadPlan {
    file: Arc<dyn FsFile>,
    salt: u64,
    from: u64,
    end: u64,
    want: Vec<(usize, u64)>,
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
        }
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
                    salt: seg.hdr.salt,
                    from,
                    end: seg.len,
                    want,
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
}

impl Reads {
    /// Read the events, in the order asked.
    ///
    /// # Errors
    /// Unreadable data.
    pub fn run(self) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        let mut out: Vec<Option<StoredEvent>> = vec![None; self.n];
        for (pos, c) in &self.cached {
            let state = self.states.get(&c.seq).copied().unwrap_or(RetryState {
                attempts: 0,
                first_enqueued_ms: c.first_ms,
                due_ms: 0,
            });
            if let Some(slot) = out.get_mut(*pos) {
                *slot = Some(StoredEvent {
                    seq: c.seq,
                    id: c.id.clone(),
                    body: c.body.clone(),
                    state,
                    trace: c.trace.clone(),
                });
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
            let frame = read_frame(&*p.file, p.salt, offset, p.end)
                .map_err(|e| StoreError::Io(e.to_string()))?;
            let Some((payload, next)) = frame else { break };
            let records = format::decode_records(&payload)
                .ok_or_else(|| StoreError::Corrupt(format!("unreadable records at {offset}")))?;
            let mut past = false;
            for r in records {
                if let Record::Event {
                    seq,
                    first_ms,
                    id,
                    body,
                    trace,
                    ..
                } = r
                {
                    past |= seq > last;
                    if let Some(pos) = want.remove(&seq) {
                        let state = self.states.get(&seq).copied().unwrap_or(RetryState {
                            attempts: 0,
                            first_enqueued_ms: first_ms,
                            due_ms: 0,
                        });
                        if let Some(slot) = out.get_mut(pos) {
                            *slot = Some(StoredEvent {
                                seq,
                                id,
                                body,
                                state,
                                trace,
                            });
                        }
                    }
                }
            }
            if past {
                break;
            }
            offset = next;
        }
        Ok(())
    }
}
