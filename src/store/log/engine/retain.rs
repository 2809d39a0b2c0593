//! Keeping settled segments for a while: the **retention horizon**.
//!
//! Whoever reads the log at start for more than what is pending (the broker's deduplication
//! window) tells the log how far back it needs events: [`Log::retain_since`], a time on the
//! events' own clock (their acceptance time, `first_ms` in [`Record::Event`]). A segment whose
//! newest event was accepted at or after it is **kept**: collection does not delete it when
//! nothing in it is pending, and compaction does not copy it (a copy keeps only the pending
//! events, so it would drop the records of the settled ones). Nothing is written for it: the
//! segment's own `Event` records are what is kept.
//!
//! Kept segments count in the disk bound. When a publish would pass it, the oldest segments
//! that are kept only for the horizon go first ([`Log::release_kept`]), before the spare is the
//! only thing left and before the publish is refused: the horizon then starts later than asked.
//! Each such release is counted ([`Log::kept_evicted`]) and logged.
//!
//! At start the reader gets the kept events back with [`Log::plan_retained`]: each segment
//! holding events accepted since the horizon is read whole, once, outside the log's lock.
//!
//! The horizon is not persisted: after a restart it is unset (nothing kept) until the reader
//! sets it again, which the broker does first thing in its open, before anything can settle.
//! Nothing deletes or copies a settled segment before that: collection runs in a round after a
//! frame, and nothing is written before the broker opens; compaction waits for segments nobody
//! settled in for `persistence__compactAfterIdleSeconds`, a restart counting as a settlement
//! (`recover.rs`), and the committer first weighs segments one idle tick (1 s) after it starts.

use super::format::{self, Record};
use super::segment::{past_hole, Seg};
use super::{damage, io_err, Log};
use crate::store::fs::FsFile;
use crate::store::{RetainedEvent, StoreError};
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;

/// The log's retention state.
#[derive(Debug, Default)]
pub(super) struct Retention {
    /// Keep segments whose newest event was accepted at or after this (wall ms); `None`: keep
    /// nothing past what is pending.
    since_ms: Option<u64>,
    /// Segments numbered up to this one are no longer kept: the disk bound needed them.
    released_through: u64,
    /// Segments released early for the disk bound since open.
    evicted: u64,
}

/// The newest acceptance time of `seg`'s events (`None`: it has none).
fn newest_ms(seg: &Seg) -> Option<u64> {
    seg.ms_runs.iter().map(|(_, ms)| *ms).max()
}

impl Log {
    /// Keep settled segments whose newest event was accepted at or after `since_ms` (`None`:
    /// keep none). Returns whether a segment with nothing pending stopped being kept, so that
    /// the caller can have it collected.
    pub fn retain_since(&mut self, since_ms: Option<u64>) -> bool {
        let before: Vec<u64> = self.idle_kept().collect();
        self.retain.since_ms = since_ms;
        before
            .iter()
            .any(|no| self.segs.iter().any(|s| s.hdr.no == *no && !self.kept(s)))
    }

    /// Whether `seg` is kept for the retention horizon (whatever it owes).
    pub(super) fn kept(&self, seg: &Seg) -> bool {
        let Some(since) = self.retain.since_ms else {
            return false;
        };
        seg.hdr.no > self.retain.released_through && newest_ms(seg).is_some_and(|ms| ms >= since)
    }

