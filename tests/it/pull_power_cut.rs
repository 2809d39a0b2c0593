//! What a power cut does to pull delivery, on tokio's paused clock: a receive is staged, not
//! waited for; an acknowledgement and a reject wait for the frame that holds them. The store
//! here is the event log's contract made explicit ([`PowerCut`]): settlements and retry states
//! are staged until a commit (a frame) takes them, and a cut loses what is staged. That the
//! event log keeps this contract is the power-cut simulation's job (`store/log/sim.rs`); the
//! real binary under SIGKILL is `pull_process.rs`.
//!
//! What `deliveryCount` means after a crash: the receives that reached the disk, plus one. A
//! receive answered after the last frame and before the crash is not counted, and its event is
//! available again at once instead of when its lock would have expired.

use crate::pull_clock::{create, publish, receive, NoSinks, T0};
use gridlet::broker::Broker;
use gridlet::clock::Clock;
use gridlet::model::record::{SubscriptionRecord, TopicRecord};
use gridlet::store::deadletter::DeadLetterStore;
use gridlet::store::memory::MemoryStore;
use gridlet::store::{
    Answer, Commit, Letters, PendingRuns, QueueId, RetryState, Settled, Settlement, Snapshot,
    Store, StoreError, StoredEvent, Writes,
};
use gridlet::Config;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A settlement staged and not yet in a frame.
enum Staged {
    Retry(QueueId, Vec<u64>, RetryState),
    Remove(QueueId, Vec<Settled>),
    /// Dead letters, kept (then their events removed) by the frame.
    Letters(QueueId, Letters),
}

/// The memory store as the disk, behind the log store's staging: retry states and removals
/// wait in memory until a commit, a frame's sync or a publish (frames take everything staged,
/// in order) writes them to the disk; [`PowerCut::cut`] loses them and refuses every later
/// write. Metadata and publishes are durable when they return, as with the log store.
struct PowerCut {
    disk: Arc<MemoryStore>,
    staged: Mutex<Vec<Staged>>,
    off: AtomicBool,
}

impl PowerCut {
    fn new(disk: Arc<MemoryStore>) -> Self {
        Self {
            disk,
            staged: Mutex::new(Vec::new()),
            off: AtomicBool::new(false),
        }
    }

    fn on(&self) -> Result<(), StoreError> {
        match self.off.load(Ordering::SeqCst) {
            false => Ok(()),
            true => Err(StoreError::Io("the power is off".into())),
        }
    }

    fn keep(&self, s: Staged) -> Result<(), StoreError> {
        self.on()?;
        self.staged.lock().unwrap().push(s);
        Ok(())
    }

    /// A frame: everything staged reaches the disk, in order.
    fn frame(&self) -> Result<(), StoreError> {
        self.on()?;
        for s in std::mem::take(&mut *self.staged.lock().unwrap()) {
            match s {
                Staged::Retry(q, seqs, state) => self.disk.update(q, &seqs, state)?,
                Staged::Remove(q, seqs) => self.disk.remove(q, &seqs)?,
                Staged::Letters(q, job) => {
                    drop(self.disk.stage(Writes::Letters(q, job), Answer::Nobody)?);
                }
            }
        }
        Ok(())
    }

    /// The power goes: what is staged is lost, nothing is written any more.
    fn cut(&self) {
        self.off.store(true, Ordering::SeqCst);
        self.staged.lock().unwrap().clear();
    }
}

impl Store for PowerCut {
    fn load(&self) -> Result<Snapshot, StoreError> {
        self.disk.load()
    }
    fn pending_runs(&self, queue: QueueId) -> Result<PendingRuns, StoreError> {
        self.disk.pending_runs(queue)
    }
    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        self.disk.get(queue, seqs)
    }
    fn put_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError> {
        self.on()?;
        self.disk.put_topic(key, record)
    }
    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.on()?;
        self.disk.delete_topic(key)
    }
    fn put_subscription(
        &self,
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError> {
        self.on()?;
        self.disk.put_subscription(queue, record)
    }
    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.on()?;
        self.disk.delete_subscription(queue)
    }
    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        self.on()?;
        self.disk.next_queue_id()
    }
    fn stage(&self, writes: Writes<'_>, answer: Answer) -> Result<Commit, StoreError> {
        match writes {
            // A publish is a frame: it carries everything staged before it.
            Writes::Events(items) => {
                self.frame()?;
                return self.disk.stage(Writes::Events(items), answer);
            }
            Writes::Settle(q, settlements) => {
                for s in settlements {
                    self.keep(match *s {
                        Settlement::Retry(seqs, state) => Staged::Retry(q, seqs.to_vec(), state),
                        Settlement::Remove(seqs) => Staged::Remove(q, seqs.to_vec()),
                    })?;
                }
            }
            Writes::Letters(q, job) => self.keep(Staged::Letters(q, job))?,
            Writes::Staged => {}
        }
        // A commit somebody waits for is a frame.
        if answer != Answer::Nobody {
            self.frame()?;
        }
        Ok(Commit::done())
    }
    fn stages_in_memory(&self) -> bool {
        true
    }
    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        self.disk.dead_letters()
    }
}

