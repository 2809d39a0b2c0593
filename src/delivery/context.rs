//! What every subscription's delivery shares: the broker-wide engine context (clock, store,
//! in-flight bound, endpoint health, dead letters, memory bound) and the shutdown drain.

use super::forward::Forwarder;
use super::health::{HealthConfig, HealthRegistry};
use crate::clock::Clock;
use crate::store::deadletter::{DeadLetterBound, DeadLetterStore};
use crate::store::Store;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Broker-wide pieces every dispatcher uses.
pub struct DeliveryContext {
    /// Clock (wall ms for TTL, tokio time for timers).
    pub clock: Clock,
    /// Durable copy of persisted subscriptions' events.
    pub store: Arc<dyn Store>,
    /// Broker-wide in-flight bound.
    pub global: Arc<Semaphore>,
    /// Per-subscription in-flight bound.
    pub max_in_flight: usize,
    /// Per-queue-subscription bound of received, unsettled events.
    pub max_locks: usize,
    /// Per-queue-subscription bound of received, unsettled events' body bytes.
    pub max_locked_bytes: u64,
    /// The key every queue subscription's lock tokens are signed with (one per process, so a
    /// token of another subscription is known as such).
    pub lock_tokens: Arc<super::lock_token::TokenKey>,
    /// Log each successful delivery.
    pub log_success: bool,
    /// Endpoint health thresholds.
    pub health_cfg: HealthConfig,
    /// Endpoint health by URL.
    pub health: HealthRegistry,
    /// Dead letters.
    pub dead_letters: Arc<dyn DeadLetterStore>,
    /// What the dead-letter store keeps (per subscription, and bytes all together).
    pub dead_letter_bound: DeadLetterBound,
    /// Posts dead letters to dead-letter webhooks.
    pub forwarder: Forwarder,
    /// Event payload bytes held in memory (`broker__maxPendingBytes`).
    pub pending_bytes: Arc<super::payload::PendingBytes>,
    /// Hands the store writes that follow delivery attempts to the store, in order.
    pub writer: Arc<super::writer::StoreWriter>,
    /// Shutdown drain.
    pub drain: Drain,
    /// Spans of delivery attempts and their settling (off unless an OTLP endpoint is set).
    pub tracer: crate::telemetry::Tracer,
}

/// The shutdown drain. Once [`Drain::start`]ed, every subscription task sends nothing new,
/// waits for its in-flight attempts, settles them (acknowledged events leave the store), and
/// ends; [`Drain::running`] counts the tasks not yet ended.
#[derive(Debug, Default)]
pub struct Drain {
    started: std::sync::atomic::AtomicBool,
    pub(super) running: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drain {
    /// Stop sending; tasks end once their in-flight attempts are settled (each task must also
    /// be woken through its `notify`).
    pub fn start(&self) {
        self.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Subscription tasks still running.
    pub fn running(&self) -> usize {
        self.running.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(super) fn started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Counts a running subscription task in [`Drain::running`] until dropped (ended or aborted).
pub(super) struct Running(Arc<std::sync::atomic::AtomicUsize>);

impl Running {
    pub(super) fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}
