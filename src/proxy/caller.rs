//! caller: where a request's API key is found (`limits.api_key_from`): a list of sources tried in
//! order, the first one present deciding, even when its key is unknown (a request never falls
//! through to a key it did not mean, and one source cannot be used to probe behind another).
//!
//! Sources: `header:NAME` (the field's value is the key), `bearer` (`Authorization: Bearer
//! <token>`, the scheme in any case, the token is the key), `query:NAME` (a query parameter,
//! percent-decoded, taken out of the target before anything else sees it) and `jwt:CLAIM` (a
//! Bearer JWT, verified by [`super::jwt`], whose claim is the key). Pure: the admission reads
//! the fields and asks here which key they give; what needs more than the head (a query taken
//! out of the target, a token verified) is done before and handed over as [`Given`].

use http::header::AUTHORIZATION;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Uri};

/// Sources in one list at most: each is looked for in every request's fields.
pub const MAX_SOURCES: usize = 4;

/// One place a key may be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A header field's whole value.
    Header(HeaderName),
    /// The token of `Authorization: Bearer <token>`.
    Bearer,
    /// A query parameter's value, percent-decoded (`+` a space, as forms send it).
    Query(String),
    /// A claim of the verified JWT of `Authorization: Bearer <token>`: its path into nested
    /// objects (`org.id` is `["org", "id"]`).
    Jwt(Vec<String>),
}

/// What the sources that need more than the head's fields found before admission, held for
/// it (boxed by the proxy, and only when such a source is listed: a request's future would
/// otherwise carry it whole).
#[derive(Debug, Default)]
pub struct Taken {
    pub query: Option<QueryKey>,
    pub token: Option<super::jwt::Checked>,
}

impl Taken {
    pub fn given(&self) -> Given<'_> {
        Given {
            query: self.query.as_ref(),
            token: self.token.as_ref(),
        }
    }
}

/// What was found before admission for the sources that need more than the head's fields.
#[derive(Debug, Default, Clone, Copy)]
pub struct Given<'a> {
    /// The `query:` source's parameter, taken out of the target; `None`: it was not there.
    pub query: Option<&'a QueryKey>,
    /// The `jwt:` source's token, checked; `None`: not checked (another source decided).
    pub token: Option<&'a super::jwt::Checked>,
}

