//! Power cuts, simulated: a seeded workload drives the log store as shipped ([`LogStore`], its
//! metadata on the same disk, [`FsMeta`]) on a [`SimFs`] that cuts the power at a seeded step,
//! loses or tears what was not synced, and reboots; the store is opened again and checked
//! against a model of what was acknowledged. The store runs without threads
//! ([`LogStore::simulated`]): its [`Driver`] runs the committer's rounds (the same executor,
//! `round.rs`) and the compactor's copies when the seed says, so every seed is one order of
//! events, reproducible from its number. Publishes go through [`Store::submit`] and are
//! acknowledged when their `Commit` resolves; several may share a round's frame.
//!
//! The promises checked after every cut:
//!
//! 1. start-up succeeds (a crash never leaves a state the store refuses);
//! 2. every event whose publish was acknowledged, and not settled since, is pending, exactly once,
//!    with the body (and trace context) that was published;
//! 3. nothing is invented: every pending event was published to that queue (an unacknowledged
//!    publish may or may not be there), of a queue not deleted;
//! 4. a settlement followed by a successful round is never undone (the event does not come back);
//!    a pending event's retry state is its first one or one that was set;
//! 5. a subscription deletion cut short leaves the subscription either gone with its events or
//!    there with all of them (`delete_subscription`: the record first); one that returned is gone;
//! 6. writing goes on after the restart (the next round publishes, settles and is cut again).
//!
//! With damage on ([`run_seed_with`]), between a cut and the next open half the rounds of a
//! seed also damage **synced** data
//! ([`damage`]: a flipped bit, a zeroed or lost sector, a stale block, a damaged header, a
//! missing segment file), where the log promises to see it. Then promise 2 becomes: every
//! acknowledged event is pending unless it was in damaged data, and then the open or the scrub
//! that follows it (run to the end after each open, [`Driver::scrub`]; the frames a checkpoint
//! vouches for are checked there, not at open) reported the loss ([`LogStore::damage`]); never
//! silent. Whether the count reported covers what went missing is
//! counted ([`Outcome::undercounted`]), not yet a failure. A settled
//! event may come back (a damaged frame may have held its settlement: at least once). An open
//! with no fault made in the seed so far must report no damage at all.
//!
//! `run_seed(seed, ops)` is deterministic: a failing seed reproduces from its number. The suite
//! runs a few thousand short seeds (`sim_tests`), `gridlet-bench --scenario crashsim` many more.

mod check;
pub mod damage;

use check::{check, counted_enough};

use super::engine::LogOptions;
use super::{Driver, LogStore, LogStoreOptions, SUBDIR};
use crate::store::fs::sim::{Rng, SimFs};
use crate::store::fs::Fs;
use crate::store::meta::FsMeta;
use crate::store::{
    Answer, Commit, QueueId, RetryState, Settled, Settlement, Store, StoredEvent, Writes,
};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What one seed did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// Power cuts survived.
    pub cuts: u32,
    /// Events published (acknowledged or not).
    pub published: u64,
    /// Acknowledged events found pending after a cut.
    pub checked: u64,
    /// Mutating disk calls made.
    pub steps: u64,
    /// Segments replaced by a compacted copy.
    pub compactions: u64,
    /// Events read back while the log runs (chunks, as a drain reads them).
    pub read: u64,
    /// Heads started in a segment given back earlier (the spare).
    pub recycled: u64,
    /// Damage faults made in synced data ([`damage`]).
    pub faults: u32,
    /// Opens after a fault that reported damage.
    pub reported: u32,
    /// Acknowledged events lost in damaged data (each reported).
    pub lost: u64,
    /// Opens that reported fewer events lost than went missing (the loss reported, its count
    /// short: a known gap, see docs/DURABILITY.md).
    pub undercounted: u32,
}

