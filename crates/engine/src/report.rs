//! report: the cost a response reports (issue 29's `cost_from`), read from a header or from the
//! body as it streams through, without I/O. The proxy feeds it the bytes it forwards and asks at
//! the end; nothing here holds a response back.
//!
//! A JSON body (`application/json`) is read as it passes ([`json::Scan`]: nothing of it is kept),
//! up to a bound; an event stream (`text/event-stream`) is read event by event (only the current
//! event is kept), and the last `data:` event that carries the field wins, the way LLM APIs report
//! usage at the end of a stream.

mod blocks;
pub mod json;

/// The largest cost a response may report.
pub const MAX_REPORTED: u64 = 1_000_000_000;

/// Where an endpoint's responses report their cost (`cost_from` in the catalog).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostFrom {
    /// A response header (its name, lower-case).
    Header(String),
    /// A field of the body, by path (`usage.total_tokens`: object keys, or array indices);
    /// shared by every response's reader.
    Json(Path),
}

impl CostFrom {
    /// The path of `usage.total_tokens`, or why it is not one: dot-separated, no empty segment.
    pub fn json_path(path: &str) -> Result<CostFrom, String> {
        if path.is_empty() || path.split('.').any(str::is_empty) || path.len() > 256 {
            return Err(format!(
                "{path:?} is not a JSON path (keys separated by dots, such as \"usage.total_tokens\", at most 256 bytes)"
            ));
        }
        Ok(CostFrom::Json(path.split('.').map(Box::from).collect()))
    }
}

pub use json::Path;

/// What a JSON text holds at the path, as a report.
pub fn reported(found: json::Found) -> Result<u64, NoReport> {
    match found {
        json::Found::Count(n) if n <= MAX_REPORTED => Ok(n),
        json::Found::Count(_) | json::Found::Other => Err(NoReport::Invalid),
        json::Found::Nothing => Err(NoReport::Missing),
    }
}

/// Why a response reported no cost (its reservation stays): the `outcome` of the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReport {
    /// Nothing in the response carries the field.
    Missing,
    /// A value that is not a whole number from 0 to [`MAX_REPORTED`].
    Invalid,
    /// The body is larger than what is read of it.
    TooLarge,
    /// The response ended before its end (the upstream or the client went away).
    CutShort,
}

impl NoReport {
    pub fn as_str(self) -> &'static str {
        match self {
            NoReport::Missing => "missing",
            NoReport::Invalid => "invalid",
            NoReport::TooLarge => "too_large",
            NoReport::CutShort => "cut_short",
        }
    }
}

/// A reported number: a whole number from 0 to [`MAX_REPORTED`], as header text.
pub fn parse_reported(text: &[u8]) -> Result<u64, NoReport> {
    std::str::from_utf8(text)
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|n| *n <= MAX_REPORTED)
        .ok_or(NoReport::Invalid)
}

/// The reported number at `path` in the JSON text `json`.
fn value_at(json: &[u8], path: &Path) -> Result<u64, NoReport> {
    let mut scan = json::Scan::new(path);
    scan.feed(json);
    reported(scan.end())
}

/// Reads a body's report as it streams through: [`BodyReport::feed`] each chunk forwarded, then
/// [`BodyReport::end`].
#[derive(Debug)]
pub struct BodyReport {
    /// At most this many bytes are kept (a JSON body; an event stream's current event).
    max: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A JSON body, read as it passes; `None` once it grew past the bound.
    Json(Option<json::Scan>, usize),
    /// An event stream: the path (a JSON body's is its scan's), the line being read, the
    /// current event's data, and the last value found (`None`: none yet; `Some(Err)`: the last
    /// event carrying the field had a bad value).
    Events {
        path: Path,
        line: Vec<u8>,
        data: Vec<u8>,
        last: Option<Result<u64, NoReport>>,
        overflow: bool,
        /// The line being read is past the bound: dropped up to its end.
        skipping: bool,
    },
}

