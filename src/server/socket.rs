//! socket: an accepted client connection, registered with the runtime's reactor only once it has
//! to wait.
//!
//! Why: a client that opens a connection for one request has usually sent it by the time the
//! connection is accepted, and its answer fits the socket's send buffer, so reading, writing and
//! closing never wait. Registered at once (as tokio's `TcpListener::accept` does), such a
//! connection paid two `epoll_ctl` calls (added, then removed as it closed), the reactor's
//! bookkeeping of each, and a wait for the reactor's next turn before its first read: nginx adds
//! a connection once and lets `close` remove it. Here the first read, the writes and the close go
//! straight to the socket; the first that would block registers it, and it is a tokio
//! `TcpStream` from then on (a keep-alive connection waits for its next request, a TLS one for
//! the client's reply to its handshake).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A non-blocking accepted TCP socket, not registered until it must wait.
#[derive(Debug)]
pub struct Socket(State);

#[derive(Debug)]
enum State {
    /// Not registered: each call goes to the socket, and would-block registers it. `drained`:
    /// the last read took less than it had room for, so all there was (the next read would
    /// block: it registers without trying, as tokio's own stream skips it then).
    Raw {
        tcp: std::net::TcpStream,
        drained: bool,
    },
    Registered(TcpStream),
    /// Registration failed (the reactor refused it, e.g. out of memory): the error was answered
    /// once, and the socket is closed.
    Failed,
}

impl Socket {
    /// `tcp` must be in non-blocking mode (as `accept4(SOCK_NONBLOCK)` gives it).
    pub fn new(tcp: std::net::TcpStream) -> Socket {
        Socket(State::Raw {
            tcp,
            drained: false,
        })
    }

    /// Reads what has arrived without waiting, if anything: `Ok(0)` at the end of the stream,
    /// `WouldBlock` when nothing came.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.0 {
            State::Raw { tcp, .. } => (&*tcp).read(buf),
            State::Registered(s) => s.try_read(buf),
            State::Failed => Err(failed()),
        }
    }

    /// The socket as a tokio `TcpStream`, registered now if it was not.
    pub fn into_tokio(self) -> io::Result<TcpStream> {
        match self.0 {
            State::Raw { tcp, .. } => TcpStream::from_std(tcp),
            State::Registered(s) => Ok(s),
            State::Failed => Err(failed()),
        }
    }

    /// Whether the socket is registered (it has waited, or was made to: [`Socket::into_tokio`]).
    pub fn is_registered(&self) -> bool {
        !matches!(self.0, State::Raw { .. })
    }

    /// A read of an unregistered socket, without waiting: `None` when it would block (or the last
    /// read took all there was), and the socket is still unregistered.
    pub fn read_now(&mut self, buf: &mut ReadBuf<'_>) -> Option<io::Result<()>> {
        let State::Raw {
            tcp,
            drained: drained @ false,
        } = &mut self.0
        else {
            return None;
        };
        let room = buf.remaining();
        // SAFETY: `recv` writes at most `room` bytes into the buffer's unfilled part and
        // de-initialises none of it; `n` of them are initialised when it returns `n`.
        let n = unsafe {
            let unfilled = buf.unfilled_mut();
            libc::recv(tcp.as_raw_fd(), unfilled.as_mut_ptr().cast(), room, 0)
        };
        let res = match n {
            -1 => Err(io::Error::last_os_error()),
            n => Ok(n as usize),
        };
        let Some(res) = unless_blocked(res) else {
            *drained = true;
            return None;
        };
        Some(res.map(|n| {
            *drained = n > 0 && n < room;
            // SAFETY: see above.
            unsafe { buf.assume_init(n) };
            buf.advance(n);
        }))
    }

    /// Registers the socket (it is about to wait), and gives the registered stream.
    #[cold]
    fn registered(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        if let State::Raw { .. } = self.0 {
            let State::Raw { tcp, .. } = std::mem::replace(&mut self.0, State::Failed) else {
                unreachable!("just matched");
            };
            self.0 = State::Registered(TcpStream::from_std(tcp)?);
        }
        match &mut self.0 {
            State::Registered(s) => Ok(Pin::new(s)),
            _ => Err(failed()),
        }
    }
}

