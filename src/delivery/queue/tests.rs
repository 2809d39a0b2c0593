use super::super::payload::EventData;
use super::*;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

fn p(seq: u64, size: usize) -> Pending {
    Pending {
        seq,
        event: Arc::new(EventData::new(
            Bytes::from(vec![b'x'; size]),
            "e".into(),
            None,
            None,
        )),
        attempts: 0,
        first_enqueued_ms: 0,
        enqueued_at: Instant::now(),
    }
}

fn lim(events: usize, bytes: usize) -> Limits {
    Limits {
        max_events: events,
        max_bytes: bytes,
        max_in_flight: 4,
        retry_cap: 1,
    }
}

#[tokio::test(start_paused = true)]
async fn all_due_makes_held_and_spilled_retries_due_oldest_first() {
    let now = Instant::now();
    let mut q = SubQueue::windowed(Window {
        events: 2,
        bytes: 1 << 20,
    });
    for i in 0..4 {
        q.reserve(1);
        q.push_reserved(p(i, 10));
    }
    let lim = lim(10, 1 << 20);
    let b = q.pick(now, &lim, |_| false, &mut Vec::new()).unwrap();
    q.finish(false);
    assert_eq!(b.items.len(), 2);
    let ten = now + Duration::from_secs(600);
    q.schedule_retry(ten, b.items);
    q.push_spilled_retry(now + Duration::from_secs(300), 9);
    q.push_spilled_retry(now + Duration::from_secs(900), 7);
    assert_eq!(q.next_due(), Some(now + Duration::from_secs(300)));
    q.all_due(now, false);
    assert_eq!(q.next_due(), Some(now));
    let r = q.pick(now, &lim, |_| false, &mut Vec::new()).unwrap();
    assert!(r.retry);
    assert_eq!(r.items.iter().map(|p| p.seq).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(q.retry_refill_wanted(now), vec![7, 9], "oldest first");
}

#[tokio::test(start_paused = true)]
async fn live_first_sends_what_arrived_after_the_outage_before_the_backlog() {
    let now = Instant::now();
    let lim = lim(2, 1 << 20);
    // Take a batch, and finish its request at once.
    let take = |q: &mut SubQueue| {
        let b = q.pick(now, &lim, |_| false, &mut Vec::new())?;
        q.finish(false);
        Some(b.items.iter().map(|p| p.seq).collect::<Vec<_>>())
    };
    for live_first in [false, true] {
        let mut q = SubQueue::windowed(Window {
            events: 2,
            bytes: 1 << 20,
        });
        // The backlog: two in the window, two spilled.
        for i in 0..4 {
            q.reserve(1);
            q.push_reserved(p(i, 10));
        }
        q.all_due(now, live_first);
        q.reserve(2);
        q.push_reserved(p(10, 10));
        q.push_reserved(p(11, 10));
        let first = take(&mut q);
        if !live_first {
            assert_eq!(first, Some(vec![0, 1]), "oldest first");
            continue;
        }
        assert_eq!(first, Some(vec![10, 11]), "live first");
        assert_eq!(take(&mut q), Some(vec![0, 1]));
        q.refilled(Vec::new(), Vec::new());
        // A live lane holds one window; past it, live events wait behind the backlog.
        for i in 20..23 {
            q.reserve(1);
            q.push_reserved(p(i, 10));
        }
        assert_eq!(take(&mut q), Some(vec![20, 21]));
        assert_eq!(q.spilled(), 3, "2 and 3, then 22");
        // 22 joined the backlog: a later live event still goes first. Once the backlog is
        // gone the drain ends and events queue as usual.
        let _ = q.refill_wanted();
        q.refilled(vec![p(2, 10), p(3, 10)], Vec::new());
        assert_eq!(take(&mut q), Some(vec![2, 3]));
        assert_eq!(q.refill_wanted(), vec![22]);
        q.refilled(vec![p(22, 10)], Vec::new());
        q.reserve(1);
        q.push_reserved(p(30, 10));
        assert_eq!(take(&mut q), Some(vec![30]));
        assert_eq!(take(&mut q), Some(vec![22]));
        q.reserve(1);
        q.push_reserved(p(31, 10));
        assert_eq!(take(&mut q), Some(vec![31]));
        assert!(q.live.is_none());
    }
}

#[tokio::test]
async fn waiting_names_the_oldest_event_retries_included() {
    let mut q = SubQueue::default();
    assert_eq!(q.waiting(), Waiting::default());
    for (seq, ms) in [(1, 10), (2, 20), (3, 30)] {
        q.push(Pending {
            first_enqueued_ms: ms,
            ..p(seq, 1)
        });
    }
    assert_eq!(q.waiting().oldest_ms, Some(10));
    let now = Instant::now();
    let mut out = Vec::new();
    let b = q
        .pick(now, &lim(1, usize::MAX), |_| false, &mut out)
        .unwrap();
    q.finish(false);
    let due = now + Duration::from_secs(60);
    q.schedule_retry(due, b.items);
    let w = q.waiting();
    assert_eq!(
        w.oldest_ms,
        Some(10),
        "the retry of the first event is the oldest"
    );
    assert_eq!(w.retrying, 1);
    assert_eq!(w.next_retry, Some(due));
}

#[tokio::test]
async fn batches_never_exceed_the_caps_and_never_wait() {
    let mut q = SubQueue::default();
    for i in 0..10 {
        q.push(p(i, 100));
    }
    let mut out = Vec::new();
    let b = q
        .pick(Instant::now(), &lim(3, usize::MAX), |_| false, &mut out)
        .unwrap();
    assert_eq!(b.items.len(), 3);
    let b = q
        .pick(Instant::now(), &lim(50, 250), |_| false, &mut out)
        .unwrap();
    assert_eq!(b.items.len(), 2, "byte cap");
    let mut q = SubQueue::default();
    q.push(p(0, 5000));
    let b = q
        .pick(Instant::now(), &lim(50, 1024), |_| false, &mut out)
        .unwrap();
    assert_eq!(b.items.len(), 1, "a big event goes alone");
}

#[tokio::test]
async fn retries_have_their_own_budget() {
    let mut q = SubQueue::default();
    let now = Instant::now();
    q.push(p(1, 1));
    q.push(p(2, 1));
    q.push(p(3, 1));
    q.push(p(4, 1));
    let mut out = Vec::new();
    let a = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
    let b = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
    q.finish(false);
    q.finish(false);
    q.schedule_retry(now, a.items);
    q.schedule_retry(now, b.items);
    let r = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
    assert!(r.retry);
    // The second due retry must wait for the retry slot; a first attempt goes instead.
    let n = q.pick(now, &lim(1, 100), |_| false, &mut out).unwrap();
    assert!(!n.retry);
    assert_eq!(q.next_due(), Some(now));
    assert_eq!(
        q.next_wakeup(&lim(1, 100)),
        None,
        "retry budget full: no timer wake-up"
    );
    q.finish(true);
    assert_eq!(q.next_wakeup(&lim(1, 100)), Some(now));
}

#[tokio::test]
async fn take_expired_sweeps_both_lanes() {
    let mut q = SubQueue::default();
    let now = Instant::now();
    for i in 1..=4 {
        q.push(p(i, 1));
    }
    let mut out = Vec::new();
    let b = q.pick(now, &lim(2, 100), |_| false, &mut out).unwrap();
    q.finish(false);
    q.schedule_retry(now + Duration::from_secs(60), b.items);
    // Ready lane now holds 3, 4 (head expired: 3); retry lane holds 1, 2 (expired: 1).
    let gone = q.take_expired(|e| e.seq % 2 == 1);
    let mut seqs: Vec<u64> = gone.iter().map(|e| e.seq).collect();
    seqs.sort();
    assert_eq!(seqs, vec![1, 3]);
    assert_eq!(q.pending(), 4, "pending until settled");
    assert!(q.next_due().is_some(), "seq 2 still waits to retry");
}

#[tokio::test]
async fn expired_events_are_handed_back() {
    let mut q = SubQueue::default();
    q.push(p(1, 1));
    q.push(p(2, 1));
    let mut out = Vec::new();
    let b = q
        .pick(Instant::now(), &lim(10, 100), |e| e.seq == 1, &mut out)
        .unwrap();
    assert_eq!(b.items.len(), 1);
    assert_eq!(out.len(), 1);
    assert_eq!(q.pending(), 2, "pending until settled");
    assert!(q
        .pick(
            Instant::now() + Duration::from_secs(1),
            &lim(10, 100),
            |_| false,
            &mut out
        )
        .is_none());
}

#[tokio::test]
async fn a_windowed_queue_spills_past_its_window_and_keeps_arrival_order() {
    let w = Window {
        events: 4,
        bytes: 1 << 20,
    };
    let mut q = SubQueue::windowed(w);
    for i in 1..=10 {
        q.push(p(i, 10));
    }
    assert_eq!(q.pending(), 10);
    assert_eq!(q.ready_len(), 4);
    assert_eq!(q.spilled(), 6);
    assert!(q.refill_wanted().is_empty(), "window still full");
    let mut out = Vec::new();
    let b = q
        .pick(Instant::now(), &lim(3, usize::MAX), |_| false, &mut out)
        .unwrap();
    assert_eq!(b.items.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    // One left in the window (< half): refill up to the window.
    let want = q.refill_wanted();
    assert_eq!(want, vec![5, 6, 7]);
    assert!(q.refill_wanted().is_empty(), "one read at a time");
    // New events keep spilling while a read is under way.
    q.push(p(11, 10));
    assert_eq!(q.ready_len(), 1);
    // 7 was over the byte budget: back to the head of the spilled list.
    q.refilled(vec![p(5, 10), p(6, 10)], vec![7]);
    assert_eq!(q.spilled(), 5);
    q.finish(false);
    q.settle(3, 30);
    let mut seqs = Vec::new();
    while let Some(b) = q.pick(Instant::now(), &lim(10, usize::MAX), |_| false, &mut out) {
        seqs.extend(b.items.iter().map(|e| e.seq));
        q.finish(false);
        q.settle(b.items.len(), 0);
        let want = q.refill_wanted();
        if !want.is_empty() {
            let loaded = want.iter().map(|s| p(*s, 10)).collect();
            q.refilled(loaded, Vec::new());
        }
    }
    assert_eq!(seqs, (4..=11).collect::<Vec<_>>());
    assert_eq!(q.pending(), 0);
    assert_eq!(q.spilled(), 0);
    // Empty again: new events go straight to the window.
    q.push(p(12, 10));
    assert_eq!((q.ready_len(), q.spilled()), (1, 0));
}

#[tokio::test]
async fn the_window_is_bounded_by_bytes_too() {
    let mut q = SubQueue::windowed(Window {
        events: 100,
        bytes: 1000,
    });
    q.push(p(1, 2000));
    assert_eq!(q.ready_len(), 1, "a big event still enters an empty window");
    q.push(p(2, 10));
    assert_eq!(q.spilled(), 1);
    q.push_spilled(3);
    assert_eq!((q.pending(), q.spilled()), (3, 2));
    assert_eq!(q.window_room_bytes(), 0);
    let mut plain = SubQueue::default();
    for i in 0..10_000 {
        plain.push(p(i, 100));
    }
    assert_eq!(plain.spilled(), 0, "non-persisted queues never spill");
}

#[tokio::test(start_paused = true)]
async fn a_windowed_retry_lane_keeps_only_sequence_numbers_past_its_window() {
    let w = Window {
        events: 4,
        bytes: 1 << 20,
    };
    let mut q = SubQueue::windowed(w);
    let t0 = Instant::now();
    let minute = Duration::from_secs(60);
    // Three failed batches of two: the first two fit the window's bodies, the third spills.
    for b in 0..3u64 {
        let items = vec![p(b * 2 + 1, 10), p(b * 2 + 2, 10)];
        q.reserve(2);
        q.schedule_retry(t0 + minute + Duration::from_millis(b), items);
    }
    assert_eq!(q.pending(), 6);
    assert_eq!(q.retry_len(), 4, "bodies held: one window");
    assert_eq!(
        q.spilled(),
        2,
        "the third batch keeps only its sequence numbers"
    );
    // Recovered retries are spilled from the start.
    q.push_spilled_retry(t0 + minute / 2, 100);
    assert_eq!((q.pending(), q.spilled()), (7, 3));
    assert_eq!(
        q.next_due(),
        Some(t0 + minute / 2),
        "a spilled retry wakes the task too"
    );
    assert!(q.retry_refill_wanted(t0).is_empty(), "nothing due yet");
    tokio::time::advance(minute + Duration::from_millis(10)).await;
    let now = Instant::now();
    // The window holds 4 bodies (not below half): nothing is read until retries go out.
    assert!(q.retry_refill_wanted(now).is_empty());
    let mut out = Vec::new();
    let l = lim(10, usize::MAX);
    for expected in [[1, 2], [3, 4]] {
        let b = q.pick(now, &l, |_| false, &mut out).unwrap();
        assert!(b.retry);
        assert_eq!(b.items.iter().map(|e| e.seq).collect::<Vec<_>>(), expected);
        q.finish(b.retry);
        q.settle(b.items.len(), 0);
    }
    assert_eq!(q.retry_len(), 0);
    let want = q.retry_refill_wanted(now);
    assert_eq!(want, vec![100, 5, 6], "due order");
    assert!(q.retry_refill_wanted(now).is_empty(), "one read at a time");
    // 6 was not read (over the byte budget): it goes back, due now.
    q.retries_loaded(
        vec![p(100, 10), p(5, 10)],
        vec![6],
        now,
        &lim(1, usize::MAX),
    );
    assert_eq!(q.retry_len(), 2);
    assert_eq!(q.spilled(), 1);
    let mut seqs = Vec::new();
    while let Some(b) = q.pick(now, &l, |_| false, &mut out) {
        assert_eq!(b.items.len(), 1, "loaded retries are cut to the caps");
        seqs.extend(b.items.iter().map(|e| e.seq));
        q.finish(b.retry);
        q.settle(b.items.len(), 0);
        let want = q.retry_refill_wanted(now);
        if !want.is_empty() {
            let loaded = want.iter().map(|s| p(*s, 10)).collect();
            q.retries_loaded(loaded, Vec::new(), now, &l);
        }
    }
    seqs.sort_unstable();
    assert_eq!(seqs, [5, 6, 100], "every spilled retry is sent once");
    assert_eq!((q.pending(), q.spilled(), q.retry_len()), (0, 0, 0));
}

#[test]
fn reserved_places_count_as_pending_until_pushed_or_given_back() {
    let mut q = SubQueue::default();
    assert!(q.has_room(3, 3) && !q.has_room(4, 3));
    q.reserve(3);
    assert!(!q.has_room(1, 3));
    q.push_reserved(p(1, 1));
    q.unreserve(2);
    assert_eq!(q.pending(), 1);
    assert_eq!(q.ready_len(), 1);
}
