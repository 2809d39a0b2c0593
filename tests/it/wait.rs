//! Waiting on the real clock for something to happen: the one place tests poll. (In-process
//! tests on the paused clock wait on the harness's channel instead, `harness.rs`.)

use crate::util::WAIT;
use std::time::Duration;

/// How often [`eventually`] checks again.
const POLL: Duration = Duration::from_millis(10);

/// Wait for a condition over the real clock: call `probe` until it returns `Ok` (again every
/// 10 ms, so it returns as soon as the condition holds) and give back its value; after [`WAIT`]
/// panic with `what` and the last `Err` (the state seen).
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    eventually_within(WAIT, what, probe).await
}

/// [`eventually`] with a time limit other than [`WAIT`].
pub async fn eventually_within<T, F, Fut>(limit: Duration, what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    match poll_within(limit, probe).await {
        Ok(v) => v,
        Err(seen) => panic!("timed out after {limit:?} waiting for {what}: {seen}"),
    }
}

/// Call `probe` (again every 10 ms) until it returns `Ok` or `limit` has passed; its last answer.
/// For a test that reports a timeout itself.
pub async fn poll_within<T, E, F, Fut>(limit: Duration, mut probe: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let r = probe().await;
        if r.is_ok() || tokio::time::Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(POLL).await;
    }
}
