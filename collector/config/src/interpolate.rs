//! `${VAR}` and `${VAR:-default}` in the configuration file, replaced from
//! the environment before the YAML is parsed; `$$` is a literal `$` (write
//! `$$` for a `$` in a regex, for instance). Lines that are comments are left
//! alone.
//!
//! The environment is read through a lookup function, so tests never set
//! process variables. A variable that is unset (and has no default) is an
//! error naming the variable and the key on its line.

use crate::ConfigError;

/// The values the environment gave the configuration, each with its
/// variable's name, so that what the collector prints about its
/// configuration (errors, log lines) can show `${NAME}` instead of a value
/// that may be a secret. Its `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Interpolated(Vec<(String, String)>);

impl Interpolated {
    /// `text` with each value of 4 bytes or more replaced by `${NAME}`
    /// (longest first). Shorter values are no secret, and replacing them
    /// would garble the text (line numbers, ports).
    pub fn conceal(&self, text: &str) -> String {
        let mut used: Vec<&(String, String)> = self
            .0
            .iter()
            .filter(|(value, _)| value.len() >= 4)
            .collect();
        used.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        let mut text = text.to_owned();
        for (value, name) in used {
            text = text.replace(value.as_str(), &format!("${{{name}}}"));
        }
        text
    }
}

impl std::fmt::Debug for Interpolated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(_, name)| name))
            .finish()
    }
}

/// Replaces the references in `text` using `lookup`.
#[cfg(test)]
pub fn interpolate(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    interpolate_with(text, lookup, &mut Interpolated::default())
}

/// As [`interpolate`], also recording each value taken from the
/// environment with its variable's name in `used` (so that errors can name
/// the variable instead of showing a secret).
pub fn interpolate_with(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    used: &mut Interpolated,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with('#') {
            // Comment lines may talk about `${VAR}`; they are left alone.
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(pos) = rest.find('$') {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(body) = after.strip_prefix('{') {
                let Some(end) = body.find('}') else {
                    return Err(error(line, index, "an unterminated `${`"));
                };
                let reference = &body[..end];
                let (name, default) = match reference.split_once(":-") {
                    Some((name, default)) => (name, Some(default)),
                    None => (reference, None),
                };
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(error(
                        line,
                        index,
                        &format!("`${{{reference}}}` is not a variable reference"),
                    ));
                }
                let from_env = lookup(name).filter(|v| !v.is_empty());
                if let Some(value) = &from_env {
                    used.0.push((value.clone(), name.to_owned()));
                }
                match from_env.or(default.map(str::to_owned)) {
                    Some(value) => out.push_str(&value),
                    None => {
                        return Err(error(
                            line,
                            index,
                            &format!("environment variable {name} is not set"),
                        ));
                    }
                }
                rest = &body[end + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
    }
    Ok(out)
}

/// An error for line `index` (0-based), naming the YAML key written on it.
fn error(line: &str, index: usize, reason: &str) -> ConfigError {
    let key = line
        .trim_start()
        .trim_start_matches("- ")
        .split(':')
        .next()
        .unwrap_or("")
        .trim();
    let path = if key.is_empty() || key.contains('$') {
        format!("line {}", index + 1)
    } else {
        format!("line {} ({key})", index + 1)
    };
    ConfigError {
        path,
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn references_are_replaced() {
        let text = "a: ${TOKEN}\nb: ${MISSING:-fallback}\nc: ${EMPTY:-used}\nd: $$notvar $5\n";
        assert_eq!(
            interpolate(text, &env).unwrap(),
            "a: s3cret\nb: fallback\nc: used\nd: $notvar $5\n"
        );
    }

    #[test]
    fn conceal_shows_names_instead_of_values() {
        let mut used = Interpolated::default();
        let text = interpolate_with("a: /data/${TOKEN}/x\n", &env, &mut used).unwrap();
        assert_eq!(text, "a: /data/s3cret/x\n");
        assert_eq!(used.conceal("/data/s3cret/x"), "/data/${TOKEN}/x");
        assert_eq!(format!("{used:?}"), "[\"TOKEN\"]");
    }

    #[test]
    fn unset_variable_names_the_key() {
        let e = interpolate("exporters:\n  otlp:\n    endpoint: ${OTLP_URL}\n", &env).unwrap_err();
        assert_eq!(e.path, "line 3 (endpoint)");
        assert!(e.reason.contains("OTLP_URL"), "{e}");
        let e = interpolate("x: ${bad name}\n", &env).unwrap_err();
        assert!(e.reason.contains("not a variable reference"));
        assert!(interpolate("x: ${TOKEN\n", &env).is_err());
    }
}
