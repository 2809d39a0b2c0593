//! The event log's bytes: segment headers, frames and records.
//!
//! ```text
//! segment file  <16 hex digits>.seg
//!   header (48 B)  magic "GRDLOG02" | segment no u64 | salt u64 | base seq u64 | created ms u64
//!                  | reserved u32 | crc32 u32 (of the 44 bytes before it)
//!   frame*         len u32 | crc32 u32 (of salt ‖ len ‖ payload) | payload = record*
//! ```
//!
//! A frame is the unit of atomicity: one group commit writes one frame, and recovery keeps a
//! frame whole or not at all (its CRC covers every record in it, and the segment's random salt,
//! so bytes of another file or incarnation never pass). All integers are little-endian.
//!
//! Records (first byte = kind):
//!
//! | kind | record | fields |
//! |---|---|---|
//! | 1 | [`Record::Event`] | seq u64, first-enqueued ms u64, queue count u16, queues u32…, id len u16, id, body len u32, body |
//! | 6 | [`Record::Event`] with a trace context | the fields of kind 1, then trace id 16 B, span id u64, flags u8, tracestate len u16, tracestate |
//! | 2 | [`Record::Settle`] | queue u32, count u32, seqs u64… (delivered, dropped or dead-lettered) |
//! | 7 | [`Record::Settle`] with bytes | queue u32, bytes u64, count u32, seqs u64… (the seqs all in one segment; bytes: their bodies' total) |
//! | 3 | [`Record::Retry`] | queue u32, attempts u32, first ms u64, due ms u64, count u32, seqs u64… |
//! | 4 | [`Record::DropQueue`] | queue u32 (a deleted subscription) |
//! | 5 | [`Record::State`] | segment u64, first seq u64, queue count u32, then per queue: queue u32, word count u32, live bits u64…, retry count u32, (seq u64, attempts u32, first ms u64, due ms u64)… |
//!
//! Kind 7 replaces kind 2 for new settlements: recovery subtracts its bytes from what the
//! segment still owes the queue ([`crate::store::Store::pending_bytes`]) without reading the
//! settled events' bodies. A kind-2 record (written before bytes were counted) makes recovery
//! count its segment's pending bytes again by reading the segment.
//!
//! An event that travels in a W3C trace context (its `traceparent` / `tracestate`) is written as
//! kind 6, one without as kind 1: a log of kind-1 events reads as before, and the context costs
//! 27 bytes plus its `tracestate` per event that has one.
//!
//! A `State` record restates everything one older segment still owes, all queues (a queue not
//! listed is owed nothing there), so that later segments holding settle and retry records about it
//! can be deleted (see `engine.rs`).

use crate::store::{QueueId, RetryState};
use crate::telemetry::TraceContext;
use bytes::Bytes;
use std::sync::Arc;

/// Bytes of a segment header.
pub const HEADER: usize = 48;
/// Bytes before a frame's payload.
pub const FRAME_HEAD: usize = 8;
const MAGIC: &[u8; 8] = b"GRDLOG02";
/// Magic of a dead-letter segment (`letters.rs`): the same header, `base_seq` holding the next
/// letter id.
pub const LETTERS_MAGIC: &[u8; 8] = b"GRDDLQ01";
/// Largest frame accepted when reading (a length beyond it is damage, not a frame).
pub const MAX_FRAME: u32 = 256 << 20;

/// A segment's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Segment number (also in the file name).
    pub no: u64,
    /// Random per segment: part of every frame's CRC.
    pub salt: u64,
    /// Highest sequence number used before this segment was created.
    pub base_seq: u64,
    /// Wall ms at creation.
    pub created_ms: u64,
    /// The file was an earlier segment's ([`SPARE`]): what follows the last frame may be that
    /// segment's frames (another salt), not a torn write.
    pub recycled: bool,
}

/// Flag bit of [`Header::recycled`] in the header's flags word.
const RECYCLED: u32 = 1;

