//! Redaction: replacing secrets and personal data in attribute values.
//!
//! Owns the compiled rules ([`Redactor`]) and their application to OTLP
//! attribute lists. Two kinds of rules:
//! - key rules: an attribute, key-value list entry or JSON object member
//!   whose key matches gets its whole value replaced;
//! - value patterns: every match inside a string is replaced, all patterns in
//!   one pass of one combined regex, run only on strings that contain one of
//!   the literals the patterns require (`prefilter.rs`).
//!
//! A string holding a JSON object or array is parsed and walked (key rules on
//! its members, patterns on every string and key, nested JSON text inside
//! strings too, up to [`MAX_JSON_NESTING`] levels), then written back
//! compact; a string that is not JSON gets the patterns over its text.
//!
//! Keys are exported text too: an attribute, key-value list or JSON member
//! key that holds a pattern match gets the match replaced, and one longer
//! than [`crate::MAX_NAME_BYTES`] is cut (on a character boundary). The key
//! rules are judged on the key as it comes and as it is rewritten, so that a
//! second pass, which sees the rewritten key, replaces nothing more.
//!
//! Invariants: a value that no rule touches is left exactly as it was (no
//! re-serialization, no allocation beyond key normalization scratch); a
//! redacted JSON value is still valid JSON; applying the rules twice gives
//! the same result as once (unless the replacement itself matches a rule).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use hermes_span::common::v1::{AnyValue, KeyValue, any_value::Value};
use hermes_span::{SharedAttributes, Str};
use regex::{NoExpand, Regex};

use crate::MAX_NAME_BYTES;
use crate::config::{ConfigError, RedactionConfig};
use crate::json::{self, Json};
use crate::prefilter::Prefilter;
use crate::recent::{AddressMemo, Id};

/// How many levels of JSON text inside JSON strings are parsed (e.g. tool
/// call arguments encoded as a string inside a message list).
pub(crate) const MAX_JSON_NESTING: u8 = 4;

/// Most passes of the value patterns over one string (see
/// [`Redactor::apply_patterns`]); each pass that changes something replaces
/// at least one match, so only a replacement that itself matches a pattern
/// reaches the bound.
const MAX_PATTERN_ROUNDS: usize = 8;

/// Compiled redaction rules.
#[derive(Debug)]
pub(crate) struct Redactor {
    keys: Vec<KeyGlob>,
    values: Option<Regex>,
    /// Literals one of which a string must contain for `values` to match.
    prefilter: Option<Prefilter>,
    replacement: String,
}

/// A key rule, normalized: lowercase, without `-` and `_`, split at `*`.
#[derive(Debug)]
struct KeyGlob {
    /// The literal pieces between wildcards, in order.
    parts: Vec<String>,
    /// No leading `*`: the first part must be a prefix.
    anchored_start: bool,
    /// No trailing `*`: the last part must be a suffix.
    anchored_end: bool,
}

impl KeyGlob {
    fn new(index: usize, rule: &str) -> Result<Self, ConfigError> {
        let mut normalized = String::new();
        normalize_into(rule, &mut normalized);
        let parts: Vec<String> = normalized
            .split('*')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect();
        if parts.is_empty() {
            return Err(ConfigError::InvalidKeyName {
                index,
                name: rule.to_owned(),
                reason: if normalized.is_empty() {
                    "is empty"
                } else {
                    "would match every key"
                },
            });
        }
        Ok(Self {
            parts,
            anchored_start: !normalized.starts_with('*'),
            anchored_end: !normalized.ends_with('*'),
        })
    }

    /// Whether the normalized key `key` matches.
    fn matches(&self, key: &str) -> bool {
        let n = self.parts.len();
        let mut rest = key;
        for (i, part) in self.parts.iter().enumerate() {
            let first = i == 0;
            let last = i + 1 == n;
            if first && self.anchored_start {
                match rest.strip_prefix(part.as_str()) {
                    Some(r) => rest = r,
                    None => return false,
                }
                if last && self.anchored_end {
                    return rest.is_empty();
                }
            } else if last && self.anchored_end {
                return rest.ends_with(part.as_str());
            } else {
                match rest.find(part.as_str()) {
                    Some(at) => rest = &rest[at + part.len()..],
                    None => return false,
                }
            }
        }
        !self.anchored_end || rest.is_empty()
    }
}

