//! http1: what reading an HTTP/1 head takes on both sides of the gateway, the client's requests
//! (`server::h1`) and the upstream's responses (`proxy::upstream::h1`): header lines whose
//! names a connection reuses, a field's token list, a `Content-Length` number, the fields a
//! request hands on as lines. Pure.

use std::ops::Range;

use crate::server::shelf::Shelf;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// A head's header lines, while it is read; kept from one head to the next on a connection, as
/// names to reuse (a peer sends the same fields in the same order, and making a name from bytes
/// costs over 100 instructions, and an allocation for one that is not standard; comparing its
/// bytes a fifth of that).
pub type Lines = Vec<Line>;

/// Names up to this long are kept as written, to be recognised in the next head.
const RAW_NAME: usize = 32;

/// One header line: its name, where it and its value lie in the head, what the name is to a
/// proxy, and the name as written (when short).
#[derive(Debug, Clone)]
pub struct Line {
    pub name: HeaderName,
    pub value: Range<usize>,
    /// Where the line (its name) starts in the head.
    pub start: usize,
    /// Worked out when the name is made, not for each head that reuses it.
    pub kind: Kind,
    raw: [u8; RAW_NAME],
    /// `raw`'s length; 0: not kept (too long).
    raw_len: u8,
    /// The [`Passes`](super::passed::Passes) (its id; 0: none) that last judged this name, and the one that passes it:
    /// judged once for a connection's lines, not on each request.
    pub(super) judged_by: u32,
    pub(super) passed_by: u32,
}

/// What a field's name is to a proxy passing the field on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Hop-by-hop (RFC 9110 §7.6.1), never passed on: `Keep-Alive`, `Proxy-Connection`,
    /// `Proxy-Authenticate`, `Proxy-Authorization`, `TE`, `Trailer`, `Upgrade`.
    HopByHop,
    /// `Connection`: hop-by-hop, and the names it lists are too.
    Connection,
    /// `Transfer-Encoding`: never passed on either (each side frames its own bodies).
    TransferEncoding,
    ContentLength,
    Date,
    /// `Retry-After` and the `RateLimit*` fields: those a rate limiter writes.
    RateLimit,
    Other,
}

/// The hop-by-hop names but `Connection` ([`Kind::HopByHop`]).
const HOP_BY_HOP: [HeaderName; 7] = [
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

impl Kind {
    pub fn of(name: &HeaderName) -> Kind {
        match *name {
            header::CONNECTION => Kind::Connection,
            header::TRANSFER_ENCODING => Kind::TransferEncoding,
            header::CONTENT_LENGTH => Kind::ContentLength,
            header::DATE => Kind::Date,
            header::RETRY_AFTER => Kind::RateLimit,
            _ if HOP_BY_HOP.contains(name) => Kind::HopByHop,
            _ if name.as_str().starts_with("ratelimit") => Kind::RateLimit,
            _ => Kind::Other,
        }
    }

    /// A field of this kind is never passed on.
    pub fn hop_by_hop(self) -> bool {
        matches!(
            self,
            Kind::HopByHop | Kind::Connection | Kind::TransferEncoding
        )
    }

    /// `Kind::of(name).hop_by_hop()`, without looking at what else the name may be (this runs
    /// on every name of every request).
    pub fn is_hop_by_hop(name: &HeaderName) -> bool {
        *name == header::CONNECTION
            || *name == header::TRANSFER_ENCODING
            || HOP_BY_HOP.contains(name)
    }
}

impl Line {
    fn new(name: HeaderName, raw: &[u8], start: usize, value: Range<usize>) -> Line {
        let mut line = Line {
            kind: Kind::of(&name),
            name,
            value,
            start,
            raw: [0; RAW_NAME],
            raw_len: 0,
            judged_by: 0,
            passed_by: 0,
        };
        if let Some(keep) = line.raw.get_mut(..raw.len()) {
            keep.copy_from_slice(raw);
            line.raw_len = raw.len() as u8;
        }
        line
    }

    /// Written as `raw` (exactly: the same bytes make the same name).
    fn written_as(&self, raw: &[u8]) -> bool {
        usize::from(self.raw_len) == raw.len() && self.raw[..raw.len()] == *raw
    }
}

/// Fields a connection's request map has room for, from its first request on, and a map handed
/// from its answers to its next requests: 16 slots, so that a usual request's fields fill at
/// most half of them (a map grown to just fit them probes longer on every lookup and removal:
/// +150 instructions a request, callgrind; grown from nothing on a new connection, it was
/// allocated three times).
pub const KEPT_ROOM: usize = 12;

/// Lines a connection reads its heads into, starting from those of a connection of this thread
/// that ended (clients of one kind send the same fields in the same order: a new connection then
/// makes no name, where it made each, ~1,500 instructions a connection, callgrind). When
/// dropped, they are kept for a later connection of this thread.
pub struct ThreadLines(Lines);

/// Lines kept of a connection, at most (a bound on what a thread keeps).
const KEPT_LINES: usize = 32;

/// Sets of lines a thread keeps, at most: as many connections as opened at once on a worker
/// (~3 KiB each, so at most ~200 KiB a thread) start from a set of their own, moved, not copied.
const KEPT_SETS: usize = 64;

thread_local! {
    /// Kept sets, the last kept on top.
    static KEPT: Shelf<Lines> = const { Shelf::new(KEPT_SETS) };
}

impl ThreadLines {
    /// The set kept last on this thread, moved (most likely the lines of a connection of the
    /// same clients), or a new one with room for a usual request's lines (grown one by one,
    /// they moved four times). `h1::serve` keeps a connection's lines with its read buffer
    /// while it waits; a set comes here when more wait than that keeps.
    pub fn resume() -> ThreadLines {
        ThreadLines(Shelf::take(&KEPT).unwrap_or_else(|| Vec::with_capacity(16)))
    }
}

impl std::ops::Deref for ThreadLines {
    type Target = Lines;
    fn deref(&self) -> &Lines {
        &self.0
    }
}

impl std::ops::DerefMut for ThreadLines {
    fn deref_mut(&mut self) -> &mut Lines {
        &mut self.0
    }
}

impl Drop for ThreadLines {
    fn drop(&mut self) {
        let mut lines = std::mem::take(&mut self.0);
        lines.truncate(KEPT_LINES);
        lines.shrink_to(KEPT_LINES);
        Shelf::keep(&KEPT, lines);
    }
}

/// Sets line `i` of `lines` (each line before it set already) to the name written `raw`, the
/// line starting at `start`, its value at `value`: the name is the one at that place in the
/// last head when written the same. `None`: `raw` is no field name.
pub fn set_line<'a>(
    lines: &'a mut Lines,
    i: usize,
    raw: &[u8],
    start: usize,
    value: Range<usize>,
) -> Option<&'a mut Line> {
    match lines.get_mut(i) {
        Some(line) if line.written_as(raw) => (line.start, line.value) = (start, value),
        known => {
            let line = Line::new(HeaderName::from_bytes(raw).ok()?, raw, start, value);
            match known {
                Some(known) => *known = line,
                None => lines.push(line),
            }
        }
    }
    Some(&mut lines[i])
}

