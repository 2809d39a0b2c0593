//! The connection table behind `inbound__maxConnections` and `inbound__maxConnectionsPerPeer`.
//!
//! Every open connection holds a [`Slot`]. A slot is *idle* while its connection has no request
//! in progress (it has not sent one yet, sits between keep-alive requests, or is still sending
//! its headers) and *busy* while a request is handled ([`Slot::busy`]). Idle slots are kept in
//! least-recently-used order, so a full table makes room the way nginx reuses keep-alive slots:
//!
//! * at the cap, the accept loop closes the idle connection that was used least recently and
//!   accepts the new one; only when every connection is busy does it wait (new connections then
//!   wait in the kernel's listen backlog);
//! * a peer (IP address) at its own cap gets its least recently used idle connection closed for
//!   the new one, or the new one is refused when all of the peer's connections are busy;
//! * past half the cap the table is *under pressure*: new connections get shorter handshake
//!   and idle timeouts ([`Slots::under_pressure`]);
//! * a busy connection whose request is a receive waiting for events (a long poll,
//!   [`ConnYield`]) is the next choice when no connection is idle: its receive is ended (it
//!   answers no events, as at `maxWaitTime`, and closes the connection), which gives the slot
//!   back within moments (issue 37: 1,024 long polls held every slot). At the cap the accept
//!   loop then waits for it; a peer at its cap has the new connection admitted meanwhile.
//!
//! So sockets that connect and send nothing cannot keep the API from new clients: each new
//! connection pushes the oldest idle one out (issue 20: a flood of 3,000 idle sockets, then
//! `/healthz` and a publish answered within 2 s).

use crate::api::long_poll::ConnYield;
use crate::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The connection table, shared by both listeners.
pub struct Slots {
    cap: usize,
    per_peer: usize,
    table: Mutex<Table>,
    /// Signalled whenever a slot is released or becomes idle.
    changed: Notify,
}

#[derive(Default)]
struct Table {
    next: u64,
    conns: HashMap<u64, Entry>,
    /// Idle connections by the sequence number of their last use: the first is evicted first.
    idle: BTreeMap<u64, u64>,
    per_peer: HashMap<IpAddr, usize>,
}

struct Entry {
    peer: IpAddr,
    busy: usize,
    /// Its key in `idle` while idle.
    idle_seq: Option<u64>,
    close: Arc<Notify>,
    /// Its long-poll state: a waiting receive may be ended to make room.
    poll: Arc<ConnYield>,
    /// Its waiting receive was told to end (not chosen again).
    yielding: bool,
}

impl Table {
    fn seq(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Remove connection `id` (closing it when `close`); `true` when it was there.
    fn remove(&mut self, id: u64, close: bool) -> bool {
        let Some(e) = self.conns.remove(&id) else {
            return false;
        };
        if let Some(seq) = e.idle_seq {
            self.idle.remove(&seq);
        }
        if let Some(n) = self.per_peer.get_mut(&e.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&e.peer);
            }
        }
        if close {
            e.close.notify_one();
        }
        true
    }

    /// Close the least recently used idle connection (of `peer`, when given).
    fn evict(&mut self, peer: Option<IpAddr>) -> bool {
        let victim = self
            .idle
            .values()
            .copied()
            .find(|id| peer.is_none_or(|p| self.conns.get(id).is_some_and(|e| e.peer == p)));
        match victim {
            Some(id) => self.remove(id, true),
            None => false,
        }
    }

    /// End the waiting receive of a busy connection (of `peer`, when given), one not told
    /// already; `true` when one was told. Its connection closes once it has answered.
    fn end_long_poll(&mut self, peer: Option<IpAddr>) -> bool {
        let victim = self.conns.values_mut().find(|e| {
            !e.yielding && e.busy > 0 && peer.is_none_or(|p| e.peer == p) && e.poll.is_waiting()
        });
        match victim {
            Some(e) => {
                e.yielding = true;
                e.poll.end();
                true
            }
            None => false,
        }
    }
}

impl Slots {
    /// A table of at most `cap` connections, at most `per_peer` from one address (0 = no
    /// per-peer cap).
    pub fn new(cap: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            per_peer: if per_peer == 0 { usize::MAX } else { per_peer },
            table: Mutex::new(Table::default()),
            changed: Notify::new(),
        })
    }

    /// Wait until a connection may be accepted: at once below the cap; at the cap after the
    /// least recently used idle connection was closed; when every connection is busy, until one
    /// is released or becomes idle.
    pub async fn room(&self) {
        loop {
            let wait = self.changed.notified();
            {
                let mut t = lock(&self.table);
                if t.conns.len() < self.cap || t.evict(None) {
                    return;
                }
                // Every connection is busy: a waiting receive gives its slot back (it answers
                // and closes; the release wakes this loop).
                t.end_long_poll(None);
            }
            wait.await;
        }
    }

    /// Register a connection from `peer`: `None` (refuse it) when the peer is at its cap and
    /// none of its connections is idle or waiting in a receive (one that is has its receive
    /// ended, and the new connection is admitted while it closes). Call after [`Slots::room`].
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut t = lock(&self.table);
        if t.per_peer.get(&peer).copied().unwrap_or(0) >= self.per_peer
            && !t.evict(Some(peer))
            && !t.end_long_poll(Some(peer))
        {
            return None;
        }
        let id = t.seq();
        let seq = t.seq();
        let close = Arc::new(Notify::new());
        let poll = Arc::new(ConnYield::default());
        t.conns.insert(
            id,
            Entry {
                peer,
                busy: 0,
                idle_seq: Some(seq),
                close: close.clone(),
                poll: poll.clone(),
                yielding: false,
            },
        );
        t.idle.insert(seq, id);
        *t.per_peer.entry(peer).or_insert(0) += 1;
        Some(Slot {
            slots: self.clone(),
            id,
            close,
            poll,
        })
    }

    /// More than half the cap in use: new connections get shorter timeouts.
    pub fn under_pressure(&self) -> bool {
        lock(&self.table).conns.len() * 2 > self.cap
    }

    /// Open connections.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.table).conns.len()
    }
}