#[derive(Default)]
struct Model {
    /// `(queue, seq)` → body, for every event staged (acknowledged or not).
    published: HashMap<(QueueId, u64), Bytes>,
    /// Acknowledged and not settled since.
    owed: HashSet<(QueueId, u64)>,
    /// A read that answered wrong while the log ran: the seed fails with it.
    broken: Option<String>,
    /// Settled, not yet followed by a successful commit: may come back after a cut.
    settling: HashSet<(QueueId, u64)>,
    /// Settled, and a commit succeeded after: must never come back.
    settled: HashSet<(QueueId, u64)>,
    /// Retry states ever set per event.
    states: HashMap<(QueueId, u64), Vec<RetryState>>,
    /// Deleted queues (the deletion returned).
    dropped: HashSet<QueueId>,
    /// Events dead-lettered (their letter put, then their removal staged): after a cut each is
    /// pending, a letter, or both; never neither.
    lettered: HashSet<(QueueId, u64)>,
    /// A deletion of this queue began and did not return: either outcome is allowed.
    deleting: Option<QueueId>,
    /// Publishes submitted and not yet answered, with their events.
    unanswered: Vec<(Commit, Vec<(QueueId, u64)>)>,
    next_seq: u64,
}

const QUEUES: [QueueId; 3] = [1, 2, 3];

/// Where the simulated store keeps its files.
const EVENTS: &str = "/data/events";
const META: &str = "/data/meta";

fn store_opts() -> LogStoreOptions {
    LogStoreOptions {
        metadata_path: PathBuf::from(META),
        events_path: PathBuf::from(EVENTS),
        max_disk_bytes: 64 << 20,
        cache_bytes: 0,
        flush_every_ms: 0,
        segment_bytes: 16 << 10,
        compact_idle_ms: 0,
        refuse_damage: false,
    }
}

/// The event log's options of a seed (its directory: the store's).
pub fn opts(seed: u64) -> LogOptions {
    LogOptions {
        dir: Path::new(EVENTS).join(SUBDIR).join("log"),
        // Small segments: rolls and deletions happen within a few dozen operations.
        segment_bytes: 16 << 10,
        max_disk_bytes: 64 << 20,
        // Half the seeds read every body back from the disk, half mostly from the tail.
        tail_bytes: if seed.is_multiple_of(2) { 0 } else { 8 << 10 },
        // Checkpoints every few frames in a third of the seeds, never in another third (those
        // read every segment at open); the rest also take them at random steps.
        checkpoint_bytes: match seed % 3 {
            0 => 6 << 10,
            1 => u64::MAX,
            _ => 40 << 10,
        },
        // Frames as they are, or rewritten in whole blocks from the head's last partial one
        // (the store's direct writes), with files reserved ahead or not.
        align: [1, 512, 4096][(seed / 3 % 3) as usize],
        // With whole 4 KiB blocks, half the seeds write small frames by 512-byte sectors.
        sector: if (seed / 27).is_multiple_of(2) {
            512
        } else {
            4096
        },
        allocate_step: [1, 4096, 12 << 10][(seed / 9 % 3) as usize],
        // Segments are weighed at every round, and qualify as soon as a quarter of their events
        // at most are pending.
        compact_idle_ms: 0,
        refuse_damage: false,
    }
}

fn body(rng: &mut Rng, seq: u64) -> Bytes {
    let len = if rng.chance(1, 20) {
        rng.below(20_000)
    } else {
        rng.below(600)
    };
    let mut b = format!("{{\"seq\":{seq},\"pad\":\"").into_bytes();
    b.extend((0..len).map(|i| b'a' + ((seq + i) % 26) as u8));
    b.extend_from_slice(b"\"}");
    Bytes::from(b)
}

/// The record each simulated subscription is created with.
fn record(q: QueueId) -> crate::model::record::SubscriptionRecord {
    crate::model::record::SubscriptionRecord {
        v: crate::model::record::RECORD_VERSION,
        name: format!("s{q}"),
        topic: "t".into(),
        delivery_schema: crate::model::topic::EventSchema::EventGrid,
        persisted: true,
        retry_policy: None,
        destination: crate::model::destination::DestinationRecord {
            endpoint_type: "WebHook".into(),
            properties: serde_json::Map::new(),
        },
        batching: Default::default(),
        filter: None,
        signing_secrets: Vec::new(),
        attributes: Vec::new(),
        dead_letter: None,
        queue: None,
    }
}

/// Open the store on the seed's disk.
fn open(fs: &SimFs, seed: u64, clock: &Arc<AtomicU64>) -> Result<(LogStore, Driver), String> {
    let shared: Arc<dyn Fs> = Arc::new(fs.clone());
    let meta = FsMeta::open(shared.clone(), PathBuf::from(META)).map_err(|e| e.to_string())?;
    LogStore::simulated(
        shared,
        Box::new(meta),
        &store_opts(),
        opts(seed),
        clock.clone(),
    )
    .map_err(|e| e.to_string())
}

