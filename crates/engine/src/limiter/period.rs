//! period: the periods a calendar quota counts in: the hour, the day, the ISO week
//! (from Monday) or the month that holds an instant, in an IANA time zone. Pure: the zone's rules
//! come from the time zone database compiled into the binary (jiff's bundled copy), so every
//! instance computes the same boundaries whatever its host has installed.
//!
//! Periods are counted as they are: a day is 23 or 25 hours around a daylight-saving change, a
//! month 28 to 31 days. A day, week or month starts at its first instant (midnight, or the first
//! time that exists when midnight is skipped); an hour at its local `:00`, keeping the offset of
//! the instant asked about, so that an hour repeated when clocks go back is two periods.

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};

/// A calendar quota's period: `"period"` in the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Hour,
    Day,
    /// ISO weeks: Monday 00:00 to the next Monday 00:00.
    Week,
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// The period [`Period::as_str`] names.
    pub fn parse(name: &str) -> Option<Period> {
        [Period::Hour, Period::Day, Period::Week, Period::Month]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

/// The zone called `name` (an IANA name such as `Europe/Berlin`, or `UTC`), if the database
/// knows it.
pub fn zone(name: &str) -> Option<TimeZone> {
    TimeZone::get(name).ok()
}

/// A time zone a limit counts in, as a small number: a [`super::Limit`] stays 16 bytes (a
/// catalog holds millions of them). The number indexes a table of the zones this process has
/// met, which only grows by names the time zone database knows (a few hundred at most), so no
/// input can grow it without bound. Numbers are this process's own: never stored or sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ZoneId(u16);

/// The zones met so far, [`ZoneId`] `i` at index `i`; UTC is 0.
static ZONES: std::sync::RwLock<Vec<(Box<str>, TimeZone)>> = std::sync::RwLock::new(Vec::new());

fn zones_read() -> std::sync::RwLockReadGuard<'static, Vec<(Box<str>, TimeZone)>> {
    ZONES.read().unwrap_or_else(|e| e.into_inner())
}

impl ZoneId {
    /// UTC, the default zone.
    pub const UTC: ZoneId = ZoneId(0);

    /// The zone called `name`, if the time zone database knows it (`None` names an unknown zone).
    pub fn of(name: &str) -> Option<ZoneId> {
        if name == "UTC" {
            return Some(ZoneId::UTC);
        }
        if let Some(i) = zones_read().iter().position(|(n, _)| &**n == name) {
            return Some(ZoneId(i as u16 + 1));
        }
        let tz = zone(name)?;
        let mut all = ZONES.write().unwrap_or_else(|e| e.into_inner());
        // Another thread may have added it meanwhile.
        let i = match all.iter().position(|(n, _)| &**n == name) {
            Some(i) => i,
            None => {
                all.push((name.into(), tz));
                all.len() - 1
            }
        };
        // The database holds fewer than 65,535 names.
        u16::try_from(i + 1).ok().map(ZoneId)
    }

    /// The zone's name, as the catalog wrote it.
    pub fn name(self) -> String {
        match self.0 {
            0 => "UTC".to_owned(),
            i => zones_read()
                .get(usize::from(i) - 1)
                .map_or_else(|| "UTC".to_owned(), |(n, _)| n.to_string()),
        }
    }

    fn tz(self) -> TimeZone {
        match self.0 {
            0 => TimeZone::UTC,
            i => zones_read()
                .get(usize::from(i) - 1)
                .map_or(TimeZone::UTC, |(_, tz)| tz.clone()),
        }
    }

    /// [`span`] in this zone.
    pub fn span(self, period: Period, now_ms: u64) -> Option<(u64, u64)> {
        span(period, &self.tz(), now_ms)
    }
}

