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

use std::borrow::Cow;
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
pub struct NormalPath<'a> {
    /// Each segment after a `/` (`/users/42`; empty for the root): one string, not one per
    /// segment (this runs for every request). A segment never holds a `/` (an escaped one stays
    /// escaped), so splitting at each `/` gives the segments back. Borrowed when the path was
    /// normal as it came, as most are: it is then the path itself (less a trailing slash).
    joined: Cow<'a, str>,
    pub trailing_slash: bool,
}

impl NormalPath<'_> {
    /// The segments, in order.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        split_slashes(self.joined.get(1..))
    }

    /// The path to forward, in the string it was normalised into; `None` when it is the path
    /// [`normalize`] was given, as it was given (no copy of it: an allocation a request).
    pub fn into_path(self) -> Option<String> {
        let Cow::Owned(mut out) = self.joined else {
            return None;
        };
        if out.is_empty() || self.trailing_slash {
            out.push('/');
        }
        Some(out)
    }

    /// The path to forward when no template applies.
    pub fn to_path(&self) -> String {
        let mut out = String::with_capacity(self.joined.len() + 1);
        out.push_str(&self.joined);
        if out.is_empty() || self.trailing_slash {
            out.push('/');
        }
        out
    }

    /// The key the router matches: lower-case ASCII, no trailing slash; borrowed exactly when
    /// the path has no upper-case letter, as most have (the router counts on it).
    pub fn match_key(&self) -> Cow<'_, str> {
        if self.joined.is_empty() {
            Cow::Borrowed("/")
        } else if crate::ascii::has_upper(self.joined.as_bytes()) {
            Cow::Owned(self.joined.to_ascii_lowercase())
        } else {
            Cow::Borrowed(&self.joined)
        }
    }
}

/// The parts of `s` between its `/`s (none for `None`), found by byte: `str::split` with a
/// `char` pattern costs several times more on the short segments of a path.
fn split_slashes(s: Option<&str>) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        let r = rest?;
        match r.bytes().position(|b| b == b'/') {
            Some(i) => {
                rest = Some(&r[i + 1..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
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
pub fn normalize_segment(seg: &str, slashes: EscapedSlashes) -> Result<Cow<'_, str>, PathError> {
    if !seg.bytes().any(|b| b == b'%' || b == b'\\') {
        return Ok(Cow::Borrowed(seg));
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
    Ok(Cow::Owned(out))
}

/// Whether `rest` (a path after its first `/`) is normal already: no escape, no backslash, no
/// empty segment but the last (a trailing slash), no `.` or `..` segment.
fn is_plain(rest: &[u8]) -> bool {
    let dots = |seg: &[u8]| matches!(seg, b"." | b"..");
    let mut start = 0;
    for (i, &b) in rest.iter().enumerate() {
        match b {
            b'%' | b'\\' => return false,
            b'/' if i == start || dots(&rest[start..i]) => return false,
            b'/' => start = i + 1,
            _ => {}
        }
    }
    !dots(&rest[start..])
}

/// Normalises a request path (no query string).
pub fn normalize(raw: &str, slashes: EscapedSlashes) -> Result<NormalPath<'_>, PathError> {
    let Some(rest) = raw.strip_prefix('/') else {
        return Err(PathError::NotAbsolute);
    };
    if is_plain(rest.as_bytes()) {
        // Already normal, as most paths are: taken whole (a third of the instructions).
        let trailing_slash = raw.len() > 1 && raw.ends_with('/');
        let joined = raw.strip_suffix('/').unwrap_or(raw);
        return Ok(NormalPath {
            joined: Cow::Borrowed(joined),
            trailing_slash,
        });
    }
    let mut joined = String::with_capacity(raw.len());
    let mut trailing_slash = false;
    for raw_seg in split_slashes(Some(rest)) {
        let seg = normalize_segment(raw_seg, slashes)?;
        trailing_slash = matches!(&*seg, "" | "." | "..");
        match &*seg {
            "" | "." => {}
            ".." => {
                let last = joined.rfind('/').unwrap_or(0);
                joined.truncate(last);
            }
            _ => {
                joined.push('/');
                joined.push_str(&seg);
            }
        }
    }
    Ok(NormalPath {
        trailing_slash: trailing_slash && !joined.is_empty(),
        joined: Cow::Owned(joined),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> String {
        normalize(p, EscapedSlashes::Reject)
            .unwrap()
            .match_key()
            .into_owned()
    }

    fn fwd(p: &str) -> String {
        normalize(p, EscapedSlashes::Reject).unwrap().to_path()
    }

    /// The normaliser as first written (a list of segments), the model the one-string form is
    /// held to: segments, the forwarded path, the match key and every refusal.
    fn reference(raw: &str, slashes: EscapedSlashes) -> Result<(Vec<String>, bool), PathError> {
        let Some(rest) = raw.strip_prefix('/') else {
            return Err(PathError::NotAbsolute);
        };
        let mut segments: Vec<String> = Vec::new();
        let mut trailing_slash = false;
        for raw_seg in rest.split('/') {
            let seg = normalize_segment(raw_seg, slashes)?.into_owned();
            trailing_slash = matches!(seg.as_str(), "" | "." | "..");
            match seg.as_str() {
                "" | "." => {}
                ".." => {
                    segments.pop();
                }
                _ => segments.push(seg),
            }
        }
        Ok((segments.clone(), trailing_slash && !segments.is_empty()))
    }

    #[test]
    fn the_one_string_form_answers_as_a_list_of_segments_did() {
        let pieces = [
            "/", "/", "//", ".", "..", "%2e", "%2E%2e", "%2F", "%5c", "\\", "%41", "%7e", "A", "b",
            "Users", "42", "%", "%z1", "%00", "é", "%C3%A9", "{id}",
        ];
        // A tiny generator (xorshift): the same paths every run.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for _ in 0..20_000 {
            let mut raw = String::from(if next(10) == 0 { "" } else { "/" });
            for _ in 0..next(8) {
                raw.push_str(pieces[next(pieces.len())]);
            }
            for mode in [EscapedSlashes::Reject, EscapedSlashes::Keep] {
                let (got, want) = (normalize(&raw, mode), reference(&raw, mode));
                match (got, want) {
                    (Ok(p), Ok((segments, trailing))) => {
                        assert_eq!(p.segments().collect::<Vec<_>>(), segments, "{raw:?}");
                        assert_eq!(p.trailing_slash, trailing, "{raw:?}");
                        let mut path: String = segments.iter().map(|s| format!("/{s}")).collect();
                        let key = if path.is_empty() {
                            "/".to_owned()
                        } else {
                            path.to_ascii_lowercase()
                        };
                        if path.is_empty() || trailing {
                            path.push('/');
                        }
                        assert_eq!(p.to_path(), path, "{raw:?}");
                        assert_eq!(p.match_key(), key, "{raw:?}");
                    }
                    (Err(a), Err(b)) => assert_eq!(a, b, "{raw:?}"),
                    (got, want) => panic!("{raw:?}: {got:?} but {want:?}"),
                }
            }
        }
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
        assert_eq!(
            kept.segments().collect::<Vec<_>>(),
            ["users", "1%2F2", "prefs"]
        );
    }

    #[test]
    fn non_ascii_survives() {
        assert_eq!(fwd("/caf\u{e9}/x"), "/caf\u{e9}/x");
    }
}
