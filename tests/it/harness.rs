//! The in-process harness: a [`Broker`] whose deliveries go to a channel instead of the network,
//! for tests on tokio's **paused clock** (`#[tokio::test(start_paused = true)]`). Paused time
//! auto-advances to the next timer whenever every task is idle, so an hour of retry schedule
//! takes no real time; nothing here sleeps or opens a socket.
//!
//! Every attempt reaches the test as an [`Attempt`] with its virtual time. A subscription with a
//! script ([`InProcess::script`]) is answered by it at once (the attempt carries the outcome);
//! any other attempt waits for the test to [`Attempt::answer`] it, and one dropped unanswered
//! hangs forever, like an endpoint that never replies.

#![allow(dead_code)]

use crate::util::eg_event;
use futures_util::future::BoxFuture;
use gridlet::broker::Broker;
use gridlet::clock::Clock;
use gridlet::delivery::sink::{DeliveryRequest, FailureKind, Outcome, Sink, SinkFactory};
use gridlet::model::event::{parse, PublishInput};
use gridlet::model::subscription::Subscription;
use gridlet::model::topic::{EventSchema, Topic};
use gridlet::store::memory::MemoryStore;
use gridlet::store::Store;
use gridlet::Config;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// The endpoint every in-process subscription names (never dialled: the channel sink replaces
/// the webhook). Endpoint health is kept per URL, so subscriptions sharing it share health.
pub const ENDPOINT: &str = "http://127.0.0.1:9/hook";

/// The longest a test waits for the next attempt, in virtual time.
const DAY: Duration = Duration::from_secs(24 * 3600);

type Script = Arc<dyn Fn(&DeliveryRequest) -> Outcome + Send + Sync>;

/// One delivery attempt the broker made.
#[derive(Debug)]
pub struct Attempt {
    pub sub: String,
    /// Virtual time since the harness opened.
    pub at: Duration,
    /// The `id` of each event in the batch.
    pub ids: Vec<String>,
    pub attempt: u32,
    /// The `traceparent` each event carries onward (`DeliveryRequest::trace`), in order.
    pub traceparents: Vec<Option<String>>,
    /// The outcome a script gave (`None`: the test answers).
    pub outcome: Option<Outcome>,
    reply: Option<oneshot::Sender<Outcome>>,
}

impl Attempt {
    /// Answer an attempt that waits for the test.
    pub fn answer(mut self, o: Outcome) {
        let reply = self.reply.take().expect("an unscripted attempt");
        let _ = reply.send(o);
    }

    pub fn events(&self) -> usize {
        self.ids.len()
    }

    pub fn delivered(&self) -> bool {
        self.outcome == Some(Outcome::Delivered)
    }
}

#[derive(Clone)]
struct Sinks {
    t0: Instant,
    scripts: Arc<Mutex<HashMap<String, Script>>>,
    tx: mpsc::UnboundedSender<Attempt>,
}

struct ChannelSink {
    sub: String,
    sinks: Sinks,
}

impl Sink for ChannelSink {
    fn send<'a>(&'a self, req: &'a DeliveryRequest) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let ids = req
                .events
                .iter()
                .map(|e| {
                    serde_json::from_slice::<Value>(e).unwrap()["id"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect();
            let script = self.sinks.scripts.lock().unwrap().get(&self.sub).cloned();
            let mut attempt = Attempt {
                sub: self.sub.clone(),
                at: self.sinks.t0.elapsed(),
                ids,
                attempt: req.attempt,
                traceparents: (0..req.events.len())
                    .map(|i| req.trace.of(i).map(|t| t.traceparent()))
                    .collect(),
                outcome: None,
                reply: None,
            };
            if let Some(script) = script {
                let o = script(req);
                attempt.outcome = Some(o.clone());
                let _ = self.sinks.tx.send(attempt);
                return o;
            }
            let (reply, rx) = oneshot::channel();
            attempt.reply = Some(reply);
            let _ = self.sinks.tx.send(attempt);
            match rx.await {
                Ok(o) => o,
                Err(_) => std::future::pending().await,
            }
        })
    }
}

impl SinkFactory for Sinks {
    fn create(&self, sub: &Subscription) -> Arc<dyn Sink> {
        Arc::new(ChannelSink {
            sub: sub.name.clone(),
            sinks: self.clone(),
        })
    }
}

