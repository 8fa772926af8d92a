//! keys: every counter key name, built in one place.
//!
//! A counter is one (owner, endpoint) pair. Its name is `{<owner>}:<endpoint>`, each part escaped
//! so that no two pairs can share a name whatever bytes an owner holds: bytes outside
//! `A-Z a-z 0-9 - . _ ~ /` become `%XX`, so `%`, `:`, `{` and `}` never appear unescaped. The braces
//! are the Redis Cluster hash tag: all counters of one owner live in one slot, and the hashes of
//! adjacent minutes (which one script call touches together) always share a slot. An API key's
//! counters are owned by its key identifier (`quotagate_engine::catalog::KeyId`: 32 hex digits of
//! the digest its catalog knows it by), never by the key; the application names them so.
//!
//! Redis hash of one counter for one minute: `<prefix>:w:{<owner>}:<endpoint>:<unix minute>`;
//! of one counter's window of `w` seconds (any other length): `<prefix>:w:{<owner>}:<endpoint>:s<w>`;
//! of one counter's calendar period: `<prefix>:w:{<owner>}:<endpoint>:<period>:<start, Unix s>`.

use quotagate_engine::catalog::KeyId;
use quotagate_engine::limiter::{Kind, Limit, Period, Span};

/// Redis key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "quotagate";

/// The name of one (API key, endpoint) counter. Used as-is by the memory store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey(String);

fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    // A table, and bytes rather than `char`s: this runs for every counted request.
    const KEPT: [bool; 256] = {
        let mut kept = [false; 256];
        let mut b = 0;
        while b < 256 {
            let c = b as u8;
            kept[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'/');
            b += 1;
        }
        kept
    };
    // Runs of kept bytes copied at once: most names are a few runs (an endpoint's name escapes
    // its space and braces, most API keys nothing).
    let mut rest = bytes;
    while let Some(at) = rest.iter().position(|&b| !KEPT[usize::from(b)]) {
        let b = rest[at];
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
}

/// Appends `name` (an endpoint's or a group's) escaped, from a memo of the last names this thread
/// escaped: a request names its endpoint's counter, and escaping the endpoint's name (`GET
/// /users/{id}`: its space and braces) each time cost ~300 instructions a request (callgrind,
/// docs/benchmarks/). Eight entries a thread, each chosen by the name's length and last byte
/// and used only for the very same name: a name seen before in another catalog is still spelled
/// the same, and a miss only costs the escape it saves otherwise. Names are the catalog's, so
/// the memo's size is bounded by its longest (a thread keeps at most eight).
fn push_escaped_name(name: &str, out: &mut Vec<u8>) {
    const WAYS: usize = 8;
    thread_local! {
        static MEMO: std::cell::RefCell<[(String, Vec<u8>); WAYS]> =
            const { std::cell::RefCell::new([const { (String::new(), Vec::new()) }; WAYS]) };
    }
    let last = name.as_bytes().last().copied().unwrap_or(0);
    let way = (name.len() ^ usize::from(last)) % WAYS;
    MEMO.with_borrow_mut(|memo| {
        let (known, escaped) = &mut memo[way];
        if known != name {
            known.clear();
            known.push_str(name);
            escaped.clear();
            escape(name.as_bytes(), escaped);
        }
        out.extend_from_slice(escaped);
    });
}

