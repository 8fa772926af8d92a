//! path: the one spelling of a request path that quotagate matches, counts and forwards.
//!
//! Hand-written on purpose: this decoder is a security rule (what a client may spell differently
//! without reaching another counter), so its every choice is ours and tested here, not a URL
//! library's.
//!
//! A client must not reach a limited endpoint while dodging its counter by spelling the path another
//! way, so every request path is reduced to a normal form before routing (rules in
//! `docs/routing.md`):
//!
//! 1. Percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded; every other escape
//!    is kept, with upper-case hex digits. Invalid escapes and `%00` are refused.
//! 2. An encoded `/` or `\` (`%2F`, `%5C`) or a raw `\` is refused by default, because upstreams
//!    disagree on whether it separates segments; it can be configured to pass as data.
//! 3. Empty segments (`//`) are dropped and dot segments (`.`, `..`, also as `%2E`) are resolved.
//! 4. For matching only, ASCII letters are compared case-insensitively and a trailing slash is
//!    ignored. The request is then forwarded with the endpoint's canonical spelling (see
//!    `router`), so the upstream receives exactly the endpoint that was counted.
//!
//! Pure: no I/O; unit tests below.

use std::fmt::Write;

/// What to do with `%2F`, `%5C` and raw `\` in a request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EscapedSlashes {
    /// Answer 400. Default: the safe choice when the upstream's interpretation is unknown.
    #[default]
    Reject,
    /// Keep them as data inside one segment (`%2F` never splits a segment).
    Keep,
}

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with '/'")]
    NotAbsolute,
    #[error("the path has an invalid percent-escape")]
    BadEscape,
    #[error("the path has an encoded slash or a backslash")]
    EscapedSlash,
    #[error("the path has an encoded NUL byte")]
    Nul,
}

/// A normalised path: its segments (escapes normalised, dot segments resolved) and whether it ended
/// with a slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalPath {
    pub segments: Vec<String>,
    pub trailing_slash: bool,
}

impl NormalPath {
    /// The path to forward when no template applies.
    pub fn to_path(&self) -> String {
        let mut out =
            String::with_capacity(self.segments.iter().map(|s| s.len() + 1).sum::<usize>() + 1);
        for s in &self.segments {
            out.push('/');
            out.push_str(s);
        }
        if out.is_empty() || self.trailing_slash {
            out.push('/');
        }
        out
    }

    /// The key the router matches: lower-case ASCII, no trailing slash.
    pub fn match_key(&self) -> String {
        let mut out =
            String::with_capacity(self.segments.iter().map(|s| s.len() + 1).sum::<usize>() + 1);
        for s in &self.segments {
            out.push('/');
            out.extend(s.chars().map(|c| c.to_ascii_lowercase()));
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Normalises the escapes of one segment (rules 1 and 2).
pub fn normalize_segment(seg: &str, slashes: EscapedSlashes) -> Result<String, PathError> {
    if !seg.contains('%') && !seg.contains('\\') {
        return Ok(seg.to_owned());
    }
    let bytes = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2)) else {
                    return Err(PathError::BadEscape);
                };
                let (Some(h), Some(l)) = (hex_val(h), hex_val(l)) else {
                    return Err(PathError::BadEscape);
                };
                let b = h << 4 | l;
                match b {
                    0 => return Err(PathError::Nul),
                    b'/' | b'\\' if slashes == EscapedSlashes::Reject => {
                        return Err(PathError::EscapedSlash);
                    }
                    b if is_unreserved(b) => out.push(b as char),
                    b => {
                        let _ = write!(out, "%{b:02X}");
                    }
                }
                i += 3;
            }
            b'\\' if slashes == EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
            _ => {
                // Copy the whole run up to the next '%' or '\' (keeps multi-byte UTF-8 intact).
                let end = bytes[i..]
                    .iter()
                    .position(|&b| b == b'%' || b == b'\\')
                    .map_or(bytes.len(), |p| i + p.max(1));
                out.push_str(&seg[i..end]);
                i = end;
            }
        }
    }
    Ok(out)
}

