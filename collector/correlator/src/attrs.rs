//! Small builders for OTLP attribute lists.
//!
//! Keys are static strings (no allocation); string values are copied once
//! into a shared [`Str`], so the spans of a turn that repeat one (the
//! session id, the model) share it. Values of few distinct texts that
//! every turn repeats (providers, server addresses, response models, finish
//! reasons, tool names and statuses, and the span names made of them) are
//! shared across turns through an [`Interner`]: one copy per text, most of
//! them static (no reference count to take per span), and the span
//! processor, which remembers a shared value's verdict by its address for a
//! pass, scans each such text once per pass instead of once per span. The
//! platform and a subagent's role go through it too.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

use hermes_span::Str;
use hermes_span::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};

/// An attribute list under construction. Empty strings are skipped: Hermes
/// passes `None` or `""` for absent values and a backend should not show them.
#[derive(Debug, Default, Clone)]
pub struct Attrs(pub Vec<KeyValue>);

/// Approximate bytes one attribute holds: its key and a string value's
/// text (other values are counted in the record's fixed share).
pub(crate) fn approx_bytes(kv: &KeyValue) -> usize {
    let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.len(),
        _ => 0,
    };
    32 + kv.key.len() + value
}

/// One attribute.
pub(crate) fn kv(key: &'static str, value: Value) -> KeyValue {
    KeyValue {
        key: Str::from_static(key),
        value: Some(AnyValue { value: Some(value) }),
    }
}

impl Attrs {
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    pub fn str(&mut self, key: &'static str, value: &str) -> &mut Self {
        if !value.is_empty() {
            self.0.push(kv(key, Value::StringValue(value.into())));
        }
        self
    }

    /// A value of few distinct texts (a provider, a server address, a tool
    /// name), shared through `values` with every other span that has it.
    pub(crate) fn common_str(
        &mut self,
        key: &'static str,
        value: &str,
        values: &mut Interner,
    ) -> &mut Self {
        if !value.is_empty() {
            self.0.push(kv(key, Value::StringValue(values.get(value))));
        }
        self
    }

    /// A fixed value: no allocation.
    pub fn fixed(&mut self, key: &'static str, value: &'static str) -> &mut Self {
        self.shared(key, &Str::from_static(value))
    }

    /// `shared` when `value` is its text (the turn's model on each chat
    /// span), else a copy of `value`.
    pub fn shared_or_str(&mut self, key: &'static str, shared: &Str, value: &str) -> &mut Self {
        if *shared == value {
            self.shared(key, shared)
        } else {
            self.str(key, value)
        }
    }

    /// A value that is already a [`Str`] (static, or shared with other
    /// spans): no copy.
    pub fn shared(&mut self, key: &'static str, value: &Str) -> &mut Self {
        if !value.is_empty() {
            self.0.push(kv(key, Value::StringValue(value.clone())));
        }
        self
    }

    pub fn int(&mut self, key: &'static str, value: i64) -> &mut Self {
        self.0.push(kv(key, Value::IntValue(value)));
        self
    }

    /// Unsigned values are clamped into OTLP's signed 64-bit integer.
    pub fn uint(&mut self, key: &'static str, value: u64) -> &mut Self {
        self.int(key, i64::try_from(value).unwrap_or(i64::MAX))
    }

    pub fn opt_uint(&mut self, key: &'static str, value: Option<u64>) -> &mut Self {
        if let Some(v) = value {
            self.uint(key, v);
        }
        self
    }

    pub fn bool(&mut self, key: &'static str, value: bool) -> &mut Self {
        self.0.push(kv(key, Value::BoolValue(value)));
        self
    }

    pub fn opt_bool(&mut self, key: &'static str, value: Option<bool>) -> &mut Self {
        if let Some(v) = value {
            self.bool(key, v);
        }
        self
    }

