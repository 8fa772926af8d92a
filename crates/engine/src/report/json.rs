//! json: the number at a path in a JSON text that arrives in pieces, found in one pass over the
//! bytes as they stream through, keeping none of them.
//!
//! Why not serde_json: it reads a whole text from one slice, so the body had to be copied as it
//! passed, then walked again at its end, checking every byte; together that was most of what
//! `cost_from` added to a request (callgrind, docs/benchmarks/). This reads each byte once, where
//! it lies. The containers on the path and the values beside it are read by the grammar; a
//! container off the path is only followed to its end (its brackets and strings, found 64 bytes
//! at a time by `blocks`), and strings are not checked (escapes, control characters, UTF-8). So on every valid
//! text it answers what serde_json answers (the tests and the fuzz target `report` hold it equal
//! to [`reference`]); a text cut short, or out of grammar where it is read, reports nothing; a
//! text that is not JSON only off the path may still report its count. Content inside a valid
//! text's strings (what a client sent, echoed back) cannot move the path: strings end only at an
//! unescaped quote.

use super::blocks;

/// A JSON path's keys (object keys, or array indices), shared by every response's reader.
pub type Path = std::sync::Arc<[Box<str>]>;

/// What a text holds at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing: no value there, or the text is not JSON.
    Nothing,
    /// A whole number written as digits alone.
    Count(u64),
    /// Anything else: a sign, a fraction or an exponent, a number past `u64`, a string, a
    /// literal, an object or an array.
    Other,
}

/// The value at a path, found in a JSON text fed in pieces: [`Scan::feed`] them, then
/// [`Scan::end`]. Any split of the same text gives the same answer.
#[derive(Debug)]
pub struct Scan {
    path: Path,
    state: State,
    /// The open containers, all on the path (the one at depth `d` was reached through the path's
    /// first `d` keys), the innermost first: set for an object. At most the path's length
    /// (128 keys at most: a path is at most 256 bytes).
    stack: Kinds,
    depth: u8,
    /// When the innermost container is an array: how many elements come before the one the path
    /// names, from the current one (`None`: it passed, or the path names none).
    index: Option<usize>,
    /// The string being read is a key (not a value).
    in_key: bool,
    /// The key being read, compared with the path's as it comes.
    key: KeyMatch,
    /// The value that starts next is on the path (its key or index is the path's).
    selected: bool,
    /// Brackets open in the value being skipped (a count: nesting off the path costs no
    /// memory).
    skipping: u64,
    /// The number being read is the path's value: its value so far (`None`: not a count).
    target: Option<Option<u64>>,
    /// The value at the path, as far as the text went.
    found: Found,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value must come (the text's, after `:`, after `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value in a container: `,` or its closing bracket.
    Next,
    /// After the text's value: only white space.
    End,
    /// Inside a string.
    Str,
    /// After `\` in a string.
    Escape,
    /// In a number.
    Num(Num),
    /// In `true`, `false` or `null`: the bytes still to come (of [`LITERALS`]).
    Literal(u8, u8),
    /// In a value off the path, outside its strings.
    Skip,
    /// In a number or literal off the path: to the next `,`, bracket or white space.
    SkipScalar,
    /// In a string of a value off the path.
    SkipStr,
    /// After `\` there.
    SkipEscape,
    /// Not JSON: nothing more is read.
    Bad,
}

/// The literals' bytes after their first.
const LITERALS: [&[u8]; 3] = [b"rue", b"alse", b"ull"];

/// Where a number is in its grammar (RFC 8259 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    /// After `-`.
    Minus,
    /// After a leading `0`.
    Zero,
    /// In the integer's digits.
    Int,
    /// After `.`.
    Dot,
    /// In the fraction's digits.
    Frac,
    /// After `e` or `E`.
    Exp,
    /// After the exponent's sign.
    ExpSign,
    /// In the exponent's digits.
    ExpInt,
}

impl Num {
    /// The number may end here.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpInt)
    }
}

/// 128 bits, one a container (set for an object), the innermost in bit 0 of `lo`. Not a `u128`:
/// its alignment (16) would make the reader's box ask the allocator for aligned memory, a slower
/// path (about 100 instructions a response, callgrind).
#[derive(Debug, Clone, Copy, Default)]
struct Kinds {
    lo: u64,
    hi: u64,
}

impl Kinds {
    fn push(&mut self, object: bool) {
        self.hi = (self.hi << 1) | (self.lo >> 63);
        self.lo = (self.lo << 1) | u64::from(object);
    }

