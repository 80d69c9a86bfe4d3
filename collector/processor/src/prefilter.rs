//! A literal prefilter for the redaction value patterns.
//!
//! Owns [`Prefilter`]: a set of literals such that every match of every
//! value pattern contains at least one of them (`sk-`, `AKIA`, `@`,
//! `bearer` in any case, ...), searched ignoring ASCII case. A string that
//! contains none of them cannot match, and skips the regex; almost every
//! attribute value of a trace (ids, model names, finish reasons, URLs) is
//! such a string. The combined regex finds no literal prefix of its own when
//! one pattern starts with a class (the e-mail pattern), so without this it
//! runs its automaton over every byte of every value.
//!
//! The literals are read from each pattern's syntax tree: a literal, a run of
//! small classes expanded into every literal it spells (at most
//! [`MAX_LITERALS`]), or the union over an alternation. A pattern with no
//! such required literal (e.g. `[0-9]{16}`) turns the prefilter off; the
//! regex then runs on every string, as before.
//!
//! Two searches answer the same question. A short string goes through one
//! automaton that ignores ASCII case byte by byte. A longer one is lowered
//! into a stack buffer, a window at a time, and searched by aho-corasick's
//! vectorized packed searcher (Teddy, which only matches case-sensitively),
//! with the one-byte literals (`@`) found by `memchr`: several times faster
//! per byte, at a fixed cost that only a longer string repays.
//!
//! Invariant: for every string `s`, if the patterns match `s` then the
//! prefilter matches `s` (tested on generated strings), and both searches
//! give the same answer for every string.

use aho_corasick::{AhoCorasick, packed};
use regex_syntax::hir::{Class, Hir, HirKind};

/// Most literals one pattern's required set may hold.
const MAX_LITERALS: usize = 64;
/// Most bytes a class may stand for to be expanded into literals.
const MAX_CLASS_BYTES: usize = 8;
/// Strings shorter than this take the byte-by-byte automaton: below it,
/// lowering a copy and the packed searcher's setup cost more than they save.
const PACKED_FROM: usize = 32;
/// Bytes lowered and searched at a time by the packed path.
const WINDOW: usize = 1024;

/// Literals at least one of which every match of the patterns contains.
#[derive(Debug)]
pub(crate) struct Prefilter {
    /// Every literal, ignoring ASCII case.
    literals: AhoCorasick,
    /// The same literals for strings of [`PACKED_FROM`] bytes or more;
    /// `None` where the packed searcher cannot be built (no SIMD, too many
    /// literals, more one-byte literals than `memchr3` takes).
    packed: Option<Packed>,
}

/// The literals split for a lowered haystack: those of two bytes or more
/// (lowercase) in a packed searcher, the one-byte ones in both cases.
#[derive(Debug)]
struct Packed {
    searcher: packed::Searcher,
    bytes: Vec<u8>,
    longest: usize,
}

impl Prefilter {
    /// The prefilter of `patterns`, or `None` when one of them has no
    /// required literal (or does not parse: the regex build reports that).
    pub(crate) fn new(patterns: &[String]) -> Option<Self> {
        let mut literals = Vec::new();
        for pattern in patterns {
            let hir = regex_syntax::parse(pattern).ok()?;
            literals.extend(required(&hir)?);
        }
        // Searched ignoring ASCII case (the 64 spellings of `bearer` become
        // one), and a literal that contains another is redundant: few
        // literals keep the search on its vectorized path.
        for literal in &mut literals {
            literal.make_ascii_lowercase();
        }
        literals.sort_by_key(Vec::len);
        literals.dedup();
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for literal in literals {
            if !kept.iter().any(|k| contains(&literal, k)) {
                kept.push(literal);
            }
        }
        let literals = AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(&kept)
            .ok()?;
        Some(Self {
            literals,
            packed: Packed::new(&kept),
        })
    }

    /// Whether `haystack` contains one of the literals (it may match).
    pub(crate) fn may_match(&self, haystack: &str) -> bool {
        match &self.packed {
            Some(packed) if haystack.len() >= PACKED_FROM => packed.may_match(haystack.as_bytes()),
            _ => self.literals.is_match(haystack),
        }
    }
}