/// What the rules say of one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KeyVerdict {
    /// A key rule matches the key or its rewritten form: the whole value is
    /// replaced.
    pub(crate) secret: bool,
    /// The key holds a pattern match or is longer than
    /// [`MAX_NAME_BYTES`]: it is rewritten ([`Redactor::rewrite_key`]).
    pub(crate) rewrite: bool,
}

/// Working memory of the processing passes: the normalized-key buffer, the
/// key rules' verdicts per key seen (spans of a batch share most of their
/// attribute keys, so each is normalized and matched once per pass), and the
/// values known to need no redaction.
///
/// Static strings (the correlator's keys and fixed values) are remembered by
/// address and length, without hashing their text, for the redactor's
/// lifetime; shared values (the ids, model and platform every span of a
/// turn holds) by the address of their shared allocation, which the scratch
/// keeps alive so that no other string can take that address during the
/// pass. The processor keeps the scratch between passes, and
/// [`Scratch::end_pass`] empties what holds for one pass only: their tables
/// keep their size rather than grow again from empty in every pass
/// (`docs/BENCHMARKS.md`).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    normalized: String,
    /// foldhash: a key is hashed on every attribute, and SipHash (the
    /// std default, built against flooding) cost more than the rules.
    verdicts: HashMap<String, KeyVerdict, foldhash::fast::RandomState>,
    /// The key rules' verdicts on static keys, and the static values the
    /// patterns found clean: both depend only on the redactor's rules and on
    /// text that never changes at that address, so they hold for the
    /// redactor's lifetime rather than being matched again in every pass
    /// (`docs/BENCHMARKS.md`). A static string is one the program contains
    /// or a text the correlator keeps for good (its interner's, bounded
    /// there); the clean ones remembered are bounded here too
    /// ([`Scratch::MAX_STATIC_CLEAN`]).
    static_verdicts: AddressMemo<KeyVerdict>,
    static_clean: AddressMemo<()>,
    /// The shared values found clean in this pass, and their allocations,
    /// kept alive until the pass ends.
    clean_shared: AddressMemo<()>,
    kept_shared: Vec<Arc<str>>,
    /// The turns' shared blocks of leading attributes that came out of
    /// this pass unchanged, and the blocks, kept alive until it ends.
    clean_blocks: AddressMemo<()>,
    kept_blocks: Vec<SharedAttributes>,
}

impl Scratch {
    /// Keys (and, separately, clean values) remembered per pass: JSON member
    /// keys and values are arbitrary.
    const MAX_VERDICTS: usize = 1024;
    /// Static values remembered clean, for the redactor's lifetime.
    const MAX_STATIC_CLEAN: usize = 8192;

    /// Forgets what holds for one pass only (the verdicts on keys by their
    /// text, the shared values found clean, releasing them), keeping the
    /// static memos and every table's size.
    pub(crate) fn end_pass(&mut self) {
        self.verdicts.clear();
        self.clean_shared.clear();
        self.kept_shared.clear();
        self.clean_blocks.clear();
        self.kept_blocks.clear();
    }

    /// Whether `block` came out of this pass unchanged before: then its
    /// attributes, wherever they lead a span's, need nothing.
    pub(crate) fn known_clean_block(&mut self, block: &SharedAttributes) -> bool {
        self.clean_blocks
            .get((block.address(), block.len()))
            .is_some()
    }

    /// Remembers `block` as unchanged by this pass.
    pub(crate) fn remember_clean_block(&mut self, block: &SharedAttributes) {
        if self.clean_blocks.len() < Self::MAX_VERDICTS {
            self.clean_blocks.insert((block.address(), block.len()), ());
            self.kept_blocks.push(block.clone());
        }
    }

    fn known_clean(&mut self, s: &Str) -> bool {
        match s {
            Str::Static(t) => self.static_clean.get(id(t)).is_some(),
            Str::Shared(a) => self.clean_shared.get(id(a)).is_some(),
            Str::Owned(_) => false,
        }
    }

