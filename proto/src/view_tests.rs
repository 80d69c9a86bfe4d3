#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use prost::Message;

fn entry(key: &str, value: &str) -> Vec<u8> {
    let mut entry = Vec::new();
    prost::encoding::string::encode(1, &key.to_owned(), &mut entry);
    prost::encoding::string::encode(2, &value.to_owned(), &mut entry);
    let mut field = Vec::new();
    prost::encoding::encode_key(20, WireType::LengthDelimited, &mut field);
    prost::encoding::encode_varint(entry.len() as u64, &mut field);
    field.extend(entry);
    field
}

#[test]
fn the_last_entry_of_a_content_key_is_its_value_as_for_prost() {
    let mut bytes = v1::Event {
        seq: 7,
        hook: "pre_llm_call".into(),
        ..Default::default()
    }
    .encode_to_vec();
    bytes.extend(entry("user_message", "first"));
    bytes.extend(entry("other", "x"));
    bytes.extend(entry("user_message", "second"));
    let event = WireEvent::new(Bytes::from(bytes.clone())).unwrap();
    assert_eq!(event.seq(), 7);
    let view = event.view().unwrap();
    assert_eq!(view.hook, "pre_llm_call");
    assert_eq!(view.content.get("user_message"), Some("second"));
    assert_eq!(view.content.get("missing"), None);
    assert_eq!(
        view.to_event(),
        v1::Event::decode(bytes.as_slice()).unwrap()
    );
}

#[test]
fn a_message_field_sent_twice_is_merged_and_another_body_case_replaces() {
    let first = v1::Event {
        ids: Some(Box::new(v1::Ids {
            session_id: "s".into(),
            ..Default::default()
        })),
        body: Some(v1::event::Body::Tool(v1::ToolCall {
            tool_name: "t".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let second = v1::Event {
        ids: Some(Box::new(v1::Ids {
            turn_id: "u".into(),
            ..Default::default()
        })),
        body: Some(v1::event::Body::Api(Box::new(v1::ApiCall {
            attempt: 2,
            ..Default::default()
        }))),
        ..Default::default()
    };
    let mut bytes = first.encode_to_vec();
    bytes.extend(second.encode_to_vec());
    let view = Event::decode(&bytes).unwrap();
    let ids = view.ids.clone().unwrap();
    assert_eq!((ids.session_id, ids.turn_id), ("s", "u"));
    assert!(matches!(&view.body, Some(Body::Api(api)) if api.attempt == 2));
    assert_eq!(
        view.to_event(),
        v1::Event::decode(bytes.as_slice()).unwrap()
    );
}

#[test]
fn malformed_content_is_refused_when_the_event_is_decoded() {
    let mut bytes = v1::Event::default().encode_to_vec();
    // An entry whose key is not UTF-8.
    bytes.extend([0xa2, 0x01, 0x03, 0x0a, 0x01, 0xff]);
    assert_eq!(
        Event::decode(&bytes).unwrap_err(),
        WireError::NotUtf8 { tag: 1 }
    );
}
