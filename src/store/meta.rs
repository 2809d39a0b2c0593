//! The metadata a store keeps beside its events: topics, subscriptions, queue ids, endpoint
//! health. [`MetaStore`] is what the log store needs of it; `sled` holds it in production
//! ([`super::sled::SledMeta`]), [`FsMeta`] on the storage seam ([`super::fs`]), so that the
//! power-cut simulation cuts metadata and log writes in one fault schedule and tests the order
//! between them (`LogStore::delete_subscription`: the record first).
//!
//! The promise both keep: a write is durable when it returns, whole or not at all.

use super::fs::Fs;
use super::{QueueId, StoreError};
use crate::model::record::{MqttKind, MqttRecord, SubscriptionRecord, TopicRecord};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Topics in creation order, and subscriptions with their queue ids.
pub type MetaSnapshot = (Vec<TopicRecord>, Vec<(QueueId, SubscriptionRecord)>);

/// Metadata: every write durable when it returns.
pub trait MetaStore: Send + Sync + 'static {
    /// Queue ids that a subscription record owns.
    ///
    /// # Errors
    /// Unreadable data.
    fn known_queues(&self) -> Result<HashSet<QueueId>, StoreError>;

    /// Topics (in creation order) and subscriptions.
    ///
    /// # Errors
    /// Unreadable data, or a record this build does not read ([`StoreError::Corrupt`] naming
    /// the database and the record).
    fn snapshot(&self) -> Result<MetaSnapshot, StoreError>;

    /// Create or replace a topic record, keeping its creation order.
    ///
    /// # Errors
    /// Write failure.
    fn write_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError>;

    /// Delete a topic record.
    ///
    /// # Errors
    /// Write failure.
    fn remove_topic(&self, key: &str) -> Result<(), StoreError>;

    /// Create or replace a subscription record.
    ///
    /// # Errors
    /// Write failure.
    fn write_subscription(
        &self,
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError>;

    /// Delete a subscription record.
    ///
    /// # Errors
    /// Write failure.
    fn remove_subscription(&self, queue: QueueId) -> Result<(), StoreError>;

    /// A fresh queue id, never handed out before (durable before it is returned).
    ///
    /// # Errors
    /// Write failure, or the ids are exhausted.
    fn new_queue_id(&self) -> Result<QueueId, StoreError>;

    /// Stored endpoint-health records, `(destination URL, record)`.
    ///
    /// # Errors
    /// Unreadable data.
    fn health_records(&self) -> Result<Vec<(String, Value)>, StoreError>;

    /// Keep or forget a destination's health record.
    ///
    /// # Errors
    /// Write failure.
    fn write_endpoint_health(&self, url: &str, record: Option<&Value>) -> Result<(), StoreError>;

    /// MQTT connections and routes made through the management API, by kind and name.
    ///
    /// # Errors
    /// Unreadable data.
    fn mqtt_records(&self) -> Result<Vec<MqttRecord>, StoreError>;

    /// Keep (`Some`) or forget (`None`) an MQTT connection or route.
    ///
    /// # Errors
    /// Write failure.
    fn write_mqtt_record(
        &self,
        kind: MqttKind,
        name: &str,
        record: Option<&MqttRecord>,
    ) -> Result<(), StoreError>;

    /// Flush (best effort, at a clean stop).
    fn flush(&self) {}
}

/// Everything [`FsMeta`] holds, as one JSON file.
#[derive(Default, Clone, serde::Serialize, serde::Deserialize)]
struct Contents {
    topics: Vec<(String, TopicRecord)>,
    subs: BTreeMap<QueueId, SubscriptionRecord>,
    health: BTreeMap<String, Value>,
    next_queue: QueueId,
    /// By `{kind}/{name}`, the order sled keeps them in.
    #[serde(default)]
    mqtt: BTreeMap<String, MqttRecord>,
}