    /// An array of values of few distinct texts, shared as in
    /// [`Attrs::common_str`].
    pub(crate) fn common_str_array(
        &mut self,
        key: &'static str,
        texts: &[&str],
        values: &mut Interner,
    ) -> &mut Self {
        let texts = texts
            .iter()
            .map(|v| AnyValue {
                value: Some(Value::StringValue(values.get(v))),
            })
            .collect();
        self.0
            .push(kv(key, Value::ArrayValue(ArrayValue { values: texts })));
        self
    }

    pub fn extend(&mut self, other: &Attrs) -> &mut Self {
        self.0.extend(other.0.iter().cloned());
        self
    }
}

/// The texts the interners of the process have kept for good (see
/// [`Interner`]), shared by all of them and reachable from here for the
/// life of the process.
static KEPT: LazyLock<Mutex<Kept>> = LazyLock::new(Mutex::default);

/// Texts kept for good, and what they cost of the budget.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    texts: HashSet<&'static str, foldhash::quality::RandomState>,
    bytes: usize,
}

/// Shared copies of short texts, each at most [`Interner::MAX_LEN`] bytes
/// (longer ones are copied per span): bounded whatever the agents send.
///
/// The first texts are kept for the life of the process, as static strings
/// in a pool all interners share ([`KEPT`]), up to
/// [`Interner::MAX_KEPT_BYTES`] (each text counted with
/// [`Interner::KEPT_OVERHEAD`]); each interner remembers the ones it
/// handed out, so that only a text it has not seen takes the pool's lock.
/// A span's clone and drop of one is then a copy of a pointer. A reference
/// count would be an atomic read-modify-write per span and value, which
/// stalls the thread (several of them per span). Past that budget (an agent
/// sending ever new texts), texts are shared by a reference count, at most
/// [`Interner::MAX_ENTRIES`] of them (emptied when full).
#[derive(Debug)]
pub(crate) struct Interner {
    /// The texts kept for good, over all interners ([`KEPT`]).
    pool: &'static Mutex<Kept>,
    /// The ones of them this interner handed out.
    kept: HashSet<&'static str, foldhash::quality::RandomState>,
    texts: HashSet<Arc<str>, foldhash::quality::RandomState>,
    /// Where [`Interner::joined`] puts its two parts together.
    scratch: String,
}

impl Default for Interner {
    fn default() -> Self {
        Self {
            pool: &KEPT,
            kept: HashSet::default(),
            texts: HashSet::default(),
            scratch: String::new(),
        }
    }
}

impl Interner {
    const MAX_ENTRIES: usize = 1024;
    const MAX_LEN: usize = 256;
    const MAX_KEPT_BYTES: usize = 1 << 20;
    /// What a kept text costs of the budget beyond its bytes: its entry in
    /// the table and its allocation's bookkeeping (so at most 32 768 texts).
    const KEPT_OVERHEAD: usize = 32;

    /// `text` as a shared string: the copy made for an earlier span when
    /// there is one.
    pub(crate) fn get(&mut self, text: &str) -> Str {
        if text.len() > Self::MAX_LEN {
            return text.into();
        }
        if let Some(&kept) = self.kept.get(text) {
            return Str::Static(kept);
        }
        if let Some(shared) = self.texts.get(text) {
            return Str::Shared(Arc::clone(shared));
        }
        if let Some(kept) = keep(text, self.pool) {
            self.kept.insert(kept);
            return Str::Static(kept);
        }
        if self.texts.len() >= Self::MAX_ENTRIES {
            self.texts.clear();
        }
        let shared: Arc<str> = Arc::from(text);
        self.texts.insert(Arc::clone(&shared));
        Str::Shared(shared)
    }

    /// `prefix` followed by `text`, shared as [`Interner::get`] shares a
    /// text: a span name such as `chat gpt-4o` is put together without an
    /// allocation of its own (`format!` made one, and grew it, per span).
    pub(crate) fn joined(&mut self, prefix: &str, text: &str) -> Str {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.push_str(prefix);
        scratch.push_str(text);
        let joined = self.get(&scratch);
        self.scratch = scratch;
        joined
    }
}

