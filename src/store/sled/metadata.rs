//! Metadata: topics, subscriptions, queue ids and endpoint-health records, in the metadata
//! database (trees `topics`, `subs`, `health`; layout in the [`super`] docs).
//!
//! Invariant: every write here is flushed before it returns (management calls are rare and
//! must survive a crash once answered).

use super::codec::be;
use super::{corrupt, io};
use crate::store::{QueueId, StoreError};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const META_CACHE_BYTES: u64 = 1 << 20;

/// Topics, subscriptions (with their stored subscriptions' queue ids) in creation order.
pub type MetaSnapshot = (Vec<Value>, Vec<(String, QueueId, Value)>);

/// The metadata database.
pub struct SledMeta {
    meta: sled::Db,
    topics: sled::Tree,
    subs: sled::Tree,
    /// Endpoint-health records (destination URL → JSON).
    health: sled::Tree,
    /// Serialises `write_topic` order assignment.
    topic_order: Mutex<()>,
    path: PathBuf,
}

impl SledMeta {
    /// Open (or create) `<metadata_path>/gridlet-v1/meta`.
    ///
    /// # Errors
    /// As [`super::open_db`].
    pub fn open(metadata_path: &Path, flush_every_ms: u64) -> Result<Self, StoreError> {
        let meta = super::open_db(
            &metadata_path.join(super::SUBDIR),
            "meta",
            META_CACHE_BYTES,
            flush_every_ms,
        )?;
        Ok(Self {
            topics: meta.open_tree("topics").map_err(io)?,
            subs: meta.open_tree("subs").map_err(io)?,
            health: meta.open_tree("health").map_err(io)?,
            meta,
            topic_order: Mutex::new(()),
            path: metadata_path.to_path_buf(),
        })
    }

    /// Queue ids that a subscription record owns.
    ///
    /// # Errors
    /// Unreadable data.
    pub fn known_queues(&self) -> Result<HashSet<QueueId>, StoreError> {
        super::open::known_queues(&self.subs, &self.path)
    }

    /// Flush (best effort, at shutdown).
    pub fn flush(&self) {
        let _ = self.meta.flush();
    }

    /// Topics (in creation order) and subscriptions.
    ///
    /// # Errors
    /// Unreadable data.
    pub fn snapshot(&self) -> Result<MetaSnapshot, StoreError> {
        let mut topics = Vec::new();
        for item in self.topics.iter() {
            let (k, v) = item.map_err(io)?;
            let order = be::<8>(&v, 0)
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(&self.path, "bad topic record"))?;
            let rec: Value = v
                .get(8..)
                .and_then(|b| serde_json::from_slice(b).ok())
                .ok_or_else(|| {
                    corrupt(
                        &self.path,
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
                .ok_or_else(|| corrupt(&self.path, "bad subscription key"))?;
            let mut rec: Value = serde_json::from_slice(&v)
                .map_err(|e| corrupt(&self.path, format!("subscription {q}: {e}")))?;
            let topic = rec
                .get("topic")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let record = rec.get_mut("record").map(Value::take).unwrap_or_default();
            subscriptions.push((topic, q, record));
        }
        Ok((topics.into_iter().map(|(_, v)| v).collect(), subscriptions))
    }

    /// Create or replace a topic record, keeping its creation order; flushed on return.
    pub fn write_topic(&self, key: &str, record: &Value) -> Result<(), StoreError> {
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
    pub fn remove_topic(&self, key: &str) -> Result<(), StoreError> {
        self.topics.remove(key).map_err(io)?;
        self.flush_meta()
    }

    /// Create or replace a subscription record; flushed on return.
    pub fn write_subscription(
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

    /// Delete a subscription record; flushed on return.
    ///
    /// # Errors
    /// Write failure.
    pub fn remove_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.subs.remove(queue.to_be_bytes()).map_err(io)?;
        self.flush_meta()
    }

    /// A fresh queue id, never handed out before (the counter is flushed before it is used).
    pub fn new_queue_id(&self) -> Result<QueueId, StoreError> {
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
    pub fn health_records(&self) -> Result<Vec<(String, Value)>, StoreError> {
        let mut out = Vec::new();
        for item in self.health.iter() {
            let (k, v) = item.map_err(io)?;
            let url = String::from_utf8(k.to_vec())
                .map_err(|_| corrupt(&self.path, "bad endpoint-health key"))?;
            let rec: Value = serde_json::from_slice(&v)
                .map_err(|e| corrupt(&self.path, format!("endpoint health record: {e}")))?;
            out.push((url, rec));
        }
        Ok(out)
    }

    /// Keep or forget a destination's health record; flushed on return when anything changed.
    pub fn write_endpoint_health(
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
