//! Damage: what opening the log finds that a crash cannot explain, told apart from a torn tail.
//!
//! A crash leaves at most one torn frame, at the end of the newest segment (invariant 3 in
//! [`super`]): a write that was never acknowledged. Anything else that fails its checksum was
//! durable once and was damaged since (a flipped bit, a lost or zeroed sector, a stale block, a
//! file cut short or gone). A failing frame is a **torn tail** only when it is the tail: no frame
//! of the same salt after it checks out, it starts at or past the end the checkpoint recorded,
//! the segment is the newest, and it looks torn (a sector of it was never written: all zeros, in
//! a file that held nothing before). Otherwise it is **damage**: its span is stepped over, only
//! the events it held are lost, and the intact frames after it are recovered.
//!
//! Damage is never silent: each loss is a [`Loss`] (file, offset, frames, events), which the
//! store logs at error level, counts in metrics and shows in the readiness detail; the damaged
//! file is first copied into the quarantine folder ([`QUARANTINE`]) or, when the log cannot use
//! it at all (its header is unreadable), moved there. Nothing damaged is deleted.

use super::format::{self, FRAME_HEAD};
use crate::store::fs::{Fs, FsFile};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The quarantine folder, beside the log's and the dead letters' folders: copies of damaged
/// files, counted in the disk bound, never read or removed by gridlet.
pub const QUARANTINE: &str = "quarantine";

/// One loss found when the log opened, or since by the scrub or a read (`scrub.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The damaged file.
    pub file: PathBuf,
    /// Where the damage starts (0: the whole file).
    pub offset: u64,
    /// Bytes of the damaged span.
    pub bytes: u64,
    /// Frames lost (a damaged span counts as one when its frames cannot be told apart).
    pub frames: u64,
    /// Events lost: the sequence numbers the damaged span held (an upper bound when some of
    /// them may have been delivered before), or the events a segment still owed.
    pub events: u64,
    /// Whether `events` is the count (or a bound from sequence numbers): `false` when the
    /// damaged span's events could not be counted, only those that still read (a lower bound).
    pub counted: bool,
    /// What was found, in words.
    pub what: String,
}

/// A torn tail cut when the log opened: an unacknowledged write (logged at warn level).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torn {
    /// The newest segment's file.
    pub file: PathBuf,
    /// Where the cut was made.
    pub offset: u64,
    /// Bytes cut.
    pub bytes: u64,
}

/// Everything an open found: losses, torn tails cut, and the copies made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Damage {
    /// Damage, in the order found.
    pub losses: Vec<Loss>,
    /// Torn tails cut (not damage).
    pub torn: Vec<Torn>,
    /// Copies (or moved files) in the quarantine folder, made by this open.
    pub quarantined: Vec<PathBuf>,
}

impl Damage {
    /// Log each loss at error level, naming the file and where, then each quarantine copy.
    /// `log` names the log ("event log", "dead-letter log"), `unit` what it holds ("events",
    /// "dead letters"). Both logs report through this, so their lines read alike.
    pub fn log_errors(&self, log: &str, unit: &str) {
        for l in &self.losses {
            let lost = if l.counted {
                format!("{} {unit} lost", l.events)
            } else {
                format!(
                    "{} {unit} that still read lost, and more whose records do not read",
                    l.events
                )
            };
            tracing::error!(
                file = %l.file.display(),
                offset = l.offset,
                bytes = l.bytes,
                frames = l.frames,
                lost = l.events,
                counted = l.counted,
                "{log} damaged: {} ({lost})",
                l.what,
            );
        }
        for q in &self.quarantined {
            tracing::error!(copy = %q.display(), "a damaged file of the {log} was kept in the quarantine folder");
        }
    }

    /// Frames lost, all losses.
    pub fn frames(&self) -> u64 {
        self.losses.iter().map(|l| l.frames).sum()
    }

    /// Events lost, all losses.
    pub fn events(&self) -> u64 {
        self.losses.iter().map(|l| l.events).sum()
    }

    /// One line for the readiness detail and errors; `None` when nothing was lost.
    pub fn summary(&self) -> Option<String> {
        if self.losses.is_empty() {
            return None;
        }
        let files: std::collections::BTreeSet<_> = self.losses.iter().map(|l| &l.file).collect();
        let more = if self.losses.iter().all(|l| l.counted) {
            ""
        } else {
            " (at least: some damaged records do not read)"
        };
        Some(format!(
            "damaged data found at start or since: {} events lost{more} in {} frames of {} files (copies in the quarantine folder; see the error log)",
            self.events(),
            self.frames(),
            files.len()
        ))
    }