/// Appends `lines` to `headers`, their values slices of `head` (the head's bytes), not checked
/// again: `HeaderValue`'s check of every byte repeated httparse's, ~460 instructions a proxied
/// request for its two heads, the client's and the upstream's (callgrind, docs/benchmarks/).
///
/// # Safety
///
/// Each line's value range lies in `head` and holds only bytes that `httparse` admits in a field
/// value (HTAB, SP to `~`, 0x80 to 0xFF: exactly the bytes a `HeaderValue` may hold), as the
/// lines that [`set_line`] sets from the fields `httparse` parsed out of the same bytes do.
/// Debug builds check anyway (`HeaderValue::from_maybe_shared_unchecked` panics there).
pub unsafe fn append_lines(lines: &[Line], head: &Bytes, headers: &mut HeaderMap) {
    headers.reserve(lines.len());
    for line in lines {
        // SAFETY: the caller's promise, above.
        unsafe { append_line(line, head, headers) };
    }
}

/// # Safety
///
/// As [`append_lines`]'s, for `line`.
#[inline(always)]
pub(super) unsafe fn append_line(line: &Line, head: &Bytes, headers: &mut HeaderMap) {
    // SAFETY: the caller's promise.
    let value = unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(line.value.clone())) };
    headers.append(line.name.clone(), value);
}

