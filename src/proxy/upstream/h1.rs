//! h1: the HTTP/1.1 wire rules of the gateway's own upstream exchange ([`super::raw`]): a
//! request head written, a response head read and where its body ends (RFC 9112 §6.3), a
//! chunked body's framing. No I/O here.

use bytes::{Bytes, BytesMut};

use crate::server::Written;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

/// Header lines a response head may have at most (hyper's client allows as many).
pub const MAX_HEADERS: usize = 100;

/// Room a response's header map is made with beyond its own fields: for those the gateway adds
/// (`headers::set_rate_limit`: at most six), which would otherwise grow it, twice for five.
const ROOM: usize = 6;

/// Fields written after a request's own, in place of some of them.
pub trait After {
    /// The request's field `name` is one of these: it is left out.
    fn replaces(&self, name: &HeaderName) -> bool;
    /// Gives these to `line`, for a request with `headers`; `replaced`: it had a field that
    /// [`After::replaces`].
    fn write(
        &self,
        headers: &HeaderMap,
        replaced: bool,
        line: impl FnMut(&HeaderName, &HeaderValue),
    );
}

#[inline(always)]
fn line(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    let (name, value) = (name.as_str().as_bytes(), value.as_bytes());
    out.reserve(name.len() + value.len() + 4);
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes a request head: `METHOD target HTTP/1.1`, `host`, then each header as it is but a
/// `Host` of its own and those `after` replaces, then the lines `passed` (the fields handed on
/// as they came, [`crate::server::passed::Passed`]), then `after`'s. The `http` types hold no CR, LF or
/// other control byte, nor do `passed`'s names and values, so nothing here can split a line.
pub fn encode_request(
    method: &Method,
    target: &str,
    host: &HeaderValue,
    headers: &HeaderMap,
    passed: &[u8],
    after: &impl After,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut replaced = false;
    for (name, value) in headers {
        if name == http::header::HOST {
            continue;
        }
        if after.replaces(name) {
            replaced = true;
            continue;
        }
        line(out, name, value);
    }
    if !passed.is_empty() {
        out.extend_from_slice(passed);
    }
    after.write(headers, replaced, |name, value| line(out, name, value));
    out.extend_from_slice(b"\r\n");
}

/// Where a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304).
    Empty,
    /// `Content-Length`: this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// To the connection's close.
    Close,
}

/// A final response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request after this response's body.
    pub reusable: bool,
}

/// Why a response head is refused (the exchange then fails: 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadHead(pub &'static str);

use crate::proxy::headers::listed_in;
pub use crate::server::http1::Lines;
use crate::server::http1::{Kind, has_token, plain_number};

/// Reads a response head from the front of `buf`, taking its bytes off it (header values
/// share them). `Ok(None)`: not whole yet. Informational (1xx) heads are read past. `lines`:
/// room to work in, holding the connection's last response's names: a name written as the one
/// at its place was is taken from there (an upstream answers with the same fields in the same
/// order, and making a name from bytes costs over 100 instructions, comparing its bytes a
/// fifth of that). With `written` (the answer goes to the gateway's own HTTP/1.1 server), the
/// fields are passed on as lines there ([`pass_on`]) and the head's map holds only those the
/// gateway may replace; without, the map holds them all.
pub fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
    max_bytes: usize,
    lines: &mut Lines,
    written: Option<&mut Written>,
) -> Result<Option<Head>, BadHead> {
    loop {
        let mut slots =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, buf, &mut slots);
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) if len > max_bytes => {
                return Err(BadHead("response head too large"));
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() >= max_bytes => {
                return Err(BadHead("response head too large"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(BadHead("too many headers")),
            Err(_) => return Err(BadHead("malformed response head")),
        };
        let code = resp.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| BadHead("invalid status code"))?;
        let version = match resp.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        };
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(BadHead("101 to a request that asked for no upgrade"));
        }
        if status.is_informational() {
            let _ = buf.split_to(len);
            continue;
        }
        // Each name, and where its value lies, so that the head can be cut off `buf` first
        // (`lines` is the caller's, kept from one response to the next: an array here was
        // zeroed every time).
        let base = buf.as_ptr() as usize;
        let mut framed_by = Seen::default();
        for (i, h) in resp.headers.iter().enumerate() {
            let (start, at) = (
                h.name.as_ptr() as usize - base,
                h.value.as_ptr() as usize - base,
            );
            let value = at..at + h.value.len();
            crate::server::http1::set_line(lines, i, h.name.as_bytes(), start, value)
                .ok_or(BadHead("invalid header name"))?;
            framed_by.note(lines[i].kind, h.value);
        }
        lines.truncate(resp.headers.len());
        let bytes = buf.split_to(len).freeze();
        let (framing, reusable) = frame(status, version, lines, &bytes, framed_by, head_request)?;
        // SAFETY (both): `lines` are the fields httparse parsed out of these bytes (their ranges
        // from `base`, the start of `bytes`).
        let headers = match written {
            Some(written) => unsafe { pass_on(lines, &bytes, framed_by, head_request, written) },
            None => {
                let mut headers = HeaderMap::with_capacity(lines.len() + ROOM);
                unsafe { crate::server::http1::append_lines(lines, &bytes, &mut headers) };
                if framing_drops_length(framing, framed_by) {
                    headers.remove(CONTENT_LENGTH);
                }
                headers
            }
        };
        return Ok(Some(Head {
            status,
            version,
            headers,
            framing,
            reusable,
        }));
    }
}