/// Normalises a request path (no query string).
pub fn normalize(raw: &str, slashes: EscapedSlashes) -> Result<NormalPath, PathError> {
    let Some(rest) = raw.strip_prefix('/') else {
        return Err(PathError::NotAbsolute);
    };
    let mut segments: Vec<String> = Vec::new();
    let mut trailing_slash = false;
    for raw_seg in rest.split('/') {
        let seg = normalize_segment(raw_seg, slashes)?;
        trailing_slash = matches!(seg.as_str(), "" | "." | "..");
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(seg),
        }
    }
    Ok(NormalPath {
        trailing_slash: trailing_slash && !segments.is_empty(),
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> String {
        normalize(p, EscapedSlashes::Reject).unwrap().match_key()
    }

    fn fwd(p: &str) -> String {
        normalize(p, EscapedSlashes::Reject).unwrap().to_path()
    }

    #[test]
    fn plain_paths_are_unchanged() {
        assert_eq!(fwd("/users/42/prefs"), "/users/42/prefs");
        assert_eq!(fwd("/"), "/");
        assert_eq!(key("/"), "/");
    }

    #[test]
    fn unreserved_escapes_are_decoded_others_upper_cased() {
        assert_eq!(fwd("/%75sers/4%32"), "/users/42");
        assert_eq!(fwd("/a%2e%2E/b"), "/a../b");
        assert_eq!(fwd("/a%3ab/c%c3%a9"), "/a%3Ab/c%C3%A9");
        assert_eq!(fwd("/caf%C3%A9/%7e"), "/caf%C3%A9/~");
    }

    #[test]
    fn empty_and_dot_segments_are_resolved() {
        assert_eq!(key("//users///42//prefs"), "/users/42/prefs");
        assert_eq!(key("/users/./42/prefs"), "/users/42/prefs");
        assert_eq!(key("/users/x/../42/prefs"), "/users/42/prefs");
        assert_eq!(key("/users/%2e/42/%2E%2E/42/prefs"), "/users/42/prefs");
        assert_eq!(key("/../../users/42/prefs"), "/users/42/prefs");
        assert_eq!(key("/users/42/prefs/.."), "/users/42");
    }

    #[test]
    fn matching_ignores_case_and_trailing_slash_forwarding_keeps_them() {
        assert_eq!(key("/USERS/42/Prefs/"), "/users/42/prefs");
        assert_eq!(fwd("/USERS/42/Prefs/"), "/USERS/42/Prefs/");
        assert_eq!(fwd("/a/b/."), "/a/b/");
    }

    #[test]
    fn bad_escapes_and_nul_are_refused() {
        for p in ["/a%", "/a%4", "/a%zz", "/%g0"] {
            assert_eq!(
                normalize(p, EscapedSlashes::Keep),
                Err(PathError::BadEscape),
                "{p}"
            );
        }
        assert_eq!(
            normalize("/a%00b", EscapedSlashes::Keep),
            Err(PathError::Nul)
        );
        assert_eq!(
            normalize("a/b", EscapedSlashes::Keep),
            Err(PathError::NotAbsolute)
        );
    }

    #[test]
    fn encoded_slashes_are_refused_or_kept_as_data() {
        for p in [
            "/users/1%2F2",
            "/users/1%2f2",
            "/users/1%5C2",
            "/users/1\\2",
        ] {
            assert_eq!(
                normalize(p, EscapedSlashes::Reject),
                Err(PathError::EscapedSlash),
                "{p}"
            );
        }
        let kept = normalize("/users/1%2f2/prefs", EscapedSlashes::Keep).unwrap();
        assert_eq!(kept.segments, vec!["users", "1%2F2", "prefs"]);
    }

    #[test]
    fn non_ascii_survives() {
        assert_eq!(fwd("/caf\u{e9}/x"), "/caf\u{e9}/x");
    }
}
