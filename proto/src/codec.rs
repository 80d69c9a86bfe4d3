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
//! The server receives with [`WireCodec`]: the message's bytes, taken out
//! of tonic's buffer without a copy, become a [`FromWire`] message (the
//! ingest's [`RawBatch`](crate::wire::RawBatch), which the receiver turns
//! into a [`WireBatch`](crate::wire::WireBatch) when the pipeline has room).

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::{Buf, Bytes};
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
    U: Message + Default + Send + 'static,
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

impl<U: Message + Default> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode(buf).map(Some)
    }
}

/// Decodes one message that fills `buf`, from one slice when `buf` is
/// contiguous. Errors are `INTERNAL`, as tonic's prost codec reports them.
pub fn decode<U: Message + Default>(buf: &mut impl Buf) -> Result<U, Status> {
    let len = buf.remaining();
    let decoded = if buf.chunk().len() == len {
        let message = U::decode(buf.chunk());
        buf.advance(len);
        message
    } else {
        U::decode(buf)
    };
    decoded.map_err(|e| Status::internal(e.to_string()))
}

/// A message made from the bytes it came in.
pub trait FromWire: Sized {
    /// Why bytes are not such a message: the status the call ends with.
    type Error: Into<Status>;

    fn from_wire(bytes: Bytes) -> Result<Self, Self::Error>;
}

impl FromWire for crate::wire::WireBatch {
    type Error = crate::wire::WireError;

    fn from_wire(bytes: Bytes) -> Result<Self, Self::Error> {
        Self::from_wire(bytes)
    }
}

impl FromWire for crate::wire::RawBatch {
    type Error = crate::wire::WireError;

    fn from_wire(bytes: Bytes) -> Result<Self, Self::Error> {
        Ok(Self::new(bytes))
    }
}

/// Codec of prost messages `T` (sent) and [`FromWire`] messages `U`
/// (received).
#[derive(Debug, Clone, Copy)]
pub struct WireCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: Message + Send + 'static,
    U: FromWire + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SliceEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SliceEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder(PhantomData)
    }
}

/// Decoder of [`WireCodec`].
#[derive(Debug)]
pub struct WireDecoder<U>(PhantomData<U>);

impl<U: FromWire> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        U::from_wire(bytes).map(Some).map_err(Into::into)
    }
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
            handoff: false,
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
    fn garbage_is_an_internal_error() {
        let mut buf = Bytes::from_static(&[0x0a, 0xff, 0xff, 0xff]);
        let status = decode::<EventBatch>(&mut buf).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
    }
}
