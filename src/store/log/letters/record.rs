//! The dead-letter log's records. A frame (the event log's framing: `len | crc32(salt, len,
//! payload) | payload`) holds one or more of these; all integers little-endian.
//!
//! | kind | record | fields |
//! |---|---|---|
//! | 1 | [`LetterRecord::Letter`] | queue u32, id u64, seq u64, reason u8, status flag u8, status u16, attempts u32, first ms u64, dead ms u64, event id len u32, event id, error flag u8, error len u32, error, body len u32, body |
//! | 2 | [`LetterRecord::Gone`] | queue u32, count u32, ids u64… (taken or evicted) |
//! | 3 | [`LetterRecord::DropQueue`] | queue u32 (a deleted subscription's letters) |
//! | 4 | [`LetterRecord::Synced`] | upto u64 (the head was synced up to this offset before this frame was written) |

use crate::store::deadletter::{DeadLetter, DropReason};
use crate::store::log::format::Reader;
use crate::store::QueueId;
use bytes::Bytes;

/// One record of a dead-letter frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LetterRecord {
    /// A letter kept (or copied forward by compaction: the same id again).
    Letter {
        /// Its subscription's queue.
        queue: QueueId,
        /// The letter, `id` included.
        letter: DeadLetter,
    },
    /// Letters that left (taken by replay or purge, or evicted by a bound).
    Gone {
        /// Queue.
        queue: QueueId,
        /// Letter ids.
        ids: Vec<u64>,
    },
    /// Every letter of a deleted subscription.
    DropQueue {
        /// Queue.
        queue: QueueId,
    },
    /// The segment's frames up to `upto` were synced before this frame was written: a frame
    /// below it that fails its checksum is damage, never a write cut by a crash (see
    /// `letters/recover.rs`). The first record of the first frame after each sync.
    Synced {
        /// An offset in the same segment.
        upto: u64,
    },
}

fn reason_code(r: DropReason) -> u8 {
    match r {
        DropReason::MaxDeliveryAttemptsExceeded => 1,
        DropReason::TimeToLiveExceeded => 2,
        DropReason::DeliveryRefused => 3,
        DropReason::QueueFull => 4,
    }
}

fn reason_of(c: u8) -> Option<DropReason> {
    DropReason::ALL.into_iter().find(|r| reason_code(*r) == c)
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

impl LetterRecord {
    /// Append this record's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            LetterRecord::Letter { queue, letter: l } => {
                out.push(1);
                out.extend_from_slice(&queue.to_le_bytes());
                out.extend_from_slice(&l.id.to_le_bytes());
                out.extend_from_slice(&l.seq.to_le_bytes());
                out.push(reason_code(l.reason));
                out.push(u8::from(l.last_status.is_some()));
                out.extend_from_slice(&l.last_status.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&l.attempts.to_le_bytes());
                out.extend_from_slice(&l.first_enqueued_ms.to_le_bytes());
                out.extend_from_slice(&l.dead_lettered_ms.to_le_bytes());
                put_str(out, l.event_id.as_bytes());
                out.push(u8::from(l.last_error.is_some()));
                put_str(out, l.last_error.as_deref().unwrap_or("").as_bytes());
                put_str(out, &l.body);
            }
            LetterRecord::Gone { queue, ids } => {
                out.push(2);
                out.extend_from_slice(&queue.to_le_bytes());
                out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
                for id in ids {
                    out.extend_from_slice(&id.to_le_bytes());
                }
            }
            LetterRecord::DropQueue { queue } => {
                out.push(3);
                out.extend_from_slice(&queue.to_le_bytes());
            }
            LetterRecord::Synced { upto } => {
                out.push(4);
                out.extend_from_slice(&upto.to_le_bytes());
            }
        }
    }
}

fn string(r: &mut Reader<'_>) -> Option<String> {
    let n = r.u32()? as usize;
    String::from_utf8(r.take(n)?.to_vec()).ok()
}

/// Decode a frame's records; `None` when the payload is not a sequence of records (damage).
pub fn decode(payload: &Bytes) -> Option<Vec<LetterRecord>> {
    let mut r = Reader(payload);
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(match r.u8()? {
            1 => {
                let queue = r.u32()?;
                let id = r.u64()?;
                let seq = r.u64()?;
                let reason = reason_of(r.u8()?)?;
                let has_status = r.u8()? != 0;
                let status = r.u16()?;
                let attempts = r.u32()?;
                let first_enqueued_ms = r.u64()?;
                let dead_lettered_ms = r.u64()?;
                let event_id = string(&mut r)?;
                let has_error = r.u8()? != 0;
                let error = string(&mut r)?;
                let body_len = r.u32()? as usize;
                let start = payload.len() - r.0.len();
                r.take(body_len)?;
                LetterRecord::Letter {
                    queue,
                    letter: DeadLetter {
                        id,
                        seq,
                        event_id,
                        body: payload.slice(start..start + body_len),
                        reason,
                        last_status: has_status.then_some(status),
                        last_error: has_error.then_some(error),
                        attempts,
                        first_enqueued_ms,
                        dead_lettered_ms,
                    },
                }
            }
            2 => {
                let queue = r.u32()?;
                let n = r.u32()? as usize;
                if n > r.0.len() / 8 {
                    return None;
                }
                let ids = (0..n).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
                LetterRecord::Gone { queue, ids }
            }
            3 => LetterRecord::DropQueue { queue: r.u32()? },
            4 => LetterRecord::Synced { upto: r.u64()? },
            _ => return None,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let letter = DeadLetter {
            id: 7,
            seq: 42,
            event_id: "e-42".into(),
            body: Bytes::from_static(b"{\"a\":1}"),
            reason: DropReason::DeliveryRefused,
            last_status: Some(400),
            last_error: None,
            attempts: 3,
            first_enqueued_ms: 10,
            dead_lettered_ms: 20,
        };
        let recs = vec![
            LetterRecord::Gone {
                queue: 2,
                ids: vec![1, 5],
            },
            LetterRecord::Letter { queue: 2, letter },
            LetterRecord::DropQueue { queue: 9 },
            LetterRecord::Synced { upto: 4096 },
        ];
        let mut b = Vec::new();
        for r in &recs {
            r.encode(&mut b);
        }
        let b = Bytes::from(b);
        assert_eq!(decode(&b), Some(recs));
        assert_eq!(
            decode(&b.slice(..b.len() - 1)),
            None,
            "a cut record is damage"
        );
        assert_eq!(
            decode(&Bytes::from_static(&[9])),
            None,
            "an unknown kind is damage"
        );
    }
}
