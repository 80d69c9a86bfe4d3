//! gRPC requests framed from their encoded message, without a copy.
//!
//! tonic's client writes a request's message through its codec into a
//! buffer of its own, then frames that buffer: for the exporter, whose
//! requests are encoded before they are sent (the shared batch's parts, or
//! their gzip stream), a copy of the whole message per attempt. Here the
//! request carries its message as the [`Message`] extension and an empty
//! body for tonic's codec ([`crate::grpc`]); the channel's wrapper,
//! [`FramedRequests`], replaces the empty frame tonic made with the
//! message's own: the five-byte header (the compressed flag and the length)
//! and then the parts, each sent as it is. A compressed message also gets
//! `grpc-encoding: gzip`. A request without the extension is sent as it
//! came. Responses pass untouched (tonic decompresses them itself).

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut as _, Bytes, BytesMut};
use http::HeaderValue;
use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::transport::Channel;

/// Errors of the wrapped channel, boxed as tonic boxes them (so a
/// connection failure still maps to `UNAVAILABLE`).
type BoxError = Box<dyn StdError + Send + Sync>;

/// Length of a gRPC frame's header: the compressed flag and the length.
const FRAME_HEADER: usize = 5;

/// The message of a request, already encoded: its parts one after
/// another, gzip-compressed when `compressed`.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub(crate) parts: Vec<Bytes>,
    pub(crate) compressed: bool,
}

/// The exporter's channel, sending the [`Message`] of each request that
/// carries one as its body.
#[derive(Debug, Clone)]
pub(crate) struct FramedRequests {
    inner: Channel,
}

impl FramedRequests {
    pub(crate) fn new(inner: Channel) -> Self {
        Self { inner }
    }
}

impl Service<http::Request<Body>> for FramedRequests {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone is not ready: the channel polled ready is the one that
        // takes the call (tower's convention), the clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if let Some(message) = request.extensions_mut().remove::<Message>() {
            let compressed = message.compressed;
            match Parts::framing(message) {
                Ok(body) => {
                    // tonic's frame of the codec's empty message is dropped
                    // unread.
                    let (mut parts, _) = request.into_parts();
                    if compressed {
                        parts
                            .headers
                            .insert("grpc-encoding", HeaderValue::from_static("gzip"));
                    }
                    request = http::Request::from_parts(parts, Body::new(body));
                }
                Err(status) => return Box::pin(async move { Err(status.into()) }),
            }
        }
        let call = inner.call(request);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

/// A body of one gRPC frame: its header, then the message's parts.
#[derive(Debug)]
struct Parts {
    chunks: std::vec::IntoIter<Bytes>,
    /// Bytes not yet yielded.
    remaining: u64,
}

impl Parts {
    /// The frame of `message`; a message longer than a frame can say (4 GiB)
    /// is refused, as tonic refuses it.
    fn framing(message: Message) -> Result<Self, tonic::Status> {
        let len: usize = message.parts.iter().map(Bytes::len).sum();
        let declared = u32::try_from(len).map_err(|_| {
            tonic::Status::resource_exhausted(format!(
                "an export request of {len} bytes is longer than a gRPC message can be"
            ))
        })?;
        let mut header = BytesMut::with_capacity(FRAME_HEADER);
        header.put_u8(u8::from(message.compressed));
        header.put_u32(declared);
        let mut chunks = Vec::with_capacity(message.parts.len() + 1);
        chunks.push(header.freeze());
        chunks.extend(message.parts.into_iter().filter(|part| !part.is_empty()));
        Ok(Self {
            chunks: chunks.into_iter(),
            remaining: (FRAME_HEADER + len) as u64,
        })
    }
}

impl http_body::Body for Parts {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let chunk = self.chunks.next();
        if let Some(chunk) = &chunk {
            self.remaining -= chunk.len() as u64;
        }
        Poll::Ready(chunk.map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.len() == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use http_body::Body as _;
    use http_body_util::BodyExt as _;

    use super::*;

    async fn frame(parts: Vec<Bytes>, compressed: bool) -> (Vec<Bytes>, Bytes) {
        let body = Parts::framing(Message { parts, compressed }).unwrap();
        assert_eq!(body.size_hint().exact(), Some(body.remaining));
        let mut body = std::pin::pin!(body);
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            chunks.push(frame.unwrap().into_data().unwrap());
        }
        assert!(body.is_end_stream());
        let whole = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        (chunks, whole)
    }

    #[tokio::test]
    async fn the_frame_is_the_header_then_each_part_as_it_is() {
        let abc = Bytes::copy_from_slice(b"abc");
        let parts = vec![abc.clone(), Bytes::new(), Bytes::from_static(b"defg")];
        let (chunks, whole) = frame(parts, false).await;
        assert_eq!(&whole[..], b"\0\0\0\0\x07abcdefg");
        assert_eq!(chunks.len(), 3, "the empty part is skipped: {chunks:?}");
        assert_eq!(
            chunks[1].as_ptr(),
            abc.as_ptr(),
            "a part is sent without a copy"
        );
        let (_, whole) = frame(vec![Bytes::from_static(b"gz")], true).await;
        assert_eq!(&whole[..], b"\x01\0\0\0\x02gz");
        let (chunks, whole) = frame(Vec::new(), false).await;
        assert_eq!((&whole[..], chunks.len()), (&b"\0\0\0\0\0"[..], 1));
    }
}
