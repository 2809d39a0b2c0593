//! The round's order, shown step by step on a log where every step has something to do.

use super::engine::{Compaction, Log, LogOptions};
use super::round::{self, Host, Round, Step, Waiter};
use super::tests::ev;
use crate::store::fs::{Fs, RealFs};
use crate::store::{QueueId, Settled};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// A host that records what each step did and keeps the compaction handed over.
struct Recording {
    log: Mutex<Log>,
    did: Mutex<Vec<(Step, u64)>>,
    handed: Mutex<Option<Compaction>>,
    /// Whether syncing the letters fails.
    letters_fail: bool,
    letters: crate::store::deadletter::MemoryDeadLetters,
}

impl Recording {
    fn new(log: Log) -> Self {
        Self {
            log: Mutex::new(log),
            did: Mutex::new(Vec::new()),
            handed: Mutex::new(None),
            letters_fail: false,
            letters: Default::default(),
        }
    }

    fn steps(&self) -> Vec<Step> {
        crate::sync::lock(&self.did).iter().map(|d| d.0).collect()
    }
}

impl Host for Recording {
    type Guard<'g> = std::sync::MutexGuard<'g, Log>;
    fn log(&self) -> Self::Guard<'_> {
        crate::sync::lock(&self.log)
    }
    fn now_ms(&self) -> u64 {
        10_000
    }
    fn compacts(&self) -> bool {
        true
    }
    fn hand_over(&self, job: Compaction) -> Option<Compaction> {
        *crate::sync::lock(&self.handed) = Some(job);
        None
    }
    fn dead_letters(&self) -> Option<&dyn crate::store::deadletter::DeadLetterStore> {
        Some(&self.letters)
    }
    fn sync_letters(&self) -> Result<(), crate::store::StoreError> {
        if self.letters_fail {
            return Err(crate::store::StoreError::Io("letters: disk gone".into()));
        }
        Ok(())
    }
    fn did(&self, step: Step, n: u64) {
        crate::sync::lock(&self.did).push((step, n));
    }
}

fn opts(dir: &std::path::Path) -> LogOptions {
    LogOptions {
        // No checkpoint while the log is filled; the round's large publish makes one due.
        checkpoint_bytes: 1 << 20,
        ..super::tests::real_opts(dir, 64 << 10)
    }
}

/// Segments full of events for queues 1 and 2; queue 1 settles everything and queue 2 events
/// 101 to 200 and all but one in 50 of the others: the segments of 101 to 200 are dead, the
/// others pinned by a few events (worth compacting). Event 1 is settled in queue 2 in the
/// frame of event 150: that dead segment speaks of the first, live one, which its deletion
/// restates.
fn prepared(dir: &std::path::Path) -> Log {
    let known: HashSet<QueueId> = [1, 2].into_iter().collect();
    let fs: Arc<dyn Fs> = Arc::new(RealFs);
    let (mut log, _) = Log::open(fs, opts(dir), &known, 1).unwrap();
    for seq in 1..=400u64 {
        log.stage_events(&[(1, ev(seq, 900)), (2, ev(seq, 900))], 0)
            .unwrap();
        if seq == 150 {
            log.stage_settle(2, &Settled::all([1], 0));
        }
        round::commit(&mut log, seq).unwrap();
    }
    let all: Vec<u64> = (1..=400).collect();
    log.stage_settle(1, &Settled::all(all.iter().copied(), 0));
    let settled: Vec<u64> = all
        .iter()
        .copied()
        .filter(|s| (101..=200).contains(s) || s % 50 != 0)
        .collect();
    log.stage_settle(2, &Settled::all(settled.iter().copied(), 0));
    log
}

#[tokio::test]
async fn a_round_answers_publishes_after_their_frame_and_the_rest_after_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = prepared(dir.path());
    assert!(!log.checkpoint_due());
    log.stage_events(&[(2, ev(401, 700_000))], 0).unwrap();
    let host = Recording::new(log);
    let (publish, published) = tokio::sync::oneshot::channel();
    let (commit, committed) = tokio::sync::oneshot::channel();
    round::run(
        &host,
        Round::Frame,
        vec![Waiter::Frame(publish), Waiter::Round(commit)].into(),
    )
    .unwrap();
    let did = crate::sync::lock(&host.did).clone();
    let steps: Vec<Step> = did.iter().map(|(s, _)| *s).collect();
    use Step::*;
    assert_eq!(
        steps,
        [
            // The publish's frame, and its answer before anything else.
            WriteFrame,
            AnswerPublishes,
            // The restatement of the older live segments, then the dead files removed.
            WriteFrame,
            RemoveSegments,
            // The plan's restatement, then the copy handed over.
            WriteFrame,
            HandOverCompaction,
            Checkpoint,
            // The commit, after the whole round.
            AnswerRound,
        ],
        "{did:?}"
    );
    let removed = did.get(3).map_or(0, |d| d.1);
    assert!(removed >= 1, "{did:?}");
    let handed = crate::sync::lock(&host.handed)
        .take()
        .expect("a compaction handed over");
    assert_eq!(did.get(5).map(|d| d.1), Some(handed.segment()));
    assert!(published.await.unwrap().is_ok());
    assert!(committed.await.unwrap().is_ok());
}

