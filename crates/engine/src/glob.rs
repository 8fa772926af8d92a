//! glob: `*`-only patterns, anchored at both ends, every `*` matching any run of characters.
//! Shared by Divvy's rule values and envoyproxy/ratelimit's wildcard values, which mean the same.
//!
//! Hand-written on purpose: no glob crate offers `*` alone without also accepting `?`, `[...]` or
//! escapes that would change what existing rule files mean.

/// Does `value` match the pattern whose pieces between the stars are `parts` (at least two: a
/// pattern with one star splits in two)?
pub fn matches(parts: &[String], value: &str) -> bool {
    let (first, last) = (&parts[0], &parts[parts.len() - 1]);
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle.as_str()) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::matches;

    fn m(pattern: &str, value: &str) -> bool {
        let parts: Vec<String> = pattern.split('*').map(str::to_owned).collect();
        matches(&parts, value)
    }

    #[test]
    fn stars_match_runs_anchored_at_both_ends() {
        assert!(m("/api/*", "/api/"));
        assert!(m("/api/*", "/api/v1/x"));
        assert!(!m("/api/*", "/apx/v1"));
        assert!(m("a*b*c", "abc"));
        assert!(m("a*b*c", "a-b-b-c"));
        assert!(!m("a*b*c", "acb"));
        assert!(!m("ab*ba", "aba"), "the ends may not overlap");
        assert!(m("*", ""));
    }
}
