//! Metadata: topics, subscriptions, queue ids, endpoint-health records and the MQTT connections
//! and routes made through the API, in the metadata database (trees `topics`, `subs`, `health`,
//! `mqtt`; layout in the [`super`] docs). Topics and
//! subscriptions are their typed, versioned records (`crate::model::record`), as JSON; a
//! record of another version is refused at start-up, naming the database and the record.
//!
//! Invariant: every write here is flushed before it returns (management calls are rare and
//! must survive a crash once answered).

use super::codec::be;
use super::{corrupt, io};
use crate::model::record::{check_version, MqttKind, MqttRecord, SubscriptionRecord, TopicRecord};
use crate::store::{QueueId, StoreError};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const META_CACHE_BYTES: u64 = 1 << 20;

/// Topics in creation order, and subscriptions with their queue ids.
pub type MetaSnapshot = (Vec<TopicRecord>, Vec<(QueueId, SubscriptionRecord)>);

/// Everything the database holds, for the move to the metadata file
/// (`crate::store::meta::migrate`).
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// Topics by key, in creation order.
    pub topics: Vec<(String, TopicRecord)>,
    /// Subscriptions by queue id.
    pub subs: Vec<(QueueId, SubscriptionRecord)>,
    /// Endpoint-health records by destination URL.
    pub health: Vec<(String, Value)>,
    /// MQTT records by `{kind}/{name}`, in key order.
    pub mqtt: Vec<(String, MqttRecord)>,
    /// The last queue id handed out (at least the largest subscription's).
    pub last_queue: QueueId,
}

/// A record's bytes (JSON, with its format version).
fn encode(record: &impl serde::Serialize) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(record).map_err(|e| StoreError::Io(format!("cannot encode a record: {e}")))
}

/// A record from its bytes, once its format version is one this build reads.
fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    check_version(bytes)?;
    serde_json::from_slice(bytes).map_err(|e| format!("unreadable record: {e}"))
}

