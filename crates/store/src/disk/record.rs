//! record: how the embedded store's files are laid out, pure (no I/O).
//!
//! Both files are a run of frames: `[length u32][crc32 u32][payload]`, little-endian, the CRC
//! over the payload. A log frame is one commit (every record appended between two fsyncs), so a
//! commit is on disk whole or not at all; a snapshot is frames of entries ended by one `End`
//! frame, so a snapshot cut short is told from a whole one.

use quotagate_engine::limiter::{Period, Tally, Window, WindowSet, ZoneId};

/// A frame's header: its payload's length and CRC.
pub const FRAME_HEADER: usize = 8;
/// No frame is longer (a commit larger than this is cut into several): a length read from a
/// damaged file cannot ask for more memory than this.
pub const MAX_FRAME: usize = 16 << 20;

/// No time a record holds is later than 9999-12-31 (Unix milliseconds): a damaged file's
/// number cannot overflow the window arithmetic.
pub const MAX_MS: u64 = 253_402_300_799_999;

/// The first bytes of a snapshot file, naming the format.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"QGSNAP1\n";
/// The first bytes of a log file.
pub const LOG_MAGIC: &[u8; 8] = b"QGLOG01\n";

const GRANT: u8 = 1;
const FIXED_GRANT: u8 = 2;
const FORGET: u8 = 3;
const COUNTER: u8 = 4;
const FIXED: u8 = 5;
/// The tag of [`Record::End`], a snapshot's last record ([`END_LEN`] bytes).
pub const END: u8 = 6;
/// The bytes of a [`Record::End`].
pub const END_LEN: usize = 26;
const RESTART: u8 = 7;

/// What a counter's record says about the units it may have spent (`cover.rs` keeps it true:
/// every unit admitted is in some record's `spent`, or in the last record's `open + reserve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Claim {
    /// Units spent since the counter's previous record, at or before `at_ms`.
    pub spent: u64,
    /// Units of earlier reservations not spent yet, and units reserved by this record: both may
    /// be spent until `until_ms`.
    pub open: u64,
    pub reserve: u64,
    pub at_ms: u64,
    pub until_ms: u64,
}

/// One record of the log, or one entry of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A sliding counter (windows and calendar tallies): its claim, and the window lengths and
    /// tallies its units count in.
    Grant {
        key: String,
        claim: Claim,
        windows: Vec<u32>,
        tallies: Vec<(Period, ZoneId)>,
    },
    /// A fixed window (`limit` units until Unix second `expires`).
    FixedGrant {
        name: String,
        limit: u64,
        expires: u64,
        claim: Claim,
    },
    /// Every sliding counter whose name starts with `prefix` was forgotten (an admin's reset).
    Forget { prefix: String },
    /// A snapshot's sliding counter: its windows and tallies as they were, and `outstanding` units
    /// reserved and perhaps spent since, until `until_ms`.
    Counter {
        key: String,
        set: WindowSet,
        outstanding: u64,
        until_ms: u64,
    },
    /// A snapshot's fixed window: `credit` left (outstanding units already taken) until `expires`.
    Fixed {
        name: String,
        credit: u64,
        expires: u64,
    },
    /// A process started from the files at `at_ms`: every claim before it is spent by then.
    Restart { at_ms: u64 },
    /// A snapshot's last record: the log generation that follows it, how many entries it holds
    /// (`fixed` of them fixed windows, written after the sliding counters), and whether it was
    /// written at a clean stop.
    End {
        next_log: u64,
        entries: u64,
        fixed: u64,
        clean: bool,
    },
}

/// Why bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Appends one frame holding `payload`.
pub fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// What the bytes at the start of `buf` are.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole frame whose CRC holds: its payload, and the bytes it took.
    Whole(&'a [u8], usize),
    /// Fewer bytes than the frame says it has.
    Short,
    /// A length above [`MAX_FRAME`] or a CRC that does not hold.
    Bad,
}

pub fn read_frame(buf: &[u8]) -> Frame<'_> {
    if buf.len() < FRAME_HEADER {
        return Frame::Short;
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap_or_default());
    if len > MAX_FRAME {
        return Frame::Bad;
    }
    let Some(payload) = buf.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Frame::Short;
    };
    if crc32fast::hash(payload) != crc {
        return Frame::Bad;
    }
    Frame::Whole(payload, FRAME_HEADER + len)
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Names are bounded well below 64 KiB (a catalog key, an endpoint, a descriptor).
    let len = s.len().min(usize::from(u16::MAX));
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..len]);
}

