#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::v1::event::Body;
use crate::v1::{
    ApiCall, Approval, Ids, Other, Scalar, Session, ShimInfo, Subagent, ToolCall, Turn, Usage,
    scalar,
};
use crate::view::Source;
use proptest::prelude::*;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

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
        dropped_events: 3,
        floor_seq: 1,
        handoff: true,
    }
}

#[test]
fn a_batch_is_read_off_the_wire_and_its_events_decode() {
    let mut sent = batch(&[10, 300, 300, 20]);
    sent.events[3].ids = Some(Box::new(Ids {
        session_id: "s".repeat(40),
        turn_id: "t".repeat(70),
        ..Default::default()
    }));
    let wire = WireBatch::encode(&sent).unwrap();
    assert_eq!(wire.shim, sent.shim);
    assert_eq!(
        (wire.dropped_events, wire.floor_seq, wire.handoff),
        (3, 1, true)
    );
    assert_eq!(
        (wire.events, wire.first_seq, wire.last_seq),
        (4, Some(1), Some(4))
    );
    assert!(wire.increasing);
    let largest = wire.largest.unwrap();
    assert_eq!(largest.seq, 2, "the first of equals");
    assert_eq!(largest.len, sent.events[1].encoded_len());
    let id = wire.longest_id.unwrap();
    assert_eq!((id.seq, id.field, id.len), (4, "turn_id", 70));
    assert_eq!(wire.decode_events().unwrap(), sent.events);
    assert_eq!(wire.to_batch().unwrap(), sent);
}

#[test]
fn seqs_that_do_not_increase_are_noted() {
    let mut sent = batch(&[1, 1, 1]);
    sent.events[2].seq = 2;
    assert!(!WireBatch::encode(&sent).unwrap().increasing);
    let empty = WireBatch::from_wire(Bytes::new()).unwrap();
    assert_eq!((empty.events, empty.largest, empty.shim), (0, None, None));
    assert!(empty.increasing);
}

/// A batch's seqs form a run only when they increase by one from the
/// first to the last; its views are its events in order.
#[test]
fn a_gapless_batch_is_a_run() {
    let run = |seqs: &[u64]| {
        let mut sent = batch(&vec![1; seqs.len()]);
        for (event, &seq) in sent.events.iter_mut().zip(seqs) {
            event.seq = seq;
        }
        WireBatch::encode(&sent).unwrap().run()
    };
    assert_eq!(run(&[3, 4, 5]), Some(3..=5));
    assert_eq!(run(&[7]), Some(7..=7));
    assert_eq!(run(&[3, 5]), None, "a gap");
    assert_eq!(run(&[3, 5, 4]), None, "out of order");
    assert_eq!(run(&[3, 3]), None, "a redelivery");
    assert_eq!(run(&[]), None);
    let wire = WireBatch::encode(&batch(&[2, 5])).unwrap();
    let hooks: Vec<&str> = wire.views().iter().map(|e| e.hook).collect();
    assert_eq!(hooks, ["hh", "hhhhh"]);
}

/// A batch of more events than any collector accepts is refused before
/// its events are decoded: each view takes far more memory than the two
/// bytes an empty event takes on the wire.
#[test]
fn too_many_events_are_refused_before_they_are_decoded() {
    let most = [0x12, 0x00].repeat(MAX_EVENTS);
    assert_eq!(
        WireBatch::from_wire(Bytes::from(most)).unwrap().events,
        MAX_EVENTS
    );
    let more = [0x12, 0x00].repeat(MAX_EVENTS + 1);
    let error = WireBatch::from_wire(Bytes::from(more)).unwrap_err();
    assert_eq!(
        error,
        WireError::TooManyEvents {
            events: MAX_EVENTS + 1
        }
    );
    assert_eq!(
        error.to_string(),
        "65537 events in one batch, more than 65536"
    );
}

#[test]
fn malformed_bytes_are_refused_with_the_reason() {
    // Event (field 2) whose hook (field 2) is not UTF-8.
    let bad_text: &'static [u8] = &[0x12, 0x03, 0x12, 0x01, 0xff];
    assert_eq!(
        WireBatch::from_wire(Bytes::from_static(bad_text)),
        Err(WireError::NotUtf8 { tag: 2 })
    );
    // Event whose seq (a varint) comes length-delimited.
    let bad_type: &'static [u8] = &[0x12, 0x03, 0x0a, 0x01, 0x41];
    assert!(matches!(
        WireBatch::from_wire(Bytes::from_static(bad_type)),
        Err(WireError::WireType { tag: 1, .. })
    ));
    // An event longer than what follows.
    let truncated: &'static [u8] = &[0x12, 0x09, 0x08, 0x01];
    assert_eq!(
        WireBatch::from_wire(Bytes::from_static(truncated)),
        Err(WireError::Truncated)
    );
    // An unknown group (field 9, start and end).
    let group: &'static [u8] = &[0x4b, 0x4c];
    assert_eq!(
        WireBatch::from_wire(Bytes::from_static(group)),
        Err(WireError::Group { tag: 9 })
    );
    // A group in an API call's usage (decoded by prost, which skips groups).
    let nested_group: &'static [u8] = &[0x12, 0x06, 0x62, 0x04, 0x72, 0x02, 0x4b, 0x4c];
    assert_eq!(
        WireBatch::from_wire(Bytes::from_static(nested_group)),
        Err(WireError::Group { tag: 9 })
    );
    let bad_varint: &'static [u8] = &[
        0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    let error = WireBatch::from_wire(Bytes::from_static(bad_varint)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "failed to decode Protobuf message: invalid varint",
        "prost's words, once"
    );
    for bytes in [bad_text, bad_type, truncated, bad_varint] {
        assert!(EventBatch::decode(bytes).is_err(), "prost refuses it too");
    }
}