impl Header {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER] {
        self.encode_with(MAGIC)
    }

    /// The header's bytes, with another file kind's magic.
    pub fn encode_with(&self, magic: &[u8; 8]) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        let mut w = Vec::with_capacity(HEADER);
        w.extend_from_slice(magic);
        w.extend_from_slice(&self.no.to_le_bytes());
        w.extend_from_slice(&self.salt.to_le_bytes());
        w.extend_from_slice(&self.base_seq.to_le_bytes());
        w.extend_from_slice(&self.created_ms.to_le_bytes());
        let flags = if self.recycled { RECYCLED } else { 0 };
        w.extend_from_slice(&flags.to_le_bytes());
        let crc = crc32fast::hash(&w);
        w.extend_from_slice(&crc.to_le_bytes());
        b.copy_from_slice(&w);
        b
    }

    /// Read a header; `None` when the bytes are not one (wrong magic or CRC).
    pub fn decode(b: &[u8]) -> Option<Header> {
        Self::decode_with(b, MAGIC)
    }

    /// [`Header::decode`] of another file kind's magic.
    pub fn decode_with(b: &[u8], magic: &[u8; 8]) -> Option<Header> {
        let mut r = Reader(b.get(..HEADER)?);
        if r.take(8)? != magic {
            return None;
        }
        let (no, salt, base_seq, created_ms) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let flags = r.u32()?;
        let h = Header {
            no,
            salt,
            base_seq,
            created_ms,
            recycled: flags & RECYCLED != 0,
        };
        let crc = r.u32()?;
        (crc32fast::hash(b.get(..HEADER - 4)?) == crc).then_some(h)
    }
}

/// What a segment owes one queue (in a [`Record::State`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    /// Queue.
    pub queue: QueueId,
    /// Bit `i` set: event `first_seq + i` is pending.
    pub words: Vec<u64>,
    /// Retry states of its pending events that have any.
    pub retries: Vec<(u64, RetryState)>,
}

/// One record of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A published event, once, with every queue it is pending in.
    Event {
        /// Sequence number.
        seq: u64,
        /// When it was first enqueued (wall ms).
        first_ms: u64,
        /// Queues it is pending in.
        queues: Vec<QueueId>,
        /// Event id.
        id: String,
        /// The event as delivered.
        body: Bytes,
        /// The trace context it travels in (kind 6), so a redelivery after a restart stays in
        /// its publisher's trace.
        trace: Option<Arc<TraceContext>>,
    },
    /// Events settled in a queue (delivered, dropped or dead-lettered).
    Settle {
        /// Queue.
        queue: QueueId,
        /// Their sequence numbers.
        seqs: Vec<u64>,
        /// Their bodies' bytes together, all of them in one segment (kind 7); `None`: not
        /// known (kind 2, written before bytes were counted).
        bytes: Option<u64>,
    },
    /// A new retry state for events of a queue.
    Retry {
        /// Queue.
        queue: QueueId,
        /// The state.
        state: RetryState,
        /// Their sequence numbers.
        seqs: Vec<u64>,
    },
    /// A queue was deleted: nothing of it is pending any more.
    DropQueue {
        /// Queue.
        queue: QueueId,
    },
    /// What segment `segment` still owes, every queue, replacing everything said of it before.
    State {
        /// Segment number.
        segment: u64,
        /// Sequence number of bit 0.
        first_seq: u64,
        /// The queues owed anything there.
        queues: Vec<QueueState>,
    },
}

fn put_state(out: &mut Vec<u8>, s: &RetryState) {
    out.extend_from_slice(&s.attempts.to_le_bytes());
    out.extend_from_slice(&s.first_enqueued_ms.to_le_bytes());
    out.extend_from_slice(&s.due_ms.to_le_bytes());
}

fn put_seqs(out: &mut Vec<u8>, seqs: &[u64]) {
    out.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
    for s in seqs {
        out.extend_from_slice(&s.to_le_bytes());
    }
}

/// A context's `tracestate` as written (at most `u16::MAX` bytes; parsing keeps it to
/// `telemetry::context::MAX_TRACESTATE`).
fn state_of(t: &TraceContext) -> &[u8] {
    let s = t.state.as_deref().unwrap_or("").as_bytes();
    s.get(..usize::from(u16::MAX)).unwrap_or(s)
}

