//! headers: the header rules of the proxy, as pure functions.
//!
//! - Hop-by-hop fields (RFC 9110 §7.6.1) are removed in both directions: the fixed list plus every
//!   name listed in `Connection`.
//! - The upstream gets `X-Forwarded-For` (the client address appended to any list it sent),
//!   `X-Forwarded-Proto` and `X-Forwarded-Host`; the latter two are replaced, never trusted from
//!   the client.
//! - Rate-limit fields: the current IETF draft (`RateLimit-Policy`, `RateLimit`) and/or the
//!   DynLimits-compatible trio (`RateLimit-Limit`, `-Remaining`, `-Reset`), plus `Retry-After` on
//!   rejections. They replace any fields of the same names from the upstream.
//! - A request's fields that the gateway never reads ([`HANDED_ON`]: a client's usual
//!   `User-Agent`, `Accept`, `Cookie`, ...) go upstream as the own HTTP/1.1 server read them,
//!   as lines, not through the request's map; the names the gateway reads, configured or not,
//!   never do.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::fields::Fields;
use crate::config::HeaderSet;
use crate::server::http1::Kind;
#[cfg(test)]
use quotagate_engine::limiter::Quota;
use quotagate_engine::limiter::{Limit, Rate, WINDOW_SECONDS};

/// The forwarding fields the proxy sets ([`Forwarded::set`]).
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// Request fields the gateway hands on unread ([`handed_on`]): those an API client or a browser
/// usually sends besides its key. A field of one of these names is not in the request's map on
/// its way through the own HTTP/1.1 server: nothing on the request path may read one of them
/// (what it reads: `Host`, the framing, `Content-Type` for gRPC, `traceparent`, the
/// `X-Forwarded-*` it replaces, and the configured API key, cost and refresh header names,
/// which [`handed_on`] takes out of these).
pub const HANDED_ON: [HeaderName; 26] = [
    header::USER_AGENT,
    header::ACCEPT,
    header::ACCEPT_ENCODING,
    header::ACCEPT_LANGUAGE,
    header::ACCEPT_CHARSET,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::REFERER,
    header::ORIGIN,
    header::COOKIE,
    header::AUTHORIZATION,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::RANGE,
    header::DNT,
    HeaderName::from_static("x-request-id"),
    HeaderName::from_static("x-correlation-id"),
    HeaderName::from_static("x-requested-with"),
    HeaderName::from_static("sec-fetch-site"),
    HeaderName::from_static("sec-fetch-mode"),
    HeaderName::from_static("sec-fetch-dest"),
    HeaderName::from_static("sec-ch-ua"),
    HeaderName::from_static("priority"),
];

/// The fields the proxy hands on unread: [`HANDED_ON`] but those it reads by configuration (the
/// API key's, the cost's, the forced refresh's: any name may be configured).
pub fn handed_on<'a>(
    read: impl IntoIterator<Item = &'a HeaderName>,
) -> crate::server::passed::Passes {
    crate::server::passed::Passes::new(&HANDED_ON, read)
}

/// `X-Forwarded-Proto`'s value: the gateway's listener speaks cleartext HTTP.
const HTTP: HeaderValue = HeaderValue::from_static("http");
/// A field the gateway writes on answers: its name for a map (a static, lent to [`Fields`]: a
/// const made a name at each use and dropped it through its `Bytes`' vtable, five times an
/// answer) and its line's start for the lines (`name: `, a const, so that it is copied as the
/// constant it is: a name's bytes read from the static were a `memcpy` call a field), both from
/// one literal.
macro_rules! written_field {
    ($name:ident, $line:ident, $literal:literal) => {
        pub static $name: HeaderName = HeaderName::from_static($literal);
        const $line: &str = concat!($literal, ": ");
    };
}
written_field!(RATELIMIT_POLICY, RATELIMIT_POLICY_LINE, "ratelimit-policy");
written_field!(RATELIMIT, RATELIMIT_LINE, "ratelimit");
written_field!(RATELIMIT_LIMIT, RATELIMIT_LIMIT_LINE, "ratelimit-limit");
written_field!(
    RATELIMIT_REMAINING,
    RATELIMIT_REMAINING_LINE,
    "ratelimit-remaining"
);
written_field!(RATELIMIT_RESET, RATELIMIT_RESET_LINE, "ratelimit-reset");
/// `Retry-After`'s line start (its name is `http`'s).
const RETRY_AFTER_LINE: &str = "retry-after: ";

