//! Time, in two kinds on purpose.
//!
//! * Timers use tokio's `Instant` (pausable in tests).
//! * TTL and anything persisted use wall-clock milliseconds: an `Instant` means nothing after a
//!   restart.
//!
//! [`Clock`] derives wall time from the wall clock read **once** at start plus tokio's monotonic
//! elapsed time. So with tokio's paused clock the TTL advances exactly with the timers (schedules
//! and expiry are tested together without sleeping), and a wall-clock jump on a device without an
//! RTC does not expire or resurrect queued events mid-run.

use std::time::{SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Milliseconds since the Unix epoch.
pub type WallMs = u64;

/// The broker's clock. Cheap to copy.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base_wall_ms: WallMs,
    base_instant: Instant,
}

impl Clock {
    /// A clock anchored at the system's wall time now.
    pub fn system() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Self::anchored_at(wall)
    }

    /// A clock whose wall time now is `wall_ms` (tests).
    pub fn anchored_at(wall_ms: WallMs) -> Self {
        Self {
            base_wall_ms: wall_ms,
            base_instant: Instant::now(),
        }
    }

    /// Wall-clock milliseconds now.
    pub fn now_ms(&self) -> WallMs {
        self.base_wall_ms + self.base_instant.elapsed().as_millis() as u64
    }

    /// Monotonic now (for timers).
    pub fn instant(&self) -> Instant {
        Instant::now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn wall_time_follows_the_paused_clock() {
        let c = Clock::anchored_at(1_000);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(c.now_ms(), 61_000);
    }
}
