//! raw: the gateway's own HTTP/1.1 exchange with a cleartext target, for the common request: no
//! body or a small one read whole ([`super::outgoing`]), no upgrade, no trailers asked for. The request's own task writes the head and reads
//! the response on the connection; hyper's client runs each connection as a task of its own
//! that requests reach through a channel, a wake-up and a copy of the request each way (about a
//! third of a proxied request's instructions, callgrind: docs/benchmarks/). Everything else
//! (streamed bodies, upgrades, TLS, HTTP/2) still goes through hyper's client. The wire rules are in
//! [`super::h1`].

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::Request;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::h1::{self, Chunked, Framing, Head, Next};

/// Read buffer a connection starts with (a head larger than this grows it, up to the bound).
const READ_BUF: usize = 8 * 1024;

/// An open connection to a target, idle or carrying one exchange. Boxed once, when it opens: it
/// is moved into the pool, out of it and along with every response body read from it, and each
/// move copied its 112 bytes (callgrind, docs/benchmarks/).
pub struct RawConn(Box<Open>);

struct Open {
    io: TcpStream,
    /// Bytes read and not yet taken (a head, a body's next bytes).
    buf: BytesMut,
    /// The request head being written (kept: its allocation serves the next request).
    out: Vec<u8>,
    /// Room to read a response head's lines in (kept, as `out`).
    lines: h1::Lines,
}

/// How an exchange failed.
#[derive(Debug)]
pub enum Failure {
    /// The request could not be written: the connection was closed before it (a reused one may
    /// have been closed by the target while idle; the request can go on a new one).
    NotSent(std::io::Error),
    /// The response never came whole, or was not HTTP/1.1.
    Failed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotSent(e) => write!(f, "the request could not be written: {e}"),
            Failure::Failed(why) => f.write_str(why),
        }
    }
}

impl RawConn {
    pub fn new(io: TcpStream) -> RawConn {
        RawConn(Box::new(Open {
            io,
            buf: BytesMut::with_capacity(READ_BUF),
            out: Vec::new(),
            lines: Vec::new(),
        }))
    }

    /// The target closed it, or sent bytes nobody asked for, as far as is known without a wait.
    /// Free while neither happened: the runtime knows the socket has nothing to read, and no
    /// system call is made.
    pub fn is_closed(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.0.io.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes `req`'s head (its URI in origin form, `host` for its `Host`, `passed` after its
    /// map's fields, `after` after those) and `body` (the length its head gives), and reads the
    /// response's head; the body's first bytes stay in the buffer. `written`: where the
    /// response's fields go as lines ([`h1::parse_response`]).
    #[allow(
        clippy::too_many_arguments,
        reason = "each is one part of the exchange; a struct would only name them again"
    )]
    pub async fn exchange<B>(
        &mut self,
        req: &Request<B>,
        body: &[u8],
        passed: &[u8],
        host: &http::HeaderValue,
        after: &impl h1::After,
        max_head: usize,
        mut written: Option<&mut crate::server::Written>,
    ) -> Result<Head, Failure> {
        let c = &mut *self.0;
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        let headers = req.headers();
        h1::encode_request(
            req.method(),
            target,
            host,
            headers,
            passed,
            after,
            &mut c.out,
        );
        match body.is_empty() {
            true => c.io.write_all(&c.out).await,
            false => write_both(&mut c.io, &c.out, body).await,
        }
        .map_err(Failure::NotSent)?;
        let head_request = req.method() == http::Method::HEAD;
        loop {
            let lines = &mut c.lines;
            let to = written.as_deref_mut();
            match h1::parse_response(&mut c.buf, head_request, max_head, lines, to) {
                Ok(Some(head)) => return Ok(head),
                Ok(None) => {}
                Err(bad) => return Err(Failure::Failed(bad.0.to_owned())),
            }
            let read = match c.buf.is_empty() {
                true => read_first(c).await,
                false => {
                    c.buf.reserve(READ_BUF);
                    c.io.read_buf(&mut c.buf).await
                }
            };
            match read {
                Ok(0) => {
                    return Err(Failure::Failed(
                        "connection closed before a whole response head".to_owned(),
                    ));
                }
                Ok(_) => {}
                Err(e) => return Err(Failure::Failed(e.to_string())),
            }
        }
    }
}

/// Reads the first bytes of a response into `c.buf` (empty). While the target has sent nothing,
/// the buffer (8 KiB) goes back to the worker ([`WAITING`]), so a request whose upstream has
/// not answered holds none (nginx allocates its `proxy_buffer_size` when the answer comes too);
/// it is taken back when the task is woken (for the socket's readiness, but for a drain or a
/// time-out) and read into at once. A read that fills less than the room clears the socket's
/// readiness (tokio), so the pool's `is_closed` makes no system call when the connection is
/// next taken (a `try_read` left it set: one `recv` a request more).
fn read_first(c: &mut Open) -> impl std::future::Future<Output = std::io::Result<usize>> + '_ {
    std::future::poll_fn(move |cx| {
        if c.buf.capacity() == 0 {
            c.buf = crate::server::shelf::Shelf::take(&WAITING)
                .unwrap_or_else(|| BytesMut::with_capacity(READ_BUF));
        }
        c.buf.reserve(READ_BUF);
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut c.io), cx, &mut c.buf);
        if read.is_pending() && c.buf.capacity() <= 2 * READ_BUF {
            crate::server::shelf::Shelf::keep(&WAITING, std::mem::take(&mut c.buf));
        }
        read
    })
}

