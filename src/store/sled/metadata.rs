//! Metadata of the sled store: topics, subscriptions, queue ids and endpoint-health records, in
//! the metadata database (trees `topics`, `subs`, `health`; layout in the [`super`] docs).
//!
//! Invariant: every write here is flushed before it returns (management calls are rare and
//! must survive a crash once answered).

use super::codec::{be, read_u64};
use super::committer::lock_map;
use super::{corrupt, io, item_cost, SledStore, HIGH_WATER_KEY};
use crate::store::{QueueId, Snapshot, StoreError};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

impl SledStore {
    /// Topics (in creation order), subscriptions and the highest sequence number: [`crate::store::Store::load`].
    pub(super) fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let mut topics = Vec::new();
        for item in self.topics.iter() {
            let (k, v) = item.map_err(io)?;
            let order = be::<8>(&v, 0)
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(&self.paths.0, "bad topic record"))?;
            let rec: Value = v
                .get(8..)
                .and_then(|b| serde_json::from_slice(b).ok())
                .ok_or_else(|| {
                    corrupt(
                        &self.paths.0,
                        format!("topic '{}' is unreadable", String::from_utf8_lossy(&k)),
                    )
                })?;
            topics.push((order, rec));
        }
        topics.sort_by_key(|(o, _)| *o);
        let mut subscriptions = Vec::new();
        for item in self.subs.iter() {
            let (k, v) = item.map_err(io)?;
            let q = be::<4>(&k, 0)
                .map(u32::from_be_bytes)
                .ok_or_else(|| corrupt(&self.paths.0, "bad subscription key"))?;
            let mut rec: Value = serde_json::from_slice(&v)
                .map_err(|e| corrupt(&self.paths.0, format!("subscription {q}: {e}")))?;
            let topic = rec
                .get("topic")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let record = rec.get_mut("record").map(Value::take).unwrap_or_default();
            subscriptions.push((topic, q, record));
        }
        let high_water = read_u64(&self.events, &HIGH_WATER_KEY)?;
        let max_seq = high_water.max(self.scanned_max_seq.load(Ordering::Relaxed));
        Ok(Snapshot {
            topics: topics.into_iter().map(|(_, v)| v).collect(),
            subscriptions,
            max_seq,
        })
    }

    /// Create or replace a topic record, keeping its creation order; flushed on return.
    pub(super) fn write_topic(&self, key: &str, record: &Value) -> Result<(), StoreError> {
        let _g = crate::sync::lock(&self.topic_order);
        let order = match self.topics.get(key).map_err(io)? {
            Some(v) => be::<8>(&v, 0).map(u64::from_be_bytes).unwrap_or(0),
            None => self.meta.generate_id().map_err(io)?,
        };
        let mut v = order.to_be_bytes().to_vec();
        v.extend_from_slice(record.to_string().as_bytes());
        self.topics.insert(key, v).map_err(io)?;
        self.flush_meta()
    }

    /// Delete a topic record; flushed on return.
    pub(super) fn remove_topic(&self, key: &str) -> Result<(), StoreError> {
        self.topics.remove(key).map_err(io)?;
        self.flush_meta()
    }

    /// Create or replace a subscription record; flushed on return.
    pub(super) fn write_subscription(
        &self,
        topic: &str,
        queue: QueueId,
        record: &Value,
    ) -> Result<(), StoreError> {
        let v = json!({"topic": topic, "record": record}).to_string();
        self.subs
            .insert(queue.to_be_bytes(), v.as_bytes())
            .map_err(io)?;
        self.flush_meta()
    }

    /// Delete a subscription record, then its events (pending and unflushed). The record goes
    /// first: a crash in between leaves orphan events, removed at the next start.
    pub(super) fn remove_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.forget_recovered(queue);
        self.deleted
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(queue);
        // Record first: a crash in between leaves orphan events, removed at the next start.
        self.subs.remove(queue.to_be_bytes()).map_err(io)?;
        self.flush_meta()?;
        let mut freed = 0u64;
        lock_map(&self.unflushed).retain(|(q, _), v| {
            if *q == queue {
                freed += item_cost(v.len());
            }
            *q != queue
        });
        freed += self.remove_queue(queue)?;
        self.sub_live(freed);
        Ok(())
    }

    /// A fresh queue id, never handed out before (the counter is flushed before it is used).
    pub(super) fn new_queue_id(&self) -> Result<QueueId, StoreError> {
        let next = self
            .meta
            .update_and_fetch(b"next_queue", |old| {
                let n = old
                    .and_then(|o| be::<4>(o, 0))
                    .map(u32::from_be_bytes)
                    .unwrap_or(0);
                Some(n.saturating_add(1).to_be_bytes().to_vec())
            })
            .map_err(io)?
            .and_then(|v| be::<4>(&v, 0))
            .map(u32::from_be_bytes)
            .ok_or_else(|| StoreError::Io("queue id counter unreadable".into()))?;
        if next == u32::MAX {
            return Err(StoreError::Io("queue ids exhausted".into()));
        }
        self.flush_meta()?;
        Ok(next)
    }

    /// Stored endpoint-health records, `(destination URL, record)`.
    pub(super) fn health_records(&self) -> Result<Vec<(String, Value)>, StoreError> {
        let mut out = Vec::new();
        for item in self.health.iter() {
            let (k, v) = item.map_err(io)?;
            let url = String::from_utf8(k.to_vec())
                .map_err(|_| corrupt(&self.paths.0, "bad endpoint-health key"))?;
            let rec: Value = serde_json::from_slice(&v)
                .map_err(|e| corrupt(&self.paths.0, format!("endpoint health record: {e}")))?;
            out.push((url, rec));
        }
        Ok(out)
    }

    /// Keep or forget a destination's health record; flushed on return when anything changed.
    pub(super) fn write_endpoint_health(
        &self,
        url: &str,
        record: Option<&Value>,
    ) -> Result<(), StoreError> {
        match record {
            Some(r) => self
                .health
                .insert(url.as_bytes(), r.to_string().as_bytes())
                .map(|_| ())
                .map_err(io)?,
            None => {
                if self.health.remove(url.as_bytes()).map_err(io)?.is_none() {
                    return Ok(()); // nothing stored: no flush needed
                }
            }
        }
        self.flush_meta()
    }

    fn flush_meta(&self) -> Result<(), StoreError> {
        self.meta.flush().map(|_| ()).map_err(io)
    }
}
