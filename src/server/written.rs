//! written: header fields as they go on the wire, and what a handler answers with them.

use http::Response;

/// What a handler answers: its response, and header fields it wrote out already ([`Written`]).
/// A `Response` is an answer with none.
pub trait Answer: Send + 'static {
    type Body;
    fn split(self) -> (Response<Self::Body>, Written);
}

impl<B: Send + 'static> Answer for Response<B> {
    type Body = B;
    fn split(self) -> (Response<B>, Written) {
        (self, Written::default())
    }
}

/// Header fields written as they go on the wire, `name: value\r\n` each (names in lower case),
/// sent after the response's own: the gateway's own HTTP/1.1 server copies them as they are,
/// where a header map would hash, allocate and copy each (the rate-limit fields cost the
/// memory store's path 13% that way; an upstream's answer's fields, passed on this way, 4% of
/// a proxied request: docs/benchmarks/). For hyper's servers they are set in the response's
/// map. The response's map must not hold their names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    lines: Vec<u8>,
    /// A `Date` is among the lines (the server then writes none of its own).
    dated: bool,
}

impl Written {
    /// Adds `name: value`; a value with a byte no field may hold (a control character) is left
    /// out, as a `HeaderValue` would refuse it.
    pub fn push(&mut self, name: &http::HeaderName, value: &[u8]) {
        self.push_with(name, |v| v.extend_from_slice(value));
    }

