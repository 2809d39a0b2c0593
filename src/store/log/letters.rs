//! Dead letters on disk, in a small log of their own (`<eventsPath>/gridlet-v2/dead-letters/`),
//! written through the same storage seam ([`Fs`]) and framing as the event log.
//!
//! ```text
//! <16 hex digits>.dlq   header (the event log's, magic "GRDDLQ01", base = next letter id)
//!                       frame*  (records: letter, gone, drop queue: see `record.rs`)
//! ```
//!
//! * **Memory**: where each letter is (segment, frame offset, frame length) and its size, per
//!   queue; bodies stay on disk and are read when listed, peeked or taken.
//! * **Put** writes one frame: the `Gone` records of the letters the bounds evict, then the new
//!   letter. The store's committer puts them in its round (`round::Step::WriteLetters`), syncs
//!   them once for the round (however many batches), and only then stages the removal of the
//!   events the letters replace, so after a crash an event is pending, a dead letter, or both;
//!   never neither. Letters of subscriptions
//!   that are not persisted are synced by the store's committer within
//!   `persistence__flushEveryMs` (their events were never on disk either). `take` and
//!   `delete_queue` sync before they return.
//! * **Disk**: letters count against `persistence__maxDiskBytes` with the event log. A put keeps
//!   the letters' sizes within half of what the event log leaves of the bound (and within
//!   `broker__deadLetter__maxBytes`), and the files are compacted whenever they hold more than
//!   twice the live letters plus one segment. So the event log plus the letters never hold more
//!   than the bound plus one letter segment ([`SEGMENT_BYTES`]) plus one letter: a `du` of the
//!   data directory stays within `persistence__maxDiskBytes` + that constant + sled's metadata.
//! * **Compaction** takes the oldest segment only: its live letters are copied forward into the
//!   head (same ids), the head is synced, then the old file is removed and its directory synced.
//!   Deleting oldest-first keeps recovery simple: a `Gone` record is never older than the letter
//!   it removes, so no segment still alive depends on one that was deleted. A copy that was
//!   synced before a crash undid the removal is read twice; the later one wins (same id).
//! * **Ids** keep increasing across restarts: a new segment's header records the next id.
//! * **Syncs recorded**: the first frame after each sync starts with a `Synced` record (how far
//!   the head was synced), and a clean stop adds one more frame, synced, saying it of the last
//!   frames. Recovery (`recover.rs`) uses them to tell damage from writes a crash cut or lost.
//! * **Damage** loses only its own span, is copied to the quarantine folder first, and is
//!   reported ([`LogLetters::damage`]: logged at error level, merged into the store's damage
//!   for metrics and `/readyz`); `persistence__onDamage=refuse` stops the open instead.
//! * **Fail-stop**: after a failed write or sync, every later write is refused until restart.

mod compact;
pub mod record;
mod recover;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use super::engine::{read_frame, Damage};
use super::format::{self, Header, HEADER, LETTERS_MAGIC};
use crate::store::deadletter::{not_kept, DeadLetter, DeadLetterBound, DeadLetterStore};
use crate::store::fs::{Fs, FsFile};
use crate::store::{QueueId, StoreError};
use record::LetterRecord;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Directory of the letter segments under the store's root (`gridlet-v2`).
pub const DIR: &str = "dead-letters";
/// A new letter segment is started once the head has this many bytes.
pub const SEGMENT_BYTES: u64 = 1 << 20;

/// Options of the letters' log.
#[derive(Debug, Clone)]
pub struct LetterOptions {
    /// Directory of the segments.
    pub dir: PathBuf,
    /// Size at which the head is closed ([`SEGMENT_BYTES`] in the store).
    pub segment_bytes: u64,
    /// `persistence__maxDiskBytes`.
    pub max_disk_bytes: u64,
    /// `persistence__onDamage=refuse`: damage stops the open ([`StoreError::Corrupt`]) before
    /// anything is changed.
    pub refuse_damage: bool,
}

