//! protocol: the Divvy `HIT` line protocol, parsed and formatted without I/O.
//!
//! Grammar as implemented by Divvy 1.7.1 (`docs/divvy.md`): a command word (quoted or not,
//! case-insensitive, only `HIT` exists), then `key=value` pairs separated by whitespace. Strings are
//! quoted (`"..."`, no escapes) or unquoted (up to whitespace or `=`). Error reasons are Divvy's own
//! texts, so clients that match on them keep working. Differences from the original: an empty line
//! is ignored (as up to Divvy 1.7.0).

use std::collections::HashMap;

/// One request line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `HIT` with its operation (duplicate keys: the last wins).
    Hit(HashMap<String, String>),
    /// An empty line: no reply.
    Empty,
}

/// Why a line was refused. The connection closes after the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// `ERR unknown-command "Unrecognized command: <WORD>"`.
    UnknownCommand(String),
    /// `ERR unknown "<reason>"`.
    Unknown(String),
}

/// A reply line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `OK <allowed> <credit> <resetSeconds>`.
    Ok {
        allowed: bool,
        credit: u64,
        reset: i64,
    },
    Err(ProtoError),
}

impl Reply {
    /// The reply as sent: one line, LF-terminated.
    pub fn to_line(&self) -> String {
        match self {
            Reply::Ok {
                allowed,
                credit,
                reset,
            } => format!("OK {allowed} {credit} {reset}\n"),
            Reply::Err(ProtoError::UnknownCommand(word)) => {
                format!("ERR unknown-command \"Unrecognized command: {word}\"\n")
            }
            Reply::Err(ProtoError::Unknown(reason)) => format!("ERR unknown \"{reason}\"\n"),
        }
    }
}

/// JavaScript's `\s`: what Divvy treats as whitespace.
pub fn is_js_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202f}'
                | '\u{205f}'
                | '\u{3000}'
                | '\u{feff}'
    )
}

fn unknown(reason: &str) -> ProtoError {
    ProtoError::Unknown(reason.to_owned())
}

/// A cursor over the characters of one line.
struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
}

impl Cursor<'_> {
    /// Reads one string: quoted up to the next `"`, or unquoted up to whitespace, `=` or the end.
    fn string(&mut self) -> Result<String, ProtoError> {
        let mut out = String::new();
        if self.chars.peek() == Some(&'"') {
            self.chars.next();
            loop {
                match self.chars.next() {
                    Some('"') => return Ok(out),
                    Some(c) => out.push(c),
                    None => return Err(unknown("Unexpected end of quoted string.")),
                }
            }
        }
        while let Some(&c) = self.chars.peek() {
            if c == '=' || is_js_space(c) {
                break;
            }
            out.push(c);
            self.chars.next();
        }
        Ok(out)
    }
}

