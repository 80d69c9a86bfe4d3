//! gzip of OTLP/gRPC export requests at a chosen level.
//!
//! tonic's own request compression always deflates at level 6, and it
//! compresses the frame the codec wrote: the whole uncompressed request
//! copied into tonic's buffer first. Here the exporter compresses the
//! request's encoded parts itself, at its configured level, with a deflate
//! state it keeps from one request to the next ([`Gzip`]), and sends the
//! compressed stream as the request's message ([`crate::framed`]).

use bytes::Bytes;
use flate2::{Compress, Compression, Crc, FlushCompress, Status};

/// Output room reserved whenever less than this is left.
const MIN_ROOM: usize = 4096;

/// The gzip compressor of one exporter. Its deflate state (a few hundred
/// KiB, the hash table zeroed) is made once and reset for each request,
/// rather than allocated and freed per request.
pub(crate) struct Gzip {
    level: Compression,
    deflate: Compress,
}

impl Gzip {
    /// A compressor at `level` (0–9).
    pub(crate) fn new(level: u32) -> Self {
        let level = Compression::new(level);
        Self {
            level,
            deflate: Compress::new(level, false),
        }
    }

    /// The gzip stream of `parts` one after another: the header flate2's
    /// `GzEncoder` writes, the raw deflate stream, then the CRC-32 and the
    /// length (RFC 1952). `None` if deflate fails, which it does not on
    /// memory it owns.
    pub(crate) fn compress(&mut self, parts: &[Bytes]) -> Option<Bytes> {
        let len: usize = parts.iter().map(Bytes::len).sum();
        // Room for the message at a third of its size: OTLP spans compress
        // about that well or better, so the vector rarely grows.
        let mut out = Vec::with_capacity(len / 3 + 64);
        out.extend_from_slice(&header(self.level));
        self.deflate.reset();
        let mut crc = Crc::new();
        for part in parts {
            crc.update(part);
            self.deflate_into(part, FlushCompress::None, &mut out)?;
        }
        self.deflate_into(&[], FlushCompress::Finish, &mut out)?;
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(&crc.amount().to_le_bytes());
        Some(Bytes::from(out))
    }

    /// Deflates all of `input` into `out` (with `Finish`, to the end of the
    /// stream), growing `out` as needed.
    fn deflate_into(
        &mut self,
        mut input: &[u8],
        flush: FlushCompress,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        loop {
            if out.capacity() - out.len() < MIN_ROOM {
                out.reserve(out.capacity().max(MIN_ROOM));
            }
            let (read, written) = (self.deflate.total_in(), out.len());
            let status = self.deflate.compress_vec(input, out, flush).ok()?;
            let consumed = usize::try_from(self.deflate.total_in() - read).ok()?;
            input = input.get(consumed..)?;
            let done = match flush {
                FlushCompress::Finish => status == Status::StreamEnd,
                _ => input.is_empty(),
            };
            if done {
                return Some(());
            }
            // With room in `out`, a call that neither read nor wrote is
            // stuck: never loop on it.
            if consumed == 0 && out.len() == written {
                return None;
            }
        }
    }
}

/// The 10-byte gzip header flate2's `GzEncoder` writes: no name, time or
/// extra field, the level hint, and "unknown" as the operating system.
fn header(level: Compression) -> [u8; 10] {
    let xfl = if level.level() >= Compression::best().level() {
        2
    } else if level.level() <= Compression::fast().level() {
        4
    } else {
        0
    };
    [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, xfl, 255]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::{Read as _, Write as _};

    use super::*;

    fn gunzip(compressed: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(compressed)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    /// flate2's own gzip of `parts`, written one after another.
    fn gz_encoder(parts: &[Bytes], level: u32) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Compression::new(level));
        for part in parts {
            encoder.write_all(part).unwrap();
        }
        encoder.finish().unwrap()
    }

    fn repeating(len: usize) -> Vec<u8> {
        b"span attributes repeat: gen_ai.request.model "
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect()
    }

    /// Bytes that do not compress (deflate's output is larger than a third
    /// of them, so the output vector must grow).
    fn noise(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn parts_are_compressed_as_one_message_at_every_level() {
        let message = repeating(10_000);
        let parts: Vec<Bytes> = message.chunks(3_000).map(Bytes::copy_from_slice).collect();
        let mut sizes = Vec::new();
        for level in [0, 1, 6, 9] {
            let compressed = Gzip::new(level).compress(&parts).unwrap();
            assert_eq!(gunzip(&compressed), message, "level {level}");
            sizes.push(compressed.len());
        }
        assert!(sizes[0] > message.len(), "level 0 stores: {sizes:?}");
        assert!(sizes[1] < message.len() / 10, "{sizes:?}");
        assert!(gunzip(&Gzip::new(1).compress(&[]).unwrap()).is_empty());
    }

    #[test]
    fn a_kept_compressor_writes_what_a_new_gz_encoder_writes_for_each_message() {
        let messages: Vec<Vec<Bytes>> = vec![
            repeating(100_000)
                .chunks(7_000)
                .map(Bytes::copy_from_slice)
                .collect(),
            vec![Bytes::from(noise(300_000, 7))],
            vec![],
            vec![
                Bytes::from_static(b"x"),
                Bytes::new(),
                Bytes::from(noise(70_000, 9)),
            ],
            repeating(1_000)
                .chunks(10)
                .map(Bytes::copy_from_slice)
                .collect(),
        ];
        // Level 0 (stored) splits its blocks where the output buffer ends,
        // which differs: its stream is checked by reading it back.
        for level in [0, 1, 6, 9] {
            let mut gzip = Gzip::new(level);
            for (i, parts) in messages.iter().enumerate() {
                let compressed = gzip.compress(parts).unwrap();
                if level == 0 {
                    assert_eq!(gunzip(&compressed), parts.concat(), "message {i}");
                } else {
                    assert_eq!(
                        compressed.as_ref(),
                        gz_encoder(parts, level).as_slice(),
                        "level {level}, message {i}"
                    );
                }
            }
        }
    }
}