    /// Add `other`'s findings (the dead-letter log's) to these.
    pub fn extend(&mut self, other: Damage) {
        self.losses.extend(other.losses);
        self.torn.extend(other.torn);
        self.quarantined.extend(other.quarantined);
    }
}

/// The frame at `offset` of `buf` (a whole segment file), checked: `(payload, next offset)`.
pub(crate) fn frame_at(buf: &[u8], salt: u64, offset: u64) -> Option<(&[u8], u64)> {
    let at = usize::try_from(offset).ok()?;
    let head = buf.get(at..at.checked_add(FRAME_HEAD)?)?;
    let mut r = format::Reader(head);
    let (len, crc) = (r.u32()?, r.u32()?);
    if len == 0 || len > format::MAX_FRAME {
        return None;
    }
    let start = at + FRAME_HEAD;
    let payload = buf.get(start..start.checked_add(len as usize)?)?;
    (format::frame_crc(salt, payload) == crc).then_some((payload, (start + payload.len()) as u64))
}

/// The first offset after `from` where a frame of `salt` checks out, if any: the end of a
/// damaged span. Only starts whose first record kind is known and whose length fits are
/// checksummed.
pub(crate) fn next_frame(buf: &[u8], salt: u64, from: u64) -> Option<u64> {
    let start = usize::try_from(from).ok()?.checked_add(1)?;
    let end = buf.len().checked_sub(FRAME_HEAD + 1)?;
    (start..=end)
        .filter(|&p| {
            buf.get(p + FRAME_HEAD)
                .is_some_and(|k| format::is_record_kind(*k))
        })
        .find(|&p| frame_at(buf, salt, p as u64).is_some())
        .map(|p| p as u64)
}

/// Events in the frames from `from` to `to` of `buf`, read by their lengths without their
/// checksums: an estimate of what a damaged span held (stops at the first length or record
/// that does not read).
pub(super) fn events_unchecked(buf: &[u8], from: u64, to: u64) -> u64 {
    let mut at = usize::try_from(from).unwrap_or(usize::MAX);
    let to = usize::try_from(to).unwrap_or(usize::MAX).min(buf.len());
    let mut n = 0;
    while let Some(head) = buf
        .get(at..at + FRAME_HEAD)
        .filter(|_| at + FRAME_HEAD <= to)
    {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let Some(payload) = buf
            .get(at + FRAME_HEAD..at + FRAME_HEAD + len)
            .filter(|_| len > 0)
        else {
            break;
        };
        let Some(records) = format::decode_records(&bytes::Bytes::copy_from_slice(payload)) else {
            break;
        };
        n += records
            .iter()
            .filter(|r| matches!(r, format::Record::Event { .. }))
            .count() as u64;
        at += FRAME_HEAD + len;
    }
    n
}

/// Whether `buf` holds only zero bytes from `from` on.
pub(crate) fn zeros_after(buf: &[u8], from: u64) -> bool {
    usize::try_from(from)
        .ok()
        .and_then(|f| buf.get(f..))
        .is_none_or(|rest| rest.iter().all(|b| *b == 0))
}

/// The whole of `file` (`size` bytes) in memory.
pub(crate) fn read_whole(file: &dyn FsFile, size: u64) -> io::Result<Vec<u8>> {
    read_range(file, 0, size)
}

/// The bytes of `file` from `from` to `to` in memory (fewer where the file ends before).
pub(crate) fn read_range(file: &dyn FsFile, from: u64, to: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    read_range_into(file, from, to, &mut buf)?;
    Ok(buf)
}

/// [`read_range`] into `buf`, whose allocation is reused when it is large enough (the scrub
/// reads a chunk after another into one buffer).
pub(crate) fn read_range_into(
    file: &dyn FsFile,
    from: u64,
    to: u64,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    let n = to.saturating_sub(from);
    buf.clear();
    buf.resize(usize::try_from(n).map_err(io::Error::other)?, 0);
    let mut at = 0usize;
    while at < buf.len() {
        let n = file.read_at(buf.get_mut(at..).unwrap_or_default(), from + at as u64)?;
        if n == 0 {
            buf.truncate(at);
            break;
        }
        at += n;
    }
    Ok(())
}