    fn remember_clean(&mut self, s: &Str) {
        match s {
            Str::Static(t) if self.static_clean.len() < Self::MAX_STATIC_CLEAN => {
                self.static_clean.insert(id(t), ());
            }
            Str::Shared(a) if self.clean_shared.len() < Self::MAX_VERDICTS => {
                self.clean_shared.insert(id(a), ());
                self.kept_shared.push(Arc::clone(a));
            }
            _ => {}
        }
    }
}

/// The address and length of `s`: what the memos by address key on.
fn id(s: &str) -> Id {
    (s.as_ptr() as usize, s.len())
}

/// Lowercases `key` and drops `-` and `_`, into `out` (cleared first).
fn normalize_into(key: &str, out: &mut String) {
    out.clear();
    for c in key.chars() {
        if c == '-' || c == '_' {
            continue;
        }
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
        } else {
            out.extend(c.to_lowercase());
        }
    }
}

impl Redactor {
    pub(crate) fn new(config: &RedactionConfig) -> Result<Self, ConfigError> {
        let keys = config
            .key_names
            .iter()
            .enumerate()
            .map(|(i, rule)| KeyGlob::new(i, rule))
            .collect::<Result<Vec<_>, _>>()?;
        for (index, pattern) in config.value_patterns.iter().enumerate() {
            let re = Regex::new(pattern)
                .map_err(|source| ConfigError::InvalidValuePattern { index, source })?;
            if re.is_match("") {
                return Err(ConfigError::EmptyMatchingValuePattern {
                    index,
                    pattern: pattern.clone(),
                });
            }
        }
        let values = if config.value_patterns.is_empty() {
            None
        } else {
            // One alternation, each pattern in its own group so its inline
            // flags (`(?i)`) stay local to it.
            let combined = config
                .value_patterns
                .iter()
                .map(|p| format!("(?:{p})"))
                .collect::<Vec<_>>()
                .join("|");
            Some(
                Regex::new(&combined)
                    .map_err(|source| ConfigError::ValuePatternsTooLarge { source })?,
            )
        };
        Ok(Self {
            keys,
            prefilter: values
                .as_ref()
                .and_then(|_| Prefilter::new(&config.value_patterns)),
            values,
            replacement: config.replacement.clone(),
        })
    }

    /// Whether the redactor has no rule at all.
    pub(crate) fn is_noop(&self) -> bool {
        self.keys.is_empty() && self.values.is_none()
    }

    /// The verdict on `key` (a JSON member key or a key that is not
    /// static), remembered by its text for the pass.
    pub(crate) fn key_verdict(&self, key: &str, scratch: &mut Scratch) -> KeyVerdict {
        if let Some(&known) = scratch.verdicts.get(key) {
            return known;
        }
        let verdict = self.key_verdict_uncached(key, &mut scratch.normalized);
        if scratch.verdicts.len() < Scratch::MAX_VERDICTS {
            scratch.verdicts.insert(key.to_owned(), verdict);
        }
        verdict
    }

    /// Whether `key` (or its last dot-separated segment) matches a key rule.
    #[cfg(test)]
    pub(crate) fn key_matches(&self, key: &str, scratch: &mut Scratch) -> bool {
        self.key_verdict(key, scratch).secret
    }

    fn key_verdict_uncached(&self, key: &str, normalized: &mut String) -> KeyVerdict {
        let rewritten = self.rewrite_key(key);
        let secret = self.key_rule_matches(key, normalized)
            || rewritten
                .as_deref()
                .is_some_and(|k| self.key_rule_matches(k, normalized));
        KeyVerdict {
            secret,
            rewrite: rewritten.is_some(),
        }
    }

    fn key_rule_matches(&self, key: &str, normalized: &mut String) -> bool {
        if self.keys.is_empty() {
            return false;
        }
        normalize_into(key, normalized);
        if self.keys.iter().any(|g| g.matches(normalized)) {
            return true;
        }
        match key.rsplit_once('.') {
            Some((_, last)) if !last.is_empty() => {
                normalize_into(last, normalized);
                self.keys.iter().any(|g| g.matches(normalized))
            }
            _ => false,
        }
    }

