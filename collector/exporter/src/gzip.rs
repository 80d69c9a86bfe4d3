//! gzip of OTLP/gRPC export requests at a chosen level.
//!
//! Owns [`GzipRequests`], the gRPC exporter's channel wrapped so that the
//! message of each request leaves gzip-compressed (`grpc-encoding: gzip`,
//! the frame's compressed flag set) at the exporter's configured level.
//! tonic's own request compression always deflates at level 6; with the
//! exporter compressing, that deflate is the collector's largest stage in
//! instructions per span (`docs/BENCHMARKS.md`), and the level trades it
//! against the bytes on the wire.
//!
//! tonic encodes the unary request into one uncompressed gRPC frame (flag
//! byte 0, the message length as 4 bytes big-endian, the message); this
//! wrapper reads that body, compresses the message into a new frame and
//! sends it on. A body that is not exactly one uncompressed frame (not
//! produced by the exporter) is sent as it came. Responses pass untouched
//! (tonic decompresses them itself). Without a level the wrapper only
//! forwards.

use std::error::Error as StdError;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
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

/// The exporter's channel, compressing request messages with gzip at
/// `level` (0–9) when one is set.
#[derive(Debug, Clone)]
pub(crate) struct GzipRequests {
    inner: Channel,
    level: Option<u32>,
}

impl GzipRequests {
    pub(crate) fn new(inner: Channel, level: Option<u32>) -> Self {
        Self { inner, level }
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
        let Some(level) = self.level else {
            let call = inner.call(request);
            return Box::pin(async move { call.await.map_err(Into::into) });
        };
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            // The body's error is tonic's `Status` (an encoding failure):
            // boxed, tonic finds it again and reports it as it was.
            let frame = body.collect().await?.to_bytes();
            let body = match gzip_frame(&frame, level) {
                Some(compressed) => {
                    parts
                        .headers
                        .insert("grpc-encoding", HeaderValue::from_static("gzip"));
                    Body::new(http_body_util::Full::new(compressed))
                }
                None => Body::new(http_body_util::Full::new(frame)),
            };
            inner
                .call(http::Request::from_parts(parts, body))
                .await
                .map_err(Into::into)
        })
    }
}

/// The gRPC frame holding `frame`'s message gzip-compressed at `level`;
/// `None` when `frame` is not exactly one uncompressed frame.
fn gzip_frame(frame: &[u8], level: u32) -> Option<Bytes> {
    let (header, message) = frame.split_at_checked(FRAME_HEADER)?;
    let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    if header[0] != 0 || usize::try_from(declared).ok()? != message.len() {
        return None;
    }
    // Room for the message at a third of its size: OTLP spans compress
    // about that well or better, so the vector rarely grows.
    let mut out = Vec::with_capacity(FRAME_HEADER + message.len() / 3 + 64);
    out.extend_from_slice(&[1, 0, 0, 0, 0]);
    let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::new(level));
    // Writing into a vector cannot fail.
    encoder.write_all(message).ok()?;
    let mut out = encoder.finish().ok()?;
    let len = u32::try_from(out.len() - FRAME_HEADER).ok()?;
    out[1..FRAME_HEADER].copy_from_slice(&len.to_be_bytes());
    Some(Bytes::from(out))
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
    fn a_frame_is_compressed_at_every_level() {
        let message: Vec<u8> = b"span attributes repeat: gen_ai.request.model "
            .iter()
            .copied()
            .cycle()
            .take(10_000)
            .collect();
        let mut sizes = Vec::new();
        for level in [0, 1, 6, 9] {
            let compressed = gzip_frame(&frame(0, &message), level).unwrap();
            assert_eq!(gunzip(&compressed), message, "level {level}");
            sizes.push(compressed.len());
        }
        assert!(sizes[0] > message.len(), "level 0 stores: {sizes:?}");
        assert!(sizes[1] < message.len() / 10, "{sizes:?}");
        let empty = gzip_frame(&frame(0, b""), 1).unwrap();
        assert!(gunzip(&empty).is_empty());
    }

    #[test]
    fn anything_but_one_uncompressed_frame_is_left_alone() {
        assert_eq!(gzip_frame(&frame(1, b"already"), 1), None);
        assert_eq!(gzip_frame(b"\0\0\0", 1), None);
        let mut two = frame(0, b"one");
        two.extend_from_slice(&frame(0, b"two"));
        assert_eq!(gzip_frame(&two, 1), None);
        let mut short = frame(0, b"message");
        short.pop();
        assert_eq!(gzip_frame(&short, 1), None);
    }
}
