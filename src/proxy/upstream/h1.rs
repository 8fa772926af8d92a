//! h1: the HTTP/1.1 wire rules of the gateway's own upstream exchange ([`super::raw`]): a
//! request head written, a response head read and where its body ends (RFC 9112 §6.3), a
//! chunked body's framing. No I/O here.

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
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
/// `Host` of its own and those `after` replaces, then `after`'s. The `http` types hold no CR,
/// LF or other control byte, so nothing here can split a line.
pub fn encode_request(
    method: &Method,
    target: &str,
    host: &HeaderValue,
    headers: &HeaderMap,
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

pub use crate::http1::Lines;
use crate::http1::{has_token, plain_number};

/// Reads a response head from the front of `buf`, taking its bytes off it (header values
/// share them). `Ok(None)`: not whole yet. Informational (1xx) heads are read past. `lines`:
/// room to work in, holding the connection's last response's names: a name written as the one
/// at its place was is taken from there (an upstream answers with the same fields in the same
/// order, and making a name from bytes costs over 100 instructions, comparing its bytes a
/// fifth of that).
pub fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
    max_bytes: usize,
    lines: &mut Lines,
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
            let at = h.value.as_ptr() as usize - base;
            let name = crate::http1::set_line(lines, i, h.name.as_bytes(), at..at + h.value.len())
                .ok_or(BadHead("invalid header name"))?;
            framed_by.note(name, h.value);
        }
        lines.truncate(resp.headers.len());
        let bytes = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(lines.len() + ROOM);
        // SAFETY: `lines` are the fields httparse parsed out of these bytes (their ranges from
        // `base`, the start of `bytes`).
        unsafe { crate::http1::append_lines(lines, &bytes, &mut headers) };
        return frame(status, version, headers, framed_by, head_request).map(Some);
    }
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
    fn note(&mut self, name: &HeaderName, value: &[u8]) {
        self.connection |= name == CONNECTION;
        self.transfer_encoding |= name == TRANSFER_ENCODING;
        if name == CONTENT_LENGTH {
            self.length = Some(match self.length {
                Some(Err(e)) => Err(e),
                Some(Ok(n)) => length_of(value, Some(n)),
                None => length_of(value, None),
            });
        }
    }
}

/// Where the body of a response with these headers ends (RFC 9112 §6.3), and whether the
/// connection outlives it.
fn frame(
    status: StatusCode,
    version: Version,
    mut headers: HeaderMap,
    seen: Seen,
    head_request: bool,
) -> Result<Head, BadHead> {
    let mut reusable = version == Version::HTTP_11
        && !(seen.connection
            && headers
                .get_all(CONNECTION)
                .iter()
                .any(|v| has_token(v.as_bytes(), b"close")));
    let framing =
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            Framing::Empty
        } else if seen.transfer_encoding {
            if version != Version::HTTP_11 {
                return Err(BadHead("Transfer-Encoding in an HTTP/1.0 response"));
            }
            // With a Content-Length too, the coding wins (the length is not passed on: a message
            // must not carry both) and the connection ends with the body.
            if seen.length.is_some() && headers.remove(CONTENT_LENGTH).is_some() {
                reusable = false;
            }
            let last = headers.get_all(TRANSFER_ENCODING).iter().next_back();
            let codings = last.map(|v| v.as_bytes()).unwrap_or_default();
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
    Ok(Head {
        status,
        version,
        headers,
        framing,
        reusable,
    })
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

/// A chunked body's framing, read a byte at a time between its data (RFC 9112 §7.1), to its
/// last chunk; chunk extensions are skipped. The trailer section after it is read whole by
/// [`parse_trailers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunked {
    state: Chunk,
    /// Bytes of the current size line's extensions so far.
    extra: usize,
    max_extra: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// In the chunk size's hex digits: how many, and the size so far.
    Size(u8, u64),
    /// After the size, in its extensions, to the CR.
    Ext(u64),
    /// After the size line's CR.
    SizeLf(u64),
    /// In the chunk's data: bytes to come.
    Data(u64),
    DataCr,
    DataLf,
    /// The last chunk was read.
    Last,
}

/// What comes next in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The input's framing was read; more is needed.
    More,
    /// This many bytes of data are at the front of the rest of the input.
    Data(usize),
    /// The last chunk was read: the trailer section comes next ([`parse_trailers`]).
    Trailers,
}

/// A chunked body out of grammar (or a size line or trailer section past the bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadChunk;

