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
//! # Protocol (the committer thread, `super::Committer`)
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
//! # Recovery
//!
//! sled recovers a prefix of its log; after a checkpoint it holds `JOURNAL_LSN = L` and every
//! event of records `≤ L` that was still pending at that checkpoint. Records `≤ L` are therefore
//! skipped (replaying them would bring back events delivered before the checkpoint). Records
//! `> L` are applied in order (their events inserted, then their removals applied), then a
//! checkpoint runs. A torn last record (CRC mismatch: a group that was never acknowledged) and
//! records left over from an earlier cycle (all `≤ L`, or cut off mid-record) are handled by the
//! same rule: read records in file order while they are intact, apply those above `L`, stop at
//! the first damaged one. A clean shutdown overwrites the first header, so the next start reads
//! nothing.
//!
//! # Record format (little-endian)
//!
//! ```text
//! magic u32 = "GJL1" ‖ lsn u64 ‖ payload_len u32 ‖ crc32(lsn ‖ payload) u32 ‖ payload
//! payload = count u32 ‖ count × (queue u32 ‖ seq u64 ‖ value_len u32 ‖ value)
//!           [‖ removed u32 ‖ removed × (queue u32 ‖ seq u64)]
//! ```
//!
//! `value` is the sled value ([`super::encode_value`]): the journal replays exactly what sled
//! would have held.

use super::super::QueueId;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: u32 = u32::from_le_bytes(*b"GJL1");
/// The journal file is created zero-filled to this size and then overwritten in place: an
/// `fdatasync` of a write inside the file's existing blocks need not write the inode, one write
/// less per group than appending to a growing file (measured: the inode write was a third of the
/// committer's CPU). A group that does not fit grows the file.
pub const PREALLOCATED_BYTES: u64 = 8 << 20;
const RECORD_HEADER: usize = 4 + 8 + 4 + 4;
/// Largest record accepted when reading (a publish request is bounded far below this).
const MAX_RECORD: usize = 1 << 30;

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
    file: File,
    path: PathBuf,
    len: u64,
    buf: Vec<u8>,
}