    /// Numbers of the closed segments with nothing pending that are kept only for the horizon.
    fn idle_kept(&self) -> impl Iterator<Item = u64> + '_ {
        let head = self.segs.len().saturating_sub(1);
        self.segs
            .iter()
            .take(head)
            .filter(|s| s.pending() == 0 && self.kept(s))
            .map(|s| s.hdr.no)
    }

    /// Bytes of the segments kept only for the horizon.
    pub fn kept_bytes(&self) -> u64 {
        let kept: Vec<u64> = self.idle_kept().collect();
        self.segs
            .iter()
            .filter(|s| kept.contains(&s.hdr.no))
            .map(|s| s.len)
            .sum()
    }

    /// Segments released early (before the horizon let them go) for the disk bound since open.
    pub fn kept_evicted(&self) -> u64 {
        self.retain.evicted
    }

    /// Stop keeping the oldest segments kept only for the horizon until `need` bytes are
    /// released (or none is left); the next collection deletes them. Returns the bytes
    /// released. Each is counted and logged: the horizon now starts later than asked.
    pub(super) fn release_kept(&mut self, need: u64) -> u64 {
        let mut released = 0;
        let mut through = None;
        let mut n = 0u64;
        for s in self.segs.iter().take(self.segs.len().saturating_sub(1)) {
            if released >= need {
                break;
            }
            if !self.kept(s) {
                continue;
            }
            // Oldest first: a segment still owing events is passed over (it stays for what it
            // owes), and the horizon moves past it.
            through = Some(s.hdr.no);
            if s.pending() == 0 {
                released += s.len;
                n += 1;
            }
        }
        if let Some(no) = through {
            self.retain.released_through = no;
            self.retain.evicted += n;
            let newest = self
                .segs
                .iter()
                .find(|s| s.hdr.no == no)
                .and_then(newest_ms);
            tracing::warn!(
                segments = n,
                bytes = released,
                through_segment = no,
                now_kept_from_ms = ?newest.map(|ms| ms + 1),
                "event log at its disk bound: settled segments kept for the deduplication window deleted early; after a restart the window remembers less"
            );
        }
        released
    }

    /// Plan reading every event accepted at or after `since_ms` (settled or not), segment by
    /// segment (run it with [`RetainedScan::run`], outside the lock).
    pub fn plan_retained(&self, since_ms: u64) -> RetainedScan {
        let segs = self
            .segs
            .iter()
            .filter(|s| newest_ms(s).is_some_and(|ms| ms >= since_ms))
            .map(|s| ScanSeg {
                path: self.path(s.hdr.no),
                file: s.file.clone(),
                salt: s.hdr.salt,
                len: s.len,
                holes: s.holes.clone(),
            })
            .collect();
        RetainedScan { since_ms, segs }
    }
}

/// A segment to read.
struct ScanSeg {
    path: PathBuf,
    file: Arc<dyn FsFile>,
    salt: u64,
    len: u64,
    holes: Vec<(u64, u64)>,
}

/// The read of kept events prepared by [`Log::plan_retained`].
pub struct RetainedScan {
    since_ms: u64,
    segs: Vec<ScanSeg>,
}

impl RetainedScan {
    /// Segments to read.
    pub fn segments(&self) -> usize {
        self.segs.len()
    }

    /// Read each planned segment whole, once, in order, and hand every event accepted at or
    /// after the horizon to `f`, in sequence order. A frame that does not read ends that
    /// segment's events (damage found at open is stepped over, as reads do).
    ///
    /// # Errors
    /// I/O failure reading a segment.
    pub fn run(&self, f: &mut dyn FnMut(RetainedEvent)) -> Result<(), StoreError> {
        for s in &self.segs {
            let buf = damage::read_whole(&*s.file, s.len).map_err(|e| io_err(&s.path, e))?;
            let buf = Bytes::from(buf);
            let mut offset = format::HEADER as u64;
            while offset < s.len {
                offset = past_hole(&s.holes, offset);
                let Some((payload, next)) = damage::frame_at(&buf, s.salt, offset) else {
                    break;
                };
                let start = (next as usize).saturating_sub(payload.len());
                let payload = buf.slice(start..next as usize);
                for r in format::decode_records(&payload).unwrap_or_default() {
                    if let Record::Event {
                        seq,
                        first_ms,
                        queues,
                        id,
                        body,
                        ..
                    } = r
                    {
                        if first_ms >= self.since_ms {
                            f(RetainedEvent {
                                seq,
                                accepted_ms: first_ms,
                                queues,
                                id,
                                body,
                            });
                        }
                    }
                }
                offset = next;
            }
        }
        Ok(())
    }
}