/// Run one seed: `rounds` rounds of about `ops` operations, each ended by a power cut.
///
/// # Errors
/// The first broken promise, with the seed and what was seen.
pub fn run_seed(seed: u64, ops: usize) -> Result<Outcome, String> {
    run_seed_with(seed, ops, false)
}

/// [`run_seed`], with damage faults in synced data between rounds when `damage` is set.
///
/// # Errors
/// As [`run_seed`].
pub fn run_seed_with(seed: u64, ops: usize, damage: bool) -> Result<Outcome, String> {
    let fs = SimFs::new(seed);
    let mut rng = Rng::new(seed ^ 0xdead_beef);
    let mut model = Model {
        next_seq: 1,
        ..Model::default()
    };
    let mut out = Outcome::default();
    let clock = Arc::new(AtomicU64::new(1_000));
    // Damage faults draw from a generator of their own: the workload of a seed stays the same.
    let mut harm = Rng::new(seed ^ 0x0da3_a9e5);
    let mut fault: Option<damage::Injected> = None;
    let mut ever = false;
    for round in 0..3 {
        let (store, driver) = open(&fs, seed, &clock)
            .map_err(|e| format!("seed {seed} round {round}: open failed: {e}"))?;
        // The open left the frames its checkpoint vouches for to the scrub: run it to the end
        // (as `gridlet-scrub` would) before the promises are checked.
        driver
            .scrub()
            .map_err(|e| format!("seed {seed} round {round}: scrub failed: {e}"))?;
        if round == 0 {
            for q in QUEUES {
                store
                    .put_subscription(q, &record(q))
                    .map_err(|e| format!("seed {seed}: subscription {q}: {e}"))?;
            }
        } else {
            let why = |e: String| match &fault {
                Some(f) => format!("{e} (damage made before this open: {f:?})"),
                None => e,
            };
            let (checked, lost) = check(seed, &mut model, &store, ever).map_err(why)?;
            out.checked += checked;
            out.lost += lost;
            out.undercounted += u32::from(!counted_enough(&store, lost));
            out.reported += u32::from(fault.is_some() && !store.damage().losses.is_empty());
            out.cuts += 1;
        }
        let max_seq = store
            .load()
            .map_err(|e| format!("seed {seed}: load: {e}"))?
            .max_seq;
        model.next_seq = model.next_seq.max(max_seq + 1);
        // Disk steps before the cut: the store makes more per operation than the bare log did
        // (metadata, letters, idle rounds), so the window is wider than two per operation.
        fs.crash_at_step(fs.steps() + 1 + rng.below(ops as u64 * 3));
        for _ in 0..ops {
            clock.fetch_add(1 + rng.below(50), Ordering::Relaxed);
            let now = clock.load(Ordering::Relaxed);
            if step(&mut rng, &store, &driver, &mut model, now, &mut out).is_err() {
                break;
            }
        }
        if let Some(b) = model.broken.take() {
            return Err(format!("seed {seed} round {round}: {b}"));
        }
        if !fs.crashed() {
            if rng.chance(1, 2) {
                // A clean stop: the last round and a checkpoint, then the power goes.
                store.close();
                answered(&mut model);
            } else {
                let _ = run_round(&driver, &mut model);
            }
            fs.power_cut();
        }
        // Publishes never answered were never acknowledged.
        model.unanswered.clear();
        // Settlements not followed by a successful round may or may not have been written.
        model.settling.clear();
        out.compactions += store.compactions();
        out.recycled += store.recycled();
        store.crash();
        fs.reboot();
        fault = None;
        if damage && round < 2 && harm.chance(1, 2) {
            fault = damage::inject(&mut harm, &fs, &opts(seed));
            out.faults += u32::from(fault.is_some());
            ever |= fault.is_some();
        }
    }
    out.steps = fs.steps();
    Ok(out)
}