/// How a damaged file goes to the quarantine folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Copied: the log goes on using (and may rewrite) the file.
    Copy,
    /// Moved: the log cannot use the file at all.
    Move,
}

/// Put `path` into the quarantine folder `dir` (`<ms>-<name>`), synced; answers the new path.
///
/// # Errors
/// I/O failures.
pub fn quarantine(
    fs: &Arc<dyn Fs>,
    path: &Path,
    dir: &Path,
    now_ms: u64,
    how: Keep,
) -> io::Result<PathBuf> {
    fs.create_dir_all(dir)?;
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let taken = fs.list(dir)?;
    // A damaged span stepped over stays in its file: the next start finds it again. A copy
    // already kept of the same content is not made again.
    if let Some(same) = taken
        .iter()
        .filter(|t| t.ends_with(&format!("-{name}")))
        .map(|t| dir.join(t))
        .find(|t| same_content(fs, path, t).unwrap_or(false))
    {
        if how == Keep::Move {
            fs.remove(path)?;
            if let Some(parent) = path.parent() {
                fs.sync_dir(parent)?;
            }
        }
        return Ok(same);
    }
    let mut n = 0u32;
    let target = loop {
        let candidate = match n {
            0 => format!("{now_ms}-{name}"),
            n => format!("{now_ms}-{n}-{name}"),
        };
        if !taken.contains(&candidate) {
            break dir.join(candidate);
        }
        n += 1;
    };
    // Copied, then (moved) removed: the copy is synced before the original goes.
    let src = fs.open(path)?;
    let size = src.size()?;
    let dst = fs.create(&target)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < size {
        let want = usize::try_from((size - at).min(buf.len() as u64)).unwrap_or(0);
        let chunk = buf.get_mut(..want).unwrap_or_default();
        let got = src.read_at(chunk, at)?;
        if got == 0 {
            break;
        }
        dst.write_at(chunk.get(..got).unwrap_or_default(), at)?;
        at += got as u64;
    }
    dst.sync_data()?;
    dst.done_writing();
    fs.sync_dir(dir)?;
    if how == Keep::Move {
        fs.remove(path)?;
        if let Some(parent) = path.parent() {
            fs.sync_dir(parent)?;
        }
    }
    Ok(target)
}

/// Whether files `a` and `b` hold the same bytes.
fn same_content(fs: &Arc<dyn Fs>, a: &Path, b: &Path) -> io::Result<bool> {
    let (fa, fb) = (fs.open(a)?, fs.open(b)?);
    let size = fa.size()?;
    if fb.size()? != size {
        return Ok(false);
    }
    Ok(read_whole(&*fa, size)? == read_whole(&*fb, size)?)
}

/// Bytes the quarantine folder `dir` holds (0 when it does not exist).
pub fn quarantine_bytes(fs: &Arc<dyn Fs>, dir: &Path) -> u64 {
    let Ok(names) = fs.list(dir) else { return 0 };
    names
        .iter()
        .filter_map(|n| fs.open(&dir.join(n)).ok())
        .map(|f| f.disk_bytes().max(f.size().unwrap_or(0)))
        .sum()
}

/// A segment the checkpoint lists whose file is gone: restored from the checkpoint so that the
/// frames after it can settle its events; what it still owes at the end is lost.
pub(super) struct Gone;

impl FsFile for Gone {
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "segment file missing",
        ))
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<usize> {
        Ok(0)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(0)
    }
    fn set_len(&self, _: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "segment file missing",
        ))
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
    fn disk_bytes(&self) -> u64 {
        0
    }
    fn allocate(&self, _: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "segment file missing",
        ))
    }
}

/// The first event of a segment file whose header does not read, its frames read by their
/// lengths alone, without their checksums (the salt is in the header). Where a frame does not
/// read (a damaged span right after the header), the next place one does is looked for, one
/// byte at a time: a damaged first frame must not make a header damaged since look like a
/// header write cut by a crash (damage seed 2,584: the newest segment was deleted).
pub(super) fn first_event_unchecked(buf: &[u8]) -> Option<u64> {
    let mut at = format::HEADER;
    while at + format::FRAME_HEAD < buf.len() {
        match unchecked_frame(buf, at) {
            Some((records, next)) => {
                if let Some(seq) = records.iter().find_map(|r| match r {
                    format::Record::Event { seq, .. } => Some(*seq),
                    _ => None,
                }) {
                    return Some(seq);
                }
                at = next;
            }
            None => at += 1,
        }
    }
    None
}