/// A name built of escaped parts and ASCII separators: ASCII throughout, so the check never fails
/// (and if it did, no two names would be made one).
fn ascii(name: Vec<u8>) -> String {
    String::from_utf8(name).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl CounterKey {
    /// `endpoint` is the endpoint's name (`METHOD /template`), stable across catalog versions, so a
    /// counter carries on when a new catalog keeps the endpoint.
    pub fn new(api_key: &[u8], endpoint: &str) -> Self {
        CounterKey::of_key(api_key, "}:", endpoint)
    }

    /// `{<api key>}<sep><name>`, both parts escaped.
    fn of_key(api_key: &[u8], sep: &str, name: &str) -> Self {
        // Room for the braces and a few escapes (an endpoint name's space and braces) at once.
        let mut s = Vec::with_capacity(api_key.len() + name.len() + 24);
        s.push(b'{');
        escape(api_key, &mut s);
        s.extend_from_slice(sep.as_bytes());
        push_escaped_name(name, &mut s);
        CounterKey(ascii(s))
    }

    /// The counter of the API key whose counters `id` names on `endpoint`: [`CounterKey::new`]
    /// of the id's 32 hex digits, which need no escape (so none is run: every counted request
    /// names one).
    pub fn of_id(id: &KeyId, endpoint: &str) -> Self {
        CounterKey::of_hex(&id.hex(), "}:", endpoint)
    }

    /// [`CounterKey::pool`] of the API key whose counters `id` names.
    pub fn pool_of_id(id: &KeyId, group: &str) -> Self {
        CounterKey::of_hex(&id.hex(), "}:@", group)
    }

    fn of_hex(hex: &[u8; 32], sep: &str, name: &str) -> Self {
        let mut s = Vec::with_capacity(hex.len() + name.len() + 24);
        s.push(b'{');
        s.extend_from_slice(hex);
        s.extend_from_slice(sep.as_bytes());
        push_escaped_name(name, &mut s);
        CounterKey(ascii(s))
    }

    /// A counter's name as a store kept it ([`CounterKey::as_str`] read back).
    pub fn from_stored(name: String) -> Self {
        CounterKey(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The counter of `api_key`'s pool `group` (limits shared by several endpoints):
    /// `{<api key>}:@<group>`. An `@` is always escaped in an endpoint's name, so no endpoint
    /// can share it, and it is in the API key's slot.
    pub fn pool(api_key: &[u8], group: &str) -> Self {
        CounterKey::of_key(api_key, "}:@", group)
    }

    /// A pool's counter ([`CounterKey::pool`])?
    pub fn is_pool(&self) -> bool {
        self.0.starts_with('{') && self.0.contains("}:@")
    }

    /// The hash tag (`{<api key>}` and the like): what a Redis Cluster slot and a memory shard
    /// are chosen by, so that every counter of one API key is in one. The whole name when it has
    /// none.
    pub fn tag(&self) -> &str {
        // Bytes, not `str::find`: this runs for every request, and a char search costs several
        // times more on a name of 30 bytes.
        match self.0.bytes().position(|b| b == b'}') {
            Some(end) if self.0.starts_with('{') => &self.0[..=end],
            _ => &self.0,
        }
    }

    /// The counter of requests without an API key from the client address group `client` on
    /// `endpoint`: `{!<address>/<prefix>}:<endpoint>`. A `!` is always escaped in an API key's
    /// name, so no key can share it.
    pub fn anonymous(client: &ipnet::IpNet, endpoint: &str) -> Self {
        let mut s = Vec::with_capacity(endpoint.len() + 48);
        s.extend_from_slice(b"{!");
        s.extend_from_slice(client.to_string().as_bytes());
        s.extend_from_slice(b"}:");
        push_escaped_name(endpoint, &mut s);
        CounterKey(ascii(s))
    }

    /// The counter of an Envoy rate-limit descriptor: `{#<domain>:<entries>}:rls`. Its domain is
    /// escaped (`:` never appears unescaped in one), and a `#` is always escaped in an owner's
    /// name, so no descriptor can share an API key's counter. The whole descriptor is the hash
    /// tag: descriptors spread over a cluster's slots.
    ///
    /// The entries are named by a digest, never as sent: a descriptor's values are often API
    /// keys, tokens or addresses. `<entries>` is the first 128 bits, in hex, of the SHA-256 of
    /// `:<key>=<value>:...` (each part escaped, so no two lists share it).
    pub fn descriptor<'a>(domain: &str, entries: impl Iterator<Item = (&'a str, &'a str)>) -> Self {
        let mut listed = Vec::with_capacity(64);
        for (k, v) in entries {
            listed.push(b':');
            escape(k.as_bytes(), &mut listed);
            listed.push(b'=');
            escape(v.as_bytes(), &mut listed);
        }
        // Through the engine's per-thread memo of digests: a busy descriptor is digested once
        // (a SHA-256 is ~3,400 instructions in software, as callgrind counts it).
        let id = quotagate_engine::catalog::digests(&listed, None)
            .sha256()
            .id();
        let mut s = Vec::with_capacity(domain.len() + 40);
        s.extend_from_slice(b"{#");
        escape(domain.as_bytes(), &mut s);
        s.push(b':');
        s.extend_from_slice(&id.hex());
        s.extend_from_slice(b"}:rls");
        CounterKey(ascii(s))
    }

    /// The counter of a Divvy rule (`bucket`: its sorted operation pairs) for `actor`:
    /// `divvy:<bucket>:<actor>`, as the original Divvy names it (unescaped), so that quotagate and
    /// a running Divvy share counters in one Redis. It starts with neither `{` nor `=`, so no
    /// other counter can share it.
    pub fn divvy(bucket: &str, actor: &str) -> Self {
        let mut s = String::with_capacity(bucket.len() + actor.len() + 8);
        s.push_str("divvy:");
        s.push_str(bucket);
        s.push(':');
        s.push_str(actor);
        CounterKey(s)
    }

    /// The lease table's name for the fixed window (Redis key) `name`: `=<name>`. A counter's
    /// name starts with `{`, so none can share it.
    pub fn fixed(name: &str) -> Self {
        let mut s = String::with_capacity(name.len() + 1);
        s.push('=');
        s.push_str(name);
        CounterKey(s)
    }

    /// The fixed window's Redis key, for a name made by [`CounterKey::fixed`].
    pub fn fixed_name(&self) -> Option<&str> {
        self.0.strip_prefix('=')
    }

    /// The start shared by every counter of `api_key` (`{<api key>}:`).
    pub fn api_key_prefix(api_key: &[u8]) -> String {
        let mut s = Vec::with_capacity(api_key.len() + 3);
        s.push(b'{');
        escape(api_key, &mut s);
        s.extend_from_slice(b"}:");
        ascii(s)
    }
}

/// A `SCAN MATCH` pattern for every minute hash of `api_key`'s counters. Counter names hold no
/// glob characters (see [`CounterKey`]); the configured prefix may, so they are escaped.
pub fn api_key_pattern(prefix: &str, api_key: &[u8]) -> String {
    let mut s = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            s.push('\\');
        }
        s.push(c);
    }
    s.push_str(":w:");
    s.push_str(&CounterKey::api_key_prefix(api_key));
    s.push('*');
    s
}

