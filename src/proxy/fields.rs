//! fields: where an answer's rate-limit fields are written: its header map, or the lines the
//! gateway's own HTTP/1.1 server sends as they are ([`Lines`], over [`Written`]), taken out of
//! the map where an upstream's field of the same name would otherwise go beside them.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::server::Written;
use crate::server::http1::Kind;

/// Where an answer's rate-limit fields go: its header map, or the lines the gateway's own
/// HTTP/1.1 server sends as they are ([`Lines`]).
pub trait Fields {
    /// Sets `name` to `value` (a field value's bytes), replacing what the answer held of it.
    fn set(&mut self, name: &HeaderName, value: &[u8]);

    /// Sets `name` (whose line starts `line`: `name: `) to the value `write` appends to an empty
    /// buffer: bytes a field value may hold (a map checks them anyway; lines do in debug builds
    /// only).
    fn set_with(
        &mut self,
        name: &HeaderName,
        line: &'static str,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        let _ = line;
        let mut value = Vec::with_capacity(64);
        write(&mut value);
        self.set(name, &value);
    }

    /// Sets `name` (whose line starts `line`) to `n` in decimal.
    fn set_number(&mut self, name: &HeaderName, line: &'static str, n: u64) {
        self.set_digits(name, line, itoa::Buffer::new().format(n));
    }

    /// Sets `name` (whose line starts `line`) to `digits`, a number written in decimal.
    fn set_digits(&mut self, name: &HeaderName, line: &'static str, digits: &str) {
        let _ = line;
        self.set(name, digits.as_bytes());
    }
}

impl Fields for HeaderMap {
    fn set(&mut self, name: &HeaderName, value: &[u8]) {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            self.insert(name.clone(), v);
        }
    }
}

/// Fields written as lines ([`Written`]), taken out of the answer's map.
pub struct Lines<'a> {
    /// The answer's map, while it may hold a field written ([`Lines::new`]).
    map: Option<&'a mut HeaderMap>,
    written: &'a mut Written,
}

impl<'a> Lines<'a> {
    pub fn new(map: &'a mut HeaderMap, written: &'a mut Written) -> Lines<'a> {
        // Looked at once: a field seldom comes from the upstream, and a removal looks it up
        // by its name's hash, five times an answer.
        let holds = map.keys().any(may_be_replaced);
        Lines {
            map: holds.then_some(map),
            written,
        }
    }
}

impl Lines<'_> {
    /// Takes `name` out of the answer's map, where the upstream's field would otherwise be sent
    /// beside the gateway's line.
    fn replacing(&mut self, name: &HeaderName) -> &mut Written {
        if let Some(map) = self.map.as_deref_mut() {
            map.remove(name);
        }
        self.written
    }
}

impl Fields for Lines<'_> {
    fn set(&mut self, name: &HeaderName, value: &[u8]) {
        self.replacing(name).push(name, value);
    }

    /// Written in place: the structured fields' values are built in the lines themselves.
    #[inline(always)]
    fn set_with(
        &mut self,
        name: &HeaderName,
        line: &'static str,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        self.replacing(name).push_valid_with(line, write);
    }

    /// Digits need no check ([`Written::push_digits`]).
    #[inline(always)]
    fn set_digits(&mut self, name: &HeaderName, line: &'static str, digits: &str) {
        self.replacing(name).push_digits(line, digits);
    }
}

/// A field of an upstream's answer that the gateway may write itself in its place
/// (`Retry-After`, `RateLimit*`: [`set_rate_limit`](super::headers::set_rate_limit)), and so may remove.
fn may_be_replaced(name: &HeaderName) -> bool {
    Kind::of(name) == Kind::RateLimit
}