    /// Adds `name: ` and the value `write` appends, checked as [`Written::push`] checks one.
    pub fn push_with(&mut self, name: &http::HeaderName, write: impl FnOnce(&mut Vec<u8>)) {
        let line = self.start(name);
        let value = self.lines.len();
        write(&mut self.lines);
        if !field_value(&self.lines[value..]) {
            self.lines.truncate(line);
            return;
        }
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Adds a line that starts `start` (a field's name and `: `, as `"ratelimit: "`: best a
    /// constant, copied as one inline, where a name's bytes read from a `HeaderName` were a
    /// `memcpy` call a field) with the value `write` appends, which the caller makes of bytes a
    /// field may hold, so it is not checked again (debug builds do): the rate-limit lists, made of
    /// the catalog's names (printable ASCII, checked as it loads), digits and fixed ASCII. Their
    /// check was ~200 instructions a counted request (callgrind, docs/benchmarks/).
    #[inline(always)]
    pub fn push_valid_with(&mut self, start: &str, write: impl FnOnce(&mut Vec<u8>)) {
        self.start_named(start);
        let value = self.lines.len();
        write(&mut self.lines);
        debug_assert!(
            field_value(&self.lines[value..]),
            "{:?}",
            &self.lines[value..]
        );
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Adds `name: ` and `digits`, a number in decimal, which needs no check (the rate-limit
    /// fields' numbers: [`Written::push`]'s closure and check cost ~50 instructions a field,
    /// callgrind). `start` as [`Written::push_valid_with`]'s.
    #[inline(always)]
    pub fn push_digits(&mut self, start: &str, digits: &str) {
        debug_assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{digits:?}");
        self.start_named(start);
        self.lines.extend_from_slice(digits.as_bytes());
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Adds `line`, a field line of a peer's head as `httparse` read it (`name: value`, without
    /// its end of line; `date`: a `Date`), as it was written: its value holds no byte a field
    /// may not (`http1::append_lines`), nor does its name, and neither is checked again (a tab
    /// is among them, which [`Written::push`] refuses). The name keeps the peer's case.
    pub fn push_line(&mut self, line: &[u8], date: bool) {
        self.dated |= date;
        if self.lines.capacity() == 0 {
            self.lines.reserve(256);
        }
        self.lines.extend_from_slice(line);
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Starts a line: its name and `: `; where it starts.
    fn start(&mut self, name: &http::HeaderName) -> usize {
        let line = self.start_line(name.as_str().as_bytes());
        self.lines.extend_from_slice(b": ");
        line
    }

    /// Starts a line with `bytes`; where it starts.
    #[inline(always)]
    fn start_line(&mut self, bytes: &[u8]) -> usize {
        if self.lines.capacity() == 0 {
            // The usual answer's fields at once (they grew the lines four times).
            self.lines.reserve(256);
        }
        let line = self.lines.len();
        self.lines.extend_from_slice(bytes);
        line
    }

    /// Starts a line with `start`, a lower-case field name and `: ` (checked in debug builds).
    #[inline(always)]
    fn start_named(&mut self, start: &str) -> usize {
        debug_assert!(
            start.strip_suffix(": ").is_some_and(
                |n| http::HeaderName::from_bytes(n.as_bytes()).is_ok_and(|h| h.as_str() == n)
            ),
            "{start:?}"
        );
        self.start_line(start.as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.lines
    }

    /// A `Date` field is among the lines.
    pub fn dated(&self) -> bool {
        self.dated
    }

    /// Each line's name and value.
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines.split(|&b| b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            Some((&line[..colon], line[colon + 1..].trim_ascii()))
        })
    }

    /// The value of the first field named `name`, in any case. A line at a time (a name holds
    /// no `:`), not [`Written::fields`]: this runs on the answers whose cost they report.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let name = name.as_bytes();
        let mut rest = &self.lines[..];
        while !rest.is_empty() {
            let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
            let line = &rest[..end];
            // Exactly first: most peers write names in lower case, and a compare in any case
            // goes a byte at a time.
            let written = |n: &[u8]| n == name || n.eq_ignore_ascii_case(name);
            if line.get(name.len()) == Some(&b':') && written(&line[..name.len()]) {
                return Some(line[name.len() + 1..].trim_ascii());
            }
            rest = rest.get(end + 1..).unwrap_or_default();
        }
        None
    }

    /// Sets the fields in `headers`: the first of each name replaces what it held of that
    /// name, the others are added after it (an upstream's `Set-Cookie`s, each kept).
    pub fn set_in(&self, headers: &mut http::HeaderMap) {
        let mut set: Vec<http::HeaderName> = Vec::new();
        for (name, value) in self.fields() {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                match set.contains(&n) {
                    true => {
                        headers.append(n, v);
                    }
                    false => {
                        set.push(n.clone());
                        headers.insert(n, v);
                    }
                }
            }
        }
    }
}

/// Whether `v` may be a field's value as written here: no control character, DEL included (a
/// tab too, which `HeaderValue` would take: none is written here). Eight bytes at a time: this
/// runs on every counted request's fields.
fn field_value(v: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20, or equal to 0x7f, in `x` (exact as to whether there is one).
    let bad = |x: u64| {
        let del = x ^ (0x7f * ONES);
        ((x.wrapping_sub(0x20 * ONES) & !x) | (del.wrapping_sub(ONES) & !del)) & HIGH != 0
    };
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        if bad(u64::from_le_bytes(c.try_into().expect("8 bytes"))) {
            return false;
        }
    }
    let mut last = [b' '; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    !bad(u64::from_le_bytes(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_value_has_no_control_character_wherever_it_is() {
        for len in 1..=17 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert_eq!(
                        field_value(&v),
                        !(b < 0x20 || b == 0x7f),
                        "{b:#x} at {at} of {len}"
                    );
                }
            }
        }
        assert!(field_value(b""));
    }

    #[test]
    fn lines_read_from_a_peer_are_written_as_they_came_and_found_by_name() {
        let mut w = Written::default();
        w.push_line(b"Content-Type:application/json", false);
        w.push_line(b"set-cookie: a=1", false);
        w.push_line(b"Set-Cookie: b=2\t", false);
        assert!(!w.dated());
        w.push_line(b"date: x", true);
        assert!(w.dated());
        w.push(&http::HeaderName::from_static("ratelimit"), b"r");
        assert_eq!(
            w.as_bytes(),
            b"Content-Type:application/json\r\nset-cookie: a=1\r\nSet-Cookie: b=2\t\r\ndate: x\r\nratelimit: r\r\n"
        );
        assert_eq!(w.get("content-type"), Some(&b"application/json"[..]));
        assert_eq!(w.get("Set-Cookie"), Some(&b"a=1"[..]));
        assert_eq!(w.get("ratelimit"), Some(&b"r"[..]));
        assert_eq!(w.get("date"), Some(&b"x"[..]));
        assert_eq!((w.get("set"), w.get("content-type:")), (None, None));
        // In a map, each field of a name kept, in order.
        let mut map = http::HeaderMap::new();
        w.set_in(&mut map);
        let cookies: Vec<_> = map.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(map.len(), 5);
    }

    #[test]
    fn written_fields_are_lines_and_set_in_a_map_as_they_were() {
        let mut w = Written::default();
        w.push_digits("retry-after: ", "13");
        w.push(
            &http::HeaderName::from_static("ratelimit"),
            br#""GET /a";r=0;t=13"#,
        );
        w.push(
            &http::HeaderName::from_static("x-bad"),
            b"a\r\nx-injected: 1",
        );
        assert_eq!(
            w.as_bytes(),
            b"retry-after: 13\r\nratelimit: \"GET /a\";r=0;t=13\r\n"
        );
        let mut map = http::HeaderMap::new();
        map.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("5"),
        );
        w.set_in(&mut map);
        assert_eq!(map.len(), 2);
        assert_eq!(map["retry-after"], "13");
        assert_eq!(map["ratelimit"], r#""GET /a";r=0;t=13"#);
    }

    #[test]
    fn a_number_is_written_as_its_digits_would_be() {
        let name = http::HeaderName::from_static("ratelimit-remaining");
        for n in [0, 9, 10, 4_294_967_296, u64::MAX] {
            let (mut by_number, mut by_digits) = (Written::default(), Written::default());
            by_number.push_digits("ratelimit-remaining: ", itoa::Buffer::new().format(n));
            by_digits.push(&name, n.to_string().as_bytes());
            assert_eq!(by_number, by_digits, "{n}");
        }
    }
}
