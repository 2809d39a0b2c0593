//! Damage faults for the power-cut simulation ([`super`]): between a cut and the next
//! open, a seed may damage data that was **synced**: flip a bit, zero a sector, fill one with
//! garbage (a lost sector), make a block stale (it reads back as it was before the write that put
//! the frame there: zeros from the frame on, in a file that held nothing before), damage a
//! segment header, or lose a segment file the checkpoint lists.
//!
//! A fault goes only where the log promises to see it (see `engine/damage.rs`): a span with an
//! intact frame of its segment after it, a span below the end the checkpoint recorded, a bit
//! flipped or a sector garbled in a closed segment, any header, a listed segment other than the
//! one that was the head when the checkpoint was taken (its frames after the checkpoint are
//! known to no one). Damage elsewhere, to the last frames of the newest segment written after
//! the last checkpoint, looks exactly like a torn write; the simulation does not claim it.

use crate::store::fs::sim::{Rng, SimFs};
use crate::store::fs::Fs;
use crate::store::log::engine::{read_frame, Log, LogOptions};
use crate::store::log::format::{self, Header, HEADER};
use std::path::PathBuf;
use std::sync::Arc;

/// A kind of damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// One bit of a frame flipped.
    FlipBit,
    /// A 512-byte sector of zeros.
    ZeroSector,
    /// A 512-byte sector of garbage.
    LostSector,
    /// A 4 KiB block as it was before the frame was written into it.
    StaleBlock,
    /// A bit of a segment header flipped.
    Header,
    /// A segment file the checkpoint lists, gone.
    MissingSegment,
}

const FAULTS: [Fault; 6] = [
    Fault::FlipBit,
    Fault::ZeroSector,
    Fault::LostSector,
    Fault::StaleBlock,
    Fault::Header,
    Fault::MissingSegment,
];

/// A fault made.
#[derive(Debug, Clone)]
pub struct Injected {
    /// Which.
    pub fault: Fault,
    /// The segment file.
    pub file: PathBuf,
    /// Where (0 for a missing file).
    pub offset: u64,
}

/// Make one fault of a seeded kind in the synced segment files of `opts.dir` on `fs` (just
/// rebooted), where the log must see it; `None` when the kind has no such place now.
pub fn inject(rng: &mut Rng, fs: &SimFs, opts: &LogOptions) -> Option<Injected> {
    let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
    let shared: Arc<dyn Fs> = Arc::new(fs.clone());
    let mut segs: Vec<u64> = fs
        .list(&opts.dir)
        .ok()?
        .iter()
        .filter_map(|n| format::parse_segment_name(n))
        .collect();
    segs.sort_unstable();
    let newest = *segs.last()?;
    let (recorded, ck_newest) = Log::recorded(shared.clone(), opts.clone()).ok()?;
    let path = |no: u64| opts.dir.join(format::segment_name(no));
    let content = |no: u64| -> Option<Vec<u8>> {
        let f = shared.open(&path(no)).ok()?;
        let mut buf = vec![0u8; f.size().ok()? as usize];
        let n = f.read_at(&mut buf, 0).ok()?;
        buf.truncate(n);
        Some(buf)
    };
    // The checkpoint is used only when every listed file still has the header it recorded.
    let fits = recorded.iter().all(|(no, (salt, _))| {
        !segs.contains(no)
            || content(*no)
                .and_then(|c| Header::decode(&c))
                .is_some_and(|h| h.salt == *salt)
    });
    match fault {
        Fault::MissingSegment => {
            let listed: Vec<u64> = segs
                .iter()
                .copied()
                .filter(|no| recorded.contains_key(no) && Some(*no) != ck_newest)
                .collect();
            if !fits || listed.is_empty() {
                return None;
            }
            let no = listed[rng.below(listed.len() as u64) as usize];
            fs.lose(&path(no)).ok()?;
            Some(Injected {
                fault,
                file: path(no),
                offset: 0,
            })
        }
        Fault::Header => {
            let no = segs[rng.below(segs.len() as u64) as usize];
            let c = content(no)?;
            let at = rng.below(HEADER as u64);
            let byte = *c.get(at as usize)? ^ (1 << rng.below(8));
            fs.damage(&path(no), at, &[byte]).ok()?;
            Some(Injected {
                fault,
                file: path(no),
                offset: at,
            })
        }
        _ => {
            let no = segs[rng.below(segs.len() as u64) as usize];
            let c = content(no)?;
            let salt = Header::decode(&c)?.salt;
            let frames = frames_of(&shared, &path(no), salt, c.len() as u64);
            let &(start, end) = frames.get(rng.below(frames.len() as u64) as usize)?;
            let at = start + rng.below(end - start);
            let (a, bytes) = match fault {
                Fault::FlipBit => (at, vec![c.get(at as usize)? ^ (1 << rng.below(8))]),
                Fault::ZeroSector | Fault::LostSector => {
                    let a = at - at % 512;
                    let b = (a + 512).min(c.len() as u64);
                    let bytes = (a..b)
                        .map(|_| match fault {
                            Fault::ZeroSector => 0,
                            _ => rng.next_u64() as u8,
                        })
                        .collect();
                    (a, bytes)
                }
                _ => {
                    let a = (at - at % 4096).max(start);
                    let b = (at - at % 4096 + 4096).min(c.len() as u64);
                    (a, vec![0u8; (b - a) as usize])
                }
            };
            // What the fault really changes (a zeroed byte may have been zero): the log can only
            // see that, so the rules below are asked of it (crashsim damage seed 20,260: a
            // sector zeroed from the last byte of a checkpointed frame, which was zero, into the
            // frames after the checkpoint, claimed as damage below the recorded end).
            let differs = |i: usize| bytes.get(i) != c.get(a as usize + i);
            let lo = (0..bytes.len()).find(|&i| differs(i))?;
            let hi = (0..bytes.len()).rev().find(|&i| differs(i)).unwrap_or(lo);
            let (a, bytes) = (a + lo as u64, bytes[lo..=hi].to_vec());
            let b = a + bytes.len() as u64;
            if a < HEADER as u64 && no == newest {
                // The newest segment's header and first frame both gone look like a header
                // write cut by a crash (see `engine/recover.rs`): not claimed.
                return None;
            }
            // The first frame the span reaches, and whether the log must see it.
            let first = frames.iter().find(|(_, e)| *e > a).map_or(start, |f| f.0);
            let after = frames.iter().any(|(s, _)| *s >= b);
            let below = fits
                && recorded
                    .get(&no)
                    .is_some_and(|(s, len)| *s == salt && first < *len);
            let closed = no != newest && matches!(fault, Fault::FlipBit | Fault::LostSector);
            if !(after || below || closed) {
                return None;
            }
            fs.damage(&path(no), a, &bytes).ok()?;
            Some(Injected {
                fault,
                file: path(no),
                offset: a,
            })
        }
    }
}

/// `(start, end)` of each valid frame of a segment file, in order.
fn frames_of(fs: &Arc<dyn Fs>, path: &std::path::Path, salt: u64, size: u64) -> Vec<(u64, u64)> {
    let Ok(file) = fs.open(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = HEADER as u64;
    while let Ok(Some((_, next))) = read_frame(&*file, salt, at, size) {
        out.push((at, next));
        at = next;
    }
    out
}
