//! gzip of OTLP/gRPC export requests at a chosen level.
//!
//! tonic's own request compression always deflates at level 6, and it
//! compresses the frame the codec wrote: the whole uncompressed request
//! copied into tonic's buffer first. Here the exporter compresses the
//! request's encoded parts itself, at its configured level, before the
//! codec ([`gzip_parts`]): the codec copies only the compressed bytes.
//! Such a request carries the [`Gzipped`] extension, and the channel's
//! wrapper, [`GzipRequests`], marks its frame compressed (the frame's flag
//! byte, `grpc-encoding: gzip`). A request without the extension, or a
//! body that is not exactly one uncompressed frame, is sent as it came.
//! Responses pass untouched (tonic decompresses them itself).

use std::error::Error as StdError;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderValue;
use http_body_util::BodyExt as _;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::transport::Channel;

/// Errors of the wrapped channel, boxed as tonic boxes them (so a
/// connection failure still maps to `UNAVAILABLE`).
type BoxError = Box<dyn StdError + Send + Sync>;

/// Length of a gRPC frame's header: the compressed flag and the length.
const FRAME_HEADER: usize = 5;

/// The extension of a request whose message is already gzip-compressed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gzipped;

/// The exporter's channel, marking the frames of [`Gzipped`] requests
/// compressed.
#[derive(Debug, Clone)]
pub(crate) struct GzipRequests {
    inner: Channel,
}

impl GzipRequests {
    pub(crate) fn new(inner: Channel) -> Self {
        Self { inner }
    }
}

impl Service<http::Request<Body>> for GzipRequests {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone is not ready: the channel polled ready is the one that
        // takes the call (tower's convention), the clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if request.extensions().get::<Gzipped>().is_none() {
            let call = inner.call(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            // The body's error is tonic's `Status` (an encoding failure):
            // boxed, tonic finds it again and reports it as it was.
            let frame = body.collect().await?.to_bytes();
            let body = match marked_compressed(frame) {
                Ok(frame) => {
                    parts
                        .headers
                        .insert("grpc-encoding", HeaderValue::from_static("gzip"));
                    frame
                }
                Err(frame) => frame,
            };
            inner
                .call(http::Request::from_parts(
                    parts,
                    Body::new(http_body_util::Full::new(body)),
                ))
                .await
                .map_err(Into::into)
        })
    }
}

/// `frame` with its compressed flag set; `Err` with the frame as it was
/// when it is not exactly one uncompressed frame.
fn marked_compressed(frame: Bytes) -> Result<Bytes, Bytes> {
    let declared = match frame.get(..FRAME_HEADER) {
        Some(&[0, a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
        _ => return Err(frame),
    };
    if usize::try_from(declared).ok() != Some(frame.len() - FRAME_HEADER) {
        return Err(frame);
    }
    // The frame is the compressed message: small, and usually tonic's
    // alone, so this takes it without a copy.
    let mut frame = frame
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    frame[0] = 1;
    Ok(frame.freeze())
}

/// The gzip stream of `parts` one after another, at `level` (0–9).
pub(crate) fn gzip_parts(parts: &[Bytes], level: u32) -> Bytes {
    let len: usize = parts.iter().map(Bytes::len).sum();
    // Room for the message at a third of its size: OTLP spans compress
    // about that well or better, so the vector rarely grows.
    let out = Vec::with_capacity(len / 3 + 64);
    let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::new(level));
    // Writing into a vector cannot fail.
    for part in parts {
        let _ = encoder.write_all(part);
    }
    Bytes::from(encoder.finish().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::Read as _;

    use super::*;

    fn frame(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut f = vec![flag];
        f.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        f.extend_from_slice(message);
        f
    }

    fn gunzip(frame: &[u8]) -> Vec<u8> {
        assert_eq!(frame[0], 1, "compressed flag");
        let len = u32::from_be_bytes(frame[1..5].try_into().unwrap());
        assert_eq!(len as usize, frame.len() - FRAME_HEADER);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&frame[FRAME_HEADER..])
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn parts_are_compressed_as_one_message_at_every_level() {
        let message: Vec<u8> = b"span attributes repeat: gen_ai.request.model "
            .iter()
            .copied()
            .cycle()
            .take(10_000)
            .collect();
        let parts: Vec<Bytes> = message.chunks(3_000).map(Bytes::copy_from_slice).collect();
        let mut sizes = Vec::new();
        for level in [0, 1, 6, 9] {
            let compressed = gzip_parts(&parts, level);
            let frame = marked_compressed(Bytes::from(frame(0, &compressed))).unwrap();
            assert_eq!(gunzip(&frame), message, "level {level}");
            sizes.push(compressed.len());
        }
        assert!(sizes[0] > message.len(), "level 0 stores: {sizes:?}");
        assert!(sizes[1] < message.len() / 10, "{sizes:?}");
        let empty = marked_compressed(Bytes::from(frame(0, &gzip_parts(&[], 1)))).unwrap();
        assert!(gunzip(&empty).is_empty());
    }

    #[test]
    fn anything_but_one_uncompressed_frame_is_left_alone() {
        let unchanged = |f: &[u8]| {
            let f = Bytes::copy_from_slice(f);
            assert_eq!(marked_compressed(f.clone()), Err(f));
        };
        unchanged(&frame(1, b"already"));
        unchanged(b"\0\0\0");
        let mut two = frame(0, b"one");
        two.extend_from_slice(&frame(0, b"two"));
        unchanged(&two);
        let mut short = frame(0, b"message");
        short.pop();
        unchanged(&short);
    }
}