/// The first value of `name` in `map`: a request's few fields (up to eight values) compared by
/// name, where the map would hash the name first (25-110 instructions for the names every request
/// is looked up by, a custom one's bytes each hashed; callgrind, docs/benchmarks/); a larger
/// map looked up as usual.
pub fn find<'m>(map: &'m HeaderMap, name: &HeaderName) -> Option<&'m HeaderValue> {
    const SCANNED: usize = 8;
    match map.len() <= SCANNED {
        true => map.iter().find_map(|(n, v)| (n == name).then_some(v)),
        false => map.get(name),
    }
}

/// Removes hop-by-hop fields, including those named in `Connection`, except `keep`: a client must
/// not be able to hide from the upstream a field the gateway decided on (the API key it was counted
/// against) by calling it hop-by-hop. `Transfer-Encoding` is left to hyper, which frames bodies
/// itself on each side.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep: &[HeaderName]) {
    // Most messages carry none of these: one pass over the few names present is far cheaper than
    // nine hashed removals.
    if !headers.keys().any(Kind::is_hop_by_hop) {
        return;
    }
    // Only the names present are removed (a removal hashes its name): usually one, `Connection`.
    // `Connection` looked up once (per name, it was most of a new connection's cost here).
    let connection = headers.get_all(header::CONNECTION);
    let listed =
        |k: &HeaderName| !keep.contains(k) && connection.iter().any(|v| listed_in(v.as_bytes(), k));
    // Gathered first (a map is not changed while it is walked), the usual few without an
    // allocation: a client that sends `Connection: keep-alive` does on every request.
    let mut few: [Option<HeaderName>; 4] = Default::default();
    let mut more = Vec::new();
    let doomed = headers
        .keys()
        .filter(|k| Kind::is_hop_by_hop(k) || listed(k));
    for (i, name) in doomed.cloned().enumerate() {
        match few.get_mut(i) {
            Some(slot) => *slot = Some(name),
            None => more.push(name),
        }
    }
    for name in few.iter().flatten().chain(&more) {
        headers.remove(name);
    }
}

/// `connection`, a `Connection` field's value, lists `name` (which is then hop-by-hop too). A
/// value that is not visible ASCII lists nothing.
pub fn listed_in(connection: &[u8], name: &HeaderName) -> bool {
    connection
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        && connection.split(|&b| b == b',').any(|n| {
            n.trim_ascii()
                .eq_ignore_ascii_case(name.as_str().as_bytes())
        })
}

/// Copies `head`'s target and header values into one allocation of their own. As parsed, they
/// are slices of the buffer they were read into (hyper's HTTP/1 read buffer, 8 KiB; h2's frames),
/// which keeps that buffer whole for as long as the request lives, and hyper reads the next bytes
/// of an HTTP/1 connection into a new one meanwhile: for a request that waits for room, 8 KiB
/// more held per waiting request (docs/benchmarks/). Names need nothing: hyper and h2 copy
/// those they do not know.
pub fn own_head(head: &mut http::request::Parts) {
    let target = head.uri.to_string();
    let values: usize = head.headers.values().map(|v| v.len()).sum();
    let mut all = bytes::BytesMut::with_capacity(target.len() + values);
    all.extend_from_slice(target.as_bytes());
    for v in head.headers.values() {
        all.extend_from_slice(v.as_bytes());
    }
    let all = all.freeze();
    // Each was valid as it was, so each is valid again; one that was not would stay as it was.
    if let Ok(uri) = http::Uri::from_maybe_shared(all.slice(..target.len())) {
        head.uri = uri;
    }
    let mut at = target.len();
    for v in head.headers.values_mut() {
        let own = all.slice(at..at + v.len());
        at += v.len();
        if let Ok(mut own) = HeaderValue::from_maybe_shared(own) {
            own.set_sensitive(v.is_sensitive());
            *v = own;
        }
    }
}