/// One connection's place in the table; released on drop.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    close: Arc<Notify>,
    poll: Arc<ConnYield>,
}

impl Slot {
    /// The connection's long-poll state, for its requests (a request extension).
    pub fn long_poll(&self) -> Arc<ConnYield> {
        self.poll.clone()
    }

    /// Completes when the table closed this connection to make room.
    pub async fn evicted(&self) {
        self.close.notified().await;
    }

    /// Mark a request in progress until the guard drops (the connection is not evicted
    /// meanwhile); then it is the most recently used idle connection.
    pub fn busy(self: &Arc<Self>) -> Busy {
        let mut t = lock(&self.slots.table);
        let mut idle_seq = None;
        if let Some(e) = t.conns.get_mut(&self.id) {
            e.busy += 1;
            idle_seq = e.idle_seq.take();
        }
        if let Some(seq) = idle_seq {
            t.idle.remove(&seq);
        }
        Busy { slot: self.clone() }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots.table).remove(self.id, false);
        self.slots.changed.notify_waiters();
    }
}

/// A request in progress on a connection ([`Slot::busy`]).
pub struct Busy {
    slot: Arc<Slot>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let slots = &self.slot.slots;
        let mut t = lock(&slots.table);
        let seq = t.seq();
        let id = self.slot.id;
        let now_idle = match t.conns.get_mut(&id) {
            Some(e) => {
                e.busy = e.busy.saturating_sub(1);
                // A connection whose receive was ended closes after its answer: not idle (an
                // eviction now could cut that answer off).
                if e.busy == 0 && !e.yielding {
                    e.idle_seq = Some(seq);
                    true
                } else {
                    false
                }
            }
            None => false,
        };
        if now_idle {
            t.idle.insert(seq, id);
            drop(t);
            slots.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[tokio::test]
    async fn at_the_cap_the_least_recently_used_idle_connection_makes_room() {
        let slots = Slots::new(2, 0);
        let a = Arc::new(slots.admit(ip(1)).unwrap());
        let b = Arc::new(slots.admit(ip(2)).unwrap());
        // `a` was used after `b` was opened: `b` is the least recently used.
        drop(a.busy());
        slots.room().await;
        assert_eq!(slots.len(), 1);
        tokio::time::timeout(std::time::Duration::from_secs(1), b.evicted())
            .await
            .expect("b was told to close");
        let _c = slots.admit(ip(3)).unwrap();
        assert_eq!(slots.len(), 2);
    }

    #[tokio::test]
    async fn busy_connections_are_never_evicted() {
        let slots = Slots::new(1, 0);
        let a = Arc::new(slots.admit(ip(1)).unwrap());
        let busy = a.busy();
        let room = tokio::time::timeout(std::time::Duration::from_millis(50), slots.room()).await;
        assert!(room.is_err(), "no room while the only connection is busy");
        drop(busy);
        slots.room().await;
        assert_eq!(slots.len(), 0);
    }

    #[tokio::test]
    async fn with_every_connection_busy_a_waiting_receive_is_ended_for_room() {
        let slots = Slots::new(2, 0);
        let a = Arc::new(slots.admit(ip(1)).unwrap());
        let b = Arc::new(slots.admit(ip(2)).unwrap());
        let (_busy_a, busy_b) = (a.busy(), b.busy());
        let poll = b.long_poll();
        let waiting = tokio::spawn({
            let poll = poll.clone();
            async move { poll.ended().await }
        });
        while !poll.is_waiting() {
            tokio::task::yield_now().await;
        }
        let room = tokio::spawn({
            let slots = slots.clone();
            async move { slots.room().await }
        });
        waiting.await.unwrap();
        assert!(poll.was_ended(), "b's receive was told to end");
        // Its answer does not make b idle (an eviction could cut the answer off); b closing
        // makes the room.
        drop(busy_b);
        assert!(!room.is_finished());
        drop(b);
        room.await.unwrap();
        assert_eq!(slots.len(), 1);
    }

    #[test]
    fn a_peer_at_its_cap_ends_one_of_its_waiting_receives_for_a_new_connection() {
        let slots = Slots::new(10, 1);
        let a = Arc::new(slots.admit(ip(1)).unwrap());
        let _busy = a.busy();
        assert!(slots.admit(ip(1)).is_none(), "busy, not waiting: refused");
        a.long_poll().mark_waiting();
        assert!(
            slots.admit(ip(1)).is_some(),
            "admitted while a's receive ends"
        );
        assert!(a.long_poll().was_ended());
    }

    #[test]
    fn a_peer_at_its_cap_pushes_out_its_own_idle_connection_or_is_refused() {
        let slots = Slots::new(10, 2);
        let a = Arc::new(slots.admit(ip(1)).unwrap());
        let _b = slots.admit(ip(1)).unwrap();
        let _other = slots.admit(ip(2)).unwrap();
        let c = Arc::new(slots.admit(ip(1)).expect("evicts a"));
        assert_eq!(slots.len(), 3);
        let _busy = (a.busy(), c.busy());
        let d = slots.admit(ip(1)).expect("evicts b, the idle one");
        let _busy_d = Arc::new(d).busy();
        assert!(slots.admit(ip(1)).is_none(), "all of the peer's are busy");
        assert!(slots.admit(ip(3)).is_some(), "other peers are not affected");
    }
}
