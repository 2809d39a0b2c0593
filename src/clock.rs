//! Time, in two kinds on purpose.
//!
//! * Timers use tokio's `Instant` (pausable in tests).
//! * TTL and anything persisted use wall-clock milliseconds: an `Instant` means nothing after a
//!   restart.
//!
//! [`Clock`] derives wall time from the wall clock read **once** at start plus tokio's monotonic
//! elapsed time. So with tokio's paused clock the TTL advances exactly with the timers (schedules
//! and expiry are tested together without sleeping), and a wall-clock jump on a device without an
//! RTC (NTP setting the time, forward or back, by days) does not expire, dead-letter or stall
//! queued events mid-run: ages and delays are monotonic while running.
//!
//! **Across a restart** the persisted times (`first_enqueued_ms`, `due_ms`) were written on the
//! previous run's timeline, and the wall clock read at start may have jumped since. The rule
//! ([`Clock::resume`]): the previous run's last time is kept in a heartbeat file next to the
//! metadata ([`HEARTBEAT_FILE`], written every 30 s and at shutdown); the new run's clock starts
//! at the wall time **clamped** to `[last seen, last seen + allowance]`
//! (`broker__restartClockAllowanceInSeconds`). So persisted ages are trusted, and the downtime
//! counts toward TTL and retry delays for at most the allowance:
//! * a forward jump (or a long downtime) ages the backlog by at most the allowance, not by the
//!   jump: a backlog that is not old is not expired;
//! * a backward jump (a device that booted with an old time) resumes where the last run stopped:
//!   retries are not pushed back by the size of the jump.
//!
//! The price: after a downtime longer than the allowance, or a boot with a time behind the last
//! run's, gridlet's time (dead-letter timestamps, TTL) runs behind or ahead of the wall clock for
//! that run; start-up logs both times when it does. Without a heartbeat (first start, memory
//! store) the wall clock is trusted as before.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// The heartbeat file, in the metadata directory: the clock's last time, decimal milliseconds.
pub const HEARTBEAT_FILE: &str = "gridlet-clock";
/// How often a running gridlet writes its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(30);

/// The system's wall time now, in milliseconds since the Unix epoch.
pub fn system_wall_ms() -> WallMs {
    // The seam itself: the one place the system's wall time is read for the broker's clock.
    #[allow(clippy::disallowed_methods)]
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The last time recorded in `dir`'s heartbeat file, if there is a readable one.
pub fn read_heartbeat(dir: &Path) -> Option<WallMs> {
    std::fs::read_to_string(dir.join(HEARTBEAT_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Record `ms` as the last time in `dir`'s heartbeat file (written aside, then renamed, so a
/// crash leaves the old or the new value, never half of one).
///
/// # Errors
/// The directory is not writable.
pub fn write_heartbeat(dir: &Path, ms: WallMs) -> std::io::Result<()> {
    let tmp = dir.join(format!("{HEARTBEAT_FILE}.tmp"));
    std::fs::write(&tmp, ms.to_string())?;
    std::fs::rename(tmp, dir.join(HEARTBEAT_FILE))
}

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
        Self::anchored_at(system_wall_ms())
    }

    /// The clock of a restarted gridlet (the rule in the module docs): starts at `wall_ms`
    /// clamped to `[last_seen_ms, last_seen_ms + allowance]`; at `wall_ms` without a heartbeat.
    /// Returns the clock and its start time.
    pub fn resume(
        wall_ms: WallMs,
        last_seen_ms: Option<WallMs>,
        allowance: Duration,
    ) -> (Self, WallMs) {
        let start = match last_seen_ms {
            None => wall_ms,
            Some(last) => wall_ms.clamp(last, last.saturating_add(allowance.as_millis() as u64)),
        };
        (Self::anchored_at(start), start)
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

    const DAY: u64 = 86_400_000;
    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn a_restart_counts_at_most_the_allowance_of_downtime() {
        let last = 100 * DAY;
        // Normal restart: the wall clock is trusted.
        assert_eq!(
            Clock::resume(last + 60_000, Some(last), HOUR).1,
            last + 60_000
        );
        // NTP jumped forward by days (or a long downtime): one allowance of age, not the jump.
        assert_eq!(
            Clock::resume(last + 3 * DAY, Some(last), HOUR).1,
            last + 3_600_000
        );
        // Booted with an old time: resume where the last run stopped.
        assert_eq!(Clock::resume(last - 5 * DAY, Some(last), HOUR).1, last);
        // No heartbeat: the wall clock.
        assert_eq!(Clock::resume(7, None, HOUR).1, 7);
        // Running, the clock is monotonic whatever the system time does.
        let (c, start) = Clock::resume(last - 5 * DAY, Some(last), HOUR);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(c.now_ms(), start + 90_000);
    }

    #[test]
    fn heartbeat_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_heartbeat(dir.path()), None);
        write_heartbeat(dir.path(), 1_234).unwrap();
        write_heartbeat(dir.path(), 5_678).unwrap();
        assert_eq!(read_heartbeat(dir.path()), Some(5_678));
    }

    #[tokio::test(start_paused = true)]
    async fn wall_time_follows_the_paused_clock() {
        let c = Clock::anchored_at(1_000);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(c.now_ms(), 61_000);
    }
}
