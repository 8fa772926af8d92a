//! limits: the limits of one request, its own and its pools', and which store call they take.

use super::{Limit, MAX_LIMITS};

/// The kinds of a request's limits, as a store decides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape<'a> {
    /// Sliding windows and calendar periods only (or none): one [`WindowSet`].
    Sliding,
    /// One fixed or aligned window.
    Fixed(&'a Limit),
    /// Fixed windows with others, or several fixed ones: no store decides these yet (no door
    /// asks them).
    Mixed,
}

impl<'a> Shape<'a> {
    pub fn of(limits: &'a [Limit]) -> Shape<'a> {
        match limits {
            _ if limits.iter().all(|l| l.in_window_set()) => Shape::Sliding,
            [l] => Shape::Fixed(l),
            _ => Shape::Mixed,
        }
    }
}

/// The limits of one request: borrowed from the catalog, or a copy when a config switch turns them
/// all to shadow or pools apply (rare, so the common request path copies nothing). Its own
/// limits come first, then each pool's ([`Limits::pools`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits<'a> {
    all: std::borrow::Cow<'a, [Limit]>,
    /// Each pool's name and number of limits, in order after the request's own. Empty (no
    /// allocation) without pools.
    pools: Box<[(&'a str, usize)]>,
}

impl<'a> Limits<'a> {
    /// The first [`MAX_LIMITS`] of `limits`; all of them shadow limits if `all_shadow`.
    pub fn new(limits: &'a [Limit], all_shadow: bool) -> Limits<'a> {
        let limits = &limits[..limits.len().min(MAX_LIMITS)];
        let all = if all_shadow && limits.iter().any(|l| !l.shadow) {
            std::borrow::Cow::Owned(limits.iter().map(|l| l.shadowed(true)).collect())
        } else {
            std::borrow::Cow::Borrowed(limits)
        };
        Limits {
            all,
            pools: Box::default(),
        }
    }

    /// `own` and each pool's limits (its group's name, its limits), at most [`MAX_LIMITS`] in
    /// all; all of them shadow limits if `all_shadow`.
    pub fn pooled(
        own: &'a [Limit],
        pools: impl IntoIterator<Item = (&'a str, &'a [Limit])>,
        all_shadow: bool,
    ) -> Limits<'a> {
        let mut all: Vec<Limit> = own.iter().take(MAX_LIMITS).copied().collect();
        let mut named = Vec::new();
        for (name, limits) in pools {
            let n = limits.len().min(MAX_LIMITS - all.len());
            if n > 0 {
                all.extend_from_slice(&limits[..n]);
                named.push((name, n));
            }
        }
        if all_shadow {
            for l in &mut all {
                *l = l.shadowed(true);
            }
        }
        Limits {
            all: std::borrow::Cow::Owned(all),
            pools: named.into(),
        }
    }

    /// Some limits count in pools.
    pub fn has_pools(&self) -> bool {
        !self.pools.is_empty()
    }

    /// The request's own limits (the first ones).
    pub fn own(&self) -> &[Limit] {
        let pooled: usize = self.pools.iter().map(|(_, n)| n).sum();
        &self.all[..self.all.len() - pooled]
    }

    /// Each pool's name and limits, in order.
    pub fn pools(&self) -> impl Iterator<Item = (&'a str, &[Limit])> {
        let mut at = self.own().len();
        self.pools.iter().map(move |&(name, n)| {
            let limits = &self.all[at..at + n];
            at += n;
            (name, limits)
        })
    }

    /// The pool limit `i` counts in (`None`: the request's own counter).
    pub fn pool_of(&self, i: usize) -> Option<&'a str> {
        let mut at = self.own().len();
        for &(name, n) in self.pools.iter() {
            if (at..at + n).contains(&i) {
                return Some(name);
            }
            at += n;
        }
        None
    }
}

impl std::ops::Deref for Limits<'_> {
    type Target = [Limit];

    fn deref(&self) -> &[Limit] {
        &self.all
    }
}
