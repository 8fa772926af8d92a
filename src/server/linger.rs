//! linger: nginx's lingering close, and holding off a socket's registration.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::idle;
use super::socket::Socket;

/// How long a closed connection keeps discarding what the client still sends. Default: 2 s.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// How much a closed connection discards at most. Default: 16 MiB.
const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// A client socket with nginx's lingering close: when a connection ends while the client is still
/// sending (an upload answered early with 413, say), closing at once would make the kernel reset
/// the connection, and the client would often lose the answer along with it. So the rest is read
/// and discarded, within [`LINGER_TIME`] and [`LINGER_BYTES`], before the socket is closed.
/// Unless the connection's activity says the client sends nothing more (nginx looks too, only
/// where a client may still be sending): the look is a system call each connection.
///
/// It also holds off registering a socket that has not had to wait yet ([`Socket`]) while it is
/// read only to see the client go (a request's answer is being made): for [`WATCH_AFTER`], so a
/// short connection whose answer comes sooner is never registered at all.
pub(super) struct Lingering {
    tcp: Option<Socket>,
    activity: Arc<idle::Activity>,
    /// The request whose answer the watch waits on, and when the socket is registered for it.
    watch: Option<(u64, Pin<Box<tokio::time::Sleep>>)>,
}

/// How long a request's answer may take before its client's socket is registered to see the
/// client go, when it has not been registered yet; a client that goes sooner is noticed when
/// the answer is sent or this much after the request, whichever is first. Default: 20 ms.
const WATCH_AFTER: Duration = Duration::from_millis(20);

impl Lingering {
    pub(super) fn new(tcp: Socket, activity: Arc<idle::Activity>) -> Lingering {
        Lingering {
            tcp: Some(tcp),
            activity,
            watch: None,
        }
    }

    fn get(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut Socket> {
        let tcp = self.get_mut().tcp.as_mut().expect("present until dropped");
        std::pin::Pin::new(tcp)
    }

    /// Whether a read of the unregistered socket, which only watches for the client going, is to
    /// wait ([`WATCH_AFTER`]) before it registers the socket.
    fn hold_off(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let Some(of) = self.activity.watched() else {
            return false;
        };
        let timer = match &mut self.watch {
            Some((watched, timer)) if *watched == of => timer,
            Some((watched, timer)) => {
                *watched = of;
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + WATCH_AFTER);
                timer
            }
            None => {
                let timer = Box::pin(tokio::time::sleep(WATCH_AFTER));
                &mut self.watch.insert((of, timer)).1
            }
        };
        timer.as_mut().poll(cx).is_pending()
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(tcp) = self.tcp.take() else { return };
        if self.activity.is_quiet() {
            return;
        }
        // Nothing unread (the usual close): close now.
        if !matches!(tcp.try_read(&mut [0u8; 1]), Ok(n) if n > 0) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let Ok(mut tcp) = tcp.into_tokio() else {
                return;
            };
            let _ = tcp.shutdown().await;
            let mut buf = vec![0u8; 16 * 1024];
            let mut left = LINGER_BYTES;
            let _ = tokio::time::timeout(LINGER_TIME, async {
                while left > 0 {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => left = left.saturating_sub(n),
                    }
                }
            })
            .await;
        });
    }
}

impl tokio::io::AsyncRead for Lingering {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let tcp = this.tcp.as_mut().expect("present until dropped");
        if tcp.is_registered() {
            return std::pin::Pin::new(tcp).poll_read(cx, buf);
        }
        this.poll_read_unregistered(cx, buf)
    }
}

impl Lingering {
    /// A read before the socket has had to wait: what has come, or a wait, which registers the
    /// socket unless the read only watches for the client going ([`Lingering::hold_off`]).
    #[inline(never)]
    fn poll_read_unregistered(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let tcp = self.tcp.as_mut().expect("present until dropped");
        if let Some(read) = tcp.read_now(buf) {
            return std::task::Poll::Ready(read);
        }
        if self.hold_off(cx) {
            return std::task::Poll::Pending;
        }
        // Registered from here: no watch needs the timer again (left armed, it would wake the
        // connection for nothing).
        self.watch = None;
        tokio::io::AsyncRead::poll_read(std::pin::Pin::new(self).get(), cx, buf)
    }
}

impl tokio::io::AsyncWrite for Lingering {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.get().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.get().poll_flush(cx)
    }

    /// Nothing to do for a quiet connection: closing sends the same FIN, a system call less (a
    /// TLS stream above has written its `close_notify` by then).
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.activity.is_quiet() {
            return std::task::Poll::Ready(Ok(()));
        }
        self.get().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One poll of a read of `tcp`: the bytes read, when it is ready.
    fn poll_read(tcp: &mut Lingering) -> std::task::Poll<std::io::Result<usize>> {
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        let mut buf = [0u8; 64];
        let mut buf = tokio::io::ReadBuf::new(&mut buf);
        tokio::io::AsyncRead::poll_read(Pin::new(tcp), &mut cx, &mut buf)
            .map_ok(|()| buf.filled().len())
    }

    fn registered(tcp: &Lingering) -> bool {
        tcp.tcp.as_ref().is_some_and(Socket::is_registered)
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_watched_for_its_client_going_is_registered_once_the_answer_takes_long() {
        use tokio::io::AsyncReadExt;
        let (socket, client) = super::super::socket::tests::pair().await;
        let activity = idle::Activity::new();
        let mut tcp = Lingering::new(socket, activity.clone());
        let _request = activity.begin();
        activity.watch_for_departure(true);
        assert!(poll_read(&mut tcp).is_pending());
        assert!(!registered(&tcp), "held off");
        // Gone while its answer is quick to come: noticed when the answer is sent.
        drop(client);
        tokio::time::sleep(WATCH_AFTER / 2).await;
        assert!(poll_read(&mut tcp).is_pending());
        assert!(!registered(&tcp), "still held off");
        // The answer takes long: the watch registers the socket, and the client is seen gone.
        tokio::time::sleep(WATCH_AFTER / 2).await;
        let mut buf = [0u8; 64];
        assert_eq!(tcp.read(&mut buf).await.unwrap(), 0);
        assert!(registered(&tcp));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_for_a_request_registers_at_once() {
        let (socket, _client) = super::super::socket::tests::pair().await;
        let activity = idle::Activity::new();
        let mut tcp = Lingering::new(socket, activity.clone());
        // The next request, say: nothing watched.
        assert!(poll_read(&mut tcp).is_pending());
        assert!(registered(&tcp));
    }
}
