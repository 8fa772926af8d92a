//! framing: where a request's body ends, decided from its head's fields as RFC 9112 §6 says, or
//! why the request is refused; and a chunked body's grammar (§7.1), read a byte at a time.
//!
//! One decision for every way a request is read: the own HTTP/1.1 server reads each head it sees
//! with [`RequestFraming`]; a request read by hyper's server (after a hand-off) is looked at
//! again by admission with the same rules over its map, and hyper's own reading is stricter than
//! or equal to these (it refuses a coding list not ending in `chunked`, differing lengths, any
//! coding in HTTP/1.0). The upstream exchange reads response bodies with the same [`Chunked`].
//! The choices where the RFC leaves one (refuse, never repair) are in docs/semantics.md.
//!
//! No I/O here.

use http::StatusCode;

/// How long a request's body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// This many bytes (`Content-Length`; 0 without one).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Why a request is refused before anything of it is sent on: its status and a sentence for
/// the problem detail. The connection closes after the answer (the framing of what follows is
/// unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub why: &'static str,
}

impl Refusal {
    const fn bad(why: &'static str) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            why,
        }
    }
}

/// The fields of one request head that frame its body, noted as its lines come.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestFraming {
    /// `Content-Length` lines seen (counted to two).
    lengths: u8,
    /// The first one's number; `None` when it is not one (or none came).
    length: Option<u64>,
    /// Whether any `Transfer-Encoding` line came.
    coded: bool,
    codings: Codings,
}

/// What a request's `Transfer-Encoding` lines list, all lines read as one list (RFC 9110 §5.3).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Codings {
    /// `chunked` listed (counted to two).
    chunked: u8,
    /// The last coding listed is `chunked`.
    last_chunked: bool,
    /// A coding other than `chunked` is listed (with or without parameters).
    other: bool,
    /// A member is not a token (with parameters), or nothing is listed.
    malformed: bool,
}

impl RequestFraming {
    /// A `Content-Length` line's value.
    #[inline]
    pub fn content_length(&mut self, value: &[u8]) {
        self.lengths = self.lengths.saturating_add(1).min(2);
        if self.lengths == 1 {
            self.length = crate::server::http1::plain_number(value);
        }
    }

    /// A `Transfer-Encoding` line's value.
    pub fn transfer_encoding(&mut self, value: &[u8]) {
        self.coded = true;
        let c = &mut self.codings;
        for member in value.split(|&b| b == b',') {
            let member = member.trim_ascii();
            // Empty members are allowed and not counted (RFC 9110 §5.6.1).
            if member.is_empty() {
                continue;
            }
            let (name, params) = match member.iter().position(|&b| b == b';') {
                Some(i) => (member[..i].trim_ascii(), Some(&member[i + 1..])),
                None => (member, None),
            };
            if name.is_empty()
                || !name.iter().all(|&b| is_tchar(b))
                || params.is_some_and(|p| !valid_parameters(p))
            {
                c.malformed = true;
            }
            // `chunked` takes no parameters (RFC 9112 §7): one with them is a coding unknown here.
            let chunked = name.eq_ignore_ascii_case(b"chunked") && params.is_none();
            if chunked {
                c.chunked = c.chunked.saturating_add(1).min(2);
            } else {
                c.other = true;
            }
            c.last_chunked = chunked;
        }
    }

    /// Whether a `Transfer-Encoding` line came.
    pub fn coded(&self) -> bool {
        self.coded
    }

