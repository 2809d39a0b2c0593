//! Power cuts, simulated: a seeded workload drives the event log on a [`SimFs`] that cuts the
//! power at a seeded step, loses or tears what was not synced, and reboots; the log is opened
//! again and checked against a model of what was acknowledged.
//!
//! The promises checked after every cut:
//!
//! 1. start-up succeeds (a crash never leaves a state the log refuses);
//! 2. every event whose publish was acknowledged, and not settled since, is pending, exactly once,
//!    with the body (and trace context) that was published;
//! 3. nothing is invented: every pending event was published to that queue (an unacknowledged
//!    publish may or may not be there), of a queue not deleted;
//! 4. a settlement followed by a successful commit is never undone (the event does not come back);
//!    a pending event's retry state is its first one or one that was set;
//! 5. writing goes on after the restart (the next round publishes, settles and is cut again).
//!
//! With damage on ([`run_seed_with`]), between a cut and the next open half the rounds of a
//! seed also damage **synced** data
//! ([`damage`]: a flipped bit, a zeroed or lost sector, a stale block, a damaged header, a
//! missing segment file), where the log promises to see it. Then promise 2 becomes: every
//! acknowledged event is pending unless it was in damaged data, and then the open reported the
//! loss ([`Log::damage`]); never silent. Whether the count reported covers what went missing is
//! counted ([`Outcome::undercounted`]), not yet a failure. A settled
//! event may come back (a damaged frame may have held its settlement: at least once). An open
//! with no fault made in the seed so far must report no damage at all.
//!
//! `run_seed(seed, ops)` is deterministic: a failing seed reproduces from its number. The suite
//! runs a few thousand short seeds (`sim_tests`), `gridlet-bench --scenario crashsim` many more.

pub mod damage;

use super::engine::{Compaction, Log, LogOptions};
use crate::store::fs::sim::{Rng, SimFs};
use crate::store::{QueueId, RetryState, StoredEvent};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
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
    /// Deleted queues.
    dropped: HashSet<QueueId>,
    next_seq: u64,
}

const QUEUES: [QueueId; 3] = [1, 2, 3];

