//! Opening a sled database and checking its format marker.
//!
//! Invariant: a database that was initialised (its `*.format` marker exists) and opens empty
//! or damaged is an error naming the path, never an empty start.

use super::{corrupt, io};
use crate::store::{QueueId, StoreError};
use std::collections::HashSet;
use std::path::Path;

const FORMAT_KEY: &[u8] = b"format";
const FORMAT_VERSION: &[u8] = b"1";
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Queue ids that a subscription record owns.
pub(super) fn known_queues(subs: &sled::Tree, path: &Path) -> Result<HashSet<QueueId>, StoreError> {
    subs.iter()
        .keys()
        .map(|k| {
            let k = k.map_err(io)?;
            let b: [u8; 4] = k
                .as_ref()
                .try_into()
                .map_err(|_| corrupt(path, "bad subscription key"))?;
            Ok(u32::from_be_bytes(b))
        })
        .collect()
}

/// Open one sled database at `<root>/<name>` (marker `<root>/<name>.format`), checking its
/// format marker.
///
/// # Errors
/// [`StoreError::Corrupt`] naming the path when the database cannot be opened, is damaged, or is
/// empty although it was initialised; [`StoreError::Io`] when another process holds it.
pub fn open_db(
    root: &Path,
    name: &str,
    cache: u64,
    flush_every_ms: u64,
) -> Result<sled::Db, StoreError> {
    let dir = root.join(name);
    let marker = root.join(format!("{name}.format"));
    let initialised = marker.exists();
    if initialised && !dir.is_dir() {
        return Err(corrupt(
            &dir,
            "the database directory is missing although it was initialised (restore it, or delete its parent directory to start empty)",
        ));
    }
    std::fs::create_dir_all(root).map_err(|e| corrupt(root, format!("cannot create: {e}")))?;
    let cfg = sled::Config::new()
        .path(&dir)
        .cache_capacity(cache)
        .mode(sled::Mode::LowSpace)
        .use_compression(false)
        .flush_every_ms((flush_every_ms > 0).then_some(flush_every_ms));
    // sled panics on some kinds of damage instead of returning an error: turn that into the same
    // clear start-up error (with panic=abort builds the panic message is printed and the process
    // exits, which is still not a silent empty start).
    //
    // sled holds an exclusive lock on its files: a previous instance still shutting down (the same
    // process in tests, an exiting container in production) gets a few seconds to let go.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let db = loop {
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cfg.open()))
            .map_err(|_| {
                corrupt(
                    &dir,
                    "sled panicked while opening the database (damaged files)",
                )
            })?;
        match opened {
            Ok(db) => break db,
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::Io(format!(
                        "{}: the database is in use by another process (another gridlet on the same directory?)",
                        dir.display()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(corrupt(&dir, format!("cannot open the database: {e}"))),
        }
    };
    let marks = db.open_tree("gridlet").map_err(io)?;
    match marks.get(FORMAT_KEY).map_err(|e| corrupt(&dir, e))? {
        Some(v) if v.as_ref() == FORMAT_VERSION => {}
        Some(v) => {
            return Err(corrupt(
                &dir,
                format!(
                    "unsupported format version {:?} (this gridlet reads version 1)",
                    String::from_utf8_lossy(&v)
                ),
            ))
        }
        None if initialised => {
            return Err(corrupt(
                &dir,
                "the database is empty although it was initialised: its files are damaged or were replaced (restore them, or delete their parent directory to start empty)",
            ))
        }
        None => {
            marks.insert(FORMAT_KEY, FORMAT_VERSION).map_err(io)?;
            db.flush().map_err(io)?;
            write_marker(&marker)?;
        }
    }
    Ok(db)
}

fn write_marker(path: &Path) -> Result<(), StoreError> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| corrupt(path, e))?;
    f.write_all(b"gridlet sled store, format 1\n")
        .and_then(|_| f.sync_all())
        .map_err(|e| corrupt(path, e))
}