fn failed() -> io::Error {
    io::Error::other("the socket could not be registered with the runtime")
}

/// `Ready` of `res`, unless it would block: `None` then.
fn unless_blocked<T>(res: io::Result<T>) -> Option<io::Result<T>> {
    match res {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
        res => Some(res),
    }
}

// The registered stream first and inline: a keep-alive connection's every call takes it. The
// unregistered paths are a new connection's first calls, out of line.
impl AsyncRead for Socket {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let State::Registered(s) = &mut this.0 {
            return Pin::new(s).poll_read(cx, buf);
        }
        this.poll_read_unregistered(cx, buf)
    }
}

impl Socket {
    #[inline(never)]
    fn poll_read_unregistered(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(read) = self.read_now(buf) {
            return Poll::Ready(read);
        }
        self.registered()?.poll_read(cx, buf)
    }

    #[inline(never)]
    fn poll_write_unregistered(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let State::Raw { tcp, .. } = &self.0 {
            let res = match bufs {
                [one] => (&*tcp).write(one),
                _ => (&*tcp).write_vectored(bufs),
            };
            if let Some(res) = unless_blocked(res) {
                return Poll::Ready(res);
            }
        }
        self.registered()?.poll_write_vectored(cx, bufs)
    }
}

impl AsyncWrite for Socket {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let State::Registered(s) = &mut this.0 {
            return Pin::new(s).poll_write(cx, buf);
        }
        this.poll_write_unregistered(cx, &[io::IoSlice::new(buf)])
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let State::Registered(s) = &mut this.0 {
            return Pin::new(s).poll_write_vectored(cx, bufs);
        }
        this.poll_write_unregistered(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            State::Registered(s) => Pin::new(s).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            State::Raw { tcp, .. } => Poll::Ready(tcp.shutdown(Shutdown::Write)),
            State::Registered(s) => {
                ready!(Pin::new(s).poll_shutdown(cx))?;
                Poll::Ready(Ok(()))
            }
            State::Failed => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An accepted socket (non-blocking, as the accept loop's) and its client.
    pub async fn pair() -> (Socket, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (Socket::new(server), client)
    }

    fn is_registered(s: &Socket) -> bool {
        matches!(s.0, State::Registered(_))
    }

    #[tokio::test]
    async fn what_has_arrived_is_read_and_answered_without_registering() {
        let (mut server, mut client) = pair().await;
        client.write_all(b"ping").await.unwrap();
        // Arrived: loopback delivers before `write_all` returns.
        let mut buf = [0u8; 16];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ping");
        server.write_all(b"pong").await.unwrap();
        server.shutdown().await.unwrap();
        assert!(!is_registered(&server), "nothing waited");
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"pong");
    }

    #[tokio::test]
    async fn a_read_that_would_wait_registers_and_is_woken_by_what_comes() {
        let (mut server, mut client) = pair().await;
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let n = server.read(&mut buf).await.unwrap();
            (buf[..n].to_vec(), is_registered(&server))
        });
        // The reader waits (registered) before anything is sent.
        tokio::task::yield_now().await;
        client.write_all(b"late").await.unwrap();
        let (got, registered) = reader.await.unwrap();
        assert_eq!(got, b"late");
        assert!(registered);
    }

    #[tokio::test]
    async fn a_write_larger_than_the_send_buffer_waits_for_room_and_loses_nothing() {
        let (mut server, mut client) = pair().await;
        let big = vec![7u8; 8 * 1024 * 1024];
        let writer = tokio::spawn(async move {
            server.write_all(&big).await.unwrap();
            server.shutdown().await.unwrap();
            is_registered(&server)
        });
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), 8 * 1024 * 1024);
        assert!(got.iter().all(|&b| b == 7));
        assert!(writer.await.unwrap(), "8 MiB do not fit a send buffer");
    }

    #[tokio::test]
    async fn a_closed_client_reads_as_the_end() {
        let (mut server, client) = pair().await;
        drop(client);
        let mut buf = [0u8; 16];
        // The FIN may still be on its way: a wait, then the end.
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
        assert_eq!(
            server.try_read(&mut buf).unwrap(),
            0,
            "still the end, without waiting"
        );
    }
}
