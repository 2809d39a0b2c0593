//! Reading the journal back at start-up: the current cycle's records (v3, salted), or the v1/v2
//! records of a journal left by a gridlet without cycles. Never panics on any file content
//! (`damaged_journals_yield_a_prefix_of_what_was_written` fuzzes it).

use super::{
    Item, Record, CYCLE_HEADER, MAGIC_CYCLE, MAGIC_V1, MAGIC_V2, MAGIC_V3, MAX_RECORD,
    RECORD_HEADER, RECORD_HEADER_V2, RECORD_HEADER_V3, SALT,
};
use crate::store::QueueId;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

/// A record's checksum. A v2 record's also covers its stride (`Some`), so a damaged stride cannot
/// shift the reader; v1 records have none.
pub(super) fn record_crc(lsn: u64, stride: Option<u32>, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&lsn.to_le_bytes());
    if let Some(stride) = stride {
        h.update(&stride.to_le_bytes());
    }
    h.update(payload);
    h.finalize()
}

/// A v3 record's checksum: over the cycle's salt too, so a record is only ever read back as part
/// of the cycle that wrote it.
pub(super) fn record_crc_v3(salt: &[u8; SALT], lsn: u64, stride: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(salt);
    h.update(&lsn.to_le_bytes());
    h.update(&stride.to_le_bytes());
    h.update(payload);
    h.finalize()
}

pub(super) fn cycle_crc(records_at: u32, salt: &[u8; SALT]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&records_at.to_le_bytes());
    h.update(salt);
    h.finalize()
}

/// The records a journal file holds: the current cycle's when it starts with a cycle header,
/// else (a journal left by a gridlet without cycles) the v1/v2 records from the start.
pub(super) fn read_journal(file: &File, size: u64) -> Vec<Record> {
    let mut head = [0u8; CYCLE_HEADER];
    if file.read_exact_at(&mut head, 0).is_err() {
        return Vec::new();
    }
    match parse_cycle_header(&head) {
        Some((records_at, salt)) if u64::from(records_at) <= size => {
            let mut r = std::io::BufReader::new(file);
            if r.seek(SeekFrom::Start(records_at.into())).is_err() {
                return Vec::new();
            }
            read_cycle(&mut r, size - u64::from(records_at), &salt)
        }
        Some(_) => Vec::new(),
        None => read_records(&mut std::io::BufReader::new(file), size),
    }
}

pub(super) fn parse_cycle_header(h: &[u8]) -> Option<(u32, [u8; SALT])> {
    if u32::from_le_bytes(le(h, 0)?) != MAGIC_CYCLE {
        return None;
    }
    let records_at = u32::from_le_bytes(le(h, 4)?);
    let salt: [u8; SALT] = le(h, 8)?;
    let crc = u32::from_le_bytes(le(h, 8 + SALT)?);
    (crc == cycle_crc(records_at, &salt) && records_at as usize >= CYCLE_HEADER)
        .then_some((records_at, salt))
}

/// The records of one cycle, in order: each must carry the cycle's salt, a matching checksum and
/// the sequence number after its predecessor's. The first record that does not ends the cycle.
pub(super) fn read_cycle(r: &mut impl Read, size: u64, salt: &[u8; SALT]) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    let mut left = size;
    let mut header = [0u8; RECORD_HEADER_V3];
    while left >= RECORD_HEADER_V3 as u64 && r.read_exact(&mut header).is_ok() {
        left -= RECORD_HEADER_V3 as u64;
        let Some((lsn, len, crc, stride)) = parse_header_v3(&header, salt) else {
            break;
        };
        let next = out
            .last()
            .is_none_or(|prev| prev.lsn.checked_add(1) == Some(lsn));
        if !next || len as u64 > left || stride < RECORD_HEADER_V3 + len {
            break;
        }
        let mut payload = vec![0u8; len];
        if r.read_exact(&mut payload).is_err() {
            break;
        }
        left -= len as u64;
        if record_crc_v3(salt, lsn, stride as u32, &payload) != crc {
            break;
        }
        let Some((items, removed)) = parse_payload(&payload) else {
            break;
        };
        out.push(Record {
            lsn,
            items,
            removed,
        });
        if !skip_padding(r, (stride - RECORD_HEADER_V3 - len) as u64, &mut left) {
            break;
        }
    }
    out
}

/// Skip a record's padding to the next record; `false` when the file ends inside it.
pub(super) fn skip_padding(r: &mut impl Read, pad: u64, left: &mut u64) -> bool {
    if pad == 0 {
        return true;
    }
    let skipped = std::io::copy(&mut r.take(pad.min(*left)), &mut std::io::sink());
    if !matches!(skipped, Ok(n) if n == pad) {
        return false;
    }
    *left -= pad;
    true
}