impl Packed {
    /// The packed search of `literals` (lowercase, deduplicated).
    fn new(literals: &[Vec<u8>]) -> Option<Self> {
        let (short, long): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) =
            literals.iter().partition(|l| l.len() == 1);
        let mut bytes: Vec<u8> = short
            .iter()
            .flat_map(|l| [l[0], l[0].to_ascii_uppercase()])
            .collect();
        bytes.sort_unstable();
        bytes.dedup();
        if bytes.len() > 3 || long.is_empty() {
            return None;
        }
        let searcher = packed::Config::new().builder().extend(&long).build()?;
        let longest = long.iter().map(|l| l.len()).max().unwrap_or(1);
        // A window must hold more than the overlap, and the searcher needs
        // haystacks at least as long as its minimum (shorter ones it
        // searches slowly).
        (longest < WINDOW / 2 && searcher.minimum_len() <= PACKED_FROM).then_some(Self {
            searcher,
            bytes,
            longest,
        })
    }

    fn may_match(&self, haystack: &[u8]) -> bool {
        let found = match *self.bytes.as_slice() {
            [] => false,
            [a] => memchr::memchr(a, haystack).is_some(),
            [a, b] => memchr::memchr2(a, b, haystack).is_some(),
            [a, b, c, ..] => memchr::memchr3(a, b, c, haystack).is_some(),
        };
        if found {
            return true;
        }
        // Windows overlap by one byte less than the longest literal, so a
        // literal across a window's end is whole in the next; the last one
        // ends with the haystack and is full (no shorter than the
        // searcher's minimum: the haystack is at least `PACKED_FROM`).
        let mut lowered = [0u8; WINDOW];
        let mut start = 0;
        loop {
            let start_at = start.min(haystack.len().saturating_sub(WINDOW));
            let end = haystack.len().min(start_at + WINDOW);
            let window = &haystack[start_at..end];
            let lowered = &mut lowered[..window.len()];
            for (to, from) in lowered.iter_mut().zip(window) {
                *to = from.to_ascii_lowercase();
            }
            if self.searcher.find(&*lowered).is_some() {
                return true;
            }
            if end == haystack.len() {
                return false;
            }
            start = end - (self.longest - 1);
        }
    }
}

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// A set of literals one of which every match of `hir` contains; `None`
/// when none is known. Among candidates, the set whose shortest literal is
/// longest wins (it rejects the most strings).
fn required(hir: &Hir) -> Option<Vec<Vec<u8>>> {
    match hir.kind() {
        HirKind::Literal(literal) => Some(vec![literal.0.to_vec()]),
        HirKind::Capture(capture) => required(&capture.sub),
        HirKind::Repetition(repetition) if repetition.min >= 1 => required(&repetition.sub),
        HirKind::Alternation(branches) => {
            let mut union = Vec::new();
            for branch in branches {
                union.extend(required(branch)?);
            }
            (union.len() <= MAX_LITERALS).then_some(union)
        }
        HirKind::Concat(parts) => {
            let mut best: Option<Vec<Vec<u8>>> = None;
            let mut consider = |candidate: Vec<Vec<u8>>| {
                if best.as_ref().is_none_or(|b| better(&candidate, b)) {
                    best = Some(candidate);
                }
            };
            // Runs of consecutive fixed positions, each expanded.
            let mut run: Vec<Vec<Vec<u8>>> = Vec::new();
            for part in parts {
                match positions(part) {
                    Some(p) => run.extend(p),
                    None => {
                        if let Some(c) = expand_best(&run) {
                            consider(c);
                        }
                        run.clear();
                        if let Some(c) = required(part) {
                            consider(c);
                        }
                    }
                }
            }
            if let Some(c) = expand_best(&run) {
                consider(c);
            }
            best
        }
        _ => None,
    }
}

/// Whether the literal set `a` filters better than `b`: a longer shortest
/// literal, then fewer literals.
fn better(a: &[Vec<u8>], b: &[Vec<u8>]) -> bool {
    let shortest = |set: &[Vec<u8>]| set.iter().map(Vec::len).min().unwrap_or(0);
    (shortest(a), std::cmp::Reverse(a.len())) > (shortest(b), std::cmp::Reverse(b.len()))
}

/// `hir` as a fixed sequence of positions, each the set of strings it may
/// be: a literal (one byte per position), a small class of ASCII characters
/// (e.g. `[pousr]`, or `[Bb]` from a case-insensitive `b`), or an
/// alternation of such sequences (`(?:live|test)`, and the factored forms
/// the parser makes of `password|passwd|passphrase`) as one position
/// holding every string it spells.
fn positions(hir: &Hir) -> Option<Vec<Vec<Vec<u8>>>> {
    match hir.kind() {
        HirKind::Empty => Some(Vec::new()),
        HirKind::Literal(literal) => Some(literal.0.iter().map(|b| vec![vec![*b]]).collect()),
        HirKind::Capture(capture) => positions(&capture.sub),
        HirKind::Class(class) => {
            class_bytes(class).map(|bytes| vec![bytes.into_iter().map(|b| vec![b]).collect()])
        }
        HirKind::Concat(parts) => {
            let mut all = Vec::new();
            for part in parts {
                all.extend(positions(part)?);
            }
            Some(all)
        }
        HirKind::Alternation(branches) => {
            let mut union = Vec::new();
            for branch in branches {
                let p = positions(branch)?;
                if count(&p) > MAX_LITERALS {
                    return None;
                }
                union.extend(expand(&p));
                if union.len() > MAX_LITERALS {
                    return None;
                }
            }
            union.sort();
            union.dedup();
            Some(vec![union])
        }
        _ => None,
    }
}