/// The views' fields against the descriptors protoc wrote for
/// `ingest.proto`: a field added to the `.proto` and not to its view
/// fails here.
#[test]
fn the_views_are_the_proto_files() {
    let set = FileDescriptorSet::decode(
        &include_bytes!(concat!(env!("OUT_DIR"), "/ingest.descriptors"))[..],
    )
    .unwrap();
    let message = |name: &str| -> &DescriptorProto {
        set.file[0]
            .message_type
            .iter()
            .find(|m| m.name() == name)
            .unwrap()
    };
    let views: [(&str, view::Fields); 7] = [
        ("Ids", view::Ids::FIELDS),
        ("Session", view::Session::FIELDS),
        ("Turn", view::Turn::FIELDS),
        ("ApiCall", view::ApiCall::FIELDS),
        ("ToolCall", view::ToolCall::FIELDS),
        ("Subagent", view::Subagent::FIELDS),
        ("Approval", view::Approval::FIELDS),
    ];
    for (name, fields) in views {
        let descriptor = message(name);
        assert_eq!(fields.len(), descriptor.field.len(), "{name}: fields");
        for field in &descriptor.field {
            let number = u32::try_from(field.number()).unwrap();
            let &(_, view_name, kind) = fields
                .iter()
                .find(|(tag, ..)| *tag == number)
                .unwrap_or_else(|| panic!("{name}.{}: not in the view", field.name()));
            assert_eq!(view_name, field.name(), "{name}: field {number}");
            let repeated = field.label() == Label::Repeated;
            let optional = field.proto3_optional();
            let ok = match (field.r#type(), kind) {
                (Type::String, "str") => !repeated,
                (Type::String, "strs") => repeated,
                (Type::Message, "usage") => field.type_name().ends_with(".Usage"),
                (Type::Bool, "opt_bool")
                | (Type::Uint64, "opt_uint64")
                | (Type::Int32, "opt_int32") => optional,
                (Type::Uint64, "uint64")
                | (Type::Uint32, "uint32")
                | (Type::Fixed64, "fixed64") => !optional && !repeated,
                _ => false,
            };
            assert!(
                ok,
                "{name}.{}: {:?} read as {kind}",
                field.name(),
                field.r#type()
            );
        }
    }
    // The event's own fields, which `view::Event::decode` reads by tag.
    let event = message("Event");
    let mut tags: Vec<i32> = event.field.iter().map(|f| f.number()).collect();
    tags.sort_unstable();
    let read: Vec<i32> = (1..=7).chain(10..=16).chain([20]).collect();
    assert_eq!(tags, read, "Event: the tags decode reads");
}

fn event() -> impl Strategy<Value = Event> {
    (
        (any::<u64>(), ".{0,20}", ".{0,300}", any::<u64>()),
        proptest::collection::btree_map(".{0,8}", ".{0,200}", 0..3),
        proptest::option::of((".{0,80}", ".{0,40}")),
        proptest::option::of(body()),
    )
        .prop_map(|((seq, hook, thread, time), content, ids, body)| Event {
            seq,
            hook,
            thread,
            time_unix_nano: time,
            content: content.into_iter().collect(),
            ids: ids.map(|(session_id, turn_id)| {
                Box::new(Ids {
                    session_id,
                    turn_id,
                    ..Default::default()
                })
            }),
            body,
            ..Default::default()
        })
}

/// One body of each kind, with a few of its fields set.
fn body() -> impl Strategy<Value = Body> {
    let text = || ".{0,30}";
    prop_oneof![
        (text(), text()).prop_map(|(model, reason)| Body::Session(Session {
            model,
            reason,
            ..Default::default()
        })),
        (text(), proptest::option::of(any::<bool>())).prop_map(|(model, completed)| {
            Body::Turn(Turn {
                model,
                completed,
                ..Default::default()
            })
        }),
        (
            (text(), text(), any::<u32>(), any::<u64>()),
            (
                proptest::option::of(any::<i32>()),
                proptest::option::of(any::<u64>())
            ),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(
                |((model, base_url, attempt, started), (status, max), input)| {
                    Body::Api(Box::new(ApiCall {
                        model,
                        base_url,
                        attempt,
                        started_at_unix_nano: started,
                        status_code: status,
                        max_tokens: max,
                        usage: input.map(|input_tokens| Usage {
                            input_tokens,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }))
                }
            ),
        (text(), proptest::option::of(any::<u64>())).prop_map(|(tool_name, duration_ms)| {
            Body::Tool(ToolCall {
                tool_name,
                duration_ms,
                ..Default::default()
            })
        }),
        text().prop_map(|child_goal| Body::Subagent(Subagent {
            child_goal,
            ..Default::default()
        })),
        (text(), proptest::collection::vec(text(), 0..3)).prop_map(|(surface, pattern_keys)| {
            Body::Approval(Box::new(Approval {
                surface,
                pattern_keys,
                ..Default::default()
            }))
        }),
        proptest::collection::hash_map(".{0,8}", any::<i64>(), 0..3).prop_map(|fields| {
            Body::Other(Other {
                fields: fields
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k,
                            Scalar {
                                value: Some(scalar::Value::IntValue(v)),
                            },
                        )
                    })
                    .collect(),
            })
        }),
    ]
}

