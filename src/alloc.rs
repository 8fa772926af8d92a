//! alloc: the binary's allocator (mimalloc, [`Mimalloc`]) and how the process hands freed memory
//! back to the system.
//!
//! mimalloc keeps freed pages for reuse and returns them lazily, and only while the heap that
//! freed them is active: after a burst of 5000 keep-alive connections closed, resident memory
//! stayed at its peak (about 190 MB instead of 17 MB). Purging at once (`purge_delay` 0) gave it
//! back, but under load it cost about 7% of the gateway's CPU (`perf`): an `madvise` every ~100
//! requests, each a TLB shootdown on every core, and page faults when the pages were used again
//! a moment later. So freed memory is purged after [`PURGE_DELAY_MS`], and each worker collects
//! every [`COLLECT_EVERY`], so that memory freed just before the gateway goes idle is still
//! returned.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::time::Duration;

use libmimalloc_sys as mi;

/// mimalloc as the global allocator (`main.rs`), asked for alignment only where a type needs more
/// than every block has.
///
/// The `mimalloc` crate's allocator passes every allocation to `mi_malloc_aligned`, whose fast
/// path covers blocks of at most 1 KiB: anything larger (hyper's 8 KiB buffers, a connection's
/// state, a task) took the aligned slow path, about 185 instructions an allocation (callgrind),
/// about a dozen times per new connection. Every mimalloc block is aligned to 8 bytes (its sizes
/// are whole words), so an alignment up to 8 needs no asking.
pub struct Mimalloc;

/// The alignment every block from `mi_malloc` has.
const WORD: usize = std::mem::size_of::<usize>();

// SAFETY: each method hands its layout to the mimalloc call that honours it (size, and alignment
// beyond `WORD`); mimalloc's blocks are freed by `mi_free` whichever call made them.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain C allocation calls; a null return is passed on as failure.
        unsafe {
            match layout.align() <= WORD {
                true => mi::mi_malloc(layout.size()),
                false => mi::mi_malloc_aligned(layout.size(), layout.align()),
            }
            .cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            match layout.align() <= WORD {
                true => mi::mi_zalloc(layout.size()),
                false => mi::mi_zalloc_aligned(layout.size(), layout.align()),
            }
            .cast()
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract).
        unsafe {
            match layout.align() <= WORD {
                true => mi::mi_realloc(ptr.cast::<c_void>(), new_size),
                false => mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()),
            }
            .cast()
        }
    }
}

/// How long freed memory is kept for reuse before it goes back to the system. Default: 50 ms.
/// (50 and 250 ms measured the same CPU per request; 0 costs 8-10% more. Any delay above 0 costs
/// about 2-3 KiB more resident memory per idle keep-alive connection after a burst of 5000:
/// 39.6 -> 42.0 KiB; `MIMALLOC_PURGE_DELAY=0` in the environment chooses that trade back.)
pub const PURGE_DELAY_MS: i64 = 50;

/// How often each worker asks the allocator to purge what has waited long enough. Default: 1 s.
pub const COLLECT_EVERY: Duration = Duration::from_secs(1);

/// Sets the allocator's options: call first thing in `main`, before anything allocates much.
pub fn configure() {
    // Option numbers of mimalloc 2 and 3 (`mi_option_e` in mimalloc.h); the Rust binding names
    // only some of them.
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: mi_option_set only stores an integer option; both are documented as settable at
    // any time.
    unsafe {
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
        // mimalloc's own MIMALLOC_PURGE_DELAY (milliseconds) still wins, for whoever needs to
        // trade differently (0: less resident memory, more CPU under load).
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS as std::ffi::c_long);
        }
    }
}

/// Purges the freed memory of the calling thread (and of the shared arenas) whose delay has
/// passed. Cheap when there is nothing to do. (Without mimalloc as the global allocator, as in
/// the tests, it only tidies mimalloc's own unused heap.)
pub fn collect() {
    // SAFETY: mi_collect may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) }
}

/// Returns to the system at once what the calling thread has freed: after a catalog was parsed
/// and built (hundreds of megabytes for a million keys, freed on a thread that may then idle and
/// never collect). Costs a scan of the thread's heap: not for the request path.
pub fn release() {
    // SAFETY: as for `collect`.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
