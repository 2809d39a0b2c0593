//! The storage seam: every file operation of the event log goes through [`Fs`] and [`FsFile`].
//!
//! [`RealFs`] is the operating system's file system. [`sim::SimFs`] (tests and the bench) is a
//! disk that keeps only what was synced when it "loses power": unsynced writes are dropped or
//! torn, files created or removed without a directory sync come back as they were. The log is
//! written against these two traits only, so every crash a real disk can produce can be replayed
//! from a seed (see `store/log/sim.rs`).
//!
//! The contract the log relies on (POSIX's, and what `SimFs` models):
//!
//! * [`FsFile::write_at`] is durable only after [`FsFile::sync_data`] of that file returns;
//! * a created, removed or renamed directory entry is durable only after [`Fs::sync_dir`] of its
//!   directory returns;
//! * a write that was not synced may be lost whole, in part, or leave garbage in the last sector
//!   it touched; nothing else changes.

pub mod sim;

use std::io;
use std::path::Path;
use std::sync::Arc;

/// An open file.
pub trait FsFile: Send + Sync + 'static {
    /// Write all of `buf` at `offset` (the file grows as needed).
    ///
    /// # Errors
    /// I/O failure; the file's content from `offset` on is then unknown.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Read up to `buf.len()` bytes at `offset`; fewer only at the end of the file.
    ///
    /// # Errors
    /// I/O failure.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// The file's length.
    ///
    /// # Errors
    /// I/O failure.
    fn size(&self) -> io::Result<u64>;

    /// Cut the file to `len` bytes.
    ///
    /// # Errors
    /// I/O failure.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Make every write so far durable (`fdatasync`).
    ///
    /// # Errors
    /// I/O failure: what was written since the last sync may be lost.
    fn sync_data(&self) -> io::Result<()>;

    /// Bytes the file occupies on disk (allocated blocks).
    fn disk_bytes(&self) -> u64;
}

/// A file system: directories and files.
pub trait Fs: Send + Sync + 'static {
    /// Create a directory and its parents.
    ///
    /// # Errors
    /// I/O failure.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Names of the files in `dir` (not sub-directories); empty when `dir` does not exist.
    ///
    /// # Errors
    /// I/O failure.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;

    /// Create a new, empty file (an error if it exists). Durable only after [`Fs::sync_dir`].
    ///
    /// # Errors
    /// I/O failure, or the file exists.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn FsFile>>;

    /// Open an existing file for reading and writing.
    ///
    /// # Errors
    /// I/O failure, or no such file.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FsFile>>;

    /// Remove a file. Durable only after [`Fs::sync_dir`].
    ///
    /// # Errors
    /// I/O failure.
    fn remove(&self, path: &Path) -> io::Result<()>;

    /// Make the directory's entries (files created, removed) durable.
    ///
    /// # Errors
    /// I/O failure.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

struct RealFile(std::fs::File);

impl FsFile for RealFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let rest = buf.get_mut(done..).unwrap_or_default();
            match std::os::unix::fs::FileExt::read_at(&self.0, rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.0.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }
}

impl Fs for RealFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for e in entries {
            let e = e?;
            if e.file_type()?.is_file() {
                names.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(RealFile(f)))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        Ok(Arc::new(RealFile(f)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }
}