    /// The body's length, or why the request is refused. `http11`: the request is HTTP/1.1
    /// (else 1.0).
    pub fn decide(&self, http11: bool) -> Result<BodyLength, Refusal> {
        if self.coded {
            let c = &self.codings;
            return if !http11 {
                // RFC 9112 §6.1: framing faulty, even with a Content-Length.
                Err(Refusal::bad("Transfer-Encoding in an HTTP/1.0 request"))
            } else if self.lengths > 0 {
                // RFC 9112 §6.1: allowed to be read chunked, but "ought to be handled as an
                // error": the smuggling families CL.TE and TE.CL start here.
                Err(Refusal::bad(
                    "a request with both Content-Length and Transfer-Encoding",
                ))
            } else if c.malformed || c.chunked == 0 && !c.other {
                Err(Refusal::bad("an invalid Transfer-Encoding"))
            } else if !c.last_chunked {
                // RFC 9112 §6.3 (4): the length cannot be told; a server MUST answer 400.
                Err(Refusal::bad(
                    "a Transfer-Encoding whose last coding is not chunked",
                ))
            } else if c.chunked > 1 {
                // RFC 9112 §7: chunked is applied once at most.
                Err(Refusal::bad("a Transfer-Encoding that lists chunked twice"))
            } else if c.other {
                // RFC 9112 §6.1: a coding the server does not know, 501. The gateway decodes
                // none but chunked, and would otherwise pass on a body it cannot frame.
                Err(Refusal {
                    status: StatusCode::NOT_IMPLEMENTED,
                    why: "a transfer coding other than chunked",
                })
            } else {
                Ok(BodyLength::Chunked)
            };
        }
        match (self.lengths, self.length) {
            (0, _) => Ok(BodyLength::Length(0)),
            // RFC 9110 §8.6: several lengths (or a list) are refused, not merged.
            (2.., _) => Err(Refusal::bad("more than one Content-Length")),
            (_, Some(n)) => Ok(BodyLength::Length(n)),
            // RFC 9112 §6.3 (5): an invalid length is an unrecoverable error.
            (_, None) => Err(Refusal::bad("an invalid Content-Length")),
        }
    }
}

/// Whether `params` (what follows a coding's first `;`) are `name=value` pairs, each value a
/// token or a quoted string (RFC 9112 §7: transfer-parameter; RFC 9110 §5.6.4). A `;` or `,`
/// inside a quoted string is not read as one (a coding with one is refused as malformed).
fn valid_parameters(params: &[u8]) -> bool {
    params.split(|&b| b == b';').all(|p| {
        let Some(eq) = p.iter().position(|&b| b == b'=') else {
            return false;
        };
        let (name, value) = (p[..eq].trim_ascii(), p[eq + 1..].trim_ascii());
        let token = |t: &[u8]| !t.is_empty() && t.iter().all(|&b| is_tchar(b));
        token(name) && (token(value) || quoted_string(value))
    })
}

/// `DQUOTE *( qdtext / quoted-pair ) DQUOTE` (RFC 9110 §5.6.4).
fn quoted_string(v: &[u8]) -> bool {
    let Some(inner) = v.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")) else {
        return false;
    };
    let text = |b: u8| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80;
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e) if text(e) => {}
                _ => return false,
            },
            b'"' => return false,
            _ if text(b) => {}
            _ => return false,
        }
    }
    true
}

/// A `tchar` (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// What each byte may be in a `Host` value: 1, in a reg-name (unreserved, sub-delims; `%` is
/// checked apart); 2, inside an IP-literal's brackets (RFC 3986 §3.2.2). A table: a request's
/// Host is looked at on every request, a byte at a time.
const HOST_BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() {
            t[b] = 1 | 2;
        }
        b += 1;
    }
    let (reg, literal) = (b"-._~!$&'()*+,;=", b":");
    let mut i = 0;
    while i < reg.len() {
        t[reg[i] as usize] = 1 | 2;
        i += 1;
    }
    t[literal[0] as usize] = 2;
    t
};