/// Where a letter is.
#[derive(Debug, Clone, Copy)]
struct Loc {
    seg: u64,
    at: u64,
    len: u64,
    /// [`DeadLetter::size`].
    size: u64,
}

struct Seg {
    hdr: Header,
    file: Arc<dyn FsFile>,
    /// Bytes written (the next frame's offset).
    len: u64,
}

struct Inner {
    fs: Arc<dyn Fs>,
    opts: LetterOptions,
    segs: BTreeMap<u64, Seg>,
    letters: HashMap<QueueId, BTreeMap<u64, Loc>>,
    /// Sizes per queue, and their sum.
    bytes: HashMap<QueueId, u64>,
    total: u64,
    next_id: u64,
    /// Queues deleted since open: a late put for one (its task still settling) is not kept.
    dropped: HashSet<QueueId>,
    dirty: bool,
    failed: Option<String>,
    /// The head was synced up to here (its header, after a roll).
    synced: u64,
    /// The head's frames record that it was synced up to here ([`LetterRecord::Synced`]).
    proven: u64,
    /// What the open found damaged ([`LogLetters::damage`]), and the files copied aside.
    damage: Damage,
    quarantined: HashSet<PathBuf>,
}

/// The dead-letter store of the log store. See the module docs.
pub struct LogLetters {
    inner: Mutex<Inner>,
    /// Bytes the event log holds now (the rest of the disk bound is the letters' to share).
    log_bytes: Box<dyn Fn() -> u64 + Send + Sync>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{}: {e}", path.display()))
}

fn seg_name(no: u64) -> String {
    format!("{no:016x}.dlq")
}

fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".dlq")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

impl Inner {
    fn path(&self, no: u64) -> PathBuf {
        self.opts.dir.join(seg_name(no))
    }

    fn check(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(m) => Err(StoreError::Io(format!(
                "dead letters: an earlier write failed ({m}); restart to recover"
            ))),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: StoreError) -> StoreError {
        if self.failed.is_none() {
            self.failed = Some(e.to_string());
        }
        e
    }

    /// Bytes of every segment file.
    fn file_bytes(&self) -> u64 {
        self.segs.values().map(|s| s.len).sum()
    }

    fn live_in(&self, no: u64) -> Vec<(QueueId, u64, Loc)> {
        let mut v: Vec<_> = self
            .letters
            .iter()
            .flat_map(|(q, m)| m.iter().map(move |(id, l)| (*q, *id, *l)))
            .filter(|(_, _, l)| l.seg == no)
            .collect();
        v.sort_unstable_by_key(|(_, id, _)| *id);
        v
    }

    /// Start a new head segment (the old one synced first).
    fn roll(&mut self) -> Result<(), StoreError> {
        if let Some(old) = self.segs.values().next_back() {
            let p = self.path(old.hdr.no);
            if let Err(e) = old.file.sync_data() {
                return Err(self.fail(io_err(&p, e)));
            }
        }
        let no = self.segs.keys().next_back().map_or(1, |n| n + 1);
        let path = self.path(no);
        let hdr = Header {
            no,
            salt: super::engine::rand_u64(),
            base_seq: self.next_id,
            created_ms: crate::clock::system_wall_ms(),
            recycled: false,
        };
        let made = self.fs.create(&path).and_then(|f| {
            f.write_at(&hdr.encode_with(LETTERS_MAGIC), 0)?;
            f.sync_data()?;
            self.fs.sync_dir(&self.opts.dir)?;
            Ok(f)
        });
        match made {
            Ok(file) => {
                self.segs.insert(
                    no,
                    Seg {
                        hdr,
                        file,
                        len: HEADER as u64,
                    },
                );
                self.dirty = false;
                self.synced = HEADER as u64;
                self.proven = HEADER as u64;
                Ok(())
            }
            Err(e) => Err(self.fail(io_err(&path, e))),
        }
    }

