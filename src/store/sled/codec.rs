//! Byte layouts of the events database: keys (`queue_id u32 BE ‖ seq u64 BE`, so a queue is one
//! contiguous, sequence-ordered range) and event values (a versioned retry-state header, the
//! event id, then the body). Pure functions, no I/O except [`read_u64`]'s point read.
//!
//! Invariant: [`patch_state`] rewrites the header in place and keeps the value's length, so a
//! retry-state update never changes an event's counted live bytes.

use super::io;
use crate::store::{QueueId, RetryState, StoreError, StoredEvent};
use bytes::Bytes;

pub(super) const VALUE_VERSION: u8 = 1;
pub(super) const HEADER_LEN: usize = 1 + 4 + 8 + 8 + 4;

pub(super) fn event_key(queue: QueueId, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    let (q, s) = k.split_at_mut(4);
    q.copy_from_slice(&queue.to_be_bytes());
    s.copy_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn parse_key(k: &[u8]) -> Option<(QueueId, u64)> {
    let q: [u8; 4] = k.get(..4)?.try_into().ok()?;
    let s: [u8; 8] = k.get(4..12)?.try_into().ok()?;
    (k.len() == 12).then(|| (u32::from_be_bytes(q), u64::from_be_bytes(s)))
}

/// Encode a stored event's value: `version u8 ‖ attempts u32 ‖ first_enqueued_ms u64 ‖ due_ms
/// u64 ‖ id_len u32 ‖ id ‖ body` (all big-endian).
pub fn encode_value(e: &StoredEvent) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + e.id.len() + e.body.len());
    v.push(VALUE_VERSION);
    v.extend_from_slice(&e.state.attempts.to_be_bytes());
    v.extend_from_slice(&e.state.first_enqueued_ms.to_be_bytes());
    v.extend_from_slice(&e.state.due_ms.to_be_bytes());
    v.extend_from_slice(&(e.id.len() as u32).to_be_bytes());
    v.extend_from_slice(e.id.as_bytes());
    v.extend_from_slice(&e.body);
    v
}

pub(super) fn be<const N: usize>(v: &[u8], at: usize) -> Option<[u8; N]> {
    v.get(at..at + N)?.try_into().ok()
}

/// A big-endian `u64` stored under `key` (the high-water mark, the journal sequence number);
/// 0 when absent.
pub(super) fn read_u64(tree: &sled::Tree, key: &[u8]) -> Result<u64, StoreError> {
    Ok(tree
        .get(key)
        .map_err(io)?
        .and_then(|v| be::<8>(&v, 0))
        .map_or(0, u64::from_be_bytes))
}

pub(super) fn decode_state(v: &[u8]) -> Option<RetryState> {
    if v.first() != Some(&VALUE_VERSION) {
        return None;
    }
    Some(RetryState {
        attempts: u32::from_be_bytes(be(v, 1)?),
        first_enqueued_ms: u64::from_be_bytes(be(v, 5)?),
        due_ms: u64::from_be_bytes(be(v, 13)?),
    })
}

/// Decode a value written by [`encode_value`]; `None` when it is not one.
pub fn decode_value(seq: u64, v: &[u8]) -> Option<StoredEvent> {
    let state = decode_state(v)?;
    let id_len = u32::from_be_bytes(be(v, 21)?) as usize;
    let id = std::str::from_utf8(v.get(HEADER_LEN..HEADER_LEN + id_len)?).ok()?;
    let body = v.get(HEADER_LEN + id_len..)?;
    Some(StoredEvent {
        seq,
        id: id.to_string(),
        body: Bytes::copy_from_slice(body),
        state,
    })
}

pub(super) fn patch_state(v: &[u8], s: RetryState) -> Vec<u8> {
    let mut out = v.to_vec();
    if let Some(h) = out.get_mut(1..21) {
        let (attempts, rest) = h.split_at_mut(4);
        let (first, due) = rest.split_at_mut(8);
        attempts.copy_from_slice(&s.attempts.to_be_bytes());
        first.copy_from_slice(&s.first_enqueued_ms.to_be_bytes());
        due.copy_from_slice(&s.due_ms.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::ev;
    use super::*;

    #[test]
    fn values_round_trip() {
        let mut e = ev(7, 10);
        e.state = RetryState {
            attempts: 3,
            first_enqueued_ms: 11,
            due_ms: 99,
        };
        let v = encode_value(&e);
        assert_eq!(decode_value(7, &v), Some(e.clone()));
        let s = RetryState {
            attempts: 4,
            first_enqueued_ms: 11,
            due_ms: 1234,
        };
        assert_eq!(decode_value(7, &patch_state(&v, s)).unwrap().state, s);
        assert_eq!(decode_value(7, b"\x02garbage"), None);
    }
}
