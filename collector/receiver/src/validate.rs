//! What makes a received batch acceptable: the pure checks the stream loop
//! runs on every message before anything else sees it, on what
//! [`WireBatch::from_wire`] read off the wire (the events themselves are
//! decoded later, by the correlation stage).
//!
//! Owns [`check_batch`] and its verdict, [`Refusal`]. Pure and total: no I/O,
//! no allocation, no panic on any input (the wire fuzz target
//! `fuzz/fuzz_targets/wire.rs` feeds it every batch the receiver's decoding accepts
//! from arbitrary bytes).
//!
//! Checks, in order (the first failure is reported):
//! 1. the batch names its shim (`ShimInfo` with a non-empty `instance_id`);
//! 2. at most [`Limits::max_events_per_batch`] events;
//! 3. no event is longer than [`Limits::max_event_bytes`] on the wire
//!    ([`WireBatch::largest`]);
//! 4. seqs strictly increase within the batch, and none is `u64::MAX` (a
//!    shim counts from 1 and never gets there; the sequencer's "next seq"
//!    after it would not exist);
//! 5. no correlation id (the shim's `instance_id`, and each event's
//!    `session_id`, `turn_id`, `api_request_id`, `tool_call_id`, …; the
//!    longest is named) is longer than [`MAX_ID_BYTES`]: the correlator
//!    keeps them as keys of its open state, and Hermes' own are under 64
//!    bytes. A refused batch
//!    stays at the head of its shim's buffer until the shim evicts it (as
//!    for `max_event_bytes`), so a shim that sent one would resend it
//!    until then; Hermes never makes such ids.

use hermes_proto::wire::WireBatch;
use tonic::Status;

use crate::Limits;

/// Longest correlation id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Why a batch is refused. Every refusal ends its stream with
/// [`Refusal::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `ShimInfo`, or an empty `instance_id`: `INVALID_ARGUMENT`.
    NoShim,
    /// More events than `max_events_per_batch`: `RESOURCE_EXHAUSTED`.
    TooManyEvents { events: usize, limit: usize },
    /// An event longer than `max_event_bytes`: `RESOURCE_EXHAUSTED`.
    EventTooLarge {
        seq: u64,
        bytes: usize,
        limit: usize,
    },
    /// Seqs that do not strictly increase: `INVALID_ARGUMENT`.
    SeqNotIncreasing,
    /// A seq of `u64::MAX`: `INVALID_ARGUMENT`.
    SeqOutOfRange,
    /// A correlation id longer than [`MAX_ID_BYTES`]: `INVALID_ARGUMENT`
    /// naming the field.
    IdTooLong {
        seq: u64,
        field: &'static str,
        bytes: usize,
    },
}

impl Refusal {
    /// The status the stream ends with; its message names the limit.
    pub fn status(&self) -> Status {
        match self {
            Self::NoShim => {
                Status::invalid_argument("event batch without shim info (ShimInfo.instance_id)")
            }
            Self::TooManyEvents { events, limit } => Status::resource_exhausted(format!(
                "{events} events in one batch, more than the limit of {limit} (max_events_per_batch)"
            )),
            Self::EventTooLarge { seq, bytes, limit } => Status::resource_exhausted(format!(
                "event seq {seq} is {bytes} bytes, more than the limit of {limit} (max_event_bytes)"
            )),
            Self::SeqNotIncreasing => {
                Status::invalid_argument("events of a batch must have strictly increasing seq")
            }
            Self::SeqOutOfRange => {
                Status::invalid_argument("event seq out of range (at most 2^64 - 2)")
            }
            Self::IdTooLong { seq, field, bytes } => Status::invalid_argument(format!(
                "event seq {seq}: {field} is {bytes} bytes, more than the limit of {MAX_ID_BYTES}"
            )),
        }
    }
}

