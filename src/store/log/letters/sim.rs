//! Power cuts on the dead-letter log, simulated like the event log's (`store/log/sim.rs`): a
//! seeded workload puts, evicts, takes and drops letters on a [`SimFs`] that cuts the power at a
//! seeded step; the letters are opened again and checked against a model.
//!
//! Promises checked after every cut:
//!
//! 1. opening succeeds;
//! 2. every letter made durable (a `sync`, `take` or `delete_queue` returned after its put) and
//!    not taken or evicted since is there, with the same id and content;
//! 3. nothing is invented: every letter there was put with that id and content, and none that
//!    was taken (the take returned) or evicted before a later sync returned comes back;
//! 4. ids keep increasing: the next put's id is above every durable letter's;
//! 5. a crash is never taken for damage: no open reports any (`letters/recover.rs` tells writes
//!    a crash cut or lost from damage by the `Synced` records).
//!
//! `run_seed` is deterministic: a failing seed reproduces from its number.

use super::{LetterOptions, LogLetters};
use crate::store::deadletter::{DeadLetter, DeadLetterBound, DeadLetterStore, DropReason};
use crate::store::fs::sim::{Rng, SimFs};
use crate::store::QueueId;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

const QUEUES: [QueueId; 3] = [1, 2, 3];

#[derive(Default)]
struct Model {
    /// Every letter ever put, by id.
    put: HashMap<u64, (QueueId, DeadLetter)>,
    /// Durable and not taken or evicted since: must be there.
    kept: HashSet<u64>,
    /// Put, not yet durable: may be there.
    maybe: HashSet<u64>,
    /// Evicted or taken, not yet durably: may come back.
    leaving: HashSet<u64>,
    /// Durably gone: must not come back.
    gone: HashSet<u64>,
    /// Queues deleted (or being deleted).
    dropped: HashSet<QueueId>,
    /// A put the power cut: its letter may be there (with the id it was given).
    inflight: Option<(QueueId, DeadLetter)>,
}

impl Model {
    /// A sync returned: everything written before it is durable.
    fn synced(&mut self) {
        self.kept.extend(self.maybe.drain());
        self.gone.extend(self.leaving.drain());
    }
}

fn opts() -> LetterOptions {
    LetterOptions {
        dir: PathBuf::from("/data/dead-letters"),
        segment_bytes: 8 << 10,
        max_disk_bytes: 1 << 30,
        refuse_damage: false,
    }
}

fn letter(rng: &mut Rng, seq: u64) -> DeadLetter {
    let len = if rng.chance(1, 10) {
        rng.below(12_000)
    } else {
        rng.below(400)
    } as usize;
    DeadLetter {
        id: 0,
        seq,
        event_id: format!("e{seq}"),
        body: Bytes::from(vec![b'a' + (seq % 26) as u8; len]),
        reason: DropReason::ALL[(seq % 4) as usize],
        last_status: rng.chance(1, 2).then_some(500),
        last_error: rng.chance(1, 2).then(|| format!("HTTP {seq}")),
        attempts: (seq % 7) as u32,
        first_enqueued_ms: seq,
        dead_lettered_ms: seq + 1,
    }
}

fn present(
    d: &LogLetters,
    alive: &HashSet<QueueId>,
) -> Result<HashMap<u64, (QueueId, DeadLetter)>, String> {
    let mut out = HashMap::new();
    for q in alive {
        for l in d.peek(*q, None).map_err(|e| e.to_string())? {
            out.insert(l.id, (*q, l));
        }
    }
    Ok(out)
}

/// What one seed did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// Power cuts survived.
    pub cuts: u32,
    /// Durable letters found after a cut.
    pub checked: u64,
}

/// Run one seed: three rounds of about `ops` operations, each ended by a power cut.
///
/// # Errors
/// The first broken promise, with the seed.
pub fn run_seed(seed: u64, ops: usize) -> Result<Outcome, String> {
    let fs = SimFs::new(seed);
    let mut rng = Rng::new(seed ^ 0x1e77_e125);
    let mut m = Model::default();
    let mut out = Outcome::default();
    let mut seq = 0u64;
    for round in 0..3 {
        let alive: HashSet<QueueId> = QUEUES
            .iter()
            .copied()
            .filter(|q| !m.dropped.contains(q))
            .collect();
        let d = LogLetters::open(Arc::new(fs.clone()), opts(), &alive, Box::new(|| 0))
            .map_err(|e| format!("seed {seed} round {round}: open failed: {e}"))?;
        let now = present(&d, &alive).map_err(|e| format!("seed {seed}: read failed: {e}"))?;
        let found = d.damage().losses;
        if !found.is_empty() {
            return Err(format!(
                "seed {seed} round {round}: damage reported after power cuts alone: {found:?}"
            ));
        }
        if round > 0 {
            out.checked += check(seed, &m, &now)?;
            out.cuts += 1;
        }
        // What survived a cut is durable now.
        if let Some((q, l)) = m.inflight.take() {
            if let Some((id, _)) = now
                .iter()
                .find(|(id, (nq, _))| !m.put.contains_key(id) && *nq == q)
            {
                m.put.insert(*id, (q, DeadLetter { id: *id, ..l }));
            }
        }
        m.kept = now.keys().copied().collect();
        m.maybe.clear();
        m.leaving.clear();
        // Ids above every durable one (a letter lost with the power before its sync may see
        // its id again).
        let max_seen = m.kept.iter().chain(&m.gone).copied().max().unwrap_or(0);
        fs.crash_at_step(fs.steps() + 1 + rng.below(ops as u64 * 2));
        for i in 0..ops {
            seq += 1;
            if step(&mut rng, &d, &mut m, &alive, seq).is_err() {
                break;
            }
            if i == 0 {
                if let Some(first) = m.maybe.iter().copied().max() {
                    if first <= max_seen {
                        return Err(format!("seed {seed}: id {first} reused (seen {max_seen})"));
                    }
                }
            }
        }
        if !fs.crashed() {
            let _ = d.sync().map(|()| m.synced());
            fs.power_cut();
        }
        drop(d);
        fs.reboot();
    }
    Ok(out)
}

