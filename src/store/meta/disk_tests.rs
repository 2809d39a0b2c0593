//! The metadata as shipped: migration from sled, its crash points, the marker, the lock.

use super::disk::{self, prepare, Source, MARKER, SUBDIR};
use super::migrate::MIGRATED;
use super::{Contents, FsMeta, MetaStore, FILE};
use crate::model::record::{MqttKind, MqttRecord};
use crate::store::contract::{sub, topic};
use crate::store::fs::sim::SimFs;
use crate::store::fs::Fs;
use crate::store::sled::SledMeta;
use crate::store::StoreError;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A sled database as earlier releases left it: topics created out of name order, a deleted
/// subscription (its queue id must not come back), health and MQTT records.
fn old_database(path: &Path) -> Contents {
    let m = SledMeta::open(path, 0).unwrap();
    m.write_topic("zeta", &topic("zeta")).unwrap();
    m.write_topic("alpha", &topic("alpha")).unwrap();
    let q1 = m.new_queue_id().unwrap();
    m.write_subscription(q1, &sub("s1")).unwrap();
    let q2 = m.new_queue_id().unwrap();
    m.write_subscription(q2, &sub("gone")).unwrap();
    let q3 = m.new_queue_id().unwrap();
    m.write_subscription(q3, &sub("s3")).unwrap();
    m.remove_subscription(q3).unwrap();
    let health = json!({"state": "Frozen", "consecutiveFailures": 3});
    m.write_endpoint_health("http://x/h", Some(&health))
        .unwrap();
    let fields = [("url".to_string(), "mqtt://b:1883".to_string())].into();
    let c = MqttRecord::new(MqttKind::Connection, "site", fields);
    m.write_mqtt_record(MqttKind::Connection, "site", Some(&c))
        .unwrap();
    Contents {
        topics: vec![
            ("zeta".into(), topic("zeta")),
            ("alpha".into(), topic("alpha")),
        ],
        subs: [(q1, sub("s1")), (q2, sub("gone"))].into(),
        health: [("http://x/h".to_string(), health)].into(),
        next_queue: q3,
        mqtt: [("connection/site".to_string(), c)].into(),
    }
}

#[test]
fn an_old_sled_database_is_moved_whole_and_set_aside_and_ids_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let expected = old_database(dir.path());
    assert_eq!(expected.next_queue, 3);
    let m = disk::open(dir.path()).unwrap();
    assert_eq!(m.contents(), expected);
    let (topics, _) = m.snapshot().unwrap();
    assert_eq!(
        topics,
        vec![topic("zeta"), topic("alpha")],
        "creation order"
    );
    assert_eq!(
        m.new_queue_id().unwrap(),
        4,
        "a queue id is never handed out twice"
    );
    assert!(!dir.path().join("gridlet-v1").exists());
    assert!(
        dir.path().join(MIGRATED).join("meta").is_dir(),
        "nothing deleted"
    );
    assert!(dir.path().join(MIGRATED).join("meta.format").exists());
    drop(m);
    // Reopened: the file, not sled; the id handed out is kept.
    let m = disk::open(dir.path()).unwrap();
    assert_eq!(m.contents().next_queue, 4);
    assert_eq!(m.contents().subs, expected.subs);
}

#[test]
fn a_damaged_sled_database_stops_the_migration_naming_it_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    old_database(dir.path());
    let db = dir.path().join("gridlet-v1").join("meta");
    let file = db.join("db");
    let len = std::fs::metadata(&file).unwrap().len() as usize;
    std::fs::write(&file, vec![0xa5u8; len.max(4096)]).unwrap();
    let e = disk::open(dir.path()).err().unwrap();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
    assert!(e.to_string().contains(&db.display().to_string()), "{e}");
    assert!(dir.path().join("gridlet-v1").exists());
    assert!(!dir.path().join(SUBDIR).join(FILE).exists());
}

