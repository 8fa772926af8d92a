//! deadline: timeouts whose timers a worker reuses from one request to the next.
//!
//! `tokio::time::timeout` makes a timer per call: it finds the runtime (a thread-local and a
//! reference count), inserts the timer into the timer wheel at its first wait and takes it out
//! when dropped, each under the wheel's lock. The upstream's response timeout did that for every
//! proxied request. Here a worker keeps the timers of finished timeouts, and the next timeout
//! waits on one of them as it is: set to an earlier request's deadline, it fires early, and only
//! then is it moved on to this timeout's deadline (once per timeout's length per timer, not once
//! per request). A kept timer set later than the new deadline (a shorter timeout) is set at once.
//! The answers are tokio's: done, or elapsed at the deadline. Callgrind: 346 instructions less a
//! proxied request (docs/benchmarks/).
//!
//! Only the workers reuse ([`reuse_on_this_thread`]): a timer belongs to the runtime it was made
//! on, and a worker's thread runs one runtime for its whole life. Anywhere else, [`timeout`] is
//! `tokio::time::timeout`.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Timers a worker keeps at most: as many as its requests waiting on their upstreams at once
/// under steady load; beyond it a finished timer is dropped (taken out of the wheel).
///
/// A kept timer still holds the waker of the last task that waited on it, until it is reused
/// or fires (within the response timeout): a waker keeps its task's header alive (a connection's
/// task holds its future boxed: about 200 bytes; an HTTP/2 stream's task its handler's future,
/// about 4 kB), and a timer that fires wakes that task once for nothing. So at most 256 of them
/// a worker, about 1 MB at worst, for at most the response timeout. Clearing the waker when a
/// timer is kept (waiting once with a no-op waker) cost ~120 of the ~350 instructions saved.
const KEPT: usize = 256;

thread_local! {
    /// `None` where timers are not reused.
    static KEPT_TIMERS: RefCell<Option<Vec<Pin<Box<Sleep>>>>> = const { RefCell::new(None) };
}

/// From now on, timeouts on this thread reuse their timers. For a thread that runs a single
/// runtime until [`stop_reusing_on_this_thread`].
pub fn reuse_on_this_thread() {
    KEPT_TIMERS.with(|k| *k.borrow_mut() = Some(Vec::new()));
}

/// Drops the kept timers; to be called on the runtime, before it is dropped.
pub fn stop_reusing_on_this_thread() {
    let kept = KEPT_TIMERS.with(|k| k.borrow_mut().take());
    drop(kept);
}

/// The time ran out before the future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed(());

/// Runs `fut` for at most `after` (counted from now).
///
/// A plain function returning the future, not an `async fn`: that would hold `fut` twice in its
/// own future and copy it from one to the other (rust-lang/rust#62958), and a request's exchange
/// with its upstream is a large future.
pub fn timeout<F: Future>(after: Duration, fut: F) -> Timeout<F> {
    Timeout {
        fut,
        deadline: Instant::now() + after,
        timer: None,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`timeout`].
    pub struct Timeout<F> {
        #[pin]
        fut: F,
        deadline: Instant,
        // Taken at the first wait.
        timer: Option<Timer>,
    }
}

/// A kept timer in use, given back to the worker's kept timers when dropped (the timeout
/// finished, or its future was dropped); or, where timers are not reused, one of its own.
struct Timer {
    /// `None` only once given back.
    sleep: Option<Pin<Box<Sleep>>>,
    kept: bool,
}

