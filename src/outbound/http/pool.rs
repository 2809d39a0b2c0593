//! The client's shared state and its idle connections: per `(scheme, host, port)`, most
//! recently returned last, closed after [`IDLE_TIMEOUT`] (checked on checkout and by a reaper
//! task every [`REAP_EVERY`]).

use super::{Sender, IDLE_TIMEOUT, REAP_EVERY};
use crate::config::IpRange;
use crate::sync::lock;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

pub(super) struct Inner {
    pub(super) tls: TlsConnector,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) hosts: Mutex<HashMap<HostKey, Arc<HostPool>>>,
    pub(super) reaper: std::sync::atomic::AtomicBool,
    pub(super) max_idle_per_host: std::sync::atomic::AtomicUsize,
    /// Address ranges no connection may reach (`outbound__deniedAddressRanges`), set once.
    pub(super) denied: std::sync::OnceLock<Vec<IpRange>>,
    /// gridlet's own listeners, never a destination (a subscription to its own API), set once.
    pub(super) own: std::sync::OnceLock<Vec<SocketAddr>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct HostKey {
    pub(super) https: bool,
    pub(super) host: String,
    pub(super) port: u16,
}

#[derive(Default)]
pub(super) struct HostPool {
    /// Most recently returned last.
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    tx: Sender,
    since: Instant,
}

impl HostPool {
    pub(super) fn take(&self) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        while let Some(i) = idle.pop() {
            if i.since.elapsed() >= IDLE_TIMEOUT {
                // Older ones are further down: all expired.
                idle.clear();
                return None;
            }
            if !i.tx.is_closed() {
                return Some(i.tx);
            }
        }
        None
    }

    pub(super) fn put(&self, tx: Sender, max_idle: usize) {
        if tx.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        if idle.len() < max_idle {
            idle.push(Idle {
                tx,
                since: Instant::now(),
            });
        }
    }

    fn reap(&self) {
        lock(&self.idle).retain(|i| i.since.elapsed() < IDLE_TIMEOUT && !i.tx.is_closed());
    }
}

impl Inner {
    fn reap(&self) {
        let mut hosts = lock(&self.hosts);
        hosts.retain(|_, p| {
            p.reap();
            // Keep pools an endpoint still refers to or that hold connections.
            Arc::strong_count(p) > 1 || !lock(&p.idle).is_empty()
        });
    }

    /// Start the idle reaper (once, from inside the runtime).
    pub(super) fn start_reaper(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.reaper.load(Ordering::Relaxed) || self.reaper.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(self);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(REAP_EVERY).await;
                    match weak.upgrade() {
                        Some(inner) => inner.reap(),
                        None => return,
                    }
                }
            });
        } else {
            self.reaper.store(false, Ordering::Relaxed);
        }
    }
}
