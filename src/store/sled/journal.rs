//! The publish journal: a write-ahead log in front of sled that makes an acknowledged publish
//! durable with one `pwrite` + `fdatasync` per group commit.
//!
//! # Why
//!
//! A sled `flush` per group commit cost ≈ 370 µs of CPU on the benchmark VM (it hands the sealed
//! I/O buffer to sled's thread pool, which wakes every idle thread, then `sync_file_range`s), and
//! it is not a power-loss barrier (`sync_file_range` flushes neither the device cache nor file
//! metadata). Writing the group here and `fdatasync`ing costs ≈ 50–75 µs of CPU and *is* one.
//!
//! # Protocol (the committer thread, `super::committer`)
//!
//! 1. A group of publishes (all that arrived while the previous sync ran) gets the next log
//!    sequence number *L* and is written here as one record, together with the events settled
//!    (delivered) since the previous record; the file is `fdatasync`ed. Then the events go into
//!    the store's in-memory *unflushed* map (readable like sled) and the publishers are answered.
//! 2. A delivered event is removed from the map if it is still there (it never touches sled),
//!    else from sled; either way its removal rides on the next record.
//! 3. A **checkpoint** (every ≈ 200 ms while anything changed, and when the journal outgrows its
//!    preallocated size) moves the events still in the map into sled, sets sled's key
//!    `JOURNAL_LSN` to the last *L*, flushes sled and `fsync`s its data file (what sled's own
//!    background flusher does), then writing starts over at the beginning of this file.
//!
//! # Cycles
//!
//! The file is rewritten from its start after every checkpoint; the span between two checkpoints
//! is a **cycle**. A cycle begins with a header at offset 0 holding a fresh random salt (16 bytes
//! from the OS generator), written in the same `pwrite` as the cycle's first record, and every
//! record of the cycle carries that salt inside its checksum. A reader accepts a record only if
//! it has the current cycle's salt, a matching checksum and the sequence number after its
//! predecessor's, and stops at the first that does not. Older cycles' records left behind the
//! current one, and bytes a publisher chose (an event id can spell a whole record, and a new
//! cycle's small records end where an old large record's payload goes on), can therefore never be
//! replayed: their salt is unknown to anyone outside this process.
//!
//! # Recovery
//!
//! sled recovers a prefix of its log; after a checkpoint it holds `JOURNAL_LSN = L` and every
//! event of records `≤ L` that was still pending at that checkpoint. Records `≤ L` are therefore
//! skipped (replaying them would bring back events delivered before the checkpoint). Records
//! `> L` are applied in order (their events inserted, then their removals applied, in bounded
//! sled batches with the record's `L` in its last one), then a checkpoint runs. A torn last
//! record (checksum mismatch: a group that was never acknowledged) ends the cycle like any other
//! record that does not belong to it. A clean shutdown overwrites the cycle header, so the next
//! start reads nothing. A journal without a cycle header, left by a crash of a gridlet from before
//! cycles, is read as that version wrote it (v1/v2 records from offset 0) once, at the upgrade.
//!
//! # Writing
//!
//! Where the file system takes `O_DIRECT` (probed at open), a group goes to the device without
//! the page cache: each record is padded to the direct-I/O block (512 or 4096 bytes, whichever
//! the probe read) and copied to an aligned buffer, then one `pwrite` + `fdatasync` (which then
//! only flushes the device cache). Measured on the benchmark VM, 3 × 4,000 groups of ≈ 1.4 KB:
//! 116–127 µs and 33–36 µs of CPU per group, against 117–167 µs and 43–62 µs through the page
//! cache. Elsewhere, and if the kernel refuses a direct write after all (`EINVAL`), the same
//! records go through the page cache. Either way a group is acknowledged only after its
//! `fdatasync` returned.
//!
//! # Record format (little-endian)
//!
//! ```text
//! cycle ("GJC3", at 0): magic u32 ‖ records_at u32 ‖ salt [16] ‖ crc32(records_at ‖ salt) u32
//!                       ‖ zeros up to `records_at` (a multiple of the direct-I/O block)
//! v3 ("GJL3", written): magic u32 ‖ lsn u64 ‖ payload_len u32 ‖ crc32(salt ‖ lsn ‖ stride ‖
//!                       payload) u32 ‖ stride u32 ‖ salt [16] ‖ payload ‖ zeros up to `stride`
//! v2 ("GJL2", read):    as v3 without the salt, crc32(lsn ‖ stride ‖ payload), from offset 0
//! v1 ("GJL1", read):    magic u32 ‖ lsn u64 ‖ payload_len u32 ‖ crc32(lsn ‖ payload) u32 ‖ payload
//! payload = count u32 ‖ count × (queue u32 ‖ seq u64 ‖ value_len u32 ‖ value)
//!           [‖ removed u32 ‖ removed × (queue u32 ‖ seq u64)]
//! ```
//!
//! `value` is the sled value ([`super::encode_value`]): the journal replays exactly what sled
//! would have held. v1 and v2 records (gridlet before cycles) are still read from a journal with
//! no cycle header, so a journal left by a crash of an older version is replayed after an upgrade.

