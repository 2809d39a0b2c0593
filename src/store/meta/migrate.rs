//! The one move of metadata from the sled database of earlier releases
//! (`<persistence__metadataPath>/gridlet-v1/meta`, marker `gridlet-v1/meta.format`) to the
//! metadata file ([`super::disk`]).
//!
//! The order, each step durable before the next:
//!
//! 1. read everything from sled ([`read_sled`]): topics in creation order, subscriptions with
//!    their queue ids, the last queue id handed out, endpoint health, MQTT records;
//! 2. write `gridlet-v2/meta.json`, then its marker ([`super::disk::prepare`]);
//! 3. rename `gridlet-v1` to `gridlet-v1.migrated` and sync the parent directory
//!    ([`set_aside`]): an earlier release started here finds no database of its own rather than
//!    stale metadata, and nothing is deleted.
//!
//! A crash before 2 ends leaves sled as it was and no metadata file: the next start migrates
//! again. A crash after leaves the complete file: the next start uses it and moves sled aside.
//! A damaged sled database stops the start ([`StoreError::Corrupt`] naming it), as it did.
//!
//! sled is opened here only. Opening it starts its I/O thread pool (seven threads that live as
//! long as the process), so the first start after an upgrade carries them until the next
//! restart; a start without a sled database never opens it.

use super::Contents;
use crate::store::sled::{SledMeta, SUBDIR};
use crate::store::StoreError;
use std::path::{Path, PathBuf};

/// What the sled database is renamed to once migrated (with `.2`, `.3`… if that exists).
pub const MIGRATED: &str = "gridlet-v1.migrated";

/// Whether `<metadata_path>/gridlet-v1` holds a sled metadata database or its marker.
pub fn has_sled(metadata_path: &Path) -> bool {
    let old = metadata_path.join(SUBDIR);
    old.join("meta.format").exists() || old.join("meta").exists()
}

/// The first `gridlet-v1.migrated*` directory under `metadata_path`, if any.
pub fn moved_aside(metadata_path: &Path) -> Option<PathBuf> {
    let first = metadata_path.join(MIGRATED);
    first.exists().then_some(first)
}

/// Everything in the sled database (checked as sled's reads always were: a damaged database or
/// a record of another format is [`StoreError::Corrupt`] naming it).
///
/// # Errors
/// As above; [`StoreError::Io`] when another process holds the database.
pub fn read_sled(metadata_path: &Path) -> Result<Contents, StoreError> {
    let e = SledMeta::open(metadata_path, 0)?.export()?;
    Ok(Contents {
        topics: e.topics,
        subs: e.subs.into_iter().collect(),
        health: e.health.into_iter().collect(),
        next_queue: e.last_queue,
        mqtt: e.mqtt.into_iter().collect(),
    })
}

/// Rename `<metadata_path>/gridlet-v1` to `gridlet-v1.migrated` (or the first free
/// `gridlet-v1.migrated.N`), then sync `metadata_path`. Returns the new path.
///
/// # Errors
/// The rename or the sync failed.
pub fn set_aside(metadata_path: &Path) -> Result<PathBuf, StoreError> {
    let from = metadata_path.join(SUBDIR);
    let err = |e: std::io::Error| {
        StoreError::Io(format!("{}: cannot move it aside: {e}", from.display()))
    };
    let mut to = metadata_path.join(MIGRATED);
    let mut n = 1;
    while to.exists() {
        n += 1;
        to = metadata_path.join(format!("{MIGRATED}.{n}"));
    }
    std::fs::rename(&from, &to).map_err(err)?;
    std::fs::File::open(metadata_path)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(to)
}
