//! The metadata a store keeps beside its events: topics, subscriptions, queue ids, endpoint
//! health, MQTT connections and routes. [`MetaStore`] is what the log store needs of it;
//! [`FsMeta`] holds it as one JSON file on the storage seam ([`super::fs`]): in production on the
//! real file system ([`disk`]: `<persistence__metadataPath>/gridlet-v2/meta.json`, locked,
//! migrated once from the sled database of earlier releases by [`migrate`]), and in the power-cut
//! simulation on the simulated disk, so that metadata and log writes are cut in one fault
//! schedule and the order between them is tested (`LogStore::delete_subscription`: the record
//! first).
//!
//! The promise: a write is durable when it returns, whole or not at all.

pub mod disk;
#[cfg(test)]
mod disk_tests;
pub mod migrate;

use super::fs::Fs;
use super::{QueueId, StoreError};
use crate::model::record::{MqttKind, MqttRecord, SubscriptionRecord, TopicRecord, RECORD_VERSION};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
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

/// Everything [`FsMeta`] holds, as one JSON file (`docs/DURABILITY.md`, metadata).
#[derive(Default, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Contents {
    /// Topics by key, in creation order.
    pub topics: Vec<(String, TopicRecord)>,
    /// Subscriptions by queue id.
    pub subs: BTreeMap<QueueId, SubscriptionRecord>,
    /// Endpoint-health records by destination URL.
    pub health: BTreeMap<String, Value>,
    /// The last queue id handed out: the next is one more, so no id is used twice.
    pub next_queue: QueueId,
    /// MQTT connections and routes by `{kind}/{name}`, the order sled kept them in.
    #[serde(default)]
    pub mqtt: BTreeMap<String, MqttRecord>,
}

impl Contents {
    /// Every record is of the format version this build reads; else why not, naming the record.
    fn check_versions(&self) -> Result<(), String> {
        let bad = |what: String, v: u32| {
            (v != RECORD_VERSION).then(|| {
                format!(
                    "{what}: record format version {v} is not one this build reads (version \
                     {RECORD_VERSION}): it was written by another gridlet release; run that \
                     release, or move the metadata directory aside to start empty"
                )
            })
        };
        let topics = self
            .topics
            .iter()
            .map(|(k, t)| bad(format!("topic '{k}'"), t.v));
        let subs = self
            .subs
            .iter()
            .map(|(q, s)| bad(format!("subscription {q}"), s.v));
        let mqtt = self.mqtt.iter().map(|(k, m)| bad(format!("MQTT {k}"), m.v));
        match topics.chain(subs).chain(mqtt).flatten().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Metadata as one small file on an [`Fs`], replaced whole at each write: written to
/// `meta.json.new`, synced, renamed over `meta.json`, the directory synced. A crash leaves the
/// old file or the new one. Management writes are rare and the file is small, so rewriting it
/// whole is cheap.
pub struct FsMeta {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    contents: Mutex<Contents>,
    /// The lock file held while open ([`disk`]); `None` on the simulated disk.
    _lock: Option<std::fs::File>,
}

/// The metadata file.
pub const FILE: &str = "meta.json";
const NEW: &str = "meta.json.new";

fn io(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("metadata {what}: {e}"))
}

/// Write `bytes` as `dir/meta.json` durably: to `meta.json.new`, synced, renamed over
/// `meta.json`, the directory synced. A crash leaves the old file or the new one (and maybe a
/// `meta.json.new`, which [`FsMeta::open`] removes).
fn write_file(fs: &dyn Fs, dir: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let new = dir.join(NEW);
    let file = fs.create(&new).map_err(|e| io("create", e))?;
    let written = file
        .write_at(bytes, 0)
        .and_then(|()| file.sync_data())
        .and_then(|()| fs.rename(&new, &dir.join(FILE)))
        .and_then(|()| fs.sync_dir(dir));
    if let Err(e) = written {
        // Best effort: the next write creates it again.
        let _ = fs.remove(&new);
        return Err(io("write", e));
    }
    Ok(())
}

/// Encode and write `contents` ([`write_file`]).
fn write_contents(fs: &dyn Fs, dir: &Path, contents: &Contents) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(contents).map_err(|e| io("encode", e))?;
    write_file(fs, dir, &bytes)
}

impl FsMeta {
    /// Open (or create) the metadata in `dir` on `fs`; a leftover `meta.json.new` (a crash
    /// before its rename) is removed.
    ///
    /// # Errors
    /// The directory cannot be created, or the file is unreadable or holds a record of another
    /// format version ([`StoreError::Corrupt`] naming the file).
    pub fn open(fs: Arc<dyn Fs>, dir: PathBuf) -> Result<Self, StoreError> {
        fs.create_dir_all(&dir).map_err(|e| io("directory", e))?;
        let names = fs.list(&dir).map_err(|e| io("directory", e))?;
        if names.iter().any(|n| n == NEW) {
            fs.remove(&dir.join(NEW))
                .map_err(|e| io("leftover removal", e))?;
        }
        let contents = if names.iter().any(|n| n == FILE) {
            read_contents(&*fs, &dir)?
        } else {
            Contents::default()
        };
        Ok(Self {
            fs,
            dir,
            contents: Mutex::new(contents),
            _lock: None,
        })
    }

    /// Change the contents and make the change durable; on failure the memory keeps the old
    /// contents.
    fn change(&self, f: impl FnOnce(&mut Contents)) -> Result<(), StoreError> {
        let mut c = crate::sync::lock(&self.contents);
        let mut next = c.clone();
        f(&mut next);
        write_contents(&*self.fs, &self.dir, &next)?;
        *c = next;
        Ok(())
    }

    /// A copy of everything held (tests).
    pub fn contents(&self) -> Contents {
        crate::sync::lock(&self.contents).clone()
    }
}

/// Read and check `dir/meta.json`.
fn read_contents(fs: &dyn Fs, dir: &Path) -> Result<Contents, StoreError> {
    let path = dir.join(FILE);
    let corrupt = |e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!(
            "{}: {e} (restore the file from a backup, or move the metadata directory aside to \
             start empty)",
            path.display()
        ))
    };
    let f = fs.open(&path).map_err(|e| io("open", e))?;
    let mut buf = vec![0u8; f.size().map_err(|e| io("size", e))? as usize];
    let n = f.read_at(&mut buf, 0).map_err(|e| io("read", e))?;
    buf.truncate(n);
    let contents: Contents = serde_json::from_slice(&buf).map_err(|e| corrupt(&e))?;
    contents.check_versions().map_err(|e| corrupt(&e))?;
    Ok(contents)
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
