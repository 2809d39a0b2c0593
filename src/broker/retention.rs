//! How far back the store keeps settled events for the deduplication windows (its retention
//! horizon, [`Store::retain_since`]): the broker's clock now less the longest window in force
//! (the setting, or the largest topic override). A restart then rebuilds each window from the
//! log's own `Event` records, delivered ones included (`recovery.rs`).
//!
//! The horizon moves with time: a task sets it again every [`tick`] (a 60th of the longest
//! window, 1 s to 1 min), and a topic change sets it at once. So a settled segment is given back
//! at most one tick after its newest event left the window. With every window off the store
//! keeps nothing more, exactly as before.

use super::*;
use crate::clock::WallMs;
use crate::sync::AbortOnDrop;
use std::sync::Weak;

/// The longest deduplication window of `topics` in milliseconds (0: none is on).
pub(super) fn longest_window_ms(
    topics: &HashMap<String, Arc<TopicEntry>>,
    default: Duration,
) -> u64 {
    topics
        .values()
        .filter_map(|t| dedup::window_ms(&t.topic(), default))
        .max()
        .unwrap_or(0)
}

/// The horizon for `window_ms` at `now_ms`: events accepted at or after it are still in some
/// window (`None`: no window is on).
pub(super) fn horizon(now_ms: WallMs, window_ms: u64) -> Option<WallMs> {
    (window_ms > 0).then(|| now_ms.saturating_sub(window_ms))
}

/// How often the horizon is moved for a longest window of `window_ms`.
fn tick(window_ms: u64) -> Duration {
    Duration::from_millis((window_ms / 60).clamp(1_000, 60_000))
}

impl Broker {
    /// Set the store's retention horizon from the topics and the clock now.
    pub(super) fn update_retention(&self) -> u64 {
        let topics = super::read(&self.inner.topics);
        let window = longest_window_ms(&topics, self.inner.cfg.broker.deduplication_window);
        let now = self.inner.ctx.clock.now_ms();
        self.inner.ctx.store.retain_since(horizon(now, window));
        window
    }

    /// Start the task that moves the horizon with time; it ends with the broker.
    pub(super) fn start_retention(&self) {
        let state: Weak<BrokerState> = Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            loop {
                let Some(inner) = state.upgrade() else {
                    return;
                };
                let window = Broker { inner }.update_retention();
                tokio::time::sleep(tick(window)).await;
            }
        });
        let _ = self.inner.retention.set(AbortOnDrop(task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_horizon_is_the_longest_window_back_and_moves_every_sixtieth_of_it() {
        assert_eq!(horizon(100_000, 0), None);
        assert_eq!(horizon(100_000, 60_000), Some(40_000));
        assert_eq!(horizon(10, 60_000), Some(0));
        assert_eq!(tick(600_000), Duration::from_secs(10));
        assert_eq!(tick(10_000), Duration::from_secs(1));
        assert_eq!(tick(7 * 86_400_000), Duration::from_secs(60));
    }
}
