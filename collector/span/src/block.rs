//! [`SharedAttributes`]: the attributes that lead every span of one turn,
//! held once for all of them.
//!
//! The correlator puts the same few attributes first on every span of a
//! turn (its session, conversation, turn and task ids, platform and agent
//! name). Each span still carries them in its own `attributes`, so that
//! every reader sees a plain attribute list; the span also points at the
//! turn's block, which holds those attributes' strings and where they
//! are, in one allocation per turn. The block lets the stages that cost
//! per attribute do that work once per turn: the span processor finds
//! them clean once per pass, the OTLP encoder encodes them once and copies
//! the bytes.
//!
//! The block is a cache, never the truth: a stage uses it only for a span
//! whose leading attributes are still *the same* as the block's, keys and
//! string values at the same addresses ([`SharedAttributes::leads`]). The
//! block holds its strings, so no other text can be at one of those
//! addresses: the same address and length is the same text. A stage that
//! rewrites one of them (a redacted value, a renamed key, a cut) replaces
//! the string, so the span no longer matches its block and is treated
//! attribute by attribute.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::Str;
use crate::common::v1::{AnyValue, KeyValue, any_value::Value};

/// A turn's leading attributes, shared by its spans, or none (the
/// default); see the module docs. Cloned by a reference count.
#[derive(Clone, Default)]
pub struct SharedAttributes(Option<Arc<Block>>);

/// The most attributes a block holds (a turn leads with six or seven):
/// they are held in place, in the block's one allocation.
const MAX_ATTRIBUTES: usize = 8;

struct Block {
    /// The attributes' keys and string values, the first `len`: held so
    /// that no other text can take their addresses.
    strings: [(Str, Str); MAX_ATTRIBUTES],
    /// The address and length of each.
    texts: [(Text, Text); MAX_ATTRIBUTES],
    len: usize,
    /// The attributes as a span's repeated field, once an encoder asked.
    encoded: OnceLock<Box<[u8]>>,
}

impl SharedAttributes {
    /// A block of `attributes`: at most [`MAX_ATTRIBUTES`], each with a
    /// string value, else none.
    pub fn new(attributes: &[KeyValue]) -> Self {
        if attributes.len() > MAX_ATTRIBUTES {
            return Self::default();
        }
        let mut block = Block {
            strings: Default::default(),
            texts: Default::default(),
            len: attributes.len(),
            encoded: OnceLock::new(),
        };
        for (i, kv) in attributes.iter().enumerate() {
            let Some(value) = string_value(kv) else {
                return Self::default();
            };
            // The addresses of the block's own strings: a shared or static
            // one's clone is where the original is, an owned one's is a copy.
            let (key, value) = (kv.key.clone(), value.clone());
            block.texts[i] = (text(&key), text(&value));
            block.strings[i] = (key, value);
        }
        Self(Some(Arc::new(block)))
    }

    /// Number of attributes the block holds (none without a block).
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether there is a block and `attributes` start with its
    /// attributes, the same strings by address: then whatever holds of the
    /// block's attributes holds of theirs.
    pub fn leads(&self, attributes: &[KeyValue]) -> bool {
        let Some(block) = &self.0 else {
            return false;
        };
        let (Some(texts), Some(head)) = (block.texts.get(..block.len), attributes.get(..block.len))
        else {
            return false;
        };
        texts.iter().zip(head).all(|(&(key, value), kv)| {
            text(&kv.key) == key && string_value(kv).is_some_and(|v| text(v) == value)
        })
    }

    /// The block's attributes encoded by `encode`, made on the first call
    /// and kept (nothing without a block). `attributes` is a list the
    /// block leads, whose first [`Self::len`] are handed to `encode`;
    /// every caller must encode them the same way (the OTLP encoder, as a
    /// span's attributes).
    pub fn encoded(
        &self,
        attributes: &[KeyValue],
        encode: impl FnOnce(&[KeyValue]) -> Vec<u8>,
    ) -> &[u8] {
        debug_assert!(
            self.0.is_none() || self.leads(attributes),
            "a list the block does not lead"
        );
        self.0.as_ref().map_or(&[], |b| {
            b.encoded.get_or_init(|| {
                encode(attributes.get(..b.len).unwrap_or_default()).into_boxed_slice()
            })
        })
    }

