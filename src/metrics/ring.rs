//! The last minutes of the broker's counters, in memory: what the console's overview charts.
//!
//! A fixed number of [`Sample`]s (each a handful of counters and gauges, ~100 bytes), the oldest
//! replaced by the newest: memory is bounded by the capacity whatever the load, and no external
//! time-series database is needed. Counters are cumulative (rates are the difference of two
//! samples), so a missed tick loses resolution, not counts.

use crate::model::reason::DropReason;
use std::collections::VecDeque;

/// Seconds between samples.
pub const SAMPLE_EVERY_SECS: u64 = 2;
/// Samples kept: 15 minutes.
pub const SAMPLES_KEPT: usize = (15 * 60 / SAMPLE_EVERY_SECS) as usize;

/// The broker's counters and gauges at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Wall-clock time, ms since the epoch.
    pub at_ms: u64,
    /// Events accepted by publishes, all topics (cumulative).
    pub events_in: u64,
    /// Events delivered (pushed and acknowledged), all subscriptions (cumulative).
    pub events_out: u64,
    /// Delivery attempts that failed (cumulative); the event may still be retried.
    pub failed_attempts: u64,
    /// Events dead-lettered, by [`DropReason`] in [`DropReason::ALL`]'s order (cumulative).
    pub dropped: [u64; DropReason::ALL.len()],
    /// Bytes of undelivered events held in memory now.
    pub pending_bytes: u64,
    /// Bytes the event store uses on disk now.
    pub disk_bytes: u64,
}

/// The newest [`SAMPLES_KEPT`] samples (or another capacity).
#[derive(Debug)]
pub struct SampleRing {
    samples: VecDeque<Sample>,
    capacity: usize,
}

impl Default for SampleRing {
    fn default() -> Self {
        Self::with_capacity(SAMPLES_KEPT)
    }
}

impl SampleRing {
    /// An empty ring holding at most `capacity` samples (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Add the newest sample, dropping the oldest when full.
    pub fn push(&mut self, s: Sample) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// The samples, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_samples_within_its_capacity() {
        let mut r = SampleRing::with_capacity(3);
        assert_eq!(r.iter().count(), 0);
        for i in 0..10 {
            r.push(Sample {
                at_ms: i,
                ..Sample::default()
            });
            assert!(r.iter().count() <= 3);
        }
        let kept: Vec<u64> = r.iter().map(|s| s.at_ms).collect();
        assert_eq!(kept, vec![7, 8, 9]);
        assert_eq!(SAMPLES_KEPT, 450, "15 minutes of 2 s samples");
        assert_eq!(SampleRing::default().capacity, SAMPLES_KEPT);
    }
}