fn put_claim(out: &mut Vec<u8>, c: &Claim) {
    for v in [c.spent, c.open, c.reserve, c.at_ms, c.until_ms] {
        put_u64(out, v);
    }
}

fn put_tally_name(out: &mut Vec<u8>, period: Period, zone: ZoneId) {
    out.push(period_code(period));
    match zone == ZoneId::UTC {
        true => put_str(out, "UTC"),
        false => put_str(out, &zone.name()),
    }
}

fn period_code(p: Period) -> u8 {
    match p {
        Period::Hour => 0,
        Period::Day => 1,
        Period::Week => 2,
        Period::Month => 3,
    }
}

impl Record {
    /// Appends the record's bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Grant {
                key,
                claim,
                windows,
                tallies,
            } => put_grant(
                out,
                key,
                claim,
                windows.iter().copied(),
                tallies.iter().copied(),
            ),
            Record::FixedGrant {
                name,
                limit,
                expires,
                claim,
            } => encode_fixed_grant(out, name, *limit, *expires, claim),
            Record::Forget { prefix } => {
                out.push(FORGET);
                put_str(out, prefix);
            }
            Record::Counter {
                key,
                set,
                outstanding,
                until_ms,
            } => encode_counter(out, key, set, *outstanding, *until_ms),
            Record::Fixed {
                name,
                credit,
                expires,
            } => encode_fixed(out, name, *credit, *expires),
            Record::Restart { at_ms } => {
                out.push(RESTART);
                put_u64(out, *at_ms);
            }
            Record::End {
                next_log,
                entries,
                fixed,
                clean,
            } => {
                out.push(END);
                put_u64(out, *next_log);
                put_u64(out, *entries);
                put_u64(out, *fixed);
                out.push(u8::from(*clean));
            }
        }
    }

    /// The records in one frame's payload, in order.
    pub fn decode_all(mut payload: &[u8]) -> Result<Vec<Record>, Malformed> {
        let mut out = Vec::new();
        while !payload.is_empty() {
            out.push(Record::decode(&mut payload)?);
        }
        Ok(out)
    }

    /// The record at the start of `buf`, moving `buf` past it.
    pub fn decode(buf: &mut &[u8]) -> Result<Record, Malformed> {
        let mut r = Reader(buf);
        let record = match r.u8()? {
            GRANT => {
                let key = r.str()?;
                let claim = r.claim()?;
                let windows: Vec<u32> = (0..r.u8()?).map(|_| r.u32()).collect::<Result<_, _>>()?;
                if windows
                    .iter()
                    .any(|&w| w == 0 || w > quotagate_engine::limiter::MAX_WINDOW_SECONDS)
                {
                    return Err(Malformed("a window of 0 s or longer than a limit may be"));
                }
                let tallies = (0..r.u8()?)
                    .map(|_| r.tally_name())
                    .collect::<Result<_, _>>()?;
                Record::Grant {
                    key,
                    claim,
                    windows,
                    tallies,
                }
            }
            FIXED_GRANT => Record::FixedGrant {
                name: r.str()?,
                limit: r.u64()?,
                expires: r.seconds()?,
                claim: r.claim()?,
            },
            FORGET => Record::Forget { prefix: r.str()? },
            COUNTER => {
                let key = r.str()?;
                let outstanding = r.u64()?;
                let until_ms = r.ms()?;
                let mut windows = Vec::new();
                for _ in 0..r.u8()? {
                    let w = r.u32()?;
                    // Buckets are at least 100 ms long.
                    let last = r.u64()?;
                    if last > MAX_MS / 100 {
                        return Err(Malformed("a bucket past the year 9999"));
                    }
                    let n = r.u16()?;
                    let mut held = Vec::with_capacity(usize::from(n));
                    for _ in 0..n {
                        let back = u64::from(r.u32()?);
                        let c = r.u32()?;
                        held.push((last.checked_sub(back).ok_or(Malformed("bucket"))?, c));
                    }
                    if w == 0 || w > quotagate_engine::limiter::MAX_WINDOW_SECONDS {
                        return Err(Malformed("a window of 0 s or longer than a limit may be"));
                    }
                    windows.push(Window::from_counts(w, last, held));
                }
                let mut tallies = Vec::new();
                for _ in 0..r.u8()? {
                    let (period, zone) = r.tally_name()?;
                    let start_ms = r.ms()?;
                    let count = r.u64()?;
                    tallies.push(Tally::holding(period, zone, start_ms, count));
                }
                Record::Counter {
                    key,
                    set: WindowSet::from_windows(windows).with_tallies(tallies),
                    outstanding,
                    until_ms,
                }
            }
            FIXED => Record::Fixed {
                name: r.str()?,
                credit: r.u64()?,
                expires: r.seconds()?,
            },
            END => Record::End {
                next_log: r.u64()?,
                entries: r.u64()?,
                fixed: r.u64()?,
                clean: r.u8()? == 1,
            },
            RESTART => Record::Restart { at_ms: r.ms()? },
            _ => return Err(Malformed("unknown record")),
        };
        *buf = r.0;
        Ok(record)
    }
}

