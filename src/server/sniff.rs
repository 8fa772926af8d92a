//! sniff: what a connection speaks (HTTP/1 or HTTP/2; on a TLS port, TLS or not), told from its
//! first bytes, which are then read again by the connection.
//!
//! Why not hyper-util's `auto` server: it reads a new connection's first 24 bytes on their own,
//! so every new connection paid a second read (a system call), a failed parse of those 24 bytes,
//! and a copy of hyper's whole 8 KiB read buffer into a larger one. Here the first read takes what
//! the client has sent (its whole head, usually) and hyper parses it at once.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// HTTP/2's connection preface: a connection that starts with it speaks HTTP/2.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first read's buffer, in bytes: most requests' heads fit; a longer one is read on by hyper.
const FIRST_READ: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    H1,
    H2,
}

/// The version `first` (a connection's first bytes) tells, or `None` while it may still be the
/// preface.
pub fn version(first: &[u8]) -> Option<Version> {
    if first.len() >= PREFACE.len() {
        Some(match first.starts_with(PREFACE) {
            true => Version::H2,
            false => Version::H1,
        })
    } else if PREFACE.starts_with(first) {
        None
    } else {
        Some(Version::H1)
    }
}

/// Reads a connection's first bytes: the version they tell, and the bytes, to be read again
/// ([`Replay`]). `None` when the connection ends before its first byte.
pub async fn first_bytes<S: AsyncRead + Unpin>(
    io: &mut S,
) -> std::io::Result<Option<(Version, BytesMut)>> {
    let mut buf = BytesMut::with_capacity(FIRST_READ);
    loop {
        if io.read_buf(&mut buf).await? == 0 {
            // Ended within a preface's first bytes: hyper answers what it can of them.
            return Ok((!buf.is_empty()).then_some((Version::H1, buf)));
        }
        if let Some(v) = version(&buf) {
            return Ok(Some((v, buf)));
        }
    }
}

/// One read of what the client has sent (empty: the connection ended first).
pub async fn read_some<S: AsyncRead + Unpin>(io: &mut S) -> std::io::Result<BytesMut> {
    let mut buf = BytesMut::with_capacity(FIRST_READ);
    io.read_buf(&mut buf).await?;
    Ok(buf)
}

/// A connection whose first bytes, already read, are read again before the rest. (Kept as read:
/// freezing them into `Bytes` allocated a second time per connection.)
pub struct Replay<S> {
    first: BytesMut,
    io: S,
}

impl<S> Replay<S> {
    pub fn new(first: BytesMut, io: S) -> Replay<S> {
        Replay { first, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.first.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = this.first.len().min(buf.remaining());
        buf.put_slice(&this.first[..n]);
        this.first.advance(n);
        if this.first.is_empty() {
            // Let the allocation go now: the connection may live for minutes.
            this.first = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_tells_http2_and_anything_else_http1() {
        assert_eq!(version(PREFACE), Some(Version::H2));
        assert_eq!(
            version(&[PREFACE, b"\0\0\x12\x04"].concat()),
            Some(Version::H2)
        );
        assert_eq!(version(b"GET / HTTP/1.1\r\n"), Some(Version::H1));
        assert_eq!(version(b"P"), None);
        assert_eq!(version(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(version(b"PRIX"), Some(Version::H1));
        assert_eq!(
            version(b"POST / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(Version::H1)
        );
        // 24 bytes that only start like the preface.
        assert_eq!(
            version(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r"),
            Some(Version::H1)
        );
    }

    #[tokio::test]
    async fn first_bytes_read_until_they_tell_and_are_read_again() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let (v, first) = first_bytes(&mut server).await.unwrap().unwrap();
            let mut replay = Replay::new(first, server);
            let mut all = Vec::new();
            replay.read_to_end(&mut all).await.unwrap();
            (v, all)
        });
        use tokio::io::AsyncWriteExt;
        // The preface in pieces: the first read cannot tell yet.
        client.write_all(&PREFACE[..5]).await.unwrap();
        tokio::task::yield_now().await;
        client.write_all(&PREFACE[5..]).await.unwrap();
        client.write_all(b"frames").await.unwrap();
        drop(client);
        let (v, all) = reader.await.unwrap();
        assert_eq!(v, Version::H2);
        assert_eq!(all, [PREFACE, b"frames"].concat());
    }

    #[tokio::test]
    async fn a_connection_closed_before_a_byte_has_no_version() {
        let (client, mut server) = tokio::io::duplex(64);
        drop(client);
        assert!(first_bytes(&mut server).await.unwrap().is_none());
    }
}