/// `text` as kept in `pool` for the life of the process: the copy another
/// interner kept, or a new one when the budget of
/// [`Interner::MAX_KEPT_BYTES`] allows it.
fn keep(text: &str, pool: &Mutex<Kept>) -> Option<&'static str> {
    let mut pool = pool.lock().ok()?;
    if let Some(&kept) = pool.texts.get(text) {
        return Some(kept);
    }
    let bytes = pool.bytes + text.len() + Interner::KEPT_OVERHEAD;
    if bytes > Interner::MAX_KEPT_BYTES {
        return None;
    }
    let kept: &'static str = Box::leak(Box::from(text));
    pool.texts.insert(kept);
    pool.bytes = bytes;
    Some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `a` and `b` are one copy of their text.
    fn same(a: &Str, b: &Str) -> bool {
        std::ptr::eq(a.as_str(), b.as_str())
    }

    /// An interner whose pool has `left` bytes of its budget left (the
    /// process's own pool is shared by the tests that run in parallel).
    fn with_budget_left(left: usize) -> Interner {
        let pool = Box::leak(Box::new(Mutex::new(Kept {
            bytes: Interner::MAX_KEPT_BYTES - left,
            ..Kept::default()
        })));
        Interner {
            pool,
            ..Interner::default()
        }
    }

    #[test]
    fn an_interned_text_is_one_copy_kept_static_within_the_budget() {
        let overhead = Interner::KEPT_OVERHEAD;
        let mut values = with_budget_left(20 + 2 * overhead);
        let (a, b) = (values.get("openai"), values.get("openai"));
        assert!(matches!(a, Str::Static(_)), "{a:?}");
        assert!(same(&a, &b));
        // 6 + 12 bytes and their overhead fit; the next text is shared by a
        // reference count.
        assert!(matches!(values.get("gpt-4o-mini!"), Str::Static(_)));
        let (c, d) = (values.get("terminal"), values.get("terminal"));
        assert!(matches!(c, Str::Shared(_)), "{c:?}");
        assert!(same(&c, &d));
        assert!(same(&values.get("openai"), &a), "kept texts stay");
        assert_eq!(
            values.pool.lock().unwrap().bytes,
            Interner::MAX_KEPT_BYTES - 2
        );
        // Another interner of the process takes the same copy, at no cost.
        let mut other = Interner {
            pool: values.pool,
            ..Interner::default()
        };
        assert!(same(&other.get("openai"), &a));
        assert_eq!(
            values.pool.lock().unwrap().bytes,
            Interner::MAX_KEPT_BYTES - 2
        );
    }

    #[test]
    fn past_the_budget_the_table_stays_bounded() {
        let mut values = with_budget_left(0);
        for i in 0..3 * Interner::MAX_ENTRIES {
            assert_eq!(values.get(&i.to_string()).as_str(), i.to_string());
            assert!(values.texts.len() <= Interner::MAX_ENTRIES);
        }
        assert!(values.kept.is_empty());
        let mut values = with_budget_left(1 << 20);
        let long = "x".repeat(Interner::MAX_LEN + 1);
        assert_eq!(values.get(&long).as_str(), long);
        assert!(
            values.kept.is_empty() && values.texts.is_empty(),
            "long texts are not kept"
        );
    }

    #[test]
    fn a_joined_text_is_shared_like_any_other() {
        let mut values = Interner::default();
        let (a, b) = (values.joined("chat ", "gpt-4o"), values.get("chat gpt-4o"));
        assert!(same(&a, &b));
        assert_eq!(
            values.joined("execute_tool ", "terminal").as_str(),
            "execute_tool terminal"
        );
        let long = "x".repeat(Interner::MAX_LEN);
        assert_eq!(
            values.joined("chat ", &long).as_str(),
            format!("chat {long}")
        );
    }
}
