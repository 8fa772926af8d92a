//! h1: the gateway's own HTTP/1.1 server for the common request, with hyper's for the rest.
//!
//! Why: hyper's HTTP/1 server costs about a third of a proxied request's instructions (its
//! dispatcher, its body channel, its encoder: docs/benchmarks/, "The gateway's own HTTP/1.1
//! server"). Most API requests are plain: HTTP/1.1, no body or a small one (of known length, or
//! chunked), no upgrade, no `Expect` but `100-continue`. Those are read and answered here; the
//! first request that is anything else (or that does not parse) hands the connection, with every
//! byte read so far, to hyper's server, which serves it from then on, answering errors as it
//! always did. Every head read here is framed first ([`super::framing`]): a framing refused is
//! answered here, and the connection closed, whoever would have served the request, so what
//! hyper is handed frames its messages as this server would, and the request-smuggling surface
//! is no wider than hyper's alone (narrower: docs/semantics.md, "Framing at the edge").
//!
//! The rules kept from hyper: keep-alive unless the client or the handler says `close` (then the
//! answer says `connection: close`); a `date` header; the body framed by its known length, else
//! chunked; no body on `HEAD`, 204 and 304; a client that closes before its answer drops the
//! handler's future (nothing is forwarded for a client that is gone). One differs: a request's
//! `Connection: close` or `keep-alive` is acted on here and not handed to the handler in the
//! request's map (it is hop-by-hop; hyper hands it on).

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use http::header;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{RequestBody, cold};

/// The largest request body read whole here, in bytes (64 KiB; the proxy's
/// `outgoing::WHOLE_MAX` is this one): a longer one is hyper's, which streams it.
pub const BODY_MAX: u64 = 64 * 1024;

/// Header lines a request read here may have (hyper's default): one with more (up to
/// `server.max_headers`) is hyper's.
const MAX_HEADERS: usize = 100;

/// The longest request target (hyper's limit): longer is hyper's to refuse (414).
const MAX_URI: usize = u16::MAX as usize - 1;

/// What a connection's buffered bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A request served here: its head is `len` bytes; its header lines are in the `lines` given.
    Own(Head),
    /// A request for hyper's server (or bytes that are not a request: hyper answers them).
    Hyper,
    /// A request whose framing is refused ([`framing`](super::framing)): answered here, and the
    /// connection closes.
    Refused(Refusal),
}

/// A request head read here.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    /// The head's length in bytes, its blank line included.
    pub len: usize,
    pub method: Method,
    /// Where the request target is in the head.
    pub target: Range<usize>,
    /// The body's length: `Content-Length` (0 without one), or chunked.
    pub body: BodyLength,
    /// The client asked to close after this request (`Connection: close`).
    pub close: bool,
    /// The line of the head's one `Connection` field, when it says only `close` or
    /// `keep-alive`: this server acts on it, and the request's map goes without it.
    pub connection: Option<usize>,
    /// The client waits for `100 Continue` before it sends the body (`Expect: 100-continue`).
    pub expect_continue: bool,
}

use crate::server::framing::{BodyLength, Chunked, Next, Refusal, RequestFraming};
use crate::server::http1::{KEPT_ROOM, has_token, plain_number};
pub use crate::server::http1::{Line, Lines};
use crate::server::passed::{Passed, Passes};
use crate::server::shelf::{Kept, Shelf};

/// A field named `close`: `Connection: close` makes it hop-by-hop.
static CLOSE: http::HeaderName = http::HeaderName::from_static("close");

/// Reads the request head at the start of `buf`, if it is whole; its header lines go to `lines`
/// (which hold the connection's last request's, reused where written the same). `max_head`
/// bounds a head's length, `max_headers` its lines (more than [`MAX_HEADERS`] is hyper's).
///
/// Every head whose lines are read is framed here ([`RequestFraming`]), whoever serves it: a
/// framing refused is [`Parsed::Refused`] even where hyper's server would have read it (two
/// equal lengths, a length and a coding, a coding but chunked), so what hyper is handed frames
/// its message as this server would.
pub fn parse(buf: &[u8], max_head: usize, max_headers: usize, lines: &mut Lines) -> Parsed {
    let mut headers =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Parsed::Partial,
        _ => return Parsed::Hyper,
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parsed::Hyper;
    };
    if len > max_head || target.len() > MAX_URI || req.headers.len() > max_headers {
        return Parsed::Hyper;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Hyper;
    };
    // Read here, but served by hyper's server once the framing is known to be sound.
    let mut hypers = version != 1 || method == Method::CONNECT;
    let start = buf.as_ptr() as usize;
    let at = |s: &[u8]| {
        let from = s.as_ptr() as usize - start;
        from..from + s.len()
    };
    let (mut framing, mut close, mut expect_continue) = (RequestFraming::default(), false, false);
    // The `Connection` line (`None` inside: more than one), and whether a field is named `close`.
    let (mut connection, mut named_close) = (None, false);
    for (i, h) in req.headers.iter().enumerate() {
        let line = at(h.name.as_bytes()).start;
        let Some(line) =
            crate::server::http1::set_line(lines, i, h.name.as_bytes(), line, at(h.value))
        else {
            return Parsed::Hyper;
        };
        let name = &line.name;
        match *name {
            header::CONTENT_LENGTH => framing.content_length(h.value),
            header::TRANSFER_ENCODING => framing.transfer_encoding(h.value),
            header::CONNECTION => {
                if h.value.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                    // `upgrade`, or a list: hyper's.
                    hypers = true;
                }
                connection = match connection {
                    None => Some(Some(i)),
                    Some(_) => Some(None),
                };
            }
            // `100-continue` is answered here before the body is read; another expectation is
            // hyper's (which ignores it).
            header::EXPECT if h.value.eq_ignore_ascii_case(b"100-continue") => {
                expect_continue = true;
            }
            header::UPGRADE | header::EXPECT | header::TE => hypers = true,
            _ => named_close |= *name == CLOSE,
        }
    }
    lines.truncate(req.headers.len());
    let body = match framing.decide(version == 1) {
        Ok(body) => body,
        Err(refusal) => return Parsed::Refused(refusal),
    };
    if hypers || matches!(body, BodyLength::Length(n) if n > BODY_MAX) {
        return Parsed::Hyper;
    }
    Parsed::Own(Head {
        len,
        method,
        target: at(target.as_bytes()),
        body,
        close,
        // A field named `close` is hop-by-hop once `Connection: close` names it: with the line
        // kept, the proxy removes both.
        connection: connection.flatten().filter(|_| !named_close),
        expect_continue: expect_continue && body != BodyLength::Length(0),
    })
}

/// How a response's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes (`content-length`; 0 also where no body may be sent).
    Length(u64),
    Chunked,
}

/// What [`encode_head`] needs of a response's body.
#[derive(Debug, Clone, Copy)]
pub struct BodyHint {
    /// It has ended already (no bytes).
    pub ended: bool,
    /// Its length, when known.
    pub exact: Option<u64>,
}