/// The period of `period` in `tz` that holds `now_ms` (Unix milliseconds): its first instant and
/// the first instant of the next (Unix milliseconds). `None` only outside the years jiff knows
/// (-9999 to 9999).
pub fn span(period: Period, tz: &TimeZone, now_ms: u64) -> Option<(u64, u64)> {
    let now = Timestamp::from_millisecond(i64::try_from(now_ms).ok()?)
        .ok()?
        .to_zoned(tz.clone());
    let (start, end) = match period {
        Period::Hour => {
            let start = hour_start(&now)?;
            // The next local :00 after it: an hour later in absolute time, unless the offset
            // moved by less than an hour meanwhile (Lord Howe's 30 minutes).
            let later = start
                .timestamp()
                .checked_add(1.hour())
                .ok()?
                .to_zoned(tz.clone());
            (start.timestamp(), hour_start(&later)?.timestamp())
        }
        Period::Day => {
            let day = now.date();
            (
                first_instant(day, tz)?,
                first_instant(day.tomorrow().ok()?, tz)?,
            )
        }
        Period::Week => {
            let day = now.date();
            let back = i64::from(day.weekday().to_monday_zero_offset());
            let monday = day.checked_sub(back.days()).ok()?;
            let next = monday.checked_add(7.days()).ok()?;
            (first_instant(monday, tz)?, first_instant(next, tz)?)
        }
        Period::Month => {
            let first = now.date().first_of_month();
            let next = first.checked_add(1.month()).ok()?;
            (first_instant(first, tz)?, first_instant(next, tz)?)
        }
    };
    let ms = |t: Timestamp| u64::try_from(t.as_millisecond()).ok();
    Some((ms(start)?, ms(end)?))
}

/// The period of `period` in `zone` holding `now_ms`; outside the years the database knows
/// (never with a real clock), the second holding it.
///
/// Asked on every decision of a calendar limit (its headers, its Redis keys): the periods found
/// last are kept per thread, so that the time zone arithmetic runs about once per period.
pub fn period_bounds(period: Period, zone: ZoneId, now_ms: u64) -> (u64, u64) {
    /// (period, zone, start, end) of the periods found last on this thread, newest first.
    type Found = [(Period, ZoneId, u64, u64); FOUND];
    const FOUND: usize = 4;
    thread_local! {
        static LAST: std::cell::Cell<Found> =
            const { std::cell::Cell::new([(Period::Hour, ZoneId::UTC, 0, 0); FOUND]) };
    }
    let mut found = LAST.get();
    if let Some(&(_, _, start, end)) = found
        .iter()
        .find(|&&(p, z, start, end)| (p, z) == (period, zone) && (start..end).contains(&now_ms))
    {
        return (start, end);
    }
    let (start, end) = zone.span(period, now_ms).unwrap_or_else(|| {
        let start = now_ms - now_ms % 1000;
        (start, start + 1000)
    });
    found.rotate_right(1);
    found[0] = (period, zone, start, end);
    LAST.set(found);
    (start, end)
}

/// The local `:00` of `z`'s hour, in `z`'s offset where that time exists in it.
fn hour_start(z: &Zoned) -> Option<Zoned> {
    z.with()
        .minute(0)
        .second(0)
        .subsec_nanosecond(0)
        .build()
        .ok()
}

