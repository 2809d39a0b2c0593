//! Opening the sled store: the two databases and their format markers, replay of the publish
//! journal, and the one scan of the events database that counts live bytes, removes orphans and
//! indexes each queue (see the start-up sections of the [`super`] docs).
//!
//! Invariant: a database that was initialised (its `*.format` marker exists) and opens empty
//! or damaged is an error naming the path, never an empty start.

use super::codec::{event_key, parse_key, read_u64};
use super::committer::{Committer, Unflushed, Writer};
use super::{
    corrupt, deadletters, io, item_cost, journal, SledOptions, SledStore, HIGH_WATER_KEY,
    JOURNAL_LSN_KEY, SLED_BATCH, SPACE_FACTOR_TENTHS, SUBDIR,
};
use crate::store::{QueueId, RetryState, StoreError};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

const FORMAT_KEY: &[u8] = b"format";
const FORMAT_VERSION: &[u8] = b"1";
const META_CACHE_BYTES: u64 = 1 << 20;
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Queue ids that a subscription record owns.
fn known_queues(subs: &sled::Tree, path: &Path) -> Result<HashSet<QueueId>, StoreError> {
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

/// Open one sled database at `<base>/gridlet-v1/<name>`, checking its format marker.
fn open_db(
    base: &Path,
    name: &str,
    cache: u64,
    flush_every_ms: u64,
) -> Result<sled::Db, StoreError> {
    let root = base.join(SUBDIR);
    let dir = root.join(name);
    let marker = root.join(format!("{name}.format"));
    let initialised = marker.exists();
    if initialised && !dir.is_dir() {
        return Err(corrupt(
            &dir,
            "the database directory is missing although it was initialised (restore it, or delete the whole gridlet-v1 directory to start empty)",
        ));
    }
    std::fs::create_dir_all(&root).map_err(|e| corrupt(&root, format!("cannot create: {e}")))?;
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
                "the database is empty although it was initialised: its files are damaged or were replaced (restore them, or delete the whole gridlet-v1 directory to start empty)",
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

/// Apply the journal's acknowledged groups that sled does not hold (see [`journal`]), make them
/// durable, and empty the journal. Returns the journal and the last applied sequence number.
fn replay_journal(
    db: &sled::Db,
    events: &sled::Tree,
    dir: &Path,
) -> Result<(journal::Journal, u64), StoreError> {
    let path = dir.join("events.journal");
    let (mut j, records) = journal::Journal::open(&path).map_err(StoreError::Io)?;
    let applied = read_u64(events, &JOURNAL_LSN_KEY)?;
    let mut lsn = applied;
    let mut replayed = 0usize;
    let mut max_seq = 0u64;
    for r in records.into_iter().filter(|r| r.lsn > applied) {
        // A record (one group of publishes) can hold many thousands of events, and a sled batch
        // costs ≈ 7 KB of memory per operation until applied (100,000 inserts: 718 MB), so it is
        // applied in batches of `SLED_BATCH`. A record need not be applied atomically: its
        // sequence number is written with its last batch, and replaying a record again after a
        // crash in between repeats the same inserts and removals.
        let mut batch = sled::Batch::default();
        let mut ops = 0;
        replayed += r.items.len();
        let inserts = r.items.into_iter().map(|(q, seq, v)| {
            max_seq = max_seq.max(seq);
            (event_key(q, seq), Some(v))
        });
        let removals = r
            .removed
            .into_iter()
            .map(|(q, seq)| (event_key(q, seq), None));
        for (key, value) in inserts.chain(removals) {
            match value {
                Some(v) => batch.insert(&key, v),
                None => batch.remove(&key),
            }
            ops += 1;
            if ops == SLED_BATCH {
                events.apply_batch(std::mem::take(&mut batch)).map_err(io)?;
                ops = 0;
            }
        }
        batch.insert(&JOURNAL_LSN_KEY, &r.lsn.to_be_bytes());
        events.apply_batch(batch).map_err(io)?;
        lsn = lsn.max(r.lsn);
    }
    if lsn > applied {
        // Sequence numbers of replayed events that were settled stay used.
        if max_seq > read_u64(events, &HIGH_WATER_KEY)? {
            events
                .insert(HIGH_WATER_KEY, &max_seq.to_be_bytes())
                .map_err(io)?;
        }
        tracing::info!(
            events = replayed,
            "replayed acknowledged events from the journal"
        );
        db.flush().map_err(io)?;
        journal::fsync_file(&dir.join("events").join("db")).map_err(StoreError::Io)?;
    }
    j.reset();
    Ok((j, lsn))
}

impl SledStore {
    /// Open (or create) both databases.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the path when a database cannot be opened or is damaged.
    pub fn open(opts: &SledOptions) -> Result<Self, StoreError> {
        let meta = open_db(
            &opts.metadata_path,
            "meta",
            META_CACHE_BYTES,
            opts.flush_every_ms,
        )?;
        let events_db = open_db(
            &opts.events_path,
            "events",
            opts.cache_bytes,
            opts.flush_every_ms,
        )?;
        let topics = meta.open_tree("topics").map_err(io)?;
        let subs = meta.open_tree("subs").map_err(io)?;
        let health = meta.open_tree("health").map_err(io)?;
        let events: sled::Tree = (*events_db).clone();
        let events_dir = opts.events_path.join(SUBDIR);
        let (journal, lsn) = replay_journal(&events_db, &events, &events_dir)?;
        let high_water = read_u64(&events, &HIGH_WATER_KEY)?;
        let committer = Arc::new(Committer::default());
        let live = Arc::new(AtomicU64::new(0));
        let deleted = Arc::new(RwLock::new(HashSet::new()));
        let unflushed: Arc<Unflushed> = Arc::default();
        let writer = Writer {
            db: events_db.clone(),
            events: events.clone(),
            live: live.clone(),
            deleted: deleted.clone(),
            journal,
            unflushed: unflushed.clone(),
            data_file: events_dir.join("events").join("db"),
            lsn,
            high_water,
            checkpointed_high_water: high_water,
            last_checkpoint: std::time::Instant::now(),
            checkpoint_every: opts.checkpoint_every,
            dirty: false,
            journal_charged: 0,
        };
        let thread = Committer::start(&committer, writer)?;
        let (dead_letters, dead_letter_bytes) = deadletters::SledDeadLetterStore::open(
            &events_db,
            &known_queues(&subs, &opts.metadata_path)?,
            live.clone(),
            committer.clone(),
            opts.events_path.clone(),
        )?;
        let store = Self {
            meta,
            topics,
            subs,
            health,
            events_db,
            events,
            live,
            dead_letters: Arc::new(dead_letters),
            scanned_max_seq: AtomicU64::new(0),
            live_budget: opts.max_disk_bytes / SPACE_FACTOR_TENTHS * 10,
            max_disk_bytes: opts.max_disk_bytes,
            deleted,
            unflushed,
            topic_order: Mutex::new(()),
            committer,
            committer_thread: Some(thread),
            paths: (opts.metadata_path.clone(), opts.events_path.clone()),
            recovered: Mutex::new(HashMap::new()),
            has_recovered: AtomicBool::new(false),
        };
        store.scan_events()?;
        store.live.fetch_add(dead_letter_bytes, Ordering::Relaxed);
        Ok(store)
    }

    /// Count live bytes and remove events of queues no subscription owns (left by a crash between
    /// deleting a subscription's record and its events, or by a metadata directory that was reset).
    fn scan_events(&self) -> Result<(), StoreError> {
        let known = known_queues(&self.subs, &self.paths.0)?;
        let mut live = 0u64;
        let mut max_seq = 0u64;
        let mut orphans: Vec<(QueueId, u64)> = Vec::new();
        let mut index: HashMap<QueueId, Vec<(u64, RetryState)>> = HashMap::new();
        for item in self.events.iter() {
            let (k, v) = item.map_err(io)?;
            if k.starts_with(&HIGH_WATER_KEY) {
                continue; // the high-water mark and the journal sequence number
            }
            let (q, seq) = parse_key(&k).ok_or_else(|| corrupt(&self.paths.1, "bad event key"))?;
            if known.contains(&q) {
                live += item_cost(v.len());
                max_seq = max_seq.max(seq);
                index
                    .entry(q)
                    .or_default()
                    .push((seq, self.state_of(q, seq, &v)?));
            } else {
                match orphans.last_mut() {
                    Some((oq, n)) if *oq == q => *n += 1,
                    _ => orphans.push((q, 1)),
                }
            }
        }
        for (q, n) in orphans {
            tracing::warn!(
                queue = q,
                events = n,
                "removing stored events of a subscription that no longer exists"
            );
            self.remove_queue(q)?;
        }
        self.live.store(live, Ordering::Relaxed);
        self.scanned_max_seq.store(max_seq, Ordering::Relaxed);
        self.has_recovered
            .store(!index.is_empty(), Ordering::Relaxed);
        *crate::sync::lock(&self.recovered) = index;
        Ok(())
    }
}
