//! The request-body deadline: a request body must arrive within
//! `inbound__requestBodyTimeoutInSeconds` of the handler starting to read it.
//!
//! The listener wraps every request body in [`DeadlineBody`]; the clock starts at the first read
//! (requests whose body is never read, like GETs, never arm a timer). Past the deadline the body
//! fails with [`BodyTimedOut`], which [`super::read_body`] answers with 408. The header phase
//! and idle keep-alive connections are bounded by the listener (`inbound__idleTimeoutInSeconds`).

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

/// How long a request waits for room in the [`BodyBudget`] before it gets 503.
pub const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// The bytes of request bodies being read at once, all connections together
/// (`inbound__maxBodyBytesInFlight`): without it, every connection could hold a body of
/// `broker__maxRequestBodyBytes` while sending it slowly (1,024 × 1 MiB), outside every other
/// memory bound. Each read reserves its `Content-Length` (or the body limit when there is none)
/// until the body is read.
pub struct BodyBudget {
    bytes: tokio::sync::Semaphore,
    total: usize,
}

impl BodyBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        let total = total.clamp(
            1,
            tokio::sync::Semaphore::MAX_PERMITS.min(u32::MAX as usize),
        );
        Self {
            bytes: tokio::sync::Semaphore::new(total),
            total,
        }
    }

    /// Reserve `n` bytes (at most the whole budget, so one large body can still be read
    /// alone), waiting up to [`BUDGET_WAIT`].
    ///
    /// # Errors
    /// `None` when the budget stayed taken.
    pub async fn reserve(&self, n: usize) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let n = u32::try_from(n.clamp(1, self.total)).unwrap_or(u32::MAX);
        match tokio::time::timeout(BUDGET_WAIT, self.bytes.acquire_many(n)).await {
            Ok(Ok(p)) => Some(p),
            _ => None,
        }
    }
}

/// The request body did not arrive within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// A body that fails with [`BodyTimedOut`] when it is not complete `timeout` after its first
/// read.
pub struct DeadlineBody<B> {
    inner: B,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<B> DeadlineBody<B> {
    /// Wrap `inner`.
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: None,
        }
    }
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
