//! Unit tests of `journal`.

use super::*;

fn items(n: u64) -> Vec<Item> {
    (0..n)
        .map(|i| (7, 100 + i, vec![b'v'; i as usize]))
        .collect()
}

fn append(j: &mut Journal, lsn: u64, it: &[Item]) {
    j.append(lsn, it.iter().map(|(q, s, v)| (*q, *s, v.as_slice())), &[])
        .unwrap();
}

#[test]
fn records_round_trip_and_reset_empties() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j");
    let (mut j, recs) = Journal::open(&p).unwrap();
    assert!(recs.is_empty());
    append(&mut j, 1, &items(3));
    j.append(2, std::iter::empty(), &[(7, 100), (7, 102)])
        .unwrap();
    append(&mut j, 3, &items(5));
    drop(j);
    let (mut j, recs) = Journal::open(&p).unwrap();
    assert_eq!(
        recs,
        vec![
            Record {
                lsn: 1,
                items: items(3),
                removed: vec![]
            },
            Record {
                lsn: 2,
                items: items(0),
                removed: vec![(7, 100), (7, 102)]
            },
            Record {
                lsn: 3,
                items: items(5),
                removed: vec![]
            },
        ]
    );
    j.reset();
    append(&mut j, 4, &items(1));
    drop(j);
    // Record 4 overwrote record 1 (same stride). The records of the earlier cycle behind it
    // are still intact, but carry the earlier cycle's salt: reading stops after record 4.
    let (_, recs) = Journal::open(&p).unwrap();
    let lsns: Vec<u64> = recs.iter().map(|r| r.lsn).collect();
    assert_eq!(lsns, vec![4]);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), PREALLOCATED_BYTES);
}

#[test]
fn records_of_the_earlier_format_are_still_replayed() {
    // A journal left by gridlet before direct I/O (v1: unpadded records).
    let v1 = |lsn: u64, payload: &[u8]| {
        let mut r = MAGIC_V1.to_le_bytes().to_vec();
        r.extend_from_slice(&lsn.to_le_bytes());
        r.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        r.extend_from_slice(&record_crc(lsn, None, payload).to_le_bytes());
        r.extend_from_slice(payload);
        r
    };
    let mut payload = 1u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&7u32.to_le_bytes());
    payload.extend_from_slice(&100u64.to_le_bytes());
    payload.extend_from_slice(&2u32.to_le_bytes());
    payload.extend_from_slice(b"ab");
    let removals: Vec<u8> = [
        1u32.to_le_bytes().as_slice(),
        &7u32.to_le_bytes(),
        &99u64.to_le_bytes(),
    ]
    .concat();
    let mut file = v1(5, &payload);
    file.extend(v1(6, &[0u32.to_le_bytes().as_slice(), &removals].concat()));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j");
    std::fs::write(&p, &file).unwrap();
    let (_, recs) = Journal::open(&p).unwrap();
    assert_eq!(
        recs,
        vec![
            Record {
                lsn: 5,
                items: vec![(7, 100, b"ab".to_vec())],
                removed: vec![]
            },
            Record {
                lsn: 6,
                items: vec![],
                removed: vec![(7, 99)]
            },
        ]
    );
}

#[test]
fn a_write_direct_io_refuses_falls_back_to_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j");
    let (mut j, _) = Journal::open(&p).unwrap();
    // ext4 here and in CI; tmpfs takes O_DIRECT too since Linux 6.6.
    if !j.is_direct() {
        eprintln!("{}: no O_DIRECT on this file system, skipped", p.display());
        return;
    }
    // Unaligned records: the kernel refuses them with EINVAL, as it would refuse a block
    // size the probe at open did not see.
    j.block = 1;
    append(&mut j, 1, &items(3));
    assert!(!j.is_direct(), "switched to the page cache");
    append(&mut j, 2, &items(1));
    drop(j);
    let (_, recs) = Journal::open(&p).unwrap();
    let lsns: Vec<u64> = recs.iter().map(|r| r.lsn).collect();
    assert_eq!(lsns, vec![1, 2]);
}

#[test]
fn a_torn_or_damaged_record_ends_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j");
    let (mut j, _) = Journal::open(&p).unwrap();
    append(&mut j, 1, &items(2));
    append(&mut j, 2, &items(2));
    let first = CYCLE_HEADER.div_ceil(j.block) * j.block;
    let stride = (j.len() as usize - first) / 2;
    assert_eq!(
        stride % 512,
        0,
        "records are padded to the direct-I/O block"
    );
    let full = std::fs::read(&p).unwrap()[..j.len() as usize].to_vec();
    // The second record's bytes: header (with stride and salt) and payload; then padding.
    let record_end = first + stride + RECORD_HEADER_V3 + 4 + 2 * 16 + 1;
    assert!(full[record_end..].iter().all(|b| *b == 0));
    // Every truncation point inside the second record keeps exactly the first; a cut in its
    // padding keeps both.
    let in_padding = [record_end, record_end + 1, full.len() - 1];
    for cut in (first + stride..record_end).chain(in_padding) {
        std::fs::write(&p, &full[..cut]).unwrap();
        let (_, recs) = Journal::open(&p).unwrap();
        let want = if cut < record_end { 1 } else { 2 };
        assert_eq!(recs.len(), want, "cut at {cut}");
    }
    // A flipped byte in the second record's payload drops it (crc).
    let mut bad = full.clone();
    bad[record_end - 1] ^= 0xff;
    std::fs::write(&p, &bad).unwrap();
    assert_eq!(Journal::open(&p).unwrap().1.len(), 1);
    // Garbage is not a record.
    std::fs::write(&p, b"not a journal at all").unwrap();
    assert!(Journal::open(&p).unwrap().1.is_empty());
}