    /// `key` with its pattern matches replaced and cut to
    /// [`MAX_NAME_BYTES`], or `None` when it needs neither.
    pub(crate) fn rewrite_key(&self, key: &str) -> Option<String> {
        let redacted = self.apply_patterns(key);
        let end = redacted.floor_char_boundary(MAX_NAME_BYTES);
        match redacted {
            Cow::Borrowed(_) if end == key.len() => None,
            Cow::Borrowed(k) => Some(k[..end].to_owned()),
            Cow::Owned(mut k) => {
                k.truncate(end);
                Some(k)
            }
        }
    }

    /// Redacts an attribute list in place; returns how many attributes
    /// changed.
    pub(crate) fn redact_attributes(&self, attrs: &mut [KeyValue], scratch: &mut Scratch) -> u64 {
        if self.is_noop() {
            // No rule: only the keys' length limit, which redacts nothing.
            for kv in attrs.iter_mut().filter(|kv| kv.key.len() > MAX_NAME_BYTES) {
                let end = kv.key.floor_char_boundary(MAX_NAME_BYTES);
                kv.key = kv.key[..end].to_owned().into();
            }
            return 0;
        }
        attrs
            .iter_mut()
            .map(|kv| u64::from(self.redact_key_value(kv, scratch)))
            .sum()
    }

    /// [`Self::key_verdict`] for an attribute key: a static key's verdict
    /// is remembered by its address (not also by its text) for the
    /// redactor's lifetime.
    fn str_key_verdict(&self, key: &Str, scratch: &mut Scratch) -> KeyVerdict {
        let Str::Static(text) = key else {
            return self.key_verdict(key, scratch);
        };
        let id = id(text);
        if let Some(known) = scratch.static_verdicts.get(id) {
            return known;
        }
        let verdict = self.key_verdict_uncached(text, &mut scratch.normalized);
        scratch.static_verdicts.insert(id, verdict);
        verdict
    }

    fn redact_key_value(&self, kv: &mut KeyValue, scratch: &mut Scratch) -> bool {
        let verdict = self.str_key_verdict(&kv.key, scratch);
        let mut changed = false;
        if verdict.rewrite
            && let Some(new) = self.rewrite_key(&kv.key)
        {
            kv.key = new.into();
            changed = true;
        }
        if verdict.secret {
            let Some(value) = kv.value.as_mut() else {
                return changed;
            };
            return match &value.value {
                None => changed,
                Some(Value::StringValue(s)) if s.is_empty() || *s == self.replacement => changed,
                Some(_) => {
                    value.value = Some(Value::StringValue(self.replacement.clone().into()));
                    true
                }
            };
        }
        match kv.value.as_mut() {
            Some(v) => self.redact_any(v, scratch) || changed,
            None => changed,
        }
    }

    /// Redacts one string (an attribute value, or a span, event or scope
    /// name) in place; returns whether it changed. Static and shared
    /// strings found clean are remembered by address.
    pub(crate) fn redact_str_value(&self, s: &mut Str, scratch: &mut Scratch) -> bool {
        if self.is_noop() || scratch.known_clean(s) {
            return false;
        }
        match self.redact_str(s, 0, scratch) {
            Some(new) => {
                *s = new.into();
                true
            }
            None => {
                scratch.remember_clean(s);
                false
            }
        }
    }

    /// Redacts an owned string (a span's status message) in place; returns
    /// whether it changed.
    pub(crate) fn redact_string(&self, s: &mut String, scratch: &mut Scratch) -> bool {
        if self.is_noop() || s.is_empty() {
            return false;
        }
        match self.redact_str(s, 0, scratch) {
            Some(new) => {
                *s = new;
                true
            }
            None => false,
        }
    }

    fn redact_any(&self, v: &mut AnyValue, scratch: &mut Scratch) -> bool {
        match &mut v.value {
            Some(Value::StringValue(s)) => self.redact_str_value(s, scratch),
            Some(Value::ArrayValue(array)) => {
                let mut changed = false;
                for item in &mut array.values {
                    changed |= self.redact_any(item, scratch);
                }
                changed
            }
            Some(Value::KvlistValue(list)) => {
                let mut changed = false;
                for kv in &mut list.values {
                    changed |= self.redact_key_value(kv, scratch);
                }
                changed
            }
            _ => false,
        }
    }

