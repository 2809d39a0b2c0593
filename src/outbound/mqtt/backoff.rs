//! Reconnect back-off with jitter, shared by every MQTT connection.

use std::time::Duration;

/// Reconnect delays: exponential from `base` to `max`, with "equal jitter" (each delay is half
/// the exponential step plus a random part of the other half), so many clients that lost the
/// same broker do not come back at once, and no delay is shorter than half its step. Pure: the
/// randomness is a seeded splitmix64, so tests see fixed sequences.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
    state: u64,
}

impl Backoff {
    /// Delays from `base` up to `max`; `seed` picks the jitter sequence.
    pub fn new(base: Duration, max: Duration, seed: u64) -> Self {
        Self {
            base,
            max: max.max(base),
            attempt: 0,
            state: seed,
        }
    }

    /// gridlet's reconnect back-off: 1 s to 60 s, seeded from the connection's name and the
    /// process (so restarts of many gridlets do not share a sequence).
    pub fn reconnect(name: &str) -> Self {
        let mut seed = u64::from(std::process::id());
        for b in name.bytes() {
            seed = seed
                .wrapping_mul(0x100_0000_01b3)
                .wrapping_add(u64::from(b));
        }
        Self::new(Duration::from_secs(1), Duration::from_secs(60), seed)
    }

    fn next_random(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The step of the current attempt, before jitter: `base · 2^attempt`, at most `max`.
    pub fn step(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The delay before the next attempt; the one after is (up to `max`) twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step();
        self.attempt = self.attempt.saturating_add(1);
        let half = step / 2;
        let spread = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        let extra = if spread == 0 {
            0
        } else {
            self.next_random() % (spread + 1)
        };
        half + Duration::from_millis(extra)
    }

    /// A connection succeeded: the next failure starts from `base` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_equal_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), 7);
        let mut steps = Vec::new();
        for _ in 0..8 {
            let step = b.step();
            let d = b.next_delay();
            assert!(
                d >= step / 2 && d <= step,
                "{d:?} outside [{:?}, {step:?}]",
                step / 2
            );
            steps.push(step.as_secs());
        }
        assert_eq!(steps, [1, 2, 4, 8, 16, 30, 30, 30]);
        b.reset();
        assert_eq!(b.step(), Duration::from_secs(1));
        // Two seeds give different sequences; one seed the same.
        let seq = |seed| {
            let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60), seed);
            (0..6).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(seq(1), seq(1));
        assert_ne!(seq(1), seq(2));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_schedule_on_the_paused_clock() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8), 42);
        let start = tokio::time::Instant::now();
        let mut total = Duration::ZERO;
        for _ in 0..5 {
            let d = b.next_delay();
            total += d;
            tokio::time::sleep(d).await;
        }
        assert_eq!(start.elapsed(), total);
        // Steps 1, 2, 4, 8, 8: at least half of 23 s, at most 23 s.
        assert!(total >= Duration::from_millis(11_500) && total <= Duration::from_secs(23));
    }
}