thread_local! {
    /// The last client address written, and its text: clients of one worker are mostly the same
    /// few addresses (a load balancer, keep-alive connections), and formatting an address with
    /// `Display` costs more than the rest of these rules together.
    static LAST_CLIENT: std::cell::RefCell<Option<(IpAddr, HeaderValue)>> =
        const { std::cell::RefCell::new(None) };
}

fn client_value(client: IpAddr) -> HeaderValue {
    LAST_CLIENT.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((ip, v)) = &*last
            && *ip == client
        {
            return v.clone();
        }
        let v = HeaderValue::try_from(client.to_string()).expect("an address is a valid value");
        *last = Some((client, v.clone()));
        v
    })
}

/// The `X-Forwarded-*` fields of a request from a client that was sent to a host (the client's
/// `Host` value itself, or its HTTP/2 authority: no copy of it is made). They replace what the
/// client sent, but for `X-Forwarded-For`, whose list the client's address ends. Set in a
/// request's header map ([`Forwarded::set`]), or written after its other fields by the
/// gateway's own exchange ([`Forwarded::each`], skipping those that [`Forwarded::replaces`]),
/// which spares the map three insertions and often its growth.
#[derive(Debug, Clone)]
pub struct Forwarded {
    ip: HeaderValue,
    host: Option<HeaderValue>,
}

impl Forwarded {
    pub fn new(client: IpAddr, host: Option<HeaderValue>) -> Forwarded {
        Forwarded {
            ip: client_value(client),
            host,
        }
    }

    /// The client's field `name` is one of these (replaced, or folded into the new
    /// `X-Forwarded-For`).
    pub fn replaces(name: &HeaderName) -> bool {
        // A length first: most names are none of the three.
        matches!(name.as_str().len(), 15..=17)
            && (*name == X_FORWARDED_FOR || *name == X_FORWARDED_PROTO || *name == X_FORWARDED_HOST)
    }

    /// Gives the fields to `line` as they go upstream after the client's `headers`, less those
    /// that [`Forwarded::replaces`]; `replaced`: the client sent such a field (otherwise its
    /// headers are not looked at again).
    pub fn each(
        &self,
        headers: &HeaderMap,
        replaced: bool,
        mut line: impl FnMut(&HeaderName, &HeaderValue),
    ) {
        let prior = replaced
            .then(|| headers.get_all(X_FORWARDED_FOR))
            .filter(|p| p.iter().next().is_some());
        match prior {
            None => line(&X_FORWARDED_FOR, &self.ip),
            Some(prior) => {
                if let Some(v) = self.forwarded_for(prior.iter()) {
                    line(&X_FORWARDED_FOR, &v);
                }
            }
        }
        line(&X_FORWARDED_PROTO, &HTTP);
        if let Some(host) = &self.host {
            line(&X_FORWARDED_HOST, host);
        }
    }

    /// `X-Forwarded-For` after the client's own field lines `prior`: their list (values that are
    /// not visible ASCII dropped), then the client's address.
    fn forwarded_for<'a>(
        &self,
        prior: impl Iterator<Item = &'a HeaderValue>,
    ) -> Option<HeaderValue> {
        let prior: Vec<&str> = prior.filter_map(|v| v.to_str().ok()).collect();
        let mut list = prior.join(", ");
        if !list.is_empty() {
            list.push_str(", ");
        }
        list.push_str(self.ip.to_str().unwrap_or_default());
        HeaderValue::try_from(list).ok()
    }

    /// Sets the fields in `headers`, replacing the client's: what [`Forwarded::each`] gives,
    /// and none of a field it does not give.
    pub fn set(self, headers: &mut HeaderMap) {
        let mut new: [Option<HeaderValue>; 3] = [None, None, None];
        let names = [X_FORWARDED_FOR, X_FORWARDED_PROTO, X_FORWARDED_HOST];
        self.each(headers, true, |name, value| {
            if let Some(i) = names.iter().position(|n| n == name) {
                new[i] = Some(value.clone());
            }
        });
        for (name, value) in names.into_iter().zip(new) {
            match value {
                Some(v) => headers.insert(name, v),
                None => headers.remove(&name),
            };
        }
    }
}

