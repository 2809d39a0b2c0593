//! The metadata as shipped: [`FsMeta`] on the real file system, in a private directory, locked
//! against a second process, never started empty once it was initialised, and moved once from
//! the sled database of earlier releases ([`super::migrate`]).
//!
//! # Layout
//!
//! ```text
//! <persistence__metadataPath>/gridlet-v2/            mode 0700
//!     meta.json      the metadata (FsMeta: replaced whole, through meta.json.new)
//!     meta.format    marker: written once meta.json exists
//!     meta.lock      advisory lock (flock), held while the store is open
//! <persistence__metadataPath>/gridlet-v1.migrated/   the sled database of earlier releases,
//!                                                     moved aside once its contents are in meta.json
//! ```
//!
//! Invariants:
//!
//! * `meta.format` without `meta.json` is an error naming the path, never an empty start; so is
//!   a `gridlet-v1.migrated` with no metadata file (the metadata was moved here, then lost);
//! * a `meta.json` that does not parse, or holds a record of another format version, is
//!   [`StoreError::Corrupt`] naming the file;
//! * while one store holds `meta.lock`, a second open (another process, or the same one) waits
//!   [`LOCK_WAIT`] for it, then fails naming the directory.

use super::{migrate, write_contents, Contents, FsMeta, FILE};
use crate::store::fs::{Fs, RealFs};
use crate::store::StoreError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Directory (under `persistence__metadataPath`) holding the metadata file.
pub const SUBDIR: &str = "gridlet-v2";
/// The marker: written once `meta.json` exists.
pub const MARKER: &str = "meta.format";
/// The lock file.
pub const LOCK: &str = "meta.lock";
/// How long an open waits for another holder of the lock to let go (a previous instance still
/// shutting down: the same process in tests, an exiting container in production).
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Where the metadata comes from when the file does not exist yet.
pub enum Source<F> {
    /// Nothing before: start empty.
    Fresh,
    /// The sled database of an earlier release: read it ([`migrate::read_sled`]).
    Sled(F),
    /// The sled database was moved aside after a migration (this path), so the metadata existed:
    /// refuse.
    Migrated(PathBuf),
}

/// Open (or create, or migrate) `<metadata_path>/gridlet-v2/meta.json`. See the module docs.
///
/// # Errors
/// [`StoreError::Corrupt`] naming the path: the file is missing although it was initialised,
/// unreadable, or of another format, or the sled database to migrate is damaged.
/// [`StoreError::Io`]: another process holds the lock, or the directory cannot be made.
pub fn open(metadata_path: &Path) -> Result<FsMeta, StoreError> {
    open_waiting(metadata_path, LOCK_WAIT)
}

/// [`open`], waiting up to `wait` for the lock.
///
/// # Errors
/// As [`open`].
pub fn open_waiting(metadata_path: &Path, wait: Duration) -> Result<FsMeta, StoreError> {
    let dir = metadata_path.join(SUBDIR);
    private_dir(&dir)?;
    let lock = lock(&dir, wait)?;
    let fs: Arc<dyn Fs> = Arc::new(RealFs);
    let sled = migrate::has_sled(metadata_path);
    let moved = migrate::moved_aside(metadata_path);
    let source = match (sled, moved) {
        (true, _) => Source::Sled(|| migrate::read_sled(metadata_path)),
        (false, Some(p)) => Source::Migrated(p),
        (false, None) => Source::Fresh,
    };
    let migrated = prepare(&*fs, &dir, source)?;
    if sled {
        let to = migrate::set_aside(metadata_path)?;
        match &migrated {
            Some(c) => tracing::info!(
                from = %metadata_path.join(crate::store::sled::SUBDIR).display(),
                to = %dir.join(FILE).display(),
                topics = c.topics.len(),
                subscriptions = c.subs.len(),
                endpoint_health = c.health.len(),
                mqtt = c.mqtt.len(),
                last_queue_id = c.next_queue,
                moved_aside = %to.display(),
                "metadata moved from the sled database of an earlier release"
            ),
            // A crash after the file was written and before the move (or an earlier release
            // started here again after the migration): the file wins, sled is kept aside.
            None => tracing::warn!(
                file = %dir.join(FILE).display(),
                moved_aside = %to.display(),
                "a sled metadata database was found beside the metadata file: it was not read \
                 (the file is newer) and was moved aside"
            ),
        }
    }
    let mut meta = FsMeta::open(fs, dir)?;
    meta._lock = Some(lock);
    Ok(meta)
}