fn put_trace(out: &mut Vec<u8>, t: &TraceContext) {
    out.extend_from_slice(&t.trace_id.to_le_bytes());
    out.extend_from_slice(&t.span_id.to_le_bytes());
    out.push(t.flags);
    let state = state_of(t);
    out.extend_from_slice(&(state.len() as u16).to_le_bytes());
    out.extend_from_slice(state);
}

impl Record {
    /// Append this record's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Event {
                seq,
                first_ms,
                queues,
                id,
                body,
                trace,
            } => {
                out.push(if trace.is_some() { 6 } else { 1 });
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&first_ms.to_le_bytes());
                out.extend_from_slice(&(queues.len() as u16).to_le_bytes());
                for q in queues {
                    out.extend_from_slice(&q.to_le_bytes());
                }
                let id = id.as_bytes();
                let id = id.get(..usize::from(u16::MAX)).unwrap_or(id);
                out.extend_from_slice(&(id.len() as u16).to_le_bytes());
                out.extend_from_slice(id);
                out.extend_from_slice(&(body.len() as u32).to_le_bytes());
                out.extend_from_slice(body);
                if let Some(t) = trace {
                    put_trace(out, t);
                }
            }
            Record::Settle { queue, seqs, bytes } => {
                out.push(if bytes.is_some() { 7 } else { 2 });
                out.extend_from_slice(&queue.to_le_bytes());
                if let Some(b) = bytes {
                    out.extend_from_slice(&b.to_le_bytes());
                }
                put_seqs(out, seqs);
            }
            Record::Retry { queue, state, seqs } => {
                out.push(3);
                out.extend_from_slice(&queue.to_le_bytes());
                put_state(out, state);
                put_seqs(out, seqs);
            }
            Record::DropQueue { queue } => {
                out.push(4);
                out.extend_from_slice(&queue.to_le_bytes());
            }
            Record::State {
                segment,
                first_seq,
                queues,
            } => {
                out.push(5);
                out.extend_from_slice(&segment.to_le_bytes());
                out.extend_from_slice(&first_seq.to_le_bytes());
                out.extend_from_slice(&(queues.len() as u32).to_le_bytes());
                for q in queues {
                    out.extend_from_slice(&q.queue.to_le_bytes());
                    out.extend_from_slice(&(q.words.len() as u32).to_le_bytes());
                    for w in &q.words {
                        out.extend_from_slice(&w.to_le_bytes());
                    }
                    out.extend_from_slice(&(q.retries.len() as u32).to_le_bytes());
                    for (seq, s) in &q.retries {
                        out.extend_from_slice(&seq.to_le_bytes());
                        put_state(out, s);
                    }
                }
            }
        }
    }

    /// Bytes [`Record::encode`] writes for an event record (without its trace context: add
    /// [`Record::trace_len`]).
    pub fn event_len(queues: usize, id: usize, body: usize) -> usize {
        1 + 8 + 8 + 2 + 4 * queues + 2 + id.min(usize::from(u16::MAX)) + 4 + body
    }

    /// Bytes an event record's trace context adds.
    pub fn trace_len(trace: Option<&TraceContext>) -> usize {
        trace.map_or(0, |t| 16 + 8 + 1 + 2 + state_of(t).len())
    }
}

