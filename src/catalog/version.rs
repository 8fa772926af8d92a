//! version: ordering catalog versions by their `released` time (RFC 3339).
//!
//! A poller must never go back to an older catalog (a stale server replica, a cache). Versions are
//! compared by `released`; when either side has no parseable `released`, they cannot be ordered and
//! the newer-looking one (different hash) is accepted. Pure.

use super::CatalogVersion;

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into nanoseconds since the Unix epoch.
pub fn parse_rfc3339(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: i128 = 0;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() {
            return None;
        }
        let padded = format!("{:0<9}", &digits[..digits.len().min(9)]);
        nanos = padded.parse().ok()?;
    }
    let offset_s: i64 = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let o = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if *sign == b'+' { o } else { -o }
        }
        _ => return None,
    };
    // Days from civil date (Howard Hinnant's algorithm).
    let (yy, mm) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * mm + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(i128::from(secs) * 1_000_000_000 + nanos)
}

/// Formats Unix seconds as RFC 3339 in UTC (`2026-11-21T10:00:00Z`).
pub fn format_rfc3339(unix: i64) -> String {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

impl CatalogVersion {
    /// True when `self` was released strictly before `other`; false when it was not or when the
    /// two cannot be ordered.
    pub fn is_older_than(&self, other: &CatalogVersion) -> bool {
        let when = |v: &CatalogVersion| v.released.as_deref().and_then(parse_rfc3339);
        matches!((when(self), when(other)), (Some(a), Some(b)) if a < b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2020-04-12T23:20:50.52Z"),
            Some(1_586_733_650_520_000_000)
        );
        assert_eq!(
            parse_rfc3339("2020-04-13T01:20:50.52+02:00"),
            Some(1_586_733_650_520_000_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-21T00:00:00Z"),
            Some(1_795_219_200 * 1_000_000_000)
        );
        for bad in [
            "",
            "2020-04-12",
            "2020-13-01T00:00:00Z",
            "2020-04-12T23:20:50",
            "2020-04-12T23:20:50.Z",
            "x020-04-12T23:20:50Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_and_parses_back() {
        for t in [
            0,
            1_586_733_650,
            1_795_219_200,
            951_782_400, /* 2000-02-29 */
        ] {
            let s = format_rfc3339(t);
            assert_eq!(
                parse_rfc3339(&s),
                Some(i128::from(t) * 1_000_000_000),
                "{s}"
            );
        }
        assert_eq!(format_rfc3339(1_795_219_200), "2026-11-21T00:00:00Z");
    }

    #[test]
    fn orders_by_release_time() {
        let v = |r: Option<&str>| CatalogVersion {
            semver: String::new(),
            hash: String::new(),
            released: r.map(str::to_owned),
        };
        assert!(v(Some("2020-01-01T00:00:00Z")).is_older_than(&v(Some("2020-01-01T00:00:01Z"))));
        assert!(!v(Some("2020-01-01T00:00:01Z")).is_older_than(&v(Some("2020-01-01T00:00:00Z"))));
        assert!(
            !v(None).is_older_than(&v(Some("2020-01-01T00:00:00Z"))),
            "unordered: not older"
        );
    }
}
