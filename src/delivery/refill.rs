//! Reading spilled events back: a persisted subscription keeps only a window of its backlog
//! (first attempts) and of its retries in memory ([`super::queue`]); when a window runs low or
//! spilled retries fall due, the dispatcher reads their bodies and retry states from the store,
//! on the blocking pool (every write submitted before is staged, and read as staged).

use super::apply::apply;
use super::context::DeliveryContext;
use super::payload::{EventData, Pending};
use super::retry::{self, DropReason};
use super::settle;
use super::state::SubscriptionState;
use crate::store::{QueueId, Store, StoreError, StoredEvent};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Events read per sled call batch while refilling a window.
const REFILL_CHUNK: usize = 64;

/// What a window refill read: events (in the order asked), how many were gone from the store,
/// and the sequence numbers left unread (over the byte budget).
type WindowRead = (Vec<StoredEvent>, usize, Vec<u64>);

/// Read spilled events' bodies from the store, stopping once `room` body bytes are read (at
/// least one event is always read). Chunks are sized from the events read so far, so large
/// events pass the room by one event at most, not by a chunk (issue 37: a 64-event chunk of
/// 1 MB events put 64 MB in a 1 MiB window). Runs on a blocking thread.
fn read_window(
    store: &dyn Store,
    queue: QueueId,
    seqs: &[u64],
    room: usize,
) -> Result<WindowRead, StoreError> {
    let mut out = Vec::with_capacity(seqs.len().min(REFILL_CHUNK));
    let mut missing = 0usize;
    let mut bytes = 0usize;
    let mut done = 0usize;
    while done < seqs.len() {
        if !out.is_empty() && bytes >= room {
            break;
        }
        let n = match bytes.checked_div(out.len()) {
            None => 1,
            Some(avg) => ((room - bytes) / avg.max(1)).clamp(1, REFILL_CHUNK),
        };
        let chunk = &seqs[done..(done + n).min(seqs.len())];
        for e in store.get(queue, chunk)? {
            match e {
                Some(e) => {
                    bytes += e.body.len();
                    out.push(e);
                }
                None => missing += 1,
            }
        }
        done += chunk.len();
    }
    Ok((out, missing, seqs.get(done..).unwrap_or_default().to_vec()))
}

/// Which in-memory window a refill is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// Events waiting for their first attempt.
    Ready,
    /// Retries that fell due.
    Retry,
}

/// Move spilled events into a window: read their bodies (and retry states) off the async
/// threads, drop the expired ones (TTL of a spilled event is checked here, when it enters the
/// window), queue the rest. A read failure puts them back and pauses refills for a second.
pub(super) async fn refill(
    shared: &Arc<SubscriptionState>,
    ctx: &Arc<DeliveryContext>,
    lane: Lane,
    seqs: Vec<u64>,
) {
    let room = match lane {
        Lane::Ready => shared.queue().window_room_bytes(),
        Lane::Retry => shared.queue().retry_room_bytes(),
    };
    let store = ctx.store.clone();
    let queue = shared.queue_id;
    let asked = seqs.clone();
    // A retry's state is read back with its body: the update that wrote it was staged when
    // the attempt settled, and the store answers what is staged.
    let read =
        tokio::task::spawn_blocking(move || read_window(store.as_ref(), queue, &seqs, room)).await;
    let (events, missing, unread) = match read {
        Ok(Ok(r)) => r,
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
                Ok(Ok(_)) => String::new(),
            };
            tracing::error!(subscription = %shared.name, error = %why, "could not read queued events from the store; retrying in 1 s");
            hand_back(shared, ctx, lane, Vec::new(), asked);
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
    };
    let cfg = shared.config();
    let now_ms = ctx.clock.now_ms();
    let now = Instant::now();
    let (expired, ready): (Vec<Pending>, Vec<Pending>) = events
        .into_iter()
        .map(|e| {
            let age = Duration::from_millis(now_ms.saturating_sub(e.state.first_enqueued_ms));
            Pending {
                seq: e.seq,
                event: Arc::new(EventData::new(
                    e.body,
                    e.id.into_boxed_str(),
                    e.trace,
                    Some(&ctx.pending_bytes),
                )),
                attempts: e.state.attempts,
                first_enqueued_ms: e.state.first_enqueued_ms,
                enqueued_at: now.checked_sub(age).unwrap_or(now),
            }
        })
        .partition(|p| retry::is_expired(&cfg.policy, p.first_enqueued_ms, now_ms));
    hand_back(shared, ctx, lane, ready, unread);
    // Not in the store: nothing of them is counted there (a windowed queue's bytes are).
    shared.queue().settle(missing, 0);
    if missing > 0 {
        tracing::warn!(subscription = %shared.name, events = missing, "queued events were no longer in the store; skipped");
    }
    if !expired.is_empty() {
        let reason = DropReason::TimeToLiveExceeded;
        apply(
            shared,
            ctx,
            settle::dead_letter(cfg.rules(), expired, reason, now_ms, true),
        );
        // An expired backlog is walked through window by window without waiting for a send.
        shared.notify.notify_one();
    }
}

/// Give a refill's result to its lane.
fn hand_back(
    shared: &SubscriptionState,
    ctx: &DeliveryContext,
    lane: Lane,
    loaded: Vec<Pending>,
    unread: Vec<u64>,
) {
    match lane {
        Lane::Ready => shared.queue().refilled(loaded, unread),
        Lane::Retry => {
            let lim = shared.config().limits(ctx.max_in_flight);
            shared
                .queue()
                .retries_loaded(loaded, unread, Instant::now(), &lim);
        }
    }
}
