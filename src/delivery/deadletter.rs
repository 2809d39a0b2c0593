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

/// A bounded queue to one forwarding task (owned by the broker's engine, aborted on drop).
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
    while let Some(f) = rx.recv().await {
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
            trace: None,
            event_traces: Vec::new(),
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
}
