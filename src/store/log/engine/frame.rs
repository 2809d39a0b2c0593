//! A frame's write, prepared under the log's lock by [`Log::take_frame`] and run by the
//! committer outside it.

use super::format::{self, FRAME_HEAD, HEADER};
use super::{Log, INDEX_STRIDE, SECTOR_WRITE_MAX};
use crate::store::fs::FsFile;
use crate::store::StoreError;
use std::sync::Arc;

/// A write prepared under the lock, done outside it: one frame at an offset of a file.
pub struct FrameWrite {
    pub(super) file: Arc<dyn FsFile>,
    /// Where `bytes` go: the frame's offset rounded down to [`super::LogOptions::align`] (or to
    /// [`super::LogOptions::sector`] for a small write within written blocks).
    pub(super) offset: u64,
    /// The head's partial block (or sector) before the frame, the frame, zeros to the next
    /// block (or sector).
    pub(super) bytes: Vec<u8>,
    /// Bytes of the frame itself.
    pub(super) frame: usize,
    /// Reserve the file to this length first ([`super::LogOptions::allocate_step`]).
    pub(super) allocate: Option<u64>,
}

impl FrameWrite {
    /// Write and `fdatasync` the frame.
    ///
    /// # Errors
    /// I/O failure (the log must then fail-stop: [`super::Log::fail`]).
    pub fn run(&self) -> std::io::Result<()> {
        self.write()?;
        self.sync()
    }

    /// The first half of [`FrameWrite::run`]: reserve blocks if due, write the frame (direct
    /// where the file allows it, else into the page cache).
    ///
    /// # Errors
    /// As [`FrameWrite::run`].
    pub fn write(&self) -> std::io::Result<()> {
        if let Some(len) = self.allocate {
            self.file.allocate(len)?;
        }
        self.file.write_at(&self.bytes, self.offset)
    }

    /// The second half of [`FrameWrite::run`]: `fdatasync` the file.
    ///
    /// # Errors
    /// As [`FrameWrite::run`].
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Bytes of the frame (head and records).
    pub fn bytes(&self) -> usize {
        self.frame
    }

    /// Where the write goes and how long it is (tests of its granularity).
    #[cfg(test)]
    pub fn span(&self) -> (u64, usize) {
        (self.offset, self.bytes.len())
    }
}

/// Largest staging buffer kept from one frame to the next: a burst of large publishes does not
/// hold its size afterwards.
const KEEP_STAGED: usize = 256 << 10;

impl Log {
    /// Take what is staged as one frame for the head segment (starting a new head first when it
    /// is full). Write it with [`FrameWrite::run`], outside any lock.
    ///
    /// # Errors
    /// Starting a new segment failed, or an earlier write failure.
    pub fn take_frame(&mut self, now_ms: u64) -> Result<Option<FrameWrite>, StoreError> {
        self.check()?;
        self.now_ms = self.now_ms.max(now_ms);
        if self.staged.is_empty() {
            return Ok(None);
        }
        let head_full = self
            .segs
            .last()
            .is_none_or(|s| s.len >= self.opts.segment_bytes && s.len > HEADER as u64);
        if head_full {
            self.roll(now_ms, true)?;
        }
        // Both buffers keep their capacity for the next frame (publishes stage into them),
        // up to `KEEP_STAGED`.
        let mut payload = std::mem::take(&mut self.staged);
        let mut pending = std::mem::take(&mut self.pending_events);
        let first_event = pending.first().map(|(c, _)| c.seq);
        for (cached, queues) in pending.drain(..) {
            self.add_event(cached.seq, cached.body.len() as u64, queues.into_iter());
            if let Some(seg) = self.segs.last_mut() {
                seg.note_ms(cached.seq, cached.first_ms);
            }
            self.tail_bytes += cached.body.len();
            self.tail.push_back(cached);
        }
        while self.tail_bytes > self.opts.tail_bytes {
            match self.tail.pop_front() {
                Some(c) => self.tail_bytes -= c.body.len(),
                None => break,
            }
        }
        let Some(seg) = self.segs.last_mut() else {
            return Err(StoreError::Io("event log has no segment".into()));
        };
        seg.refs = seg.refs.union(std::mem::replace(
            &mut self.staged_refs,
            super::segment::Refs::None,
        ));
        let align = self.opts.align.max(1);
        let offset = seg.len;
        let start = offset - self.head_block.len() as u64;
        let mut bytes = std::mem::take(&mut self.head_block);
        bytes.reserve(FRAME_HEAD + payload.len() + align as usize);
        format::frame(seg.hdr.salt, &payload, &mut bytes);
        if payload.capacity() <= KEEP_STAGED {
            payload.clear();
            self.staged = payload;
            self.pending_events = pending;
        }
        let frame = bytes.len() - (offset - start) as usize;
        seg.len += frame as u64;
        self.written += frame as u64;
        if let Some(first) = first_event {
            seg.index_frame(first, offset, INDEX_STRIDE);
        }
        // The new partial block starts the next write; zeros complete this one.
        let kept = (seg.len % align) as usize;
        let cut = bytes.len() - kept;
        self.head_block
            .extend_from_slice(bytes.get(cut..).unwrap_or_default());
        let whole = bytes.len().next_multiple_of(align as usize) as u64;
        // Sectors instead of blocks where that is cheaper (see `LogOptions::sector`): from the
        // sector of the frame's offset to the sector of its end.
        let sector = self.sector.clamp(1, align);
        let by_sector = sector < align
            && whole <= SECTOR_WRITE_MAX
            && (whole <= align || start + whole <= self.head_written);
        let (offset, skip) = if by_sector {
            let from = offset - offset % sector;
            (from, (from - start) as usize)
        } else {
            (start, 0)
        };
        bytes.drain(..skip);
        let unit = if by_sector { sector } else { align };
        bytes.resize(bytes.len().next_multiple_of(unit as usize), 0);
        let end = offset + bytes.len() as u64;
        // A block a write reached is written whole from then on (the file system zeroes the
        // rest of a reserved one).
        self.head_written = self.head_written.max(end.next_multiple_of(align));
        let allocate = (end > self.head_allocated).then(|| {
            self.head_allocated = end.next_multiple_of(self.opts.allocate_step.max(1));
            self.head_allocated
        });
        Ok(Some(FrameWrite {
            file: seg.file.clone(),
            offset,
            bytes,
            frame,
            allocate,
        }))
    }
}
