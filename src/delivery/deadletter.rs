//! Dead letters, delivery's side: events that exhausted their attempts, expired, or were refused
//! are kept (bounded per subscription, oldest evicted first) instead of vanishing; the API lists
//! and replays them, and a subscription may also forward them to a dead-letter webhook
//! ([`Forwarder`]). What a letter is and where it is kept is the store's
//! (`crate::store::deadletter`, re-exported here).

use super::sink::{DeliveryRequest, FailureKind, Outcome, Sink};
use crate::model::topic::EventSchema;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

pub use crate::store::deadletter::{
    rfc3339, DeadLetter, DeadLetterBound, DeadLetterStore, MemoryDeadLetters,
};

/// The last failure of an outcome, as `(status, description)`, for a [`DeadLetter`].
pub fn describe(outcome: Option<&Outcome>) -> (Option<u16>, Option<String>) {
    match outcome {
        Some(Outcome::Failed { kind, .. }) => (
            match kind {
                FailureKind::Status(s) | FailureKind::Service { status: s, .. } => Some(*s),
                _ => None,
            },
            Some(kind.to_string()),
        ),
        _ => (None, None),
    }
}

/// Dead letters on their way to a subscription's dead-letter webhook.
pub struct Forward {
    /// The dead-letter sink.
    pub sink: Arc<dyn Sink>,
    /// Topic.
    pub topic: Arc<str>,
    /// Subscription.
    pub subscription: Arc<str>,
    /// The letters (already kept locally).
    pub letters: Vec<DeadLetter>,
}

/// Forwarding outcome counters.
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Letters forwarded.
    pub forwarded: crate::metrics::Counter,
    /// Letters whose forwarding failed after every attempt (they stay in the local store).
    pub failed: crate::metrics::Counter,
}

/// Attempts of one forward, with the delay before each retry.
const FORWARD_RETRIES: [Duration; 2] = [Duration::from_secs(10), Duration::from_secs(60)];

/// Letters waiting for one subscription's forwarding lane; more are counted as failed.
const LANE_QUEUE: usize = 64;
/// A lane with nothing to forward for this long ends (a new one starts with the next letter).
const LANE_IDLE: Duration = Duration::from_secs(60);

/// A bounded queue to the forwarding task (owned by the broker's engine, aborted on drop). It
/// hands each subscription's letters to a lane of their own (a task, in order), so a dead-letter
/// destination that hangs holds up only its own subscription's letters, as deliveries are
/// isolated per subscription.
pub struct Forwarder {
    tx: mpsc::Sender<Forward>,
    /// Counters.
    pub stats: Arc<ForwardStats>,
    _task: crate::sync::AbortOnDrop,
}

impl Forwarder {
    /// Start the forwarding task. Must run inside a tokio runtime.
    pub fn start() -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let stats = Arc::new(ForwardStats::default());
        let task = tokio::spawn(forward_loop(rx, stats.clone()));
        Self {
            tx,
            stats,
            _task: crate::sync::AbortOnDrop(task),
        }
    }

    /// Queue letters for forwarding; when the queue is full they are counted as failed (they
    /// remain in the local store).
    pub fn submit(&self, f: Forward) {
        let n = f.letters.len() as u64;
        if self.tx.try_send(f).is_err() {
            self.stats.failed.add(n);
            tracing::warn!(
                letters = n,
                "dead-letter forwarding queue full; kept locally only"
            );
        }
    }
}

async fn forward_loop(mut rx: mpsc::Receiver<Forward>, stats: Arc<ForwardStats>) {
    // The lanes end with this task: aborting it drops the set, which aborts them.
    let mut lanes_tasks = tokio::task::JoinSet::new();
    let mut lanes: std::collections::HashMap<(Arc<str>, Arc<str>), mpsc::Sender<Forward>> =
        std::collections::HashMap::new();
    while let Some(f) = rx.recv().await {
        while lanes_tasks.try_join_next().is_some() {}
        let key = (f.topic.clone(), f.subscription.clone());
        if lanes.get(&key).is_some_and(mpsc::Sender::is_closed) {
            lanes.remove(&key);
        }
        let lane = lanes.entry(key).or_insert_with(|| {
            let (tx, mut lane_rx) = mpsc::channel::<Forward>(LANE_QUEUE);
            let stats = stats.clone();
            lanes_tasks.spawn(async move {
                while let Ok(Some(f)) = tokio::time::timeout(LANE_IDLE, lane_rx.recv()).await {
                    forward_one(f, &stats).await;
                }
                // Idle: no more letters are taken; forward any that raced in, then end.
                lane_rx.close();
                while let Ok(f) = lane_rx.try_recv() {
                    forward_one(f, &stats).await;
                }
            });
            tx
        });
        let n = f.letters.len() as u64;
        if lane.try_send(f).is_err() {
            stats.failed.add(n);
            tracing::warn!(
                letters = n,
                "dead-letter forwarding queue of the subscription full; kept locally only"
            );
        }
    }
}

/// Forward one batch of letters, with [`FORWARD_RETRIES`].
async fn forward_one(f: Forward, stats: &ForwardStats) {
    let req = DeliveryRequest {
        topic: f.topic.clone(),
        subscription: f.subscription.clone(),
        schema: EventSchema::Custom,
        events: f
            .letters
            .iter()
            .map(|l| Bytes::from(l.to_json().to_string()))
            .collect(),
        attempt: 1,
        batch_id: f.letters.first().map_or(0, |l| l.seq),
    };
    let n = f.letters.len() as u64;
    let mut ok = false;
    for (i, wait) in std::iter::once(Duration::ZERO)
        .chain(FORWARD_RETRIES)
        .enumerate()
    {
        tokio::time::sleep(wait).await;
        let mut r = req.clone();
        r.attempt = i as u32 + 1;
        if f.sink.send(&r).await == Outcome::Delivered {
            ok = true;
            break;
        }
    }
    if ok {
        stats.forwarded.add(n);
    } else {
        stats.failed.add(n);
        tracing::warn!(subscription = %f.subscription, letters = n, "dead-letter webhook unreachable; kept locally only");
    }
}
