//! The collector's request message: an [`EventBatch`] as prost decodes it,
//! with the encoded length of its largest event read off the wire while it
//! is decoded.
//!
//! The ingest refuses a batch that holds an event above its
//! `max_event_bytes`. Measuring every decoded event again
//! (`Event::encoded_len`, a walk over all its fields) is a visible share of
//! the collector's work per event (`docs/BENCHMARKS.md`).
//! On the wire every event is a length-delimited field of the batch, so its
//! length is there to read: [`ReceivedBatch`] is the request message of the
//! generated server (`build.rs`) and reads each event's length prefix before
//! prost decodes the event.
//!
//! An event's length is its length on the wire: what prost writes for it
//! (`encoded_len`) for a batch prost encoded, the shim's, and never less
//! for any other (prost's encoding is the shortest; unknown fields, a field
//! sent twice or a longer varint than needed only add to it, and are not
//! kept). An event whose length prefix could not be read, because the
//! buffer came in pieces, is measured with `encoded_len` instead.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

use crate::v1::EventBatch;

/// Field number of `EventBatch.events`.
const EVENTS: u32 = 2;

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReceivedBatch {
    pub batch: EventBatch,
    /// The largest event read off the wire so far.
    largest: Option<LargestEvent>,
    /// An event's length prefix could not be read: measure every event.
    unread: bool,
}

/// An event of a batch and its encoded length (without the field's key and
/// length prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargestEvent {
    /// Its index in `EventBatch.events`.
    pub index: usize,
    pub len: usize,
}

impl ReceivedBatch {
    /// A batch that did not come from the wire: its events are measured
    /// when asked.
    pub fn new(batch: EventBatch) -> Self {
        Self {
            batch,
            largest: None,
            unread: true,
        }
    }

    /// The largest event (the first of equals), `None` without events.
    pub fn largest_event(&self) -> Option<LargestEvent> {
        if !self.unread {
            return self.largest;
        }
        self.batch
            .events
            .iter()
            .enumerate()
            .fold(None, |largest, (index, event)| {
                largest_of(largest, index, event.encoded_len())
            })
    }
}

/// `largest`, or the event at `index` of length `len` if it is larger.
fn largest_of(largest: Option<LargestEvent>, index: usize, len: usize) -> Option<LargestEvent> {
    match largest {
        Some(largest) if largest.len >= len => Some(largest),
        _ => Some(LargestEvent { index, len }),
    }
}

impl Message for ReceivedBatch {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.batch.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == EVENTS && wire_type == WireType::LengthDelimited {
            // Read from a copy of the current chunk: `buf` stays where prost
            // reads the same prefix again. A prefix cut at the chunk's end
            // (its last byte still says "more") does not decode.
            let mut prefix = buf.chunk();
            match prost::encoding::decode_varint(&mut prefix) {
                Ok(len) => {
                    let len = usize::try_from(len).unwrap_or(usize::MAX);
                    self.largest = largest_of(self.largest, self.batch.events.len(), len);
                }
                Err(_) => self.unread = true,
            }
        }
        self.batch.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.batch.encoded_len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::v1::{Event, ShimInfo};
    use proptest::prelude::*;
    use prost::bytes::Bytes;

    fn measured(batch: &EventBatch) -> Option<LargestEvent> {
        ReceivedBatch::new(batch.clone()).largest_event()
    }

    fn batch(hooks: &[usize]) -> EventBatch {
        EventBatch {
            shim: Some(ShimInfo {
                instance_id: "i".into(),
                ..Default::default()
            }),
            events: hooks
                .iter()
                .enumerate()
                .map(|(i, &len)| Event {
                    seq: i as u64 + 1,
                    hook: "h".repeat(len),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_largest_event_is_read_off_the_wire() {
        let sent = batch(&[10, 300, 300, 20]);
        let received = ReceivedBatch::decode(sent.encode_to_vec().as_slice()).unwrap();
        assert_eq!(received.batch, sent);
        assert!(!received.unread);
        let largest = received.largest_event().unwrap();
        assert_eq!(largest.index, 1, "the first of equals");
        assert_eq!(largest.len, sent.events[1].encoded_len());
        assert_eq!(received.largest_event(), measured(&sent));
        assert_eq!(
            ReceivedBatch::decode(&[][..]).unwrap().largest_event(),
            None
        );
    }

    #[test]
    fn a_buffer_in_pieces_is_measured_after_decoding() {
        let sent = batch(&[10, 300]);
        let wire = sent.encode_to_vec();
        // Cut inside the second event's two-byte length prefix.
        let second = wire.len() - sent.events[1].encoded_len() - 2;
        let (a, b) = wire.split_at(second + 1);
        let pieces = Bytes::copy_from_slice(a).chain(Bytes::copy_from_slice(b));
        let received = ReceivedBatch::decode(pieces).unwrap();
        assert!(received.unread);
        assert_eq!(received.largest_event(), measured(&sent));
    }

    fn event() -> impl Strategy<Value = Event> {
        (
            any::<u64>(),
            ".{0,20}",
            ".{0,300}",
            proptest::collection::btree_map(".{0,8}", ".{0,200}", 0..3),
        )
            .prop_map(|(seq, hook, thread, content)| Event {
                seq,
                hook,
                thread,
                content: content.into_iter().collect(),
                ..Default::default()
            })
    }

    proptest! {
        /// Whatever the events, and whatever bytes follow them.
        #[test]
        fn read_lengths_are_measured_lengths(
            events in proptest::collection::vec(event(), 0..6),
            trailer in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let sent = EventBatch { events, ..Default::default() };
            let received = ReceivedBatch::decode(sent.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(received.largest_event(), measured(&sent));
            // Bytes prost did not write: never shorter than the events
            // measured.
            let mut wire = sent.encode_to_vec();
            wire.extend_from_slice(&trailer);
            if let Ok(received) = ReceivedBatch::decode(wire.as_slice()) {
                let read = received.largest_event().map_or(0, |l| l.len);
                let measured = measured(&received.batch).map_or(0, |l| l.len);
                prop_assert!(read >= measured, "{} < {}", read, measured);
            }
        }
    }
}
