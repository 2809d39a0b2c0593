//! Opening the log store: the metadata (migrating sled's once), the event log and the dead
//! letters assembled on one file system, then the committer, compactor and scrub threads
//! started. An events directory of an earlier development format is refused, naming what to do.

use super::committer::{committer, compactor, scrubber, Compactor, Driver, Shared, Waiting};
use super::engine::{self, Log, LogOptions};
use super::{letters, now_ms, LogStore, LogStoreOptions, Running, SUBDIR};
use crate::store::fs::{Fs, RealFs};
use crate::store::meta::MetaStore;
use crate::store::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

impl LogStore {
    /// Open (or create) the store.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the path when data is damaged, or is of the earlier
    /// development format (`gridlet-v1/events`), which this build does not read; the metadata's
    /// errors ([`crate::store::meta::disk::open`]: another process holds it, the file is missing
    /// although it was initialised, the sled database to migrate is damaged).
    pub fn open(opts: &LogStoreOptions) -> Result<Self, StoreError> {
        Self::open_on(Arc::new(RealFs), opts)
    }

    /// [`LogStore::open`] with the log's files on `fs` (tests: a disk that holds removals).
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn open_on(fs: Arc<dyn Fs>, opts: &LogStoreOptions) -> Result<Self, StoreError> {
        refuse_old_format(&opts.events_path)?;
        let meta = crate::store::meta::disk::open(&opts.metadata_path)?;
        let store = Self::assemble(
            fs,
            Box::new(meta),
            opts,
            log_options(opts),
            Box::new(now_ms),
            Compactor::Thread(Mutex::new(None)),
        )?;
        store.start(
            Duration::from_millis(opts.flush_every_ms),
            engine::SCRUB_BYTES_PER_SEC,
        )?;
        Ok(store)
    }

    /// The store as shipped, with its metadata on `meta`, its log options `log` (its
    /// directory included: `<events_path>/gridlet-v2/log`) and the clock `now_ms`, and no
    /// threads: the returned [`Driver`] runs the committer's rounds and the compactor's copies
    /// when told to, on the caller's thread. For the power-cut simulation (`sim.rs`), which
    /// needs every step in a seeded order.
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn simulated(
        fs: Arc<dyn Fs>,
        meta: Box<dyn MetaStore>,
        opts: &LogStoreOptions,
        log: LogOptions,
        now_ms: Arc<AtomicU64>,
    ) -> Result<(Self, Driver), StoreError> {
        let store = Self::assemble(
            fs,
            meta,
            opts,
            log,
            Box::new(move || now_ms.load(Ordering::Relaxed)),
            Compactor::Held(Mutex::new(None)),
        )?;
        *crate::sync::lock(&store.running) = Running::Inline;
        let driver = Driver {
            shared: store.shared.clone(),
        };
        Ok((store, driver))
    }

    /// Open the metadata's queues, the event log and the dead letters; no thread yet.
    fn assemble(
        fs: Arc<dyn Fs>,
        meta: Box<dyn MetaStore>,
        opts: &LogStoreOptions,
        log_opts: LogOptions,
        clock: Box<dyn Fn() -> u64 + Send + Sync>,
        compactor: Compactor,
    ) -> Result<Self, StoreError> {
        let known = meta.known_queues()?;
        let root = opts.events_path.join(SUBDIR);
        let (mut log, recovered) = Log::open(fs.clone(), log_opts, &known, clock())?;
        if !log.damage().losses.is_empty() {
            log.start_clean_head(clock())?;
        }
        let shared = Arc::new(Shared {
            log: Mutex::new(log),
            waiting: Mutex::new(Waiting::default()),
            wake: Condvar::new(),
            commits: AtomicU64::new(0),
            publish_syncs: AtomicU64::new(0),
            collections: AtomicU64::new(0),
            tracer: std::sync::OnceLock::new(),
            clock,
            compactor,
            scrub_stop: Mutex::new(false),
            scrub_wake: Condvar::new(),
            letters: std::sync::OnceLock::new(),
        });
        // Weak: the shared state holds the letters (for the round's sync), and the letters hold
        // this; a strong reference would be a cycle that no store's drop frees.
        let for_letters = Arc::downgrade(&shared);
        let letters = letters::LogLetters::open(
            fs,
            letters::LetterOptions {
                dir: root.join(letters::DIR),
                segment_bytes: letters::SEGMENT_BYTES,
                max_disk_bytes: opts.max_disk_bytes,
                refuse_damage: opts.refuse_damage,
            },
            &known,
            Box::new(move || for_letters.upgrade().map_or(0, |s| s.log().disk_bytes())),
        )?;
        let letters = Arc::new(letters);
        let _ = shared.letters.set(letters.clone());
        Ok(Self {
            meta,
            letters_damage: letters.damage(),
            letters,
            shared,
            running: Mutex::new(Running::Stopped),
            recovered: Mutex::new(recovered),
        })
    }