mod read;

use super::super::QueueId;
#[cfg(test)]
use read::record_crc;
use read::{cycle_crc, read_journal, record_crc_v3};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Records of gridlet 0.1 before direct I/O: `header ‖ payload`, back to back.
const MAGIC_V1: u32 = u32::from_le_bytes(*b"GJL1");
/// Records padded to a multiple of the direct-I/O block: `header ‖ stride ‖ payload ‖ zeros`
/// (gridlet before per-cycle salts; read only from a journal that has no cycle header).
const MAGIC_V2: u32 = u32::from_le_bytes(*b"GJL2");
/// Records of one cycle: as v2, plus the cycle's salt after the stride.
const MAGIC_V3: u32 = u32::from_le_bytes(*b"GJL3");
/// The cycle header at offset 0: `magic ‖ records_at u32 ‖ salt ‖ crc32(records_at ‖ salt)`.
const MAGIC_CYCLE: u32 = u32::from_le_bytes(*b"GJC3");
/// Random bytes that mark every record of one cycle (between two checkpoints).
const SALT: usize = 16;
const CYCLE_HEADER: usize = 4 + 4 + SALT + 4;
/// The journal file is created zero-filled to this size and then overwritten in place: an
/// `fdatasync` of a write inside the file's existing blocks need not write the inode, one write
/// less per group than appending to a growing file (measured: the inode write was a third of the
/// committer's CPU). A group that does not fit grows the file.
pub const PREALLOCATED_BYTES: u64 = 8 << 20;
/// `magic ‖ lsn ‖ payload_len ‖ crc` (v1; v2 adds `stride u32` before the payload).
const RECORD_HEADER: usize = 4 + 8 + 4 + 4;
const RECORD_HEADER_V2: usize = RECORD_HEADER + 4;
const RECORD_HEADER_V3: usize = RECORD_HEADER_V2 + SALT;
/// Largest record accepted when reading (a publish request is bounded far below this).
const MAX_RECORD: usize = 1 << 30;
/// Alignment of the write buffer's memory (covers every device's direct-I/O memory alignment).
const MEM_ALIGN: usize = 4096;
/// Direct-I/O block sizes tried at open: the device's logical block is one of these.
const BLOCKS: [usize; 2] = [512, 4096];

/// One event of a journal record: `(queue, seq, sled value)`.
pub type Item = (QueueId, u64, Vec<u8>);

/// A record read back at start-up.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    /// Log sequence number of the group.
    pub lsn: u64,
    /// The group's events.
    pub items: Vec<Item>,
    /// Events settled (delivered, dropped, dead-lettered) since the previous record:
    /// `(queue, seq)`. Replay removes them after applying this record's events.
    pub removed: Vec<(QueueId, u64)>,
}

/// The journal file (append-only between checkpoints).
pub struct Journal {
    /// Buffered handle: start-up reads, and writes where direct I/O is not available.
    file: File,
    /// `O_DIRECT` handle, when the file system takes it: a group goes to the device without a
    /// page-cache copy and write-back pass (measured on the benchmark VM: `pwrite` +
    /// `fdatasync` 116–127 µs wall and 33–36 µs CPU against 117–167 µs and 43–62 µs buffered).
    direct: Option<File>,
    /// Records are padded to a multiple of this (the direct-I/O block: 512 or 4096 bytes).
    block: usize,
    path: PathBuf,
    len: u64,
    /// The record being built (header, payload, padding).
    buf: Vec<u8>,
    /// Its copy for direct I/O, starting at the allocation's first [`MEM_ALIGN`]-aligned byte.
    dio: Vec<u8>,
    /// This cycle's salt: in the cycle header and in every record of the cycle.
    salt: [u8; SALT],
    /// The cycle header is written together with the cycle's first record.
    header_pending: bool,
    /// The file's size: [`PREALLOCATED_BYTES`], or more while a burst has grown it.
    file_size: u64,
}

/// A fresh salt from the operating system's generator. Should that fail, a mix of the time and
/// the process id still differs from every earlier cycle's salt.
fn new_salt() -> [u8; SALT] {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; SALT];
    if ring::rand::SystemRandom::new().fill(&mut salt).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        salt.copy_from_slice(&(nanos ^ u128::from(std::process::id()) << 64).to_le_bytes());
    }
    salt
}

fn err(path: &Path, what: impl std::fmt::Display) -> String {
    format!("{}: {what}", path.display())
}

