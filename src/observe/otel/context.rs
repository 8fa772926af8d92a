//! context: W3C Trace Context (`traceparent`) read and written, and the sampling decision. Pure.
//!
//! <https://www.w3.org/TR/trace-context/#traceparent-header>: `00-<32 hex trace id>-<16 hex parent
//! id>-<2 hex flags>`, lower-case; all-zero ids are invalid; a later version may append fields
//! after a `-`, and version `ff` is invalid. A header that does not parse is ignored, as if absent.

/// The caller's span, from its `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller records this trace (flag `01`).
    pub sampled: bool,
}

/// The `traceparent` of `value`, if it is one.
pub fn parse(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 || (value.len() > 55 && value[55] != b'-') {
        return None;
    }
    let [v0, v1, b'-'] = value[..3] else {
        return None;
    };
    let version = hex_byte(v0, v1)?;
    if version == 0xff || (version == 0 && value.len() != 55) {
        return None;
    }
    if value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    hex_into(&value[3..35], &mut trace_id)?;
    hex_into(&value[36..52], &mut span_id)?;
    let flags = hex_byte(value[53], value[54])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// A version-00 `traceparent` naming `span_id` of `trace_id`, sampled.
pub fn format(trace_id: &[u8; 16], span_id: &[u8; 8]) -> String {
    let mut out = String::with_capacity(55);
    out.push_str("00-");
    push_hex(&mut out, trace_id);
    out.push('-');
    push_hex(&mut out, span_id);
    out.push_str("-01");
    out
}

/// The threshold of [`sampled_by_ratio`] for `ratio` (0 to 1).
pub fn threshold(ratio: f64) -> u64 {
    match ratio {
        r if r >= 1.0 => u64::MAX,
        r if r > 0.0 => (r * u64::MAX as f64) as u64,
        _ => 0,
    }
}

/// Whether a new trace is recorded: its id's last 8 bytes, as a number, fall below `threshold`
/// (as OpenTelemetry's `TraceIdRatioBased`: the same id gives the same answer everywhere).
pub fn sampled_by_ratio(trace_id: &[u8; 16], threshold: u64) -> bool {
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    threshold == u64::MAX || u64::from_be_bytes(low) < threshold
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(hi: u8, lo: u8) -> Option<u8> {
    Some(hex_digit(hi)? << 4 | hex_digit(lo)?)
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = hex_byte(pair[0], pair[1])?;
    }
    Some(())
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_reads_and_writes_back() {
        let p = parse(EXAMPLE.as_bytes()).unwrap();
        assert!(p.sampled);
        assert_eq!(p.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert_eq!(format(&p.trace_id, &p.span_id), EXAMPLE);
        let unsampled = parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn invalid_headers_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736x00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad}");
        }
        // A later version may add fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(parse(later.as_bytes()).is_some());
    }

    #[test]
    fn ratios_sample_their_share_of_ids() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(1.0), u64::MAX);
        let t = threshold(0.25);
        let mut rng = fastrand::Rng::with_seed(7);
        let n = 40_000;
        let sampled = (0..n)
            .filter(|_| sampled_by_ratio(&rng.u128(..).to_be_bytes(), t))
            .count();
        assert!((9_000..11_000).contains(&sampled), "{sampled} of {n}");
        assert!(!sampled_by_ratio(&[0xff; 16], threshold(0.0)));
        assert!(sampled_by_ratio(&[0xff; 16], threshold(1.0)));
    }
}