fn open(store: Arc<dyn Store>, wall_ms: u64) -> Broker {
    Broker::open(
        Arc::new(Config::from_vars(std::iter::empty()).unwrap()),
        store,
        Arc::new(NoSinks),
        Clock::anchored_at(wall_ms),
    )
    .unwrap()
}

/// Receive up to 10, waiting up to `wait` (a restarted subscription reads its window back from
/// the store first): `(id, deliveryCount, token)`.
async fn receive_within(b: &Broker, wait: Duration) -> Vec<(String, u32, String)> {
    let h = b.find_subscription("q", "s").unwrap();
    let got = h.pull().unwrap().receive(10, wait).await.unwrap();
    got.into_iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            (
                v["id"].as_str().unwrap().into(),
                r.delivery_count,
                r.lock_token,
            )
        })
        .collect()
}

async fn settle(b: &Broker, op: &str, token: &str) -> usize {
    let h = b.find_subscription("q", "s").unwrap();
    let p = h.pull().unwrap();
    let tokens = [token.to_string()];
    let r = match op {
        "acknowledge" => p.acknowledge(&tokens).await.unwrap(),
        "reject" => p.reject(&tokens).await.unwrap(),
        _ => unreachable!("{op}"),
    };
    r.succeeded.len()
}

#[tokio::test(start_paused = true)]
async fn after_a_power_cut_delivery_count_counts_the_receives_that_reached_the_disk() {
    let start = tokio::time::Instant::now();
    let disk = Arc::new(MemoryStore::new());
    let power = Arc::new(PowerCut::new(disk.clone()));
    let b = open(power.clone(), T0);
    create(&b, json!({})); // locks of 60 s
    publish(&b, &["a", "b", "c", "d"]).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(receive(&b, 1).await);
    }
    assert_eq!(
        got.iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(),
        [("a", 1), ("b", 1), ("c", 1)]
    );
    // The acknowledgement's frame holds every receive staged before it (b's and c's too).
    assert_eq!(settle(&b, "acknowledge", &got[0].2).await, 1);
    // c is rejected: a dead letter, answered once its removal is durable.
    assert_eq!(settle(&b, "reject", &got[2].2).await, 1);
    // d is received after the last frame: answered, and staged only.
    let last = receive(&b, 10).await;
    assert_eq!(
        last.iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(),
        [("d", 1)]
    );
    let cut_at = T0 + start.elapsed().as_millis() as u64;
    power.cut();
    drop(b);

    // Restarted on what reached the disk, at the same wall time.
    let b = open(disk.clone(), cut_at);
    let now = receive_within(&b, Duration::from_secs(5)).await;
    assert_eq!(
        now.iter().map(|e| (e.0.as_str(), e.1)).collect::<Vec<_>>(),
        [("d", 1)],
        "the receive of d was lost: d is available at once and counts that receive again; \
         b's lock reached the disk and holds; a (acknowledged) and c (rejected) never come back"
    );
    assert_eq!(settle(&b, "acknowledge", &now[0].2).await, 1);
    let later = receive_within(&b, Duration::from_secs(120)).await;
    assert_eq!(
        later
            .iter()
            .map(|e| (e.0.as_str(), e.1))
            .collect::<Vec<_>>(),
        [("b", 2)],
        "b comes back when its lock would have expired, its receive counted"
    );
    let waited = start.elapsed().as_millis() as u64 + T0 - cut_at;
    assert!(
        (59_000..=61_000).contains(&waited),
        "b's lock, taken before the cut, held for its 60 s: {waited} ms"
    );
    assert_eq!(settle(&b, "acknowledge", &later[0].2).await, 1);
    assert_eq!(b.find_subscription("q", "s").unwrap().pending(), 0);
}
