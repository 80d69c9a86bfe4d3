//! [`Str`]: the string of the span model.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// An immutable string that is static (an attribute key, a span name, a
/// fixed value: no allocation), shared (a value the correlator puts on many
/// spans, such as a session id: cloned by a reference count) or owned (a
/// value made once, such as a redacted or cut one: no copy).
///
/// It compares, hashes and orders as its text, whichever the variant.
#[derive(Clone)]
pub enum Str {
    Static(&'static str),
    Shared(Arc<str>),
    Owned(String),
}

impl Str {
    /// A static string: no allocation.
    pub const fn from_static(s: &'static str) -> Self {
        Self::Static(s)
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Static(s) => s,
            Self::Shared(s) => s,
            Self::Owned(s) => s,
        }
    }

    /// The text as an owned `String` (moved when owned).
    pub fn into_string(self) -> String {
        match self {
            Self::Owned(s) => s,
            other => other.as_str().to_owned(),
        }
    }
}

impl Default for Str {
    fn default() -> Self {
        Self::Static("")
    }
}

impl Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Str {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Str {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

/// A copy of `s`, shared: cloning it later costs a reference count.
impl From<&str> for Str {
    fn from(s: &str) -> Self {
        Self::Shared(Arc::from(s))
    }
}

impl From<String> for Str {
    fn from(s: String) -> Self {
        Self::Owned(s)
    }
}

impl From<Arc<str>> for Str {
    fn from(s: Arc<str>) -> Self {
        Self::Shared(s)
    }
}

/// A clone: a shared string's reference count, not its text.
impl From<&Str> for Str {
    fn from(s: &Str) -> Self {
        s.clone()
    }
}

impl From<&Str> for String {
    fn from(s: &Str) -> Self {
        s.as_str().to_owned()
    }
}

impl From<Str> for String {
    fn from(s: Str) -> Self {
        s.into_string()
    }
}

impl PartialEq for Str {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Str {}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Str {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Str {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Str> for str {
    fn eq(&self, other: &Str) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Str> for &str {
    fn eq(&self, other: &Str) -> bool {
        *self == other.as_str()
    }
}

impl PartialOrd for Str {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Str {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Str {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn variants_compare_and_hash_as_their_text() {
        let all = [
            Str::from_static("gen_ai.request.model"),
            Str::from("gen_ai.request.model"),
            Str::from("gen_ai.request.model".to_owned()),
        ];
        for a in &all {
            for b in &all {
                assert_eq!(a, b);
                assert_eq!(a.cmp(b), std::cmp::Ordering::Equal);
            }
        }
        let mut map = HashMap::new();
        map.insert(all[0].clone(), 1);
        assert_eq!(map.get("gen_ai.request.model"), Some(&1));
        assert_eq!(map.get(&all[2]), Some(&1));
        assert_eq!(all[1], "gen_ai.request.model");
        assert_ne!(all[1], "gen_ai.request");
        assert!(
            Str::from("a".to_owned())
                .cmp(&Str::from_static("b"))
                .is_lt()
        );
        assert_eq!(Str::default(), "");
        assert_eq!(
            format!("{:?} {}", all[1], all[2]),
            "\"gen_ai.request.model\" gen_ai.request.model"
        );
    }

    #[test]
    fn shared_clones_share_and_owned_moves_out() {
        let shared = Str::from("session-1");
        let clone = shared.clone();
        assert!(std::ptr::eq(shared.as_ptr(), clone.as_ptr()));
        let text = String::from("cut");
        let ptr = text.as_ptr();
        let back = Str::from(text).into_string();
        assert_eq!(back.as_ptr(), ptr);
    }
}