    /// Address of the block (0 without one), for memos that last no longer
    /// than a clone of it.
    pub fn address(&self) -> usize {
        self.0.as_ref().map_or(0, |b| Arc::as_ptr(b) as usize)
    }

    /// Approximate bytes the block holds once encoded: its strings, the
    /// encoding and the keys' share.
    pub fn approx_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |b| {
            let texts = b.texts.iter().take(b.len);
            size_of::<Block>() + texts.map(|(k, v)| 2 * (k.1 + v.1)).sum::<usize>()
        })
    }
}

fn string_value(kv: &KeyValue) -> Option<&Str> {
    match kv.value.as_ref() {
        Some(AnyValue {
            value: Some(Value::StringValue(s)),
        }) => Some(s),
        _ => None,
    }
}

/// A text's address and length.
type Text = (usize, usize);

fn text(s: &str) -> Text {
    (s.as_ptr() as usize, s.len())
}

/// The block is a cache of a span's attributes, not a part of its value:
/// spans compare equal whatever their blocks.
impl PartialEq for SharedAttributes {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for SharedAttributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedAttributes({})", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: Str, value: Str) -> KeyValue {
        KeyValue {
            key,
            value: Some(AnyValue {
                value: Some(Value::StringValue(value)),
            }),
        }
    }

    #[test]
    fn leads_only_the_same_strings() {
        let id = Str::from("session-1");
        let key = Str::from_static("session.id");
        let own = kv(Str::from_static("hermes.x"), Str::from("y"));
        let block = SharedAttributes::new(&[kv(key.clone(), id.clone())]);
        assert!(block.leads(&[kv(key.clone(), id.clone()), own.clone()]));
        assert!(block.leads(&[kv(key.clone(), id.clone())]));
        assert!(!block.leads(&[]), "too short");
        assert!(
            !block.leads(&[kv(key.clone(), Str::from("session-1"))]),
            "an equal text elsewhere (a rewritten value) is not the block's"
        );
        assert!(
            !block.leads(&[kv(Str::from("session.id"), id.clone())]),
            "a renamed key is not the block's"
        );
        assert!(!block.leads(&[own, kv(key, id)]), "not leading");
        let original = [kv(Str::from_static("k"), Str::from("v".to_owned()))];
        assert!(
            !SharedAttributes::new(&original).leads(&original),
            "an owned string is copied into the block, to another address"
        );
        let number = KeyValue {
            key: Str::from_static("n"),
            value: Some(AnyValue {
                value: Some(Value::IntValue(1)),
            }),
        };
        let block = SharedAttributes::new(std::slice::from_ref(&number));
        assert!(!block.leads(&[number]), "only string values are compared");
    }

    #[test]
    fn encodes_once() {
        let lead = [kv(Str::from_static("k"), Str::from("v"))];
        let block = SharedAttributes::new(&lead);
        let mut calls = 0;
        for _ in 0..3 {
            let encoded = block.encoded(&lead, |attributes| {
                calls += 1;
                assert_eq!(attributes, lead);
                vec![1, 2]
            });
            assert_eq!(encoded, [1, 2]);
        }
        assert_eq!(calls, 1);
        assert_eq!(block, SharedAttributes::default(), "a cache, not a value");
        let none = SharedAttributes::default();
        assert!(!none.leads(&[]), "no block leads nothing");
        assert!(none.encoded(&[], |_| vec![1]).is_empty());
    }

    #[test]
    fn a_block_holds_a_few_attributes_in_place() {
        let many: Vec<_> = (0..=MAX_ATTRIBUTES)
            .map(|_| kv(Str::from_static("k"), Str::from("v")))
            .collect();
        assert!(SharedAttributes::new(&many[..MAX_ATTRIBUTES]).leads(&many));
        let too_many = SharedAttributes::new(&many);
        assert!(too_many.is_empty() && !too_many.leads(&many));
    }
}