/// Metadata as one small file on an [`Fs`], replaced whole at each write: written to
/// `meta.json.new`, synced, renamed over `meta.json`, the directory synced. A crash leaves the
/// old file or the new one. For the simulation (and stores that want no sled): management
/// writes are rare, so rewriting the whole file is cheap.
pub struct FsMeta {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    contents: Mutex<Contents>,
}

const FILE: &str = "meta.json";
const NEW: &str = "meta.json.new";

fn io(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("metadata {what}: {e}"))
}

impl FsMeta {
    /// Open (or create) the metadata in `dir` on `fs`; a leftover `meta.json.new` (a crash
    /// before its rename) is ignored.
    ///
    /// # Errors
    /// The directory cannot be created, or the file is unreadable ([`StoreError::Corrupt`]).
    pub fn open(fs: Arc<dyn Fs>, dir: PathBuf) -> Result<Self, StoreError> {
        fs.create_dir_all(&dir).map_err(|e| io("directory", e))?;
        let names = fs.list(&dir).map_err(|e| io("directory", e))?;
        let contents = if names.iter().any(|n| n == FILE) {
            let f = fs.open(&dir.join(FILE)).map_err(|e| io("open", e))?;
            let mut buf = vec![0u8; f.size().map_err(|e| io("size", e))? as usize];
            let n = f.read_at(&mut buf, 0).map_err(|e| io("read", e))?;
            buf.truncate(n);
            serde_json::from_slice(&buf)
                .map_err(|e| StoreError::Corrupt(format!("{}: {e}", dir.join(FILE).display())))?
        } else {
            Contents::default()
        };
        Ok(Self {
            fs,
            dir,
            contents: Mutex::new(contents),
        })
    }

    /// Change the contents and make the change durable; on failure the memory keeps the old
    /// contents.
    fn change(&self, f: impl FnOnce(&mut Contents)) -> Result<(), StoreError> {
        let mut c = crate::sync::lock(&self.contents);
        let mut next = c.clone();
        f(&mut next);
        let bytes = serde_json::to_vec(&next).map_err(|e| io("encode", e))?;
        let new = self.dir.join(NEW);
        let file = self.fs.create(&new).map_err(|e| io("create", e))?;
        file.write_at(&bytes, 0)
            .and_then(|()| file.sync_data())
            .and_then(|()| self.fs.rename(&new, &self.dir.join(FILE)))
            .and_then(|()| self.fs.sync_dir(&self.dir))
            .map_err(|e| io("write", e))?;
        *c = next;
        Ok(())
    }
}

impl MetaStore for FsMeta {
    fn known_queues(&self) -> Result<HashSet<QueueId>, StoreError> {
        Ok(crate::sync::lock(&self.contents)
            .subs
            .keys()
            .copied()
            .collect())
    }

    fn snapshot(&self) -> Result<MetaSnapshot, StoreError> {
        let c = crate::sync::lock(&self.contents);
        Ok((
            c.topics.iter().map(|(_, t)| t.clone()).collect(),
            c.subs.iter().map(|(q, s)| (*q, s.clone())).collect(),
        ))
    }

    fn write_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError> {
        self.change(|c| match c.topics.iter_mut().find(|(k, _)| k == key) {
            Some((_, t)) => *t = record.clone(),
            None => c.topics.push((key.to_string(), record.clone())),
        })
    }

    fn remove_topic(&self, key: &str) -> Result<(), StoreError> {
        self.change(|c| c.topics.retain(|(k, _)| k != key))
    }