/// Writes the fields of a response head (`lines`, in `head`) to `written` as they are, but
/// hop-by-hop ones (those `Connection` lists too), and `Content-Length` (the server writes the
/// body's length) unless the request was a HEAD (whose answer tells a GET's); those the gateway
/// may replace go into the map returned instead, where it looks for them. A field written so
/// costs a copy of its line; in a map, its name hashed, its value counted in, the entry dropped
/// and the map walked again to write it (callgrind: docs/benchmarks/).
///
/// # Safety
///
/// As [`crate::server::http1::append_lines`]'s: each line's value lies in `head` and holds only bytes
/// `httparse` admits in a field value.
unsafe fn pass_on(
    lines: &Lines,
    head: &Bytes,
    seen: Seen,
    head_request: bool,
    written: &mut Written,
) -> HeaderMap {
    let listed = |name: &HeaderName| {
        seen.connection
            && lines
                .iter()
                .filter(|l| l.kind == Kind::Connection)
                .any(|c| listed_in(&head[c.value.clone()], name))
    };
    let mut map = HeaderMap::new();
    for line in lines {
        match line.kind {
            kind if kind.hop_by_hop() => {}
            _ if listed(&line.name) => {}
            Kind::ContentLength if !head_request => {}
            Kind::RateLimit => {
                // SAFETY: the caller's promise.
                let v = unsafe {
                    HeaderValue::from_maybe_shared_unchecked(head.slice(line.value.clone()))
                };
                map.append(line.name.clone(), v);
            }
            kind => match head.get(line.start..line.value.end) {
                Some(whole) => written.push_line(whole, kind == Kind::Date),
                // An empty value httparse placed elsewhere: the line is written again.
                None => written.push(&line.name, &head[line.value.clone()]),
            },
        }
    }
    map
}

/// The fields a client is sent of the response head at the front of `bytes`, read both ways:
/// into a map (hop-by-hop fields stripped, `Content-Length` left to the server but for a HEAD),
/// and passed on as lines then set in the head's map as hyper's servers do. Equal for every
/// head (the unit tests, the fuzz target `response_head`); `None`: no whole head.
#[doc(hidden)]
pub fn both_ways(bytes: &[u8], head_request: bool) -> Option<(HeaderMap, HeaderMap)> {
    let read = |written| {
        parse_response(
            &mut BytesMut::from(bytes),
            head_request,
            4096,
            &mut Lines::new(),
            written,
        )
    };
    let mut map = read(None).ok()??.headers;
    crate::proxy::headers::strip_hop_by_hop(&mut map, &[]);
    if !head_request {
        map.remove(CONTENT_LENGTH);
    }
    let mut written = Written::default();
    let mut lines = read(Some(&mut written)).ok()??.headers;
    written.set_in(&mut lines);
    Some((map, lines))
}

