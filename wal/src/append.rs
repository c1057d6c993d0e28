//! What an append gives back ([`Append`]; it carries in [`quire_proto::Event`]s): a
//! runtime-agnostic future resolved by the commit thread once the fdatasync covering the
//! append succeeded (or the log failed).
//!
//! The one-shot channel is a `Mutex` + `Condvar` + `Waker`: the future side works under any
//! executor, [`Append::wait`] blocks a plain thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use quire_proto::Offset;

use crate::error::WalError;

#[derive(Debug, Default)]
struct SlotState {
    result: Option<Result<Offset, WalError>>,
    waker: Option<Waker>,
}

/// The commit thread's end of an append's one-shot channel.
#[derive(Debug, Default)]
pub(crate) struct AckSlot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

impl AckSlot {
    pub(crate) fn new() -> Arc<AckSlot> {
        Arc::new(AckSlot::default())
    }

    /// Resolves the append. The first result wins; later ones are ignored.
    pub(crate) fn complete(&self, result: Result<Offset, WalError>) {
        let waker = {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if st.result.is_some() {
                return;
            }
            st.result = Some(result);
            st.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The result of [`crate::Wal::append`]: resolves to the last offset written once the
/// fdatasync that covers the append succeeded, or to the error.
///
/// Dropping it does not cancel the append. Polling after it returned `Ready` panics.
#[derive(Debug)]
#[must_use = "an append is only durable when its future resolves Ok"]
pub struct Append {
    inner: AppendInner,
}

#[derive(Debug)]
enum AppendInner {
    Ready(Option<Result<Offset, WalError>>),
    Pending(Arc<AckSlot>),
}

impl Append {
    pub(crate) fn ready(result: Result<Offset, WalError>) -> Append {
        Append {
            inner: AppendInner::Ready(Some(result)),
        }
    }

    pub(crate) fn pending(slot: Arc<AckSlot>) -> Append {
        Append {
            inner: AppendInner::Pending(slot),
        }
    }

    /// Blocks the calling thread until the append resolves (for tools and tests; do not
    /// call it on an async executor's thread).
    ///
    /// # Errors
    /// As the future: a validation error, [`WalError::Failed`], [`WalError::Closed`].
    pub fn wait(self) -> Result<Offset, WalError> {
        match self.inner {
            AppendInner::Ready(r) => r.expect("invariant: a ready Append is consumed once"),
            AppendInner::Pending(slot) => {
                let mut st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    if let Some(r) = st.result.take() {
                        return r;
                    }
                    st = slot.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// The error if [`crate::Wal::append`] refused the append itself (validation, a failed
    /// or closing log, a full queue): nothing of it was queued. `None` for an append the
    /// commit thread took, even one it has already failed, so that the answer does not
    /// depend on how far the commit thread got.
    pub fn refused_at_once(&mut self) -> Option<WalError> {
        match &mut self.inner {
            AppendInner::Ready(r) => match r.take() {
                Some(Err(e)) => Some(e),
                other => {
                    *r = other;
                    None
                }
            },
            AppendInner::Pending(_) => None,
        }
    }

    /// The result if the append has resolved, without blocking.
    pub fn try_result(&mut self) -> Option<Result<Offset, WalError>> {
        match &mut self.inner {
            AppendInner::Ready(r) => r.take(),
            AppendInner::Pending(slot) => {
                let mut st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
                st.result.take()
            }
        }
    }
}

impl Future for Append {
    type Output = Result<Offset, WalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.inner {
            AppendInner::Ready(r) => Poll::Ready(r.take().expect("Append polled after completion")),
            AppendInner::Pending(slot) => {
                let mut st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(r) = st.result.take() {
                    return Poll::Ready(r);
                }
                match &st.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => st.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}