/// One random operation. `Err` once the disk failed (the power is cut).
fn step(
    rng: &mut Rng,
    store: &LogStore,
    driver: &Driver,
    m: &mut Model,
    now: u64,
    out: &mut Outcome,
) -> Result<(), ()> {
    let owed: Vec<(QueueId, u64)> = {
        let mut v: Vec<_> = m.owed.iter().copied().collect();
        v.sort_unstable();
        v
    };
    match rng.below(11) {
        0..=3 => {
            let n = 1 + rng.below(4);
            let mut items = Vec::new();
            for _ in 0..n {
                let seq = m.next_seq;
                m.next_seq += 1;
                let b = body(rng, seq);
                for q in QUEUES {
                    if !m.dropped.contains(&q) && rng.chance(2, 3) {
                        m.published.insert((q, seq), b.clone());
                        items.push((q, event(seq, &b, now)));
                    }
                }
            }
            out.published += n;
            let keys = items.iter().map(|(q, e)| (*q, e.seq)).collect();
            let commit = store.submit(items).map_err(|_| ())?;
            m.unanswered.push((commit, keys));
            // Most publishes are written at once; the others share the next round's frame.
            if rng.chance(2, 3) {
                run_round(driver, m)?;
            }
        }
        4..=5 if !owed.is_empty() => {
            let k = 1 + rng.below(8) as usize;
            let start = rng.below(owed.len() as u64) as usize;
            let picked: Vec<_> = owed.iter().skip(start).take(k).copied().collect();
            if rng.chance(1, 4) {
                return dead_letter(store, m, &picked, now);
            }
            for (q, s) in &picked {
                let len = m.published.get(&(*q, *s)).map_or(0, |b| b.len());
                let gone = [Settled::new(*s, len)];
                // Through the store writer's path or in place, as delivery settles.
                if rng.chance(1, 2) {
                    store.remove(*q, &gone).map_err(|_| ())?;
                } else {
                    let settle = [Settlement::Remove(&gone)];
                    store
                        .stage(Writes::Settle(*q, &settle), Answer::Nobody)
                        .map(drop)
                        .map_err(|_| ())?;
                }
                m.owed.remove(&(*q, *s));
                m.settling.insert((*q, *s));
            }
        }
        6 if !owed.is_empty() => {
            let (q, s) = owed[rng.below(owed.len() as u64) as usize];
            let st = RetryState {
                attempts: 1 + rng.below(5) as u32,
                first_enqueued_ms: now,
                due_ms: now + 60_000,
            };
            store.update(q, &[s], st).map_err(|_| ())?;
            m.states.entry((q, s)).or_default().push(st);
        }
        8 if rng.chance(1, 2) => {
            // A checkpoint at a random step (the rounds take them when due), sometimes with
            // settlements staged and not yet written (as when a delivery settles while the
            // committer writes): the checkpoint holds them a frame early.
            if rng.chance(1, 2) {
                run_round(driver, m)?;
            }
            if rng.chance(1, 3) {
                driver.checkpoint();
            }
        }
        7 if rng.chance(1, 8) && !m.dropped.contains(&3) => {
            // The metadata record first, then the log: a cut in between leaves the subscription
            // gone with its events (see promise 5).
            m.deleting = Some(3);
            // Cut short, it may not have reached its round: its publishes stay unanswered.
            store.delete_subscription(3).map_err(|_| ())?;
            answered(m);
            m.deleting = None;
            m.dropped.insert(3);
            m.owed.retain(|(q, _)| *q != 3);
            m.settled.extend(m.settling.drain());
        }
        // The compactor copies what a round handed over; an idle round weighs the segments.
        10 => {
            if !driver.compact() {
                if rng.chance(1, 3) {
                    driver.idle().map_err(|_| ())?;
                } else {
                    // A closed segment with events pending, whatever it holds.
                    let pick =
                        |c: &[u64]| (!c.is_empty()).then(|| c[rng.below(c.len() as u64) as usize]);
                    driver.compact_one(pick).map_err(|_| ())?;
                }
            }
        }
        9 if !owed.is_empty() => read_back(rng, store, m, &owed, out)?,
        _ => run_round(driver, m)?,
    }
    Ok(())
}

/// The simulation counts nothing.
struct Quiet;

impl crate::store::deadletter::LetterReport for Quiet {
    fn kept(&self, _: usize, _: usize) {}
    fn failed(&self, _: &crate::store::StoreError) {}
}