#[test]
fn the_rounds_plans() {
    use Step::*;
    assert_eq!(
        Round::Frame.steps(),
        [
            RecordDamage,
            WriteLetters,
            WriteFrame,
            AnswerPublishes,
            RemoveSegments,
            HandOverCompaction,
            Checkpoint,
            AnswerRound
        ]
    );
    assert_eq!(Round::Idle.steps(), [RecordDamage, HandOverCompaction]);
    assert_eq!(
        Round::Stop.steps(),
        [
            RecordDamage,
            WriteLetters,
            WriteFrame,
            RemoveSegments,
            Checkpoint,
            AnswerRound
        ],
        "a stopping store starts no compaction"
    );
    assert_eq!(Round::Damage.steps(), [RecordDamage]);
    assert_eq!(
        Round::Frame.steps().first(),
        Some(&RecordDamage),
        "damage found by reads or the scrub is recorded before anything is planned"
    );
}

/// A log of one queue holding events 1 to 3, committed.
fn three_events(dir: &std::path::Path) -> Log {
    let known: HashSet<QueueId> = [1].into_iter().collect();
    let (mut log, _) = Log::open(Arc::new(RealFs), opts(dir), &known, 1).unwrap();
    for seq in 1..=3 {
        log.stage_events(&[(1, ev(seq, 100))], 0).unwrap();
    }
    round::commit(&mut log, 1).unwrap();
    log
}

fn pending(log: &Log) -> Vec<u64> {
    log.index_of(1)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

/// One attempt's dead letter of event `seq` of queue 1, for a round.
fn letters(seq: u64) -> (QueueId, crate::store::Letters) {
    let job = crate::store::Letters {
        letters: vec![crate::store::deadletter::contract::letter(seq)],
        bound: crate::store::deadletter::DeadLetterBound {
            per_subscription: 10,
            max_bytes: 1 << 20,
        },
        events: Settled::all([seq], 0),
        report: Arc::new(crate::store::contract::CountKept::default()),
    };
    (1, job)
}

#[test]
fn letters_are_put_and_synced_before_the_frame_that_removes_their_events_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let host = Recording::new(three_events(dir.path()));
    // A round with no dead letters: no letters step.
    host.log().stage_settle(1, &Settled::all([1], 0));
    round::run(&host, Round::Frame, Vec::new().into()).unwrap();
    assert!(
        !host.steps().contains(&Step::WriteLetters),
        "{:?}",
        host.steps()
    );
    // Dead letters handed to the round: put and synced, then their events' removal staged and
    // written.
    crate::sync::lock(&host.did).clear();
    let work = round::Work {
        letters: vec![letters(2)],
        ..Default::default()
    };
    round::run(&host, Round::Frame, work).unwrap();
    assert_eq!(host.steps()[..2], [Step::WriteLetters, Step::WriteFrame]);
    assert_eq!(pending(&host.log()), [3]);
    use crate::store::deadletter::DeadLetterStore;
    assert_eq!(host.letters.count(1), 1);
}

#[test]
fn a_failed_sync_of_the_letters_writes_no_frame_and_fails_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Recording::new(three_events(dir.path()));
    host.letters_fail = true;
    let (publish, mut published) = tokio::sync::oneshot::channel();
    let work = round::Work {
        waiters: vec![Waiter::Frame(publish)],
        letters: vec![letters(2)],
    };
    assert!(round::run(&host, Round::Frame, work).is_err());
    assert!(published.try_recv().unwrap().is_err());
    assert_eq!(host.steps(), [Step::AnswerPublishes]);
    assert!(host.log().stage_events(&[(1, ev(4, 10))], 0).is_err());
    // The removal never reached the disk: the event is pending after a restart.
    drop(host);
    let known: HashSet<QueueId> = [1].into_iter().collect();
    let (log, _) = Log::open(Arc::new(RealFs), opts(dir.path()), &known, 2).unwrap();
    assert_eq!(pending(&log), [1, 2, 3]);
}

#[test]
fn a_failed_frame_answers_everyone_with_the_error_and_does_nothing_else() {
    let fs = crate::store::fs::sim::SimFs::new(7);
    let known: HashSet<QueueId> = [1].into_iter().collect();
    let lo = LogOptions {
        dir: "/d/log".into(),
        ..opts(std::path::Path::new("/d"))
    };
    let (mut log, _) = Log::open(Arc::new(fs.clone()), lo, &known, 1).unwrap();
    log.stage_events(&[(1, ev(1, 10))], 0).unwrap();
    let host = Recording::new(log);
    fs.crash_at_step(fs.steps() + 1);
    let (publish, mut published) = tokio::sync::oneshot::channel();
    let (tx, rx) = std::sync::mpsc::channel();
    assert!(round::run(
        &host,
        Round::Frame,
        vec![Waiter::Frame(publish), Waiter::RoundThread(tx)].into()
    )
    .is_err());
    assert!(published.try_recv().unwrap().is_err());
    assert!(rx.recv().unwrap().is_err());
    let did = crate::sync::lock(&host.did).clone();
    assert_eq!(
        did.iter().map(|d| d.0).collect::<Vec<_>>(),
        [Step::AnswerPublishes, Step::AnswerRound]
    );
}
