//! cold: keeping the code of paths few requests take apart from the common path's.
//!
//! A request runs through ~90 KiB of code, more than a core's instruction cache holds
//! (docs/benchmarks/), so code that sits among the common path's without running costs it
//! cache lines. A rare path's future boxed as itself (`Box::pin(f)`) moves only its state out of
//! the caller's: the compiler still inlines its code into the caller's `poll`, since its type is
//! known there. Behind a trait object made out of line, neither is the caller's.

use std::future::Future;
use std::pin::Pin;

/// A boxed future of any type, polled through its vtable.
pub type Apart<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The future `make` returns, built in its box (not on the stack and copied) and behind a trait
/// object, by a function that is never inlined: its caller's code holds none of the future's.
#[inline(never)]
pub fn apart<'a, F>(make: impl FnOnce() -> F) -> Apart<'a, F::Output>
where
    F: Future + Send + 'a,
{
    boxed(make)
}

/// The future `make` returns, built in its box: `Box::pin(make())` builds it on the stack and
/// copies it, and a connection's future is kilobytes (callgrind: ~460 instructions of `memcpy` a
/// connection). Allocated first, the box is where the future is written.
#[inline(always)]
pub fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_future_kept_apart_still_gives_its_output() {
        let n = 41;
        assert_eq!(super::apart(|| async move { n + 1 }).await, 42);
    }
}