    /// Start the committer, compactor and scrub threads.
    fn start(&self, letters_every: Duration, scrub_rate: u64) -> Result<(), StoreError> {
        let (jobs, queue) = std::sync::mpsc::channel();
        if let Compactor::Thread(tx) = &self.shared.compactor {
            *crate::sync::lock(tx) = Some(jobs);
        }
        let c = self.shared.clone();
        let compactor = std::thread::Builder::new()
            .name("gridlet-compact".into())
            .spawn(move || compactor(&c, &queue))
            .map_err(|e| StoreError::Io(format!("cannot start the compactor: {e}")))?;
        let s = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("gridlet-commit".into())
            .spawn(move || committer(&s, letters_every))
            .map_err(|e| StoreError::Io(format!("cannot start the committer: {e}")))?;
        let s = self.shared.clone();
        let scrub = std::thread::Builder::new()
            .name("gridlet-scrub".into())
            .spawn(move || scrubber(&s, scrub_rate))
            .map_err(|e| StoreError::Io(format!("cannot start the scrub: {e}")))?;
        *crate::sync::lock(&self.running) = Running::Threads(thread, compactor, scrub);
        Ok(())
    }
}

/// The event log's options for the store's settings.
pub(super) fn log_options(opts: &LogStoreOptions) -> LogOptions {
    // At most an eighth of the disk bound: a head segment whose events are all settled
    // still counts until it is rolled over (see `Log::stage_collection`).
    let segment_bytes = opts.segment_bytes.min((opts.max_disk_bytes / 8).max(4096));
    LogOptions {
        dir: opts.events_path.join(SUBDIR).join("log"),
        segment_bytes,
        max_disk_bytes: opts.max_disk_bytes,
        tail_bytes: engine::TAIL_BYTES,
        checkpoint_bytes: engine::CHECKPOINT_BYTES,
        align: crate::store::fs::DIRECT_ALIGN,
        // The head file's direct-write unit (512 on most disks).
        sector: 0,
        allocate_step: engine::ALLOCATE_STEP.min(segment_bytes),
        compact_idle_ms: opts.compact_idle_ms,
        refuse_damage: opts.refuse_damage,
    }
}

/// Refuse to start on an events directory of the earlier development format.
fn refuse_old_format(events_path: &std::path::Path) -> Result<(), StoreError> {
    let old = events_path.join("gridlet-v1");
    if old.join("events.format").exists() || old.join("events").is_dir() {
        return Err(StoreError::Corrupt(format!(
            "{}: this directory holds an event store of an earlier gridlet development build \
             (sled + publish journal, format 1), which this build does not read. Deliver its \
             events with the build that wrote them, or delete {} and {} to start with an empty \
             event store (the metadata directory such a build wrote is refused too, with what \
             to do: its topics and subscriptions are the API's JSON, not typed records)",
            old.display(),
            old.join("events").display(),
            old.join("events.journal").display(),
        )));
    }
    let letters = events_path.join(SUBDIR).join("letters");
    if letters.join("db").exists() || letters.join("conf").exists() {
        return Err(StoreError::Corrupt(format!(
            "{}: this directory holds dead letters of an earlier gridlet development build \
             (sled), which this build does not read. Replay or read them with the build that \
             wrote them, or delete {} (events, topics and subscriptions are kept)",
            letters.display(),
            letters.display(),
        )));
    }
    Ok(())
}
