//! A simulated disk for power-cut tests ([`SimFs`]), in the manner of TigerBeetle's simulated
//! storage: the whole file system lives in memory, every mutating call counts as one step, and a
//! seeded run can *cut the power* at any step.
//!
//! What a power cut does (the worst a real disk is allowed to do, see [`super`]):
//!
//! * every file gets back the content it had at its last [`FsFile::sync_data`]; each write made
//!   since then is, by the seed's choice, lost, kept, or **torn**: a prefix of it kept and the
//!   rest of its last 512-byte sector filled with garbage, except bytes the write only rewrote
//!   with the value they held (the event log writes the head's last partial block again with
//!   each frame, as PostgreSQL's and InnoDB's logs do: the model is that a torn sector keeps old
//!   or new content where the two agree, which page-cache writeback of a partly written page
//!   has always relied on too);
//! * every directory gets back the entries it had at its last [`Fs::sync_dir`]: a file created
//!   without a directory sync is gone, a file removed without one is back;
//! * handles opened before the cut fail from then on.
//!
//! After [`SimFs::power_cut`] (or the step set by [`SimFs::crash_at_step`], after which every call
//! fails with `EIO` until the cut), [`SimFs::reboot`] applies the rules above and the store under
//! test opens the disk again. The same seed gives the same cut.

use super::{Fs, FsFile};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A small deterministic generator (SplitMix64): the seed decides every choice of the disk.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

type FileId = u64;

/// A write or truncation not yet made durable by a sync.
#[derive(Debug, Clone)]
enum Unsynced {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default, Clone)]
struct FileData {
    durable: Vec<u8>,
    current: Vec<u8>,
    unsynced: Vec<Unsynced>,
}

#[derive(Debug, Default)]
struct State {
    rng: Option<Rng>,
    /// Bumped by every reboot: handles of an older generation fail.
    generation: u64,
    files: HashMap<FileId, FileData>,
    next_id: FileId,
    /// Directory entries as the running system sees them.
    current: HashMap<PathBuf, HashMap<String, FileId>>,
    /// Directory entries as of each directory's last sync.
    durable: HashMap<PathBuf, HashMap<String, FileId>>,
    steps: u64,
    crash_at: Option<u64>,
    crashed: bool,
    /// Bytes returned by reads so far.
    read: u64,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated disk: {what}"))
}

impl State {
    /// Count one mutating step; fail once the crash step is reached.
    fn step(&mut self) -> io::Result<()> {
        if self.crashed {
            return Err(eio("power is off"));
        }
        self.steps += 1;
        if self.crash_at.is_some_and(|at| self.steps >= at) {
            self.crashed = true;
            return Err(eio("power cut"));
        }
        Ok(())
    }

    fn split(path: &Path) -> io::Result<(PathBuf, String)> {
        let dir = path.parent().ok_or_else(|| eio("no parent"))?;
        let name = path
            .file_name()
            .ok_or_else(|| eio("no file name"))?
            .to_string_lossy()
            .into_owned();
        Ok((dir.to_path_buf(), name))
    }

    fn lookup(&self, path: &Path) -> io::Result<FileId> {
        let (dir, name) = Self::split(path)?;
        self.current
            .get(&dir)
            .and_then(|d| d.get(&name))
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }
}

fn write_into(buf: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let end = start + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    if let Some(dst) = buf.get_mut(start..end) {
        dst.copy_from_slice(data);
    }
}

/// The simulated disk. Clones share it.
#[derive(Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimFs")
    }
}

