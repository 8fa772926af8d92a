//! outgoing: a request's body on its way upstream. Most bodies stream from the client as they
//! arrive; a small one with a known length that goes through the gateway's own exchange
//! ([`super::raw`]) is read whole first, as nginx's request buffering does, so that its head and
//! body go in one write and a request that a reused connection could not take can be sent again
//! on a new one (a streamed body cannot: its bytes are gone).

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::server::RequestBody;
use crate::server::passed::Passed;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};

/// The largest request body read whole before it is sent, in bytes (64 KiB). A larger one, or
/// one without a `Content-Length`, streams through hyper's client. The own HTTP/1.1 server's
/// bound, so that what it reads whole is what is sent whole.
pub const WHOLE_MAX: u64 = crate::server::h1::BODY_MAX;

/// Request body sent upstream: the client's body, cut off at the configured size.
pub enum Outgoing {
    /// Read from the client as it is sent on.
    Streaming(Limited<RequestBody>),
    /// Read whole ([`Outgoing::read_whole`]); `None` once sent. Beside it, the request's fields
    /// that the own server handed on as lines ([`Passed`]): the own exchange writes them as they
    /// are, and before any other way upstream they go back into the map
    /// ([`Outgoing::take_passed`]).
    Whole(Option<Bytes>, Passed),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Outgoing {
    /// The client's `body`, at most `max` bytes of it; `headers`, its request's (which take back
    /// the fields handed on as lines, unless they stay beside a whole body).
    pub fn new(mut body: RequestBody, max: usize, headers: &mut HeaderMap) -> Outgoing {
        let passed = body.take_passed();
        match body {
            // Read whole by the gateway's own server already: nothing to wait for.
            RequestBody::Whole(b, _) if b.as_ref().is_none_or(|b| b.len() <= max) => {
                Outgoing::Whole(Some(b.unwrap_or_default()), passed)
            }
            body => {
                passed.restore(headers);
                Outgoing::Streaming(Limited::new(body, max))
            }
        }
    }

    /// The fields handed on as lines, to be written after the request's map's.
    pub fn passed(&self) -> &[u8] {
        match self {
            Outgoing::Whole(_, passed) => passed.as_bytes(),
            Outgoing::Streaming(_) => &[],
        }
    }

    /// Takes the fields handed on as lines: for a way upstream that writes a request's map
    /// (hyper's client), which takes them back ([`Passed::restore`]).
    pub fn take_passed(&mut self) -> Passed {
        match self {
            Outgoing::Whole(_, passed) => std::mem::take(passed),
            Outgoing::Streaming(_) => Passed::default(),
        }
    }

    /// Whether the body can be sent by the gateway's own exchange: none, already whole, or a
    /// length of at most [`WHOLE_MAX`].
    pub fn fits_whole(&self) -> bool {
        match self {
            Outgoing::Whole(..) => true,
            Outgoing::Streaming(b) => {
                b.is_end_stream() || b.size_hint().exact().is_some_and(|n| n <= WHOLE_MAX)
            }
        }
    }

    /// Reads the rest of a streaming body, so that it is whole; the error is the client's body's
    /// (cut short, past the size limit).
    pub async fn read_whole(&mut self) -> Result<(), BoxError> {
        if let Outgoing::Streaming(b) = self {
            *self = Outgoing::Whole(Some(b.collect().await?.to_bytes()), Passed::default());
        }
        Ok(())
    }

    /// The bytes of a whole body (empty for a streaming one).
    pub fn whole(&self) -> &[u8] {
        match self {
            Outgoing::Whole(Some(b), _) => b,
            _ => &[],
        }
    }
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Outgoing::Streaming(b) => Pin::new(b).poll_frame(cx),
            Outgoing::Whole(b, _) => Poll::Ready(
                b.take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Outgoing::Streaming(b) => b.is_end_stream(),
            Outgoing::Whole(b, _) => b.as_ref().is_none_or(Bytes::is_empty),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Outgoing::Streaming(b) => b.size_hint(),
            Outgoing::Whole(b, _) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_read_whole_by_the_server_is_whole_within_its_limit() {
        let map = &mut HeaderMap::new();
        let b = Outgoing::new(RequestBody::whole(Bytes::from_static(b"abc")), 3, map);
        assert!(matches!(&b, Outgoing::Whole(Some(w), _) if w == "abc"));
        let none = Outgoing::new(RequestBody::whole(Bytes::new()), 3, map);
        assert!(none.is_end_stream() && none.fits_whole());
        // Over the limit: it fails as a streamed one would (413).
        let mut over = Outgoing::new(RequestBody::whole(Bytes::from_static(b"abcd")), 3, map);
        assert!(over.read_whole().await.is_err());
    }

    #[tokio::test]
    async fn a_whole_body_is_sent_once_with_its_length() {
        let mut body = Outgoing::Whole(Some(Bytes::from_static(b"hello")), Passed::default());
        assert!(body.fits_whole());
        assert_eq!(body.whole(), b"hello");
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert!(
            body.read_whole().await.is_ok(),
            "a whole body stays as it is"
        );
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"hello"));
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}
