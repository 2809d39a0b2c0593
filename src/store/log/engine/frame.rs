//! A frame's write, prepared under the log's lock by [`super::Log::take_frame`] and run by the
//! committer outside it.

use crate::store::fs::FsFile;
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
