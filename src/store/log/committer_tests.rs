//! Tests of the committer's order: what a publish waits for, and what a `commit` waits for.

use super::open::log_options;
use super::tests::{ev, opts};
use super::*;
use crate::store::fs::{Fs, FsFile, RealFs};
use crate::store::Settled;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Condvar, Mutex};

/// The real file system, except that removals and renames wait while held: the committer's
/// round is caught giving segments back.
#[derive(Default)]
struct HeldRemovals {
    /// (held, a removal is waiting)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl HeldRemovals {
    fn hold(&self, on: bool) {
        crate::sync::lock(&self.state).0 = on;
        self.changed.notify_all();
    }

    /// Wait until a removal waits on the hold.
    fn wait_for_removal(&self) {
        let mut g = crate::sync::lock(&self.state);
        while !g.1 {
            let (next, t) = self
                .changed
                .wait_timeout(g, Duration::from_secs(30))
                .unwrap();
            g = next;
            assert!(!t.timed_out(), "no segment was given back");
        }
    }

    fn pass(&self) {
        let mut g = crate::sync::lock(&self.state);
        while g.0 {
            g.1 = true;
            self.changed.notify_all();
            g = self.changed.wait(g).unwrap();
        }
    }
}

struct Release<'a>(&'a HeldRemovals);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.hold(false);
    }
}

impl Fs for HeldRemovals {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        RealFs.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        RealFs.list(dir)
    }
    fn create(&self, path: &Path) -> std::io::Result<Arc<dyn FsFile>> {
        RealFs.create(path)
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn FsFile>> {
        RealFs.open(path)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.pass();
        RealFs.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.pass();
        RealFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        RealFs.sync_dir(dir)
    }
}

/// A publish is answered once the frame holding its events is durable. Giving back the
/// segments that frame let go (and checkpoints, compactions) comes after, off its path; a
/// `commit` still waits for the whole round.
#[tokio::test]
async fn a_publish_does_not_wait_for_segments_to_be_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(HeldRemovals::default());
    let s = LogStore::open_on(fs.clone(), &opts(dir.path())).unwrap();
    for seq in 1..=100u64 {
        s.submit(vec![(1, ev(seq, 2000))])
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    // The last publish's round is over (a publish is answered before it ends).
    s.commit().await.unwrap();
    let before = s.segments();
    assert!(before >= 3, "{before} segments");
    fs.hold(true);
    // Released before the store is dropped, also when an assertion fails (its drop waits for
    // the committer).
    let _release = Release(&fs);
    // Settled without waking the committer: the next publish's frame carries it, and the
    // round of that frame gives the older segments back.
    let all: Vec<u64> = (1..=100).collect();
    s.shared
        .log()
        .stage_settle(1, &Settled::all(all.iter().copied(), 0));
    let publish = s.submit(vec![(1, ev(101, 2000))]).unwrap();
    let mut round = Box::pin(s.commit());
    tokio::time::timeout(Duration::from_secs(30), publish.wait())
        .await
        .expect("the publish is answered while its round gives segments back")
        .unwrap();
    // (The log's lock is held while the files go: nothing that takes it is called here.)
    fs.wait_for_removal();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(
        round.as_mut().poll(&mut cx).is_pending(),
        "a commit waits for the round"
    );
    fs.hold(false);
    round.await.unwrap();
    assert!(
        s.segments() < before,
        "{} of {before} segments left",
        s.segments()
    );
}

/// What a pull acknowledgement waits for (a commit answered at [`Answer::Frame`]) is what a
/// publish waits for: the frame holding the settlements staged before it, durable. Not the
/// round after it.
#[tokio::test]
async fn a_sync_of_staged_settlements_does_not_wait_for_segments_to_be_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(HeldRemovals::default());
    let s = LogStore::open_on(fs.clone(), &opts(dir.path())).unwrap();
    for seq in 1..=100u64 {
        s.submit(vec![(1, ev(seq, 2000))])
            .unwrap()
            .wait()
            .await
            .unwrap();
    }
    s.commit().await.unwrap();
    let before = s.segments();
    assert!(before >= 3, "{before} segments");
    fs.hold(true);
    let _release = Release(&fs);
    let all: Vec<u64> = (1..=100).collect();
    let all = Settled::all(all.iter().copied(), 0);
    let settle = [Settlement::Remove(&all)];
    let commit = s.stage(Writes::Settle(1, &settle), Answer::Frame).unwrap();
    tokio::time::timeout(Duration::from_secs(30), commit.wait())
        .await
        .expect("answered while its round gives segments back")
        .unwrap();
    // The round is held giving back the segments the settlements let go.
    fs.wait_for_removal();
    fs.hold(false);
    s.commit().await.unwrap();
    assert!(s.segments() < before);
}

/// Dead letters handed to the committer and not yet taken by a round are bounded: past
/// [`LETTERS_BOUND`], even a write nobody waits for gets a commit to wait for, which the next
/// round answers (a disk slower than the deliveries slows them, not memory).
#[test]
fn letters_handed_over_past_the_bound_make_the_caller_wait_for_the_round() {
    use crate::store::deadletter::{contract::letter, DeadLetterBound};
    use crate::store::{Answer, Letters, Writes};
    let fs = crate::store::fs::sim::SimFs::new(1);
    let shared: Arc<dyn Fs> = Arc::new(fs);
    let meta = crate::store::meta::FsMeta::open(shared.clone(), "/m".into()).unwrap();
    let store_opts = LogStoreOptions {
        metadata_path: "/m".into(),
        events_path: "/e".into(),
        max_disk_bytes: 1 << 30,
        cache_bytes: 0,
        flush_every_ms: 0,
        segment_bytes: 1 << 20,
        compact_idle_ms: 0,
        refuse_damage: false,
    };
    let log = log_options(&store_opts);
    let (store, driver) = LogStore::simulated(
        shared,
        Box::new(meta),
        &store_opts,
        log,
        Arc::new(AtomicU64::new(1)),
    )
    .unwrap();
    let report = Arc::new(crate::store::contract::CountKept::default());
    let hand = |seq: u64| {
        let job = Letters {
            letters: vec![letter(seq)],
            bound: DeadLetterBound {
                per_subscription: usize::MAX,
                max_bytes: u64::MAX,
            },
            events: Vec::new(),
            report: report.clone(),
        };
        store
            .stage(Writes::Letters(1, job), Answer::Nobody)
            .unwrap()
    };
    for seq in 0..LETTERS_BOUND as u64 {
        assert!(!hand(seq).waits(), "letter {seq} is within the bound");
    }
    let mut behind = hand(LETTERS_BOUND as u64);
    assert!(behind.waits(), "past the bound the caller waits");
    assert!(behind.ready().is_none());
    driver.round().unwrap();
    assert!(matches!(behind.ready(), Some(Ok(()))));
    assert_eq!(report.kept(), LETTERS_BOUND + 1);
    assert!(!hand(0).waits(), "the round took them: room again");
}
