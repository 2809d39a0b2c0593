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