/// How many literals `positions` spell.
fn count(positions: &[Vec<Vec<u8>>]) -> usize {
    positions
        .iter()
        .fold(1usize, |n, choices| n.saturating_mul(choices.len()))
}

/// The bytes of a class of at most [`MAX_CLASS_BYTES`] ASCII characters,
/// lowercased and deduplicated: the search ignores ASCII case, so `[Bb]`
/// (a case-insensitive `b`) is the one byte `b`, and a case-insensitive
/// word is one literal instead of one per spelling.
fn class_bytes(class: &Class) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut add = |start: u32, end: u32| -> Option<()> {
        if end >= 0x80 || (end - start) as usize >= MAX_CLASS_BYTES {
            return None;
        }
        bytes.extend((start..=end).map(|b| b as u8));
        (bytes.len() <= MAX_CLASS_BYTES).then_some(())
    };
    match class {
        Class::Unicode(c) => {
            for r in c.ranges() {
                add(u32::from(r.start()), u32::from(r.end()))?;
            }
        }
        Class::Bytes(c) => {
            for r in c.ranges() {
                add(u32::from(r.start()), u32::from(r.end()))?;
            }
        }
    }
    bytes.make_ascii_lowercase();
    bytes.sort_unstable();
    bytes.dedup();
    Some(bytes)
}

/// The best window of `run` expanded into its literals (at most
/// [`MAX_LITERALS`]): the longest, then the one with fewest literals.
fn expand_best(run: &[Vec<Vec<u8>>]) -> Option<Vec<Vec<u8>>> {
    let mut best: Option<Vec<Vec<u8>>> = None;
    for start in 0..run.len() {
        let mut count = 1usize;
        for end in start..run.len() {
            count = count.saturating_mul(run[end].len());
            if count > MAX_LITERALS {
                break;
            }
            let candidate = expand(&run[start..=end]);
            if candidate.iter().all(|l| !l.is_empty())
                && best.as_ref().is_none_or(|b| better(&candidate, b))
            {
                best = Some(candidate);
            }
        }
    }
    best
}

