//! glob: how a rule value is compared with a request's value.
//!
//! Hand-written on purpose: Divvy's globs are `*`-only and anchored at both ends, which no glob
//! crate offers without also accepting `?`, `[...]` or escapes that would change what existing rule
//! files mean. Exactly `*` means "the key is present"; a value with `*` is a glob in which every
//! `*` matches any run of characters; anything else must be equal.

/// How a rule value is compared with the request's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pattern {
    /// `*`: the key must be present (any value, empty included).
    Present,
    /// Contains `*`: the parts between the stars, matched in order, anchored at both ends.
    Glob(Vec<String>),
    Exact(String),
}

impl Pattern {
    pub(super) fn new(text: &str) -> Pattern {
        if text == "*" {
            Pattern::Present
        } else if text.contains('*') {
            Pattern::Glob(text.split('*').map(str::to_owned).collect())
        } else {
            Pattern::Exact(text.to_owned())
        }
    }

    pub(super) fn matches(&self, value: Option<&str>) -> bool {
        match (self, value) {
            (_, None) => false,
            (Pattern::Present, Some(_)) => true,
            (Pattern::Exact(e), Some(v)) => e == v,
            (Pattern::Glob(parts), Some(v)) => quotagate_engine::glob::matches(parts, v),
        }
    }
}