    fn pop(&mut self) {
        self.lo = (self.lo >> 1) | (self.hi << 63);
        self.hi >>= 1;
    }

    fn innermost_is_object(self) -> bool {
        self.lo & 1 == 1
    }
}

/// How a key is compared with the path's.
#[derive(Debug)]
enum KeyMatch {
    /// Not the path's (or not compared: the object is off the path).
    No,
    /// Its first bytes equal the path's key's, this many.
    At(usize),
    /// It has an escape: kept as written (escapes and all) for serde_json to read at its end,
    /// while it could still be the path's key: each byte of a key takes at most 6 bytes as
    /// written (`\u0041`), so a longer one is not it.
    Escaped(Vec<u8>),
}

/// Where the first `"` or `\\` of `s` is. Most strings are short, where memchr's set-up costs
/// more than its search (about 60 instructions a call, callgrind): their first 32 bytes are looked
/// at eight at a time by hand, the rest of a long one by memchr.
#[inline(always)]
fn quote_or_escape(s: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    // The high bit of each zero byte of `w`: exact for the lowest one (a borrow may mark the
    // byte above it too), and only the lowest is used.
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let mut i = 0;
    while let Some(word) = s.get(i..i + 8) {
        let w = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        let hits = zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\')));
        if hits != 0 {
            return Some(i + (hits.trailing_zeros() / 8) as usize);
        }
        i += 8;
        if i == 32 {
            return memchr::memchr2(b'"', b'\\', &s[i..]).map(|at| at + i);
        }
    }
    let tail = s[i..].iter().position(|&b| b == b'"' || b == b'\\');
    tail.map(|at| at + i)
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Scan {
    pub fn new(path: &Path) -> Scan {
        Scan {
            path: path.clone(),
            state: State::Value,
            stack: Kinds::default(),
            depth: 0,
            index: None,
            in_key: false,
            key: KeyMatch::No,
            // The text's value is where the path starts.
            selected: true,
            skipping: 0,
            target: None,
            found: Found::Nothing,
        }
    }

    /// The next bytes of the text.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Str => {
                    let rest = &bytes[i..];
                    let plain = quote_or_escape(rest).unwrap_or(rest.len());
                    self.key_bytes(&rest[..plain]);
                    i += plain;
                    match bytes.get(i) {
                        Some(b'"') => self.string_ends(),
                        Some(_) => {
                            self.key_bytes(b"\\");
                            self.state = State::Escape;
                        }
                        None => return,
                    }
                    i += 1;
                }
                State::Escape => {
                    // `\uXXXX`'s digits are plain bytes, read as such.
                    self.key_bytes(&bytes[i..=i]);
                    self.state = State::Str;
                    i += 1;
                }
                State::Skip | State::SkipStr | State::SkipEscape => i = self.skip(bytes, i),
                State::SkipScalar => {
                    let rest = &bytes[i..];
                    match rest
                        .iter()
                        .position(|&b| matches!(b, b',' | b'}' | b']') || is_space(b))
                    {
                        Some(at) => {
                            i += at;
                            self.value_ends();
                        }
                        None => return,
                    }
                }
                State::Bad => return,
                State::Num(_) | State::Literal(..) => {
                    if self.byte(bytes[i]) {
                        i += 1;
                    }
                }
                // Between tokens, where the grammar is read.
                _ => {
                    let b = bytes[i];
                    if is_space(b) {
                        i += 1;
                        continue;
                    }
                    if b == b'"' && matches!(self.state, State::KeyOrClose | State::Key) {
                        let next = self.members(bytes, i);
                        if next != i {
                            i = next;
                            continue;
                        }
                    }
                    if b == b'"'
                        && let Some(len) = self.whole_string(&bytes[i + 1..])
                    {
                        i += len + 2;
                        continue;
                    }
                    if self.byte(b) {
                        i += 1;
                    }
                }
            }
        }
    }

    /// Reads an object's members from the key at `bytes[i]` in one loop, while they are off the
    /// path and whole in `bytes` (most of an answer's top object): `"key": value,` at a time, the
    /// value followed to its end as [`Scan::skip`] and `SkipScalar` would. Stops at the path's
    /// key (its value is then read by the grammar), at a container (skipped by [`Scan::skip`]),
    /// at the object's end, or where the member is not whole here or has an escape (then from
    /// the member's key, by the byte: the same answer). Where it read to.
    fn members(&mut self, bytes: &[u8], mut i: usize) -> usize {
        let want = self.path[usize::from(self.depth) - 1].as_bytes();
        let space = |mut j: usize| {
            while bytes.get(j).is_some_and(|&b| is_space(b)) {
                j += 1;
            }
            j
        };
        loop {
            // At a key's `"`, in state `KeyOrClose` or `Key`.
            let Some(len) = quote_or_escape(&bytes[i + 1..]) else {
                return i;
            };
            if bytes[i + 1 + len] != b'"' {
                return i;
            }
            let on_path = bytes[i + 1..i + 1 + len] == *want;
            let mut j = space(i + len + 2);
            if bytes.get(j) != Some(&b':') {
                return i;
            }
            j = space(j + 1);
            let Some(&v) = bytes.get(j) else {
                return i;
            };
            if on_path || v == b'{' || v == b'[' {
                self.selected = on_path;
                self.state = State::Value;
                return j;
            }
            j = match v {
                b'"' => match quote_or_escape(&bytes[j + 1..]) {
                    Some(len) if bytes[j + 1 + len] == b'"' => j + len + 2,
                    _ => return i,
                },
                _ => match bytes[j..]
                    .iter()
                    .position(|&b| matches!(b, b',' | b'}' | b']') || is_space(b))
                {
                    Some(len) => j + len,
                    None => return i,
                },
            };
            j = space(j);
            match bytes.get(j) {
                Some(b',') => {
                    self.state = State::Key;
                    let k = space(j + 1);
                    if bytes.get(k) != Some(&b'"') {
                        return k;
                    }
                    i = k;
                }
                Some(b'}') => {
                    self.close();
                    return j + 1;
                }
                _ => {
                    self.selected = false;
                    self.state = State::Next;
                    return j;
                }
            }
        }
    }

    /// A string that starts here (after its `"`) and ends in `rest` without an escape, as most
    /// do: read at once (a key compared whole), and its length. `None`: read byte by byte.
    #[inline(always)]
    fn whole_string(&mut self, rest: &[u8]) -> Option<usize> {
        let len = quote_or_escape(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        match self.state {
            State::KeyOrClose | State::Key => {
                let want = self.path[usize::from(self.depth) - 1].as_bytes();
                self.selected = rest[..len] == *want;
                self.state = State::Colon;
            }
            State::Value | State::ValueOrClose => {
                if self.selected {
                    self.value_starts(b'"');
                }
                self.value_ends();
            }
            _ => return None,
        }
        Some(len)
    }

    /// Follows a container or string off the path from `bytes[i]` to its end (its closing
    /// bracket or quote: then the grammar is read again), or to the end of `bytes`. One loop with
    /// the state in locals: most of a body is here.
    fn skip(&mut self, bytes: &[u8], mut i: usize) -> usize {
        if bytes.len() - i >= 64 {
            let mut at = blocks::Skipping {
                open: self.skipping,
                in_string: self.state != State::Skip,
                escaped: self.state == State::SkipEscape,
            };
            match blocks::skip(bytes, i, &mut at) {
                Ok(end) => {
                    self.skipping = 0;
                    self.value_ends();
                    return end;
                }
                Err(at_byte) => {
                    i = at_byte;
                    self.skipping = at.open;
                    self.state = match (at.in_string, at.escaped) {
                        (false, _) => State::Skip,
                        (true, false) => State::SkipStr,
                        (true, true) => State::SkipEscape,
                    };
                }
            }
        }
        let mut open = self.skipping;
        let mut state = self.state;
        loop {
            match state {
                State::Skip => loop {
                    let Some(&b) = bytes.get(i) else {
                        self.skipping = open;
                        self.state = state;
                        return i;
                    };
                    i += 1;
                    match b {
                        b'"' => {
                            state = State::SkipStr;
                            break;
                        }
                        b'{' | b'[' => open += 1,
                        b'}' | b']' => {
                            open -= 1;
                            if open == 0 {
                                self.skipping = 0;
                                self.value_ends();
                                return i;
                            }
                        }
                        _ => {}
                    }
                },
                State::SkipStr => match quote_or_escape(&bytes[i..]) {
                    Some(at) => {
                        i += at + 1;
                        state = match bytes[i - 1] {
                            // A string alone ends the value skipped.
                            b'"' if open == 0 => {
                                self.skipping = 0;
                                self.value_ends();
                                return i;
                            }
                            b'"' => State::Skip,
                            _ => State::SkipEscape,
                        };
                    }
                    None => {
                        self.skipping = open;
                        self.state = state;
                        return bytes.len();
                    }
                },
                _ => {
                    // After `\\`: the byte escaped.
                    if i == bytes.len() {
                        self.skipping = open;
                        self.state = state;
                        return i;
                    }
                    i += 1;
                    state = State::SkipStr;
                }
            }
        }
    }

    /// The text ended: what it holds at the path (`Nothing` also when it is not JSON).
    pub fn end(mut self) -> Found {
        if let State::Num(n) = self.state {
            // A number is the text's last byte when it is the whole text.
            match n.complete() {
                true => self.value_ends(),
                false => self.state = State::Bad,
            }
        }
        match self.state {
            State::End => self.found,
            _ => Found::Nothing,
        }
    }

    /// One byte where the grammar is read; `false`: not consumed (a number ended before it).
    #[inline(always)]
    fn byte(&mut self, b: u8) -> bool {
        match self.state {
            State::Value | State::ValueOrClose => {
                if is_space(b) {
                    return true;
                }
                if b == b']' && self.state == State::ValueOrClose {
                    self.close();
                    return true;
                }
                if !self.selected {
                    // Off the path: followed to its end, not read.
                    (self.skipping, self.state) = match b {
                        b'"' => (0, State::SkipStr),
                        b'{' | b'[' => (1, State::Skip),
                        _ => (0, State::SkipScalar),
                    };
                    return !matches!(self.state, State::SkipScalar);
                }
                self.value_starts(b);
            }
            State::KeyOrClose | State::Key => match b {
                _ if is_space(b) => {}
                b'"' => {
                    self.in_key = true;
                    // Every open container is on the path.
                    self.key = KeyMatch::At(0);
                    self.state = State::Str;
                }
                b'}' if self.state == State::KeyOrClose => self.close(),
                _ => self.state = State::Bad,
            },
            State::Colon => match b {
                _ if is_space(b) => {}
                b':' => self.state = State::Value,
                _ => self.state = State::Bad,
            },
            State::Next => {
                let object = self.stack.innermost_is_object();
                match b {
                    _ if is_space(b) => {}
                    b',' if object => self.state = State::Key,
                    b',' => {
                        // The element on the path passed: none is after it.
                        self.index = self.index.and_then(|i| i.checked_sub(1));
                        self.selected = self.index == Some(0);
                        self.state = State::Value;
                    }
                    b'}' if object => self.close(),
                    b']' if !object => self.close(),
                    _ => self.state = State::Bad,
                }
            }
            State::End => {
                if !is_space(b) {
                    self.state = State::Bad;
                }
            }
            State::Num(n) => return self.number(n, b),
            State::Literal(which, at) => {
                let rest = LITERALS[usize::from(which)];
                self.state = match rest.get(usize::from(at)) {
                    Some(&want) if want == b => match usize::from(at) + 1 == rest.len() {
                        true => {
                            self.value_ends();
                            return true;
                        }
                        false => State::Literal(which, at + 1),
                    },
                    _ => State::Bad,
                };
            }
            State::Str
            | State::Escape
            | State::Skip
            | State::SkipStr
            | State::SkipEscape
            | State::SkipScalar
            | State::Bad => {}
        }
        true
    }

    /// A value starts with `b` (not white space); `selected` says whether it is on the path.
    #[inline(always)]
    fn value_starts(&mut self, b: u8) {
        let on_path = std::mem::take(&mut self.selected);
        let target = on_path && usize::from(self.depth) == self.path.len();
        if on_path {
            // The path's key again (or for the first time): what an earlier one held is replaced.
            self.found = Found::Nothing;
        }
        if target && b != b'-' && !b.is_ascii_digit() {
            // Only a whole number is a count.
            self.found = Found::Other;
        }
        self.state = match b {
            b'{' | b'[' if on_path && !target => return self.open(b == b'{'),
            // A container where the count should be: followed to its end.
            b'{' | b'[' => {
                self.skipping = 1;
                State::Skip
            }
            b'"' => {
                self.in_key = false;
                self.key = KeyMatch::No;
                State::Str
            }
            b't' => State::Literal(0, 0),
            b'f' => State::Literal(1, 0),
            b'n' => State::Literal(2, 0),
            b'-' | b'0'..=b'9' => {
                self.target = target.then(|| match b {
                    b'-' => None,
                    d => Some(u64::from(d - b'0')),
                });
                State::Num(match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => Num::Int,
                })
            }
            _ => State::Bad,
        };
    }

    /// A container on the path opens (the path goes on inside it).
    fn open(&mut self, object: bool) {
        self.stack.push(object);
        self.depth += 1;
        if !object {
            let key = &self.path[usize::from(self.depth) - 1];
            self.index = key.parse::<usize>().ok();
            self.selected = self.index == Some(0);
        }
        self.state = match object {
            true => State::KeyOrClose,
            false => State::ValueOrClose,
        };
    }

    /// The innermost container closes.
    fn close(&mut self) {
        self.stack.pop();
        self.depth -= 1;
        // Back in an array: its element on the path was this one.
        self.index = None;
        self.selected = false;
        self.value_ends();
    }

    /// A value (scalar or container) ended.
    #[inline(always)]
    fn value_ends(&mut self) {
        if let Some(n) = self.target.take() {
            self.found = match n {
                Some(n) => Found::Count(n),
                None => Found::Other,
            };
        }
        self.state = match self.depth {
            0 => State::End,
            _ => State::Next,
        };
    }

    fn string_ends(&mut self) {
        if !self.in_key {
            return self.value_ends();
        }
        let want = self.path[usize::from(self.depth) - 1].as_bytes();
        self.selected = match std::mem::replace(&mut self.key, KeyMatch::No) {
            KeyMatch::No => false,
            KeyMatch::At(n) => n == want.len(),
            // Escapes are rare in keys: serde_json reads them.
            KeyMatch::Escaped(raw) => {
                let quoted = [&b"\""[..], &raw, b"\""].concat();
                serde_json::from_slice::<String>(&quoted).is_ok_and(|k| k.as_bytes() == want)
            }
        };
        self.state = State::Colon;
    }

    /// The next bytes of a key, as written.
    fn key_bytes(&mut self, bytes: &[u8]) {
        if matches!(self.key, KeyMatch::No) {
            return;
        }
        let want = self.path[usize::from(self.depth) - 1].as_bytes();
        self.key = match std::mem::replace(&mut self.key, KeyMatch::No) {
            KeyMatch::At(n) if bytes.first() == Some(&b'\\') => {
                KeyMatch::Escaped([&want[..n], bytes].concat())
            }
            // The lengths first: most keys differ in theirs.
            KeyMatch::At(n)
                if bytes.len() <= want.len() - n && want[n..n + bytes.len()] == *bytes =>
            {
                KeyMatch::At(n + bytes.len())
            }
            KeyMatch::Escaped(mut raw) if raw.len() + bytes.len() <= want.len() * 6 => {
                raw.extend_from_slice(bytes);
                KeyMatch::Escaped(raw)
            }
            _ => KeyMatch::No,
        };
    }

    /// One byte in a number in part `n`; `false`: the number ended before it.
    fn number(&mut self, n: Num, b: u8) -> bool {
        let next = match (n, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign | Num::ExpInt, b'0'..=b'9') => Num::ExpInt,
            _ if n.complete() => {
                self.value_ends();
                return false;
            }
            _ => {
                self.state = State::Bad;
                return true;
            }
        };
        if let Some(count) = &mut self.target {
            *count = match next {
                Num::Int => count
                    .and_then(|c| c.checked_mul(10))
                    .and_then(|c| c.checked_add(u64::from(b - b'0'))),
                // A sign, a fraction or an exponent: not a whole number as written.
                _ => None,
            };
        }
        self.state = State::Num(next);
        true
    }
}