/// Writes a response's head to `out` (hyper's rules, above), its `headers` then the lines
/// `written` (`super::Written`): the framing of its body, and whether the connection closes
/// after it (`keep` false, or the handler's `Connection: close`).
#[allow(
    clippy::too_many_arguments,
    reason = "each is one part of the head; a struct would only name them again"
)]
pub fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    written: &super::Written,
    body: BodyHint,
    head_request: bool,
    keep: bool,
    date: &[u8],
) -> (Framing, bool) {
    let may_have_body =
        !(head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED);
    let may_have_length = !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let (mut close, mut said_close, mut dated) = (!keep, false, written.dated());
    let mut given_length = None;
    for (name, value) in headers {
        match *name {
            header::CONTENT_LENGTH => {
                given_length = given_length.or(Some(value));
                continue;
            }
            // Framing is the body's, decided below.
            header::TRANSFER_ENCODING => continue,
            header::CONNECTION if has_token(value.as_bytes(), b"close") => {
                (close, said_close) = (true, true);
            }
            header::DATE => dated = true,
            _ => {}
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(written.as_bytes());
    let length = if body.ended {
        Some(0)
    } else {
        body.exact
            .or_else(|| given_length.and_then(|v| plain_number(v.as_bytes())))
    };
    let framing = match length {
        // A HEAD's answer tells the length a GET's would have, as the handler wrote it.
        _ if head_request => {
            if let Some(v) = given_length {
                write_length(out, v.as_bytes());
            } else if let Some(n) = length.filter(|&n| n > 0) {
                write_length(out, itoa::Buffer::new().format(n).as_bytes());
            }
            Framing::Length(0)
        }
        _ if !may_have_length => Framing::Length(0),
        Some(n) => {
            write_length(out, itoa::Buffer::new().format(n).as_bytes());
            Framing::Length(n)
        }
        None if may_have_body => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
        None => Framing::Length(0),
    };
    if close && !said_close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let framing = if may_have_body {
        framing
    } else {
        Framing::Length(0)
    };
    (framing, close)
}

fn write_length(out: &mut Vec<u8>, n: &[u8]) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(n);
    out.extend_from_slice(b"\r\n");
}

/// Today's `date` header value, made once a second per thread.
fn date() -> [u8; 29] {
    thread_local! {
        static DATE: std::cell::Cell<(u64, [u8; 29])> = const { std::cell::Cell::new((0, [0; 29])) };
    }
    // The kernel's tick-updated clock: a second's field does not show a tick (src/coarse.rs).
    let secs = crate::server::coarse::unix_seconds();
    DATE.with(|d| {
        let (at, v) = d.get();
        if at == secs && at != 0 {
            return v;
        }
        let mut v = [b' '; 29];
        let s = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        let n = s.len().min(29);
        v[..n].copy_from_slice(&s.as_bytes()[..n]);
        d.set((secs, v));
        v
    })
}

/// How a connection left this server.
pub enum End<I> {
    /// It is closed (or to be dropped).
    Closed,
    /// hyper's server serves it from here: these bytes were read and not used.
    Hyper(BytesMut, I),
}

/// What serving needs of a connection besides its socket.
pub struct Conn<'a, H> {
    pub handler: &'a H,
    pub peer: SocketAddr,
    pub activity: &'a std::sync::Arc<super::idle::Activity>,
    /// `server.max_header_bytes` (at least 8 KiB).
    pub max_head: usize,
    /// `server.max_headers`.
    pub max_headers: usize,
    /// Fields the handler hands on unread ([`HttpSettings::passes`](super::HttpSettings)).
    pub passes: Option<&'a Passes>,
}

/// Serves HTTP/1.1 requests on `io` (whose first bytes, already read, are `buf`) until it
/// closes, `drain` completes between requests, or a request is hyper's ([`End::Hyper`]; `drain`
/// has not completed then).
pub async fn serve<I, H, F, A, B, D>(
    mut io: I,
    mut buf: BytesMut,
    conn: Conn<'_, H>,
    mut drain: Pin<&mut D>,
) -> End<I>
where
    I: AsyncRead + AsyncWrite + Unpin + Send,
    H: Fn(SocketAddr, Request<RequestBody>) -> F,
    F: Future<Output = A>,
    A: super::Answer<Body = B>,
    B: Body,
    B::Data: Buf,
    D: Future,
{
    // The lines come with a first head's read: those a connection of this worker gave back,
    // with the names its clients' fields had (a new connection makes none, ~1,500 instructions).
    let mut r = Reading::new(std::mem::take(&mut buf));
    let mut draining = false;
    loop {
        let head = loop {
            if !r.buf().is_empty() {
                let p = r.parts();
                match parse(&p.buf, conn.max_head, conn.max_headers, &mut p.lines) {
                    Parsed::Own(head) => break head,
                    Parsed::Hyper if draining => return End::Closed,
                    Parsed::Hyper => return End::Hyper(r.take_buf(), io),
                    Parsed::Refused(refusal) => {
                        return cold::apart(|| refuse(&mut io, refusal)).await;
                    }
                    Parsed::Partial => {}
                }
            }
            let read = if draining {
                r.read(&mut io, READ, Probe::Once).await
            } else {
                tokio::select! {
                    biased;
                    read = r.read(&mut io, READ, Probe::Once) => read,
                    _ = drain.as_mut() => {
                        // Idle: nothing to finish. Within a head: answer it, then close.
                        draining = true;
                        if r.buf().is_empty() {
                            return End::Closed;
                        }
                        continue;
                    }
                }
            };
            match read {
                Ok(0) => {
                    conn.activity.close_quietly();
                    return End::Closed;
                }
                Ok(_) => {}
                Err(_) => return End::Closed,
            }
        };
        // Boxed: a request's state (the handler's future, the answer being written) is
        // kilobytes, held while the request is, not by the connection between requests.
        let exchange =
            Kept::new(|| exchange(&mut io, &mut r, head, &conn, drain.as_mut(), &mut draining));
        match exchange.await {
            Step::Next => {}
            Step::Closed => return End::Closed,
            Step::Hyper(_) if draining => return End::Closed,
            Step::Hyper(again) => return End::Hyper(again, io),
            Step::Refused(refusal) => return cold::apart(|| refuse(&mut io, refusal)).await,
        }
    }
}

/// What became of a request read here.
enum Step {
    /// Answered: the connection reads its next request.
    Next,
    /// The connection is closed (or to be dropped).
    Closed,
    /// hyper's server serves the connection from these bytes (the request's head on).
    Hyper(BytesMut),
    /// Its body's framing is refused: answered, then the connection closes.
    Refused(Refusal),
}

/// What a connection reads requests with: its read buffer and the lines of its last head (whose
/// names the next head reuses, `http1::set_line`). While the connection waits with nothing read
/// (idle between requests, or while a request's answer is made), it holds neither: they go back
/// to the worker as one ([`READINGS`]) and come back when bytes do. An idle keep-alive
/// connection held ~6 KiB of them (the buffer 4 KiB, 16 lines 1.7 KiB); nginx frees its
/// request buffers between requests too.
struct Reading {
    /// `None` while paused. Boxed: a pause or a resume moves a pointer to and from the worker's
    /// shelf (moved whole, the parts were copied three times each way, ~110 instructions a
    /// request more, callgrind), and a connection holds 8 bytes of it.
    parts: Option<Box<Parts>>,
}