/// Reads little-endian fields from a byte slice; every read is bounds-checked.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn arr<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    /// A `u8`.
    pub fn u8(&mut self) -> Option<u8> {
        self.arr::<1>().map(|[b]| b)
    }
    /// A `u16`.
    pub fn u16(&mut self) -> Option<u16> {
        self.arr().map(u16::from_le_bytes)
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        self.arr().map(u32::from_le_bytes)
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Option<u64> {
        self.arr().map(u64::from_le_bytes)
    }
    fn state(&mut self) -> Option<RetryState> {
        Some(RetryState {
            attempts: self.u32()?,
            first_enqueued_ms: self.u64()?,
            due_ms: self.u64()?,
        })
    }
    fn seqs(&mut self) -> Option<Vec<u64>> {
        let n = self.u32()? as usize;
        if n > self.0.len() / 8 {
            return None;
        }
        (0..n).map(|_| self.u64()).collect()
    }
    fn queue_state(&mut self) -> Option<QueueState> {
        let queue = self.u32()?;
        let nw = self.u32()? as usize;
        if nw > self.0.len() / 8 {
            return None;
        }
        let words = (0..nw).map(|_| self.u64()).collect::<Option<Vec<_>>>()?;
        let nr = self.u32()? as usize;
        if nr > self.0.len() / 28 {
            return None;
        }
        let retries = (0..nr)
            .map(|_| Some((self.u64()?, self.state()?)))
            .collect::<Option<Vec<_>>>()?;
        Some(QueueState {
            queue,
            words,
            retries,
        })
    }
    /// A kind-6 event's trace context (`Some(None)`: ids of zero, kept as no context).
    fn trace(&mut self) -> Option<Option<Arc<TraceContext>>> {
        let trace_id = u128::from_le_bytes(self.arr()?);
        let span_id = self.u64()?;
        let flags = self.u8()?;
        let len = usize::from(self.u16()?);
        let state = std::str::from_utf8(self.take(len)?).ok()?;
        if trace_id == 0 || span_id == 0 {
            return Some(None);
        }
        Some(Some(Arc::new(TraceContext {
            trace_id,
            span_id,
            flags,
            state: (!state.is_empty()).then(|| Arc::from(state)),
        })))
    }
    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Decode the records of a frame's payload. `body_of` turns a body's byte range into `Bytes`
/// (a slice of the frame buffer: no copy). `None` when the payload is not a sequence of records
/// (a frame whose CRC passed but whose records do not parse is damage).
pub fn decode_records(payload: &Bytes) -> Option<Vec<Record>> {
    let mut r = Reader(payload);
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(decode_one(&mut r, payload)?);
    }
    Some(out)
}

/// Whether `kind` is a record's first byte (a frame's payload starts with one).
pub fn is_record_kind(kind: u8) -> bool {
    (1..=7).contains(&kind)
}

fn decode_one(r: &mut Reader<'_>, payload: &Bytes) -> Option<Record> {
    Some(match r.u8()? {
        kind @ (1 | 6) => {
            let seq = r.u64()?;
            let first_ms = r.u64()?;
            let nq = r.u16()? as usize;
            let queues = (0..nq).map(|_| r.u32()).collect::<Option<Vec<_>>>()?;
            let id_len = r.u16()? as usize;
            let id = String::from_utf8(r.take(id_len)?.to_vec()).ok()?;
            let body_len = r.u32()? as usize;
            let start = payload.len() - r.0.len();
            r.take(body_len)?;
            let trace = match kind {
                6 => r.trace()?,
                _ => None,
            };
            Record::Event {
                seq,
                first_ms,
                queues,
                id,
                body: payload.slice(start..start + body_len),
                trace,
            }
        }
        2 => Record::Settle {
            queue: r.u32()?,
            seqs: r.seqs()?,
            bytes: None,
        },
        7 => Record::Settle {
            queue: r.u32()?,
            bytes: Some(r.u64()?),
            seqs: r.seqs()?,
        },
        3 => Record::Retry {
            queue: r.u32()?,
            state: r.state()?,
            seqs: r.seqs()?,
        },
        4 => Record::DropQueue { queue: r.u32()? },
        5 => {
            let segment = r.u64()?;
            let first_seq = r.u64()?;
            let nq = r.u32()? as usize;
            if nq > r.0.len() / 12 {
                return None;
            }
            let queues = (0..nq)
                .map(|_| r.queue_state())
                .collect::<Option<Vec<_>>>()?;
            Record::State {
                segment,
                first_seq,
                queues,
            }
        }
        _ => return None,
    })
}

/// Frame CRC: salt, length and payload.
pub fn frame_crc(salt: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&salt.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Write a frame holding `payload` into `out` (header then payload).
pub fn frame(salt: u64, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&frame_crc(salt, payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// A segment file's name.
pub fn segment_name(no: u64) -> String {
    format!("{no:016x}.seg")
}

/// Name of the spare segment file: a segment given back, kept (its blocks written) to become
/// the next head, so that frames overwrite written blocks instead of converting reserved ones
/// (see `engine/collect.rs`). Not a segment's name: recovery never reads it as one.
pub const SPARE: &str = "spare.free";

/// The segment number in a file name, if it is a segment's.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".seg")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}