/// The Redis hash that holds `counter`'s per-second counts for Unix minute `minute`.
pub fn minute_hash(prefix: &str, counter: &CounterKey, minute: i64) -> String {
    // Four of these per Redis decision: built by hand, `format!` cost 1.5k instructions each.
    let mut digits = itoa::Buffer::new();
    let minute = digits.format(minute);
    let mut s = String::with_capacity(prefix.len() + counter.0.len() + minute.len() + 4);
    s.push_str(prefix);
    s.push_str(":w:");
    s.push_str(&counter.0);
    s.push(':');
    s.push_str(minute);
    s
}

/// The Redis hash that holds `counter`'s buckets for its window of `w` seconds (any `w` but 60,
/// which keeps the DynLimits minute hashes). `s<w>` can never be a minute number.
pub fn window_hash(prefix: &str, counter: &CounterKey, w: u32) -> String {
    let mut digits = itoa::Buffer::new();
    let w = digits.format(w);
    let mut s = String::with_capacity(prefix.len() + counter.0.len() + w.len() + 5);
    s.push_str(prefix);
    s.push_str(":w:");
    s.push_str(&counter.0);
    s.push_str(":s");
    s.push_str(w);
    s
}

/// The Redis sorted set that holds `counter`'s slots of its concurrency limit (one member per
/// request in flight: `window.lua`). `c` can never be a minute number, `s<w>` or a period.
pub fn slots_set(prefix: &str, counter: &CounterKey) -> String {
    let mut s = String::with_capacity(prefix.len() + counter.0.len() + 5);
    s.push_str(prefix);
    s.push_str(":w:");
    s.push_str(&counter.0);
    s.push_str(":c");
    s
}