/// A [`Reading`]'s buffer and lines.
struct Parts {
    buf: BytesMut,
    lines: crate::server::http1::ThreadLines,
}

/// How a paused [`Reading`] waits for bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// A one-byte read looks first; once it has waited, a read takes the buffer back and reads
    /// what came (a wake-up for a request comes when bytes do).
    Once,
    /// Always a one-byte read first: the wait is polled on every wake-up of a request being
    /// answered, most of them for the answer, not for bytes.
    Always,
}

/// A connection's buffer and lines given back while it waits, at most (4 KiB and ~1.7 KiB, so
/// ~370 KiB a worker): as many as its connections take at once.
const READINGS_KEPT: usize = 64;

/// A read buffer that grew past this many bytes (a large body read whole) is not kept.
const READ_KEPT: usize = 2 * READ;

thread_local! {
    /// Buffers and lines given back by a worker's connections, the last given on top.
    static READINGS: Shelf<Box<Parts>> = const { Shelf::new(READINGS_KEPT) };
}

impl Reading {
    /// A connection's reading, with `buf`'s bytes read already (paused if there are none).
    fn new(buf: BytesMut) -> Reading {
        let mut r = Reading { parts: None };
        if !buf.is_empty() {
            r.parts().buf = buf;
        }
        r
    }

    /// The buffer and the lines, taken back first if paused.
    #[inline]
    fn parts(&mut self) -> &mut Parts {
        self.parts.get_or_insert_with(take_back)
    }

    /// The bytes read and not used (none while paused).
    fn buf(&self) -> &[u8] {
        self.parts.as_ref().map_or(&[], |p| &p.buf[..])
    }

    /// The bytes read and not used, taken (for hyper's server).
    fn take_buf(&mut self) -> BytesMut {
        self.parts
            .as_mut()
            .map_or_else(BytesMut::new, |p| std::mem::take(&mut p.buf))
    }

    /// Gives the buffer and the lines back to the worker if nothing is held in the buffer.
    #[inline]
    fn pause(&mut self) {
        if self.parts.as_ref().is_some_and(|p| p.buf.is_empty()) {
            self.give_back();
        }
    }

    fn give_back(&mut self) {
        let Some(mut parts) = self.parts.take() else {
            return;
        };
        if parts.buf.capacity() > READ_KEPT {
            parts.buf = BytesMut::new();
        }
        Shelf::keep(&READINGS, parts);
    }

    /// Reads more into the buffer, with room for at least `room` bytes; paused again when
    /// nothing came. `Ok(0)`: the stream ended.
    fn read<'a, I: AsyncRead + Unpin>(
        &'a mut self,
        io: &'a mut I,
        room: usize,
        probe: Probe,
    ) -> impl Future<Output = std::io::Result<usize>> + 'a {
        let mut probed = false;
        std::future::poll_fn(move |cx| {
            if self.parts.is_none() && (probe == Probe::Always || !probed) {
                let mut one = [0u8; 1];
                let mut first = tokio::io::ReadBuf::new(&mut one);
                match Pin::new(&mut *io).poll_read(cx, &mut first) {
                    Poll::Pending => {
                        probed = true;
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) if first.filled().is_empty() => return Poll::Ready(Ok(0)),
                    Poll::Ready(Ok(())) => {
                        self.parts().buf.extend_from_slice(first.filled());
                        return Poll::Ready(Ok(1));
                    }
                }
            }
            let buf = &mut self.parts().buf;
            buf.reserve(room);
            let read = tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf);
            if read.is_pending() {
                self.pause();
            }
            read
        })
    }
}

/// [`Reading::parts`] of a paused reading: the last parts given back on this thread, or new.
fn take_back() -> Box<Parts> {
    match Shelf::take(&READINGS) {
        Some(mut parts) => {
            if parts.buf.capacity() == 0 {
                parts.buf = BytesMut::with_capacity(READ);
            }
            parts
        }
        None => Box::new(Parts {
            buf: BytesMut::with_capacity(READ),
            lines: crate::server::http1::ThreadLines::resume(),
        }),
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.pause();
    }
}

/// A request's head, copied into the block of heads the worker is filling ([`HEADS`]): a request
/// holds its head once, and not the connection's read buffer, which goes back to the worker
/// while the request waits ([`Reading`]). Copied whole, a head was an allocation of its own and
/// another for the count of its slices.
fn keep_head(head: &[u8]) -> Bytes {
    HEADS
        .try_with(|heads| {
            let mut heads = heads.borrow_mut();
            if heads.capacity() < head.len() {
                heads.reserve(HEADS_BLOCK.max(head.len()));
            }
            heads.extend_from_slice(head);
            heads.split().freeze()
        })
        .unwrap_or_else(|_| Bytes::copy_from_slice(head))
}

/// The size of a block of heads, in bytes: ~40 heads of an API request. A block is freed when
/// the last request whose head it holds ends; until then one request that waits long holds it
/// all.
const HEADS_BLOCK: usize = 4096;

