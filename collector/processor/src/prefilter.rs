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
//! Invariant: for every string `s`, if the patterns match `s` then the
//! prefilter matches `s` (tested on generated strings).

use aho_corasick::AhoCorasick;
use regex_syntax::hir::{Class, Hir, HirKind};

/// Most literals one pattern's required set may hold.
const MAX_LITERALS: usize = 64;
/// Most bytes a class may stand for to be expanded into literals.
const MAX_CLASS_BYTES: usize = 8;

/// Literals at least one of which every match of the patterns contains.
#[derive(Debug)]
pub(crate) struct Prefilter {
    literals: AhoCorasick,
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
        Some(Self { literals })
    }

    /// Whether `haystack` contains one of the literals (it may match).
    pub(crate) fn may_match(&self, haystack: &str) -> bool {
        self.literals.is_match(haystack)
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

    proptest! {
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