impl SimFs {
    /// An empty disk whose power cuts are decided by `seed`.
    pub fn new(seed: u64) -> Self {
        let fs = Self::default();
        fs.lock().rng = Some(Rng::new(seed));
        fs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Mutating calls made so far.
    pub fn steps(&self) -> u64 {
        self.lock().steps
    }

    /// Cut the power when the mutating call number `step` (counted from the start) is made: that
    /// call and every later one fail until [`SimFs::reboot`].
    pub fn crash_at_step(&self, step: u64) {
        self.lock().crash_at = Some(step);
    }

    /// Whether the power is off (a crash step was reached or [`SimFs::power_cut`] called).
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Bytes read from files so far (what a start reads, measured without a clock).
    pub fn bytes_read(&self) -> u64 {
        self.lock().read
    }

    /// Cut the power now.
    pub fn power_cut(&self) {
        self.lock().crashed = true;
    }

    /// Damage synced data (between a reboot and the next open): `bytes` over the file at
    /// `path` from `offset`, durably, as a disk that flips a bit or returns a wrong sector does.
    ///
    /// # Errors
    /// No such file.
    pub fn damage(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        let (dir, name) = State::split(path)?;
        let id = s
            .current
            .get(&dir)
            .and_then(|d| d.get(&name))
            .copied()
            .ok_or_else(|| eio("no such file"))?;
        let f = s.files.get_mut(&id).ok_or_else(|| eio("no such file"))?;
        write_into(&mut f.durable, offset, bytes);
        write_into(&mut f.current, offset, bytes);
        Ok(())
    }

    /// Lose a file for good (between a reboot and the next open): its directory entry is gone,
    /// durably.
    ///
    /// # Errors
    /// No such file.
    pub fn lose(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let (dir, name) = State::split(path)?;
        let gone = s.current.get_mut(&dir).and_then(|d| d.remove(&name));
        if let Some(d) = s.durable.get_mut(&dir) {
            d.remove(&name);
        }
        gone.map(|_| ()).ok_or_else(|| eio("no such file"))
    }

    /// Power on again after a cut: apply the rules in the module docs.
    pub fn reboot(&self) {
        let mut s = self.lock();
        let mut rng = s.rng.take().unwrap_or_else(|| Rng::new(0));
        s.generation += 1;
        s.current = s.durable.clone();
        let ids: Vec<FileId> = s.files.keys().copied().collect();
        for id in ids {
            let Some(f) = s.files.get_mut(&id) else {
                continue;
            };
            let mut content = f.durable.clone();
            for u in std::mem::take(&mut f.unsynced) {
                match u {
                    Unsynced::SetLen(len) => {
                        if rng.chance(1, 2) {
                            content.resize(len as usize, 0);
                        }
                    }
                    Unsynced::Write { offset, data } => match rng.below(3) {
                        0 => {}
                        1 => write_into(&mut content, offset, &data),
                        _ => {
                            let keep = rng.below(data.len() as u64 + 1) as usize;
                            let mut torn = data.get(..keep).unwrap_or_default().to_vec();
                            let sector_end = (offset as usize + keep).div_ceil(512) * 512;
                            let garbage = sector_end.saturating_sub(offset as usize + keep);
                            for i in keep..keep + garbage {
                                let noise = rng.next_u64() as u8;
                                // A byte the write rewrites with what it already holds keeps it.
                                let old = content.get(offset as usize + i).copied();
                                torn.push(match data.get(i) {
                                    Some(new) if old == Some(*new) => *new,
                                    _ => noise,
                                });
                            }
                            write_into(&mut content, offset, &torn);
                        }
                    },
                }
            }
            f.durable = content.clone();
            f.current = content;
        }
        // Files no directory names any more are gone.
        let named: std::collections::HashSet<FileId> = s
            .current
            .values()
            .flat_map(|d| d.values().copied())
            .collect();
        s.files.retain(|id, _| named.contains(id));
        s.crashed = false;
        s.crash_at = None;
        s.rng = Some(rng);
    }
}

struct SimFile {
    fs: SimFs,
    id: FileId,
    generation: u64,
}

impl SimFile {
    fn with<T>(&self, mutate: bool, f: impl FnOnce(&mut FileData) -> T) -> io::Result<T> {
        let mut s = self.fs.lock();
        if s.generation != self.generation {
            return Err(eio("stale handle (opened before a power cut)"));
        }
        if mutate {
            s.step()?;
        } else if s.crashed {
            return Err(eio("power is off"));
        }
        let file = s
            .files
            .get_mut(&self.id)
            .ok_or_else(|| eio("file vanished"))?;
        Ok(f(file))
    }
}

impl FsFile for SimFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with(true, |f| {
            write_into(&mut f.current, offset, buf);
            f.unsynced.push(Unsynced::Write {
                offset,
                data: buf.to_vec(),
            });
        })
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let n = self.with(false, |f| {
            let start = (offset as usize).min(f.current.len());
            let src = f.current.get(start..).unwrap_or_default();
            let n = src.len().min(buf.len());
            if let (Some(dst), Some(src)) = (buf.get_mut(..n), src.get(..n)) {
                dst.copy_from_slice(src);
            }
            n
        })?;
        self.fs.lock().read += n as u64;
        Ok(n)
    }

    fn size(&self) -> io::Result<u64> {
        self.with(false, |f| f.current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(true, |f| {
            f.current.resize(len as usize, 0);
            f.unsynced.push(Unsynced::SetLen(len));
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(true, |f| {
            f.durable = f.current.clone();
            f.unsynced.clear();
        })
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.with(true, |f| {
            if (f.current.len() as u64) < len {
                f.current.resize(len as usize, 0);
                f.unsynced.push(Unsynced::SetLen(len));
            }
        })
    }

    fn disk_bytes(&self) -> u64 {
        self.with(false, |f| (f.current.len() as u64).div_ceil(4096) * 4096)
            .unwrap_or(0)
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.step()?;
        // Directories themselves are assumed durable (made once, before any data).
        s.current.entry(dir.to_path_buf()).or_default();
        s.durable.entry(dir.to_path_buf()).or_default();
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let s = self.lock();
        if s.crashed {
            return Err(eio("power is off"));
        }
        let mut names: Vec<String> = s
            .current
            .get(dir)
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default();
        names.sort();
        Ok(names)
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        let mut s = self.lock();
        s.step()?;
        let (dir, name) = State::split(path)?;
        if s.current.get(&dir).is_some_and(|d| d.contains_key(&name)) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file exists"));
        }
        let id = s.next_id;
        s.next_id += 1;
        s.files.insert(id, FileData::default());
        s.current.entry(dir).or_default().insert(name, id);
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            id,
            generation: s.generation,
        }))
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn FsFile>> {
        let s = self.lock();
        if s.crashed {
            return Err(eio("power is off"));
        }
        let id = s.lookup(path)?;
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            id,
            generation: s.generation,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.step()?;
        let (dir, name) = State::split(path)?;
        s.current
            .get_mut(&dir)
            .and_then(|d| d.remove(&name))
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.step()?;
        let (dir, from_name) = State::split(from)?;
        let (to_dir, to_name) = State::split(to)?;
        if dir != to_dir {
            return Err(eio("rename across directories"));
        }
        let entries = s
            .current
            .get_mut(&dir)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such directory"))?;
        let id = entries
            .remove(&from_name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))?;
        // The file `to` named before, if any, stays readable through open handles.
        entries.insert(to_name, id);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.step()?;
        let entries = s.current.get(dir).cloned().unwrap_or_default();
        s.durable.insert(dir.to_path_buf(), entries);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_data_and_entries_survive_a_cut_unsynced_ones_may_not() {
        let fs = SimFs::new(7);
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let f = fs.create(&dir.join("a")).unwrap();
        f.write_at(b"hello", 0).unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        let g = fs.create(&dir.join("b")).unwrap(); // entry never synced
        g.write_at(b"x", 0).unwrap();
        g.sync_data().unwrap();
        f.write_at(b" world", 5).unwrap(); // never synced
        fs.power_cut();
        assert!(f.write_at(b"!", 0).is_err(), "no writes after the cut");
        fs.reboot();
        assert!(f.size().is_err(), "old handles are stale");
        assert_eq!(fs.list(dir).unwrap(), vec!["a".to_string()]);
        let a = fs.open(&dir.join("a")).unwrap();
        let mut buf = vec![0; 64];
        let n = a.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..5], b"hello", "synced bytes are kept");
        assert!(
            n == 5 || n == 11 || n <= 512,
            "unsynced tail: lost, kept or torn"
        );
    }

    #[test]
    fn a_rename_is_durable_after_its_directory_sync_and_old_handles_keep_reading() {
        let fs = SimFs::new(3);
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        let old = fs.create(&dir.join("a")).unwrap();
        old.write_at(b"old", 0).unwrap();
        old.sync_data().unwrap();
        let new = fs.create(&dir.join("a.tmp")).unwrap();
        new.write_at(b"new", 0).unwrap();
        new.sync_data().unwrap();
        fs.sync_dir(dir).unwrap();
        fs.rename(&dir.join("a.tmp"), &dir.join("a")).unwrap();
        let mut buf = [0u8; 3];
        old.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"old", "an open handle keeps the replaced file");
        fs.open(&dir.join("a"))
            .unwrap()
            .read_at(&mut buf, 0)
            .unwrap();
        assert_eq!(&buf, b"new");
        assert_eq!(fs.list(dir).unwrap(), vec!["a".to_string()]);
        // Not synced: the cut brings both names back as they were.
        fs.power_cut();
        fs.reboot();
        assert_eq!(
            fs.list(dir).unwrap(),
            vec!["a".to_string(), "a.tmp".to_string()]
        );
        fs.open(&dir.join("a"))
            .unwrap()
            .read_at(&mut buf, 0)
            .unwrap();
        assert_eq!(&buf, b"old");
        fs.rename(&dir.join("a.tmp"), &dir.join("a")).unwrap();
        fs.sync_dir(dir).unwrap();
        fs.power_cut();
        fs.reboot();
        assert_eq!(fs.list(dir).unwrap(), vec!["a".to_string()]);
        fs.open(&dir.join("a"))
            .unwrap()
            .read_at(&mut buf, 0)
            .unwrap();
        assert_eq!(&buf, b"new");
    }

    #[test]
    fn the_crash_step_fails_that_call_and_every_later_one() {
        let fs = SimFs::new(1);
        fs.create_dir_all(Path::new("/d")).unwrap();
        fs.crash_at_step(3);
        let f = fs.create(Path::new("/d/a")).unwrap(); // step 2
        assert!(f.write_at(b"1", 0).is_err()); // step 3
        assert!(fs.crashed());
        assert!(fs.sync_dir(Path::new("/d")).is_err());
    }
}
