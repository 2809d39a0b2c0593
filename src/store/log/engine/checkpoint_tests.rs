//! The checkpoint's encoding: a round trip, and damage refused (`checkpoint.rs`).

use super::*;

#[test]
fn checkpoints_round_trip_and_damage_is_refused() {
    let mut words = vec![u64::MAX; 1000];
    words.push(0b1011);
    words.extend([0, 0, 0]);
    let c = Checkpoint {
        generation: 7,
        max_seq: 99,
        dropped: vec![4],
        retries: vec![(
            (1, 5),
            RetryState {
                attempts: 2,
                first_enqueued_ms: 3,
                due_ms: 4,
            },
        )],
        segs: vec![SegState {
            no: 3,
            salt: 0x5eed,
            len: 4096,
            events: 64_000,
            first_seq: Some(1),
            last_seq: 64_067,
            index: vec![(1, 48), (900, 33_000)].into(),
            ms_runs: vec![(1, 1000), (500, 2000)].into(),
            live: vec![(1, words.into()), (2, vec![].into())],
            bytes: Some(vec![(1, 64_123), (2, 0)]),
        }],
    };
    let b = c.encode();
    assert!(
        b.len() < 300,
        "runs keep a full backlog's bits small: {}",
        b.len()
    );
    assert_eq!(Checkpoint::decode(&b), Some(c.clone()));
    for cut in [0, 10, HEAD, b.len() - 1] {
        assert_eq!(Checkpoint::decode(&b[..cut]), None, "cut at {cut}");
    }
    let mut flipped = b.clone();
    flipped[HEAD + 3] ^= 1;
    assert_eq!(Checkpoint::decode(&flipped), None);
    // The earlier format (no pending-bytes trailer) still reads, its bytes unknown.
    let mut old = c.clone();
    old.segs[0].bytes = None;
    let short = old.encode();
    assert_eq!(short.len(), b.len() - (1 + 4 + 2 * 20));
    assert_eq!(Checkpoint::decode(&short), Some(old));
}