/// Checks `batch` against `limits` (see the module docs).
pub fn check_batch(batch: &WireBatch, limits: &Limits) -> Result<(), Refusal> {
    let instance = match &batch.shim {
        Some(shim) if !shim.instance_id.is_empty() => &shim.instance_id,
        _ => return Err(Refusal::NoShim),
    };
    if batch.events > limits.max_events_per_batch {
        return Err(Refusal::TooManyEvents {
            events: batch.events,
            limit: limits.max_events_per_batch,
        });
    }
    if let Some(largest) = batch.largest
        && largest.len > limits.max_event_bytes
    {
        return Err(Refusal::EventTooLarge {
            seq: largest.seq,
            bytes: largest.len,
            limit: limits.max_event_bytes,
        });
    }
    if !batch.increasing {
        return Err(Refusal::SeqNotIncreasing);
    }
    // Increasing: only the last can be u64::MAX.
    if batch.last_seq == Some(u64::MAX) {
        return Err(Refusal::SeqOutOfRange);
    }
    if instance.len() > MAX_ID_BYTES {
        return Err(Refusal::IdTooLong {
            seq: batch.first_seq.unwrap_or(0),
            field: "shim.instance_id",
            bytes: instance.len(),
        });
    }
    if let Some(id) = batch.longest_id
        && id.len > MAX_ID_BYTES
    {
        return Err(Refusal::IdTooLong {
            seq: id.seq,
            field: id.field,
            bytes: id.len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::v1::{Event, EventBatch, ShimInfo};
    use prost::Message;

    fn wire(batch: &EventBatch) -> WireBatch {
        WireBatch::encode(batch).unwrap()
    }

    fn batch(hooks: &[(u64, usize)]) -> EventBatch {
        EventBatch {
            shim: Some(ShimInfo {
                instance_id: "i".into(),
                ..Default::default()
            }),
            events: hooks
                .iter()
                .map(|&(seq, len)| Event {
                    seq,
                    hook: "h".repeat(len),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn each_limit_is_named() {
        let limits = Limits {
            max_event_bytes: 100,
            max_events_per_batch: 3,
            ..Limits::default()
        };
        assert_eq!(
            check_batch(&wire(&batch(&[(1, 10), (2, 80)])), &limits),
            Ok(())
        );
        let big = check_batch(&wire(&batch(&[(1, 10), (2, 200)])), &limits).unwrap_err();
        assert!(
            matches!(
                big,
                Refusal::EventTooLarge {
                    seq: 2,
                    limit: 100,
                    ..
                }
            ),
            "{big:?}"
        );
        let status = big.status();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("max_event_bytes"), "{status:?}");
        let many =
            check_batch(&wire(&batch(&[(1, 1), (2, 1), (3, 1), (4, 1)])), &limits).unwrap_err();
        assert!(many.status().message().contains("max_events_per_batch"));
        assert_eq!(
            check_batch(&wire(&batch(&[(2, 1), (2, 1)])), &limits),
            Err(Refusal::SeqNotIncreasing)
        );
        assert_eq!(
            check_batch(&wire(&batch(&[(1, 1), (u64::MAX, 1)])), &limits),
            Err(Refusal::SeqOutOfRange)
        );
        let with_turn_id = |len: usize| {
            let mut b = batch(&[(1, 1), (2, 1)]);
            b.events[1].ids = Some(Box::new(hermes_proto::v1::Ids {
                turn_id: "t".repeat(len),
                ..Default::default()
            }));
            wire(&b)
        };
        let limits_ids = Limits::default();
        let refusal = check_batch(&with_turn_id(MAX_ID_BYTES + 1), &limits_ids).unwrap_err();
        let status = refusal.status();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("turn_id") && status.message().contains("256"),
            "{status:?}"
        );
        assert_eq!(
            check_batch(&with_turn_id(MAX_ID_BYTES), &limits_ids),
            Ok(()),
            "the limit itself is fine"
        );
        let mut anonymous = batch(&[(1, 1)]);
        anonymous.shim = None;
        assert_eq!(
            check_batch(&wire(&anonymous), &limits),
            Err(Refusal::NoShim)
        );
    }

    #[test]
    fn an_event_is_as_long_as_it_was_on_the_wire() {
        let limits = Limits {
            max_event_bytes: 100,
            ..Limits::default()
        };
        // An event of 12 bytes, padded with an unknown field of 200 that
        // prost skips when decoding.
        let small = batch(&[(1, 10)]);
        let mut event = small.events[0].encode_to_vec();
        prost::encoding::bytes::encode(99, &vec![0u8; 200], &mut event);
        let mut wire = EventBatch {
            events: Vec::new(),
            ..small.clone()
        }
        .encode_to_vec();
        prost::encoding::bytes::encode(2, &event, &mut wire);
        let received = WireBatch::from_wire(wire.into()).unwrap();
        assert_eq!(
            received.decode_events().unwrap(),
            small.events,
            "the padding is not kept"
        );
        assert_eq!(
            check_batch(&received, &limits),
            Err(Refusal::EventTooLarge {
                seq: 1,
                bytes: event.len(),
                limit: 100,
            })
        );
    }
}