/// The value at `path` in `json` as serde_json reads it (the last of duplicate keys wins; an
/// index such as `01` names element 1): what [`Scan`] is held to by the tests and the fuzz
/// target `report`. `None`: `json` is not JSON to serde_json.
pub fn reference(json: &[u8], path: &[Box<str>]) -> Option<Found> {
    let mut at = &serde_json::from_slice::<serde_json::Value>(json).ok()?;
    for (i, key) in path.iter().enumerate() {
        let next = match at {
            serde_json::Value::Object(m) => m.get(&**key),
            serde_json::Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        };
        match next {
            Some(v) => at = v,
            None => return Some(Found::Nothing),
        }
        if i + 1 == path.len() {
            return Some(match at.as_u64() {
                Some(n) => Found::Count(n),
                None => Found::Other,
            });
        }
    }
    Some(Found::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{MAX_REPORTED, NoReport, reported};

    fn path(p: &str) -> Path {
        p.split('.').map(Box::from).collect()
    }

    #[test]
    fn kinds_hold_128_containers_innermost_first() {
        // A pattern without a period of 64, so bits crossing from `lo` to `hi` and back show.
        let object = |d: usize| (d * 7 + d / 3) % 5 < 2;
        let mut k = Kinds::default();
        for d in 0..128 {
            k.push(object(d));
            assert_eq!(k.innermost_is_object(), object(d), "pushed {d}");
        }
        for d in (1..128).rev() {
            k.pop();
            assert_eq!(k.innermost_is_object(), object(d - 1), "popped to {d}");
        }
    }

    /// What `Scan` finds at `p` in `text`, fed whole.
    fn scan(text: &[u8], p: &str) -> Result<u64, NoReport> {
        let mut s = Scan::new(&path(p));
        s.feed(text);
        reported(s.end())
    }

    /// What serde_json finds at `p` in `text`, as a report.
    fn reference(text: &[u8], p: &str) -> Option<Result<u64, NoReport>> {
        super::reference(text, &path(p)).map(reported)
    }

    #[test]
    fn finds_what_a_full_parse_finds() {
        let cases: &[(&str, &str, Result<u64, NoReport>)] = &[
            (
                r#"{"usage": {"total_tokens": 42}}"#,
                "usage.total_tokens",
                Ok(42),
            ),
            (
                r#"{"usage":{"total_tokens":0}}"#,
                "usage.total_tokens",
                Ok(0),
            ),
            (
                r#" {"usage" : { "total_tokens" : 7 } } "#,
                "usage.total_tokens",
                Ok(7),
            ),
            (
                r#"{"usage": {"total_tokens": 1000000000}}"#,
                "usage.total_tokens",
                Ok(MAX_REPORTED),
            ),
            (
                r#"{"usage": {"total_tokens": 1000000001}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": 99999999999999999999999}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": -0}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": 1.0}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": 1e2}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": "5"}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": null}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": [5]}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": {"total_tokens": {"n": 5}}}"#,
                "usage.total_tokens",
                Err(NoReport::Invalid),
            ),
            (
                r#"{"usage": 5}"#,
                "usage.total_tokens",
                Err(NoReport::Missing),
            ),
            (
                r#"[{"usage": {"total_tokens": 5}}]"#,
                "usage.total_tokens",
                Err(NoReport::Missing),
            ),
            (
                r#"{"a": {"total_tokens": 5}, "usage": {}}"#,
                "usage.total_tokens",
                Err(NoReport::Missing),
            ),
            // The last of duplicate keys wins, whatever it holds.
            (
                r#"{"usage": {"total_tokens": 5}, "usage": {"x": 1}}"#,
                "usage.total_tokens",
                Err(NoReport::Missing),
            ),
            (
                r#"{"usage": {"total_tokens": 5, "total_tokens": 6}}"#,
                "usage.total_tokens",
                Ok(6),
            ),
            (
                r#"{"usage": {"total_tokens": "x"}, "usage": {"total_tokens": 3}}"#,
                "usage.total_tokens",
                Ok(3),
            ),
            // Keys are compared as read: escapes and all.
            (
                r#"{"us\u0061ge": {"total\u005ftokens": 8}}"#,
                "usage.total_tokens",
                Ok(8),
            ),
            (
                r#"{"usage\u0000": {"total_tokens": 8}}"#,
                "usage.total_tokens",
                Err(NoReport::Missing),
            ),
            (
                r#"{"usag": {"total_tokens": 8}, "usagee": {"total_tokens": 9}}"#,
                "usage.total_tokens",
                Err(NoReport::Missing),
            ),
            // Indices, as serde_json reads them (`01` is 1).
            (r#"{"choices": [{"n": 1}, {"n": 7}]}"#, "choices.1.n", Ok(7)),
            (
                r#"{"choices": [{"n": 1}, {"n": 7}]}"#,
                "choices.01.n",
                Ok(7),
            ),
            (
                r#"{"choices": [[1, 2], {"n": 7}, {"n": 8}]}"#,
                "choices.1.n",
                Ok(7),
            ),
            (
                r#"{"choices": [{"n": 1}]}"#,
                "choices.1.n",
                Err(NoReport::Missing),
            ),
            (r#"{"choices": {"1": {"n": 4}}}"#, "choices.1.n", Ok(4)),
            (r#"[3, 4, 5]"#, "2", Ok(5)),
            (r#"[3, 4, [5]]"#, "2.0", Ok(5)),
            (r#"[[], [], 9]"#, "2", Ok(9)),
            // An array on the path inside one: the outer one's count goes on after it.
            (r#"[[1], 5, [0, 0, 9]]"#, "0.2", Err(NoReport::Missing)),
            (
                r#"{"a": "a \"quoted\" \\ string with \"usage\": {\"total_tokens\": 3}", "b": 1}"#,
                "a.total_tokens",
                Err(NoReport::Missing),
            ),
        ];
        for (text, p, want) in cases {
            let reference = reference(text.as_bytes(), p);
            assert_eq!(reference, Some(*want), "the reference, on {text}");
            assert_eq!(scan(text.as_bytes(), p), *want, "{text} at {p}");
        }
    }

    #[test]
    fn a_text_that_is_not_json_reports_nothing() {
        for text in [
            "",
            " ",
            "{",
            r#"{"usage": {"total_tokens": 5}"#,
            r#"{"usage": {"total_tokens": 5}}}"#,
            r#"{"usage": {"total_tokens": 5}} x"#,
            r#"{"usage": {"total_tokens": 5},}"#,
            r#"{"usage": {"total_tokens" 5}}"#,
            r#"{"usage": {"total_tokens": 05}}"#,
            r#"{"usage": {"total_tokens": 5.}}"#,
            r#"{"usage": {"total_tokens": 5], "a": 1}"#,
            r#"{"usage": {"total_tokens": 5}, "a": {"b": [}"#,
            r#"{"usage": {"total_tokens": 5}, "a": {"b": "}"}"#,
            r#"{"usage": {"total_tokens": 5}, 'a': 1}"#,
            r#"[1 2]"#,
            r#"[1,]"#,
            r#"{"a" :: 1}"#,
        ] {
            assert_eq!(
                reference(text.as_bytes(), "usage.total_tokens"),
                None,
                "{text}"
            );
            assert_eq!(
                scan(text.as_bytes(), "usage.total_tokens"),
                Err(NoReport::Missing),
                "{text}"
            );
        }
    }

    #[test]
    fn a_string_ends_at_its_first_quote_or_escape() {
        for len in 0..80 {
            for (special, at) in [
                (b'"', 0),
                (b'\\', 3),
                (b'"', 7),
                (b'\\', 8),
                (b'"', 31),
                (b'"', 32),
                (b'\\', 33),
                (b'"', 79),
            ] {
                let mut s = vec![b'a'; len];
                let want = (at < len).then(|| {
                    s[at] = special;
                    // A byte after the first is never the answer.
                    if at + 1 < len {
                        s[at + 1] = b'"';
                    }
                    at
                });
                assert_eq!(quote_or_escape(&s), want, "{len} {at}");
            }
        }
        assert_eq!(
            quote_or_escape("h\u{e9}llo w\u{f6}rld \u{1f600}\"".as_bytes()),
            Some(18)
        );
        assert_eq!(
            quote_or_escape(&[0x01, 0x22]),
            Some(1),
            "a borrow does not mark a byte"
        );
        assert_eq!(quote_or_escape(&[0x00, 0x01, 0x22, 0, 0, 0, 0, 0]), Some(2));
    }

    #[test]
    fn off_the_path_only_brackets_and_strings_are_followed() {
        // Not JSON to serde_json, but only where this does not read the grammar.
        for text in [
            r#"{"usage": {"total_tokens": 5}, "a": "\x"}"#,
            r#"{"usage": {"total_tokens": 5}, "a": "\u12G4"}"#,
            "{\"usage\": {\"total_tokens\": 5}, \"a\": \"tab\there\"}",
            r#"{"usage": {"total_tokens": 5}, "a": {"b" 1 ,, ]}"#,
            r#"{"a": [[[[1 2 3}}}], "usage": {"total_tokens": 5}}"#,
            r#"{"usage": {"total_tokens": 5}, "a": tru}"#,
            r#"{"usage": {"total_tokens": 5}, "a": 1.}"#,
        ] {
            assert_eq!(
                reference(text.as_bytes(), "usage.total_tokens"),
                None,
                "{text}"
            );
            assert_eq!(scan(text.as_bytes(), "usage.total_tokens"), Ok(5), "{text}");
        }
        // Nesting off the path costs a counter, not memory.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(scan(deep.as_bytes(), "0"), Err(NoReport::Invalid));
        let deep = format!("[{}{}]", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(scan(deep.as_bytes(), "1"), Err(NoReport::Missing));
        // A quote escaped in a string off the path does not end it.
        let text =
            r#"{"a": "\"}, \"usage\": {\"total_tokens\": 9}", "usage": {"total_tokens": 2}}"#;
        assert_eq!(scan(text.as_bytes(), "usage.total_tokens"), Ok(2));
    }

    /// A tiny generator (xorshift), so the same documents are made every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
            of[self.below(of.len())]
        }
    }

    /// A random JSON text in which `path` is likely (its keys are picked half the time), with
    /// duplicate keys, escapes, numbers of every form and white space.
    fn document(rng: &mut Rng, path: &[&str], depth: usize, out: &mut String) {
        let space = |rng: &mut Rng, out: &mut String| {
            out.push_str(rng.pick(&["", "", " ", "\n  ", "\t", "\r\n"]));
        };
        space(rng, out);
        let kind = match depth {
            _ if depth > 5 => 3 + rng.below(4),
            // Where the path ends, mostly numbers.
            _ if depth == path.len() => [3, 4, 3, 4, 5, 6, 0, 2][rng.below(8)],
            // On the way, mostly the container the path goes through.
            _ if depth < path.len() && rng.below(3) > 0 => match path[depth].parse::<usize>() {
                Ok(_) => 2,
                Err(_) => 0,
            },
            _ => rng.below(7),
        };
        match kind {
            0 | 1 => {
                out.push('{');
                for i in 0..rng.below(5) {
                    if i > 0 {
                        out.push(',');
                    }
                    space(rng, out);
                    let key = match path.get(depth) {
                        Some(key) if rng.below(2) == 0 => key,
                        _ => rng.pick(&[
                            "usage",
                            "total_tokens",
                            "choices",
                            "0",
                            "1",
                            "n",
                            "us\\u0061ge",
                            "total\\u005Ftokens",
                            "x",
                            "usage ",
                            "\\\"usage\\\"",
                            "",
                        ]),
                    };
                    out.push('"');
                    out.push_str(key);
                    out.push('"');
                    space(rng, out);
                    out.push(':');
                    document(rng, path, depth + 1, out);
                }
                space(rng, out);
                out.push('}');
            }
            2 => {
                out.push('[');
                for i in 0..rng.below(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    document(rng, path, depth + 1, out);
                }
                space(rng, out);
                out.push(']');
            }
            3 | 4 => out.push_str(rng.pick(&[
                "0",
                "7",
                "42",
                "1000000000",
                "1000000001",
                "18446744073709551616",
                "-3",
                "-0",
                "1.5",
                "2e3",
                "1E+2",
                "0.0",
                "123456789012",
            ])),
            5 => out.push_str(rng.pick(&[
                r#""text""#,
                r#""""#,
                r#""with \"usage\": {\"total_tokens\": 9}""#,
                r#""\u00e9\n\\""#,
                "\"caf\u{e9} \u{1f600} and some longer text to skip\"",
                // Longer than a block (64 bytes), escapes where blocks may meet.
                r#""a line,\nand another: \"quoted\" {not a bracket} [nor this] \\\\ and \\\" still in it, \u005C then more text to pass a block's end""#,
            ])),
            _ => out.push_str(rng.pick(&["true", "false", "null"])),
        }
        space(rng, out);
    }

    #[test]
    fn random_documents_and_their_mutations_read_as_serde_json_reads_them_in_any_split() {
        let paths = [
            "usage.total_tokens",
            "choices.1.n",
            "0.usage",
            "usage",
            "choices.0",
            "1",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut compared, mut counts, mut invalid) = (0, 0, 0);
        for _ in 0..20_000 {
            let p = rng.pick(&paths);
            let keys: Vec<&str> = p.split('.').collect();
            let mut text = String::new();
            document(&mut rng, &keys, 0, &mut text);
            let mut text = text.into_bytes();
            if rng.below(4) == 0 {
                // A mutation: mostly not JSON any more; where it is, the answers must agree.
                let at = rng.below(text.len());
                text[at] = b"{}[]\",:0-\\ ae"[rng.below(13)];
            }
            let whole = scan(&text, p);
            if let Some(want) = reference(&text, p) {
                assert_eq!(whole, want, "{} at {p}", String::from_utf8_lossy(&text));
                compared += 1;
                counts += usize::from(want.is_ok());
                invalid += usize::from(want == Err(NoReport::Invalid));
            }
            let mut split = Scan::new(&path(p));
            let mut rest = &text[..];
            while !rest.is_empty() {
                // Mostly small pieces; some larger than a block (64 bytes).
                let most = [12, 12, 200][rng.below(3)];
                let (a, b) = rest.split_at(1 + rng.below(rest.len().min(most)));
                split.feed(a);
                rest = b;
            }
            assert_eq!(
                reported(split.end()),
                whole,
                "{} split",
                String::from_utf8_lossy(&text)
            );
        }
        // The generator is worth its name: most documents are JSON, many carry a count at the
        // path, and many something else there.
        assert!(
            compared > 14_000 && counts > 500 && invalid > 500,
            "{compared} compared: {counts} counts, {invalid} invalid"
        );
    }
}