/// The sources of `limits.api_key_from`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    list: Vec<Source>,
    /// The field each source that reads one reads, in the same order (`Authorization` for
    /// `bearer`; a `query:` source reads none).
    names: Vec<HeaderName>,
    /// The `query:` source's parameter name, if one is listed.
    query: Option<String>,
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
                Some((kind, name)) if kind.trim().eq_ignore_ascii_case("query") => {
                    let name = name.trim();
                    // Unreserved characters only: the name is then the same escaped or not.
                    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
                    if name.is_empty() || !name.bytes().all(unreserved) {
                        return Err(format!(
                            "{name:?} is not a query parameter name (letters, digits, -._~)"
                        ));
                    }
                    (
                        Source::Query(name.to_owned()),
                        format!("the ?{name}= query parameter"),
                    )
                }
                Some((kind, claim)) if kind.trim().eq_ignore_ascii_case("jwt") => {
                    let claim = claim.trim();
                    let path: Vec<String> = claim.split('.').map(str::to_owned).collect();
                    if path.iter().any(String::is_empty) {
                        return Err(format!("{claim:?} is not a claim (sub, tenant, org.id)"));
                    }
                    (
                        Source::Jwt(path),
                        "a JWT in Authorization: Bearer".to_owned(),
                    )
                }
                _ if part.is_empty() => return Err("a source is empty".into()),
                _ => {
                    return Err(format!(
                        "{part:?} is not a source (header:NAME, bearer, query:NAME or jwt:CLAIM)"
                    ));
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
            .filter_map(|s| match s {
                Source::Header(h) => Some(h.clone()),
                Source::Bearer | Source::Jwt(_) => Some(AUTHORIZATION),
                Source::Query(_) => None,
            })
            .collect();
        if let Some(i) = (1..names.len()).find(|&i| names[..i].contains(&names[i])) {
            return Err(format!("{} is read by two sources", names[i]));
        }
        let mut queries = list.iter().filter_map(|s| match s {
            Source::Query(name) => Some(name.clone()),
            _ => None,
        });
        let query = queries.next();
        if queries.next().is_some() {
            return Err("two query sources: at most one".into());
        }
        Ok(Sources {
            list,
            names,
            query,
            said: said.join(" or "),
        })
    }

    /// One header's value is the key (`limits.api_key_header`'s meaning).
    pub fn header(name: HeaderName, label: &str) -> Sources {
        Sources {
            list: vec![Source::Header(name.clone())],
            names: vec![name],
            query: None,
            said: format!("the {label} header"),
        }
    }

    pub fn list(&self) -> &[Source] {
        &self.list
    }

    /// The field each source that reads one reads, in order.
    pub fn names(&self) -> &[HeaderName] {
        &self.names
    }

    /// The parameter of the `query:` source, if one is listed.
    pub fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }

    /// Whether a source needs more than the head's fields (`query:`, `jwt:`): the proxy then
    /// finds it before admission ([`Taken`]).
    pub fn needs_more(&self) -> bool {
        self.query.is_some() || self.list.iter().any(|s| matches!(s, Source::Jwt(_)))
    }

    /// The claim of the `jwt:` source (`org.id`), if one is listed.
    pub fn jwt_claim(&self) -> Option<String> {
        self.list.iter().find_map(|s| match s {
            Source::Jwt(path) => Some(path.join(".")),
            _ => None,
        })
    }

    /// The token the `jwt:` source would verify for a request with these `headers` and
    /// `query` parameter: `None` when another source before it decides, or it has no token to
    /// check (absent, another scheme, empty, twice: the admission answers those without one).
    pub fn jwt_token<'a>(
        &self,
        headers: &'a http::HeaderMap,
        query: Option<&QueryKey>,
    ) -> Option<&'a [u8]> {
        for source in &self.list {
            match source {
                Source::Header(name) if headers.contains_key(name) => return None,
                Source::Query(_) if query.is_some() => return None,
                Source::Jwt(_) => {
                    let mut values = headers.get_all(AUTHORIZATION).iter();
                    let (Some(first), None) = (values.next(), values.next()) else {
                        return None;
                    };
                    return bearer(first.as_bytes()).filter(|t| !t.is_empty());
                }
                // `bearer` and `jwt:` are never listed together (both read Authorization).
                _ => {}
            }
        }
        None
    }

    /// Where a key is sent, for messages.
    pub fn said(&self) -> &str {
        &self.said
    }

    /// The key `headers` and what was found before give (the admin's `/limits`; the proxy
    /// reads its fields in one pass and asks [`Sources::find`]).
    pub fn find_in<'a>(&self, headers: &'a http::HeaderMap, given: Given<'a>) -> Found<'a> {
        let values: Vec<Two<'a>> = self
            .names
            .iter()
            .map(|name| {
                let mut two = Two::default();
                headers.get_all(name).iter().for_each(|v| two.add(v));
                two
            })
            .collect();
        self.find(&values, given)
    }

    /// The key the request gives: `values[i]` holds the first two values of the field the
    /// `i`th source that reads a field reads ([`Sources::names`]); `given`, what was found
    /// before.
    pub fn find<'a>(&self, values: &[Two<'a>], given: Given<'a>) -> Found<'a> {
        let mut fields = values.iter();
        for source in &self.list {
            let Two(first, second) = match source {
                Source::Query(_) => match given.query {
                    None => continue,
                    Some(QueryKey::Key(key)) => return Found::Key(key),
                    Some(QueryKey::Twice) => return Found::Twice,
                    Some(QueryKey::Empty) => return Found::Empty,
                },
                _ => fields.next().copied().unwrap_or_default(),
            };
            let Some(first) = first.map(HeaderValue::as_bytes) else {
                continue;
            };
            let key = match source {
                // Another scheme (Basic, a JWT the upstream checks...) is not this source's.
                Source::Bearer | Source::Jwt(_) => match bearer(first) {
                    Some(token) => token,
                    None => continue,
                },
                _ => first,
            };
            if second.is_some() {
                return Found::Twice;
            }
            if key.is_empty() {
                return Found::Empty;
            }
            return match (source, given.token) {
                (Source::Jwt(_), Some(super::jwt::Checked(Ok(v)))) => Found::Key(&v.key),
                (Source::Jwt(_), Some(super::jwt::Checked(Err(why)))) => Found::Refused(why),
                // Never left unchecked by the proxy ([`Sources::jwt_token`]): not a key.
                (Source::Jwt(_), None) => Found::Refused(&super::jwt::Refusal::Malformed),
                _ => Found::Key(key),
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
    /// The first source present is a JWT that is not taken, and why.
    Refused(&'a super::jwt::Refusal),
    /// No source is present.
    Absent,
}

/// What the `query:` source's parameter gave, once taken out of the request's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryKey {
    /// Its one value, percent-decoded.
    Key(Box<[u8]>),
    /// It came twice.
    Twice,
    /// It came without a value (`?api_key` or `?api_key=`).
    Empty,
}

impl QueryKey {
    /// Takes every `name` parameter out of `head`'s target (so that neither the upstream nor
    /// anything logged after sees the key) and returns what it gave; `None`: it was not there,
    /// and the target is untouched. A name is compared percent-decoded, as the upstream would
    /// read it: `api%5Fkey=` is `api_key=` and is taken too.
    pub fn take(head: &mut Parts, name: &str) -> Option<QueryKey> {
        let query = head.uri.query()?;
        // Most queries do not name it: none is split unless its name, or an escape (it may
        // hide the name), is there.
        let bytes = query.as_bytes();
        if memchr::memmem::find(bytes, name.as_bytes()).is_none() && !bytes.contains(&b'%') {
            return None;
        }
        let (found, rest) = Self::split(query, name)?;
        let path = head.uri.path();
        let mut target = String::with_capacity(path.len() + 1 + rest.len());
        target.push_str(path);
        if !rest.is_empty() {
            target.push('?');
            target.push_str(&rest);
        }
        let mut parts = std::mem::take(&mut head.uri).into_parts();
        // The rest of a valid query is a valid query: no byte was added.
        parts.path_and_query = target.parse().ok();
        head.uri = Uri::from_parts(parts).unwrap_or_default();
        Some(found)
    }

    /// What the `name` parameters of `query` give (the admin's `/limits`, whose own query
    /// carries the key); `None`: there are none.
    pub fn in_query(query: &str, name: &str) -> Option<QueryKey> {
        Self::split(query, name).map(|(found, _)| found)
    }

    /// `query` without its `name` parameters, and what they gave; `None` if there are none.
    fn split(query: &str, name: &str) -> Option<(QueryKey, String)> {
        let mut found = None;
        let mut rest = String::new();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if unescape(k.as_bytes()) != name.as_bytes() {
                if !pair.is_empty() {
                    rest.push_str(if rest.is_empty() { "" } else { "&" });
                    rest.push_str(pair);
                }
                continue;
            }
            found = Some(match found {
                None if v.is_empty() => QueryKey::Empty,
                None => QueryKey::Key(unescape(v.as_bytes()).into()),
                Some(_) => QueryKey::Twice,
            });
        }
        Some((found?, rest))
    }
}

/// `raw` percent-decoded, `+` a space (as a form sends one); an escape that is not two hex
/// digits is kept as it came (as browsers and WHATWG's URLSearchParams read it).
fn unescape(raw: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !raw.iter().any(|&b| b == b'%' || b == b'+') {
        return std::borrow::Cow::Borrowed(raw);
    }
    let plus: Vec<u8> = raw
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    std::borrow::Cow::Owned(percent_encoding::percent_decode(&plus).collect())
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
            ("query:", "is not a query parameter name"),
            ("query:a&b", "is not a query parameter name"),
            ("query:a, query:b", "two query sources"),
            ("jwt:", "is not a claim"),
            ("jwt:org..id", "is not a claim"),
            ("jwt:sub, bearer", "authorization is read by two sources"),
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
        fn shown(s: &Sources, values: &[Two<'_>], query: Option<&QueryKey>) -> String {
            let given = Given { query, token: None };
            match s.find(values, given) {
                Found::Key(k) => String::from_utf8_lossy(k).into_owned(),
                other => format!("{other:?}"),
            }
        }
        let (ba, bb, basic, bearer_alone) =
            (v("Bearer a"), v("Bearer c"), v("Basic x"), v("Bearer "));
        let (b, c, empty) = (v("b"), v("c"), v(""));
        let one = |auth: &Option<HeaderValue>, key: &Option<HeaderValue>| {
            shown(
                &s,
                &[Two(auth.as_ref(), None), Two(key.as_ref(), None)],
                None,
            )
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
        assert_eq!(shown(&s, &twice, None), "Twice");
        let twice = [Two(None, None), Two(b.as_ref(), c.as_ref())];
        assert_eq!(shown(&s, &twice, None), "Twice");

        // A query source between two field sources: the fields keep their places.
        let s = Sources::parse("bearer, query:api_key, header:X-Api-Key").unwrap();
        assert_eq!(
            s.names(),
            [AUTHORIZATION, HeaderName::from_static("x-api-key")]
        );
        assert_eq!(s.query(), Some("api_key"));
        let q = QueryKey::Key(b"q".as_slice().into());
        let fields = [Two(None, None), Two(b.as_ref(), None)];
        assert_eq!(shown(&s, &fields, Some(&q)), "q");
        assert_eq!(shown(&s, &fields, None), "b");
        assert_eq!(shown(&s, &fields, Some(&QueryKey::Empty)), "Empty");
        assert_eq!(shown(&s, &fields, Some(&QueryKey::Twice)), "Twice");
        let fields = [Two(ba.as_ref(), None), Two(b.as_ref(), None)];
        assert_eq!(shown(&s, &fields, Some(&q)), "a");
    }

    #[test]
    fn a_query_key_is_taken_out_of_the_target_and_decoded() {
        let taken = |target: &str| {
            let mut head = http::Request::get(target).body(()).unwrap().into_parts().0;
            let found = QueryKey::take(&mut head, "api_key");
            (found, head.uri.to_string())
        };
        let key = |k: &[u8]| Some(QueryKey::Key(k.into()));
        for (target, found, left) in [
            ("/a?api_key=k1", key(b"k1"), "/a"),
            ("/a?x=1&api_key=k1&y=2", key(b"k1"), "/a?x=1&y=2"),
            ("/a?api_key=k1&api_key=k1", Some(QueryKey::Twice), "/a"),
            ("/a?api_key", Some(QueryKey::Empty), "/a"),
            ("/a?api_key=&x", Some(QueryKey::Empty), "/a?x"),
            // Decoded as the upstream would read them: the name too.
            ("/a?api%5Fkey=k%2F1+2", key(b"k/1 2"), "/a"),
            ("/a?api_key=%FF%zz", key(b"\xff%zz"), "/a"),
            (
                "http://h.test/a?api_key=k&z",
                key(b"k"),
                "http://h.test/a?z",
            ),
            ("/a?api_keys=k&xapi_key=k", None, "/a?api_keys=k&xapi_key=k"),
            ("/a?&&x=1", None, "/a?&&x=1"),
            ("/a", None, "/a"),
        ] {
            assert_eq!(taken(target), (found, left.to_owned()), "{target}");
        }
        assert_eq!(
            QueryKey::in_query("method=GET&api_key=k", "api_key"),
            key(b"k")
        );
        // What the shortcut skips (no name, no escape), the split finds nothing in either.
        for query in ["x=1", "a=b&c", "api=1&key=2", "x=+"] {
            assert_eq!(taken(&format!("/a?{query}")).0, None);
            assert_eq!(QueryKey::in_query(query, "api_key"), None, "{query}");
        }
    }
}
