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

pub(crate) mod sim;

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

    /// A hint that `len` bytes at `offset` are read soon: the kernel reads them ahead, so that
    /// hints given for many files are served together rather than one read after another
    /// (`posix_fadvise(WILLNEED)`). Nothing by default.
    fn will_need(&self, _offset: u64, _len: u64) {}

    /// Granularity of writes that go to the device directly: writes whose offset and length
    /// are multiples of it skip the page cache (1: any write is taken as it is).
    fn direct_align(&self) -> u64 {
        1
    }

    /// Reserve blocks so the file is at least `len` bytes long, the new bytes reading as zeros
    /// (`fallocate`; a file system without it just grows the file as it is written). Like
    /// [`FsFile::set_len`], durable after [`FsFile::sync_data`].
    ///
    /// Writing into reserved blocks does not change the file's size, so an `fdatasync` after
    /// it has no size to record: one device write and a cache flush instead of two writes.
    ///
    /// # Errors
    /// I/O failure (the disk is full).
    fn allocate(&self, len: u64) -> io::Result<()>;

    /// The file will not be written again: let go of what writing needed (the real file's
    /// direct descriptor, so a long backlog of closed segments holds one descriptor each).
    fn done_writing(&self) {}
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

    /// Rename `from` to `to` in the same directory, replacing `to` if it exists (atomically:
    /// any reader sees one file or the other). Durable only after [`Fs::sync_dir`].
    ///
    /// # Errors
    /// I/O failure, or no such file.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Make the directory's entries (files created, removed, renamed) durable.
    ///
    /// # Errors
    /// I/O failure.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

/// An open file. Writes whose offset and length are multiples of [`DIRECT_ALIGN`] go through
/// a second descriptor opened with `O_DIRECT` (where the file system allows it): the event
/// log's frames then reach the device in the `pwrite` itself, and the `fdatasync` after them
/// only flushes the device's cache (page-cache writeback plus `fdatasync` took about 1.5 × as
/// long here: docs/BENCHMARKS.md). Other writes and every read use the ordinary descriptor;
/// the kernel keeps the two coherent.
struct RealFile {
    file: std::fs::File,
    path: std::path::PathBuf,
    /// Opened at the first aligned write, with its alignment (`None` inside: the file system
    /// refused it), closed by [`FsFile::done_writing`].
    direct: std::sync::Mutex<Option<Option<Direct>>>,
}

/// The direct descriptor of a [`RealFile`] and the alignment its writes need.
#[derive(Clone)]
struct Direct {
    file: Arc<std::fs::File>,
    align: u64,
}

/// Alignment of memory for direct writes, and of offset and length where the file system does
/// not say (`dio_align`): a 4 KiB page, which every block device's logical block size divides.
pub const DIRECT_ALIGN: u64 = 4096;

/// The sysfs directory of block device `dev` (an `st_dev`): `/sys/dev/block/MAJ:MIN`, which
/// exists only where `dev` is a real block device (not tmpfs, not overlay's anonymous one).
pub fn block_device_dir(dev: u64) -> String {
    // glibc's encoding of a device number.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("/sys/dev/block/{major}:{minor}")
}

/// Offset and length alignment of direct writes to `f`: what `statx` reports
/// (`STATX_DIOALIGN`, Linux 6.1+), else the logical block size of the device holding it
/// (`/sys/dev/block`, for older kernels), else [`DIRECT_ALIGN`]. Only powers of two from 512 to
/// [`DIRECT_ALIGN`] are taken. A frame of a few events then rewrites one or two 512-byte
/// sectors per sync instead of a 4 KiB page (docs/BENCHMARKS.md: device writes).
fn dio_align(f: &std::fs::File) -> u64 {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let valid = |a: u64| (a.is_power_of_two() && (512..=DIRECT_ALIGN).contains(&a)).then_some(a);
    if let Ok(st) = statx(f, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 {
            // 0: the file takes no direct I/O; writes then go through the page cache anyway.
            return valid(u64::from(st.stx_dio_offset_align)).unwrap_or(DIRECT_ALIGN);
        }
    }
    let sysfs = || -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let base = block_device_dir(f.metadata().ok()?.dev());
        // A partition's queue is its disk's.
        ["queue", "../queue"].iter().find_map(|q| {
            let v = std::fs::read_to_string(format!("{base}/{q}/logical_block_size")).ok()?;
            valid(v.trim().parse().ok()?)
        })
    };
    sysfs().unwrap_or(DIRECT_ALIGN)
}

impl RealFile {
    fn new(file: std::fs::File, path: &Path) -> Self {
        Self {
            file,
            path: path.to_path_buf(),
            direct: std::sync::Mutex::new(None),
        }
    }

