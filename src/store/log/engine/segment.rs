//! A segment file in memory: its header, valid length, sparse index, and what it still owes
//! each queue (one bit per sequence number).

use super::format::Header;
use crate::store::fs::FsFile;
use crate::store::QueueId;
use std::collections::HashMap;
use std::sync::Arc;

/// One bit per sequence number from `first`: what a segment owes one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bits {
    pub(super) words: Vec<u64>,
    pub(super) ones: u64,
    /// Body bytes of the events whose bits are set (kept by the log as it sets and clears
    /// them: 8 bytes per segment and queue, nothing per event).
    pub(super) bytes: u64,
}

impl Bits {
    /// Set bit `i`; true when it was clear.
    pub(super) fn set(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        match self.words.get_mut(w) {
            Some(word) if *word & (1 << b) == 0 => {
                *word |= 1 << b;
                self.ones += 1;
                true
            }
            _ => false,
        }
    }
    /// Whether both hold the same bits (trailing zero words aside).
    pub(super) fn same_bits(&self, other: &Bits) -> bool {
        let trim = |w: &[u64]| w.len() - w.iter().rev().take_while(|x| **x == 0).count();
        let (a, b) = (&self.words, &other.words);
        a.get(..trim(a)) == b.get(..trim(b))
    }
    pub(super) fn clear(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        match self.words.get_mut(w) {
            Some(word) if *word & (1 << b) != 0 => {
                *word &= !(1 << b);
                self.ones -= 1;
                true
            }
            _ => false,
        }
    }
    pub(super) fn get(&self, i: u64) -> bool {
        self.words
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    /// Keep only the bits `other` has set too (none when there is no `other`).
    pub(super) fn and(&mut self, other: Option<&Bits>) {
        let theirs = other.map_or(&[][..], |o| o.words.as_slice());
        self.words.truncate(theirs.len());
        for (w, t) in self.words.iter_mut().zip(theirs) {
            *w &= t;
        }
        self.ones = self.words.iter().map(|w| u64::from(w.count_ones())).sum();
    }
    pub(super) fn from_words(words: Vec<u64>) -> Self {
        let ones = words.iter().map(|w| u64::from(w.count_ones())).sum();
        Self {
            words,
            ones,
            bytes: 0,
        }
    }
    /// The set bits as runs `(first bit, how many)`, in order: a word of ones at a time, so a
    /// segment a stalled subscriber owes whole is one run, whatever its length.
    pub(super) fn runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (w, &word) in self.words.iter().enumerate() {
            let (mut word, mut at) = (word, w as u64 * 64);
            while word != 0 {
                let zeros = word.trailing_zeros();
                word >>= zeros;
                at += u64::from(zeros);
                let ones = word.trailing_ones();
                match out.last_mut() {
                    Some((first, n)) if *first + *n == at => *n += u64::from(ones),
                    _ => out.push((at, u64::from(ones))),
                }
                at += u64::from(ones);
                word = word.checked_shr(ones).unwrap_or(0);
            }
        }
        out
    }
    pub(super) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(w, word)| {
            (0..64u64)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| w as u64 * 64 + b)
        })
    }
}

/// The segments that a segment's settle, retry and state records speak of (by number): a
/// range that holds them all, or every segment when that is not known (a segment that was
/// there when the log opened, or a compacted copy). Deleting a segment restates only the live
/// segments its records name ([`super::Log::restatements`]): a drain's settle-only heads name
/// the few segments being drained, not the whole backlog behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refs {
    /// No such record.
    None,
    /// Every segment named is numbered within `first..=last`.
    Range(u64, u64),
    /// Not known: any segment.
    All,
}

impl Refs {
    /// Note segment `no`.
    pub(super) fn add(&mut self, no: u64) {
        *self = self.union(Refs::Range(no, no));
    }

    /// What either names.
    pub(super) fn union(self, other: Refs) -> Refs {
        match (self, other) {
            (Refs::All, _) | (_, Refs::All) => Refs::All,
            (Refs::None, r) | (r, Refs::None) => r,
            (Refs::Range(a, b), Refs::Range(c, d)) => Refs::Range(a.min(c), b.max(d)),
        }
    }

    /// Whether segment `no` may be named.
    pub(super) fn has(self, no: u64) -> bool {
        match self {
            Refs::None => false,
            Refs::Range(a, b) => a <= no && no <= b,
            Refs::All => true,
        }
    }
}

