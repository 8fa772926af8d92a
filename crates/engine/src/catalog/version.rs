//! version: ordering catalog versions by their `released` time (RFC 3339).
//!
//! A poller must never go back to an older catalog (a stale server replica, a cache). Versions are
//! compared by `released`; when either side has no parseable `released`, they cannot be ordered and
//! the newer-looking one (different hash) is accepted. Pure.

use super::CatalogVersion;

/// Parses an RFC 3339 time (`2020-04-12T23:20:50.52Z`, `...+02:00`) into nanoseconds since the
/// Unix epoch; `None` for anything that is not a real instant (31 February included).
pub fn parse_rfc3339(s: &str) -> Option<i128> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_nanosecond())
}

/// Formats Unix seconds as RFC 3339 in UTC (`2026-11-21T10:00:00Z`).
pub fn format_rfc3339(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_default()
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
            "2021-02-31T00:00:00Z",
            "2021-04-31T00:00:00Z",
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
            -1,
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