/// The metadata database.
pub struct SledMeta {
    meta: sled::Db,
    topics: sled::Tree,
    subs: sled::Tree,
    /// Endpoint-health records (destination URL → JSON).
    health: sled::Tree,
    /// MQTT connections and routes (`connection/{name}`, `route/{name}` → record).
    mqtt: sled::Tree,
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
            mqtt: meta.open_tree("mqtt").map_err(io)?,
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
    /// Unreadable data, or a record this build does not read (another format version, or the
    /// earlier development format): [`StoreError::Corrupt`] naming the database and the record,
    /// and what to do.
    pub fn snapshot(&self) -> Result<MetaSnapshot, StoreError> {
        let db = self.path.join(super::SUBDIR).join("meta");
        let mut topics = Vec::new();
        for item in self.topics.iter() {
            let (k, v) = item.map_err(io)?;
            let what = || format!("topic '{}'", String::from_utf8_lossy(&k));
            let order = be::<8>(&v, 0)
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(&db, format!("{}: bad record", what())))?;
            let rec: TopicRecord = decode(v.get(8..).unwrap_or_default())
                .map_err(|e| corrupt(&db, format!("{}: {e}", what())))?;
            topics.push((order, rec));
        }
        topics.sort_by_key(|(o, _)| *o);
        let mut subscriptions = Vec::new();
        for item in self.subs.iter() {
            let (k, v) = item.map_err(io)?;
            let q = be::<4>(&k, 0)
                .map(u32::from_be_bytes)
                .ok_or_else(|| corrupt(&db, "bad subscription key"))?;
            let rec: SubscriptionRecord =
                decode(&v).map_err(|e| corrupt(&db, format!("subscription {q}: {e}")))?;
            subscriptions.push((q, rec));
        }
        Ok((topics.into_iter().map(|(_, v)| v).collect(), subscriptions))
    }

    /// Everything held ([`Export`]).
    ///
    /// # Errors
    /// As [`SledMeta::snapshot`]: unreadable data, or a record this build does not read.
    pub fn export(&self) -> Result<Export, StoreError> {
        let db = self.path.join(super::SUBDIR).join("meta");
        let mut topics = Vec::new();
        for item in self.topics.iter() {
            let (k, v) = item.map_err(io)?;
            let key = String::from_utf8(k.to_vec()).map_err(|_| corrupt(&db, "bad topic key"))?;
            let order = be::<8>(&v, 0)
                .map(u64::from_be_bytes)
                .ok_or_else(|| corrupt(&db, format!("topic '{key}': bad record")))?;
            let rec: TopicRecord = decode(v.get(8..).unwrap_or_default())
                .map_err(|e| corrupt(&db, format!("topic '{key}': {e}")))?;
            topics.push((order, key, rec));
        }
        topics.sort_by_key(|(o, _, _)| *o);
        let (_, subs) = self.snapshot()?;
        let mut mqtt = Vec::new();
        for item in self.mqtt.iter() {
            let (k, v) = item.map_err(io)?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let rec: MqttRecord =
                decode(&v).map_err(|e| corrupt(&db, format!("MQTT {key}: {e}")))?;
            mqtt.push((key, rec));
        }
        let counter = match self.meta.get(b"next_queue").map_err(io)? {
            Some(v) => be::<4>(&v, 0)
                .map(u32::from_be_bytes)
                .ok_or_else(|| corrupt(&db, "queue id counter unreadable"))?,
            None => 0,
        };
        // The counter is flushed before an id is used, so it covers every record; the largest
        // record is taken too, in case.
        let last_queue = subs.iter().map(|(q, _)| *q).fold(counter, QueueId::max);
        Ok(Export {
            topics: topics.into_iter().map(|(_, k, r)| (k, r)).collect(),
            subs,
            health: self.health_records()?,
            mqtt,
            last_queue,
        })
    }

    /// Create or replace a topic record, keeping its creation order; flushed on return.
    pub fn write_topic(&self, key: &str, record: &TopicRecord) -> Result<(), StoreError> {
        let _g = crate::sync::lock(&self.topic_order);
        let order = match self.topics.get(key).map_err(io)? {
            Some(v) => be::<8>(&v, 0).map(u64::from_be_bytes).unwrap_or(0),
            None => self.meta.generate_id().map_err(io)?,
        };
        let mut v = order.to_be_bytes().to_vec();
        v.extend_from_slice(&encode(record)?);
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
        queue: QueueId,
        record: &SubscriptionRecord,
    ) -> Result<(), StoreError> {
        self.subs
            .insert(queue.to_be_bytes(), encode(record)?)
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

    /// The MQTT connections and routes made through the API.
    ///
    /// # Errors
    /// Unreadable data, or a record this build does not read (naming the database and the
    /// record).
    pub fn mqtt_records(&self) -> Result<Vec<MqttRecord>, StoreError> {
        let db = self.path.join(super::SUBDIR).join("meta");
        let mut out = Vec::new();
        for item in self.mqtt.iter() {
            let (k, v) = item.map_err(io)?;
            let rec: MqttRecord = decode(&v)
                .map_err(|e| corrupt(&db, format!("MQTT {}: {e}", String::from_utf8_lossy(&k))))?;
            out.push(rec);
        }
        Ok(out)
    }

    /// Keep or forget an MQTT connection or route; flushed on return.
    ///
    /// # Errors
    /// Write failure.
    pub fn write_mqtt_record(
        &self,
        kind: MqttKind,
        name: &str,
        record: Option<&MqttRecord>,
    ) -> Result<(), StoreError> {
        let key = format!("{}/{name}", kind.as_str());
        match record {
            Some(r) => self.mqtt.insert(key, encode(r)?).map(|_| ()).map_err(io)?,
            None => self.mqtt.remove(key).map(|_| ()).map_err(io)?,
        }
        self.flush_meta()
    }

    fn flush_meta(&self) -> Result<(), StoreError> {
        self.meta.flush().map(|_| ()).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::{sub, topic};

    #[test]
    fn records_round_trip_and_other_formats_are_refused_naming_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let m = SledMeta::open(dir.path(), 0).unwrap();
        m.write_topic("t1", &topic("t1")).unwrap();
        m.write_subscription(7, &sub("s")).unwrap();
        assert_eq!(
            m.snapshot().unwrap(),
            (vec![topic("t1")], vec![(7, sub("s"))])
        );
        let db = dir.path().join("gridlet-v1").join("meta");
        // A record of the earlier development format (the API's JSON, no version).
        m.subs
            .insert(
                8u32.to_be_bytes(),
                br#"{"topic":"t1","record":{"name":"old"}}"#.as_slice(),
            )
            .unwrap();
        let e = m.snapshot().unwrap_err().to_string();
        assert!(e.contains(&db.display().to_string()), "{e}");
        assert!(e.contains("subscription 8"), "{e}");
        assert!(e.contains("earlier development format"), "{e}");
        // A record of a version this build does not know.
        let mut newer = serde_json::to_value(sub("s")).unwrap();
        newer["v"] = 2.into();
        m.subs
            .insert(8u32.to_be_bytes(), newer.to_string().as_bytes())
            .unwrap();
        let e = m.snapshot().unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");
        // An old topic record.
        m.subs.remove(8u32.to_be_bytes()).unwrap();
        let mut v = 99u64.to_be_bytes().to_vec();
        v.extend_from_slice(br#"{"name":"t2","properties":{"inputSchema":"EventGridSchema"}}"#);
        m.topics.insert("t2", v).unwrap();
        let e = m.snapshot().unwrap_err().to_string();
        assert!(
            e.contains("topic 't2'") && e.contains("earlier development format"),
            "{e}"
        );
    }

    #[test]
    fn mqtt_records_round_trip_and_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let m = SledMeta::open(dir.path(), 0).unwrap();
        let fields = [("url".to_string(), "mqtt://b:1883".to_string())].into();
        let c = MqttRecord::new(MqttKind::Connection, "site", fields);
        let r = MqttRecord::new(MqttKind::Route, "site", Default::default());
        m.write_mqtt_record(MqttKind::Connection, "site", Some(&c))
            .unwrap();
        m.write_mqtt_record(MqttKind::Route, "site", Some(&r))
            .unwrap();
        drop(m);
        let m = SledMeta::open(dir.path(), 0).unwrap();
        assert_eq!(m.mqtt_records().unwrap(), vec![c.clone(), r]);
        m.write_mqtt_record(MqttKind::Route, "site", None).unwrap();
        assert_eq!(m.mqtt_records().unwrap(), vec![c]);
    }
}