/// A v3 record header of this cycle: `(lsn, payload length, crc, stride)`.
pub(super) fn parse_header_v3(h: &[u8], salt: &[u8; SALT]) -> Option<(u64, usize, u32, usize)> {
    if u32::from_le_bytes(le(h, 0)?) != MAGIC_V3 || le::<SALT>(h, RECORD_HEADER_V2)? != *salt {
        return None;
    }
    let len = u32::from_le_bytes(le(h, 12)?) as usize;
    (len <= MAX_RECORD).then_some((
        u64::from_le_bytes(le(h, 4)?),
        len,
        u32::from_le_bytes(le(h, 16)?),
        u32::from_le_bytes(le(h, 20)?) as usize,
    ))
}

pub(super) fn le<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// The fixed part of a record header: `(lsn, payload length, crc, v2)`; a v2 header goes on
/// with the record's stride.
pub(super) type Header = (u64, usize, u32, bool);

/// Intact records from the start of a journal of `size` bytes written by a gridlet without
/// cycles, stopping at the first damaged or partial one. Reads both of its record versions.
pub(super) fn read_records(r: &mut impl Read, size: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut left = size;
    let mut header = [0u8; RECORD_HEADER_V2];
    while left >= RECORD_HEADER as u64 && r.read_exact(&mut header[..RECORD_HEADER]).is_ok() {
        left -= RECORD_HEADER as u64;
        let Some((lsn, len, crc, v2)) = parse_header(&header[..RECORD_HEADER]) else {
            break;
        };
        // v1: no stride field, no padding.
        let stride_field = if v2 {
            if left < 4 || r.read_exact(&mut header[RECORD_HEADER..]).is_err() {
                break;
            }
            left -= 4;
            le::<4>(&header, RECORD_HEADER).map(u32::from_le_bytes)
        } else {
            None
        };
        let header_len = if v2 { RECORD_HEADER_V2 } else { RECORD_HEADER };
        let stride = stride_field.map_or(header_len + len, |s| s as usize);
        if len as u64 > left || stride < header_len + len {
            break;
        }
        let mut payload = vec![0u8; len];
        if r.read_exact(&mut payload).is_err() {
            break;
        }
        left -= len as u64;
        let intact = record_crc(lsn, stride_field, &payload) == crc;
        match intact.then(|| parse_payload(&payload)).flatten() {
            Some((items, removed)) => out.push(Record {
                lsn,
                items,
                removed,
            }),
            None => break,
        }
        if !skip_padding(r, (stride - header_len - len) as u64, &mut left) {
            break;
        }
    }
    out
}

/// The header of a record, if these bytes start one.
pub(super) fn parse_header(h: &[u8]) -> Option<Header> {
    let v2 = match u32::from_le_bytes(le(h, 0)?) {
        MAGIC_V1 => false,
        MAGIC_V2 => true,
        _ => return None,
    };
    let len = u32::from_le_bytes(le(h, 12)?) as usize;
    (len <= MAX_RECORD).then_some((
        u64::from_le_bytes(le(h, 4)?),
        len,
        u32::from_le_bytes(le(h, 16)?),
        v2,
    ))
}

pub(super) type Removed = Vec<(QueueId, u64)>;

pub(super) fn parse_payload(payload: &[u8]) -> Option<(Vec<Item>, Removed)> {
    let count = u32::from_le_bytes(le(payload, 0)?) as usize;
    let mut items = Vec::with_capacity(count.min(1 << 16));
    let mut p = 4usize;
    for _ in 0..count {
        let q = u32::from_le_bytes(le(payload, p)?);
        let seq = u64::from_le_bytes(le(payload, p + 4)?);
        let vlen = u32::from_le_bytes(le(payload, p + 12)?) as usize;
        let v = payload.get(p + 16..(p + 16).checked_add(vlen)?)?;
        items.push((q, seq, v.to_vec()));
        p += 16 + vlen;
    }
    let mut removed = Vec::new();
    if p < payload.len() {
        let n = u32::from_le_bytes(le(payload, p)?) as usize;
        p += 4;
        removed.reserve(n.min(1 << 16));
        for _ in 0..n {
            let q = u32::from_le_bytes(le(payload, p)?);
            let seq = u64::from_le_bytes(le(payload, p + 4)?);
            removed.push((q, seq));
            p += 12;
        }
    }
    (p == payload.len()).then_some((items, removed))
}