/// Appends `s` as a Structured Fields string (RFC 9651 §3.3.3): quoted, with `"` and `\` escaped.
/// Endpoint names are printable ASCII (the catalog checks templates), so nothing else needs care.
fn push_sf_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    if quotagate_engine::ascii::has_either(s.as_bytes(), b'"', b'\\') {
        for b in s.bytes() {
            if b == b'"' || b == b'\\' {
                out.push(b'\\');
            }
            out.push(b);
        }
    } else {
        out.extend_from_slice(s.as_bytes());
    }
    out.push(b'"');
}

#[cfg(test)]
fn sf_string(s: &str) -> String {
    let mut out = Vec::new();
    push_sf_string(&mut out, s);
    String::from_utf8(out).unwrap()
}

/// Appends `"<name>";<a>=<x>;<b>=<y>` to `v`, without `fmt` (this runs on every counted request).
/// The policy of a window other than 60 s is named `<name> <w>s`, a calendar quota's `<name>
/// <period>` (`"GET /a day"`), so every policy of an endpoint has a distinct name and the
/// per-minute one keeps the endpoint's name.
fn push_sf_item(v: &mut Vec<u8>, name: &str, l: &Limit, a: u8, x: &str, b: u8, y: &str) {
    push_sf_string(v, name);
    if let Some(p) = l.period() {
        v.pop(); // the closing quote
        v.push(b' ');
        v.extend_from_slice(p.as_str().as_bytes());
        v.push(b'"');
    } else if u64::from(l.w) != WINDOW_SECONDS {
        v.pop();
        v.push(b' ');
        v.extend_from_slice(itoa::Buffer::new().format(l.w).as_bytes());
        v.extend_from_slice(b"s\"");
    }
    v.extend_from_slice(&[b';', a, b'=']);
    v.extend_from_slice(x.as_bytes());
    v.extend_from_slice(&[b';', b, b'=']);
    v.extend_from_slice(y.as_bytes());
}

/// Writes the rate-limit fields of one answer: every enforced policy in `RateLimit-Policy` and
/// `RateLimit`, the most restrictive in the legacy trio, and `Retry-After` on a refusal that
/// waiting can cure (an upstream's is the forwarding's to keep or remove:
/// [`keeps_upstream_retry_after`]). Shadow limits add nothing.
pub fn set_rate_limit(headers: &mut impl Fields, set: HeaderSet, rate: &Rate) {
    let quotas = rate.outcome.quotas();
    // A concurrency limit is not a rate: no window to tell (the 429's problem names it).
    let told = |l: &Limit| !l.shadow && !l.is_concurrent();
    let legacy = match set {
        HeaderSet::Both | HeaderSet::Legacy => rate.outcome.most_restrictive(&rate.limits),
        HeaderSet::Ietf | HeaderSet::None => None,
    };
    // The legacy trio's numbers, written once: the lists repeat them for the same limit (three
    // of the seven numbers an answer with one limit tells, ~140 instructions; callgrind).
    let mut buffers = [itoa::Buffer::new(); 3];
    let [limit, remaining, reset] = &mut buffers;
    let trio = legacy.map(|i| {
        let d = &quotas[i];
        (
            i,
            limit.format(d.limit),
            remaining.format(d.remaining),
            reset.format(d.reset),
        )
    });
    if matches!(set, HeaderSet::Both | HeaderSet::Ietf) && rate.limits.iter().any(told) {
        // Each list written where it goes (the own server's lines): no string of its own.
        let list = |v: &mut Vec<u8>, state: bool| {
            let mut first = true;
            for (i, (l, q)) in rate.limits.iter().zip(quotas).enumerate() {
                if !told(l) {
                    continue;
                }
                if !std::mem::take(&mut first) {
                    v.extend_from_slice(b", ");
                }
                // A pool's policies are named after its group.
                let name = rate.limits.pool_of(i).unwrap_or(rate.name);
                let (mut x, mut y) = (itoa::Buffer::new(), itoa::Buffer::new());
                // The trio's limit: its digits are written already.
                let trios = trio.filter(|t| t.0 == i);
                match state {
                    false => {
                        let q = trios.map_or_else(|| x.format(q.limit), |t| t.1);
                        let w = y.format(l.seconds_at(rate.at_ms));
                        push_sf_item(v, name, l, b'q', q, b'w', w)
                    }
                    true => {
                        let r = trios.map_or_else(|| x.format(q.remaining), |t| t.2);
                        let t = trios.map_or_else(|| y.format(q.reset), |t| t.3);
                        push_sf_item(v, name, l, b'r', r, b't', t)
                    }
                }
            }
        };
        headers.set_with(&RATELIMIT_POLICY, RATELIMIT_POLICY_LINE, |v| list(v, false));
        headers.set_with(&RATELIMIT, RATELIMIT_LINE, |v| list(v, true));
    }
    if let Some((_, limit, remaining, reset)) = trio {
        headers.set_digits(&RATELIMIT_LIMIT, RATELIMIT_LIMIT_LINE, limit);
        headers.set_digits(&RATELIMIT_REMAINING, RATELIMIT_REMAINING_LINE, remaining);
        headers.set_digits(&RATELIMIT_RESET, RATELIMIT_RESET_LINE, reset);
    }
    if let Some(s) = rate.outcome.retry_after(&rate.limits) {
        headers.set_number(&header::RETRY_AFTER, RETRY_AFTER_LINE, s);
    }
}