/// One segment file and what it still owes.
pub(super) struct Seg {
    pub(super) hdr: Header,
    pub(super) file: Arc<dyn FsFile>,
    /// Bytes of valid frames (the head's next frame goes here).
    pub(super) len: u64,
    /// Sequence number of bit 0 of every queue's bits (its first event's; `None`: no event yet).
    pub(super) first_seq: Option<u64>,
    pub(super) last_seq: u64,
    /// `(first event seq of a frame, frame offset)`, every [`INDEX_STRIDE`] bytes or more.
    pub(super) index: Vec<(u64, u64)>,
    pub(super) live: HashMap<QueueId, Bits>,
    /// `(first seq, first-enqueued ms)` of each run of events first enqueued within the same
    /// second (the run's ms is its latest event's: a time to live restored from it ends up to a
    /// second late, never early). Kept for recovery and checkpoints: one pair per second of
    /// publishing, not per event.
    pub(super) ms_runs: Vec<(u64, u64)>,
    /// Event records in the file (compaction weighs what is still pending against it).
    pub(super) events: u64,
    /// Wall ms of the last settlement of one of its events (`0`: none since open).
    pub(super) settled_ms: u64,
    /// Compaction found more live bytes than it may copy when this many events were pending:
    /// not tried again before half of them are settled (`0`: never).
    pub(super) skip_floor: u64,
    /// Damaged spans found when the log opened, `(start, next frame)` in order: reads and
    /// compaction step over them (`engine/damage.rs`).
    pub(super) holes: Vec<(u64, u64)>,
    /// The segments its records speak of (settlements, retry states, restatements): [`Refs`].
    pub(super) refs: Refs,
}

impl Seg {
    /// A segment with no frames yet read or written (`len`: where its frames end so far).
    pub(super) fn new(hdr: Header, file: Arc<dyn FsFile>, len: u64) -> Self {
        Seg {
            hdr,
            file,
            len,
            first_seq: None,
            last_seq: hdr.base_seq,
            index: Vec::new(),
            live: HashMap::new(),
            ms_runs: Vec::new(),
            events: 0,
            settled_ms: 0,
            skip_floor: 0,
            holes: Vec::new(),
            refs: Refs::All,
        }
    }

    /// Events pending in at least one queue.
    pub(super) fn live_events(&self) -> u64 {
        let mut union: Vec<u64> = Vec::new();
        for bits in self.live.values() {
            if union.len() < bits.words.len() {
                union.resize(bits.words.len(), 0);
            }
            for (u, w) in union.iter_mut().zip(&bits.words) {
                *u |= w;
            }
        }
        union.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Sequence numbers pending in at least one queue, with those queues (sorted), in order.
    pub(super) fn live_seqs(&self) -> std::collections::BTreeMap<u64, Vec<QueueId>> {
        let mut out: std::collections::BTreeMap<u64, Vec<QueueId>> = Default::default();
        let Some(first) = self.first_seq else {
            return out;
        };
        for (q, bits) in &self.live {
            for i in bits.iter() {
                out.entry(first + i).or_default().push(*q);
            }
        }
        for qs in out.values_mut() {
            qs.sort_unstable();
        }
        out
    }

    /// Note the frame at `offset`, whose first event is `first_seq`, in the sparse index when it
    /// starts `stride` bytes or more after the last entry.
    pub(super) fn index_frame(&mut self, first_seq: u64, offset: u64, stride: u64) {
        if self.index.last().is_none_or(|(_, o)| offset >= o + stride) {
            self.index.push((first_seq, offset));
        }
    }

    /// Note event `seq`'s first-enqueue time in the runs.
    pub(super) fn note_ms(&mut self, seq: u64, ms: u64) {
        match self.ms_runs.last_mut() {
            Some((_, run_ms)) if *run_ms / 1000 == ms / 1000 => *run_ms = (*run_ms).max(ms),
            _ => self.ms_runs.push((seq, ms)),
        }
    }

    pub(super) fn pending(&self) -> u64 {
        self.live.values().map(|b| b.ones).sum()
    }
    pub(super) fn bit(&self, seq: u64) -> Option<u64> {
        self.first_seq
            .filter(|f| seq >= *f && seq <= self.last_seq)
            .map(|f| seq - f)
    }
}

/// Where the frames continue from `offset`: past the damaged span starting there, if any.
pub(super) fn past_hole(holes: &[(u64, u64)], offset: u64) -> u64 {
    holes
        .iter()
        .find(|(start, _)| *start == offset)
        .map_or(offset, |(_, next)| *next)
}
