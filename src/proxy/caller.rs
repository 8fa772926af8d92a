//! caller: where a request's API key is found (`limits.api_key_from`): a list of sources tried in
//! order, the first one present deciding, even when its key is unknown (a request never falls
//! through to a key it did not mean, and one source cannot be used to probe behind another).
//!
//! Sources: `header:NAME` (the field's value is the key) and `bearer` (`Authorization: Bearer
//! <token>`, the scheme in any case, the token is the key). Pure: the admission reads the fields
//! and asks here which key they give.

use http::header::AUTHORIZATION;
use http::{HeaderName, HeaderValue};

/// Sources in one list at most: each is looked for in every request's fields.
pub const MAX_SOURCES: usize = 4;

/// One place a key may be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A header field's whole value.
    Header(HeaderName),
    /// The token of `Authorization: Bearer <token>`.
    Bearer,
}

/// The sources of `limits.api_key_from`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    list: Vec<Source>,
    /// The field each source reads, in the same order (`Authorization` for `bearer`).
    names: Vec<HeaderName>,
    /// Where to send a key, for messages: "the X-Api-Key header", "an Authorization: Bearer
    /// token or the X-Api-Key header".
    said: String,
}

impl Sources {
    /// `spec`: comma-separated sources (`header:X-Api-Key, bearer`). The error says what is
    /// wrong, without the option's name.
    pub fn parse(spec: &str) -> Result<Sources, String> {
        let mut list = Vec::new();
        let mut said = Vec::new();
        for part in spec.split(',').map(str::trim) {
            let (source, words) = match part.split_once(':') {
                _ if part.eq_ignore_ascii_case("bearer") => {
                    (Source::Bearer, "an Authorization: Bearer token".to_owned())
                }
                Some((kind, name)) if kind.trim().eq_ignore_ascii_case("header") => {
                    let name = name.trim();
                    let header = HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("{name:?} is not a header name"))?;
                    (Source::Header(header), format!("the {name} header"))
                }
                Some((kind, _))
                    if kind.trim().eq_ignore_ascii_case("query")
                        || kind.trim().eq_ignore_ascii_case("jwt") =>
                {
                    return Err(format!("{part:?}: {kind} sources are not supported yet"));
                }
                _ if part.is_empty() => return Err("a source is empty".into()),
                _ => {
                    return Err(format!("{part:?} is not a source (header:NAME or bearer)"));
                }
            };
            list.push(source);
            said.push(words);
        }
        if list.len() > MAX_SOURCES {
            return Err(format!("{} sources: at most {MAX_SOURCES}", list.len()));
        }
        let names: Vec<HeaderName> = list
            .iter()
            .map(|s| match s {
                Source::Header(h) => h.clone(),
                Source::Bearer => AUTHORIZATION,
            })
            .collect();
        if let Some(i) = (1..names.len()).find(|&i| names[..i].contains(&names[i])) {
            return Err(format!("{} is read by two sources", names[i]));
        }
        Ok(Sources {
            list,
            names,
            said: said.join(" or "),
        })
    }

    /// One header's value is the key (`limits.api_key_header`'s meaning).
    pub fn header(name: HeaderName, label: &str) -> Sources {
        Sources {
            list: vec![Source::Header(name.clone())],
            names: vec![name],
            said: format!("the {label} header"),
        }
    }

    pub fn list(&self) -> &[Source] {
        &self.list
    }

    /// The field each source reads, in order.
    pub fn names(&self) -> &[HeaderName] {
        &self.names
    }

    /// Where a key is sent, for messages.
    pub fn said(&self) -> &str {
        &self.said
    }

    /// The key `headers` give (the admin's `/limits`; the proxy reads its fields in one pass
    /// and asks [`Sources::find`]).
    pub fn find_in<'a>(&self, headers: &'a http::HeaderMap) -> Found<'a> {
        let values: Vec<Two<'a>> = self
            .names
            .iter()
            .map(|name| {
                let mut two = Two::default();
                headers.get_all(name).iter().for_each(|v| two.add(v));
                two
            })
            .collect();
        self.find(&values)
    }

    /// The key the request's fields give: `values[i]` holds the first two values of the field
    /// source `i` reads ([`Sources::names`]).
    pub fn find<'a>(&self, values: &[Two<'a>]) -> Found<'a> {
        for (source, Two(first, second)) in self.list.iter().zip(values) {
            let Some(first) = first.map(HeaderValue::as_bytes) else {
                continue;
            };
            let key = match source {
                Source::Header(_) => first,
                // Another scheme (Basic, a JWT the upstream checks...) is not this source's.
                Source::Bearer => match bearer(first) {
                    Some(token) => token,
                    None => continue,
                },
            };
            if second.is_some() {
                return Found::Twice;
            }
            return match key.is_empty() {
                true => Found::Empty,
                false => Found::Key(key),
            };
        }
        Found::Absent
    }
}