/// Parses one request line (without its `\n`; a `\r` before it is removed here).
pub fn parse_line(line: &str) -> Result<Request, ProtoError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.is_empty() {
        return Ok(Request::Empty);
    }
    let mut cur = Cursor {
        chars: line.chars().peekable(),
    };
    let word = cur.string()?.to_uppercase();
    if word != "HIT" {
        return Err(ProtoError::UnknownCommand(word));
    }
    let rest: String = cur.chars.collect();
    let rest = rest.trim_matches(is_js_space);
    let mut cur = Cursor {
        chars: rest.chars().peekable(),
    };
    let mut op = HashMap::new();
    while cur.chars.peek().is_some() {
        let key = cur.string()?;
        match cur.chars.next() {
            Some('=') => {}
            Some(c) => return Err(ProtoError::Unknown(format!("Expected '=', found '{c}'"))),
            None => return Err(unknown("Unexpected end of input string.")),
        }
        let value = cur.string()?;
        match cur.chars.peek() {
            None => {}
            Some(&c) if is_js_space(c) => {
                while cur.chars.peek().is_some_and(|&c| is_js_space(c)) {
                    cur.chars.next();
                }
            }
            Some(&c) => {
                return Err(ProtoError::Unknown(format!(
                    "Expected whitespace, found '{c}'"
                )));
            }
        }
        op.insert(key, value);
    }
    Ok(Request::Hit(op))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(pairs: &[(&str, &str)]) -> Result<Request, ProtoError> {
        Ok(Request::Hit(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ))
    }

    fn err_line(line: &str) -> String {
        Reply::Err(parse_line(line).unwrap_err()).to_line()
    }

    #[test]
    fn hits_with_quoted_and_unquoted_strings() {
        assert_eq!(
            parse_line("HIT method=GET path=/status"),
            hit(&[("method", "GET"), ("path", "/status")])
        );
        assert_eq!(parse_line("hit a=1\r"), hit(&[("a", "1")]));
        assert_eq!(
            parse_line("Hit \"a b\"=\"x = y\"\t c=\"\""),
            hit(&[("a b", "x = y"), ("c", "")])
        );
        assert_eq!(parse_line("\"hit\" a=b"), hit(&[("a", "b")]));
        assert_eq!(parse_line("HIT who=a\"b"), hit(&[("who", "a\"b")]));
        assert_eq!(parse_line("HIT a="), hit(&[("a", "")]));
        assert_eq!(
            parse_line("HIT a=1 a=2"),
            hit(&[("a", "2")]),
            "the last duplicate wins"
        );
        assert_eq!(parse_line("HIT"), hit(&[]));
        assert_eq!(parse_line("HIT   "), hit(&[]));
        assert_eq!(parse_line("HIT =x"), hit(&[("", "x")]));
        assert_eq!(parse_line("HIT=x"), hit(&[("", "x")]));
        assert_eq!(
            parse_line("HIT a=1\rb=2"),
            hit(&[("a", "1"), ("b", "2")]),
            "a lone CR is whitespace"
        );
        assert_eq!(
            parse_line("HIT a=1\u{a0}b=2"),
            hit(&[("a", "1"), ("b", "2")]),
            "NBSP is whitespace"
        );
    }

    #[test]
    fn empty_lines_are_ignored() {
        assert_eq!(parse_line(""), Ok(Request::Empty));
        assert_eq!(parse_line("\r"), Ok(Request::Empty));
    }

    /// Every row of the error table in docs/divvy.md (Divvy 1.7.1's exact texts).
    #[test]
    fn error_replies_are_divvys() {
        for (line, reply) in [
            ("HIT a", "ERR unknown \"Unexpected end of input string.\"\n"),
            ("HIT a b=c", "ERR unknown \"Expected '=', found ' '\"\n"),
            ("HIT a = b", "ERR unknown \"Expected '=', found ' '\"\n"),
            ("HIT \"a\" =b", "ERR unknown \"Expected '=', found ' '\"\n"),
            (
                "HIT a=b=c",
                "ERR unknown \"Expected whitespace, found '='\"\n",
            ),
            (
                "HIT a=\"b\"c",
                "ERR unknown \"Expected whitespace, found 'c'\"\n",
            ),
            (
                "HIT \"a=b",
                "ERR unknown \"Unexpected end of quoted string.\"\n",
            ),
            (
                "HIT a=\"b c",
                "ERR unknown \"Unexpected end of quoted string.\"\n",
            ),
            (
                "\"FOO",
                "ERR unknown \"Unexpected end of quoted string.\"\n",
            ),
            (
                "HIT \"\"",
                "ERR unknown \"Unexpected end of input string.\"\n",
            ),
            ("FOO", "ERR unknown-command \"Unrecognized command: FOO\"\n"),
            (
                "foo a=b",
                "ERR unknown-command \"Unrecognized command: FOO\"\n",
            ),
            (
                "HIT\"a\"=b",
                "ERR unknown-command \"Unrecognized command: HIT\"A\"\"\n",
            ),
            (
                " HIT a=b",
                "ERR unknown-command \"Unrecognized command: \"\n",
            ),
            ("   ", "ERR unknown-command \"Unrecognized command: \"\n"),
            (
                "\"two words\"",
                "ERR unknown-command \"Unrecognized command: TWO WORDS\"\n",
            ),
        ] {
            assert_eq!(err_line(line), reply, "{line:?}");
        }
    }

    #[test]
    fn ok_replies() {
        assert_eq!(
            Reply::Ok {
                allowed: true,
                credit: 4,
                reset: 60
            }
            .to_line(),
            "OK true 4 60\n"
        );
        assert_eq!(
            Reply::Ok {
                allowed: false,
                credit: 0,
                reset: -1
            }
            .to_line(),
            "OK false 0 -1\n"
        );
    }
}
