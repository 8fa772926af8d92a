//! A thread's shelf: things a connection or an answer used, kept for the next one on the same
//! worker thread instead of freed and allocated again (still in cache when taken, and no
//! allocator work). Bounded, last kept on top. Used for the request lines of `http1`, the
//! answers' rooms of `server::h1`, and the blocks requests' states are written in ([`Kept`]).

use std::alloc::Layout;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};
use std::thread::LocalKey;

/// Things kept on one thread, at most `max` of them.
pub struct Shelf<T> {
    items: RefCell<Vec<T>>,
    max: usize,
}

impl<T> Shelf<T> {
    /// An empty shelf that keeps at most `max` things (for a `thread_local!`).
    pub const fn new(max: usize) -> Shelf<T> {
        Shelf {
            items: RefCell::new(Vec::new()),
            max,
        }
    }

    /// The last thing kept (on a shelf that is one of several in a thread local, which one
    /// access reaches).
    pub fn pop(&self) -> Option<T> {
        self.items.borrow_mut().pop()
    }

    /// Keeps `item` unless the shelf holds its most already: then `item` is dropped (after the
    /// shelf is let go: its drop may keep something on another shelf).
    pub fn put(&self, item: T) {
        let mut items = self.items.borrow_mut();
        if items.len() < self.max {
            items.push(item);
        } else {
            drop(items);
            drop(item);
        }
    }

    /// What `pick` takes from `shelf`'s things on this thread (`pop` for the last kept). `None`
    /// while the thread exits (its storage may be gone).
    pub fn take_with(
        shelf: &'static LocalKey<Shelf<T>>,
        pick: impl FnOnce(&mut Vec<T>) -> Option<T>,
    ) -> Option<T> {
        shelf
            .try_with(|s| pick(&mut s.items.borrow_mut()))
            .ok()
            .flatten()
    }

    /// The last thing kept on `shelf` on this thread.
    pub fn take(shelf: &'static LocalKey<Shelf<T>>) -> Option<T> {
        Self::take_with(shelf, Vec::pop)
    }

    /// Keeps `item` on `shelf` unless it holds its most already (or the thread exits): then
    /// `item` is dropped.
    pub fn keep(shelf: &'static LocalKey<Shelf<T>>, item: T) {
        let _ = shelf.try_with(|s| s.put(item));
    }

    /// How many things `shelf` holds on this thread.
    pub fn len(shelf: &'static LocalKey<Shelf<T>>) -> usize {
        shelf.try_with(|s| s.items.borrow().len()).unwrap_or(0)
    }
}

/// A future in a block of memory the worker keeps: when it ends (or is dropped), its block goes
/// to the worker's shelf, and the next future of the same layout on this thread is written into
/// it. A request's state is kilobytes (`h1::serve` keeps it apart from the connection's, so that
/// an idle connection holds none): allocated and freed for each request, the block cost ~190
/// instructions a request (callgrind: mimalloc's path for blocks above 1 KiB, and a page given
/// back whenever its one block was freed).
pub struct Kept<F> {
    /// A block of `Layout::new::<F>()` holding an `F` that never moves until dropped in place.
    at: NonNull<F>,
}

/// A block of memory for [`Kept`], freed if dropped.
struct Block {
    at: NonNull<u8>,
    layout: Layout,
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `at` was allocated with `layout` by the global allocator ([`Kept::new`]) and
        // is owned by this block alone.
        unsafe { std::alloc::dealloc(self.at.as_ptr(), self.layout) }
    }
}

/// Blocks a worker keeps at most: as many as its requests in flight at once (~3.5 KiB each, so
/// ~220 KiB a worker).
const BLOCKS_KEPT: usize = 64;

thread_local! {
    static BLOCKS: Shelf<Block> = const { Shelf::new(BLOCKS_KEPT) };
}

