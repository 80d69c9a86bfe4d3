//! The gRPC codec of the `EventIngest` service: prost messages, decoded from
//! the received message's bytes as one slice.
//!
//! tonic hands a decoder a `DecodeBuf`, a length-limited view of its receive
//! buffer; prost reading through that `Buf` checks and advances it per field
//! and per varint, which made decoding an `EventBatch` a third slower than
//! decoding the same bytes from a `&[u8]` (`benches/`, criterion
//! `ingest_decode`). The received message is contiguous in that buffer, so
//! [`SliceCodec`] decodes from `DecodeBuf::chunk()` and then advances past
//! it; a buffer in pieces (not produced by tonic today) falls back to the
//! `Buf` path. Encoding is prost's, as in `tonic_prost::ProstCodec`.
//!
//! prost grows a repeated field one element at a time. For an `EventBatch`
//! of 512 events (808 bytes each) that is seven reallocations and 400 KiB
//! copied, and the large ones take fresh pages from the OS, which the
//! kernel zeroes (5 % of the collector's CPU under load in a perf profile;
//! +1 … +3 % events per CPU-second measured). [`Decode`] lets a
//! message size its repeated field from a walk over the wire's top-level
//! keys first ([`count_field`]).

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::Buf;
use prost::encoding::{WireType, decode_key, decode_varint};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Codec of prost messages `T` (sent) and `U` (received).
#[derive(Debug, Clone, Copy)]
pub struct SliceCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SliceCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SliceCodec<T, U>
where
    T: Message + Send + 'static,
    U: Decode + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SliceEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SliceEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Encoder of [`SliceCodec`].
#[derive(Debug)]
pub struct SliceEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SliceEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encode: {e}")))
    }
}

/// Decoder of [`SliceCodec`].
#[derive(Debug)]
pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Decode> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode(buf).map(Some)
    }
}

/// A message [`SliceCodec`] receives.
pub trait Decode: Message + Default {
    /// The empty message `encoded` is merged into; it may reserve room for
    /// its repeated fields. A hint only: `encoded` is not validated yet.
    fn for_wire(encoded: &[u8]) -> Self {
        let _ = encoded;
        Self::default()
    }
}

impl Decode for crate::v1::Ack {}

impl Decode for crate::v1::EventBatch {
    fn for_wire(encoded: &[u8]) -> Self {
        Self {
            events: Vec::with_capacity(count_field(encoded, 2)),
            ..Self::default()
        }
    }
}

/// How many times field `number` occurs at the top level of the encoded
/// message: its keys are read and every value skipped, without decoding
/// any. The walk stops at the first malformed key or value (decoding then
/// reports it), so the count is at most one per two bytes of `encoded`.
pub fn count_field(mut encoded: &[u8], number: u32) -> usize {
    let mut count = 0;
    while !encoded.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut encoded) else {
            break;
        };
        let skip = match wire_type {
            WireType::Varint => decode_varint(&mut encoded).map(|_| 0),
            WireType::SixtyFourBit => Ok(8),
            WireType::ThirtyTwoBit => Ok(4),
            WireType::LengthDelimited => decode_varint(&mut encoded),
            WireType::StartGroup | WireType::EndGroup => break,
        };
        let Some(skip) = skip.ok().and_then(|n| usize::try_from(n).ok()) else {
            break;
        };
        let Some(rest) = encoded.get(skip..) else {
            break;
        };
        encoded = rest;
        count += usize::from(tag == number);
    }
    count
}

/// Decodes one message that fills `buf`, from one slice when `buf` is
/// contiguous. Errors are `INTERNAL`, as tonic's prost codec reports them.
pub fn decode<U: Decode>(buf: &mut impl Buf) -> Result<U, Status> {
    let len = buf.remaining();
    let decoded = if buf.chunk().len() == len {
        let encoded = buf.chunk();
        let mut message = U::for_wire(encoded);
        let merged = message.merge(encoded).map(|()| message);
        buf.advance(len);
        merged
    } else {
        U::decode(buf)
    };
    decoded.map_err(|e| Status::internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::v1::{Event, EventBatch, ShimInfo};
    use prost::bytes::{Bytes, BytesMut};

    fn batch() -> EventBatch {
        EventBatch {
            shim: Some(ShimInfo {
                instance_id: "i".into(),
                ..Default::default()
            }),
            events: (1..=3)
                .map(|seq| Event {
                    seq,
                    hook: "pre_llm_call".into(),
                    ..Default::default()
                })
                .collect(),
            dropped_events: 2,
            floor_seq: 1,
        }
    }

    #[test]
    fn a_contiguous_buffer_is_decoded_whole_and_consumed() {
        let wire = batch().encode_to_vec();
        let mut buf = BytesMut::from(&wire[..]);
        buf.extend_from_slice(b"next message");
        let mut limited = (&mut buf).take(wire.len());
        assert_eq!(decode::<EventBatch>(&mut limited).unwrap(), batch());
        assert_eq!(&buf[..], b"next message");
    }

    #[test]
    fn a_buffer_in_pieces_is_decoded_through_buf() {
        let wire = batch().encode_to_vec();
        let (a, b) = wire.split_at(wire.len() / 2);
        let mut pieces = Bytes::copy_from_slice(a).chain(Bytes::copy_from_slice(b));
        assert_eq!(decode::<EventBatch>(&mut pieces).unwrap(), batch());
        assert_eq!(pieces.remaining(), 0);
    }

    #[test]
    fn a_batch_is_decoded_into_events_sized_from_the_wire() {
        let wire = batch().encode_to_vec();
        assert_eq!(count_field(&wire, 2), 3);
        assert_eq!(count_field(&wire, 1), 1);
        assert_eq!(count_field(&wire, 9), 0);
        let decoded = decode::<EventBatch>(&mut &wire[..]).unwrap();
        assert_eq!(decoded, batch());
        assert_eq!(decoded.events.capacity(), 3);
    }

    #[test]
    fn the_count_stops_at_a_malformed_key_or_value() {
        let events_only = EventBatch {
            events: batch().events,
            ..Default::default()
        };
        let mut cut = events_only.encode_to_vec();
        // The third event's length now runs past the end.
        cut.pop();
        assert_eq!(count_field(&cut, 2), 2);
        assert_eq!(count_field(&[0x12, 0xff, 0xff, 0xff], 2), 0);
        assert_eq!(
            count_field(&[0x0b, 0x12, 0x00], 2),
            0,
            "a group stops the walk"
        );
        assert_eq!(count_field(&[], 2), 0);
        // Decoding the cut message still reports the error.
        assert!(decode::<EventBatch>(&mut &cut[..]).is_err());
    }

    #[test]
    fn garbage_is_an_internal_error() {
        let mut buf = Bytes::from_static(&[0x0a, 0xff, 0xff, 0xff]);
        let status = decode::<EventBatch>(&mut buf).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
    }
}