/// Bytes changed at `at`: a byte replaced, the rest cut, or bytes put in.
#[derive(Debug, Clone)]
enum Damage {
    Set(usize, u8),
    Cut(usize),
    Insert(usize, Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Damage::Set(at, b)),
        any::<usize>().prop_map(Damage::Cut),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..6))
            .prop_map(|(at, b)| Damage::Insert(at, b)),
    ]
}

/// The batch's events as the stage reads them, copied back into prost's
/// messages.
fn views(wire: &WireBatch) -> Vec<Event> {
    let events = wire.wire_events();
    let views: Vec<Event> = events
        .iter()
        .map(|e| e.view().unwrap().to_event())
        .collect();
    for (event, view) in events.iter().zip(&views) {
        assert_eq!(event.seq(), view.seq);
    }
    views
}

proptest! {
    /// A batch prost encoded is accepted as it is; damaged, whatever the
    /// receiver accepts prost decodes to the same events. The stage's views of
    /// the events are prost's decoding, and so is a view of prost's event.
    #[test]
    fn the_receiver_accepts_no_more_than_prost(
        events in proptest::collection::vec(event(), 0..5),
        damages in proptest::collection::vec(damage(), 1..4),
    ) {
        let sent = EventBatch { events, ..batch(&[]) };
        let mut bytes = sent.encode_to_vec();
        let wire = WireBatch::from_wire(Bytes::from(bytes.clone())).unwrap();
        prop_assert_eq!(wire.decode_events().unwrap(), sent.events.clone());
        prop_assert_eq!(views(&wire), sent.events.clone());
        for event in &sent.events {
            prop_assert_eq!(&event.view().unwrap().to_event(), event);
        }
        let read = wire.largest.map(|l| (l.seq, l.len));
        // The first of equals: its seq and length.
        let measured = sent.events.iter().map(|e| (e.seq, e.encoded_len()))
            .fold(None, |m: Option<(u64, usize)>, (seq, len)| match m {
                Some(m) if m.1 >= len => Some(m),
                _ => Some((seq, len)),
            });
        prop_assert_eq!(read, measured);
        for damage in damages {
            match damage {
                Damage::Set(at, b) if !bytes.is_empty() => {
                    let at = at % bytes.len();
                    bytes[at] = b;
                }
                Damage::Cut(at) => bytes.truncate(at % (bytes.len() + 1)),
                Damage::Insert(at, b) => {
                    let at = at % (bytes.len() + 1);
                    bytes.splice(at..at, b);
                }
                Damage::Set(..) => {}
            }
        }
        // Counted first, as the receiver does, then read: the same verdict
        // and the same batch as read at once.
        let raw = RawBatch::new(Bytes::from(bytes.clone()));
        let counted = raw.events();
        let via_raw = raw.decode();
        let direct = WireBatch::from_wire(Bytes::from(bytes.clone()));
        prop_assert_eq!(via_raw.is_ok(), direct.is_ok());
        if let (Ok(via_raw), Ok(direct)) = (&via_raw, &direct) {
            prop_assert_eq!(counted.ok(), Some(direct.events));
            prop_assert_eq!(via_raw.decode_events().unwrap(), direct.decode_events().unwrap());
        }
        if let Ok(wire) = WireBatch::from_wire(Bytes::from(bytes.clone())) {
            let decoded = EventBatch::decode(bytes.as_slice());
            prop_assert!(decoded.is_ok(), "prost refused what the receiver accepted");
            let decoded = decoded.unwrap();
            prop_assert_eq!(wire.decode_events().unwrap(), decoded.events.clone());
            prop_assert_eq!(views(&wire), decoded.events.clone());
            prop_assert_eq!(wire.events, decoded.events.len());
            prop_assert_eq!(wire.last_seq, decoded.events.last().map(|e| e.seq));
            prop_assert_eq!(&wire.shim, &decoded.shim);
            // Never shorter than the event prost would write.
            let read = wire.largest.map_or(0, |l| l.len);
            let measured = decoded.events.iter().map(Message::encoded_len).max().unwrap_or(0);
            prop_assert!(read >= measured, "{} < {}", read, measured);
        }
    }
}
