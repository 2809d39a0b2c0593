//! The promises of the simulation (see [`super`]), checked after a cut against the model.

use super::{trace_of, Model, QUEUES};
use crate::store::log::LogStore;
use crate::store::{QueueId, Store};
use std::collections::{BTreeMap, HashSet};

/// Check the promises of the module docs (`ever`: a damage fault was made in this seed);
/// returns how many owed events were found, and how many were lost in reported damage (the
/// model then forgets them).
pub(super) fn check(
    seed: u64,
    m: &mut Model,
    store: &LogStore,
    ever: bool,
) -> Result<(u64, u64), String> {
    let snapshot = store
        .load()
        .map_err(|e| format!("seed {seed}: load failed: {e}"))?;
    let known: HashSet<QueueId> = snapshot.subscriptions.iter().map(|(q, _)| *q).collect();
    // Promise 5: a deletion cut short went one way or the other; the checks below hold the
    // store to the way its metadata says.
    if let Some(q) = m.deleting.take() {
        if !known.contains(&q) {
            m.dropped.insert(q);
            m.owed.retain(|(o, _)| *o != q);
        }
    }
    for q in QUEUES {
        if m.dropped.contains(&q) == known.contains(&q) {
            return Err(format!(
                "seed {seed}: subscription {q} is {} after the restart",
                if known.contains(&q) { "back" } else { "gone" }
            ));
        }
    }
    let mut recovered = BTreeMap::new();
    for q in &known {
        let runs = store
            .pending_runs(*q)
            .map_err(|e| format!("seed {seed}: pending of queue {q}: {e}"))?;
        recovered.insert(*q, runs);
    }
    // The bytes counted are those of the events listed, exactly (checkpoint, replay, restatements,
    // damage and compaction alike).
    for (q, runs) in &recovered {
        let listed: u64 = runs
            .events()
            .iter()
            .filter_map(|(seq, _)| m.published.get(&(*q, *seq)))
            .map(|b| b.len() as u64)
            .sum();
        let counted = store.pending_bytes(*q);
        if counted != Some(listed) {
            return Err(format!(
                "seed {seed}: queue {q} counts {counted:?} bytes pending, its events hold {listed}"
            ));
        }
    }
    let mut found: HashSet<(QueueId, u64)> = HashSet::new();
    for (q, runs) in &recovered {
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
    let d = store.damage();
    // Dead letters first: a dead-lettered event is pending, a letter, or both; unless the open
    // reported damage, which may have taken the event before its letter was synced (the round
    // syncs the letters only before the frame removing their events).
    let damaged = ever && !d.losses.is_empty();
    if let Some(letters) = store.dead_letters() {
        let mut gone = Vec::new();
        for q in &known {
            let kept: HashSet<u64> = letters
                .list(*q, 0, usize::MAX)
                .map_err(|e| format!("seed {seed}: letters of queue {q}: {e}"))?
                .iter()
                .map(|l| l.seq)
                .collect();
            for (lq, s) in &m.lettered {
                if lq == q && !kept.contains(s) && !found.contains(&(*q, *s)) {
                    if !damaged {
                        return Err(format!(
                            "seed {seed}: dead-lettered event {s} of queue {q} is neither pending nor a letter"
                        ));
                    }
                    gone.push((*q, *s));
                }
            }
        }
        // What damage took is gone.
        for k in gone {
            m.lettered.remove(&k);
        }
    }
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
        let got = store
            .get(q, &seqs)
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
                        store.damage().losses
                    ))
                }
            }
        }
    }
    Ok((checked, seqs.len() as u64))
}

/// Whether the open reported at least as many events lost as went missing (`lost`), when it
/// could count them.
pub(super) fn counted_enough(store: &LogStore, lost: u64) -> bool {
    let d = store.damage();
    !d.losses.iter().all(|l| l.counted) || lost <= d.events()
}