/// A v2-shaped record (the format before per-cycle salts), as a publisher could spell it
/// inside an event id: `stride` 512, one event `(7, seq, "bad")`.
fn crafted_v2(lsn: u64, seq: u64) -> Vec<u8> {
    let mut payload = 1u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&7u32.to_le_bytes());
    payload.extend_from_slice(&seq.to_le_bytes());
    payload.extend_from_slice(&3u32.to_le_bytes());
    payload.extend_from_slice(b"bad");
    let mut crc = crc32fast::Hasher::new();
    crc.update(&lsn.to_le_bytes());
    crc.update(&512u32.to_le_bytes());
    crc.update(&payload);
    let mut r = b"GJL2".to_vec();
    r.extend_from_slice(&lsn.to_le_bytes());
    r.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    r.extend_from_slice(&crc.finalize().to_le_bytes());
    r.extend_from_slice(&512u32.to_le_bytes());
    r.extend_from_slice(&payload);
    r
}

/// An event whose raw bytes (its id) carry record-shaped bytes at every 512-byte boundary of
/// the file is journaled; a checkpoint starts a new cycle over it; one small group follows;
/// the process dies. Replay must return that one group and nothing the publisher wrote.
#[test]
fn record_shaped_event_bytes_are_never_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let marker = b"MARKER-7f3a9c";
    // Where a value lands in the file: write one, find it.
    let offset = {
        let p = dir.path().join("probe");
        let (mut j, _) = Journal::open(&p).unwrap();
        j.reset();
        j.append(1, [(7, 1, marker.as_slice())].into_iter(), &[])
            .unwrap();
        drop(j);
        let bytes = std::fs::read(&p).unwrap();
        bytes
            .windows(marker.len())
            .position(|w| w == marker)
            .unwrap()
    };
    let mut value = vec![b'x'; 8 * 512];
    for (k, boundary) in (512..offset + value.len() - 64).step_by(512).enumerate() {
        if boundary < offset {
            continue;
        }
        let rec = crafted_v2(1_000 + k as u64, 900 + k as u64);
        value[boundary - offset..boundary - offset + rec.len()].copy_from_slice(&rec);
    }
    let p = dir.path().join("j");
    let (mut j, _) = Journal::open(&p).unwrap();
    j.reset();
    j.append(1, [(7, 1, value.as_slice())].into_iter(), &[])
        .unwrap();
    // Checkpoint: the next cycle starts over the big record.
    j.reset();
    append(&mut j, 2, &items(1));
    drop(j);
    let (_, recs) = Journal::open(&p).unwrap();
    let lsns: Vec<u64> = recs.iter().map(|r| r.lsn).collect();
    assert_eq!(
        lsns,
        vec![2],
        "only the current cycle's real group is replayed"
    );
}

/// Seeded fuzz of journal files: random bytes, and a valid journal with bytes flipped,
/// ranges overwritten or the file cut short. Reading never panics and never invents a
/// record: what comes back is always a prefix of what was written.
#[test]
fn damaged_journals_yield_a_prefix_of_what_was_written() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j");
    let (mut j, _) = Journal::open(&p).unwrap();
    j.reset();
    for lsn in 1..=12u64 {
        let n = next() % 6;
        append(&mut j, lsn, &items(n));
    }
    let written_len = j.len() as usize;
    drop(j);
    let valid = std::fs::read(&p).unwrap()[..written_len].to_vec();
    let (_, written) = Journal::open(&p).unwrap();
    assert_eq!(written.len(), 12);
    let f = dir.path().join("fuzz");
    let check = |bytes: &[u8], what: &str| {
        std::fs::write(&f, bytes).unwrap();
        let file = File::open(&f).unwrap();
        let got = read_journal(&file, bytes.len() as u64);
        assert!(
            got.len() <= written.len() && got.iter().zip(&written).all(|(a, b)| a == b),
            "{what}: read {} records that are not a prefix of the written ones",
            got.len()
        );
    };
    for round in 0..400 {
        let mut bytes = valid.clone();
        match round % 4 {
            0 => {
                for _ in 0..1 + next() % 8 {
                    let at = (next() as usize) % bytes.len();
                    bytes[at] ^= 1 << (next() % 8);
                }
            }
            1 => {
                let at = (next() as usize) % bytes.len();
                let end = (at + 1 + (next() as usize) % 600).min(bytes.len());
                for b in &mut bytes[at..end] {
                    *b = next() as u8;
                }
            }
            2 => bytes.truncate((next() as usize) % bytes.len()),
            _ => {
                // Random bytes behind this file's intact cycle header.
                let header = CYCLE_HEADER.div_ceil(512) * 512;
                for b in &mut bytes[header.min(valid.len())..] {
                    *b = next() as u8;
                }
            }
        }
        check(&bytes, &format!("round {round}"));
    }
    for round in 0..100 {
        let len = (next() as usize) % 16_384;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        check(&bytes, &format!("random file {round}"));
    }
}

/// A burst larger than the preallocated file grows it; the next cycle cuts it back.
#[test]
fn a_grown_journal_returns_to_its_normal_size_at_the_next_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("j");
    let (mut j, _) = Journal::open(&p).unwrap();
    j.reset();
    let big = vec![b'b'; PREALLOCATED_BYTES as usize + 100_000];
    j.append(1, [(7, 1, big.as_slice())].into_iter(), &[])
        .unwrap();
    let grown = std::fs::metadata(&p).unwrap().len();
    assert!(grown > PREALLOCATED_BYTES);
    assert_eq!(j.excess_bytes(), grown - PREALLOCATED_BYTES);
    j.reset();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), PREALLOCATED_BYTES);
    assert_eq!(j.excess_bytes(), 0);
}