/// The Redis hash that holds `counter`'s count (field `n`) for the calendar `period` starting at
/// Unix millisecond `start_ms`: `<counter>:day:<start in Unix seconds>`. A period's name can never
/// be a minute number or `s<w>`, and one counter has at most one limit per period.
pub fn calendar_hash(prefix: &str, counter: &CounterKey, period: Period, start_ms: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let start = digits.format(start_ms / 1000);
    let name = period.as_str();
    let mut s =
        String::with_capacity(prefix.len() + counter.0.len() + name.len() + start.len() + 6);
    s.push_str(prefix);
    s.push_str(":w:");
    s.push_str(&counter.0);
    s.push(':');
    s.push_str(name);
    s.push(':');
    s.push_str(start);
    s
}

/// The key of `counter`'s fixed window for `limit` at `span` ([`Kind::Fixed`] or
/// [`Kind::Aligned`]): Divvy's `<counter>:<limit>:<seconds>` for a window from its first hit
/// (with [`CounterKey::divvy`], the original Divvy's key), [`aligned_window`] for one on the
/// clock. The memory store names its fixed windows the same way.
pub fn fixed_window(counter: &CounterKey, limit: &Limit, span: &Span) -> String {
    match (limit.kind, span.index) {
        (Kind::Aligned, Some(index)) => aligned_window(counter, limit.w, index),
        _ => {
            let mut digits = itoa::Buffer::new();
            let mut s = String::with_capacity(counter.0.len() + 32);
            s.push_str(&counter.0);
            s.push(':');
            s.push_str(digits.format(limit.rl));
            s.push(':');
            s.push_str(digits.format(limit.w));
            s
        }
    }
}

/// The key of `counter`'s fixed window of `w` seconds aligned to the clock, number `index`
/// (covering seconds `[index w, (index + 1) w)` of Unix time): `rls:<counter>:f<w>:<index>`. Like
/// Divvy's keys it holds the credit left and is not under the store's prefix; it expires with
/// its window.
fn aligned_window(counter: &CounterKey, w: u32, index: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let mut s = String::with_capacity(counter.0.len() + 32);
    s.push_str("rls:");
    s.push_str(&counter.0);
    s.push_str(":f");
    s.push_str(digits.format(w));
    s.push(':');
    s.push_str(digits.format(index));
    s
}