/// Whether `value` is a valid `Host` field value (RFC 9110 §7.2: `uri-host [ ":" port ]`, as RFC
/// 3986 spells them; empty is allowed for a target without an authority, RFC 9112 §3.2).
pub fn valid_host(value: &[u8]) -> bool {
    let port = if let Some(inside) = value.strip_prefix(b"[") {
        // IP-literal: an IPv6 address or IPvFuture, bracketed.
        let Some(end) = inside.iter().position(|&b| b == b']') else {
            return false;
        };
        if end == 0
            || !inside[..end]
                .iter()
                .all(|&b| HOST_BYTES[b as usize] & 2 != 0)
        {
            return false;
        }
        &inside[end + 1..]
    } else {
        // reg-name (an IPv4 address is one too): its bytes, and `%` with two hex digits.
        let mut rest = value;
        loop {
            let i = rest
                .iter()
                .position(|&b| HOST_BYTES[b as usize] & 1 == 0)
                .unwrap_or(rest.len());
            rest = &rest[i..];
            match rest {
                [b'%', a, b, more @ ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => {
                    rest = more;
                }
                _ => break rest,
            }
        }
    };
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// [`valid_host`], remembered: the last value found valid on this thread is known valid again
/// without reading its bytes one by one. A request's Host is looked at on every request, and a
/// worker's requests mostly name one host; read a byte at a time, `127.0.0.1:8080` cost ~100
/// instructions a request (callgrind), compared whole ~25 (docs/architecture.md). Held equal to
/// `valid_host` by `the_memo_answers_as_the_host_rules_do`.
pub fn valid_host_remembered(value: &[u8]) -> bool {
    use std::cell::Cell;
    /// Values longer are not remembered (a host name of more than 40 bytes is rare).
    const KEPT: usize = 40;
    thread_local! {
        static LAST: Cell<(u8, [u8; KEPT])> = const { Cell::new((0, [0; KEPT])) };
    }
    if value.is_empty() || value.len() > KEPT {
        return valid_host(value);
    }
    let (len, bytes) = LAST.get();
    if usize::from(len) == value.len() && bytes[..value.len()] == *value {
        return true;
    }
    let valid = valid_host(value);
    if valid {
        let mut bytes = [0; KEPT];
        bytes[..value.len()].copy_from_slice(value);
        LAST.set((value.len() as u8, bytes));
    }
    valid
}

/// A chunked body's framing, read a byte at a time between its data (RFC 9112 §7.1), to its
/// last chunk. Extensions are skipped, but only bytes their grammar allows pass (no control
/// byte, no bare LF; a size line ends with CRLF). The trailer section after the last chunk is
/// read whole by [`parse_trailers`].
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
    /// After the size, whitespace before an extension's `;` (RFC 9112 §7.1.1: BWS).
    ExtSpace(u64),
    /// After a `;`, in the extensions, to the CR.
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
            (Chunk::Size(1.., size) | Chunk::ExtSpace(size), b' ' | b'\t') => {
                self.grow()?;
                Chunk::ExtSpace(size)
            }
            (Chunk::Size(1.., size) | Chunk::ExtSpace(size), b';') => {
                self.grow()?;
                Chunk::Ext(size)
            }
            (Chunk::Size(1.., size) | Chunk::Ext(size), b'\r') => Chunk::SizeLf(size),
            // An extension's names, values and quoted strings: visible bytes, space, tab and
            // obs-text (RFC 9110 §5.6), never a control byte.
            (Chunk::Ext(size), _) if b == b'\t' || b >= b' ' && b != 0x7f => {
                self.grow()?;
                Chunk::Ext(size)
            }
            (Chunk::SizeLf(0), b'\n') => Chunk::Last,
            (Chunk::SizeLf(size), b'\n') => {
                self.extra = 0;
                Chunk::Data(size)
            }
            (Chunk::DataCr, b'\r') => Chunk::DataLf,
            (Chunk::DataLf, b'\n') => Chunk::Size(0, 0),
            _ => return Err(BadChunk),
        };
        Ok(state)
    }

    fn grow(&mut self) -> Result<(), BadChunk> {
        self.extra += 1;
        if self.extra > self.max_extra {
            return Err(BadChunk);
        }
        Ok(())
    }
}

/// Header lines a trailer section may have at most.
const MAX_TRAILERS: usize = 100;

/// The trailer section and blank line at the front of `buf`: its length in bytes and how many
/// fields it has. `Ok(None)`: not whole yet (and within `max_bytes`).
pub fn trailer_section(buf: &[u8], max_bytes: usize) -> Result<Option<(usize, usize)>, BadChunk> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_TRAILERS];
    match httparse::parse_headers(buf, &mut lines) {
        Ok(httparse::Status::Complete((len, _))) if len > max_bytes => Err(BadChunk),
        Ok(httparse::Status::Complete((len, fields))) => Ok(Some((len, fields.len()))),
        Ok(httparse::Status::Partial) if buf.len() > max_bytes => Err(BadChunk),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(BadChunk),
    }
}

