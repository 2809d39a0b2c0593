//! Delivery: from a subscription's queue to its destination and back.
//!
//! ```text
//! broker::publish ─► SubQueue.ready ─► dispatcher (one task per subscription)
//!                                        │ pick batch (caps, in-flight budget, retry budget)
//!                                        ▼
//!                                   Sink::send ─► crate::outbound (WebHook, EventGrid, EdgeHub, Azure)
//!                                        │
//!                                        ▼
//!             settle::settle(rules, batch, outcome, now) ─► Effects (pure, per event:
//!                                        │                 retry::next_step)
//!                                        ▼
//!   apply: delivered ─► Write::Remove          retried ─► Write::RetryState, then SubQueue.retry
//!          dead-lettered ─► Write::KeepLetters (kept, then removed), forwarded; metrics, logs
//!          (writes: staged by the store writer, in order, when apply hands them over)
//! ```
//!
//! * [`sink`]: the `Sink` trait and outcome types (the test seam).
//! * [`retry`]: the pure schedule/limit decision.
//! * `settle`: what an outcome (or an expiry) does, as typed effects; `apply` does them.
//! * [`queue`]: ready lane and retry timer map.
//! * [`dispatcher`]: the per-subscription task.
//! * The destinations themselves (HTTP, Azure, edgeHub) live in `crate::outbound`, which the
//!   engine reaches only through the [`sink::Sink`] seam.
//! * [`forward`]: dead letters to a dead-letter destination (batched, retried with patience).

mod apply;
pub mod classify;
pub(crate) mod context;
pub(crate) mod deadletter;
pub(crate) mod dispatcher;
pub(crate) mod forward;
pub(crate) mod health;
pub(crate) mod lock_token;
pub(crate) mod payload;
pub(crate) mod pull;
pub(crate) mod queue;
mod refill;
pub(crate) mod retry;
mod settle;
pub mod sink;
mod state;
pub(crate) mod subscription;
mod trace;
pub(crate) mod writer;