thread_local! {
    /// The room left in the block heads are copied into.
    static HEADS: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// Serves the request whose head (`head`, parsed from the start of `buf`) was read: its body,
/// the handler's answer, the answer written.
async fn exchange<I, H, F, A, B, D>(
    io: &mut I,
    r: &mut Reading,
    head: Head,
    conn: &Conn<'_, H>,
    mut drain: Pin<&mut D>,
    draining: &mut bool,
) -> Step
where
    I: AsyncRead + AsyncWrite + Unpin + Send,
    H: Fn(SocketAddr, Request<RequestBody>) -> F,
    F: Future<Output = A>,
    A: super::Answer<Body = B>,
    B: Body,
    B::Data: Buf,
    D: Future,
{
    let p = r.parts();
    let head_bytes = keep_head(&p.buf[..head.len]);
    p.buf.advance(head.len);
    let map = Room::map();
    let mut passed = Passed::default();
    let Some(parts) = request(
        &head,
        &head_bytes,
        &mut p.lines,
        map,
        conn.passes,
        &mut passed,
    ) else {
        // Not what it seemed (a target `Uri` refuses): hyper's, from its first byte.
        return again(&head_bytes, &p.buf);
    };
    let request_in_flight = conn.activity.begin();
    // RFC 9110 §10.1.1: the client waits for this before it sends its body (unless it has
    // started already). The body is read whole before the request is admitted, as nginx
    // reads one before it is proxied.
    if head.expect_continue && p.buf.is_empty() {
        let sent = cold::apart(|| async {
            io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
            io.flush().await
        });
        if sent.await.is_err() {
            return Step::Closed;
        }
    }
    let body = match head.body {
        BodyLength::Length(n) => {
            let body = n as usize;
            while p.buf.len() < body {
                p.buf.reserve(body - p.buf.len());
                if !matches!(io.read_buf(&mut p.buf).await, Ok(n) if n > 0) {
                    // Cut short: hyper's, which hands the handler a body that fails (its
                    // answer, 400, is the handler's).
                    drop(request_in_flight);
                    return again(&head_bytes, &p.buf);
                }
            }
            match body {
                // Split off, an empty body would make the buffer shared (an allocation).
                0 => Bytes::new(),
                _ => p.buf.split_to(body).freeze(),
            }
        }
        BodyLength::Chunked => match cold::apart(|| read_chunked(io, &mut p.buf)).await {
            Ok(Some(body)) => body,
            // Longer than is read whole, with trailers, or cut short: hyper's, from the
            // head's first byte (nothing of `buf` was taken).
            Ok(None) => {
                drop(request_in_flight);
                return again(&head_bytes, &p.buf);
            }
            Err(refusal) => return Step::Refused(refusal),
        },
    };
    // The request holds what it needs: the rest waits in the worker while nothing more is read.
    r.pause();
    let mut req = Request::new(RequestBody::read(body, passed));
    *req.method_mut() = parts.0;
    *req.uri_mut() = parts.1;
    *req.headers_mut() = parts.2;
    let head_request = req.method() == Method::HEAD;
    let mut answer = pin!((conn.handler)(conn.peer, req));
    // While the answer is made, a client that closes is gone: its request is dropped.
    conn.activity.watch_for_departure(true);
    let resp = loop {
        if r.buf().len() >= conn.max_head {
            break answer.as_mut().await;
        }
        // This read is there to see a client go (or its next request come early). While it
        // waits with nothing read, the buffer and the lines are the worker's ([`Reading`]).
        tokio::select! {
            biased;
            resp = answer.as_mut() => break resp,
            read = r.read(io, 1, Probe::Always) => if !matches!(read, Ok(n) if n > 0) {
                return Step::Closed;
            },
        }
    };
    conn.activity.watch_for_departure(false);
    let (resp, written) = resp.split();
    let resp = request_in_flight.respond(resp);
    if !*draining && futures_util::poll!(drain.as_mut()).is_ready() {
        *draining = true;
    }
    let keep = !head.close && !*draining;
    let (parts, body) = resp.into_parts();
    let mut out = Room::out();
    let sent = respond(io, &mut out, &parts, &written, body, head_request, keep).await;
    // The answer's map, emptied, holds a next request's fields (hyper reuses a connection's).
    Room::give(parts.headers, out);
    match sent {
        Ok(true) => Step::Next,
        // Asked to close, and nothing came after: the client sends no more (RFC 9112 §9.6),
        // so the socket is not looked at for more (`server::Lingering`).
        Ok(false) if head.close && r.buf().is_empty() => {
            conn.activity.close_quietly();
            let _ = io.shutdown().await;
            Step::Closed
        }
        _ => {
            let _ = io.shutdown().await;
            Step::Closed
        }
    }
}

/// Answers a request whose framing is refused, then closes: what follows it on the connection
/// cannot be told from a next request's head.
async fn refuse<I: AsyncWrite + Unpin + Send, J>(io: &mut I, refusal: Refusal) -> End<J> {
    let (parts, body) =
        super::problem::problem(refusal.status, None, refusal.why, None).into_parts();
    let mut out = Vec::new();
    let written = super::Written::default();
    let _ = respond(io, &mut out, &parts, &written, body, false, false).await;
    let _ = io.shutdown().await;
    End::Closed
}

/// The raw bytes a chunked body read whole may take, in bytes (four times [`BODY_MAX`]: a body
/// sent in small chunks is longer than its data).
const CHUNKED_MAX: usize = 4 * BODY_MAX as usize;

/// Reads a chunked request body whole from `buf` (its head taken off) and `io`: its data, with
/// `buf` then starting after the body. `Ok(None)`, and `buf` holds what it held and all that was
/// read after: the body is longer than is read whole ([`BODY_MAX`] of data, [`CHUNKED_MAX`] of
/// bytes), has trailer fields (hyper's server passes them on), or the client stopped sending.
async fn read_chunked<I: AsyncRead + Unpin + Send>(
    io: &mut I,
    buf: &mut BytesMut,
) -> Result<Option<Bytes>, Refusal> {
    const MALFORMED: Refusal = Refusal {
        status: StatusCode::BAD_REQUEST,
        why: "the chunked request body is malformed",
    };
    let mut chunked = Chunked::new(1024);
    let mut data = BytesMut::new();
    let mut at = 0;
    loop {
        let (used, next) = chunked.next(&buf[at..]).map_err(|_| MALFORMED)?;
        at += used;
        match next {
            Next::Data(n) => {
                if data.len() + n > BODY_MAX as usize {
                    return Ok(None);
                }
                data.extend_from_slice(&buf[at..at + n]);
                at += n;
                continue;
            }
            Next::Trailers => match super::framing::trailer_section(&buf[at..], 1024) {
                Err(_) => return Err(MALFORMED),
                Ok(Some((len, 0))) => {
                    buf.advance(at + len);
                    return Ok(Some(data.freeze()));
                }
                Ok(Some(_)) => return Ok(None),
                Ok(None) => {}
            },
            Next::More => {}
        }
        if buf.len() >= CHUNKED_MAX {
            return Ok(None);
        }
        buf.reserve(READ);
        if !matches!(io.read_buf(buf).await, Ok(n) if n > 0) {
            return Ok(None);
        }
    }
}

/// The connection for hyper's server from the request whose head is `head` (`rest` read after
/// it), as if nothing had been read (closed instead if it is draining).
fn again(head: &[u8], rest: &BytesMut) -> Step {
    let mut again = BytesMut::with_capacity(head.len() + rest.len());
    again.extend_from_slice(head);
    again.extend_from_slice(rest);
    Step::Hyper(again)
}

/// An answer's bytes are gathered in the connection's buffer (its head with a small body goes
/// in one write) up to this many, in bytes.
const WRITE_AT: usize = 64 * 1024;
/// A body's chunk larger than this many bytes is written where it is, not copied.
const COPY_MAX: usize = 16 * 1024;
/// The room of an answer's write buffer, in bytes: an API answer's head and body fit (it grew
/// five times on each new connection from nothing). One that grew past it is not kept.
const OUT_KEPT: usize = 4096;

/// The fields a kept header map may have room for, at most: one that grew past it, for a large
/// answer, is not kept.
const MAP_KEPT: usize = 4 * KEPT_ROOM;

/// What a request is read into and its answer written with, kept by the worker between
/// answers, not by each connection: a request's header map (then the answer's, emptied), taken
/// as its head is read, and an answer's write buffer, taken only while the answer is written
/// (a request that waits for room or for its upstream holds none: 4 KiB each). An idle
/// keep-alive connection holds neither (~5 KiB less each), a new connection allocates neither
/// (four allocations and frees, ~450 instructions, callgrind), and the one taken is the one the
/// last answer on this thread used, still in cache, where a connection's own had gone cold while
/// it waited (and a new one's came cold from the allocator).
struct Room;

/// Maps and write buffers a worker keeps at most, each: as many as its connections have
/// requests or answers in flight at once (a map is ~1.5 KiB, a buffer 4 KiB, so ~350 KiB a
/// worker).
const ROOMS_KEPT: usize = 64;

/// A worker's rooms: its header maps and its write buffers, the last given on top of each.
struct Rooms {
    maps: Shelf<HeaderMap>,
    outs: Shelf<Vec<u8>>,
}

thread_local! {
    /// One thread local for both: an answer gives its map and its buffer back together.
    static ROOMS: Rooms = const {
        Rooms {
            maps: Shelf::new(ROOMS_KEPT),
            outs: Shelf::new(ROOMS_KEPT),
        }
    };
}

impl Room {
    /// The last map given back on this thread, or a new one with room for a usual request's
    /// fields (grown from nothing, it was allocated three times).
    fn map() -> HeaderMap {
        match ROOMS.try_with(|r| r.maps.pop()) {
            Ok(Some(map)) => map,
            _ => HeaderMap::with_capacity(KEPT_ROOM),
        }
    }

    /// The last write buffer given back on this thread, or a new one an API answer's head and
    /// body fit (grown from nothing, it was allocated five times).
    fn out() -> Vec<u8> {
        match ROOMS.try_with(|r| r.outs.pop()) {
            Ok(Some(out)) => out,
            _ => Vec::with_capacity(OUT_KEPT),
        }
    }

    /// Keeps `map` for a next request on this thread and `out` for a next answer; not one a
    /// large answer grew (nor more than [`ROOMS_KEPT`] of each, nor while the thread exits).
    fn give(mut map: HeaderMap, out: Vec<u8>) {
        let _ = ROOMS.try_with(move |r| {
            if out.capacity() <= OUT_KEPT {
                r.outs.put(out);
            }
            if map.capacity() <= MAP_KEPT {
                map.clear();
                r.maps.put(map);
            }
        });
    }
}

/// What a read asks room for, in bytes.
const READ: usize = 4096;

/// The request's method, target and header map, from its head's bytes (values are slices of
/// them). `None` if the target is not a `Uri`.
///
/// The head's `Connection: close` or `keep-alive` ([`Head::connection`]) is this server's to act
/// on, and is hop-by-hop (RFC 9110 §7.6.1), so it is left out of the map: a proxy that is handed
/// it must remove it, and what it names, and that cost a new connection's request ~700
/// instructions (`wrk` and most clients send `Connection: close` to open one a request; some
/// send `keep-alive` on every request).
///
/// With `passes`, the fields it passes go to `passed`, not the map (each line judged by it here,
/// once for a connection's name).
fn request(
    head: &Head,
    bytes: &Bytes,
    lines: &mut [Line],
    mut headers: HeaderMap,
    passes: Option<&Passes>,
    passed: &mut Passed,
) -> Option<(Method, http::Uri, HeaderMap)> {
    let passes = passes.filter(|p| lines.iter_mut().fold(false, |any, l| p.judge(l) | any));
    let lines = &*lines;
    let uri = http::Uri::from_maybe_shared(bytes.slice(head.target.clone())).ok()?;
    // SAFETY: `lines` are the fields httparse parsed out of these bytes ([`parse`]; `bytes` is
    // the head it parsed, split off the same buffer).
    let (before, after) = match head
        .connection
        .and_then(|i| Some((lines.get(..i)?, lines.get(i + 1..)?)))
    {
        Some(around) => around,
        None => (lines, &[][..]),
    };
    unsafe {
        match passes {
            None => {
                crate::server::http1::append_lines(before, bytes, &mut headers);
                if !after.is_empty() {
                    crate::server::http1::append_lines(after, bytes, &mut headers);
                }
            }
            Some(passes) => {
                crate::server::passed::split_lines(before, bytes, &mut headers, passes, passed);
                if !after.is_empty() {
                    crate::server::passed::split_lines(after, bytes, &mut headers, passes, passed);
                }
            }
        }
    }
    Some((head.method.clone(), uri, headers))
}

/// What `serve` hands its handler for the head at the start of `buf` ([`parse`], then
/// [`request`]): its method, target, header map and the lines handed on beside it; `None` if it
/// is not a whole head read here. For tests and fuzzing.
pub fn read_head(
    buf: &Bytes,
    lines: &mut Lines,
    passes: Option<&Passes>,
) -> Option<(Method, http::Uri, HeaderMap, Passed)> {
    let Parsed::Own(head) = parse(buf, buf.len().max(8192), MAX_HEADERS, lines) else {
        return None;
    };
    let mut passed = Passed::default();
    let bytes = buf.slice(..head.len);
    let (method, uri, map) = request(&head, &bytes, lines, HeaderMap::new(), passes, &mut passed)?;
    Some((method, uri, map, passed))
}

/// Writes `resp` (its head, then its body as it comes: bytes are sent whenever the body has no
/// more ready). `Ok(false)`: the connection must close (asked, or the body broke its framing).
async fn respond<I, B>(
    io: &mut I,
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    written: &super::Written,
    body: B,
    head_request: bool,
    keep: bool,
) -> std::io::Result<bool>
where
    I: AsyncWrite + Unpin,
    B: Body,
    B::Data: Buf,
{
    let mut body = pin!(body);
    let status = if parts.status.is_informational() {
        // No 1xx answer is a whole answer (hyper's rule).
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        parts.status
    };
    let hint = BodyHint {
        ended: body.is_end_stream() || status != parts.status,
        exact: body.size_hint().exact(),
    };
    out.clear();
    let (framing, close) = encode_head(
        out,
        status,
        &parts.headers,
        written,
        hint,
        head_request,
        keep,
        &date(),
    );
    let mut left = match framing {
        Framing::Length(n) => n,
        Framing::Chunked => u64::MAX,
    };
    // `whole`: the body was sent as framed. A body that may have none (HEAD, 204, 304) is not
    // read: what it holds is not sent, and the connection stays.
    let mut whole = true;
    let mut more = !hint.ended && framing != Framing::Length(0);
    while more {
        // The body's error is dropped as it is read: it is not `Send`, and only tells that the
        // connection must end.
        let ready = std::future::poll_fn(|cx| {
            Poll::Ready(body.as_mut().poll_frame(cx).map(|f| f.map(Result::ok)))
        })
        .await;
        let frame = match ready {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if !out.is_empty() {
                    io.write_all(out).await?;
                    io.flush().await?;
                    out.clear();
                }
                std::future::poll_fn(|cx| body.as_mut().poll_frame(cx).map(|f| f.map(Result::ok)))
                    .await
            }
        };
        let data = match frame {
            None => break,
            Some(None) => {
                (whole, more) = (false, false);
                continue;
            }
            Some(Some(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        let n = data.remaining();
        if n == 0 {
            continue;
        }
        let take = match framing {
            Framing::Chunked => {
                let mut size = [0u8; 18];
                out.extend_from_slice(hex(n, &mut size));
                out.extend_from_slice(b"\r\n");
                n
            }
            Framing::Length(_) => {
                let take = (n as u64).min(left) as usize;
                left -= take as u64;
                if take < n {
                    // More than it said: what it said is sent, and the connection ends.
                    (whole, more) = (false, false);
                }
                take
            }
        };
        if take <= COPY_MAX {
            put(out, data, take);
        } else {
            // Written where it is: copied, it would grow the connection's buffer for good.
            io.write_all(out).await?;
            out.clear();
            let mut data = data.take(take);
            while data.has_remaining() {
                io.write_buf(&mut data).await?;
            }
        }
        if framing == Framing::Chunked {
            out.extend_from_slice(b"\r\n");
        }
        if out.len() >= WRITE_AT {
            io.write_all(out).await?;
            out.clear();
        }
    }
    match framing {
        Framing::Chunked if whole => out.extend_from_slice(b"0\r\n\r\n"),
        // Less than it said: the client cannot tell where the next answer starts.
        Framing::Length(_) if left > 0 => whole = false,
        _ => {}
    }
    if !out.is_empty() {
        io.write_all(out).await?;
        out.clear();
    }
    io.flush().await?;
    Ok(whole && !close)
}

/// Copies `n` bytes of `data` to `out`.
fn put(out: &mut Vec<u8>, mut data: impl Buf, mut n: usize) {
    while n > 0 {
        let chunk = data.chunk();
        let take = chunk.len().min(n);
        out.extend_from_slice(&chunk[..take]);
        data.advance(take);
        n -= take;
    }
}

/// `n` in hexadecimal, in `buf`.
fn hex(mut n: usize, buf: &mut [u8; 18]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;
    use http::header::HeaderName;

    fn own(s: &str) -> Head {
        match parse(s.as_bytes(), 8192, 100, &mut Vec::new()) {
            Parsed::Own(h) => h,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    fn hyper(s: &str) {
        assert_eq!(
            parse(s.as_bytes(), 8192, 100, &mut Vec::new()),
            Parsed::Hyper,
            "{s:?}"
        );
    }

    #[test]
    fn plain_requests_are_read_here_with_their_lines() {
        let mut lines = Vec::new();
        let s = "GET /users/42?x=1 HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\n\r\nGET /next";
        let Parsed::Own(h) = parse(s.as_bytes(), 8192, 100, &mut lines) else {
            panic!()
        };
        assert_eq!(h.len, s.find("GET /next").unwrap());
        assert_eq!(h.method, Method::GET);
        assert_eq!(&s[h.target.clone()], "/users/42?x=1");
        assert_eq!((h.body, h.close), (BodyLength::Length(0), false));
        let lines: Vec<_> = lines
            .iter()
            .map(|l| (l.name.as_str(), &s[l.value.clone()]))
            .collect();
        assert_eq!(lines, [("host", "a"), ("x-api-key", "k")]);
        let h = own("POST / HTTP/1.1\r\ncontent-length: 12\r\nConnection: Close\r\n\r\n");
        assert_eq!((h.body, h.close), (BodyLength::Length(12), true));
        let h = own("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(h.body, BodyLength::Chunked);
        // `100 Continue` is this server's to send, where a body is to come.
        let h = own("PUT / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n");
        assert!(h.expect_continue);
        let h = own("PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n");
        assert!(!h.expect_continue);
        assert!(!own("GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n").close);
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\n", 8192, 100, &mut Vec::new()),
            Parsed::Partial
        );
    }

    /// The map handed to the handler, for a head read here.
    fn map_of(s: &str) -> Vec<(String, String)> {
        handed(s, None, &mut Vec::new()).0
    }

    /// The map handed to the handler and the lines handed on beside it, for a head read here
    /// with `passes`, on a connection that read `lines` last.
    fn handed(
        s: &str,
        passes: Option<&Passes>,
        lines: &mut Lines,
    ) -> (Vec<(String, String)>, String) {
        let (_, _, map, passed) = read_head(&Bytes::copy_from_slice(s.as_bytes()), lines, passes)
            .unwrap_or_else(|| panic!("{s:?}"));
        let map = map
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        (map, String::from_utf8(passed.as_bytes().to_vec()).unwrap())
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn fields_handed_on_go_as_lines_and_the_rest_in_the_map() {
        let key = HeaderName::from_static("x-api-key");
        let passes = Passes::new(
            &[
                header::USER_AGENT,
                header::ACCEPT,
                header::COOKIE,
                key.clone(),
                // Never handed on: the proxy must see it, or remove it.
                header::CONTENT_LENGTH,
                header::TE,
            ],
            [&key],
        );
        let s = "POST / HTTP/1.1\r\nHost: a\r\nUSER-agent: u/1 \r\nX-Api-Key: k\r\nCookie: a=1\r\n\
                 Accept:*/*\r\ncookie: b=2\r\nContent-Length: 0\r\nConnection: close\r\nX-Other: o\r\n\r\n";
        let mut lines = Vec::new();
        let want_map = pairs(&[
            ("host", "a"),
            ("x-api-key", "k"),
            ("content-length", "0"),
            ("x-other", "o"),
        ]);
        // As written where written `Name: value` (the value as httparse trims it), else made
        // so; one name's lines in their order.
        let want_lines = "USER-agent: u/1\r\nCookie: a=1\r\naccept: */*\r\ncookie: b=2\r\n";
        assert_eq!(
            handed(s, Some(&passes), &mut lines),
            (want_map.clone(), want_lines.to_owned())
        );
        // The next request on the connection: the lines judged once, the same answer.
        assert_eq!(
            handed(s, Some(&passes), &mut lines),
            (want_map, want_lines.to_owned())
        );
        // A listener that hands on nothing, on a thread whose lines another one judged: all in
        // the map, as before.
        let (map, passed) = handed(s, None, &mut lines);
        assert_eq!((map.len(), passed.as_str()), (8, ""));
        // Another set of names judges them again.
        let (map, passed) = handed(s, Some(&Passes::new(&[header::ACCEPT], [])), &mut lines);
        assert_eq!((map.len(), passed.as_str()), (7, "accept: */*\r\n"));
        // Given back to a map, as hyper's client needs them: the same fields, in order.
        let (_, _, mut map, passed) = read_head(
            &Bytes::copy_from_slice(s.as_bytes()),
            &mut lines,
            Some(&passes),
        )
        .unwrap();
        passed.restore(&mut map);
        assert_eq!(map["user-agent"], "u/1");
        assert_eq!(map["accept"], "*/*");
        let cookies: Vec<_> = map.get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(map.len(), 8);
    }

    #[test]
    fn a_connection_field_acted_on_here_is_not_handed_on_unless_it_names_a_field() {
        for value in ["close", "Keep-Alive"] {
            let s =
                format!("GET / HTTP/1.1\r\nHost: a\r\nConnection: {value}\r\nX-Api-Key: k\r\n\r\n");
            assert_eq!(
                map_of(&s),
                pairs(&[("host", "a"), ("x-api-key", "k")]),
                "{value}"
            );
        }
        let first = "GET / HTTP/1.1\r\nConnection: close\r\nHost: a\r\n\r\n";
        assert_eq!(map_of(first), pairs(&[("host", "a")]));
        let last = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        assert_eq!(map_of(last), pairs(&[("host", "a")]));
        // A field it would make hop-by-hop: both stay, for the proxy to remove.
        let named = "GET / HTTP/1.1\r\nClose: x\r\nConnection: close\r\n\r\n";
        assert_eq!(
            map_of(named),
            pairs(&[("close", "x"), ("connection", "close")])
        );
        // Two of them: both stay.
        let two = "GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n";
        assert_eq!(
            map_of(two),
            pairs(&[("connection", "close"), ("connection", "keep-alive")])
        );
        assert_eq!(map_of("GET / HTTP/1.1\r\n\r\n"), pairs(&[]));
    }

    #[test]
    fn a_connections_names_are_reused_only_where_written_the_same() {
        let mut lines = Vec::new();
        let names = |s: &str, lines: &mut Vec<Line>| -> Vec<(String, String)> {
            assert!(matches!(
                parse(s.as_bytes(), 8192, 100, lines),
                Parsed::Own(_)
            ));
            lines
                .iter()
                .map(|l| (l.name.as_str().to_owned(), s[l.value.clone()].to_owned()))
                .collect()
        };
        let first = names(
            "GET / HTTP/1.1\r\nX-Api-Key: a\r\nHost: h\r\n\r\n",
            &mut lines,
        );
        assert_eq!(
            first,
            [
                ("x-api-key".into(), "a".into()),
                ("host".into(), "h".into())
            ]
        );
        // Same place, same bytes: reused (with this request's value); elsewhere made anew.
        let second = names(
            "GET / HTTP/1.1\r\nX-Api-Key: b\r\nX-Api-Kez: c\r\nContent-Length: 0\r\n\r\n",
            &mut lines,
        );
        assert_eq!(
            second,
            [
                ("x-api-key".into(), "b".into()),
                ("x-api-kez".into(), "c".into()),
                ("content-length".into(), "0".into())
            ]
        );
        let third = names("GET / HTTP/1.1\r\nhost: h\r\n\r\n", &mut lines);
        assert_eq!(third, [("host".into(), "h".into())]);
        // A long name is made each time, and read the same.
        let long = format!("GET / HTTP/1.1\r\n{}: v\r\n\r\n", "N".repeat(40));
        for _ in 0..2 {
            assert_eq!(names(&long, &mut lines)[0].0, "n".repeat(40));
        }
    }

    #[test]
    fn anything_but_a_plain_request_is_hypers() {
        for s in [
            "GET / HTTP/1.0\r\n\r\n",
            "POST / HTTP/1.0\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 65537\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue, x\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n",
            "PUT / HTTP/1.1\r\nExpect: x\r\nContent-Length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET\0 / HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\n",
        ] {
            hyper(s);
        }
        // A head longer than the bound, whole or not.
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "x".repeat(9000));
        hyper(&long);
        hyper(&long[..8500]);
        // More lines than `server.max_headers`.
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "x: y\r\n".repeat(11));
        assert_eq!(
            parse(many.as_bytes(), 8192, 10, &mut Vec::new()),
            Parsed::Hyper
        );
        assert!(matches!(
            parse(many.as_bytes(), 8192, 11, &mut Vec::new()),
            Parsed::Own(_)
        ));
    }

    #[test]
    fn a_framing_refused_is_answered_here_whoever_would_serve_the_request() {
        let refused = |s: &str| match parse(s.as_bytes(), 8192, 100, &mut Vec::new()) {
            Parsed::Refused(r) => r.status.as_u16(),
            other => panic!("{s:?}: {other:?}"),
        };
        for s in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            // Refused whatever else would make it hyper's.
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(refused(s), 400, "{s:?}");
        }
        assert_eq!(
            refused("POST / HTTP/1.1\r\nTransfer-Encoding: deflate, chunked\r\n\r\n"),
            501
        );
    }

    fn head(
        status: StatusCode,
        headers: &[(&str, &str)],
        hint: BodyHint,
        head_req: bool,
        keep: bool,
    ) -> (String, Framing, bool) {
        // A name written `+name` is one of the fields written already.
        let (mut map, mut written) = (HeaderMap::new(), super::super::Written::default());
        for (n, v) in headers {
            match n.strip_prefix('+') {
                Some(n) => {
                    written.push(&HeaderName::from_bytes(n.as_bytes()).unwrap(), v.as_bytes())
                }
                None => {
                    map.append(
                        HeaderName::from_bytes(n.as_bytes()).unwrap(),
                        v.parse().unwrap(),
                    );
                }
            }
        }
        let mut out = Vec::new();
        let (f, close) = encode_head(
            &mut out,
            status,
            &map,
            &written,
            hint,
            head_req,
            keep,
            b"Sat, 28 Nov 2026 21:00:00 GMT",
        );
        (String::from_utf8(out).unwrap(), f, close)
    }

    const SIZED: BodyHint = BodyHint {
        ended: false,
        exact: Some(5),
    };
    const ENDED: BodyHint = BodyHint {
        ended: true,
        exact: Some(0),
    };
    const STREAM: BodyHint = BodyHint {
        ended: false,
        exact: None,
    };
    const DATE: &str = "date: Sat, 28 Nov 2026 21:00:00 GMT\r\n";

    #[test]
    fn a_response_head_frames_its_body_as_hyper_did() {
        assert_eq!(
            head(
                StatusCode::OK,
                &[("x-a", "1"), ("content-length", "5")],
                SIZED,
                false,
                true
            ),
            (
                format!("HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\n{DATE}\r\n"),
                Framing::Length(5),
                false
            )
        );
        assert_eq!(
            head(StatusCode::TOO_MANY_REQUESTS, &[], ENDED, false, false),
            (
                format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\nconnection: close\r\n{DATE}\r\n"
                ),
                Framing::Length(0),
                true
            )
        );
        // Unknown length: chunked, or the length the handler wrote.
        assert_eq!(
            head(
                StatusCode::OK,
                &[("transfer-encoding", "chunked")],
                STREAM,
                false,
                true
            ),
            (
                format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n{DATE}\r\n"),
                Framing::Chunked,
                false
            )
        );
        assert_eq!(
            head(
                StatusCode::OK,
                &[("content-length", "7")],
                STREAM,
                false,
                true
            )
            .1,
            Framing::Length(7)
        );
        // HEAD: the length as written, no body; 204 and 304: neither.
        assert_eq!(
            head(
                StatusCode::OK,
                &[("content-length", "7")],
                ENDED,
                true,
                true
            ),
            (
                format!("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n{DATE}\r\n"),
                Framing::Length(0),
                false
            )
        );
        assert_eq!(
            head(
                StatusCode::NO_CONTENT,
                &[("content-length", "0")],
                ENDED,
                false,
                true
            ),
            (
                format!("HTTP/1.1 204 No Content\r\n{DATE}\r\n"),
                Framing::Length(0),
                false
            )
        );
        assert_eq!(
            head(StatusCode::NOT_MODIFIED, &[], STREAM, false, true).1,
            Framing::Length(0)
        );
        // Fields written already follow the map's; one that could split the head is left out.
        assert_eq!(
            head(
                StatusCode::OK,
                &[("x-a", "1"), ("+ratelimit", "r=1"), ("+x-bad", "a\r\nb: c")],
                ENDED,
                false,
                true
            )
            .0,
            format!(
                "HTTP/1.1 200 OK\r\nx-a: 1\r\nratelimit: r=1\r\ncontent-length: 0\r\n{DATE}\r\n"
            )
        );
        // The handler's own close and date are kept, once.
        assert_eq!(
            head(
                StatusCode::OK,
                &[("connection", "close"), ("date", "then")],
                ENDED,
                false,
                false
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: close\r\ndate: then\r\ncontent-length: 0\r\n\r\n"
                    .to_owned(),
                Framing::Length(0),
                true
            )
        );
    }

    /// What `respond` writes for a body of `frames` (an `Err` breaks it) of known length or not,
    /// and whether the connection may carry on.
    async fn sent(
        status: u16,
        frames: &[Result<&'static str, ()>],
        known: bool,
        head_request: bool,
        keep: bool,
    ) -> (String, bool) {
        use http_body_util::{BodyExt, Full, StreamBody};
        let frames: Vec<Result<http_body::Frame<Bytes>, ()>> = frames
            .iter()
            .map(|f| f.map(|s| http_body::Frame::data(Bytes::from_static(s.as_bytes()))))
            .collect();
        let body = if known {
            let all: String = frames
                .iter()
                .flatten()
                .map(|f| std::str::from_utf8(f.data_ref().unwrap()).unwrap())
                .collect();
            Full::new(Bytes::from(all))
                .map_err(|e| match e {})
                .boxed_unsync()
        } else {
            StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
        };
        let (parts, _) = Response::builder()
            .status(status)
            .header("date", "d")
            .body(())
            .unwrap()
            .into_parts();
        let (mut io, mut out) = (Vec::new(), Vec::new());
        let carry_on = respond(
            &mut io,
            &mut out,
            &parts,
            &Default::default(),
            body,
            head_request,
            keep,
        )
        .await
        .unwrap();
        (String::from_utf8(io).unwrap(), carry_on)
    }

    #[tokio::test]
    async fn answers_are_framed_and_keep_the_connection_unless_they_cannot() {
        assert_eq!(
            sent(200, &[Ok("hello")], true, false, true).await,
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ncontent-length: 5\r\n\r\nhello".into(),
                true
            )
        );
        // No body: a length of 0, and the connection carries on.
        assert_eq!(
            sent(200, &[], true, false, true).await,
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ncontent-length: 0\r\n\r\n".into(),
                true
            )
        );
        assert_eq!(
            sent(204, &[], true, false, true).await,
            ("HTTP/1.1 204 No Content\r\ndate: d\r\n\r\n".into(), true)
        );
        // HEAD: the length, not the body; the connection carries on.
        assert_eq!(
            sent(200, &[Ok("hello")], true, true, true).await,
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ncontent-length: 5\r\n\r\n".into(),
                true
            )
        );
        // Unknown length: chunked.
        assert_eq!(
            sent(200, &[Ok("hello"), Ok(""), Ok("world!")], false, false, true).await,
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n".into(),
                true
            )
        );
        // A chunk larger than what is copied: written where it is, in order.
        let big: &'static str = Box::leak("b".repeat(COPY_MAX + 1).into_boxed_str());
        let (bytes, carry_on) = sent(200, &[Ok("a"), Ok(big), Ok("c")], false, false, true).await;
        let body = format!("1\r\na\r\n{:x}\r\n{big}\r\n1\r\nc\r\n0\r\n\r\n", big.len());
        assert!(carry_on && bytes.ends_with(&format!("chunked\r\n\r\n{body}")));
        let (bytes, carry_on) = sent(200, &[Ok("a"), Ok(big)], true, false, true).await;
        assert!(carry_on && bytes.ends_with(&format!("\r\n\r\na{big}")));
        // A body that breaks: what came is sent, unfinished, and the connection ends.
        assert_eq!(
            sent(200, &[Ok("hello"), Err(())], false, false, true).await,
            (
                "HTTP/1.1 200 OK\r\ndate: d\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
                    .into(),
                false
            )
        );
        // Closing: said, and done.
        assert_eq!(
            sent(429, &[Ok("no")], true, false, false).await,
            (
                "HTTP/1.1 429 Too Many Requests\r\ndate: d\r\ncontent-length: 2\r\nconnection: close\r\n\r\nno".into(),
                false
            )
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_that_waits_with_nothing_read_holds_no_buffer_nor_lines() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut r = Reading::new(BytesMut::from(&b"GET"[..]));
        assert!(r.parts.is_some());
        // Bytes held: nothing goes back.
        r.pause();
        assert!(r.parts.is_some());
        r.parts().buf.clear();
        // Nothing came: paused, with neither.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        for probe in [Probe::Once, Probe::Always] {
            let read = pin!(r.read(&mut server, READ, probe)).poll(&mut cx);
            assert!(read.is_pending());
            assert!(r.parts.is_none());
        }
        // Once a one-byte look has waited, a read takes them back and reads what came; with
        // `Always`, the look reads one byte and keeps it.
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let look = pin!(r.read(&mut server, READ, Probe::Once)).poll(&mut cx);
        assert!(
            matches!(look, Poll::Ready(Ok(1))),
            "the look reads the first byte"
        );
        assert_eq!(r.buf(), b"G");
        let more = r.read(&mut server, READ, Probe::Once).await.unwrap();
        assert_eq!(more, 15);
        assert_eq!(r.buf(), b"GET / HTTP/1.1\r\n");
        r.parts().buf.clear();
        r.pause();
        assert!(r.parts.is_none());
        client.write_all(b"x").await.unwrap();
        assert_eq!(r.read(&mut server, READ, Probe::Always).await.unwrap(), 1);
        assert_eq!(r.buf(), b"x");
        // The client goes: the end of the stream, with nothing taken.
        r.parts().buf.clear();
        r.pause();
        drop(client);
        assert_eq!(r.read(&mut server, READ, Probe::Once).await.unwrap(), 0);
        assert!(r.parts.is_none());
        // A buffer that grew past what is kept goes back without it.
        r.parts().buf.reserve(4 * READ_KEPT);
        r.pause();
        assert_eq!(r.parts().buf.capacity(), READ);
    }

    #[test]
    fn heads_are_copied_whole_into_a_shared_block() {
        std::thread::spawn(|| {
            let a = keep_head(b"GET /a HTTP/1.1\r\n\r\n");
            let b = keep_head(b"GET /b HTTP/1.1\r\n\r\n");
            assert_eq!(&a[..], b"GET /a HTTP/1.1\r\n\r\n");
            assert_eq!(&b[..], b"GET /b HTTP/1.1\r\n\r\n");
            // One block: the second right after the first.
            assert_eq!(a.as_ptr() as usize + a.len(), b.as_ptr() as usize);
            // A head larger than a block gets a block of its own.
            let big = vec![b'a'; HEADS_BLOCK * 2];
            assert_eq!(&keep_head(&big)[..], &big[..]);
            drop(b);
            assert_eq!(&a[..], b"GET /a HTTP/1.1\r\n\r\n");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn sizes_are_hex_and_the_date_its_length() {
        let mut buf = [0; 18];
        assert_eq!(hex(0, &mut buf), b"0");
        assert_eq!(hex(0x1f4a, &mut buf), b"1f4a");
        assert_eq!(date().len(), 29);
    }
}