impl Chunked {
    /// `max_extra`: bytes a size line's extensions may take.
    pub fn new(max_extra: usize) -> Chunked {
        Chunked {
            state: Chunk::Size(0, 0),
            extra: 0,
            max_extra,
        }
    }

    /// The bound on a size line's extensions (the trailer section takes the same).
    pub fn max_extra(&self) -> usize {
        self.max_extra
    }

    /// Reads framing from the front of `input`: how many bytes it took, and what follows them.
    /// After `Next::Data(n)` the caller takes those `n` bytes before calling again.
    pub fn next(&mut self, input: &[u8]) -> Result<(usize, Next), BadChunk> {
        let mut i = 0;
        loop {
            match self.state {
                Chunk::Data(left) => {
                    let n = (input.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    if n == 0 {
                        return Ok((i, Next::More));
                    }
                    self.state = match left - n as u64 {
                        0 => Chunk::DataCr,
                        rest => Chunk::Data(rest),
                    };
                    return Ok((i, Next::Data(n)));
                }
                Chunk::Last => return Ok((i, Next::Trailers)),
                _ => {}
            }
            let Some(&b) = input.get(i) else {
                return Ok((i, Next::More));
            };
            i += 1;
            self.state = self.byte(b)?;
        }
    }

    fn byte(&mut self, b: u8) -> Result<Chunk, BadChunk> {
        let state = match (self.state, b) {
            (Chunk::Size(digits, size), _) if b.is_ascii_hexdigit() => {
                // 16 hex digits fill a u64; more is no size a body can have.
                if digits == 16 {
                    return Err(BadChunk);
                }
                let d = (b as char).to_digit(16).unwrap_or(0);
                Chunk::Size(digits + 1, size << 4 | u64::from(d))
            }
            (Chunk::Size(1.., size), b';' | b' ' | b'\t') => {
                self.extra = 1;
                Chunk::Ext(size)
            }
            (Chunk::Size(1.., size) | Chunk::Ext(size), b'\r') => Chunk::SizeLf(size),
            (Chunk::Ext(size), _) if b != b'\n' => {
                self.extra += 1;
                if self.extra > self.max_extra {
                    return Err(BadChunk);
                }
                Chunk::Ext(size)
            }
            (Chunk::SizeLf(0), b'\n') => Chunk::Last,
            (Chunk::SizeLf(size), b'\n') => Chunk::Data(size),
            (Chunk::DataCr, b'\r') => Chunk::DataLf,
            (Chunk::DataLf, b'\n') => Chunk::Size(0, 0),
            _ => return Err(BadChunk),
        };
        Ok(state)
    }
}

/// Reads a chunked body's trailer section and the blank line that ends it from the front of
/// `buf`, taking them off it. `Ok(None)`: not whole yet.
pub fn parse_trailers(buf: &mut BytesMut, max_bytes: usize) -> Result<Option<HeaderMap>, BadChunk> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (len, fields) = match httparse::parse_headers(buf, &mut lines) {
        Ok(httparse::Status::Complete((len, _))) if len > max_bytes => return Err(BadChunk),
        Ok(httparse::Status::Complete(done)) => done,
        Ok(httparse::Status::Partial) if buf.len() > max_bytes => return Err(BadChunk),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadChunk),
    };
    let mut trailers = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| BadChunk)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| BadChunk)?;
        trailers.append(name, value);
    }
    let _ = buf.split_to(len);
    Ok(Some(trailers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(bytes: &[u8]) -> BytesMut {
        BytesMut::from(bytes)
    }

    fn head(text: &str) -> Result<Option<Head>, BadHead> {
        parse_response(&mut buf(text.as_bytes()), false, 8192, &mut Vec::new())
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
        encode_request(&Method::POST, "/", &host, &headers, &NewA, &mut out);
        assert_eq!(
            out,
            b"POST / HTTP/1.1\r\nhost: up:8080\r\nx-b: 3\r\nx-a: new\r\n\r\n"
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
        let h = parse_response(&mut b, true, 8192, &mut Vec::new())
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Empty);
    }

    #[test]
    fn informational_heads_are_read_past_and_the_body_stays() {
        let mut b = buf(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        );
        let h = parse_response(&mut b, false, 8192, &mut Vec::new())
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::CREATED);
        assert_eq!(&b[..], b"ok");
    }

    #[test]
    fn a_connections_heads_reuse_its_last_names_only_where_they_are_the_same() {
        let mut lines = Vec::new();
        let mut read = |text: &str| {
            let h = parse_response(&mut buf(text.as_bytes()), false, 8192, &mut lines);
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