    /// Append one frame of `recs` to the head (rolling first when it is full): its location.
    /// The first frame after a sync starts with a [`LetterRecord::Synced`] saying so.
    fn append(&mut self, recs: &[LetterRecord]) -> Result<(u64, u64, u64), StoreError> {
        self.check()?;
        let mut records = Vec::new();
        for r in recs {
            r.encode(&mut records);
        }
        let head_len = self.segs.values().next_back().map(|s| s.len);
        // At most: with the `Synced` record (9 bytes).
        let frame_len = (format::FRAME_HEAD + 9 + records.len()) as u64;
        match head_len {
            Some(len) if len == HEADER as u64 || len + frame_len <= self.opts.segment_bytes => {}
            _ => self.roll()?,
        }
        let mut payload = Vec::with_capacity(9 + records.len());
        if self.synced > self.proven {
            LetterRecord::Synced { upto: self.synced }.encode(&mut payload);
            self.proven = self.synced;
        }
        payload.extend_from_slice(&records);
        let frame_len = (format::FRAME_HEAD + payload.len()) as u64;
        let Some(head) = self.segs.values_mut().next_back() else {
            return Err(StoreError::Io("dead letters: no head segment".into()));
        };
        let mut bytes = Vec::with_capacity(frame_len as usize);
        format::frame(head.hdr.salt, &payload, &mut bytes);
        let (no, at) = (head.hdr.no, head.len);
        if let Err(e) = head.file.write_at(&bytes, at) {
            let p = self.path(no);
            return Err(self.fail(io_err(&p, e)));
        }
        head.len += frame_len;
        self.dirty = true;
        Ok((no, at, frame_len))
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        self.check()?;
        if !self.dirty {
            return Ok(());
        }
        if let Some(head) = self.segs.values().next_back() {
            if let Err(e) = head.file.sync_data() {
                let p = self.path(head.hdr.no);
                return Err(self.fail(io_err(&p, e)));
            }
            self.synced = head.len;
        }
        self.dirty = false;
        Ok(())
    }

    /// Sync, and then record in one more frame (synced too) that the head's frames were
    /// synced: a clean stop leaves every frame below a [`LetterRecord::Synced`], so damage to
    /// the last ones is told from a torn write at the next start.
    fn seal(&mut self) -> Result<(), StoreError> {
        self.sync()?;
        if self.synced > self.proven {
            self.append(&[])?;
            self.sync()?;
        }
        Ok(())
    }

    /// Read a letter back from its frame.
    fn read(&self, queue: QueueId, id: u64, loc: Loc) -> Result<DeadLetter, StoreError> {
        let path = self.path(loc.seg);
        let seg = self
            .segs
            .get(&loc.seg)
            .ok_or_else(|| StoreError::Corrupt(format!("{}: segment missing", path.display())))?;
        let frame = read_frame(&*seg.file, seg.hdr.salt, loc.at, loc.at + loc.len)
            .map_err(|e| io_err(&path, e))?;
        frame
            .and_then(|(payload, _)| record::decode(&payload))
            .into_iter()
            .flatten()
            .find_map(|r| match r {
                LetterRecord::Letter { queue: q, letter } if q == queue && letter.id == id => {
                    Some(letter)
                }
                _ => None,
            })
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "{}: dead letter {id} unreadable at offset {}",
                    path.display(),
                    loc.at
                ))
            })
    }

    fn forget(&mut self, queue: QueueId, id: u64) -> Option<Loc> {
        let loc = self.letters.get_mut(&queue)?.remove(&id)?;
        if let Some(b) = self.bytes.get_mut(&queue) {
            *b = b.saturating_sub(loc.size);
        }
        self.total = self.total.saturating_sub(loc.size);
        Some(loc)
    }

    /// Forget every letter of `queue` (a deleted subscription).
    fn forget_queue(&mut self, queue: QueueId) {
        self.letters.remove(&queue);
        let freed = self.bytes.remove(&queue).unwrap_or(0);
        self.total = self.total.saturating_sub(freed);
    }

    fn insert(&mut self, queue: QueueId, id: u64, loc: Loc) {
        // A copy read twice (a crash during compaction): the later wins.
        self.forget(queue, id);
        self.letters.entry(queue).or_default().insert(id, loc);
        *self.bytes.entry(queue).or_default() += loc.size;
        self.total += loc.size;
        self.next_id = self.next_id.max(id);
    }
}

