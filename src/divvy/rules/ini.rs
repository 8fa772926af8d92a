//! ini: the INI dialect of Divvy rule files.
//!
//! Hand-written on purpose: it mirrors node-ini (which Divvy uses) in the corners that decide what a
//! rule file means (quoted values, inline `;`/`#` comments with `\;` escapes, a section name that
//! is itself the rule's `key=value` operation, `null` as no value), so a file means here what it
//! meant to Divvy; a general INI crate differs in exactly those corners.

use super::raw::{Problem, RawRule};

fn unquote(v: &str) -> &str {
    let b = v.as_bytes();
    if b.len() >= 2 && (b[0] == b'"' || b[0] == b'\'') && b[b.len() - 1] == b[0] {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// Strips an inline `;` or `#` comment from an unquoted value (`\;` and `\#` stay literal).
fn strip_comment(v: &str) -> String {
    let mut out = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n @ (';' | '#' | '\\')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            },
            ';' | '#' => break,
            c => out.push(c),
        }
    }
    out.trim().to_owned()
}

pub(super) fn parse_ini(text: &str) -> Result<Vec<RawRule>, Problem> {
    let mut rules: Vec<RawRule> = Vec::new();
    for (n, raw_line) in text.lines().enumerate() {
        let line = raw_line.trim();
        let at = n + 1;
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = unquote(name.trim()).trim();
            let mut operation: Vec<(String, String)> = Vec::new();
            if name != "default" {
                for token in name.split(is_space).filter(|t| !t.is_empty()) {
                    let (k, v) = token.split_once('=').unwrap_or((token, ""));
                    if operation.iter().any(|(ok, _)| ok == k) {
                        return Err(format!(
                            "line {at}: section [{name}] names the key {k:?} twice"
                        )
                        .into());
                    }
                    operation.push((k.to_owned(), v.to_owned()));
                }
            }
            rules.push(RawRule {
                operation,
                name: format!("[{name}] (line {at})"),
                ..RawRule::default()
            });
            continue;
        }
        let Some(rule) = rules.last_mut() else {
            return Err(format!("line {at}: {line:?} comes before the first [section]").into());
        };
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => return Err(format!("line {at}: {line:?} is not `key = value`").into()),
        };
        let value = if value.len() >= 2 && unquote(value).len() + 2 == value.len() {
            unquote(value).to_owned()
        } else {
            strip_comment(value)
        };
        let value = (!value.is_empty() && value != "null").then_some(value);
        let slot = match key {
            "creditLimit" => &mut rule.credit_limit,
            "resetSeconds" => &mut rule.reset_seconds,
            "actorField" => &mut rule.actor_field,
            "matchPolicy" => &mut rule.match_policy,
            "label" => &mut rule.label,
            "comment" => &mut rule.comment,
            _ => continue, // Divvy ignores other keys
        };
        *slot = value;
    }
    Ok(rules)
}

fn is_space(c: char) -> bool {
    c.is_whitespace()
}