/// The migration cut at every step of its writes: the next start migrates again (sled is still
/// there) or finds the whole file; either way every record is there. A cut after the file is
/// whole but before sled was moved aside is the same as sled moved aside: the file wins.
#[test]
fn a_cut_at_any_step_of_the_migration_leaves_sled_or_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let old = old_database(dir.path());
    let meta = PathBuf::from("/m");
    let mut finished = false;
    for cut in 1..=20 {
        let fs = SimFs::new(cut);
        fs.crash_at_step(fs.steps() + cut);
        let first = prepare(&fs, &meta, Source::Sled(|| Ok(old.clone())));
        if !fs.crashed() {
            fs.power_cut();
        }
        fs.reboot();
        // sled moved aside only once the first run returned.
        let next = match first {
            Ok(_) => Source::Migrated(dir.path().join(MIGRATED)),
            Err(_) => Source::Sled(|| Ok(old.clone())),
        };
        if first.is_ok() && cut > 1 {
            finished = true;
        }
        prepare(&fs, &meta, next).unwrap_or_else(|e| panic!("cut at step {cut}: {e}"));
        let shared: Arc<dyn Fs> = Arc::new(fs.clone());
        let m = FsMeta::open(shared, meta.clone()).unwrap();
        assert_eq!(m.contents(), old, "cut at step {cut}");
    }
    assert!(finished, "the cuts went past the last step");
}

#[test]
fn initialised_but_missing_or_unreadable_metadata_refuses_to_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let m = disk::open(dir.path()).unwrap();
    m.write_topic("t1", &topic("t1")).unwrap();
    drop(m);
    let root = dir.path().join(SUBDIR);
    let file = root.join(FILE);
    assert!(root.join(MARKER).exists());
    // Unparsable.
    std::fs::write(&file, b"{\"topics\": [").unwrap();
    let e = disk::open(dir.path()).err().unwrap();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e}");
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    // A record of another format version.
    let mut c = Contents::default();
    c.topics.push(("t1".into(), topic("t1")));
    c.topics[0].1.v = 2;
    std::fs::write(&file, serde_json::to_vec(&c).unwrap()).unwrap();
    let e = disk::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("topic 't1'") && e.contains("version 2"), "{e}");
    assert!(e.contains(&file.display().to_string()), "{e}");
    // Missing, although the marker says it was written.
    std::fs::remove_file(&file).unwrap();
    let e = disk::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("missing although it was initialised"), "{e}");
    assert!(!file.exists(), "nothing was written over it");
    // The whole directory gone after a migration: refused too.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::create_dir_all(dir.path().join(MIGRATED)).unwrap();
    let e = disk::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains(MIGRATED), "{e}");
}

#[test]
fn a_crash_after_the_file_before_the_marker_or_the_move_aside_starts_on_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let old = old_database(dir.path());
    let root = dir.path().join(SUBDIR);
    std::fs::create_dir_all(&root).unwrap();
    // The file whole, no marker, sled still in place; one record differs so the test can tell
    // which was read.
    let mut newer = old.clone();
    newer.topics.pop();
    std::fs::write(root.join(FILE), serde_json::to_vec(&newer).unwrap()).unwrap();
    // And a write cut before its rename, whose file the real disk kept.
    std::fs::write(root.join("meta.json.new"), b"{\"topi").unwrap();
    let m = disk::open(dir.path()).unwrap();
    assert_eq!(m.contents(), newer, "the file wins");
    assert!(!root.join("meta.json.new").exists());
    m.write_topic("t9", &topic("t9")).unwrap();
    m.remove_topic("t9").unwrap();
    assert!(root.join(MARKER).exists());
    assert!(dir.path().join(MIGRATED).is_dir());
    drop(m);
    // An earlier release started here meanwhile and made a database again: set aside too.
    SledMeta::open(dir.path(), 0).unwrap();
    let m = disk::open(dir.path()).unwrap();
    assert_eq!(m.contents(), newer);
    assert!(dir.path().join(format!("{MIGRATED}.2")).is_dir());
}

#[test]
fn a_second_open_waits_for_the_lock_then_is_refused_and_the_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let m = disk::open(dir.path()).unwrap();
    let root = dir.path().join(SUBDIR);
    let mode = std::fs::metadata(&root).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let e = disk::open_waiting(dir.path(), std::time::Duration::ZERO)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("in use by another process"), "{e}");
    assert!(e.contains(&root.display().to_string()), "{e}");
    drop(m);
    // Opened up by hand: private again at the next open.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    disk::open_waiting(dir.path(), std::time::Duration::ZERO).unwrap();
    let mode = std::fs::metadata(&root).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}