/// A field's first two values: where one is expected, a second is an error.
#[derive(Debug, Default, Clone, Copy)]
pub struct Two<'r>(pub Option<&'r HeaderValue>, pub Option<&'r HeaderValue>);

impl<'r> Two<'r> {
    pub fn add(&mut self, value: &'r HeaderValue) {
        match self.0 {
            None => self.0 = Some(value),
            Some(_) => {
                self.1.get_or_insert(value);
            }
        }
    }
}

/// What a request's sources give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    /// The first source present, and its key.
    Key(&'a [u8]),
    /// The first source present came twice (two fields of its name).
    Twice,
    /// The first source present is empty (a field without a value, `Bearer` without a token).
    Empty,
    /// No source is present.
    Absent,
}

/// The token of an `Authorization` value whose scheme is `Bearer` (in any case), after any
/// spaces or tabs; `Some(b"")` for the scheme alone; `None` for another scheme.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    match rest.first() {
        None => Some(rest),
        Some(b' ' | b'\t') => Some(rest.trim_ascii()),
        // `BearerX`: another scheme.
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_in_order_and_say_where_a_key_goes() {
        let s = Sources::parse("header:X-Api-Key, bearer").unwrap();
        assert_eq!(
            s.list(),
            [
                Source::Header(HeaderName::from_static("x-api-key")),
                Source::Bearer
            ]
        );
        assert_eq!(s.names()[1], AUTHORIZATION);
        assert_eq!(
            s.said(),
            "the X-Api-Key header or an Authorization: Bearer token"
        );
        assert_eq!(Sources::parse(" BEARER ").unwrap().list(), [Source::Bearer]);
        for (spec, says) in [
            ("", "a source is empty"),
            ("header:X-Api-Key,", "a source is empty"),
            ("cookie:k", "is not a source"),
            ("header:a b", "is not a header name"),
            ("query:api_key", "not supported yet"),
            ("jwt:sub", "not supported yet"),
            (
                "bearer, header:Authorization",
                "authorization is read by two sources",
            ),
            ("header:a,header:b,header:c,header:d,header:e", "at most 4"),
        ] {
            let e = Sources::parse(spec).unwrap_err();
            assert!(e.contains(says), "{spec:?}: {e}");
        }
    }

    #[test]
    fn bearer_takes_the_token_of_its_scheme_only() {
        for (value, token) in [
            (&b"Bearer sk-1"[..], Some(&b"sk-1"[..])),
            (b"bearer sk-1", Some(b"sk-1")),
            (b"BEARER \t  sk-1  ", Some(b"sk-1")),
            (b"Bearer", Some(b"")),
            (b"Bearer   ", Some(b"")),
            (b"Basic dXNlcjpwYXNz", None),
            (b"BearerX sk-1", None),
            (b"Bear", None),
            (b"", None),
        ] {
            assert_eq!(bearer(value), token, "{:?}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn the_first_source_present_decides() {
        let s = Sources::parse("bearer, header:X-Api-Key").unwrap();
        let v = |b: &'static str| Some(HeaderValue::from_static(b));
        // What the two sources' fields give, as text.
        fn shown(s: &Sources, values: &[Two<'_>]) -> String {
            match s.find(values) {
                Found::Key(k) => String::from_utf8_lossy(k).into_owned(),
                other => format!("{other:?}"),
            }
        }
        let (ba, bb, basic, bearer_alone) =
            (v("Bearer a"), v("Bearer c"), v("Basic x"), v("Bearer "));
        let (b, c, empty) = (v("b"), v("c"), v(""));
        let one = |auth: &Option<HeaderValue>, key: &Option<HeaderValue>| {
            shown(&s, &[Two(auth.as_ref(), None), Two(key.as_ref(), None)])
        };
        assert_eq!(one(&ba, &b), "a");
        // Another scheme is not the bearer source: the next one decides.
        assert_eq!(one(&basic, &b), "b");
        assert_eq!(one(&None, &b), "b");
        assert_eq!(one(&bearer_alone, &b), "Empty");
        assert_eq!(one(&None, &empty), "Empty");
        assert_eq!(one(&None, &None), "Absent");
        assert_eq!(one(&basic, &None), "Absent");
        let twice = [Two(ba.as_ref(), bb.as_ref()), Two(None, None)];
        assert_eq!(shown(&s, &twice), "Twice");
        let twice = [Two(None, None), Two(b.as_ref(), c.as_ref())];
        assert_eq!(shown(&s, &twice), "Twice");
    }
}