/// Which of the fields that frame a response it has (the others are not looked up), and the
/// length its `Content-Length` values give, read as they come.
#[derive(Default, Clone, Copy)]
struct Seen {
    connection: bool,
    transfer_encoding: bool,
    /// The one length every `Content-Length` value gives (a list of equal values is one
    /// length), or their fault, told only if the length frames the body; `None`: none came.
    length: Option<Result<u64, BadHead>>,
}

impl Seen {
    fn note(&mut self, kind: Kind, value: &[u8]) {
        self.connection |= kind == Kind::Connection;
        self.transfer_encoding |= kind == Kind::TransferEncoding;
        if kind == Kind::ContentLength {
            self.length = Some(match self.length {
                Some(Err(e)) => Err(e),
                Some(Ok(n)) => length_of(value, Some(n)),
                None => length_of(value, None),
            });
        }
    }
}

/// Where the body of a response with these fields (`lines`, their values in `head`) ends (RFC
/// 9112 §6.3), and whether the connection outlives it.
fn frame(
    status: StatusCode,
    version: Version,
    lines: &Lines,
    head: &[u8],
    seen: Seen,
    head_request: bool,
) -> Result<(Framing, bool), BadHead> {
    let values = |kind: Kind| {
        lines
            .iter()
            .filter(move |l| l.kind == kind)
            .map(|l| &head[l.value.clone()])
    };
    let mut reusable = version == Version::HTTP_11
        && !(seen.connection && values(Kind::Connection).any(|v| has_token(v, b"close")));
    let framing =
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Framing::Empty
        } else if seen.transfer_encoding {
            if version != Version::HTTP_11 {
                return Err(BadHead("Transfer-Encoding in an HTTP/1.0 response"));
            }
            // With a Content-Length too, the coding wins (the length is not passed on: a message
            // must not carry both, [`framing_drops_length`]) and the connection ends with the
            // body.
            if seen.length.is_some() {
                reusable = false;
            }
            let codings = values(Kind::TransferEncoding)
                .next_back()
                .unwrap_or_default();
            let final_coding = codings.rsplit(|&b| b == b',').next().unwrap_or_default();
            match final_coding.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                true => Framing::Chunked,
                false => {
                    reusable = false;
                    Framing::Close
                }
            }
        } else if let Some(length) = seen.length {
            Framing::Length(length?)
        } else {
            reusable = false;
            Framing::Close
        };
    Ok((framing, reusable))
}

/// A response framed as `framing` had a `Content-Length` that does not frame it (a
/// `Transfer-Encoding` came with it), and is not passed on.
fn framing_drops_length(framing: Framing, seen: Seen) -> bool {
    matches!(framing, Framing::Chunked | Framing::Close)
        && seen.transfer_encoding
        && seen.length.is_some()
}

/// The length one `Content-Length` value gives: every length it lists must be the one seen so
/// far (`seen`).
fn length_of(value: &[u8], mut seen: Option<u64>) -> Result<u64, BadHead> {
    for part in value.split(|&b| b == b',') {
        let n = plain_number(part.trim_ascii()).ok_or(BadHead("invalid Content-Length"))?;
        if seen.is_some_and(|l| l != n) {
            return Err(BadHead("differing Content-Length values"));
        }
        seen = Some(n);
    }
    // A value is one part at least, and an empty one is refused above.
    seen.ok_or(BadHead("invalid Content-Length"))
}