/// Dead-letter `picked` as delivery does: one [`Writes::Letters`] per queue (the round puts the
/// letters and syncs them, then stages the removal of their events).
fn dead_letter(
    store: &LogStore,
    m: &mut Model,
    picked: &[(QueueId, u64)],
    now: u64,
) -> Result<(), ()> {
    let bound = crate::store::deadletter::DeadLetterBound {
        per_subscription: usize::MAX,
        max_bytes: u64::MAX,
    };
    let mut by_queue: BTreeMap<QueueId, (Vec<_>, Vec<Settled>)> = BTreeMap::new();
    for (q, s) in picked {
        let body = m.published.get(&(*q, *s)).cloned().unwrap_or_default();
        let letter = crate::store::deadletter::DeadLetter {
            id: 0,
            seq: *s,
            event_id: format!("id-{s}"),
            body,
            reason: crate::store::deadletter::DropReason::MaxDeliveryAttemptsExceeded,
            last_status: Some(500),
            last_error: None,
            attempts: 3,
            first_enqueued_ms: now,
            dead_lettered_ms: now,
        };
        let len = letter.body.len();
        let job = by_queue.entry(*q).or_default();
        job.0.push(letter);
        job.1.push(Settled::new(*s, len));
    }
    for (q, (letters, events)) in by_queue {
        let seqs = Settled::seqs(&events);
        let job = crate::store::Letters {
            letters,
            bound,
            events,
            report: Arc::new(Quiet),
        };
        store
            .stage(Writes::Letters(q, job), Answer::Nobody)
            .map(drop)
            .map_err(|_| ())?;
        for s in seqs {
            m.owed.remove(&(q, s));
            m.settling.insert((q, s));
            m.lettered.insert((q, s));
        }
    }
    Ok(())
}

/// Publishes answered: those answered `Ok` are acknowledged (owed).
fn answered(m: &mut Model) {
    for (mut commit, keys) in std::mem::take(&mut m.unanswered) {
        match commit.ready() {
            Some(Ok(())) => m.owed.extend(keys),
            Some(Err(_)) => {}
            // A round answers every publish staged before it: none can still wait.
            None => m.broken = Some("a publish was not answered by the round after it".into()),
        }
    }
}

/// The committer's round; on success every settlement staged before it is durable.
fn run_round(driver: &Driver, m: &mut Model) -> Result<(), ()> {
    let r = driver.round();
    answered(m);
    r.map_err(|_| ())?;
    m.settled.extend(m.settling.drain());
    Ok(())
}

/// Read owed events of one queue back in consecutive chunks, as a drain does (through the
/// frame cache, across rolls, collections and compactions): each must read its body.
fn read_back(
    rng: &mut Rng,
    store: &LogStore,
    m: &mut Model,
    owed: &[(QueueId, u64)],
    out: &mut Outcome,
) -> Result<(), ()> {
    let (q, _) = owed[rng.below(owed.len() as u64) as usize];
    let seqs: Vec<u64> = owed
        .iter()
        .filter(|(o, _)| *o == q)
        .map(|(_, s)| *s)
        .collect();
    let start = rng.below(seqs.len() as u64) as usize;
    let chunk = 1 + rng.below(64) as usize;
    for part in seqs.get(start..).unwrap_or_default().chunks(chunk).take(3) {
        // A read error is the disk failing (the cut); a wrong answer is a broken promise.
        let got = store.get(q, part).map_err(|_| ())?;
        for (seq, e) in part.iter().zip(got) {
            out.read += 1;
            if e.map(|e| e.body) != m.published.get(&(q, *seq)).cloned() {
                m.broken = Some(format!(
                    "event {seq} of queue {q} read back wrong or not at all while running"
                ));
                return Err(());
            }
        }
    }
    Ok(())
}

fn event(seq: u64, body: &Bytes, now: u64) -> StoredEvent {
    StoredEvent {
        seq,
        id: format!("id-{seq}"),
        body: body.clone(),
        state: RetryState {
            attempts: 0,
            first_enqueued_ms: now,
            due_ms: 0,
        },
        trace: trace_of(seq),
    }
}

/// The trace context event `seq` is published in: none for a third of the events, one with a
/// `tracestate` for another third (derived from `seq`: the RNG's draws stay as they were).
fn trace_of(seq: u64) -> Option<Arc<crate::telemetry::TraceContext>> {
    (!seq.is_multiple_of(3)).then(|| {
        Arc::new(crate::telemetry::TraceContext {
            trace_id: u128::from(seq) << 64 | 0xfeed,
            span_id: seq,
            flags: (seq % 2) as u8,
            state: (seq % 3 == 2).then(|| Arc::from(format!("k=v{seq}").as_str())),
        })
    })
}
