//! Long polls (`:receive` with `maxWaitTime` > 0) within the connection budget (issue 37,
//! finding 3: 1,024 waiting receives from one key held every connection slot, and `/healthz` and
//! an administrator's publish on new connections were reset).
//!
//! * **Caps** ([`LongPolls::seat`]): at most `inbound__maxLongPollsPerSubscription` waiting
//!   receives on one subscription, `inbound__maxLongPollsPerCredential` from one credential, and
//!   `inbound__maxConnections` − 1 in all, so one connection slot is never held by a long poll
//!   (`/healthz`, `/readyz`). A receive past a cap gets 429 `TooManyRequests` with
//!   `Retry-After: 1` (the SDKs retry it).
//! * **Ending early** ([`ConnYield`]): the listener attaches one to every connection. While a
//!   receive waits it marks its connection as yieldable; when the connection table runs out of
//!   idle connections to close for a new one (`server/slots.rs`), it ends such a wait instead.
//!   The receive then answers what Event Grid answers at `maxWaitTime`, `{"value":[]}`, with
//!   `Connection: close`, and the client polls again.

use crate::error::ApiError;
use crate::sync::lock;
use axum::http::StatusCode;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// One connection's long-poll state, shared by the connection table and its requests.
#[derive(Debug, Default)]
pub struct ConnYield {
    /// A receive on this connection is waiting (and may be ended).
    waiting: AtomicBool,
    /// The table asked the waiting receive to end.
    ended: AtomicBool,
    end: Notify,
}

impl ConnYield {
    /// Whether a receive on this connection is waiting now.
    pub fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }

    /// Mark a receive waiting without one (table tests).
    #[cfg(test)]
    pub(crate) fn mark_waiting(&self) {
        self.waiting.store(true, Ordering::Release);
    }

    /// Ask the waiting receive to answer now (the connection table, to make room).
    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.end.notify_one();
    }

    /// Whether the table ended this connection's receive (its answer closes the connection).
    pub fn was_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Completes when the table ends the wait; the connection counts as yieldable meanwhile.
    pub async fn ended(&self) {
        struct Waiting<'a>(&'a AtomicBool);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        self.waiting.store(true, Ordering::Release);
        let _waiting = Waiting(&self.waiting);
        self.end.notified().await;
    }
}

/// The caps on waiting receives (see the module docs).
#[derive(Debug)]
pub struct LongPolls {
    per_subscription: usize,
    per_credential: usize,
    total: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    subscriptions: HashMap<String, usize>,
    credentials: HashMap<[u8; 16], usize>,
}

impl Counts {
    fn add(&mut self, sub: &str, credential: [u8; 16]) {
        self.total += 1;
        *self.subscriptions.entry(sub.to_string()).or_default() += 1;
        *self.credentials.entry(credential).or_default() += 1;
    }

    fn remove(&mut self, sub: &str, credential: [u8; 16]) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.subscriptions.get_mut(sub) {
            *n -= 1;
            if *n == 0 {
                self.subscriptions.remove(sub);
            }
        }
        if let Some(n) = self.credentials.get_mut(&credential) {
            *n -= 1;
            if *n == 0 {
                self.credentials.remove(&credential);
            }
        }
    }
}

impl LongPolls {
    /// Caps of `per_subscription` and `per_credential` waiting receives, and of
    /// `max_connections` − 1 in all.
    pub fn new(per_subscription: usize, per_credential: usize, max_connections: usize) -> Self {
        Self {
            per_subscription: per_subscription.max(1),
            per_credential: per_credential.max(1),
            total: max_connections.saturating_sub(1).max(1),
            counts: Mutex::default(),
        }
    }

    /// A place for one waiting receive on `topic`/`subscription` by `credential`, held until the
    /// seat drops.
    ///
    /// # Errors
    /// 429 `TooManyRequests` + `Retry-After: 1` past a cap.
    pub fn seat(
        self: &Arc<Self>,
        topic: &str,
        subscription: &str,
        credential: [u8; 16],
    ) -> Result<Seat, ApiError> {
        let sub = format!(
            "{}/{}",
            topic.to_ascii_lowercase(),
            subscription.to_ascii_lowercase()
        );
        let mut c = lock(&self.counts);
        let full = if c.total >= self.total {
            Some("inbound__maxConnections − 1 (one connection is kept for /healthz and /readyz)")
        } else if c.subscriptions.get(&sub).copied().unwrap_or(0) >= self.per_subscription {
            Some("inbound__maxLongPollsPerSubscription")
        } else if c.credentials.get(&credential).copied().unwrap_or(0) >= self.per_credential {
            Some("inbound__maxLongPollsPerCredential")
        } else {
            None
        };
        if let Some(limit) = full {
            return Err(ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                detail: "TooManyRequests",
                message: format!(
                    "too many receives are waiting (maxWaitTime > 0) at once: the limit is {limit}; retry later, or receive with maxWaitTime=0"
                ),
                retry_after: Some(Duration::from_secs(1)),
            });
        }
        c.add(&sub, credential);
        Ok(Seat {
            polls: self.clone(),
            sub,
            credential,
        })
    }
}

/// One waiting receive's place under the caps; given back on drop.
#[derive(Debug)]
pub struct Seat {
    polls: Arc<LongPolls>,
    sub: String,
    credential: [u8; 16],
}

impl Drop for Seat {
    fn drop(&mut self) {
        lock(&self.polls.counts).remove(&self.sub, self.credential);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seats_are_capped_per_subscription_per_credential_and_in_all() {
        let p = Arc::new(LongPolls::new(2, 3, 6));
        let (a, b) = ([1; 16], [2; 16]);
        let s1 = p.seat("T", "s", a).unwrap();
        let _s2 = p.seat("t", "S", b).unwrap();
        let e = p.seat("t", "s", b).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(e.message.contains("PerSubscription"), "{}", e.message);
        let _s3 = p.seat("t", "s2", a).unwrap();
        let _s4 = p.seat("t", "s3", a).unwrap();
        let e = p.seat("t", "s4", a).unwrap_err();
        assert!(e.message.contains("PerCredential"), "{}", e.message);
        let _s5 = p.seat("t", "s4", b).unwrap();
        let e = p.seat("t", "s5", [3; 16]).unwrap_err();
        assert!(
            e.message.contains("healthz"),
            "5 of 6 connections: {}",
            e.message
        );
        drop(s1);
        assert!(p.seat("t", "s", [3; 16]).is_ok(), "given back on drop");
    }

    #[tokio::test]
    async fn an_ended_wait_completes_and_says_so() {
        let y = Arc::new(ConnYield::default());
        assert!(!y.is_waiting());
        let w = tokio::spawn({
            let y = y.clone();
            async move { y.ended().await }
        });
        while !y.is_waiting() {
            tokio::task::yield_now().await;
        }
        y.end();
        w.await.unwrap();
        assert!(y.was_ended() && !y.is_waiting());
    }
}
