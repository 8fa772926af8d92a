//! body: a request's body as the handlers see it, whichever HTTP/1 server read the request.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::server::passed::Passed;

/// A request's body: read by hyper as it arrives, or already read whole by the gateway's own
/// HTTP/1 server ([`super::h1`]), which takes only bodies of a known, small length.
#[derive(Debug)]
pub enum RequestBody {
    Hyper(Incoming),
    /// `None` once read. Beside it, the fields that the own server hands on as lines and did not
    /// put in the request's map ([`crate::server::passed::Passes`]): they go with the body because the
    /// body is what goes upstream with the head (a request's extensions would allocate a map
    /// for them), and only the own server reads bodies whole.
    Whole(Option<Bytes>, Passed),
}

impl RequestBody {
    /// A body of these bytes (none when empty).
    pub fn whole(bytes: Bytes) -> RequestBody {
        RequestBody::read(bytes, Passed::default())
    }

    /// A body of these bytes (none when empty), with the fields handed on beside it.
    pub fn read(bytes: Bytes, passed: Passed) -> RequestBody {
        RequestBody::Whole((!bytes.is_empty()).then_some(bytes), passed)
    }

    /// Takes the fields handed on as lines, if any.
    pub fn take_passed(&mut self) -> Passed {
        match self {
            RequestBody::Whole(_, passed) => std::mem::take(passed),
            RequestBody::Hyper(_) => Passed::default(),
        }
    }
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> RequestBody {
        RequestBody::Hyper(body)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx),
            RequestBody::Whole(b, _) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Hyper(b) => b.is_end_stream(),
            RequestBody::Whole(b, _) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Hyper(b) => b.size_hint(),
            RequestBody::Whole(b, _) => {
                SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_whole_body_is_its_bytes_once_and_an_empty_one_has_ended() {
        let b = RequestBody::whole(Bytes::from_static(b"abc"));
        assert_eq!(b.size_hint().exact(), Some(3));
        assert!(!b.is_end_stream());
        assert_eq!(b.collect().await.unwrap().to_bytes(), "abc");
        let empty = RequestBody::whole(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
    }
}