/// Open `path` for direct I/O and find the block size it accepts, by reading the first block
/// (a read has the same alignment rules as a write and cannot harm unreplayed records).
/// `None` where the file system refuses `O_DIRECT` (tmpfs before Linux 6.6) or every block size.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<(File, usize)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()?;
    let mut raw = vec![0u8; MEM_ALIGN * 2];
    let at = align_offset(raw.as_ptr() as usize);
    let block = BLOCKS.into_iter().find(|&block| {
        raw.get_mut(at..at + block)
            .is_some_and(|probe| file.read_exact_at(probe, 0).is_ok())
    })?;
    Some((file, block))
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<(File, usize)> {
    None
}

/// Bytes from `addr` (the start of a buffer's allocation) to the first [`MEM_ALIGN`]-aligned one.
fn align_offset(addr: usize) -> usize {
    (MEM_ALIGN - addr % MEM_ALIGN) % MEM_ALIGN
}

impl Journal {
    /// Open (or create) the journal at `path` and read its intact records, in file order.
    ///
    /// # Errors
    /// The file cannot be opened or read (a damaged record is not an error: reading stops there).
    pub fn open(path: &Path) -> Result<(Self, Vec<Record>), String> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| err(path, format!("cannot open the journal: {e}")))?;
        let size = file
            .metadata()
            .map_err(|e| err(path, format!("cannot read the journal: {e}")))?
            .len();
        // Read record by record, stopping at the first one that is not intact: after a clean
        // shutdown that is the first header, so start-up does not read the whole file.
        let records = read_journal(&file, size);
        if size < PREALLOCATED_BYTES {
            // First start (or a journal cut short): zero-fill to the working size, once.
            let zeros = vec![0u8; (PREALLOCATED_BYTES - size) as usize];
            file.seek(SeekFrom::End(0))
                .and_then(|_| file.write_all(&zeros))
                .and_then(|_| file.sync_all())
                .map_err(|e| err(path, format!("cannot prepare the journal: {e}")))?;
        }
        let (direct, block) = match open_direct(path) {
            Some((f, block)) => {
                tracing::info!(path = %path.display(), block, "the publish journal writes with direct I/O");
                (Some(f), block)
            }
            None => {
                tracing::info!(
                    path = %path.display(),
                    "the file system does not take direct I/O; the journal writes through the page cache"
                );
                (None, BLOCKS[0])
            }
        };
        Ok((
            Self {
                file,
                direct,
                block,
                path: path.to_path_buf(),
                len: 0,
                buf: Vec::new(),
                dio: Vec::new(),
                salt: new_salt(),
                header_pending: true,
                file_size: size.max(PREALLOCATED_BYTES),
            },
            records,
        ))
    }

    /// Bytes written since the last [`Journal::reset`] (or since opening: writing starts at the
    /// beginning of the file, over records the caller has applied).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was appended since the last [`Journal::reset`].
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether groups are written with direct I/O.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Append one record and `fdatasync` it: when this returns `Ok`, the group survives a crash
    /// and a power cut.
    ///
    /// # Errors
    /// Write or sync failure (the record may be partly written; recovery stops before it).
    pub fn append<'a>(
        &mut self,
        lsn: u64,
        items: impl Iterator<Item = (QueueId, u64, &'a [u8])>,
        removed: &[(QueueId, u64)],
    ) -> Result<(), String> {
        self.buf.clear();
        self.buf.extend_from_slice(&MAGIC_V3.to_le_bytes());
        self.buf.extend_from_slice(&lsn.to_le_bytes());
        self.buf.extend_from_slice(&[0u8; 12]); // payload_len, crc, stride: patched below
        self.buf.extend_from_slice(&self.salt);
        self.buf.extend_from_slice(&[0u8; 4]); // count: patched below
        let mut count = 0u32;
        for (q, seq, v) in items {
            self.buf.extend_from_slice(&q.to_le_bytes());
            self.buf.extend_from_slice(&seq.to_le_bytes());
            self.buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(v);
            count += 1;
        }
        if !removed.is_empty() {
            self.buf
                .extend_from_slice(&(removed.len() as u32).to_le_bytes());
            for (q, seq) in removed {
                self.buf.extend_from_slice(&q.to_le_bytes());
                self.buf.extend_from_slice(&seq.to_le_bytes());
            }
        }
        let payload_len = (self.buf.len() - RECORD_HEADER_V3) as u32;
        let stride = self.buf.len().div_ceil(self.block) * self.block;
        if let Some(c) = self.buf.get_mut(RECORD_HEADER_V3..RECORD_HEADER_V3 + 4) {
            c.copy_from_slice(&count.to_le_bytes());
        }
        let crc = record_crc_v3(
            &self.salt,
            lsn,
            stride as u32,
            self.buf.get(RECORD_HEADER_V3..).unwrap_or_default(),
        );
        if let Some(h) = self.buf.get_mut(12..RECORD_HEADER_V2) {
            h[..4].copy_from_slice(&payload_len.to_le_bytes());
            h[4..8].copy_from_slice(&crc.to_le_bytes());
            h[8..].copy_from_slice(&(stride as u32).to_le_bytes());
        }
        self.buf.resize(stride, 0);
        let at = if self.header_pending {
            // A new cycle: its header and first record go to the start of the file in one write.
            let header = self.cycle_header();
            self.buf.splice(0..0, header);
            0
        } else {
            self.len
        };
        self.write_synced(at)?;
        self.len = at + self.buf.len() as u64;
        self.file_size = self.file_size.max(self.len);
        self.header_pending = false;
        // Keep a big group's buffers from pinning memory between groups.
        if self.buf.capacity() > 4 << 20 {
            self.buf = Vec::new();
            self.dio = Vec::new();
        }
        Ok(())
    }

    /// Write `self.buf` (a whole number of blocks) at `at` and `fdatasync`. Direct I/O where
    /// the file system took it at open; a write it refuses after all (`EINVAL`: an alignment
    /// rule the probe did not see) switches this journal to the page cache for good.
    fn write_synced(&mut self, at: u64) -> Result<(), String> {
        if let Some(direct) = &self.direct {
            self.dio.clear();
            self.dio.reserve(self.buf.len() + MEM_ALIGN);
            // No reallocation below: the capacity is reserved, so the address stays aligned.
            let start = align_offset(self.dio.as_ptr() as usize);
            self.dio.resize(start, 0);
            self.dio.extend_from_slice(&self.buf);
            let data = self.dio.get(start..).unwrap_or_default();
            match direct
                .write_all_at(data, at)
                .and_then(|()| direct.sync_data())
            {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    tracing::warn!(
                        path = %self.path.display(),
                        error = %e,
                        "direct I/O refused; the journal writes through the page cache from now on"
                    );
                    self.direct = None;
                }
                Err(e) => return Err(err(&self.path, format!("journal write failed: {e}"))),
            }
        }
        self.file
            .write_all_at(&self.buf, at)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| err(&self.path, format!("journal write failed: {e}")))
    }

    /// After the final checkpoint of a clean shutdown: overwrite the first record header, so the
    /// next start reads nothing instead of stale records.
    ///
    /// # Errors
    /// Write or sync failure (harmless: the next start reads stale records and skips them).
    pub fn close_clean(&mut self) -> Result<(), String> {
        self.buf.clear();
        self.buf.resize(self.block, 0);
        self.write_synced(0)?;
        self.len = self.block as u64;
        self.header_pending = false;
        Ok(())
    }

    /// Start a new cycle at the beginning of the file after a checkpoint. Nothing is erased: the
    /// new cycle's salt differs from the old one's, so a reader stops where the new cycle's
    /// records end instead of reading on into what is left of older records (or into bytes a
    /// publisher chose, such as an event id spelling a record).
    ///
    /// A file a burst grew past [`PREALLOCATED_BYTES`] is cut back to it: everything in it is
    /// checkpointed by now. (Should the cut fail, the file stays larger and stays counted.)
    pub fn reset(&mut self) {
        self.len = 0;
        self.salt = new_salt();
        self.header_pending = true;
        if self.file_size > PREALLOCATED_BYTES {
            match self.file.set_len(PREALLOCATED_BYTES) {
                Ok(()) => self.file_size = PREALLOCATED_BYTES,
                Err(e) => tracing::warn!(
                    path = %self.path.display(),
                    error = %e,
                    "cannot cut the journal back to its normal size"
                ),
            }
        }
    }

    /// Bytes the file holds beyond its normal size (a burst between two checkpoints): counted
    /// against `persistence__maxDiskBytes` until the next checkpoint gives them back.
    pub fn excess_bytes(&self) -> u64 {
        self.file_size.saturating_sub(PREALLOCATED_BYTES)
    }

    /// The cycle header, padded so the first record starts on a direct-I/O block.
    fn cycle_header(&self) -> Vec<u8> {
        let records_at = CYCLE_HEADER.div_ceil(self.block) * self.block;
        let mut h = Vec::with_capacity(records_at);
        h.extend_from_slice(&MAGIC_CYCLE.to_le_bytes());
        h.extend_from_slice(&(records_at as u32).to_le_bytes());
        h.extend_from_slice(&self.salt);
        h.extend_from_slice(&cycle_crc(records_at as u32, &self.salt).to_le_bytes());
        h.resize(records_at, 0);
        h
    }
}

/// `fsync` a file of sled's (its data file), as sled's background flusher does after a flush.
///
/// # Errors
/// The file cannot be opened or synced.
pub fn fsync_file(path: &Path) -> Result<(), String> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| err(path, format!("fsync failed: {e}")))
}

#[cfg(test)]
mod tests;