/// Events above `floor` in the frames of a segment file whose header does not read, found as
/// [`first_event_unchecked`] finds them (stepping over what does not read).
pub(super) fn events_scanned(buf: &[u8], floor: u64) -> u64 {
    let mut at = format::HEADER;
    let mut n = 0;
    while at + format::FRAME_HEAD < buf.len() {
        match unchecked_frame(buf, at) {
            Some((records, next)) => {
                n += records
                    .iter()
                    .filter(|r| matches!(r, format::Record::Event { seq, .. } if *seq > floor))
                    .count() as u64;
                at = next;
            }
            None => at += 1,
        }
    }
    n
}

/// The records of a frame at `at` read by its length alone, and where the next one starts.
fn unchecked_frame(buf: &[u8], at: usize) -> Option<(Vec<format::Record>, usize)> {
    let head = buf.get(at..at + format::FRAME_HEAD)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len == 0 || len > format::MAX_FRAME as usize {
        return None;
    }
    let end = at + format::FRAME_HEAD + len;
    let payload = buf.get(at + format::FRAME_HEAD..end)?;
    if !format::is_record_kind(*payload.first()?) {
        return None;
    }
    let records = format::decode_records(&bytes::Bytes::copy_from_slice(payload))?;
    Some((records, end))
}

/// Frames of a segment file whose header does not read, read by their lengths alone.
pub(super) fn frames_unchecked(buf: &[u8]) -> u64 {
    let mut at = format::HEADER;
    let mut n = 0;
    while let Some(head) = buf.get(at..at + format::FRAME_HEAD) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len == 0 || buf.len() < at + format::FRAME_HEAD + len {
            break;
        }
        n += 1;
        at += format::FRAME_HEAD + len;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(salt: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = vec![0u8; 48];
        for p in payloads {
            format::frame(salt, p, &mut out);
        }
        out
    }

    #[test]
    fn a_damaged_frame_is_stepped_over_to_the_next_one_of_its_salt() {
        let buf = frames(7, &[&[2, 0, 0], &[2, 1, 1, 1], &[4, 9]]);
        let second = 48 + 8 + 3;
        let third = second + 8 + 4;
        let mut bad = buf.clone();
        bad[second + 9] ^= 1;
        assert!(frame_at(&bad, 7, second as u64).is_none());
        assert_eq!(next_frame(&bad, 7, second as u64), Some(third as u64));
        assert_eq!(next_frame(&bad, 8, second as u64), None, "another salt");
        // The length itself damaged: found by looking at every start.
        bad[second] ^= 0x40;
        assert_eq!(next_frame(&bad, 7, second as u64), Some(third as u64));
        assert_eq!(next_frame(&bad, 7, third as u64), None, "the last frame");
    }

    #[test]
    fn a_file_already_kept_as_it_is_is_not_copied_again() {
        let dir = tempfile::tempdir().unwrap();
        let fs: Arc<dyn Fs> = Arc::new(crate::store::fs::RealFs);
        let seg = dir.path().join("1.seg");
        std::fs::write(&seg, b"damaged").unwrap();
        let q = dir.path().join(QUARANTINE);
        let first = quarantine(&fs, &seg, &q, 1, Keep::Copy).unwrap();
        assert_eq!(quarantine(&fs, &seg, &q, 2, Keep::Copy).unwrap(), first);
        std::fs::write(&seg, b"damaged twice").unwrap();
        let second = quarantine(&fs, &seg, &q, 3, Keep::Copy).unwrap();
        assert_ne!(second, first, "new content, a new copy");
        assert_eq!(std::fs::read_dir(&q).unwrap().count(), 2);
    }

    #[test]
    fn zeros_end_the_frames() {
        let buf = frames(3, &[&[4, 1, 0, 0, 0]]);
        let mut padded = buf.clone();
        padded.resize(4096, 0);
        assert!(zeros_after(&padded, buf.len() as u64));
        assert!(!zeros_after(&padded, 48));
    }
}
