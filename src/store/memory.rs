//! The in-memory store: metadata, events and dead letters in maps, lost on restart (the
//! original's behaviour). Every write is done when [`Store::stage`] returns: dead letters are
//! kept, then their events removed, on the caller's thread.

use super::deadletter::{DeadLetterStore, MemoryDeadLetters};
use super::{
    Answer, Commit, PendingRuns, QueueId, Settlement, Snapshot, Store, StoreError, StoredEvent,
    Writes,
};
use crate::model::record::{MqttKind, MqttRecord, SubscriptionRecord, TopicRecord};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Inner {
    topics: BTreeMap<String, (u64, TopicRecord)>,
    subs: BTreeMap<QueueId, SubscriptionRecord>,
    events: BTreeMap<(QueueId, u64), StoredEvent>,
    /// Body bytes of each queue's events.
    bytes: BTreeMap<QueueId, u64>,
    mqtt: BTreeMap<(&'static str, String), MqttRecord>,
    next_queue: QueueId,
    order: u64,
    max_seq: u64,
}

/// Maps behind one mutex; calls are short and never await.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    letters: Arc<MemoryDeadLetters>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the maps half-written (each call is one
        // map operation), so a poisoned lock is still consistent.
        crate::sync::lock(&self.inner)
    }
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let g = self.lock();
        let mut topics: Vec<_> = g.topics.values().cloned().collect();
        topics.sort_by_key(|(order, _)| *order);
        Ok(Snapshot {
            topics: topics.into_iter().map(|(_, v)| v).collect(),
            subscriptions: g.subs.iter().map(|(q, r)| (*q, r.clone())).collect(),
            max_seq: g.max_seq,
        })
    }

    fn pending_runs(&self, queue: QueueId) -> Result<PendingRuns, StoreError> {
        let g = self.lock();
        let mut out = PendingRuns::default();
        for e in g
            .events
            .range((queue, 0)..=(queue, u64::MAX))
            .map(|(_, e)| e)
        {
            out.push(e.seq, e.state);
        }
        Ok(out)
    }

    fn get(&self, queue: QueueId, seqs: &[u64]) -> Result<Vec<Option<StoredEvent>>, StoreError> {
        let g = self.lock();
        Ok(seqs
            .iter()
            .map(|s| g.events.get(&(queue, *s)).cloned())
            .collect())
    }

    fn mqtt_records(&self) -> Result<Vec<MqttRecord>, StoreError> {
        Ok(self.lock().mqtt.values().cloned().collect())
    }

    fn put_mqtt_record(
        &self,
        kind: MqttKind,
        name: &str,
        record: Option<&MqttRecord>,
    ) -> Result<(), StoreError> {
        let key = (kind.as_str(), name.to_string());
        let mut g = self.lock();
        match record {
            Some(r) => g.mqtt.insert(key, r.clone()),
            None => g.mqtt.remove(&key),
        };
        Ok(())
    }

    fn put_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError> {
        let mut g = self.lock();
        g.order += 1;
        let order = g.topics.get(key).map(|(o, _)| *o).unwrap_or(g.order);
        g.topics.insert(key.to_string(), (order, record.clone()));
        Ok(())
    }

    fn delete_topic(&self, key: &str) -> Result<(), StoreError> {
        self.lock().topics.remove(key);
        Ok(())
    }

    fn put_subscription(
        &self,
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError> {
        self.lock().subs.insert(queue, record.clone());
        Ok(())
    }

    fn delete_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        let mut g = self.lock();
        g.subs.remove(&queue);
        let keys: Vec<_> = g
            .events
            .range((queue, 0)..=(queue, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            g.events.remove(&k);
        }
        g.bytes.remove(&queue);
        Ok(())
    }

    fn next_queue_id(&self) -> Result<QueueId, StoreError> {
        let mut g = self.lock();
        g.next_queue += 1;
        Ok(g.next_queue)
    }

    fn stage(&self, writes: Writes<'_>, _answer: Answer) -> Result<Commit, StoreError> {
        // Map operations only: done when this returns, nothing to wait for.
        if let Writes::Letters(queue, l) = writes {
            let kept = super::deadletter::keep(
                self.letters.as_ref(),
                queue,
                l.letters,
                l.bound,
                l.report.as_ref(),
            );
            if let Ok(true) = kept {
                let removal = [Settlement::Remove(&l.events)];
                return self.stage(Writes::Settle(queue, &removal), Answer::Nobody);
            }
            return Ok(Commit::done());
        }
        let mut g = self.lock();
        match writes {
            Writes::Events(items) => {
                for (q, e) in items {
                    g.max_seq = g.max_seq.max(e.seq);
                    let len = e.body.len() as u64;
                    if g.events.insert((q, e.seq), e).is_none() {
                        *g.bytes.entry(q).or_default() += len;
                    }
                }
            }
            Writes::Settle(queue, settlements) => {
                for s in settlements {
                    match *s {
                        Settlement::Remove(events) => {
                            for s in events {
                                // The stored body's size: this store has it.
                                if let Some(e) = g.events.remove(&(queue, s.seq)) {
                                    if let Some(b) = g.bytes.get_mut(&queue) {
                                        *b = b.saturating_sub(e.body.len() as u64);
                                    }
                                }
                            }
                        }
                        Settlement::Retry(seqs, state) => {
                            for s in seqs {
                                if let Some(e) = g.events.get_mut(&(queue, *s)) {
                                    e.state = state;
                                }
                            }
                        }
                    }
                }
            }
            Writes::Staged | Writes::Letters(..) => {}
        }
        Ok(Commit::done())
    }

    /// Pending events only: settled ones are not kept (this store keeps nothing across a
    /// restart, so nothing would read them).
    fn retained_events(
        &self,
        since_ms: crate::clock::WallMs,
        f: &mut dyn FnMut(super::RetainedEvent),
    ) -> Result<(), StoreError> {
        let g = self.lock();
        let mut by_seq: BTreeMap<u64, super::RetainedEvent> = BTreeMap::new();
        for ((q, seq), e) in &g.events {
            if e.state.first_enqueued_ms < since_ms {
                continue;
            }
            by_seq
                .entry(*seq)
                .or_insert_with(|| super::RetainedEvent {
                    seq: *seq,
                    accepted_ms: e.state.first_enqueued_ms,
                    queues: Vec::new(),
                    id: e.id.clone(),
                    body: e.body.clone(),
                })
                .queues
                .push(*q);
        }
        drop(g);
        for e in by_seq.into_values() {
            f(e);
        }
        Ok(())
    }

    fn pending_bytes(&self, queue: QueueId) -> Option<u64> {
        Some(self.lock().bytes.get(&queue).copied().unwrap_or(0))
    }

    fn stages_in_memory(&self) -> bool {
        true
    }

    fn dead_letters(&self) -> Option<Arc<dyn DeadLetterStore>> {
        Some(self.letters.clone())
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn memory_store_passes_the_contract() {
        super::super::contract::run(&super::MemoryStore::new()).await;
    }
}
