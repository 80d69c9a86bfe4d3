//! A nesting-depth limit for the configuration's YAML, checked on the text
//! before the YAML parser sees it.
//!
//! The YAML parser takes time that grows faster than the input with deeply
//! nested flow collections (100 000 `[` took it 38 s to refuse), and no
//! configuration of the collector nests deeper than six levels. This scan
//! runs in one pass over the text, in time linear in its length, and refuses
//! a document nested deeper than [`MAX_DEPTH`] with an error naming the line.
//!
//! The depth it counts is an estimate that never falls short of YAML's on
//! the inputs that matter: each indentation level of block structure, each
//! compact `- `/`? ` entry opened on a line, and each open `[` or `{` (outside
//! quoted scalars, comments and block scalars `|`/`>`). Brackets that a plain
//! scalar happens to contain may count too, so the limit sits far above any
//! real configuration.

use crate::ConfigError;

/// Deepest nesting a configuration may have.
pub const MAX_DEPTH: usize = 64;

/// Refuses `text` when it nests deeper than `max`, naming the first line
/// where it does.
pub fn check(text: &str, max: usize) -> Result<(), ConfigError> {
    let mut scan = Scan::default();
    for (index, line) in text.lines().enumerate() {
        if scan.depth_after(line) > max {
            return Err(ConfigError::new(
                format!("line {}", index + 1),
                format!("the YAML nests deeper than {max} levels"),
            ));
        }
    }
    Ok(())
}

/// State carried from line to line.
#[derive(Default)]
struct Scan {
    /// Indentation of each open block level.
    indents: Vec<usize>,
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Inside a quoted scalar that spans lines: its quote.
    quote: Option<char>,
    /// Inside a block scalar opened on a line of this indentation.
    block_scalar: Option<usize>,
}

impl Scan {
    /// Takes in one line; returns the deepest nesting reached on it.
    fn depth_after(&mut self, line: &str) -> usize {
        let body = line.trim_start_matches(' ');
        let indent = line.len() - body.len();
        if let Some(parent) = self.block_scalar {
            if body.trim().is_empty() || indent > parent {
                return 0;
            }
            self.block_scalar = None;
        }
        let mut rest = body;
        let mut compact = 0;
        if self.quote.is_none() && self.flow == 0 {
            if body.is_empty() || body.starts_with('#') {
                return 0;
            }
            while self.indents.last().is_some_and(|&top| top > indent) {
                self.indents.pop();
            }
            if self.indents.last() != Some(&indent) {
                self.indents.push(indent);
            }
            // `- - - x`: each indicator opens one more level.
            while let Some(after) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("? ")) {
                compact += 1;
                rest = after.trim_start_matches(' ');
            }
        }
        let base = self.indents.len() + compact;
        let mut deepest = base + self.flow;
        // The last non-blank character, and whether a blank came just before.
        let mut previous: Option<char> = None;
        let mut blank_before = true;
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            if let Some(quote) = self.quote {
                if quote == '"' && c == '\\' {
                    chars.next();
                } else if c == quote {
                    if quote == '\'' && chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        self.quote = None;
                        previous = Some(c);
                        blank_before = false;
                    }
                }
                continue;
            }
            match c {
                '#' if blank_before => break,
                '"' | '\'' if starts_scalar(previous) => self.quote = Some(c),
                '[' | '{' => {
                    self.flow += 1;
                    deepest = deepest.max(base + self.flow);
                }
                ']' | '}' => self.flow = self.flow.saturating_sub(1),
                _ => {}
            }
            blank_before = c.is_whitespace();
            if !blank_before {
                previous = Some(c);
            }
        }
        if self.quote.is_none() && self.flow == 0 && opens_block_scalar(rest) {
            self.block_scalar = Some(indent);
        }
        deepest
    }
}

/// Whether a quote after `previous` (the last non-blank character before it
/// on the line) starts a quoted scalar rather than sitting inside a plain
/// one (`key: it's`, `note: don 't`).
fn starts_scalar(previous: Option<char>) -> bool {
    previous.is_none_or(|c| matches!(c, ':' | '-' | '[' | '{' | ',' | '?'))
}

/// Whether `line` ends with a block scalar indicator (`key: |`, `- >-`),
/// a comment aside.
fn opens_block_scalar(line: &str) -> bool {
    let code = match line.find(" #") {
        Some(at) => &line[..at],
        None => line,
    };
    let Some(last) = code.split_whitespace().last() else {
        return false;
    };
    let mut indicator = last.chars();
    matches!(indicator.next(), Some('|' | '>'))
        && indicator.all(|c| matches!(c, '-' | '+' | '1'..='9'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn ordinary_configurations_pass() {
        let example =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/collector.yaml");
        check(&std::fs::read_to_string(example).unwrap(), MAX_DEPTH).unwrap();
        let text =
            "a:\n  b: [1, {c: 'it''s ]]]', d: \"[[[\\\"\"}]\n  e: |\n    [[[[[[\n  f: it's [x]\n";
        check(text, 4).unwrap();
    }

    #[test]
    fn deep_flow_nesting_is_refused_fast_naming_the_line() {
        let text = format!("receiver:\n  listen: {}\n", "[".repeat(100_000));
        let start = Instant::now();
        let e = check(&text, MAX_DEPTH).unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(500));
        assert_eq!(e.path, "line 2");
        assert!(e.reason.contains("64"), "{e}");
        // Through the whole parse too.
        let start = Instant::now();
        let e = crate::Config::from_yaml(&text).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(e.path, "line 2");
    }

    #[test]
    fn deep_block_nesting_is_refused() {
        let compact = format!("a: 1\nb:\n{}x\n", "- ".repeat(100));
        assert_eq!(check(&compact, MAX_DEPTH).unwrap_err().path, "line 3");
        let indented: String = (0..80)
            .map(|level| format!("{}k{level}:\n", " ".repeat(level)))
            .collect();
        assert_eq!(check(&indented, MAX_DEPTH).unwrap_err().path, "line 65");
        let mixed = format!("a:\n  - {}", "{b: [".repeat(40));
        assert_eq!(check(&mixed, MAX_DEPTH).unwrap_err().path, "line 2");
    }
}