impl<F> Kept<F> {
    /// The future `make` returns, written into a kept block of its layout (the last kept, if it
    /// is of that layout) or a new one.
    #[inline]
    pub fn new(make: impl FnOnce() -> F) -> Kept<F> {
        let layout = Layout::new::<F>();
        let kept = Shelf::take_with(&BLOCKS, |blocks| match blocks.last() {
            Some(b) if b.layout == layout => blocks.pop(),
            _ => None,
        });
        let at = match kept {
            Some(block) => std::mem::ManuallyDrop::new(block).at.cast::<F>(),
            None if layout.size() == 0 => NonNull::dangling(),
            None => {
                // SAFETY: the layout's size is not zero.
                let at = unsafe { std::alloc::alloc(layout) };
                NonNull::new(at)
                    .unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
                    .cast()
            }
        };
        // SAFETY: `at` is a block of `F`'s layout that nothing else holds.
        unsafe { at.as_ptr().write(make()) };
        Kept { at }
    }
}

impl<F: Future> Future for Kept<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the `F` stays where it was written until `drop` drops it in place: nothing
        // moves it or hands out more than this pinned reference.
        unsafe { Pin::new_unchecked(&mut *self.at.as_ptr()) }.poll(cx)
    }
}

impl<F> Drop for Kept<F> {
    fn drop(&mut self) {
        let layout = Layout::new::<F>();
        // SAFETY: the `F` written in `new`, dropped once, where it lies.
        unsafe { std::ptr::drop_in_place(self.at.as_ptr()) };
        if layout.size() > 0 {
            Shelf::keep(
                &BLOCKS,
                Block {
                    at: self.at.cast(),
                    layout,
                },
            );
        }
    }
}

// SAFETY: a `Kept<F>` owns its `F` as a `Box<F>` would.
unsafe impl<F: Send> Send for Kept<F> {}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static TWO: Shelf<u32> = const { Shelf::new(2) };
    }

    #[test]
    fn a_shelf_gives_the_last_kept_first_and_keeps_no_more_than_its_most() {
        std::thread::spawn(|| {
            assert_eq!(Shelf::take(&TWO), None);
            Shelf::keep(&TWO, 1);
            Shelf::keep(&TWO, 2);
            Shelf::keep(&TWO, 3);
            assert_eq!(Shelf::len(&TWO), 2);
            assert_eq!(Shelf::take(&TWO), Some(2));
            assert_eq!(Shelf::take_with(&TWO, |v| v.first().copied()), Some(1));
            assert_eq!(Shelf::take(&TWO), Some(1));
            assert_eq!(Shelf::take(&TWO), None);
        })
        .join()
        .unwrap();
    }
    #[test]
    fn a_kept_future_runs_and_drops_once_and_its_block_serves_the_next_of_its_layout() {
        std::thread::spawn(|| {
            let dropped = std::rc::Rc::new(std::cell::Cell::new(0));
            struct Counted(std::rc::Rc<std::cell::Cell<u32>>, [u64; 64]);
            impl Drop for Counted {
                fn drop(&mut self) {
                    self.0.set(self.0.get() + 1);
                }
            }
            let run = |n: u64| {
                let counted = Counted(dropped.clone(), [n; 64]);
                let mut kept = Kept::new(|| async move { counted.1.iter().sum::<u64>() });
                let at = kept.at.as_ptr() as usize;
                let waker = std::task::Waker::noop();
                let got = Pin::new(&mut kept).poll(&mut Context::from_waker(waker));
                (got, at)
            };
            let (first, at) = run(1);
            assert_eq!(first, Poll::Ready(64));
            assert_eq!(dropped.get(), 1);
            let (second, again) = run(2);
            assert_eq!(second, Poll::Ready(128));
            assert_eq!(again, at, "the same block");
            // One never polled is dropped too.
            drop(Kept::new(|| {
                let c = Counted(dropped.clone(), [0; 64]);
                async move { drop(c) }
            }));
            assert_eq!(dropped.get(), 3);
        })
        .join()
        .unwrap();
    }
}