impl BodyReport {
    /// The reader for a body of `content_type` (a field's value; `None`: a type that carries no
    /// report, such as `text/html`), looking for `path`, keeping at most `max` bytes.
    pub fn new(content_type: &[u8], path: &Path, max: usize) -> Option<BodyReport> {
        let essence = match content_type.iter().position(|&b| b == b';') {
            Some(end) => &content_type[..end],
            None => content_type,
        }
        .trim_ascii();
        let json_suffix =
            || essence.len() > 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json");
        // JSON first: what most `cost_from` answers are.
        let kind = if essence.eq_ignore_ascii_case(b"application/json") || json_suffix() {
            Kind::Json(Some(json::Scan::new(path)), 0)
        } else if essence.eq_ignore_ascii_case(b"text/event-stream") {
            Kind::Events {
                path: path.clone(),
                line: Vec::new(),
                data: Vec::new(),
                last: None,
                overflow: false,
                skipping: false,
            }
        } else {
            return None;
        };
        Some(BodyReport { max, kind })
    }

    /// The next bytes of the body.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        let max = self.max;
        match &mut self.kind {
            Kind::Json(scan, seen) => {
                *seen = seen.saturating_add(bytes.len());
                match scan {
                    Some(_) if *seen > max => *scan = None,
                    Some(scan) => scan.feed(bytes),
                    None => {}
                }
            }
            Kind::Events { .. } => {
                while let Some(i) = bytes.iter().position(|&b| b == b'\n') {
                    self.push_line(&bytes[..i]);
                    self.line_done();
                    bytes = &bytes[i + 1..];
                }
                self.push_line(bytes);
            }
        }
    }

    fn push_line(&mut self, part: &[u8]) {
        let max = self.max;
        if let Kind::Events {
            line,
            overflow,
            skipping,
            ..
        } = &mut self.kind
        {
            if *skipping {
                return;
            }
            if line.len() + part.len() > max {
                (*overflow, *skipping) = (true, true);
                line.clear();
            } else {
                line.extend_from_slice(part);
            }
        }
    }

    /// A line of the event stream is complete (its `\n` seen).
    fn line_done(&mut self) {
        let Kind::Events {
            path,
            line,
            data,
            last,
            overflow,
            skipping,
        } = &mut self.kind
        else {
            return;
        };
        if std::mem::take(skipping) {
            // The end of a line too long to read: nothing to take from it.
            line.clear();
            return;
        }
        let text = line.strip_suffix(b"\r").unwrap_or(line);
        if text.is_empty() {
            // The event ends: its data is one JSON value, or something else (`[DONE]`).
            if !data.is_empty() {
                match value_at(data, path) {
                    Err(NoReport::Missing) => {}
                    found => *last = Some(found),
                }
            }
            data.clear();
        } else if let Some(rest) = text.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if data.len() + rest.len() + 1 > self.max {
                *overflow = true;
                data.clear();
            } else {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(rest);
            }
        }
        line.clear();
    }

    /// The body ended (all of it went through): what it reported.
    pub fn end(mut self) -> Result<u64, NoReport> {
        if let Kind::Events { line, skipping, .. } = &self.kind
            && (!line.is_empty() || *skipping)
        {
            // A last line without its newline, then the end of the last event.
            self.line_done();
        }
        if let Kind::Events { data, .. } = &self.kind
            && !data.is_empty()
        {
            self.line_done();
        }
        match self.kind {
            Kind::Json(None, _) => Err(NoReport::TooLarge),
            Kind::Json(Some(scan), _) => reported(scan.end()),
            Kind::Events {
                last: Some(found), ..
            } => found,
            Kind::Events { overflow: true, .. } => Err(NoReport::TooLarge),
            Kind::Events { .. } => Err(NoReport::Missing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Path {
        match CostFrom::json_path(p).unwrap() {
            CostFrom::Json(p) => p,
            CostFrom::Header(_) => unreachable!(),
        }
    }

    /// What a body of `content_type` sent in `chunks` reports at `usage.total_tokens`.
    fn report(content_type: &str, chunks: &[&[u8]], max: usize) -> Result<u64, NoReport> {
        let mut r =
            BodyReport::new(content_type.as_bytes(), &path("usage.total_tokens"), max).unwrap();
        for c in chunks {
            r.feed(c);
        }
        r.end()
    }

    #[test]
    fn a_header_reports_a_whole_number_from_zero_to_a_billion() {
        assert_eq!(parse_reported(b"1234"), Ok(1234));
        assert_eq!(parse_reported(b" 0 "), Ok(0));
        assert_eq!(parse_reported(b"1000000000"), Ok(MAX_REPORTED));
        for bad in [
            &b"1000000001"[..],
            b"-1",
            b"1.5",
            b"12abc",
            b"",
            b"0x10",
            b"\xff",
        ] {
            assert_eq!(parse_reported(bad), Err(NoReport::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn a_json_body_reports_the_field_at_its_path_in_any_chunks() {
        let body = br#"{"id": "x", "usage": {"prompt_tokens": 5, "total_tokens": 42}}"#;
        for split in 0..body.len() {
            let (a, b) = body.split_at(split);
            assert_eq!(report("application/json", &[a, b], 1024), Ok(42), "{split}");
        }
        assert_eq!(
            report("application/json; charset=utf-8", &[body], 1024),
            Ok(42)
        );
        assert_eq!(report("application/problem+json", &[body], 1024), Ok(42));
        assert_eq!(
            report("application/json", &[body], 20),
            Err(NoReport::TooLarge)
        );
        assert_eq!(
            report("application/json", &[br#"{"usage": {}}"#], 64),
            Err(NoReport::Missing)
        );
        assert_eq!(
            report(
                "application/json",
                &[br#"{"usage": {"total_tokens": 2.5}}"#],
                64
            ),
            Err(NoReport::Invalid)
        );
        assert_eq!(
            report(
                "application/json",
                &[br#"{"usage": {"total_tokens": -3}}"#],
                64
            ),
            Err(NoReport::Invalid)
        );
        assert_eq!(
            report("application/json", &[b"{not json"], 64),
            Err(NoReport::Missing)
        );
        let mut arr = BodyReport::new(b"application/json", &path("choices.1.n"), 64).unwrap();
        arr.feed(br#"{"choices": [{"n": 1}, {"n": 7}]}"#);
        assert_eq!(arr.end(), Ok(7), "array indices");
        assert!(BodyReport::new(b"text/html", &path("a"), 64).is_none());
    }

    #[test]
    fn an_event_stream_reports_the_last_event_that_carries_the_field() {
        let stream = concat!(
            "data: {\"choices\": [{\"delta\": \"Hel\"}]}\n\n",
            ": a comment\n",
            "event: message\r\n",
            "data: {\"usage\": {\"total_tokens\": 10}}\r\n\r\n",
            "data: {\"choices\": [{\"delta\": \"lo\"}]}\n\n",
            "data: {\"usage\":\n",
            "data:  {\"total_tokens\": 57}}\n\n",
            "data: [DONE]\n\n",
        )
        .as_bytes();
        for split in 0..stream.len() {
            let (a, b) = stream.split_at(split);
            assert_eq!(
                report("text/event-stream", &[a, b], 1024),
                Ok(57),
                "{split}"
            );
        }
        let one_byte_at_a_time: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(
            report("text/event-stream", &one_byte_at_a_time, 1024),
            Ok(57)
        );
        assert_eq!(
            report(
                "text/event-stream",
                &[b"data: {\"usage\": {\"total_tokens\": 3}}"],
                1024
            ),
            Ok(3),
            "a last event without its blank line"
        );
        assert_eq!(
            report("text/event-stream", &[b"data: {\"a\": 1}\n\n"], 1024),
            Err(NoReport::Missing)
        );
        assert_eq!(
            report(
                "text/event-stream",
                &[b"data: {\"usage\": {\"total_tokens\": 9}}\n\ndata: {\"usage\": {\"total_tokens\": \"x\"}}\n\n"],
                1024
            ),
            Err(NoReport::Invalid),
            "the last report wins, bad or not"
        );
        // Only the current event is kept: a long stream of small events stays within the bound.
        let mut r = BodyReport::new(b"text/event-stream", &path("usage.total_tokens"), 64).unwrap();
        for _ in 0..10_000 {
            r.feed(b"data: {\"choices\": [{\"delta\": \"abc\"}]}\n\n");
        }
        r.feed(b"data: {\"usage\": {\"total_tokens\": 99}}\n\n");
        assert_eq!(r.end(), Ok(99));
        assert_eq!(
            report("text/event-stream", &[&[b'x'; 100]], 64),
            Err(NoReport::TooLarge),
            "a line past the bound"
        );
    }

    #[test]
    fn json_paths_are_dotted_keys() {
        assert_eq!(
            CostFrom::json_path("usage.total_tokens"),
            Ok(CostFrom::Json(
                vec!["usage".into(), "total_tokens".into()].into()
            ))
        );
        for bad in ["", ".a", "a.", "a..b"] {
            assert!(CostFrom::json_path(bad).is_err(), "{bad:?}");
        }
    }
}
