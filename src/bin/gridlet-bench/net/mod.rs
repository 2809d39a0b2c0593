//! The bench's two network ends: a fast webhook receiver and a keep-alive publisher.
//!
//! Both are plain hyper HTTP/1.1 on loopback. The publisher stamps every event with its send
//! time (`"bts":<µs since the bench started>` inside `data`); the receiver finds the stamps in
//! whatever body arrives (gridlet's delivered array or the publisher's own body in the raw run)
//! and records publish→delivery latency per event. The same code serves the raw loopback run and
//! the broker runs, so their ratio compares like with like.

use std::time::{Duration, Instant};

mod publisher;
mod receiver;

pub use publisher::{events_body, publish, request, Conn, Load, Published};
pub use receiver::{Mode, Receiver, Syncer};

/// Size of one published event, as the issue specifies.
pub const EVENT_BYTES: usize = 256;
/// The marker preceding each event's send timestamp.
const STAMP: &[u8] = b"\"bts\":";
/// Most latency samples kept (memory of the bench process stays bounded).
const MAX_SAMPLES: usize = 4_000_000;
/// The longest a stalled request is held before it is answered 503 anyway.
const MAX_STALL: Duration = Duration::from_secs(900);

/// Microseconds since the bench started: the one clock publisher and receiver share.
pub fn now_us(base: Instant) -> u64 {
    base.elapsed().as_micros() as u64
}