impl LogLetters {
    /// Open the letters in `opts.dir` (created if missing), dropping those of queues not in
    /// `known`. `log_bytes` tells what the event log holds (for the shared disk bound).
    ///
    /// Damage is recovered around and reported ([`LogLetters::damage`]; `letters/recover.rs`).
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] at the first damage found when [`LetterOptions::refuse_damage`]
    /// is set (nothing changed); I/O failures.
    pub fn open(
        fs: Arc<dyn Fs>,
        opts: LetterOptions,
        known: &HashSet<QueueId>,
        log_bytes: Box<dyn Fn() -> u64 + Send + Sync>,
    ) -> Result<Self, StoreError> {
        fs.create_dir_all(&opts.dir)
            .map_err(|e| io_err(&opts.dir, e))?;
        let mut numbers: Vec<u64> = fs
            .list(&opts.dir)
            .map_err(|e| io_err(&opts.dir, e))?
            .iter()
            .filter_map(|n| parse_name(n))
            .collect();
        numbers.sort_unstable();
        let mut inner = Inner {
            fs,
            opts,
            segs: BTreeMap::new(),
            letters: HashMap::new(),
            bytes: HashMap::new(),
            total: 0,
            next_id: 0,
            dropped: HashSet::new(),
            dirty: false,
            failed: None,
            synced: HEADER as u64,
            proven: HEADER as u64,
            damage: Damage::default(),
            quarantined: HashSet::new(),
        };
        for (i, no) in numbers.iter().enumerate() {
            inner.recover(*no, numbers.get(i + 1).copied())?;
        }
        inner.report();
        let gone: Vec<QueueId> = inner
            .letters
            .keys()
            .filter(|q| !known.contains(q))
            .copied()
            .collect();
        for q in gone {
            inner.forget_queue(q);
        }
        if inner.segs.is_empty() {
            inner.roll()?;
        }
        Ok(Self {
            inner: Mutex::new(inner),
            log_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// Bytes of the letter segment files (the disk bound).
    pub fn disk_bytes(&self) -> u64 {
        self.lock().file_bytes()
    }

    /// Letter segment files (tests).
    #[cfg(test)]
    pub fn segments(&self) -> usize {
        self.lock().segs.len()
    }

    /// What the open found damaged and lost (letters counted as events).
    pub fn damage(&self) -> Damage {
        self.lock().damage.clone()
    }

    /// A clean stop: sync, and record in one more synced frame that every frame is synced
    /// (dropping the letters does it too, but a stopping process may exit before the last
    /// holder lets go).
    ///
    /// # Errors
    /// A failed write or sync.
    pub fn seal(&self) -> Result<(), StoreError> {
        self.lock().seal()
    }

    /// The letters a [`DeadLetterStore::put`] of `letter` would evict now (the simulation's
    /// model: a put cut by the power may still have evicted them).
    #[cfg(test)]
    pub fn would_evict(
        &self,
        queue: QueueId,
        letter: &DeadLetter,
        bound: DeadLetterBound,
    ) -> Vec<(QueueId, u64)> {
        let share = self.disk_share();
        let g = self.lock();
        g.victims(
            queue,
            letter.size(),
            bound.per_subscription,
            bound.max_bytes.min(share),
        )
    }

    /// Half of what the event log leaves of the disk bound.
    fn disk_share(&self) -> u64 {
        let log_bytes = (self.log_bytes)();
        self.lock().opts.max_disk_bytes.saturating_sub(log_bytes) / 2
    }
}

impl DeadLetterStore for LogLetters {
    fn put(
        &self,
        queue: QueueId,
        mut letter: DeadLetter,
        bound: DeadLetterBound,
    ) -> Result<usize, StoreError> {
        if not_kept(queue, &letter, bound) {
            return Ok(1);
        }
        let disk_share = self.disk_share();
        let mut g = self.lock();
        g.check()?;
        if g.dropped.contains(&queue) {
            return Ok(1);
        }
        let max_bytes = bound.max_bytes.min(disk_share);
        let size = letter.size();
        if size > max_bytes {
            tracing::warn!(
                queue,
                event_id = %letter.event_id,
                bytes = size,
                room = disk_share,
                "dead letter not kept: the event store's disk bound (persistence__maxDiskBytes) leaves no room for it"
            );
            return Ok(1);
        }
        let victims = g.victims(queue, size, bound.per_subscription, max_bytes);
        let mut recs: Vec<LetterRecord> = Vec::new();
        let mut by_queue: BTreeMap<QueueId, Vec<u64>> = BTreeMap::new();
        for (q, id) in &victims {
            by_queue.entry(*q).or_default().push(*id);
        }
        for (q, ids) in by_queue {
            recs.push(LetterRecord::Gone { queue: q, ids });
        }
        letter.id = g.next_id + 1;
        let id = letter.id;
        recs.push(LetterRecord::Letter { queue, letter });
        let (seg, at, len) = g.append(&recs)?;
        for (q, vid) in &victims {
            g.forget(*q, *vid);
        }
        g.insert(queue, id, Loc { seg, at, len, size });
        g.compact()?;
        Ok(victims.len())
    }

    fn list(
        &self,
        queue: QueueId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let g = self.lock();
        let Some(m) = g.letters.get(&queue) else {
            return Ok(Vec::new());
        };
        m.range(after.saturating_add(1)..)
            .take(limit)
            .map(|(id, loc)| g.read(queue, *id, *loc))
            .collect()
    }

    fn peek(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        let g = self.lock();
        let Some(m) = g.letters.get(&queue) else {
            return Ok(Vec::new());
        };
        let wanted: Vec<(u64, Loc)> = match ids {
            None => m.iter().map(|(id, l)| (*id, *l)).collect(),
            Some(ids) => {
                let set: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
                set.iter()
                    .filter_map(|id| m.get(id).map(|l| (*id, *l)))
                    .collect()
            }
        };
        wanted
            .into_iter()
            .map(|(id, loc)| g.read(queue, id, loc))
            .collect()
    }

    fn take(&self, queue: QueueId, ids: Option<&[u64]>) -> Result<Vec<DeadLetter>, StoreError> {
        let letters = self.peek(queue, ids)?;
        if letters.is_empty() {
            self.lock().sync()?;
            return Ok(letters);
        }
        let mut g = self.lock();
        // Only what is still there (a concurrent take may have won).
        let letters: Vec<DeadLetter> = letters
            .into_iter()
            .filter(|l| g.letters.get(&queue).is_some_and(|m| m.contains_key(&l.id)))
            .collect();
        let ids: Vec<u64> = letters.iter().map(|l| l.id).collect();
        g.append(&[LetterRecord::Gone {
            queue,
            ids: ids.clone(),
        }])?;
        g.sync()?;
        for id in ids {
            g.forget(queue, id);
        }
        g.compact()?;
        Ok(letters)
    }

    fn count(&self, queue: QueueId) -> usize {
        self.lock().letters.get(&queue).map_or(0, BTreeMap::len)
    }

    fn bytes(&self) -> u64 {
        self.lock().total
    }

    fn delete_queue(&self, queue: QueueId) -> Result<(), StoreError> {
        let mut g = self.lock();
        g.dropped.insert(queue);
        if !g.letters.contains_key(&queue) {
            return g.sync();
        }
        g.append(&[LetterRecord::DropQueue { queue }])?;
        g.sync()?;
        g.forget_queue(queue);
        g.compact()
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.lock().sync()
    }
}

impl Drop for LogLetters {
    fn drop(&mut self) {
        let _ = self.lock().seal();
    }
}