pub use crate::server::framing::{BadChunk, Chunked, Next, parse_trailers};

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(bytes: &[u8]) -> BytesMut {
        BytesMut::from(bytes)
    }

    fn head(text: &str) -> Result<Option<Head>, BadHead> {
        parse_response(
            &mut buf(text.as_bytes()),
            false,
            8192,
            &mut Vec::new(),
            None,
        )
    }

    /// No fields after.
    struct Nothing;

    impl After for Nothing {
        fn replaces(&self, _: &HeaderName) -> bool {
            false
        }
        fn write(&self, _: &HeaderMap, _: bool, _: impl FnMut(&HeaderName, &HeaderValue)) {}
    }

    #[test]
    fn a_request_head_is_its_line_and_its_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("client.example"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        let mut out = Vec::new();
        let host = HeaderValue::from_static("up:8080");
        encode_request(
            &Method::GET,
            "/users/1?q=2",
            &host,
            &headers,
            b"",
            &Nothing,
            &mut out,
        );
        assert_eq!(
            out,
            b"GET /users/1?q=2 HTTP/1.1\r\nhost: up:8080\r\nx-a: 1\r\nx-a: 2\r\n\r\n"
        );
        // Fields written after: those of the request they replace are left out.
        headers.append("x-b", HeaderValue::from_static("3"));
        struct NewA;
        impl After for NewA {
            fn replaces(&self, name: &HeaderName) -> bool {
                name == "x-a" || name == "x-c"
            }
            fn write(
                &self,
                _: &HeaderMap,
                replaced: bool,
                mut line: impl FnMut(&HeaderName, &HeaderValue),
            ) {
                assert!(replaced);
                line(
                    &HeaderName::from_static("x-a"),
                    &HeaderValue::from_static("new"),
                );
            }
        }
        encode_request(&Method::POST, "/", &host, &headers, b"", &NewA, &mut out);
        assert_eq!(
            out,
            b"POST / HTTP/1.1\r\nhost: up:8080\r\nx-b: 3\r\nx-a: new\r\n\r\n"
        );
        // The fields handed on as lines go as they are, after the map's and before those after.
        let passed = b"user-agent: u\r\naccept: */*\r\n";
        encode_request(&Method::GET, "/", &host, &headers, passed, &NewA, &mut out);
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nhost: up:8080\r\nx-b: 3\r\nuser-agent: u\r\naccept: */*\r\nx-a: new\r\n\r\n"
        );
    }

    #[test]
    fn a_response_head_gives_its_framing() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-y: z\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.framing, h.reusable),
            (StatusCode::OK, Framing::Length(5), true)
        );
        assert_eq!(h.headers["x-y"], "z");
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.framing, h.reusable), (Framing::Chunked, true));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.framing, h.reusable), (Framing::Close, false));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.framing, h.reusable), (Framing::Chunked, false));
        assert!(!h.headers.contains_key(CONTENT_LENGTH));
        let h = head("HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing, h.reusable), (Framing::Close, false));
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.framing, h.reusable), (Framing::Empty, true));
        let h = head("HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.framing, h.reusable), (Framing::Length(0), false));
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.version, h.reusable), (Version::HTTP_10, false));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\ncontent-length: 4\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(4));
        for (lengths, why) in [
            ("content-length: 3, 4", "differing Content-Length values"),
            (
                "content-length: 3\r\ncontent-length: 4",
                "differing Content-Length values",
            ),
            ("content-length: x", "invalid Content-Length"),
            ("content-length: -1", "invalid Content-Length"),
            ("content-length: 3,", "invalid Content-Length"),
            (
                "content-length: 3\r\ncontent-length: 3, y",
                "invalid Content-Length",
            ),
        ] {
            let text = format!("HTTP/1.1 200 OK\r\n{lengths}\r\n\r\n");
            assert_eq!(head(&text).err(), Some(BadHead(why)), "{lengths}");
        }
        // A length that does not frame the body is not read.
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: x\r\n\r\n");
        assert_eq!(h.unwrap().unwrap().framing, Framing::Chunked);
        let h = head("HTTP/1.1 304 Not Modified\r\ncontent-length: 1, 2\r\n\r\n");
        assert_eq!(h.unwrap().unwrap().framing, Framing::Empty);
        let mut b = buf(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n");
        let h = parse_response(&mut b, true, 8192, &mut Vec::new(), None)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn informational_heads_are_read_past_and_the_body_stays() {
        let mut b = buf(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        );
        let h = parse_response(&mut b, false, 8192, &mut Vec::new(), None)
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::CREATED);
        assert_eq!(&b[..], b"ok");
    }

    #[test]
    fn a_connections_heads_reuse_its_last_names_only_where_they_are_the_same() {
        let mut lines = Vec::new();
        let mut read = |text: &str| {
            let h = parse_response(&mut buf(text.as_bytes()), false, 8192, &mut lines, None);
            let h = h.unwrap().unwrap();
            let mut fields: Vec<(String, String)> = h
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                .collect();
            fields.sort();
            (h.framing, fields)
        };
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        let (_, first) = read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nX-B: 2\r\n\r\n");
        assert_eq!(
            first,
            [
                pair("content-length", "2"),
                pair("x-a", "1"),
                pair("x-b", "2")
            ]
        );
        // Another case, another name of the same length in the second place, one field fewer.
        let (framing, second) = read("HTTP/1.1 200 OK\r\ncontent-LENGTH: 3\r\nX-Q: 1\r\n\r\n");
        assert_eq!(framing, Framing::Length(3));
        assert_eq!(second, [pair("content-length", "3"), pair("x-q", "1")]);
        // Then more fields than before; a framing field where another was.
        let (framing, third) =
            read("HTTP/1.1 200 OK\r\nX-Ab: 7\r\ntransfer-encoding: chunked\r\nx-c: 9\r\n\r\n");
        assert_eq!(framing, Framing::Chunked);
        assert_eq!(
            third,
            [
                pair("transfer-encoding", "chunked"),
                pair("x-ab", "7"),
                pair("x-c", "9")
            ]
        );
        // An invalid name is refused, whatever was there before.
        let bad = parse_response(
            &mut buf(b"HTTP/1.1 200 OK\r\nx-ab: 1\r\nx\x01: 2\r\n\r\n"),
            false,
            8192,
            &mut lines,
            None,
        );
        assert!(bad.is_err());
    }

    #[test]
    fn a_head_cut_short_waits_and_a_bad_one_is_refused() {
        assert!(head("HTTP/1.1 200 OK\r\ncontent-len").unwrap().is_none());
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
            "SMTP 200 OK\r\n\r\n",
        ] {
            assert!(head(bad).is_err(), "{bad:?}");
        }
        let long = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(9000));
        assert_eq!(head(&long).unwrap_err(), BadHead("response head too large"));
        assert_eq!(
            head(&long[..8500]).unwrap_err(),
            BadHead("response head too large")
        );
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        let text = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(head(&text).unwrap_err(), BadHead("too many headers"));
    }

    /// The data of a chunked `body` fed in pieces of `step` bytes, its trailers and whether it
    /// ended with the input.
    fn dechunk(body: &[u8], step: usize) -> Result<(Vec<u8>, Option<HeaderMap>, bool), BadChunk> {
        let mut c = Chunked::new(64);
        let mut data = Vec::new();
        let mut pending = BytesMut::new();
        let mut last = false;
        for piece in body.chunks(step) {
            pending.extend_from_slice(piece);
            loop {
                if last {
                    match parse_trailers(&mut pending, 64)? {
                        Some(t) => return Ok((data, Some(t), pending.is_empty())),
                        None => break,
                    }
                }
                let (used, next) = c.next(&pending)?;
                let _ = pending.split_to(used);
                match next {
                    Next::More => break,
                    Next::Data(n) => data.extend_from_slice(&pending.split_to(n)),
                    Next::Trailers => last = true,
                }
            }
        }
        Ok((data, None, false))
    }

    #[test]
    fn a_chunked_body_reads_the_same_in_any_split() {
        let body = b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n";
        for step in 1..body.len() {
            let (data, trailers, whole) = dechunk(body, step).unwrap();
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz", "step {step}");
            let trailers = trailers.unwrap();
            assert_eq!(
                (trailers["x-t"].as_bytes(), trailers["x-u"].as_bytes()),
                (&b"1"[..], &b"2"[..])
            );
            assert!(whole);
        }
        let (data, trailers, whole) = dechunk(b"0\r\n\r\n", 1).unwrap();
        assert!(data.is_empty() && trailers.unwrap().is_empty() && whole);
        assert_eq!(dechunk(b"3\r\nabc\r\n", 4).unwrap().0, b"abc");
    }

    #[test]
    fn fields_passed_on_as_lines_are_those_a_map_passes_on() {
        let heads = [
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\ndate: x\r\n\r\n",
            // Hop-by-hop fields, those `Connection` lists (in any case, among others), a field
            // twice, values with a tab and bytes past ASCII.
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Private\r\nkeep-alive: 5\r\nx-private: 1\r\nset-cookie: a=1\r\nx-v: a\tb \u{e9}\r\nset-cookie: b=2\r\nupgrade: h2c\r\nTE: trailers\r\nTrailer: x\r\ntransfer-encoding: chunked\r\n\r\n",
            // Fields the gateway may replace stay in the map.
            "HTTP/1.1 429 Too Many\r\nretry-after: 5\r\nratelimit-limit: 9\r\nratelimit: x\r\nx-a: 1\r\ncontent-length: 0\r\n\r\n",
            // A length beside a coding is not passed on; nor is one a HEAD's answer does not
            // frame, which still tells a GET's.
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nx-a: 1\r\n\r\n",
            "HTTP/1.0 200 OK\r\nconnection: close\r\n\r\n",
            // Empty values, white space around values, a name in capitals.
            "HTTP/1.1 200 OK\r\nx-e:\r\ncontent-length: 0\r\nx-s: \t \r\nx-t:  a b  \r\nX-Up: 1\r\n\r\n",
            // Listed in `Connection`, a field the gateway may replace and a length go too.
            "HTTP/1.1 200 OK\r\nretry-after: 1\r\nConnection: Retry-After, content-length\r\ncontent-length: 1\r\nX-Up:1\r\n\r\n",
        ];
        for text in heads {
            let bytes: Vec<u8> = text.chars().map(|c| c as u32 as u8).collect();
            for head_request in [false, true] {
                let (map, lines) = both_ways(&bytes, head_request).unwrap();
                assert_eq!(map, lines, "{text:?} {head_request}");
            }
        }
        // The forms themselves: lines, and only the replaceable fields in the map.
        let as_lines = |text: &[u8], head_request| {
            let mut written = Written::default();
            let head = parse_response(
                &mut buf(text),
                head_request,
                8192,
                &mut Vec::new(),
                Some(&mut written),
            );
            (head.unwrap().unwrap().headers, written)
        };
        let (map, written) = as_lines(heads[2].as_bytes(), false);
        assert_eq!(written.as_bytes(), b"x-a: 1\r\n");
        assert!(!written.dated());
        let names: Vec<_> = map.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["retry-after", "ratelimit-limit", "ratelimit"]);
        let (_, written) = as_lines(heads[0].as_bytes(), true);
        assert_eq!(
            written.as_bytes(),
            b"content-type: application/json\r\ncontent-length: 2\r\ndate: x\r\n"
        );
        assert!(written.dated());
        // An empty value's line ends where it does (the next line, not passed on, is not in it;
        // white space before an empty value stays, as allowed).
        let text = b"HTTP/1.1 200 OK\r\nx-e:\r\ncontent-length: 0\r\nx-s:  \r\nX-Up:1\r\n\r\n";
        let (_, written) = as_lines(text, false);
        assert_eq!(written.as_bytes(), b"x-e:\r\nx-s:  \r\nX-Up:1\r\n");
    }

    #[test]
    fn a_chunked_body_out_of_grammar_is_refused() {
        for bad in [
            &b"\r\n"[..],
            b"x\r\n",
            b"5\nhello\r\n",
            b"3\r\nabcX\r\n",
            b"3\r\nabc\r\r",
            b"11111111111111111\r\n",
            b"0\r\nx-t 1\r\n\r\n",
        ] {
            assert_eq!(dechunk(bad, 1), Err(BadChunk), "{bad:?}");
        }
        let long_ext = format!("1;{}\r\na\r\n0\r\n\r\n", "e".repeat(100));
        assert_eq!(dechunk(long_ext.as_bytes(), 7), Err(BadChunk));
        let long_trailer = format!("0\r\nx: {}\r\n\r\n", "t".repeat(100));
        assert_eq!(dechunk(long_trailer.as_bytes(), 7), Err(BadChunk));
    }
}
