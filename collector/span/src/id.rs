//! [`Id`]: a trace or span id, held in place.
//!
//! OTLP's ids are 16 bytes (a trace's) or 8 (a span's), or empty for none.
//! Every span the correlator builds holds three of them, and as `Vec<u8>`
//! each was an allocation of its own, freed again after the export. An id
//! of up to 16 bytes is kept inline; a longer one (only in a message
//! converted from prost's, whose ids may have any length) on the heap, so
//! the model still holds whatever an OTLP message carries.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// Longest id kept inline: a trace id.
const INLINE: usize = 16;

/// A trace or span id; see the module docs. Reads as its bytes (`Deref`
/// to `[u8]`).
#[derive(Clone)]
pub struct Id(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Vec<u8>),
}

impl Id {
    /// An id of these bytes.
    pub fn new(bytes: &[u8]) -> Self {
        let mut inline = [0; INLINE];
        match (inline.get_mut(..bytes.len()), u8::try_from(bytes.len())) {
            (Some(prefix), Ok(len)) => {
                prefix.copy_from_slice(bytes);
                Self(Repr::Inline { len, bytes: inline })
            }
            _ => Self(Repr::Heap(bytes.to_vec())),
        }
    }

    /// The id's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Heap(bytes) => bytes,
        }
    }
}

impl Default for Id {
    fn default() -> Self {
        Self(Repr::Inline {
            len: 0,
            bytes: [0; INLINE],
        })
    }
}

impl Deref for Id {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Id {}

impl Hash for Id {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialEq<Vec<u8>> for Id {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Id {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.as_slice() == other
    }
}

impl<const N: usize> From<[u8; N]> for Id {
    fn from(bytes: [u8; N]) -> Self {
        Self::new(&bytes)
    }
}

impl From<Vec<u8>> for Id {
    fn from(bytes: Vec<u8>) -> Self {
        if bytes.len() <= INLINE {
            Self::new(&bytes)
        } else {
            Self(Repr::Heap(bytes))
        }
    }
}

impl From<Id> for Vec<u8> {
    fn from(id: Id) -> Self {
        match id.0 {
            Repr::Heap(bytes) => bytes,
            inline => Id(inline).as_slice().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_every_length_read_back_as_their_bytes() {
        for len in [0, 1, 8, 15, 16, 17, 40] {
            let bytes: Vec<u8> = (1..=len as u8).collect();
            let id = Id::from(bytes.clone());
            assert_eq!(id.as_slice(), &bytes[..], "{len}");
            assert_eq!(Id::new(&bytes), id);
            assert_eq!(Vec::from(id.clone()), bytes);
            assert_eq!(matches!(id.0, Repr::Inline { .. }), len <= INLINE, "{len}");
        }
        assert!(Id::default().is_empty());
        assert_eq!(Id::from([7u8; 8]), [7u8; 8]);
    }
}