/// Every literal the positions spell.
fn expand(positions: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut literals = vec![Vec::new()];
    for choices in positions {
        literals = literals
            .iter()
            .flat_map(|prefix| {
                choices.iter().map(move |piece| {
                    let mut literal = prefix.clone();
                    literal.extend_from_slice(piece);
                    literal
                })
            })
            .collect();
    }
    literals.sort();
    literals.dedup();
    literals
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::config::DEFAULT_VALUE_PATTERNS;
    use proptest::prelude::*;
    use regex::Regex;

    fn literals_of(pattern: &str) -> Option<Vec<String>> {
        let mut set = required(&regex_syntax::parse(pattern).unwrap())?
            .into_iter()
            .map(|l| String::from_utf8(l).unwrap())
            .collect::<Vec<_>>();
        set.sort();
        Some(set)
    }

    fn defaults() -> Vec<String> {
        DEFAULT_VALUE_PATTERNS
            .iter()
            .map(|p| (*p).to_owned())
            .collect()
    }

    #[test]
    fn the_default_patterns_have_required_literals() {
        let d = defaults();
        let all = d
            .iter()
            .map(|p| (p.as_str(), literals_of(p).unwrap_or_default()))
            .collect::<Vec<_>>();
        // Every pattern has a literal, and none is shorter than 2 bytes but
        // the e-mail's `@` (a short literal lets most strings through).
        for (pattern, literals) in &all {
            assert!(!literals.is_empty(), "{pattern}: no required literal");
            for l in literals {
                assert!(l.len() >= 2 || l == "@", "{pattern}: {l:?}");
            }
        }
        let of = |i: usize| all[i].1.clone();
        assert_eq!(of(0), ["bearer"]);
        assert_eq!(of(1), ["sk-ant-"]);
        assert_eq!(of(2), ["sk-"]);
        assert_eq!(of(3), ["AKIA"]);
        assert_eq!(of(4), ["gho_", "ghp_", "ghr_", "ghs_", "ghu_"]);
        assert_eq!(of(5), ["xoxa-", "xoxb-", "xoxp-", "xoxr-"]);
        assert_eq!(of(6), ["@"]);
        // Case-insensitive words are one literal each (the search ignores
        // ASCII case).
        assert_eq!(of(7), ["authorization"]);
        assert_eq!(of(8), ["://"]);
        assert!(Prefilter::new(&d).is_some());
    }

    #[test]
    #[ignore = "prints the literal sets; run with --ignored --nocapture"]
    fn print_the_default_literals() {
        for p in defaults() {
            println!("{:?}\n    {:?}", p, literals_of(&p));
        }
    }

    #[test]
    fn a_pattern_without_a_required_literal_turns_the_prefilter_off() {
        assert_eq!(literals_of("[0-9]{16}"), None);
        assert_eq!(literals_of("a?b*"), None);
        assert_eq!(literals_of("(?i)é"), None);
        let mut patterns = defaults();
        patterns.push("[0-9]{16}".to_owned());
        assert!(Prefilter::new(&patterns).is_none());
    }

    #[test]
    fn alternations_and_repetitions_keep_what_is_required() {
        assert_eq!(
            literals_of("(?:foo|ba[rz])+x").unwrap(),
            ["bar", "baz", "foo"]
        );
        assert_eq!(literals_of("x(?:ab)+y").unwrap(), ["ab"]);
        assert_eq!(literals_of("(?:ab)?cd").unwrap(), ["cd"]);
    }

    #[test]
    fn ordinary_attribute_values_skip_the_regex() {
        let p = Prefilter::new(&defaults()).unwrap();
        for s in [
            "fake-model-1",
            "chat_completions",
            "127.0.0.1:45501",
            "20261129_200230_bbf019:944cce63-cb11-40a2-b2b0-df8cd6066fd5:1b06e77d",
            "tool_calls",
        ] {
            assert!(!p.may_match(s), "{s}");
        }
        assert!(p.may_match("Authorization: Bearer abc"));
        assert!(p.may_match("PGPASSWORD=x psql"));
        assert!(p.may_match("mail me at a@b.io"));
    }

    /// Strings built from secrets the default patterns match, pieces of
    /// them and noise, so that matches (and near misses) are frequent.
    fn near_secrets() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-z.]{1,5}@[a-z-]{1,5}\\.[a-z]{2,3}",
            "sk-(ant-)?[A-Za-z0-9_-]{14,18}",
            "AKIA[0-9A-Z]{15,16}",
            "gh[pousrx]_[A-Za-z0-9]{29,31}",
            "xox[abprz]-[A-Za-z0-9-]{9,11}",
            "[Bb][Ee][Aa][Rr][Ee][Rr] {0,2}[a-z0-9=]{0,3}",
            "[@. _-]",
            "[A-Za-z0-9_-]{1,20}",
            ".{0,3}",
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|p| p.concat())
    }

    /// Each kind of literal, in mixed case, at every offset of a string
    /// of filler no literal occurs in, around and across the packed path's
    /// window ends: both searches find it, and neither finds the filler.
    #[test]
    fn both_searches_find_a_literal_wherever_it_sits() {
        let p = Prefilter::new(&defaults()).unwrap();
        if cfg!(target_arch = "x86_64") {
            assert!(p.packed.is_some(), "Teddy is built on x86-64");
        }
        for len in [PACKED_FROM, 40, WINDOW + 3, 2 * WINDOW + 50] {
            let filler: String = "zq9 ".chars().cycle().take(len).collect();
            assert!(!p.may_match(&filler) && !p.literals.is_match(&filler));
            for literal in ["sK-", "AUTHORIZATION", "@", "://", "pypi-AgEIcHlwaS5vcmc"] {
                for at in 0..=len - literal.len() {
                    let mut s = filler.clone();
                    s.replace_range(at..at + literal.len(), literal);
                    assert!(p.may_match(&s), "{literal} at {at} of {len}");
                    assert!(p.literals.is_match(&s), "{literal} at {at} of {len}");
                }
            }
        }
    }

    /// Strings of every length up to a few windows, of filler, literals in
    /// any case and near misses.
    fn long_strings() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-z0-9 :_-]{1,300}",
            "(?i)(sk-|bearer|token|akia|ghp_|secret|://|ya29\\.|pypi-agei)",
            "(?i)(sk|bear|toke|ak|gh_|secre|:/|ya29|pypi-age)",
            "[@éß]",
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|p| p.concat())
    }

    proptest! {
        #[test]
        fn both_searches_answer_alike(s in long_strings()) {
            let p = Prefilter::new(&defaults()).unwrap();
            let packed = p.packed.as_ref().map_or(p.literals.is_match(&s), |k| k.may_match(s.as_bytes()));
            prop_assert_eq!(packed, p.literals.is_match(&s), "{:?}", s);
        }

        #[test]
        fn every_string_the_patterns_match_passes_the_prefilter(s in near_secrets()) {
            let d = defaults();
            let p = Prefilter::new(&d).unwrap();
            let re = Regex::new(&d.iter().map(|p| format!("(?:{p})")).collect::<Vec<_>>().join("|")).unwrap();
            if re.is_match(&s) {
                prop_assert!(p.may_match(&s), "{s:?}");
            }
        }
    }
}
