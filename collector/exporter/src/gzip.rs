//! gzip of OTLP/gRPC export requests at a chosen level.
//!
//! tonic's own request compression always deflates at level 6, and it
//! compresses the frame the codec wrote: the whole uncompressed request
//! copied into tonic's buffer first. Here the exporter compresses the
//! request's encoded parts itself, at its configured level
//! ([`gzip_parts`]), and sends the compressed stream as the request's
//! message ([`crate::framed`]).

use std::io::Write as _;

use bytes::Bytes;

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

    fn gunzip(compressed: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(compressed)
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
            assert_eq!(gunzip(&compressed), message, "level {level}");
            sizes.push(compressed.len());
        }
        assert!(sizes[0] > message.len(), "level 0 stores: {sizes:?}");
        assert!(sizes[1] < message.len() / 10, "{sizes:?}");
        assert!(gunzip(&gzip_parts(&[], 1)).is_empty());
    }
}