/// Whether the upstream's own `Retry-After` stays on a forwarded answer of `status`: where it
/// tells of the upstream itself (a 503's unavailability, a 429 of its own, a redirect's delay:
/// RFC 9110 §10.2.3, RFC 6585 §4), so a client does not ask again at once. Elsewhere it is
/// removed: beside quotagate's rate-limit fields it would read as quotagate's.
pub fn keeps_upstream_retry_after(status: http::StatusCode) -> bool {
    status.is_redirection()
        || status == http::StatusCode::TOO_MANY_REQUESTS
        || status == http::StatusCode::SERVICE_UNAVAILABLE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::fields::Lines;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn find_gives_a_fields_first_value_in_small_and_large_maps() {
        for extra in [0, 3, 20] {
            let mut h = map(&[("host", "a.test"), ("x-api-key", "k1"), ("x-api-key", "k2")]);
            for i in 0..extra {
                h.append(
                    HeaderName::from_bytes(format!("x-pad-{i}").as_bytes()).unwrap(),
                    HeaderValue::from_static("p"),
                );
            }
            let key = HeaderName::from_static("x-api-key");
            assert_eq!(find(&h, &key), h.get(&key), "{extra} more");
            assert_eq!(find(&h, &key).unwrap(), "k1");
            assert_eq!(find(&h, &header::HOST).unwrap(), "a.test");
            assert_eq!(find(&h, &header::CONTENT_TYPE), None);
            assert_eq!(find(&h, &HeaderName::from_static("x-api-kez")), None);
        }
    }

    #[test]
    fn an_owned_head_holds_nothing_of_the_buffer_it_was_parsed_in() {
        let read = bytes::Bytes::from(b"/users/42?x=1 example.test key-1 secret".to_vec());
        let slice = |r: std::ops::Range<usize>| HeaderValue::from_maybe_shared(read.slice(r));
        let mut head = http::Request::new(()).into_parts().0;
        head.uri = http::Uri::from_maybe_shared(read.slice(0..13)).unwrap();
        head.headers.insert(header::HOST, slice(14..26).unwrap());
        head.headers.append("x-api-key", slice(27..32).unwrap());
        head.headers.append("x-api-key", slice(27..32).unwrap());
        let mut secret = slice(33..39).unwrap();
        secret.set_sensitive(true);
        head.headers.insert(header::AUTHORIZATION, secret);
        let (uri, headers) = (head.uri.to_string(), format!("{:?}", head.headers));
        assert!(!read.is_unique());
        own_head(&mut head);
        // The same head, and only `read` itself is left on the buffer.
        assert_eq!(
            (head.uri.to_string(), format!("{:?}", head.headers)),
            (uri, headers)
        );
        assert!(head.headers[header::AUTHORIZATION].is_sensitive());
        assert_eq!(head.headers.get_all("x-api-key").iter().count(), 2);
        assert!(read.is_unique());
    }

    #[test]
    fn hop_by_hop_and_connection_listed_fields_are_removed() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("x-other", "1"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("transfer-encoding", "chunked"),
            ("x-api-key", "k"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h, &[]);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-api-key"]);
    }

    #[test]
    fn connection_cannot_remove_the_api_key() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Api-Key, x-other"),
            ("x-api-key", "k"),
            ("x-other", "1"),
        ]);
        strip_hop_by_hop(&mut h, &[HeaderName::from_static("x-api-key")]);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-api-key"]);
    }

    #[test]
    fn forwarded_fields_append_the_client_and_replace_the_rest() {
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-proto", "https"),
        ]);
        Forwarded::new(
            "10.0.0.9".parse().unwrap(),
            Some(HeaderValue::from_static("api.example:8080")),
        )
        .set(&mut h);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.9");
        assert_eq!(h["x-forwarded-host"], "api.example:8080");
        assert_eq!(h["x-forwarded-proto"], "http");
        let mut h = HeaderMap::new();
        Forwarded::new("::1".parse().unwrap(), None).set(&mut h);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn forwarded_fields_are_the_same_set_in_a_map_or_written_after_it() {
        let cases: [&[(&str, &str)]; 6] = [
            &[],
            &[("accept", "*/*")],
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "2.2.2.2"),
            ],
            &[
                ("x-forwarded-host", "evil"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-port", "1"),
            ],
            &[("x-forwarded-for", "")],
            &[("x-forwarded-for", "é"), ("x-forwarded-for", "3.3.3.3")],
        ];
        for case in cases {
            for host in [None, Some(HeaderValue::from_static("api.example"))] {
                let client = map(case);
                let fwd = Forwarded::new("10.0.0.9".parse().unwrap(), host);
                let mut set = client.clone();
                fwd.clone().set(&mut set);
                // What the own exchange writes: the client's fields but those replaced, then these.
                let mut written: Vec<(HeaderName, HeaderValue)> = client
                    .iter()
                    .filter(|(n, _)| !Forwarded::replaces(n))
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect();
                let replaced = client.keys().any(Forwarded::replaces);
                fwd.each(&client, replaced, |n, v| {
                    written.push((n.clone(), v.clone()))
                });
                let mut from_map: Vec<_> =
                    set.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
                let key =
                    |(n, v): &(HeaderName, HeaderValue)| (n.to_string(), v.as_bytes().to_vec());
                from_map.sort_by_key(key);
                written.sort_by_key(key);
                assert_eq!(from_map, written, "{case:?}");
            }
        }
        for name in ["x-forwarded-for", "X-Forwarded-Proto", "x-forwarded-host"] {
            assert!(Forwarded::replaces(
                &HeaderName::from_bytes(name.as_bytes()).unwrap()
            ));
        }
        for name in ["x-forwarded-port", "x-forwarded-fox", "accept", "x-real-ip"] {
            assert!(!Forwarded::replaces(&HeaderName::from_static(name)));
        }
    }

    fn one(name: &'static str, q: &Quota) -> Rate<'static> {
        let limits = [quotagate_engine::limiter::Limit::per_minute(q.limit)];
        Rate {
            name,
            limits: quotagate_engine::limiter::Limits::new(Box::leak(Box::new(limits)), false),
            outcome: quotagate_engine::limiter::Outcome::new(q.allowed, false, &[*q]),
            cost: 1,
            at_ms: 0,
        }
    }

    #[test]
    fn a_calendar_quota_is_named_by_its_period_and_tells_its_length_and_end() {
        use quotagate_engine::limiter::{Limit, Limits, Outcome, Period, ZoneId};
        let all = [
            Limit::sliding(10, 1),
            Limit::calendar(
                1000,
                Period::Day,
                ZoneId::of("America/Los_Angeles").unwrap(),
            ),
        ];
        let q = |limit, remaining, reset, retry_after: Option<u64>| Quota {
            allowed: retry_after.is_none(),
            limit,
            remaining,
            reset,
            retry_after,
        };
        // 2024-03-10T12:00:00-07:00: a day of 23 hours in Los Angeles, 12 hours left.
        let rate = Rate {
            name: "GET /a",
            limits: Limits::new(&all, false),
            outcome: Outcome::new(
                false,
                false,
                &[q(10, 9, 1, None), q(1000, 0, 43_200, Some(43_200))],
            ),
            cost: 1,
            at_ms: 1_710_097_200_000,
        };
        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::Both, &rate);
        assert_eq!(
            h["ratelimit-policy"],
            r#""GET /a 1s";q=10;w=1, "GET /a day";q=1000;w=82800"#
        );
        assert_eq!(
            h["ratelimit"],
            r#""GET /a 1s";r=9;t=1, "GET /a day";r=0;t=43200"#
        );
        assert_eq!(h["retry-after"], "43200");
        assert_eq!(h["ratelimit-reset"], "43200");
    }

    #[test]
    fn several_policies_are_all_reported_and_the_trio_tells_the_tightest() {
        use quotagate_engine::limiter::{Limit, Limits, Outcome};
        let l = |rl, w, shadow| Limit::sliding(rl, w).shadowed(shadow);
        let q = |allowed, limit, remaining, reset, retry_after| Quota {
            allowed,
            limit,
            remaining,
            reset,
            retry_after,
        };
        let all = [l(10, 1, false), l(100, 60, false), l(5, 3600, true)];
        let limits = Limits::new(&all, false);
        let ok = Outcome::new(
            true,
            false,
            &[
                q(true, 10, 9, 1, None),
                q(true, 100, 40, 30, None),
                q(true, 5, 1, 900, None),
            ],
        );
        let rate = Rate {
            name: "GET /a",
            limits,
            outcome: ok,
            cost: 1,
            at_ms: 0,
        };
        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::Both, &rate);
        assert_eq!(
            h["ratelimit-policy"], r#""GET /a 1s";q=10;w=1, "GET /a";q=100;w=60"#,
            "shadow limits are not listed"
        );
        assert_eq!(h["ratelimit"], r#""GET /a 1s";r=9;t=1, "GET /a";r=40;t=30"#);
        assert_eq!(h["ratelimit-remaining"], "9");
        let no = Outcome::new(
            false,
            false,
            &[
                q(false, 10, 0, 1, Some(1)),
                q(false, 100, 0, 30, Some(30)),
                q(true, 5, 1, 900, None),
            ],
        );
        let mut h = HeaderMap::new();
        set_rate_limit(
            &mut h,
            HeaderSet::Both,
            &Rate {
                outcome: no,
                ..rate
            },
        );
        assert_eq!(h["retry-after"], "30", "until every limit allows it");
        assert_eq!(h["ratelimit-limit"], "100");
        let one = [l(10, 1, false)];
        let dry = Limits::new(&one, true);
        let mut h = HeaderMap::new();
        set_rate_limit(
            &mut h,
            HeaderSet::Both,
            &Rate {
                limits: dry,
                outcome: Outcome::new(true, true, &[q(false, 10, 0, 1, Some(1))]),
                ..rate
            },
        );
        assert!(h.is_empty(), "a dry run adds no field: {h:?}");
    }

    /// A refusal of a limit of 20 whose window has room in 13 s.
    const REFUSED: Quota = Quota {
        allowed: false,
        limit: 20,
        remaining: 0,
        reset: 13,
        retry_after: Some(13),
    };

    #[test]
    fn rate_limit_fields_on_allowed_and_rejected() {
        let ok = Quota {
            allowed: true,
            limit: 20,
            remaining: 7,
            reset: 42,
            retry_after: None,
        };
        let mut h = map(&[("ratelimit-limit", "999")]);
        set_rate_limit(&mut h, HeaderSet::Both, &one("GET /users/{id}", &ok));
        assert_eq!(h["ratelimit-policy"], r#""GET /users/{id}";q=20;w=60"#);
        assert_eq!(h["ratelimit"], r#""GET /users/{id}";r=7;t=42"#);
        assert_eq!(
            (
                &h["ratelimit-limit"],
                &h["ratelimit-remaining"],
                &h["ratelimit-reset"]
            ),
            (
                &HeaderValue::from(20),
                &HeaderValue::from(7),
                &HeaderValue::from(42)
            )
        );
        assert!(
            !h.contains_key("retry-after"),
            "none on an allowed decision"
        );

        let no = REFUSED;
        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::Ietf, &one("GET /a", &no));
        assert_eq!(h["ratelimit"], r#""GET /a";r=0;t=13"#);
        assert_eq!(h["retry-after"], "13");
        assert!(!h.contains_key("ratelimit-limit"));

        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::Legacy, &one("GET /a", &no));
        assert!(!h.contains_key("ratelimit-policy"));
        assert_eq!(h["ratelimit-remaining"], "0");

        let mut h = HeaderMap::new();
        set_rate_limit(&mut h, HeaderSet::None, &one("GET /a", &no));
        assert_eq!(h.len(), 1, "only Retry-After");
    }

    /// Written as lines for the own server, the fields are the map's, and the answer's map
    /// loses the names written (an upstream's own `RateLimit-*` and `Retry-After`), keeping the
    /// rest.
    #[test]
    fn rate_limit_fields_written_as_lines_are_the_maps() {
        let no = REFUSED;
        let theirs: [&[(&str, &str)]; 3] = [
            &[
                ("ratelimit-limit", "999"),
                ("retry-after", "5"),
                ("x-a", "1"),
            ],
            &[("x-a", "1"), ("RateLimit-Policy", "theirs")],
            &[("x-a", "1")],
        ];
        let sets = [
            HeaderSet::Both,
            HeaderSet::Ietf,
            HeaderSet::Legacy,
            HeaderSet::None,
        ];
        for (set, upstream) in sets.into_iter().flat_map(|s| theirs.map(|t| (s, t))) {
            let mut as_map = map(upstream);
            set_rate_limit(&mut as_map, set, &one("GET /a", &no));
            let mut own = map(upstream);
            let mut written = crate::server::Written::default();
            set_rate_limit(
                &mut Lines::new(&mut own, &mut written),
                set,
                &one("GET /a", &no),
            );
            assert!(!own.contains_key("retry-after"), "{set:?}: {own:?}");
            assert_eq!(own["x-a"], "1");
            if set == HeaderSet::Both {
                assert!(!own.contains_key("ratelimit-policy"), "{own:?}");
            }
            written.set_in(&mut own);
            assert_eq!(own, as_map, "{set:?}");
        }
    }

    #[test]
    fn the_upstreams_retry_after_stays_where_it_speaks_of_the_upstream() {
        for (status, kept) in [(200, false), (204, false), (301, true), (307, true)] {
            let s = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(keeps_upstream_retry_after(s), kept, "{status}");
        }
        for (status, kept) in [(404, false), (429, true), (500, false), (503, true)] {
            let s = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(keeps_upstream_retry_after(s), kept, "{status}");
        }
    }

    #[test]
    fn each_written_line_starts_with_its_fields_name() {
        for (name, line) in [
            (&RATELIMIT_POLICY, RATELIMIT_POLICY_LINE),
            (&RATELIMIT, RATELIMIT_LINE),
            (&RATELIMIT_LIMIT, RATELIMIT_LIMIT_LINE),
            (&RATELIMIT_REMAINING, RATELIMIT_REMAINING_LINE),
            (&RATELIMIT_RESET, RATELIMIT_RESET_LINE),
            (&header::RETRY_AFTER, RETRY_AFTER_LINE),
        ] {
            assert_eq!(line, format!("{}: ", name.as_str()));
        }
    }

    #[test]
    fn policy_names_are_escaped() {
        assert_eq!(sf_string(r#"GET /a"b\c"#), r#""GET /a\"b\\c""#);
    }
}
