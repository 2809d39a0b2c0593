//! Dead letters to a subscription's dead-letter destination (a webhook or a blob container),
//! as Event Grid does it ("Event Grid message delivery and retry", dead-letter events): letters
//! are **batched** (held up to `broker__deadLetter__forwardBatchSeconds`, or until
//! `broker__deadLetter__forwardBatchBytes`) so one blob or one POST carries many, and a failing
//! destination is **retried with patience** (10 s, 30 s, 1 min, 5 min, then every 10 min, for
//! `broker__deadLetter__forwardPatienceMinutes`, default 4 hours as Event Grid) before the
//! batch is given up. The letters are in the local dead-letter store all along (kept before
//! they are forwarded), so giving up loses nothing locally.
//!
//! One task owns every pending batch: a bounded queue feeds it (`submit` never waits), and
//! letters waiting (batching or retrying) are bounded in bytes
//! (`broker__deadLetter__forwardMaxBytes`); past it, new letters are kept locally only and
//! counted as failed forwards. Sends run concurrently, so one slow destination does not hold
//! up another's letters.

use super::sink::{DeliveryRequest, Outcome, Sink};
use crate::model::topic::EventSchema;
use crate::policy::ForwardPolicy;
use crate::store::deadletter::DeadLetter;
use crate::telemetry::TraceContext;
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Dead letters on their way to a subscription's dead-letter destination.
pub struct Forward {
    /// The dead-letter sink.
    pub sink: Arc<dyn Sink>,
    /// Topic.
    pub topic: Arc<str>,
    /// Subscription.
    pub subscription: Arc<str>,
    /// The letters (already kept locally).
    pub letters: Vec<DeadLetter>,
    /// The trace context the first of their events travelled in (its ids go on log lines).
    pub trace: Option<TraceContext>,
}

/// Forwarding outcome counters.
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Letters forwarded.
    pub forwarded: crate::metrics::Counter,
    /// Letters whose forwarding was given up (they stay in the local store).
    pub failed: crate::metrics::Counter,
}

/// A bounded queue to one forwarding task (owned by the broker's engine, aborted on drop).
pub struct Forwarder {
    tx: mpsc::Sender<Forward>,
    /// Counters.
    pub stats: Arc<ForwardStats>,
    _task: crate::sync::AbortOnDrop,
}

impl Forwarder {
    /// Start the forwarding task with the default policy. Must run inside a tokio runtime.
    pub fn start() -> Self {
        Self::with_policy(ForwardPolicy::default())
    }

    /// Start the forwarding task under `policy`. Must run inside a tokio runtime.
    pub fn with_policy(policy: ForwardPolicy) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let stats = Arc::new(ForwardStats::default());
        let task = tokio::spawn(forward_loop(rx, stats.clone(), policy));
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
        if let Err(e) = self.tx.try_send(f) {
            let f = match e {
                mpsc::error::TrySendError::Full(f) | mpsc::error::TrySendError::Closed(f) => f,
            };
            self.stats.failed.add(n);
            let (trace_id, span_id) = TraceContext::log_ids(f.trace.as_ref());
            tracing::warn!(
                subscription = %f.subscription,
                letters = n,
                trace_id,
                span_id,
                "dead-letter forwarding queue full; kept locally only"
            );
        }
    }
}

/// Letters for one destination and subscription, gathering or waiting to be retried.
struct Batch {
    sink: Arc<dyn Sink>,
    topic: Arc<str>,
    subscription: Arc<str>,
    letters: Vec<Bytes>,
    bytes: usize,
    first_seq: u64,
    /// The trace context of its first letters' events (for log lines).
    trace: Option<TraceContext>,
    /// When it goes (out of the batching window, or to its next attempt).
    due: Instant,
    /// Attempts failed so far (0: still gathering).
    failures: u32,
    /// Given up after this (set at the first attempt).
    give_up: Option<Instant>,
}

impl Batch {
    fn same_destination(&self, f: &Forward) -> bool {
        self.failures == 0
            && Arc::ptr_eq(&self.sink, &f.sink)
            && self.topic == f.topic
            && self.subscription == f.subscription
    }

    fn request(&self, attempt: u32) -> DeliveryRequest {
        DeliveryRequest {
            topic: self.topic.clone(),
            subscription: self.subscription.clone(),
            schema: EventSchema::Custom,
            events: self.letters.clone(),
            attempt,
            attempts_each: Vec::new(),
            batch_id: self.first_seq,
            trace: Default::default(),
            time_left: Vec::new(),
        }
    }
}