    /// The redacted form of `s`, or `None` when no rule applies.
    pub(crate) fn redact_str(&self, s: &str, depth: u8, scratch: &mut Scratch) -> Option<String> {
        if depth < MAX_JSON_NESTING
            && let Some(mut doc) = json::parse_container(s)
        {
            return self
                .redact_json(&mut doc, depth, scratch)
                .then(|| doc.to_text());
        }
        match self.apply_patterns(s) {
            Cow::Owned(new) => Some(new),
            Cow::Borrowed(_) => None,
        }
    }

    /// `s` with every pattern match replaced, repeated until nothing more
    /// matches (at most [`MAX_PATTERN_ROUNDS`] times): a replacement can
    /// give a neighbour the word boundary a pattern needs (`x_PASSWORD=1`
    /// after `a@b.co` became `<redacted>_PASSWORD=1`), and a second pass over
    /// the output must find nothing.
    fn apply_patterns<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let Some(re) = &self.values else {
            return Cow::Borrowed(s);
        };
        if !self.prefilter.as_ref().is_none_or(|p| p.may_match(s)) {
            return Cow::Borrowed(s);
        }
        let Cow::Owned(mut out) = re.replace_all(s, NoExpand(&self.replacement)) else {
            return Cow::Borrowed(s);
        };
        for _ in 1..MAX_PATTERN_ROUNDS {
            match re.replace_all(&out, NoExpand(&self.replacement)) {
                Cow::Owned(next) => out = next,
                Cow::Borrowed(_) => break,
            }
        }
        Cow::Owned(out)
    }

    /// Redacts a parsed JSON document in place; returns whether it changed.
    fn redact_json(&self, v: &mut Json, depth: u8, scratch: &mut Scratch) -> bool {
        match v {
            Json::String(s) => match self.redact_str(s, depth + 1, scratch) {
                Some(new) => {
                    *s = new;
                    true
                }
                None => false,
            },
            Json::Array(items) => {
                let mut changed = false;
                for item in items {
                    changed |= self.redact_json(item, depth, scratch);
                }
                changed
            }
            Json::Object(members) => {
                let mut changed = false;
                for (key, value) in members {
                    let verdict = self.key_verdict(key, scratch);
                    if verdict.secret {
                        let already = match value {
                            Json::Null => true,
                            Json::String(s) => s.is_empty() || *s == self.replacement,
                            _ => false,
                        };
                        if !already {
                            *value = Json::String(self.replacement.clone());
                            changed = true;
                        }
                    } else {
                        changed |= self.redact_json(value, depth, scratch);
                    }
                    if verdict.rewrite
                        && let Some(new_key) = self.rewrite_key(key)
                    {
                        *key = new_key;
                        changed = true;
                    }
                }
                changed
            }
            Json::Null | Json::Bool(_) | Json::Number(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn redactor() -> Redactor {
        Redactor::new(&RedactionConfig::default()).unwrap()
    }

    #[test]
    fn key_rules_ignore_case_separators_and_honour_wildcards() {
        let r = redactor();
        let mut s = Scratch::default();
        for key in [
            "api_key",
            "API-Key",
            "apiKey",
            "Authorization",
            "http.request.header.authorization",
            "x-api-key",
            "openai_api_key",
            "OPENAI-API-KEY",
            "github_token",
            "accessToken",
            "client_secret",
            "Set-Cookie",
            "password",
            "db_password",
            "PGPASSWORD",
            "privateKey",
            "private_key",
            "ssh_private_key",
            "credentials",
            "aws_credentials_file",
            "AWS_SECRET_ACCESS_KEY",
            "secret_key_base",
            "mysql_passwd",
            "key_passphrase",
            "azure_storage_connection_string",
            "sentry.dsn",
        ] {
            assert!(r.key_matches(key, &mut s), "{key} should match");
        }
        for key in [
            "gen_ai.usage.input_tokens",
            "gen_ai.request.max_tokens",
            "llm.token_count.prompt",
            "hermes.turn_id",
            "session.id",
            "tokens",
            "tokens_used",
            "token_count",
            "gen_ai.tool.call.arguments",
            "hermes.approval.pattern_key",
            "public_key",
            "primary_key",
        ] {
            assert!(!r.key_matches(key, &mut s), "{key} should not match");
        }
    }

    #[test]
    fn globs_with_inner_wildcards() {
        let g = KeyGlob::new(0, "a*b*c").unwrap();
        assert!(g.matches("abc"));
        assert!(g.matches("axxbyyc"));
        assert!(!g.matches("axxbyycd"));
        assert!(!g.matches("xabc"));
        let g = KeyGlob::new(0, "*mid*").unwrap();
        assert!(g.matches("amidb"));
        assert!(g.matches("mid"));
        assert!(!g.matches("mi"));
        assert!(KeyGlob::new(3, "**").is_err());
        assert!(KeyGlob::new(3, "-_").is_err());
    }

    /// A replacement that gives the next text the word boundary a pattern
    /// needs: the patterns run again until nothing matches.
    #[test]
    fn patterns_run_until_nothing_more_matches() {
        let r = redactor();
        let mut s = Scratch::default();
        let once = r.redact_str("x a@b.co_PASSWORD=1", 0, &mut s).unwrap();
        assert_eq!(once, "x <redacted><redacted>");
        assert_eq!(r.redact_str(&once, 0, &mut s), None);
    }

    #[test]
    fn patterns_leave_ordinary_words_alone() {
        let r = redactor();
        let mut s = Scratch::default();
        assert_eq!(
            r.redact_str("task-management-system-design-notes", 0, &mut s),
            None
        );
        assert_eq!(
            r.redact_str("key sk-abcdefghijklmnop1234 here", 0, &mut s)
                .as_deref(),
            Some("key <redacted> here")
        );
    }

    /// A key the patterns rewrite is judged by the key rules as rewritten
    /// too, so that a second pass (which sees the rewritten key) finds
    /// nothing more to do.
    #[test]
    fn keys_are_rewritten_and_judged_as_rewritten() {
        let r = redactor();
        let mut s = Scratch::default();
        let key = "mail a@b.co_note";
        let v = r.key_verdict(key, &mut s);
        assert!(v.rewrite);
        assert_eq!(r.rewrite_key(key).as_deref(), Some("mail <redacted>_note"));
        let long = "k".repeat(300);
        assert_eq!(r.rewrite_key(&long).map(|k| k.len()), Some(MAX_NAME_BYTES));
        assert_eq!(r.rewrite_key("gen_ai.usage.input_tokens"), None);
        // A rule only the rewritten key matches: judged secret already.
        let r = Redactor::new(&RedactionConfig {
            key_names: vec!["<redacted>*".into()],
            ..RedactionConfig::default()
        })
        .unwrap();
        let v = r.key_verdict("a@b.co", &mut Scratch::default());
        assert!(v.secret && v.rewrite);
        assert!(r.key_verdict("<redacted>", &mut Scratch::default()).secret);
    }

    /// Static values found clean are remembered for the redactor's
    /// lifetime, at most `MAX_STATIC_CLEAN` of them (the correlator keeps
    /// the texts agents send as static strings too); one past the bound is
    /// still redacted.
    #[test]
    fn static_values_remembered_clean_stay_bounded() {
        let r = redactor();
        let mut s = Scratch::default();
        for i in 0..Scratch::MAX_STATIC_CLEAN + 10 {
            let text: &'static str = Box::leak(format!("model-{i}").into_boxed_str());
            assert!(!r.redact_str_value(&mut Str::Static(text), &mut s));
            s.end_pass();
        }
        assert_eq!(s.static_clean.len(), Scratch::MAX_STATIC_CLEAN);
        let mut secret = Str::Static("key sk-abcdefghijklmnop1234 here");
        assert!(r.redact_str_value(&mut secret, &mut s));
        assert_eq!(secret.as_str(), "key <redacted> here");
    }
}