/// A broker with an in-memory store, an anchored clock and the channel sink.
pub struct InProcess {
    pub broker: Broker,
    sinks: Sinks,
    rx: mpsc::UnboundedReceiver<Attempt>,
    cfg: Arc<Config>,
    store: Arc<dyn Store>,
    clock: Clock,
    /// The task running a log store's committer rounds on the paused clock
    /// ([`InProcess::open_on_log`]).
    driver: Option<tokio::task::JoinHandle<()>>,
}

impl InProcess {
    /// Open a broker with `extra` settings and one topic, `t`.
    pub fn open(extra: &[(&str, &str)]) -> Self {
        Self::open_on(Arc::new(MemoryStore::new()), extra)
    }

    /// [`InProcess::open`] on the event log store in `dir`, run without threads: its
    /// committer's rounds run in a task every 10 ms of the paused clock (a publish is
    /// acknowledged within 10 ms of virtual time), so nothing waits on real time.
    pub fn open_on_log(dir: &std::path::Path, extra: &[(&str, &str)]) -> Self {
        Self::open_on_log_within(dir, 1 << 30, extra)
    }

    /// [`InProcess::open_on_log`] with the store's disk bound at `max_disk_bytes`.
    pub fn open_on_log_within(
        dir: &std::path::Path,
        max_disk_bytes: u64,
        extra: &[(&str, &str)],
    ) -> Self {
        use gridlet::store::fs::{Fs, RealFs};
        use gridlet::store::log::engine::{self, LogOptions};
        use gridlet::store::log::{LogStore, LogStoreOptions};
        use std::sync::atomic::{AtomicU64, Ordering};
        let fs: Arc<dyn Fs> = Arc::new(RealFs);
        let meta = gridlet::store::meta::FsMeta::open(fs.clone(), dir.join("meta")).unwrap();
        let opts = LogStoreOptions {
            metadata_path: dir.join("meta"),
            events_path: dir.join("events"),
            max_disk_bytes,
            cache_bytes: 0,
            flush_every_ms: 0,
            segment_bytes: 64 << 10,
            compact_idle_ms: engine::COMPACT_IDLE_MS,
            refuse_damage: false,
        };
        let log = LogOptions {
            dir: dir.join("events").join("log"),
            segment_bytes: 64 << 10,
            max_disk_bytes,
            tail_bytes: engine::TAIL_BYTES,
            checkpoint_bytes: engine::CHECKPOINT_BYTES,
            align: 1,
            sector: 1,
            allocate_step: 64 << 10,
            compact_idle_ms: engine::COMPACT_IDLE_MS,
            refuse_damage: false,
        };
        let clock = Clock::anchored_at(1_700_000_000_000);
        let now = Arc::new(AtomicU64::new(clock.now_ms()));
        let (store, driver) =
            LogStore::simulated(fs, Box::new(meta), &opts, log, now.clone()).unwrap();
        let task = tokio::spawn(async move {
            loop {
                now.store(clock.now_ms(), Ordering::Relaxed);
                driver.round().unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let mut g = Self::open_on(Arc::new(store), extra);
        g.driver = Some(task);
        g
    }

    fn open_on(store: Arc<dyn Store>, extra: &[(&str, &str)]) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let sinks = Sinks {
            t0: Instant::now(),
            scripts: Default::default(),
            tx,
        };
        let vars = [("outbound__webhook__httpsOnly", "false")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()));
        let cfg = Arc::new(Config::from_vars(vars).unwrap());
        let clock = Clock::anchored_at(1_700_000_000_000);
        let broker =
            Broker::open(cfg.clone(), store.clone(), Arc::new(sinks.clone()), clock).unwrap();
        broker
            .put_topic(Topic::from_put("t", json!({})).unwrap())
            .unwrap();
        Self {
            broker,
            sinks,
            rx,
            cfg,
            store,
            clock,
            driver: None,
        }
    }

    /// A crash and a restart now: the broker and its tasks are dropped (attempts in flight are
    /// never settled; in-memory subscriptions lose their events) and a new one opens on the
    /// same store, its wall clock going on from the old one's. Scripts stay; attempts not yet
    /// taken are discarded.
    pub fn restart(&mut self) {
        self.clock = Clock::anchored_at(self.clock.now_ms());
        let broker = Broker::open(
            self.cfg.clone(),
            self.store.clone(),
            Arc::new(self.sinks.clone()),
            self.clock,
        )
        .unwrap();
        // Dropped after the new one opened: a store write the old one's writer still had
        // queued is done by then or lost, as in a crash.
        drop(std::mem::replace(&mut self.broker, broker));
        self.drain();
    }

    /// Subscribe `name` to topic `t`, webhook [`ENDPOINT`], with `props` merged into its properties.
    pub fn sub(&self, name: &str, props: Value) {
        let mut p = json!({"destination": {"endpointType": "WebHook",
            "properties": {"endpointUrl": ENDPOINT}}});
        for (k, v) in props.as_object().unwrap() {
            p[k] = v.clone();
        }
        self.broker
            .put_subscription("t", name, json!({ "properties": p }))
            .unwrap();
    }

    /// Subscribe each of `subs`, as [`InProcess::sub`].
    pub fn subs(&self, subs: &[(&str, Value)]) {
        for (name, props) in subs {
            self.sub(name, props.clone());
        }
    }

    /// From now on answer `sub`'s attempts with `f` (replacing an earlier script).
    pub fn script(
        &self,
        sub: &str,
        f: impl Fn(&DeliveryRequest) -> Outcome + Send + Sync + 'static,
    ) {
        self.sinks
            .scripts
            .lock()
            .unwrap()
            .insert(sub.to_string(), Arc::new(f));
    }

    /// From now on let the test answer `sub`'s attempts ([`Attempt::answer`]).
    pub fn unscript(&self, sub: &str) {
        self.sinks.scripts.lock().unwrap().remove(sub);
    }

    /// Publish `n` events with ids `e{first}`… and `subject` to topic `t`.
    pub async fn publish(&self, first: usize, n: usize, subject: &str) {
        let events: Vec<Value> = (first..first + n)
            .map(|i| eg_event(&format!("e{i}"), subject, "t", json!({"i": i})))
            .collect();
        let body = bytes::Bytes::from(serde_json::to_vec(&events).unwrap());
        let headers = Default::default();
        let parsed = parse(&PublishInput {
            schema: EventSchema::EventGrid,
            topic: "t",
            headers: &headers,
            body: &body,
            single_id: None,
            max_events: 100_000,
        })
        .unwrap();
        let entry = self.broker.topic("t").unwrap();
        self.broker.publish(&entry, parsed, None).await.unwrap();
    }

    /// The next attempt (panics if none comes within a day of virtual time).
    pub async fn next(&mut self) -> Attempt {
        tokio::time::timeout(DAY, self.rx.recv())
            .await
            .expect("an attempt")
            .expect("open")
    }

    /// The next attempt if one comes within `d`.
    pub async fn next_within(&mut self, d: Duration) -> Option<Attempt> {
        tokio::time::timeout(d, self.rx.recv()).await.ok().flatten()
    }

    /// Assert no attempt comes within `d` of virtual time.
    pub async fn none_within(&mut self, d: Duration) {
        if let Some(a) = self.next_within(d).await {
            panic!(
                "unexpected attempt {} of {:?} at {:?}",
                a.attempt, a.ids, a.at
            );
        }
    }

    /// The attempts until none has come for `quiet`.
    pub async fn until_quiet(&mut self, quiet: Duration) -> Vec<Attempt> {
        let mut v = Vec::new();
        while let Some(a) = self.next_within(quiet).await {
            v.push(a);
        }
        v
    }

    /// The attempts during the next `d`.
    pub async fn within(&mut self, d: Duration) -> Vec<Attempt> {
        let deadline = Instant::now() + d;
        let mut v = Vec::new();
        while let Ok(Some(a)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            v.push(a);
        }
        v
    }

    /// The attempts made so far and not yet taken.
    pub fn drain(&mut self) -> Vec<Attempt> {
        std::iter::from_fn(|| self.rx.try_recv().ok()).collect()
    }

    /// Subscription `sub`'s value of metric `name` (topic `t`).
    pub fn metric(&self, name: &str, sub: &str) -> Option<u64> {
        let labels = format!("topic=\"t\",subscription=\"{sub}\"");
        crate::util::metric(&self.broker.render_metrics(), name, &labels)
    }
}

/// A failure with HTTP status `code`.
pub fn fail(code: u16) -> Outcome {
    Outcome::failed(FailureKind::Status(code))
}

/// Seconds from the first attempt to each.
pub fn offsets<'a>(v: impl IntoIterator<Item = &'a Attempt>) -> Vec<u64> {
    let at: Vec<Duration> = v.into_iter().map(|a| a.at).collect();
    at.iter().map(|t| (*t - at[0]).as_secs()).collect()
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(t) = self.driver.take() {
            t.abort();
        }
    }
}
