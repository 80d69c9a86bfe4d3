//! The UTF-8 check of a message's string fields, done for most of them at
//! once.
//!
//! Checking each string field on its own costs a call per field, most of
//! it fixed overhead for strings of 10–80 bytes (ids, hooks, models,
//! URLs). [`Strings`] checks the message's bytes as a whole up to the
//! first byte that is not UTF-8 (keys, lengths and small numbers below 128
//! are ASCII, and so are most values): a string field inside that prefix
//! is a slice of it, which takes only a check that both its ends are
//! character boundaries. A field past the prefix, or one whose ends are
//! not boundaries, is checked on its own. Either way a field is accepted
//! exactly when it is UTF-8. The event itself checks its few strings each
//! on its own ([`Strings::each`]): its prefix would run on into the nested
//! messages, which check their own bytes.

use std::str::from_utf8;

/// A message's bytes and their longest prefix that is UTF-8.
pub(crate) struct Strings<'a> {
    message: &'a [u8],
    prefix: &'a str,
}

impl<'a> Strings<'a> {
    /// For a message without nested messages before its last string (the
    /// prefix would check a nested message's bytes twice).
    pub(crate) fn new(message: &'a [u8]) -> Self {
        let prefix = match from_utf8(message) {
            Ok(all) => all,
            Err(e) => message
                .get(..e.valid_up_to())
                .and_then(|valid| from_utf8(valid).ok())
                .unwrap_or_default(),
        };
        Self { message, prefix }
    }

    /// For a message whose string fields are checked each on its own: the
    /// event, whose nested messages check their own.
    pub(crate) fn each(message: &'a [u8]) -> Self {
        Self {
            message,
            prefix: "",
        }
    }

    /// `field`, a part of the message, as text; `None` when it is not
    /// UTF-8.
    pub(crate) fn get(&self, field: &'a [u8]) -> Option<&'a str> {
        // Where the field starts in the message (the address difference of
        // two slices of one buffer).
        let start = (field.as_ptr() as usize).wrapping_sub(self.message.as_ptr() as usize);
        start
            .checked_add(field.len())
            .and_then(|end| self.prefix.get(start..end))
            .or_else(|| from_utf8(field).ok())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_field_is_accepted_exactly_when_it_is_utf8() {
        // "é" is two bytes; 0xff is never UTF-8.
        let message = "ab\u{e9}cd"
            .bytes()
            .chain([0xff, b'x', 0xc3, 0xa9])
            .collect::<Vec<u8>>();
        let strings = Strings::new(&message);
        assert_eq!(
            strings.get(&message[0..4]),
            Some("ab\u{e9}"),
            "inside the prefix"
        );
        assert_eq!(strings.get(&message[0..3]), None, "ends inside a character");
        assert_eq!(
            strings.get(&message[3..5]),
            None,
            "starts inside a character"
        );
        assert_eq!(strings.get(&message[7..8]), Some("x"), "past the prefix");
        assert_eq!(
            strings.get(&message[8..10]),
            Some("\u{e9}"),
            "past the prefix"
        );
        assert_eq!(strings.get(&message[6..8]), None, "not UTF-8");
        assert_eq!(strings.get(&message[10..10]), Some(""));
        // A slice of another buffer is checked on its own.
        assert_eq!(strings.get(b"other"), Some("other"));
    }
}
