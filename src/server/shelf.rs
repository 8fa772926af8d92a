//! A thread's shelf: things a connection or an answer used, kept for the next one on the same
//! worker thread instead of freed and allocated again (still in cache when taken, and no
//! allocator work). Bounded, last kept on top. Used for the request lines of `http1` and the
//! answers' rooms of `server::h1`.

use std::cell::RefCell;
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
        let _ = shelf.try_with(|s| {
            let mut items = s.items.borrow_mut();
            if items.len() < s.max {
                items.push(item);
            }
        });
    }

    /// How many things `shelf` holds on this thread.
    pub fn len(shelf: &'static LocalKey<Shelf<T>>) -> usize {
        shelf.try_with(|s| s.items.borrow().len()).unwrap_or(0)
    }
}

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
}