fn opts(seed: u64) -> LogOptions {
    LogOptions {
        dir: PathBuf::from("/data/log"),
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
        // Segments qualify as soon as a quarter of their events are pending (`compact` also
        // forces them whatever they hold).
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
    let known: HashSet<QueueId> = QUEUES.into_iter().collect();
    let mut now = 1_000u64;
    // Damage faults draw from a generator of their own: the workload of a seed stays the same.
    let mut harm = Rng::new(seed ^ 0x0da3_a9e5);
    let mut fault: Option<damage::Injected> = None;
    let mut ever = false;
    for round in 0..3 {
        let alive: HashSet<QueueId> = known.difference(&model.dropped).copied().collect();
        let (mut log, recovered) = Log::open(Arc::new(fs.clone()), opts(seed), &alive, now)
            .map_err(|e| format!("seed {seed} round {round}: open failed: {e}"))?;
        if round > 0 {
            let why = |e: String| match &fault {
                Some(f) => format!("{e} (damage made before this open: {f:?})"),
                None => e,
            };
            let (checked, lost) = check(seed, &mut model, &log, &recovered, ever).map_err(why)?;
            out.checked += checked;
            out.lost += lost;
            out.undercounted += u32::from(!counted_enough(&log, lost));
            out.reported += u32::from(fault.is_some() && !log.damage().losses.is_empty());
            out.cuts += 1;
        }
        model.next_seq = model.next_seq.max(log.max_seq() + 1);
        fs.crash_at_step(fs.steps() + 1 + rng.below(ops as u64 * 2));
        // A compaction planned and not yet run: other operations go on meanwhile, as on the
        // store's compactor thread.
        let mut job = None;
        for _ in 0..ops {
            now += 1 + rng.below(50);
            if step(&mut rng, &mut log, &mut model, now, &mut out, &mut job).is_err() {
                break;
            }
        }
        if let Some(b) = model.broken.take() {
            return Err(format!("seed {seed} round {round}: {b}"));
        }
        if !fs.crashed() {
            let _ = commit(&mut log, &mut model, now);
            fs.power_cut();
        }
        // Settlements not followed by a successful commit may or may not have been written.
        model.settling.clear();
        out.compactions += log.compactions();
        out.recycled += log.recycled();
        drop(log);
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
    log: &mut Log,
    m: &mut Model,
    now: u64,
    out: &mut Outcome,
    job: &mut Option<Compaction>,
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
            log.stage_events(&items, 0).map_err(|_| ())?;
            commit(log, m, now)?;
            m.owed.extend(items.iter().map(|(q, e)| (*q, e.seq)));
        }
        4..=5 if !owed.is_empty() => {
            let k = 1 + rng.below(8) as usize;
            let start = rng.below(owed.len() as u64) as usize;
            let picked: Vec<_> = owed.iter().skip(start).take(k).copied().collect();
            for (q, s) in &picked {
                log.stage_settle(*q, &[*s]);
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
            log.stage_retry(q, &[s], st);
            m.states.entry((q, s)).or_default().push(st);
        }
        8 if rng.chance(1, 2) => {
            // A checkpoint between frames (as the committer takes them); a failed one is only a
            // warning: the previous one stays valid.
            // Sometimes with settlements staged and not yet written (as when a delivery settles
            // while the committer writes): the checkpoint holds them a frame early.
            if rng.chance(1, 2) {
                commit(log, m, now)?;
            }
            if log.checkpoint_due() || rng.chance(1, 3) {
                let _ = log.checkpoint();
            }
        }
        7 if rng.chance(1, 8) && !m.dropped.contains(&3) => {
            log.stage_drop_queue(3);
            m.dropped.insert(3);
            m.owed.retain(|(q, _)| *q != 3);
        }
        10 => compact(rng, log, m, now, job)?,
        9 if !owed.is_empty() => read_back(rng, log, m, &owed, out)?,
        _ => commit(log, m, now)?,
    }
    Ok(())
}

/// Read owed events of one queue back in consecutive chunks, as a drain does (through the
/// frame cache, across rolls, collections and compactions): each must read its body.
fn read_back(
    rng: &mut Rng,
    log: &Log,
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
        let got = log.plan_get(q, part).run().map_err(|_| ())?;
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

/// Compact a closed segment with events pending, whatever it holds, or the one the store would
/// choose (the head included), in two steps as the store does: plan it (restating the older segments) and commit; then, some operations later (more
/// publishes, settlements, commits, rolls, checkpoints), copy it and swap it in.
fn compact(
    rng: &mut Rng,
    log: &mut Log,
    m: &mut Model,
    now: u64,
    job: &mut Option<Compaction>,
) -> Result<(), ()> {
    if let Some(j) = job.take() {
        log.finish_compaction(j.run());
        return commit(log, m, now);
    }
    if rng.chance(1, 3) {
        // The store's choice: the segment that frees most, the head too (closed first).
        *job = log.plan_compaction(None);
    } else {
        let closed = log.closed_pending_segments();
        if !closed.is_empty() {
            let no = closed[rng.below(closed.len() as u64) as usize];
            *job = log.plan_compaction(Some(no));
        }
    }
    commit(log, m, now)
}

/// Commit; on success every settlement staged before it is durable.
fn commit(log: &mut Log, m: &mut Model, now: u64) -> Result<(), ()> {
    let r = log.commit(now);
    r.map_err(|_| ())?;
    m.settled.extend(m.settling.drain());
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

/// Check the promises of the module docs (`ever`: a damage fault was made in this seed);
/// returns how many owed events were found, and how many were lost in reported damage (the
/// model then forgets them).
fn check(
    seed: u64,
    m: &mut Model,
    log: &Log,
    recovered: &super::engine::Recovered,
    ever: bool,
) -> Result<(u64, u64), String> {
    let mut found: HashSet<(QueueId, u64)> = HashSet::new();
    for (q, runs) in recovered {
        let list = runs.events();
        let mut last = 0;
        for (seq, st) in &list {
            if *seq <= last {
                return Err(format!(
                    "seed {seed}: queue {q} lists {seq} twice or out of order"
                ));
            }
            last = *seq;
            if m.dropped.contains(q) {
                return Err(format!(
                    "seed {seed}: deleted queue {q} has event {seq} pending"
                ));
            }
            if !m.published.contains_key(&(*q, *seq)) {
                return Err(format!(
                    "seed {seed}: queue {q} has event {seq} never published to it"
                ));
            }
            if m.settled.contains(&(*q, *seq)) && !ever {
                return Err(format!(
                    "seed {seed}: event {seq} of queue {q} is pending again after its settlement was committed"
                ));
            }
            let fresh = st.attempts == 0 && st.due_ms == 0;
            let set = m.states.get(&(*q, *seq)).is_some_and(|v| v.contains(st));
            if !fresh && !set {
                return Err(format!(
                    "seed {seed}: queue {q} event {seq} has state {st:?}, never set"
                ));
            }
            found.insert((*q, *seq));
        }
    }
    let d = log.damage();
    if !ever && !d.losses.is_empty() {
        return Err(format!(
            "seed {seed}: damage reported after power cuts alone: {:?}",
            d.losses
        ));
    }
    let mut checked = 0;
    let mut by_queue: BTreeMap<QueueId, Vec<u64>> = BTreeMap::new();
    let mut missing: Vec<(QueueId, u64)> = Vec::new();
    for (q, s) in &m.owed {
        if !found.contains(&(*q, *s)) {
            missing.push((*q, *s));
            continue;
        }
        by_queue.entry(*q).or_default().push(*s);
        checked += 1;
    }
    missing.sort_unstable();
    let seqs: HashSet<u64> = missing.iter().map(|(_, s)| *s).collect();
    if !missing.is_empty() && (!ever || d.losses.is_empty()) {
        return Err(format!(
            "seed {seed}: acknowledged events lost {missing:?}, reported: {:?}",
            d.losses
        ));
    }
    if ever {
        // What damage took is gone; settled events it brought back are pending again.
        m.owed.retain(|k| found.contains(k));
        m.settled.retain(|k| !found.contains(k));
    }
    for (q, seqs) in by_queue {
        let got = log
            .plan_get(q, &seqs)
            .run()
            .map_err(|e| format!("seed {seed}: read of queue {q} failed: {e}"))?;
        for (s, e) in seqs.iter().zip(got) {
            let want = m.published.get(&(q, *s));
            match e {
                Some(e) if Some(&e.body) == want && e.trace == trace_of(*s) => {}
                Some(_) => {
                    return Err(format!(
                        "seed {seed}: event {s} of queue {q} reads back a different body or trace"
                    ))
                }
                None => {
                    return Err(format!(
                        "seed {seed}: event {s} of queue {q} is pending but unreadable (damage reported: {:?})",
                        log.damage().losses
                    ))
                }
            }
        }
    }
    Ok((checked, seqs.len() as u64))
}

/// Whether the open reported at least as many events lost as went missing (`lost`), when it
/// could count them.
fn counted_enough(log: &Log, lost: u64) -> bool {
    let d = log.damage();
    !d.losses.iter().all(|l| l.counted) || lost <= d.events()
}