/// Checks a configured prefix: a brace would steal the cluster hash tag from the API key.
pub fn check_prefix(prefix: &str) -> Result<(), crate::connect::OptionError> {
    if prefix.is_empty() || prefix.contains(['{', '}']) {
        return Err(crate::connect::OptionError::new(
            "store.key_prefix",
            format!("{prefix:?} must be non-empty and contain no braces"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo of escaped names gives what escaping gives, whichever names share an entry and
    /// in whatever order they come.
    #[test]
    fn a_remembered_name_is_spelled_as_escaping_it_spells_it() {
        // The first four share an entry (same length, same last byte).
        let names = [
            "GET /a{b}",
            "PUT /a b}",
            "GET /%7B}",
            "GET /a{b}",
            "",
            "GET /users/{id}/prefs",
            "search",
            "POST /x",
        ];
        let mut many: Vec<String> = (0..200)
            .map(|i| format!("GET /{i}/{{p}} {}", i % 7))
            .collect();
        many.extend(names.iter().map(|n| n.to_string()));
        for name in names
            .iter()
            .cycle()
            .take(64)
            .map(|n| n.to_string())
            .chain(many)
        {
            let mut direct = Vec::new();
            escape(name.as_bytes(), &mut direct);
            let mut remembered = b"x".to_vec();
            push_escaped_name(&name, &mut remembered);
            assert_eq!(remembered[1..], direct[..], "{name}");
        }
        assert_eq!(
            CounterKey::new(b"k", "PUT /a b}").as_str(),
            "{k}:PUT%20/a%20b%7D"
        );
    }

    #[test]
    fn readable_for_ordinary_keys() {
        let k = CounterKey::new(b"7H6AMB0F", "GET /users/{id}/prefs");
        assert_eq!(k.as_str(), "{7H6AMB0F}:GET%20/users/%7Bid%7D/prefs");
        assert_eq!(
            minute_hash("quotagate", &k, 29_000_000),
            "quotagate:w:{7H6AMB0F}:GET%20/users/%7Bid%7D/prefs:29000000"
        );
        assert_eq!(
            window_hash("quotagate", &k, 3600),
            "quotagate:w:{7H6AMB0F}:GET%20/users/%7Bid%7D/prefs:s3600"
        );
    }

    #[test]
    fn every_byte_is_kept_or_escaped_as_percent_hex() {
        let all: Vec<u8> = (0..=255u8).chain(b"ab%{}:".iter().copied()).collect();
        let mut got = Vec::new();
        escape(&all, &mut got);
        let mut want = String::new();
        for &b in &all {
            match b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                true => want.push(b as char),
                false => want.push_str(&format!("%{b:02X}")),
            }
        }
        assert_eq!(ascii(got), want);
    }

    #[test]
    fn injective_across_separator_and_brace_tricks() {
        let pairs: [(&[u8], &str); 6] = [
            (b"a}:GET /x", "GET /y"),
            (b"a", "GET /x}:GET /y"),
            (b"a%7D", "GET /y"),
            (b"a}", "GET /y"),
            (b"\xff\x00", "GET /y"),
            (b"", "GET /y"),
        ];
        let names: std::collections::HashSet<String> =
            pairs.iter().map(|(k, e)| CounterKey::new(k, e).0).collect();
        assert_eq!(names.len(), pairs.len());
        for n in &names {
            // exactly one '{' and one '}' : the hash tag is the whole API key
            assert_eq!(n.matches('{').count(), 1, "{n}");
            assert_eq!(n.matches('}').count(), 1, "{n}");
        }
    }

    #[test]
    fn a_key_ids_counters_are_its_hex_as_an_owner_would_be_escaped() {
        let id = KeyId([0xab; 16]);
        let hex = id.hex();
        assert_eq!(
            CounterKey::of_id(&id, "GET /a/{id}"),
            CounterKey::new(&hex, "GET /a/{id}")
        );
        assert_eq!(
            CounterKey::pool_of_id(&id, "g"),
            CounterKey::pool(&hex, "g")
        );
    }

    #[test]
    fn descriptors_have_counters_of_their_own() {
        let d =
            |domain: &str, e: &[(&str, &str)]| CounterKey::descriptor(domain, e.iter().copied()).0;
        // printf %s ':k=v:path=/a%20b' | sha256sum | cut -c1-32
        assert_eq!(
            d("edge", &[("k", "v"), ("path", "/a b")]),
            "{#edge:5c5e83ab48e97a6ac3c85fc09699ffc5}:rls"
        );
        let names: std::collections::HashSet<String> = [
            d("a", &[("b", "c")]),
            d("a:b", &[("c", "")]),
            d("a", &[("b=c", "")]),
            d("a", &[("b", "c"), ("d", "e")]),
            d("a", &[("b", "c:d=e")]),
            CounterKey::new(b"#a:b=c", "rls").0,
        ]
        .into();
        assert_eq!(names.len(), 6);
    }

    #[test]
    fn fixed_windows_keep_divvys_keys() {
        let c = CounterKey::divvy("method=GET path=/a", "alice");
        let l = Limit::fixed(100, 60);
        let span = Span::of(&l, 5_000);
        assert_eq!(
            fixed_window(&c, &l, &span),
            "divvy:method=GET path=/a:alice:100:60"
        );
        let d = CounterKey::descriptor("edge", [("k", "v")].into_iter());
        let l = Limit::aligned(100, 60);
        assert_eq!(
            fixed_window(&d, &l, &Span::of(&l, 1_700_000_040_000)),
            "rls:{#edge:0828e6565019d6422652fc090a00a1fa}:rls:f60:28333334"
        );
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("qg").is_ok());
        assert!(check_prefix("q{g}").is_err());
        assert!(check_prefix("").is_err());
    }
}