/// `list` (a comma-separated field value) has `token`, in any case.
pub fn has_token(list: &[u8], token: &[u8]) -> bool {
    list.split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// A `Content-Length` number: decimal digits only (no sign, no space), at most 19 of them.
pub fn plain_number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `append_lines`'s safety rests on this: a byte httparse lets into a field value is one a
    /// `HeaderValue` may hold, and the other way round (a new version of either would show here).
    #[test]
    fn httparse_admits_in_a_value_exactly_the_bytes_a_header_value_holds() {
        for b in 0..=255u8 {
            let head = [b"HTTP/1.1 200 OK\r\nx: a".as_slice(), &[b], b"a\r\n\r\n"].concat();
            let mut fields = [httparse::EMPTY_HEADER; 4];
            let mut resp = httparse::Response::new(&mut fields);
            let parsed = matches!(resp.parse(&head), Ok(httparse::Status::Complete(_)))
                && resp.headers.len() == 1
                && resp.headers[0].value == [b'a', b, b'a'];
            let holds = HeaderValue::from_bytes(&[b'a', b, b'a']).is_ok();
            assert_eq!(parsed, holds, "byte {b:#04x}");
        }
    }

    #[test]
    fn a_name_is_reused_only_where_written_the_same_at_the_same_place() {
        let mut lines = Lines::new();
        let name = |lines: &mut Lines, i, raw: &[u8]| {
            set_line(lines, i, raw, i, 0..1).map(|l| l.name.as_str().to_owned())
        };
        assert_eq!(
            name(&mut lines, 0, b"X-Api-Key").as_deref(),
            Some("x-api-key")
        );
        assert_eq!(name(&mut lines, 1, b"Host").as_deref(), Some("host"));
        let kept = lines[0].name.clone();
        assert_eq!(
            name(&mut lines, 0, b"X-Api-Key").as_deref(),
            Some("x-api-key")
        );
        assert_eq!(lines[0].name, kept);
        assert_eq!(
            name(&mut lines, 1, b"X-Api-Key").as_deref(),
            Some("x-api-key")
        );
        assert_eq!(name(&mut lines, 0, b"Bad Name"), None);
        let long = "N".repeat(40);
        assert_eq!(name(&mut lines, 0, long.as_bytes()), Some("n".repeat(40)));
        assert_eq!(name(&mut lines, 0, long.as_bytes()), Some("n".repeat(40)));
    }

    #[test]
    fn a_name_is_of_the_kind_a_proxy_treats_it_as() {
        for (name, kind) in [
            ("connection", Kind::Connection),
            ("transfer-encoding", Kind::TransferEncoding),
            ("keep-alive", Kind::HopByHop),
            ("proxy-connection", Kind::HopByHop),
            ("te", Kind::HopByHop),
            ("trailer", Kind::HopByHop),
            ("upgrade", Kind::HopByHop),
            ("proxy-authorization", Kind::HopByHop),
            ("content-length", Kind::ContentLength),
            ("date", Kind::Date),
            ("retry-after", Kind::RateLimit),
            ("ratelimit-policy", Kind::RateLimit),
            ("x-ratelimit", Kind::Other),
            ("content-type", Kind::Other),
        ] {
            let name = HeaderName::from_static(name);
            assert_eq!(Kind::of(&name), kind, "{name}");
            assert_eq!(Kind::is_hop_by_hop(&name), kind.hop_by_hop(), "{name}");
        }
        // Worked out with the name, and kept with it.
        let mut lines = Lines::new();
        set_line(&mut lines, 0, b"Date", 0, 6..9);
        set_line(&mut lines, 0, b"Date", 4, 10..12);
        assert_eq!((lines[0].kind, lines[0].start), (Kind::Date, 4));
    }

    #[test]
    fn a_connection_starts_from_the_names_the_last_one_of_its_thread_read() {
        std::thread::spawn(|| {
            let raw: [&[u8]; 2] = [b"Host", b"X-Api-Key"];
            let mut first = ThreadLines::resume();
            assert!(first.is_empty());
            for (i, r) in raw.iter().enumerate() {
                set_line(&mut first, i, r, 0, 0..1);
            }
            let kept = first[1].name.clone();
            drop(first);
            let mut next = ThreadLines::resume();
            assert_eq!(next.len(), 2);
            let name = &set_line(&mut next, 1, b"X-Api-Key", 1, 2..3).unwrap().name;
            // The same name, not one made again (a custom name's bytes are shared).
            assert_eq!(name.as_str().as_ptr(), kept.as_str().as_ptr());
            assert_eq!((next[1].start, next[1].value.clone()), (1, 2..3));
            let line = next[0].clone();
            next.extend(std::iter::repeat_n(line, 40));
            drop(next);
            assert_eq!(ThreadLines::resume().len(), KEPT_LINES);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn connections_open_at_once_each_start_from_a_kept_set_and_a_thread_keeps_a_bounded_few() {
        std::thread::spawn(|| {
            let mut a = ThreadLines::resume();
            set_line(&mut a, 0, b"X-Api-Key", 0, 0..1);
            let mut b = ThreadLines::resume();
            set_line(&mut b, 0, b"X-Api-Key", 0, 0..1);
            let b_at = b.as_ptr();
            drop(a);
            drop(b);
            // The set of the connection that ended last is moved to the next one, not copied.
            let c = ThreadLines::resume();
            assert_eq!((c.as_ptr(), c.len()), (b_at, 1));
            let d = ThreadLines::resume();
            assert_eq!(d.len(), 1);
            let e = ThreadLines::resume();
            assert!(e.is_empty(), "none kept: a new set");
            let many: Vec<ThreadLines> =
                (0..KEPT_SETS + 5).map(|_| ThreadLines::resume()).collect();
            drop((many, c, d, e));
            assert_eq!(Shelf::len(&KEPT), KEPT_SETS);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn tokens_and_numbers_are_read_as_written() {
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(!has_token(b"closed", b"close"));
        assert_eq!(plain_number(b"0"), Some(0));
        assert_eq!(plain_number(b"65536"), Some(65536));
        for bad in [
            &b""[..],
            b"-1",
            b"1 ",
            b"+5",
            b"0x10",
            b"99999999999999999999",
        ] {
            assert_eq!(plain_number(bad), None);
        }
    }
}