    /// The direct descriptor, opened on first use.
    fn direct(&self) -> Option<Direct> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut d = crate::sync::lock(&self.direct);
        d.get_or_insert_with(|| {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&self.path)
                .ok()?;
            Some(Direct {
                align: dio_align(&file),
                file: Arc::new(file),
            })
        })
        .clone()
    }

    /// Write `buf` at `offset` with `O_DIRECT`: `Ok(false)` when this file cannot (no direct
    /// descriptor, or an unaligned request).
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<bool> {
        if buf.is_empty() {
            return Ok(false);
        }
        let Some(Direct {
            file: direct,
            align,
        }) = self.direct()
        else {
            return Ok(false);
        };
        if !offset.is_multiple_of(align) || !(buf.len() as u64).is_multiple_of(align) {
            return Ok(false);
        }
        let align = DIRECT_ALIGN as usize;
        // An aligned copy (`O_DIRECT` needs an aligned address), made per write: one kept per
        // file would hold the largest frame's size for every segment of a long backlog.
        let mut scratch: Vec<u8> = Vec::with_capacity(buf.len() + align);
        // Capacity reserved above: filling it never reallocates, so the aligned start stays.
        let start = scratch.as_ptr() as usize;
        let skip = start.next_multiple_of(align) - start;
        scratch.resize(skip, 0);
        scratch.extend_from_slice(buf);
        let aligned = scratch.get(skip..).unwrap_or_default();
        match std::os::unix::fs::FileExt::write_all_at(&*direct, aligned, offset) {
            Ok(()) => Ok(true),
            // A file system that takes the open but not the write (some FUSE, overlay setups).
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl FsFile for RealFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.write_direct(buf, offset)? {
            return Ok(());
        }
        std::os::unix::fs::FileExt::write_all_at(&self.file, buf, offset)
    }

    fn done_writing(&self) {
        *crate::sync::lock(&self.direct) = None;
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.size()? >= len {
            return Ok(());
        }
        match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::empty(), 0, len) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let rest = buf.get_mut(done..).unwrap_or_default();
            match std::os::unix::fs::FileExt::read_at(&self.file, rest, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn will_need(&self, offset: u64, len: u64) {
        let advice = rustix::fs::Advice::WillNeed;
        // Only a hint: a file system without it reads when asked.
        let _ = rustix::fs::fadvise(&self.file, offset, std::num::NonZeroU64::new(len), advice);
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }

    fn direct_align(&self) -> u64 {
        self.direct().map_or(DIRECT_ALIGN, |d| d.align)
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
        Ok(Arc::new(RealFile::new(f, path)))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        Ok(Arc::new(RealFile::new(f, path)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_writes_go_direct_unaligned_ones_do_not_and_both_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = RealFs.create(&path).unwrap();
        f.allocate(1 << 20).unwrap();
        assert_eq!(
            f.size().unwrap(),
            1 << 20,
            "reserved blocks count as the file's"
        );
        assert!(f.disk_bytes() >= 1 << 20);
        let block: Vec<u8> = (0..2 * DIRECT_ALIGN).map(|i| (i % 251) as u8).collect();
        let real = RealFile::new(std::fs::File::open(&path).unwrap(), &path);
        // Unaligned: the ordinary descriptor.
        assert!(!real.write_direct(&block[..100], 0).unwrap());
        assert!(!real.write_direct(&block, 10).unwrap());
        f.write_at(&block[..100], 3).unwrap();
        // Aligned: direct where the file system takes it (tmpfs does not), else buffered.
        f.write_at(&block, DIRECT_ALIGN).unwrap();
        f.sync_data().unwrap();
        let mut back = vec![0u8; block.len()];
        assert_eq!(f.read_at(&mut back, DIRECT_ALIGN).unwrap(), back.len());
        assert_eq!(back, block);
        let mut head = vec![0u8; 100];
        f.read_at(&mut head, 3).unwrap();
        assert_eq!(head, &block[..100]);
        // Closed for writing, the direct descriptor goes; a later write still works.
        f.done_writing();
        f.write_at(&block, 0).unwrap();
        f.read_at(&mut back, 0).unwrap();
        assert_eq!(back, block);
        // Reserving less than the file holds changes nothing.
        f.allocate(10).unwrap();
        assert_eq!(f.size().unwrap(), 1 << 20);
        // The file system's direct alignment (512 on this disk, 4096 where it does not say):
        // a write of one such unit at such an offset is taken whole, and reads back.
        let a = f.direct_align();
        assert!(
            a.is_power_of_two() && (512..=DIRECT_ALIGN).contains(&a),
            "{a}"
        );
        let unit: Vec<u8> = (0..a).map(|i| (i % 13) as u8 + 1).collect();
        f.write_at(&unit, 3 * a).unwrap();
        f.sync_data().unwrap();
        let mut back = vec![0u8; a as usize];
        f.read_at(&mut back, 3 * a).unwrap();
        assert_eq!(back, unit);
    }
}