/// Reads a chunked body's trailer section and the blank line that ends it from the front of
/// `buf`, taking them off it. `Ok(None)`: not whole yet.
pub fn parse_trailers(
    buf: &mut bytes::BytesMut,
    max_bytes: usize,
) -> Result<Option<http::HeaderMap>, BadChunk> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_TRAILERS];
    let (len, fields) = match httparse::parse_headers(buf, &mut lines) {
        Ok(httparse::Status::Complete((len, _))) if len > max_bytes => return Err(BadChunk),
        Ok(httparse::Status::Complete(done)) => done,
        Ok(httparse::Status::Partial) if buf.len() > max_bytes => return Err(BadChunk),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadChunk),
    };
    let mut trailers = http::HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = http::HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| BadChunk)?;
        let value = http::HeaderValue::from_bytes(f.value).map_err(|_| BadChunk)?;
        trailers.append(name, value);
    }
    let _ = buf.split_to(len);
    Ok(Some(trailers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(lines: &[(&str, &str)], http11: bool) -> Result<BodyLength, Refusal> {
        let mut f = RequestFraming::default();
        for (name, value) in lines {
            match *name {
                "cl" => f.content_length(value.as_bytes()),
                _ => f.transfer_encoding(value.as_bytes()),
            }
        }
        f.decide(http11)
    }

    #[test]
    fn a_request_is_framed_by_one_length_or_a_lone_chunked() {
        use BodyLength::*;
        assert_eq!(framing(&[], true), Ok(Length(0)));
        assert_eq!(framing(&[("cl", "5")], true), Ok(Length(5)));
        assert_eq!(framing(&[("cl", "005")], false), Ok(Length(5)));
        for te in ["chunked", "Chunked", " chunked ", ", chunked", "chunked,"] {
            assert_eq!(framing(&[("te", te)], true), Ok(Chunked), "{te:?}");
        }
        assert_eq!(framing(&[("te", ""), ("te", "chunked")], true), Ok(Chunked));
    }

    #[test]
    fn framing_the_rfc_forbids_or_leaves_unsafe_is_refused() {
        let status = |lines: &[(&str, &str)], http11| framing(lines, http11).map_err(|r| r.status);
        let (bad, not_implemented) = (StatusCode::BAD_REQUEST, StatusCode::NOT_IMPLEMENTED);
        for cl in [
            "",
            "-5",
            "+5",
            "5 ",
            "5,5",
            "0x5",
            "5.0",
            "99999999999999999999",
            "1 2",
        ] {
            assert_eq!(status(&[("cl", cl)], true), Err(bad), "{cl:?}");
        }
        assert_eq!(status(&[("cl", "5"), ("cl", "5")], true), Err(bad));
        assert_eq!(status(&[("cl", "5"), ("cl", "6")], true), Err(bad));
        // CL.TE and TE.CL, whichever comes first.
        assert_eq!(status(&[("cl", "5"), ("te", "chunked")], true), Err(bad));
        assert_eq!(status(&[("te", "chunked"), ("cl", "5")], true), Err(bad));
        assert_eq!(status(&[("te", "chunked")], false), Err(bad));
        for te in [
            "",
            " ",
            "gzip",
            "chunked, gzip",
            "chunked,chunked",
            "chunked\x0b",
            "chu nked",
            "chunked;q=1",
            "x;a, chunked",
            "x;=b, chunked",
            "x;a=\"b, chunked",
            "x;a=b c, chunked",
            "x;a=\"b;\", chunked",
        ] {
            assert_eq!(status(&[("te", te)], true), Err(bad), "{te:?}");
        }
        assert_eq!(
            status(&[("te", "chunked"), ("te", "chunked")], true),
            Err(bad)
        );
        assert_eq!(status(&[("te", "chunked"), ("te", "gzip")], true), Err(bad));
        for te in [
            "deflate, chunked",
            "x, chunked",
            "gzip;a=b, chunked",
            "x; a = \"b c\" ,chunked",
        ] {
            assert_eq!(status(&[("te", te)], true), Err(not_implemented), "{te:?}");
        }
        assert_eq!(
            status(&[("te", "identity"), ("te", "chunked")], true),
            Err(not_implemented)
        );
    }

    #[test]
    fn a_host_is_a_uri_host_and_an_optional_port() {
        for ok in [
            "",
            "a",
            "a.test",
            "a.test:8080",
            "a.test:",
            "10.0.0.1:80",
            "[::1]",
            "[::1]:443",
            "[v1.x]",
            "a%41b",
            "xn--bcher-kva.test",
            "a_b",
            "a!$&'()*+,;=b",
        ] {
            assert!(valid_host(ok.as_bytes()), "{ok:?}");
        }
        for bad in [
            "a b", "a\tb", "a/b", "a?b", "a#b", "a@b", "user@a", "a:b", "a:80:80", "[::1", "[]",
            "[::1]x", "[::1]:x", "a%4", "a%zz", "\"a\"", "a\\b", "a\u{e9}",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn the_memo_answers_as_the_host_rules_do() {
        let alphabet = b"a1.:-%4F[]@ /_~v";
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let len = (rng % 45) as usize;
            let value: Vec<u8> = (0..len)
                .map(|i| alphabet[((rng >> (i % 60)) as usize + i * 7) % alphabet.len()])
                .collect();
            // Twice: the second may be answered from the memo.
            for _ in 0..2 {
                assert_eq!(
                    valid_host_remembered(&value),
                    valid_host(&value),
                    "{value:?}"
                );
            }
        }
        for v in ["a.test", "a b", "a.test", "[::1]:80", "a.test:x"] {
            assert_eq!(
                valid_host_remembered(v.as_bytes()),
                valid_host(v.as_bytes()),
                "{v}"
            );
        }
    }

    /// The data of a chunked `body` fed in pieces of `step` bytes, and whether the last chunk
    /// came.
    fn dechunk(body: &[u8], step: usize) -> Result<(Vec<u8>, bool), BadChunk> {
        let mut chunked = Chunked::new(64);
        let (mut data, mut pending) = (Vec::new(), Vec::new());
        for piece in body.chunks(step) {
            pending.extend_from_slice(piece);
            loop {
                let (used, next) = chunked.next(&pending)?;
                pending.drain(..used);
                match next {
                    Next::More => break,
                    Next::Data(n) => data.extend(pending.drain(..n)),
                    Next::Trailers => return Ok((data, true)),
                }
            }
        }
        Ok((data, false))
    }

    #[test]
    fn a_chunked_body_is_read_to_its_grammar_in_any_split() {
        let good: &[(&str, &str)] = &[
            ("5\r\nhello\r\n0\r\n", "hello"),
            ("5;a=b\r\nhello\r\n0;x\r\n", "hello"),
            ("5 ; a = \"q;\\\"\"\r\nhello\r\n000\r\n", "hello"),
            ("A\r\n0123456789\r\n0\r\n", "0123456789"),
        ];
        for (body, data) in good {
            for step in [1, 2, 7, 100] {
                assert_eq!(
                    dechunk(body.as_bytes(), step),
                    Ok((data.as_bytes().to_vec(), true)),
                    "{body:?}"
                );
            }
        }
        let bad = [
            "3\r\nhello\r\n0\r\n", // longer data than its size
            "5\r\nABCDE0\r\n",     // no CRLF after the data
            "5\nhello\n0\n",       // bare LF
            "5 x\r\nhello\r\n0\r\n",
            "5;\x00\r\nhello\r\n0\r\n",
            "5;a\nb\r\nhello\r\n0\r\n",
            "-5\r\n",
            "0x5\r\n",
            "\r\n",
            "11111111111111111\r\n",
        ];
        for body in bad {
            assert_eq!(dechunk(body.as_bytes(), 1), Err(BadChunk), "{body:?}");
        }
        // Extensions past the bound.
        let long = format!("5;{}\r\nhello\r\n0\r\n", "a".repeat(64));
        assert_eq!(dechunk(long.as_bytes(), 5), Err(BadChunk));
    }
}