impl Timer {
    /// A kept timer set to `deadline`, or a new one.
    fn take(deadline: Instant) -> Timer {
        let kept = KEPT_TIMERS.with(|k| {
            let mut kept = k.borrow_mut();
            let kept = kept.as_mut()?;
            // A kept timer set earlier than `deadline` (the common case: an earlier request's)
            // is left as it is, and moved on when it fires ([`Timeout::poll`]); a later one
            // would fire late, so it is set now.
            Some(kept.pop().map(|mut sleep| {
                if sleep.deadline() > deadline {
                    sleep.as_mut().reset(deadline);
                }
                sleep
            }))
        });
        match kept {
            Some(Some(sleep)) => Timer {
                sleep: Some(sleep),
                kept: true,
            },
            Some(None) => Timer {
                sleep: Some(Box::pin(tokio::time::sleep_until(deadline))),
                kept: true,
            },
            None => Timer {
                sleep: Some(Box::pin(tokio::time::sleep_until(deadline))),
                kept: false,
            },
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let Some(sleep) = self.sleep.take().filter(|_| self.kept) else {
            return;
        };
        // Outside the thread's life (its locals being torn down) the timer is just dropped.
        let _ = KEPT_TIMERS.try_with(|k| {
            let Ok(mut kept) = k.try_borrow_mut() else {
                return;
            };
            let Some(kept) = kept.as_mut().filter(|k| k.len() < KEPT) else {
                return;
            };
            kept.push(sleep);
        });
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let had_budget = tokio::task::coop::has_budget_remaining();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        let deadline = *this.deadline;
        let timer = this.timer.get_or_insert_with(|| Timer::take(deadline));
        let Some(timer) = timer.sleep.as_mut() else {
            return Poll::Pending;
        };
        // As tokio's own timeout: when the future used up the task's budget, the timer is still
        // looked at, or a future that always does would never time out.
        let unbudgeted = had_budget && !tokio::task::coop::has_budget_remaining();
        loop {
            let fired = if unbudgeted {
                let mut timer = std::pin::pin!(tokio::task::coop::unconstrained(timer.as_mut()));
                timer.as_mut().poll(cx)
            } else {
                timer.as_mut().poll(cx)
            };
            if fired.is_pending() {
                return Poll::Pending;
            }
            // A kept timer fires at its earlier deadline: it is moved on to this one's.
            if timer.deadline() >= deadline || Instant::now() >= deadline {
                return Poll::Ready(Err(Elapsed(())));
            }
            timer.as_mut().reset(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept() -> usize {
        KEPT_TIMERS.with(|k| k.borrow().as_ref().map_or(0, Vec::len))
    }

    /// A timeout of `after` on a future that never finishes ends at its deadline (the paused
    /// clock moves to it; a millisecond of the timer wheel's rounding allowed).
    async fn times_out_after(after: Duration) {
        let start = Instant::now();
        let r = timeout(after, std::future::pending::<()>()).await;
        let waited = start.elapsed();
        assert_eq!(r, Err(Elapsed(())));
        assert!(
            waited >= after && waited <= after + Duration::from_millis(1),
            "{waited:?} for {after:?}"
        );
    }

    /// One timer serves timeouts one after another, each with its own deadline, whether it
    /// finished, timed out, or its future was dropped; nothing is kept where reuse is off, and
    /// a timeout off the workers still times out.
    #[tokio::test(start_paused = true)]
    async fn a_kept_timer_times_out_at_each_new_deadline() {
        reuse_on_this_thread();
        assert_eq!(timeout(Duration::from_secs(30), async { 7 }).await, Ok(7));
        assert_eq!(kept(), 0, "a future done at once needs no timer");
        for _ in 0..3 {
            let waits = tokio::time::sleep(Duration::from_millis(10));
            assert_eq!(timeout(Duration::from_secs(30), waits).await, Ok(()));
        }
        assert_eq!(kept(), 1, "one timer, reused");
        // A deadline earlier than the kept timer's still counts.
        times_out_after(Duration::from_millis(200)).await;
        // And a later one, after the timer fired.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            1
        };
        assert_eq!(timeout(Duration::from_secs(3), slow).await, Ok(1));
        times_out_after(Duration::from_secs(1)).await;
        // A kept timer set earlier than the next deadline is moved on when it fires.
        let waits = tokio::time::sleep(Duration::from_millis(10));
        assert_eq!(timeout(Duration::from_secs(1), waits).await, Ok(()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        times_out_after(Duration::from_secs(1)).await;
        // Two at once take two timers.
        let (a, b) = tokio::join!(
            timeout(
                Duration::from_millis(50),
                tokio::time::sleep(Duration::from_millis(10))
            ),
            timeout(
                Duration::from_millis(50),
                tokio::time::sleep(Duration::from_secs(1))
            ),
        );
        assert_eq!((a, b), (Ok(()), Err(Elapsed(()))));
        assert_eq!(kept(), 2);
        // A timeout dropped while it waits gives its timer back, and the timer still works.
        {
            let waiting = timeout(Duration::from_secs(1), std::future::pending::<()>());
            let mut waiting = std::pin::pin!(waiting);
            std::future::poll_fn(|cx| {
                assert!(waiting.as_mut().poll(cx).is_pending());
                Poll::Ready(())
            })
            .await;
            assert_eq!(kept(), 1);
        }
        assert_eq!(kept(), 2);
        times_out_after(Duration::from_millis(300)).await;
        stop_reusing_on_this_thread();
        assert_eq!(kept(), 0);
        let r = timeout(Duration::from_secs(1), std::future::pending::<()>()).await;
        assert_eq!(r, Err(Elapsed(())));
        let waits = tokio::time::sleep(Duration::from_millis(10));
        assert_eq!(timeout(Duration::from_secs(1), waits).await, Ok(()));
        assert_eq!(kept(), 0, "not kept where reuse is off");
    }
}
