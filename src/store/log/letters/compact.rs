//! Keeping the letters within their bounds: which letters a put evicts (the queue's oldest past
//! its count, then the oldest of the largest holders while the byte bound is passed), and the
//! compaction of the oldest segment (its live letters copied forward, the file given back).

use super::record::LetterRecord;
use super::{io_err, Inner, Loc};
use crate::store::deadletter::largest_holder;
use crate::store::{QueueId, StoreError};
use std::collections::{BTreeMap, HashMap};

impl Inner {
    /// The letters a put of `size` bytes to `queue` evicts (see `store::deadletter`): the
    /// queue's oldest past its count, then, while the byte bound is passed, the oldest of the
    /// largest holders.
    pub(super) fn victims(
        &self,
        queue: QueueId,
        size: u64,
        per_subscription: usize,
        max_bytes: u64,
    ) -> Vec<(QueueId, u64)> {
        let mut out = Vec::new();
        let mut held = self.bytes.clone();
        let mut total = self.total;
        let mut cursors: HashMap<QueueId, std::collections::btree_map::Iter<'_, u64, Loc>> =
            HashMap::new();
        let mut next = |q: QueueId, held: &mut HashMap<QueueId, u64>| -> Option<(u64, u64)> {
            let it = cursors
                .entry(q)
                .or_insert_with(|| self.letters.get(&q).map(BTreeMap::iter).unwrap_or_default());
            let (id, loc) = it.next()?;
            if let Some(b) = held.get_mut(&q) {
                *b = b.saturating_sub(loc.size);
            }
            Some((*id, loc.size))
        };
        let mut count = self.letters.get(&queue).map_or(0, BTreeMap::len);
        while count >= per_subscription {
            let Some((id, s)) = next(queue, &mut held) else {
                break;
            };
            out.push((queue, id));
            total = total.saturating_sub(s);
            count -= 1;
        }
        while total + size > max_bytes {
            let Some(victim) = largest_holder(&held, queue, size) else {
                break;
            };
            let Some((id, s)) = next(victim, &mut held) else {
                break;
            };
            out.push((victim, id));
            total = total.saturating_sub(s);
        }
        out
    }

    /// Compact oldest segments while the files hold more than twice the live letters plus one
    /// segment (at most one pass over the segments per call).
    pub(super) fn compact(&mut self) -> Result<(), StoreError> {
        let mut rounds = self.segs.len();
        while rounds > 0
            && self.segs.len() > 1
            && self.file_bytes() > 2 * self.total + self.opts.segment_bytes
        {
            rounds -= 1;
            let Some(&oldest) = self.segs.keys().next() else {
                break;
            };
            for (queue, id, loc) in self.live_in(oldest) {
                let letter = self.read(queue, id, loc)?;
                let (seg, at, len) = self.append(&[LetterRecord::Letter { queue, letter }])?;
                self.insert(
                    queue,
                    id,
                    Loc {
                        seg,
                        at,
                        len,
                        size: loc.size,
                    },
                );
            }
            self.sync()?;
            let path = self.path(oldest);
            let removed = self
                .fs
                .remove(&path)
                .and_then(|()| self.fs.sync_dir(&self.opts.dir));
            if let Err(e) = removed {
                return Err(self.fail(io_err(&path, e)));
            }
            self.segs.remove(&oldest);
        }
        Ok(())
    }
}
