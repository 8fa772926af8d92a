//! passed: a request's fields the handler hands on unread ([`Passes`] names them), kept as the
//! lines they came in ([`Passed`]) instead of in the request's map, and put back in a map
//! ([`Passed::restore`]) for a way upstream that takes one.

use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::http1::{Kind, Line, append_line};

/// Field names a handler hands on to the upstream as they came, never reading them: the own
/// HTTP/1.1 server writes a request's fields of these names as lines ([`Passed`]) instead of
/// putting them in its header map. A field in the map cost ~350 instructions more than as a line
/// (its name hashed, its slot probed, two reference counts on the head's bytes, its drop, and
/// its copy to the upstream's head): a browser's or an API client's usual fields (`User-Agent`,
/// `Accept`, ...) are most of its request's (callgrind, docs/benchmarks/).
#[derive(Debug)]
pub struct Passes {
    /// Tells one set from another in the lines ([`Line`]) that keep how they were judged: a
    /// thread's lines go from one listener's connections to another's.
    id: u32,
    names: Box<[HeaderName]>,
}

static PASSES: AtomicU32 = AtomicU32::new(1);

impl Passes {
    /// Passes fields of `names` but those of `read` (names the handler reads, which may be
    /// configured to be any); hop-by-hop names and those that frame a message never pass.
    pub fn new<'a>(names: &[HeaderName], read: impl IntoIterator<Item = &'a HeaderName>) -> Passes {
        let read: Vec<&HeaderName> = read.into_iter().collect();
        let names = names
            .iter()
            .filter(|n| Kind::of(n) == Kind::Other && !read.contains(n))
            .cloned()
            .collect();
        Passes {
            id: PASSES.fetch_add(1, Ordering::Relaxed),
            names,
        }
    }

    /// Judges `line` (once for its name): whether it is handed on as a line.
    #[inline]
    pub fn judge(&self, line: &mut Line) -> bool {
        if line.judged_by != self.id {
            line.judged_by = self.id;
            line.passed_by = match self.names.contains(&line.name) {
                true => self.id,
                false => 0,
            };
        }
        self.passes(line)
    }

    /// `line`, judged by these ([`Passes::judge`]), is handed on as a line.
    pub fn passes(&self, line: &Line) -> bool {
        line.passed_by == self.id
    }
}

/// A request's fields handed on as they came ([`Passes`]): `name: value\r\n` lines, each name
/// and value as `httparse` and `HeaderName` admitted them (no CR, LF, NUL or other control byte
/// but a value's HTAB), the names as the client wrote them (field names are case-insensitive;
/// the answer's lines keep the upstream's too).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[allow(
    clippy::box_collection,
    reason = "one pointer where a `Vec` is three: see `Passed::push`"
)]
pub struct Passed(Option<Box<Vec<u8>>>);

/// The room a request's handed-on lines start with, in bytes: a browser's usual few.
const PASSED_ROOM: usize = 512;

impl Passed {
    /// The lines, to be written as they are.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Adds `line` of `head`: as the client wrote it where it is `Name: value` (one copy, the
    /// name in the client's case), else as `name: value`.
    fn push(&mut self, head: &[u8], line: &Line) {
        // Boxed: a request's body holds it, and one pointer is moved along the request path
        // with the body where a `Vec` is three.
        let lines = self
            .0
            .get_or_insert_with(|| Box::new(Vec::with_capacity(PASSED_ROOM)));
        let name_end = line.start + line.name.as_str().len();
        let value = &head[line.value.clone()];
        match head.get(name_end..line.value.start) {
            Some(b": ") => {
                lines.extend_from_slice(&head[line.start..line.value.end]);
            }
            _ => {
                let name = line.name.as_str().as_bytes();
                lines.reserve(name.len() + value.len() + 4);
                lines.extend_from_slice(name);
                lines.extend_from_slice(b": ");
                lines.extend_from_slice(value);
            }
        }
        lines.extend_from_slice(b"\r\n");
    }

    /// Puts the lines in `headers` (after what it holds of their names), for a way upstream that
    /// takes a map (hyper's client): the same fields, in the same order.
    pub fn restore(self, headers: &mut HeaderMap) {
        for line in self
            .as_bytes()
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(at) = line.windows(2).position(|w| w == b": ") else {
                continue;
            };
            // Each was a name and a value before it was written here.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&line[..at]),
                HeaderValue::from_bytes(&line[at + 2..]),
            ) {
                headers.append(name, value);
            }
        }
    }
}

/// Appends `lines` to `headers` as [`append_lines`](super::http1::append_lines) does, but for those that `passes` passes
/// (each judged by it, [`Passes::judge`]), which go to `passed`.
///
/// # Safety
///
/// As [`append_lines`](super::http1::append_lines)'s.
pub unsafe fn split_lines(
    lines: &[Line],
    head: &Bytes,
    headers: &mut HeaderMap,
    passes: &Passes,
    passed: &mut Passed,
) {
    headers.reserve(lines.len());
    for line in lines {
        if passes.passes(line) {
            passed.push(head, line);
        } else {
            // SAFETY: the caller's promise, above.
            unsafe { append_line(line, head, headers) };
        }
    }
}