    fn write_subscription(
        &self,
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError> {
        self.change(|c| {
            c.subs.insert(queue, record.clone());
        })
    }

    fn remove_subscription(&self, queue: QueueId) -> Result<(), StoreError> {
        self.change(|c| {
            c.subs.remove(&queue);
        })
    }

    fn new_queue_id(&self) -> Result<QueueId, StoreError> {
        let mut id = 0;
        self.change(|c| {
            c.next_queue = c.next_queue.saturating_add(1);
            id = c.next_queue;
        })?;
        if id == QueueId::MAX {
            return Err(StoreError::Io("queue ids exhausted".into()));
        }
        Ok(id)
    }

    fn health_records(&self) -> Result<Vec<(String, Value)>, StoreError> {
        let c = crate::sync::lock(&self.contents);
        Ok(c.health
            .iter()
            .map(|(u, v)| (u.clone(), v.clone()))
            .collect())
    }

    fn write_endpoint_health(&self, url: &str, record: Option<&Value>) -> Result<(), StoreError> {
        self.change(|c| match record {
            Some(r) => {
                c.health.insert(url.to_string(), r.clone());
            }
            None => {
                c.health.remove(url);
            }
        })
    }

    fn mqtt_records(&self) -> Result<Vec<MqttRecord>, StoreError> {
        Ok(crate::sync::lock(&self.contents)
            .mqtt
            .values()
            .cloned()
            .collect())
    }

    fn write_mqtt_record(
        &self,
        kind: MqttKind,
        name: &str,
        record: Option<&MqttRecord>,
    ) -> Result<(), StoreError> {
        let key = format!("{}/{name}", kind.as_str());
        self.change(|c| match record {
            Some(r) => {
                c.mqtt.insert(key, r.clone());
            }
            None => {
                c.mqtt.remove(&key);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::{sub, topic};
    use crate::store::fs::sim::SimFs;

    /// Every write is whole after a cut at any step: the old contents or the new, never a mix
    /// or nothing; a write that returned is there.
    #[test]
    fn a_cut_at_any_step_leaves_the_old_contents_or_the_new() {
        for cut in 1..=6 {
            let fs = SimFs::new(cut);
            let shared: Arc<dyn Fs> = Arc::new(fs.clone());
            let m = FsMeta::open(shared.clone(), "/m".into()).unwrap();
            m.write_topic("t1", &topic("t1")).unwrap();
            m.write_subscription(7, &sub("s")).unwrap();
            fs.crash_at_step(fs.steps() + cut);
            let deleted = m.remove_subscription(7).is_ok();
            if !fs.crashed() {
                fs.power_cut();
            }
            fs.reboot();
            let m = FsMeta::open(shared, "/m".into()).unwrap();
            let (topics, subs) = m.snapshot().unwrap();
            assert_eq!(topics, vec![topic("t1")], "cut at step {cut}");
            if deleted {
                assert!(
                    subs.is_empty(),
                    "cut at step {cut}: a returned delete is durable"
                );
            } else {
                assert!(subs.len() <= 1, "cut at step {cut}");
            }
            let known = m.known_queues().unwrap();
            assert_eq!(known.contains(&7), subs.len() == 1);
        }
    }

    /// API-made MQTT connections and routes are kept across a reopen, in sled's order, and
    /// forgotten when deleted.
    #[test]
    fn mqtt_records_survive_a_reopen_and_are_forgotten() {
        let fs: Arc<dyn Fs> = Arc::new(SimFs::new(1));
        let m = FsMeta::open(fs.clone(), "/m".into()).unwrap();
        let fields = [("url".to_string(), "mqtt://b:1883".to_string())].into();
        let c = MqttRecord::new(MqttKind::Connection, "site", fields);
        let r = MqttRecord::new(MqttKind::Route, "site", Default::default());
        m.write_mqtt_record(MqttKind::Route, "site", Some(&r))
            .unwrap();
        m.write_mqtt_record(MqttKind::Connection, "site", Some(&c))
            .unwrap();
        let m = FsMeta::open(fs, "/m".into()).unwrap();
        assert_eq!(m.mqtt_records().unwrap(), vec![c.clone(), r]);
        m.write_mqtt_record(MqttKind::Route, "site", None).unwrap();
        assert_eq!(m.mqtt_records().unwrap(), vec![c]);
    }
}