async fn forward_loop(mut rx: mpsc::Receiver<Forward>, stats: Arc<ForwardStats>, p: ForwardPolicy) {
    let mut waiting: Vec<Batch> = Vec::new();
    let mut pending_bytes = 0usize;
    let mut sending: JoinSet<(Batch, bool)> = JoinSet::new();
    let mut open = true;
    loop {
        // Start every batch that is due.
        let now = Instant::now();
        let mut i = 0;
        while i < waiting.len() {
            if waiting[i].due <= now {
                let mut b = waiting.swap_remove(i);
                b.give_up.get_or_insert(now + p.patience);
                sending.spawn(async move {
                    let ok = b.sink.send(&b.request(b.failures + 1)).await == Outcome::Delivered;
                    (b, ok)
                });
            } else {
                i += 1;
            }
        }
        if !open && waiting.is_empty() && sending.is_empty() {
            return;
        }
        let next = waiting.iter().map(|b| b.due).min();
        tokio::select! {
            f = rx.recv(), if open => match f {
                Some(f) => accept(f, &mut waiting, &mut pending_bytes, &stats, &p),
                None => open = false,
            },
            Some(done) = sending.join_next(), if !sending.is_empty() => {
                let Ok((mut b, ok)) = done else { continue };
                let n = b.letters.len() as u64;
                if ok {
                    stats.forwarded.add(n);
                    pending_bytes = pending_bytes.saturating_sub(b.bytes);
                    continue;
                }
                b.failures += 1;
                let due = Instant::now() + ForwardPolicy::retry_delay(b.failures);
                if b.give_up.is_some_and(|g| due > g) {
                    stats.failed.add(n);
                    pending_bytes = pending_bytes.saturating_sub(b.bytes);
                    let (trace_id, span_id) = TraceContext::log_ids(b.trace.as_ref());
                    tracing::warn!(subscription = %b.subscription, letters = n, attempts = b.failures, trace_id, span_id, "dead-letter destination unreachable for the forwarding patience (broker__deadLetter__forwardPatienceMinutes); kept locally only");
                } else {
                    b.due = due;
                    waiting.push(b);
                }
            }
            _ = sleep_until(next) => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Add `f`'s letters to the gathering batch of its destination (or a new one), within the
/// memory bound; a batch that reaches the byte bound goes at once.
fn accept(
    f: Forward,
    waiting: &mut Vec<Batch>,
    pending_bytes: &mut usize,
    stats: &ForwardStats,
    p: &ForwardPolicy,
) {
    let letters: Vec<Bytes> = f
        .letters
        .iter()
        .map(|l| Bytes::from(l.to_json().to_string()))
        .collect();
    let bytes: usize = letters.iter().map(Bytes::len).sum();
    if *pending_bytes + bytes > p.max_pending_bytes {
        stats.failed.add(letters.len() as u64);
        let (trace_id, span_id) = TraceContext::log_ids(f.trace.as_ref());
        tracing::warn!(subscription = %f.subscription, letters = letters.len(), trace_id, span_id, "dead-letter forwarding is holding broker__deadLetter__forwardMaxBytes already; kept locally only");
        return;
    }
    *pending_bytes += bytes;
    let first_seq = f.letters.first().map_or(0, |l| l.seq);
    let b = match waiting.iter_mut().find(|b| b.same_destination(&f)) {
        Some(b) => b,
        None => {
            waiting.push(Batch {
                sink: f.sink,
                topic: f.topic,
                subscription: f.subscription,
                letters: Vec::new(),
                bytes: 0,
                first_seq,
                trace: f.trace,
                due: Instant::now() + p.batch_window,
                failures: 0,
                give_up: None,
            });
            let Some(b) = waiting.last_mut() else { return };
            b
        }
    };
    b.letters.extend(letters);
    b.bytes += bytes;
    if b.bytes >= p.batch_max_bytes {
        b.due = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::sink::FailureKind;
    use crate::model::reason::DropReason;
    use futures_util::future::BoxFuture;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A sink that fails its first `fail` requests, recording each request's letter count.
    struct Flaky {
        fail: Mutex<u32>,
        seen: Mutex<Vec<(Instant, usize)>>,
    }

    impl Sink for Flaky {
        fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
            Box::pin(async move {
                self.seen
                    .lock()
                    .unwrap()
                    .push((Instant::now(), req.events.len()));
                let mut f = self.fail.lock().unwrap();
                if *f > 0 {
                    *f -= 1;
                    return Outcome::failed(FailureKind::Connect);
                }
                Outcome::Delivered
            })
        }
    }

    fn letter(seq: u64) -> DeadLetter {
        DeadLetter {
            id: 0,
            seq,
            event_id: format!("e{seq}"),
            body: Bytes::from_static(b"{\"id\":\"x\"}"),
            reason: DropReason::MaxDeliveryAttemptsExceeded,
            last_status: Some(500),
            last_error: None,
            attempts: 1,
            first_enqueued_ms: 0,
            dead_lettered_ms: 0,
        }
    }

    fn forward(sink: &Arc<Flaky>, seq: u64) -> Forward {
        Forward {
            sink: sink.clone(),
            topic: "t".into(),
            subscription: "s".into(),
            letters: vec![letter(seq)],
            trace: None,
        }
    }

    async fn settle(f: &Forwarder, n: u64) {
        while f.stats.forwarded.get() + f.stats.failed.get() < n {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn letters_within_the_window_go_together() {
        let sink = Arc::new(Flaky {
            fail: Mutex::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let f = Forwarder::with_policy(ForwardPolicy {
            batch_window: Duration::from_secs(300),
            ..ForwardPolicy::default()
        });
        let start = Instant::now();
        for seq in 0..5 {
            f.submit(forward(&sink, seq));
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        settle(&f, 5).await;
        let seen = sink.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "one request: {seen:?}");
        assert_eq!(seen[0].1, 5);
        assert_eq!(
            seen[0].0 - start,
            Duration::from_secs(300),
            "after the window"
        );
        assert_eq!(f.stats.forwarded.get(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_the_memory_bound_holds() {
        let sink = Arc::new(Flaky {
            fail: Mutex::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let one = letter(0).to_json().to_string().len();
        let f = Forwarder::with_policy(ForwardPolicy {
            batch_window: Duration::from_secs(300),
            batch_max_bytes: 2 * one,
            max_pending_bytes: 3 * one,
            ..ForwardPolicy::default()
        });
        let start = Instant::now();
        for seq in 0..4 {
            f.submit(forward(&sink, seq));
        }
        settle(&f, 4).await;
        let seen = sink.seen.lock().unwrap().clone();
        assert_eq!(
            seen[0],
            (start, 2),
            "two letters fill a batch: sent at once"
        );
        assert_eq!(
            f.stats.failed.get(),
            1,
            "the fourth is past the memory bound"
        );
        assert_eq!(f.stats.forwarded.get(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_destination_is_retried_for_the_patience_then_given_up() {
        // Down for two hours: still delivered (the old forwarder gave up after ~70 s).
        let sink = Arc::new(Flaky {
            fail: Mutex::new(16),
            seen: Mutex::new(Vec::new()),
        });
        let f = Forwarder::with_policy(ForwardPolicy {
            batch_window: Duration::ZERO,
            ..ForwardPolicy::default()
        });
        let start = Instant::now();
        f.submit(forward(&sink, 1));
        settle(&f, 1).await;
        assert_eq!(f.stats.forwarded.get(), 1);
        let seen = sink.seen.lock().unwrap().clone();
        let gaps: Vec<u64> = seen
            .windows(2)
            .map(|w| (w[1].0 - w[0].0).as_secs())
            .collect();
        assert_eq!(&gaps[..5], &[10, 30, 60, 300, 600]);
        assert!(seen.last().unwrap().0 - start > Duration::from_secs(7200));
        // Down for good: given up after the patience (4 h), not before.
        let down = Arc::new(Flaky {
            fail: Mutex::new(u32::MAX),
            seen: Mutex::new(Vec::new()),
        });
        let start = Instant::now();
        f.submit(forward(&down, 2));
        settle(&f, 2).await;
        assert_eq!(f.stats.failed.get(), 1);
        let last = down.seen.lock().unwrap().last().unwrap().0;
        assert!(
            last - start <= Duration::from_secs(4 * 3600),
            "{:?}",
            last - start
        );
        assert!(last - start > Duration::from_secs(4 * 3600 - 600));
    }
}