/// Make sure `dir/meta.json` and its marker exist, writing the file from `source` when it does
/// not (each step durable before the next: the file, then the marker). Returns what was
/// migrated, if anything. Every file operation goes through `fs`, so the simulation can cut
/// the power at each step.
///
/// # Errors
/// As [`open`].
pub fn prepare<F>(
    fs: &dyn Fs,
    dir: &Path,
    source: Source<F>,
) -> Result<Option<Contents>, StoreError>
where
    F: FnOnce() -> Result<Contents, StoreError>,
{
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", dir.display()));
    fs.create_dir_all(dir).map_err(io)?;
    let names = fs.list(dir).map_err(io)?;
    let has_file = names.iter().any(|n| n == FILE);
    let has_marker = names.iter().any(|n| n == MARKER);
    let mut migrated = None;
    if !has_file {
        if has_marker {
            return Err(StoreError::Corrupt(format!(
                "{}: the metadata file is missing although it was initialised ({} exists): \
                 restore it, or delete {} to start empty",
                dir.join(FILE).display(),
                dir.join(MARKER).display(),
                dir.display(),
            )));
        }
        let contents = match source {
            Source::Fresh => Contents::default(),
            Source::Sled(read) => {
                let c = read()?;
                migrated = Some(c.clone());
                c
            }
            Source::Migrated(aside) => {
                return Err(StoreError::Corrupt(format!(
                    "{}: the metadata file is missing, but {} shows it was moved there from an \
                     earlier release's database: restore {}, or move {} away to start empty",
                    dir.join(FILE).display(),
                    aside.display(),
                    dir.display(),
                    aside.display(),
                )));
            }
        };
        write_contents(fs, dir, &contents)?;
    }
    if !has_marker {
        let marker = dir.join(MARKER);
        let f = fs.create(&marker).map_err(io)?;
        f.write_at(b"gridlet metadata file, format 1\n", 0)
            .and_then(|()| f.sync_data())
            .and_then(|()| fs.sync_dir(dir))
            .map_err(io)?;
    }
    Ok(migrated)
}

/// Create `dir` (and its parents; its own entry synced), and make it private to this user: the
/// metadata holds subscriptions' destination secrets.
fn private_dir(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |e: std::io::Error| StoreError::Io(format!("{}: cannot create: {e}", dir.display()));
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        // Its entry durable before anything in it is relied on: else a power cut could take the
        // directory, with every acknowledged write in it, and the next start would be empty.
        Ok(()) => match dir.parent() {
            Some(parent) => std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(err),
            None => Ok(()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mode = std::fs::metadata(dir).map_err(err)?.permissions().mode();
            if mode & 0o077 != 0 {
                // Made private again (it was opened up by hand, or made by someone else); a
                // directory gridlet may not change is used as it is, with a warning.
                let private = std::fs::Permissions::from_mode(0o700);
                if let Err(e) = std::fs::set_permissions(dir, private) {
                    tracing::warn!(dir = %dir.display(), mode = format!("{mode:o}"), error = %e,
                        "the metadata directory is readable by other users and cannot be made private");
                }
            }
            Ok(())
        }
        Err(e) => Err(err(e)),
    }
}

/// Take `dir/meta.lock` (an exclusive `flock`), waiting up to `wait`.
fn lock(dir: &Path, wait: Duration) -> Result<std::fs::File, StoreError> {
    use rustix::fs::{flock, FlockOperation};
    let path = dir.join(LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(StoreError::Io(format!(
                    "{}: the metadata is in use by another process (another gridlet on the same \
                     directory?)",
                    dir.display()
                )))
            }
            Err(e) => {
                return Err(StoreError::Io(format!(
                    "{}: cannot lock: {e}",
                    path.display()
                )))
            }
        }
    }
}