/// Read buffers a worker keeps of the upstream connections that wait for an answer, at most
/// (8 KiB each, so 512 KiB a worker).
const WAITING_KEPT: usize = 64;

thread_local! {
    static WAITING: crate::server::shelf::Shelf<BytesMut> =
        const { crate::server::shelf::Shelf::new(WAITING_KEPT) };
}

/// Writes `a` then `b`, together where the socket takes both (one system call for a head and a
/// small body).
async fn write_both(io: &mut TcpStream, mut a: &[u8], mut b: &[u8]) -> std::io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        let n = io
            .write_vectored(&[std::io::IoSlice::new(a), std::io::IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    Ok(())
}

/// Why a response body could not be read to its end.
#[derive(Debug)]
pub struct BodyError(String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "upstream response body: {}", self.0)
    }
}

impl std::error::Error for BodyError {}

/// A response body read from the connection. At its end the connection is kept for the pool
/// ([`RawBody::reusable`]) when the target left it reusable and sent nothing more.
pub struct RawBody {
    conn: Option<RawConn>,
    state: State,
    reusable: bool,
}

enum State {
    Length(u64),
    Chunked(Chunked),
    /// After the last chunk: its trailer section, at most this many bytes.
    Trailers(usize),
    Close,
    Done,
}

impl RawBody {
    /// The body that follows `head` on `conn`; `max_extra`: the bound on a chunked body's
    /// extensions and trailers.
    pub fn new(head: &Head, conn: RawConn, max_extra: usize) -> RawBody {
        let state = match head.framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunked::new(max_extra)),
            Framing::Close => State::Close,
        };
        let mut body = RawBody {
            conn: Some(conn),
            state,
            reusable: head.reusable,
        };
        if matches!(body.state, State::Done) {
            body.finish();
        }
        body
    }

    /// The body ended: the connection stays only if it can carry another exchange.
    fn finish(&mut self) {
        self.state = State::Done;
        if !self.reusable || self.conn.as_ref().is_some_and(|c| !c.0.buf.is_empty()) {
            self.conn = None;
        }
    }

    /// Once the body has ended: its connection, if it can carry another exchange.
    pub fn reusable(&mut self) -> Option<RawConn> {
        match self.state {
            State::Done => self.conn.take(),
            _ => None,
        }
    }

    pub fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    pub fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }

    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        loop {
            let Some(RawConn(conn)) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            // What the bytes at hand give, if anything yet.
            let frame = match &mut self.state {
                State::Done => return Poll::Ready(None),
                _ if conn.buf.is_empty() => None,
                State::Length(left) => {
                    let n = conn
                        .buf
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= n as u64;
                    let ended = *left == 0;
                    let data = conn.buf.split_to(n).freeze();
                    if ended {
                        self.finish();
                    }
                    Some(Frame::data(data))
                }
                State::Close => Some(Frame::data(conn.buf.split().freeze())),
                State::Chunked(chunks) => {
                    let Ok((used, next)) = chunks.next(&conn.buf) else {
                        return self.fail("malformed chunked body");
                    };
                    conn.buf.advance(used);
                    match next {
                        Next::More => None,
                        Next::Data(n) => Some(Frame::data(conn.buf.split_to(n).freeze())),
                        Next::Trailers => {
                            self.state = State::Trailers(chunks.max_extra());
                            continue;
                        }
                    }
                }
                State::Trailers(max) => match h1::parse_trailers(&mut conn.buf, *max) {
                    Ok(None) => None,
                    Ok(Some(trailers)) => {
                        self.finish();
                        let frame = (!trailers.is_empty()).then(|| Ok(Frame::trailers(trailers)));
                        return Poll::Ready(frame);
                    }
                    Err(_) => return self.fail("malformed chunked trailers"),
                },
            };
            if let Some(frame) = frame {
                return Poll::Ready(Some(Ok(frame)));
            }
            let Some(RawConn(conn)) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            conn.buf.reserve(READ_BUF);
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut conn.io),
                cx,
                &mut conn.buf
            ));
            match read {
                Ok(0) if matches!(self.state, State::Close) => {
                    self.state = State::Done;
                    self.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => return self.fail("connection closed before the body's end"),
                Ok(_) => {}
                Err(e) => return self.fail(&e.to_string()),
            }
        }
    }

    /// The body cannot be read on: its connection is dropped (closed).
    fn fail(&mut self, why: &str) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.conn = None;
        Poll::Ready(Some(Err(BodyError(why.to_owned()))))
    }
}