fn put_grant(
    out: &mut Vec<u8>,
    key: &str,
    claim: &Claim,
    windows: impl ExactSizeIterator<Item = u32>,
    tallies: impl ExactSizeIterator<Item = (Period, ZoneId)>,
) {
    out.push(GRANT);
    put_str(out, key);
    put_claim(out, claim);
    out.push(windows.len().min(255) as u8);
    for w in windows.take(255) {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.push(tallies.len().min(255) as u8);
    for (p, z) in tallies.take(255) {
        put_tally_name(out, p, z);
    }
}

/// A sliding counter's record ([`Record::Grant`]) of `claim`, its windows and tallies `set`'s,
/// written from where they lie (a record is written on every few admitted units of a busy
/// counter).
pub fn encode_grant(out: &mut Vec<u8>, key: &str, claim: &Claim, set: &WindowSet) {
    put_grant(
        out,
        key,
        claim,
        set.windows().iter().map(|w| w.seconds()),
        set.tallies().iter().map(|t| (t.period(), t.zone())),
    );
}

/// A fixed window's record ([`Record::FixedGrant`]).
pub fn encode_fixed_grant(out: &mut Vec<u8>, name: &str, limit: u64, expires: u64, claim: &Claim) {
    out.push(FIXED_GRANT);
    put_str(out, name);
    put_u64(out, limit);
    put_u64(out, expires);
    put_claim(out, claim);
}

/// A snapshot's sliding counter ([`Record::Counter`]), written from where it lies.
pub fn encode_counter(
    out: &mut Vec<u8>,
    key: &str,
    set: &WindowSet,
    outstanding: u64,
    until_ms: u64,
) {
    out.push(COUNTER);
    put_str(out, key);
    put_u64(out, outstanding);
    put_u64(out, until_ms);
    let windows = set.windows();
    out.push(windows.len().min(255) as u8);
    for w in windows.iter().take(255) {
        out.extend_from_slice(&w.seconds().to_le_bytes());
        put_u64(out, w.last());
        let at = out.len();
        out.extend_from_slice(&[0, 0]);
        let mut n = 0u16;
        for (b, c) in w.held() {
            // Held buckets are within the window's `n` (at most 864,000) of `last`.
            out.extend_from_slice(&((w.last() - b) as u32).to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
            n += 1;
        }
        out[at..at + 2].copy_from_slice(&n.to_le_bytes());
    }
    let tallies = set.tallies();
    out.push(tallies.len().min(255) as u8);
    for t in tallies.iter().take(255) {
        put_tally_name(out, t.period(), t.zone());
        put_u64(out, t.start_ms);
        put_u64(out, t.count);
    }
}

/// A snapshot's fixed window ([`Record::Fixed`]).
pub fn encode_fixed(out: &mut Vec<u8>, name: &str, credit: u64, expires: u64) {
    out.push(FIXED);
    put_str(out, name);
    put_u64(out, credit);
    put_u64(out, expires);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed("cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }

    fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }

    fn str(&mut self) -> Result<String, Malformed> {
        let n = usize::from(self.u16()?);
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| Malformed("name not UTF-8"))
    }

    /// A time in Unix milliseconds (at most [`MAX_MS`]).
    fn ms(&mut self) -> Result<u64, Malformed> {
        match self.u64()? {
            ms if ms <= MAX_MS => Ok(ms),
            _ => Err(Malformed("a time past the year 9999")),
        }
    }

    /// A time in Unix seconds.
    fn seconds(&mut self) -> Result<u64, Malformed> {
        match self.u64()? {
            s if s <= MAX_MS / 1000 => Ok(s),
            _ => Err(Malformed("a time past the year 9999")),
        }
    }

    fn claim(&mut self) -> Result<Claim, Malformed> {
        Ok(Claim {
            spent: self.u64()?,
            open: self.u64()?,
            reserve: self.u64()?,
            at_ms: self.ms()?,
            until_ms: self.ms()?,
        })
    }

    fn tally_name(&mut self) -> Result<(Period, ZoneId), Malformed> {
        let period = match self.u8()? {
            0 => Period::Hour,
            1 => Period::Day,
            2 => Period::Week,
            3 => Period::Month,
            _ => return Err(Malformed("unknown period")),
        };
        // A zone this build's time zone database does not know: its tally cannot be placed,
        // and leaving it out would forget counts.
        let zone = ZoneId::of(&self.str()?).ok_or(Malformed("unknown time zone"))?;
        Ok((period, zone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotagate_engine::limiter::Limit;

    fn round_trip(r: &Record) -> Record {
        let mut bytes = Vec::new();
        r.encode(&mut bytes);
        let mut at = &bytes[..];
        let back = Record::decode(&mut at).unwrap();
        assert!(at.is_empty());
        back
    }

    #[test]
    fn every_record_reads_back_as_written() {
        let claim = Claim {
            spent: 3,
            open: 4,
            reserve: 5,
            at_ms: 6,
            until_ms: 7,
        };
        let berlin = ZoneId::of("Europe/Berlin").unwrap();
        for r in [
            Record::Grant {
                key: "k:GET%20/x".into(),
                claim,
                windows: vec![1, 60],
                tallies: vec![(Period::Month, berlin), (Period::Day, ZoneId::UTC)],
            },
            Record::FixedGrant {
                name: "d|k=v".into(),
                limit: 9,
                expires: 1_700_000_000,
                claim,
            },
            Record::Forget {
                prefix: "k:".into(),
            },
            Record::Fixed {
                name: "n".into(),
                credit: 2,
                expires: 3,
            },
            Record::End {
                next_log: 4,
                entries: 5,
                fixed: 3,
                clean: true,
            },
            Record::Restart { at_ms: 8 },
        ] {
            assert_eq!(round_trip(&r), r);
        }
    }

    #[test]
    fn a_counter_reads_back_with_the_same_windows_and_tallies() {
        let mut set = WindowSet::default();
        let limits = [
            Limit::sliding(100, 60),
            Limit::sliding(100, 1),
            Limit::calendar(1000, Period::Month, ZoneId::of("Asia/Tokyo").unwrap()),
        ];
        let mut now = 1_700_000_000_000u64;
        for i in 0..300 {
            now += 137 * (i % 5);
            set.hit(&limits, 1 + i % 2, now);
        }
        let r = Record::Counter {
            key: "c".into(),
            set: set.clone(),
            outstanding: 7,
            until_ms: now + 5,
        };
        let Record::Counter {
            set: back,
            outstanding,
            until_ms,
            ..
        } = round_trip(&r)
        else {
            panic!("not a counter");
        };
        assert_eq!((outstanding, until_ms), (7, now + 5));
        assert_eq!(back.windows(), set.windows());
        assert_eq!(back.tallies(), set.tallies());
        // Its record, written from where it lies, is the record built apart.
        let claim = Claim {
            spent: 1,
            ..Claim::default()
        };
        let (mut direct, mut built) = (Vec::new(), Vec::new());
        encode_grant(&mut direct, "c", &claim, &set);
        Record::Grant {
            key: "c".into(),
            claim,
            windows: set.windows().iter().map(|w| w.seconds()).collect(),
            tallies: set
                .tallies()
                .iter()
                .map(|t| (t.period(), t.zone()))
                .collect(),
        }
        .encode(&mut built);
        assert_eq!(direct, built);
        // And it answers as the original does.
        assert_eq!(
            back.peek(&limits, 1, now + 500),
            set.peek(&limits, 1, now + 500)
        );
    }

    #[test]
    fn frames_tell_whole_from_short_and_bad() {
        let mut bytes = Vec::new();
        frame(&mut bytes, b"hello");
        assert_eq!(read_frame(&bytes), Frame::Whole(b"hello", 13));
        assert_eq!(read_frame(&bytes[..12]), Frame::Short);
        assert_eq!(read_frame(&bytes[..3]), Frame::Short);
        let mut flipped = bytes.clone();
        flipped[10] ^= 1;
        assert_eq!(read_frame(&flipped), Frame::Bad);
        let mut long = bytes.clone();
        long[3] = 0x7f;
        assert_eq!(read_frame(&long), Frame::Bad, "a length past MAX_FRAME");
    }

    #[test]
    fn bytes_that_are_not_a_record_are_malformed_not_a_panic() {
        let mut bytes = Vec::new();
        Record::Grant {
            key: "k".into(),
            claim: Claim::default(),
            windows: vec![60],
            tallies: vec![(Period::Hour, ZoneId::UTC)],
        }
        .encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert!(Record::decode_all(&bytes[..cut]).is_err() || cut == 0);
        }
        assert!(Record::decode_all(&[99]).is_err());
    }
}