fn step(
    rng: &mut Rng,
    d: &LogLetters,
    m: &mut Model,
    alive: &HashSet<QueueId>,
    seq: u64,
) -> Result<(), ()> {
    let queues: Vec<QueueId> = QUEUES
        .iter()
        .copied()
        .filter(|q| alive.contains(q) && !m.dropped.contains(q))
        .collect();
    let Some(&q) = queues.get(rng.below(queues.len().max(1) as u64) as usize) else {
        return d.sync().map(|()| m.synced()).map_err(|_| ());
    };
    match rng.below(10) {
        0..=4 => {
            let before: HashSet<u64> = present(d, alive).map_err(|_| ())?.into_keys().collect();
            let l = letter(rng, seq);
            let bound = DeadLetterBound {
                per_subscription: 12,
                max_bytes: 40_000,
            };
            // Evicted by this put even if the power goes during it (its frame may survive).
            for (_, id) in d.would_evict(q, &l, bound) {
                m.kept.remove(&id);
                m.maybe.remove(&id);
                m.leaving.insert(id);
            }
            m.inflight = Some((q, l.clone()));
            d.put(q, l.clone(), bound).map_err(|_| ())?;
            m.inflight = None;
            let after = present(d, alive).map_err(|_| ())?;
            for id in before.iter().filter(|id| !after.contains_key(id)) {
                m.kept.remove(id);
                m.maybe.remove(id);
                m.leaving.insert(*id);
            }
            for (id, (aq, al)) in &after {
                if !before.contains(id) {
                    m.put.insert(*id, (*aq, al.clone()));
                    m.maybe.insert(*id);
                }
            }
        }
        5..=6 => d.sync().map(|()| m.synced()).map_err(|_| ())?,
        7..=8 => {
            let ids: Vec<u64> = d
                .peek(q, None)
                .map_err(|_| ())?
                .iter()
                .map(|l| l.id)
                .collect();
            let pick: Vec<u64> = ids.into_iter().filter(|_| rng.chance(1, 3)).collect();
            for id in &pick {
                m.kept.remove(id);
                m.maybe.remove(id);
                m.leaving.insert(*id);
            }
            d.take(q, Some(&pick)).map_err(|_| ())?;
            m.synced();
        }
        _ if q == 3 && rng.chance(1, 4) => {
            m.dropped.insert(3);
            d.delete_queue(3).map_err(|_| ())?;
            m.synced();
        }
        _ => d.sync().map(|()| m.synced()).map_err(|_| ())?,
    }
    Ok(())
}

fn check(seed: u64, m: &Model, now: &HashMap<u64, (QueueId, DeadLetter)>) -> Result<u64, String> {
    for (id, (q, l)) in now {
        match m.put.get(id) {
            Some((pq, pl)) if pq == q && pl == l => {}
            Some(_) => return Err(format!("seed {seed}: letter {id} reads back different")),
            None if m.inflight.as_ref().is_some_and(|(iq, il)| {
                iq == q
                    && DeadLetter {
                        id: *id,
                        ..il.clone()
                    } == *l
            }) => {}
            None => return Err(format!("seed {seed}: letter {id} was never put")),
        }
        if m.gone.contains(id) {
            return Err(format!(
                "seed {seed}: letter {id} came back after it durably left"
            ));
        }
        if m.dropped.contains(q) {
            return Err(format!(
                "seed {seed}: letter {id} of deleted queue {q} is there"
            ));
        }
    }
    let mut checked = 0;
    for id in &m.kept {
        let q = m.put.get(id).map(|(q, _)| *q);
        if q.is_some_and(|q| m.dropped.contains(&q)) {
            continue;
        }
        if !now.contains_key(id) {
            return Err(format!(
                "seed {seed}: durable letter {id} (queue {q:?}) is lost"
            ));
        }
        checked += 1;
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dead_letters_survive_simulated_power_cuts() {
        let seeds: u64 = std::env::var("GRIDLET_SIM_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2_000)
            / 4;
        let mut checked = 0;
        for seed in 0..seeds.max(1) {
            let o = super::run_seed(seed, 40).unwrap_or_else(|e| panic!("{e}"));
            checked += o.checked;
        }
        assert!(checked > 0, "the runs checked durable letters");
    }
}