/// The first instant of `day` in `tz`: midnight, or the first time that exists when it is skipped.
fn first_instant(day: jiff::civil::Date, tz: &TimeZone) -> Option<Timestamp> {
    Some(
        day.to_zoned(tz.clone())
            .ok()?
            .start_of_day()
            .ok()?
            .timestamp(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of an RFC 3339 instant.
    fn ms(rfc3339: &str) -> u64 {
        let t: Timestamp = rfc3339.parse().unwrap();
        u64::try_from(t.as_millisecond()).unwrap()
    }

    fn hours(a: u64, b: u64) -> f64 {
        (b - a) as f64 / 3_600_000.0
    }

    fn of(period: Period, zone_name: &str, at: &str) -> (u64, u64) {
        span(period, &zone(zone_name).unwrap(), ms(at)).unwrap()
    }

    #[test]
    fn days_around_daylight_saving_changes_are_23_and_25_hours() {
        // Los Angeles: clocks go forward on 2024-03-10 at 02:00, back on 2024-11-03 at 02:00.
        let (a, b) = of(
            Period::Day,
            "America/Los_Angeles",
            "2024-03-10T12:00:00-07:00",
        );
        assert_eq!(
            (a, b),
            (
                ms("2024-03-10T00:00:00-08:00"),
                ms("2024-03-11T00:00:00-07:00")
            )
        );
        assert_eq!(hours(a, b), 23.0);
        let (a, b) = of(
            Period::Day,
            "America/Los_Angeles",
            "2024-11-03T23:59:59-08:00",
        );
        assert_eq!(
            (a, b),
            (
                ms("2024-11-03T00:00:00-07:00"),
                ms("2024-11-04T00:00:00-08:00")
            )
        );
        assert_eq!(hours(a, b), 25.0);
        // Berlin: forward on 2024-03-31 at 02:00, back on 2024-10-27 at 03:00.
        let (a, b) = of(Period::Day, "Europe/Berlin", "2024-03-31T01:30:00+01:00");
        assert_eq!(
            (a, b),
            (
                ms("2024-03-31T00:00:00+01:00"),
                ms("2024-04-01T00:00:00+02:00")
            )
        );
        assert_eq!(hours(a, b), 23.0);
        let (a, b) = of(Period::Day, "Europe/Berlin", "2024-10-27T02:30:00+01:00");
        assert_eq!(hours(a, b), 25.0);
        // An ordinary day, and the instant of midnight itself belongs to the day it starts.
        let (a, b) = of(Period::Day, "UTC", "2024-05-01T00:00:00Z");
        assert_eq!(
            (a, b),
            (ms("2024-05-01T00:00:00Z"), ms("2024-05-02T00:00:00Z"))
        );
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_at_its_first_instant() {
        // São Paulo went from 23:59:59 to 01:00 on 2018-11-04.
        let (a, b) = of(
            Period::Day,
            "America/Sao_Paulo",
            "2018-11-04T12:00:00-02:00",
        );
        assert_eq!(
            (a, b),
            (
                ms("2018-11-04T01:00:00-02:00"),
                ms("2018-11-05T00:00:00-02:00")
            )
        );
    }

    #[test]
    fn months_are_28_to_31_days_and_february_knows_leap_years() {
        let days = |at: &str| {
            let (a, b) = of(Period::Month, "UTC", at);
            (b - a) / 86_400_000
        };
        assert_eq!(days("2024-02-15T00:00:00Z"), 29);
        assert_eq!(days("2023-02-28T23:59:59Z"), 28);
        assert_eq!(days("2100-02-01T00:00:00Z"), 28, "not a leap year");
        assert_eq!(days("2000-02-01T00:00:00Z"), 29, "a leap year");
        assert_eq!(days("2024-04-30T12:00:00Z"), 30);
        assert_eq!(days("2024-12-31T23:59:59Z"), 31);
        // A month in a zone starts at its local midnight; October in Berlin has 31 days and an
        // hour more.
        let (a, b) = of(Period::Month, "Europe/Berlin", "2024-10-15T12:00:00+02:00");
        assert_eq!(
            (a, b),
            (
                ms("2024-10-01T00:00:00+02:00"),
                ms("2024-11-01T00:00:00+01:00")
            )
        );
        assert_eq!(hours(a, b), 31.0 * 24.0 + 1.0);
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2024-01-01 was a Monday; the Sunday after is in its week, the Monday after starts the
        // next.
        let week = |at: &str| of(Period::Week, "UTC", at);
        let first = (ms("2024-01-01T00:00:00Z"), ms("2024-01-08T00:00:00Z"));
        assert_eq!(week("2024-01-01T00:00:00Z"), first);
        assert_eq!(week("2024-01-07T23:59:59Z"), first);
        assert_eq!(week("2024-01-08T00:00:00Z").0, first.1);
        // A week across a year's end (ISO week 1 of 2025 starts on 2024-12-30).
        assert_eq!(week("2025-01-01T12:00:00Z").0, ms("2024-12-30T00:00:00Z"));
        // The week that holds a change of clocks is an hour short.
        let (a, b) = of(Period::Week, "Europe/Berlin", "2024-03-31T12:00:00+02:00");
        assert_eq!(hours(a, b), 7.0 * 24.0 - 1.0);
    }

    #[test]
    fn zones_far_from_utc_have_their_own_dates() {
        // Kiritimati is UTC+14, Pago Pago UTC-11: at 2024-06-01T10:00Z one is on June 2nd,
        // the other still on June 1st.
        let at = "2024-06-01T10:00:00Z";
        let (a, _) = of(Period::Day, "Pacific/Kiritimati", at);
        assert_eq!(a, ms("2024-06-02T00:00:00+14:00"));
        let (a, _) = of(Period::Day, "Pacific/Pago_Pago", at);
        assert_eq!(a, ms("2024-05-31T00:00:00-11:00"));
        // The last instant of a month in UTC is already next month in Kiritimati.
        let (a, b) = of(Period::Month, "Pacific/Kiritimati", "2024-06-30T23:00:00Z");
        assert_eq!(
            (a, b),
            (
                ms("2024-07-01T00:00:00+14:00"),
                ms("2024-08-01T00:00:00+14:00")
            )
        );
    }

    #[test]
    fn hours_are_an_hour_across_changes_of_clocks_and_a_repeated_hour_is_two() {
        let hour = |at: &str| of(Period::Hour, "America/Los_Angeles", at);
        // Clocks go back at 02:00 PDT to 01:00 PST: 01:00-02:00 happens twice, as two hours.
        let first = hour("2024-11-03T01:30:00-07:00");
        let second = hour("2024-11-03T01:30:00-08:00");
        assert_eq!(
            first,
            (
                ms("2024-11-03T01:00:00-07:00"),
                ms("2024-11-03T01:00:00-08:00")
            )
        );
        assert_eq!(
            second,
            (
                ms("2024-11-03T01:00:00-08:00"),
                ms("2024-11-03T02:00:00-08:00")
            )
        );
        // Clocks go forward at 02:00 PST to 03:00 PDT: the hour after 01:00 is 03:00.
        let (a, b) = hour("2024-03-10T01:59:59-08:00");
        assert_eq!(
            (a, b),
            (
                ms("2024-03-10T01:00:00-08:00"),
                ms("2024-03-10T03:00:00-07:00")
            )
        );
        assert_eq!(hours(a, b), 1.0);
        // A zone half an hour off UTC has its hours on its own :00.
        let (a, _) = of(Period::Hour, "Asia/Kolkata", "2024-06-01T10:00:00Z");
        assert_eq!(a, ms("2024-06-01T15:00:00+05:30"));
    }

    #[test]
    fn zone_ids_name_their_zone_and_count_in_it() {
        let berlin = ZoneId::of("Europe/Berlin").unwrap();
        assert_eq!(ZoneId::of("Europe/Berlin"), Some(berlin), "met once");
        assert_ne!(berlin, ZoneId::UTC);
        assert_eq!(berlin.name(), "Europe/Berlin");
        assert_eq!(ZoneId::of("UTC"), Some(ZoneId::UTC));
        assert_eq!(ZoneId::UTC.name(), "UTC");
        assert_eq!(ZoneId::of("Mars/Olympus_Mons"), None);
        assert_eq!(
            berlin.span(Period::Day, ms("2024-06-01T12:00:00Z")),
            Some((ms("2024-05-31T22:00:00Z"), ms("2024-06-01T22:00:00Z")))
        );
    }

    #[test]
    fn unknown_zones_are_none_and_periods_read_as_lowercase_names() {
        assert!(zone("Mars/Olympus_Mons").is_none());
        assert!(zone("UTC").is_some());
        let p: Period = serde_json::from_str(r#""month""#).unwrap();
        assert_eq!((p, p.as_str()), (Period::Month, "month"));
        assert!(serde_json::from_str::<Period>(r#""year""#).is_err());
    }
}
