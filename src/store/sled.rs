//! The sled (0.34.7) metadata database of earlier releases ([`SledMeta`]). gridlet keeps its
//! metadata in one file now (`store::meta`); this database is opened only to move it there once
//! (`store::meta::migrate`), and its writer stays for the tests that make one as those releases
//! did. Persisted events and dead letters are in gridlet's own logs (`store::log`).
//!
//! # Layout
//!
//! ```text
//! <persistence__metadataPath>/gridlet-v1/meta/        sled db: trees `topics`, `subs`, `health`,
//!                                                      `gridlet`
//! <persistence__metadataPath>/gridlet-v1/meta.format  marker: written once the db is initialised
//! ```
//!
//! * `topics`: topic key → `order u64 BE ‖ TopicRecord JSON` (order = creation order).
//! * `subs`: `queue_id u32 BE` → `SubscriptionRecord JSON` (`crate::model::record`: typed,
//!   with a format version `v`).
//! * `health`: destination URL → endpoint-health record JSON (disabled or frozen endpoints only).
//!
//! Metadata writes are flushed before the call returns. A database that cannot be opened, or
//! that is empty although its `*.format` marker says it was initialised, is reported as
//! [`StoreError::Corrupt`] naming the path: gridlet refuses to start rather than start empty.

mod codec;
mod metadata;
mod open;

use crate::store::StoreError;
pub use metadata::{Export, SledMeta};
pub use open::open_db;
use std::path::Path;

/// Directory (under `persistence__metadataPath`) holding the metadata database.
pub const SUBDIR: &str = "gridlet-v1";

fn io(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::Io(other.to_string()),
    }
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{}: {what}", path.display()))
}