fn err(path: &Path, what: impl std::fmt::Display) -> String {
    format!("{}: {what}", path.display())
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
        let records = read_records(&mut std::io::BufReader::new(&file), size);
        if size < PREALLOCATED_BYTES {
            // First start (or a journal cut short): zero-fill to the working size, once.
            let zeros = vec![0u8; (PREALLOCATED_BYTES - size) as usize];
            file.seek(SeekFrom::End(0))
                .and_then(|_| file.write_all(&zeros))
                .and_then(|_| file.sync_all())
                .map_err(|e| err(path, format!("cannot prepare the journal: {e}")))?;
        }
        Ok((
            Self {
                file,
                path: path.to_path_buf(),
                len: 0,
                buf: Vec::new(),
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
        self.buf.extend_from_slice(&MAGIC.to_le_bytes());
        self.buf.extend_from_slice(&lsn.to_le_bytes());
        self.buf.extend_from_slice(&[0u8; 8]); // payload_len, crc: patched below
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
        let payload_len = (self.buf.len() - RECORD_HEADER) as u32;
        if let Some(c) = self.buf.get_mut(RECORD_HEADER..RECORD_HEADER + 4) {
            c.copy_from_slice(&count.to_le_bytes());
        }
        let crc = record_crc(lsn, self.buf.get(RECORD_HEADER..).unwrap_or_default());
        if let Some(h) = self.buf.get_mut(12..20) {
            h[..4].copy_from_slice(&payload_len.to_le_bytes());
            h[4..].copy_from_slice(&crc.to_le_bytes());
        }
        self.file
            .seek(SeekFrom::Start(self.len))
            .and_then(|_| self.file.write_all(&self.buf))
            .and_then(|_| self.file.sync_data())
            .map_err(|e| err(&self.path, format!("journal write failed: {e}")))?;
        self.len += self.buf.len() as u64;
        // Keep a big group's buffer from pinning memory between groups.
        if self.buf.capacity() > 4 << 20 {
            self.buf = Vec::new();
        }
        Ok(())
    }

    /// After the final checkpoint of a clean shutdown: overwrite the first record header, so the
    /// next start reads nothing instead of stale records.
    ///
    /// # Errors
    /// Write or sync failure (harmless: the next start reads stale records and skips them).
    pub fn close_clean(&mut self) -> Result<(), String> {
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(&[0u8; RECORD_HEADER]))
            .and_then(|_| self.file.sync_data())
            .map_err(|e| err(&self.path, format!("journal write failed: {e}")))?;
        self.len = RECORD_HEADER as u64;
        Ok(())
    }

    /// Start over at the beginning of the file after a checkpoint. Nothing is erased: records
    /// left behind are all at or below the checkpointed sequence number, and a reader stops at the
    /// first record that is not intact.
    pub fn reset(&mut self) {
        self.len = 0;
    }
}

fn record_crc(lsn: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&lsn.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn le<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// Intact records from the start of a journal of `size` bytes, stopping at the first damaged
/// or partial one.
fn read_records(r: &mut impl Read, size: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut left = size;
    let mut header = [0u8; RECORD_HEADER];
    while left >= RECORD_HEADER as u64 && r.read_exact(&mut header).is_ok() {
        left -= RECORD_HEADER as u64;
        let Some((lsn, len, crc)) = parse_header(&header) else {
            break;
        };
        if len as u64 > left {
            break;
        }
        let mut payload = vec![0u8; len];
        if r.read_exact(&mut payload).is_err() {
            break;
        }
        left -= len as u64;
        match (record_crc(lsn, &payload) == crc)
            .then(|| parse_payload(&payload))
            .flatten()
        {
            Some((items, removed)) => out.push(Record {
                lsn,
                items,
                removed,
            }),
            None => break,
        }
    }
    out
}

/// `(lsn, payload length, crc)` of a record header, if it starts a record.
fn parse_header(h: &[u8]) -> Option<(u64, usize, u32)> {
    if u32::from_le_bytes(le(h, 0)?) != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(le(h, 12)?) as usize;
    (len <= MAX_RECORD).then_some((
        u64::from_le_bytes(le(h, 4)?),
        len,
        u32::from_le_bytes(le(h, 16)?),
    ))
}

type Removed = Vec<(QueueId, u64)>;

fn parse_payload(payload: &[u8]) -> Option<(Vec<Item>, Removed)> {
    let count = u32::from_le_bytes(le(payload, 0)?) as usize;
    let mut items = Vec::with_capacity(count.min(1 << 16));
    let mut p = 4usize;
    for _ in 0..count {
        let q = u32::from_le_bytes(le(payload, p)?);
        let seq = u64::from_le_bytes(le(payload, p + 4)?);
        let vlen = u32::from_le_bytes(le(payload, p + 12)?) as usize;
        let v = payload.get(p + 16..(p + 16).checked_add(vlen)?)?;
        items.push((q, seq, v.to_vec()));
        p += 16 + vlen;
    }
    let mut removed = Vec::new();
    if p < payload.len() {
        let n = u32::from_le_bytes(le(payload, p)?) as usize;
        p += 4;
        removed.reserve(n.min(1 << 16));
        for _ in 0..n {
            let q = u32::from_le_bytes(le(payload, p)?);
            let seq = u64::from_le_bytes(le(payload, p + 4)?);
            removed.push((q, seq));
            p += 12;
        }
    }
    (p == payload.len()).then_some((items, removed))
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
mod tests {
    use super::*;

    fn items(n: u64) -> Vec<Item> {
        (0..n)
            .map(|i| (7, 100 + i, vec![b'v'; i as usize]))
            .collect()
    }

    fn append(j: &mut Journal, lsn: u64, it: &[Item]) {
        j.append(lsn, it.iter().map(|(q, s, v)| (*q, *s, v.as_slice())), &[])
            .unwrap();
    }

    #[test]
    fn records_round_trip_and_reset_empties() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        let (mut j, recs) = Journal::open(&p).unwrap();
        assert!(recs.is_empty());
        append(&mut j, 1, &items(3));
        j.append(2, std::iter::empty(), &[(7, 100), (7, 102)])
            .unwrap();
        append(&mut j, 3, &items(5));
        drop(j);
        let (mut j, recs) = Journal::open(&p).unwrap();
        assert_eq!(
            recs,
            vec![
                Record {
                    lsn: 1,
                    items: items(3),
                    removed: vec![]
                },
                Record {
                    lsn: 2,
                    items: items(0),
                    removed: vec![(7, 100), (7, 102)]
                },
                Record {
                    lsn: 3,
                    items: items(5),
                    removed: vec![]
                },
            ]
        );
        j.reset();
        append(&mut j, 4, &items(1));
        drop(j);
        // Record 4 overwrote the start of record 1; what follows it is not a record.
        let (_, recs) = Journal::open(&p).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].lsn, 4);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), PREALLOCATED_BYTES);
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        let (mut j, _) = Journal::open(&p).unwrap();
        append(&mut j, 1, &items(2));
        append(&mut j, 2, &items(2));
        let first_len = j.len() as usize / 2;
        let full = std::fs::read(&p).unwrap()[..j.len() as usize].to_vec();
        // Every truncation point inside the second record keeps exactly the first.
        for cut in first_len..full.len() {
            std::fs::write(&p, &full[..cut]).unwrap();
            let (_, recs) = Journal::open(&p).unwrap();
            assert_eq!(recs.len(), 1, "cut at {cut}");
        }
        // A flipped byte in the second record's payload drops it (crc).
        let mut bad = full.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        std::fs::write(&p, &bad).unwrap();
        assert_eq!(Journal::open(&p).unwrap().1.len(), 1);
        // Garbage is not a record.
        std::fs::write(&p, b"not a journal at all").unwrap();
        assert!(Journal::open(&p).unwrap().1.is_empty());
    }
}
