//! script: what the Redis scripts are given and what they answer, and how the sliding windows lie in
//! Redis' hashes, in one place and without I/O. [`crate::redis`] only sends what this builds and
//! hands back what it received; `window.lua` and `divvy.lua` are the other side of this contract.
//!
//! The layout (`docs/stores.md`): a limit of [`WINDOW_SECONDS`] keeps DynLimits' hash per (counter,
//! minute), field `"<second of the minute>"` = units counted in that second; any other window length
//! `w` has one hash, `<counter>:s<w>`, whose field `"<b mod n>"` holds bucket `b` of its `n`
//! ([`buckets`]). Other fields of both (`c`, `w`, `s`, `o`, `b`, `bl`, `e`) are the script's own
//! bookkeeping and never counts.

use quotagate_engine::limiter::{
    Limit, MAX_LIMITS, Outcome, Quota, Tally, WINDOW_SECONDS, Window, WindowSet, bucket_of,
    buckets, ceil_seconds, period_bounds,
};

use crate::Part;
use crate::keys::{CounterKey, calendar_hash, minute_hash, slots_set, window_hash};

/// TTL of a per-minute hash in seconds (DynLimits: EXPIRE 180). It must outlive the next minute,
/// during which the hash is still read as the previous minute.
pub const MINUTE_HASH_TTL: u64 = 180;

/// The DynLimits window, as the script's argument and as a limit's `w`.
const MINUTE: u32 = WINDOW_SECONDS as u32;

/// The minute (the number in a minute hash's name) of Unix milliseconds `ms`.
pub fn minute_of(ms: i64) -> i64 {
    ms.div_euclid(WINDOW_SECONDS as i64 * 1000)
}

/// The hashes one decision reads and writes, per limit in the order of the limits of its parts
/// (its counters, [`Part`]): for a limit a minute long, its counter's minute hashes m-2 .. m+1
/// (which one is "now" is the script's to say, by Redis' clock); for another window, its hash; for
/// a calendar period, the hash of the one holding the caller's estimate of now (the script refuses
/// to count in another).
pub struct WindowCall<'a> {
    prefix: &'a str,
    parts: &'a [Part<'a>],
    slot: Option<SlotArg<'a>>,
}

/// What a call does with its concurrency limits' slots (`window.lua`'s "A concurrency limit").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotArg<'a> {
    /// Take (a hit) or give back (a give-back) slot `who`; or renew the slots `who` lists,
    /// separated by commas (a call of cost 0).
    pub renew: bool,
    /// The slot's name, unique among every instance's requests in flight.
    pub who: &'a str,
    /// How long a slot is held after its last write, in milliseconds: the time after which the
    /// slot of a request whose instance died is dropped.
    pub hold_ms: u64,
}

impl<'a> WindowCall<'a> {
    /// The call for `parts`, whose hashes are named under `prefix`.
    pub fn new(prefix: &'a str, parts: &'a [Part<'a>]) -> WindowCall<'a> {
        WindowCall {
            prefix,
            parts,
            slot: None,
        }
    }

    /// The call, with `slot` for its concurrency limits (a call with one has it).
    pub fn with_slot(mut self, slot: Option<SlotArg<'a>>) -> WindowCall<'a> {
        self.slot = slot;
        self
    }

    /// The limits of every part, at most [`MAX_LIMITS`], with their counters.
    fn limits(&self) -> impl Iterator<Item = (&'a CounterKey, &'a Limit)> {
        self.parts
            .iter()
            .flat_map(|p| p.limits.iter().map(|l| (p.counter, l)))
            .take(MAX_LIMITS)
    }

    /// The command that runs `window.lua` for one request of `cost` (0: only give `lease` back),
    /// with the caller's estimate of now (`estimate_ms`: it names the minute hashes and the
    /// calendar periods) and, for [`crate::TimeSource::Local`], its own time (`now_ms`; `None`:
    /// Redis' `TIME`). `evalsha(keys, args, bytes)` starts the command: the script's hash and the
    /// number of keys, with room for `args` arguments of `bytes` bytes.
    pub fn command(
        &self,
        cost: u64,
        estimate_ms: i64,
        now_ms: Option<i64>,
        lease: Option<LeaseArgs>,
        evalsha: impl FnOnce(usize, usize, usize) -> redis::Cmd,
    ) -> redis::Cmd {
        let prefix = self.prefix;
        let minute = minute_of(estimate_ms);
        let estimate = u64::try_from(estimate_ms).unwrap_or(0);
        let mut keys: Vec<String> = Vec::with_capacity(4 + MAX_LIMITS);
        // A calendar period's bounds by the estimate, as the script's `w`.
        let mut bounds: [Option<String>; MAX_LIMITS] = Default::default();
        let mut n = 0;
        for (i, (counter, l)) in self.limits().enumerate() {
            n += 1;
            if l.is_concurrent() {
                keys.push(slots_set(prefix, counter));
                // A call without a slot names none: the script then takes or frees nothing.
                let s = self.slot.unwrap_or(SlotArg {
                    renew: true,
                    who: "-",
                    hold_ms: 0,
                });
                let mode = if s.renew { 'r' } else { 'c' };
                bounds[i] = Some(format!("{mode}{}:{}", s.hold_ms, s.who));
            } else if let Some(p) = l.period() {
                let (start, end) = period_bounds(p, l.zone, estimate);
                keys.push(calendar_hash(prefix, counter, p, start));
                bounds[i] = Some(format!("{start}:{end}"));
            } else if l.w == MINUTE {
                keys.extend((0..4).map(|j| minute_hash(prefix, counter, minute - 2 + j)));
            } else {
                keys.push(window_hash(prefix, counter, l.w));
            }
        }
        let key_bytes: usize = keys.iter().map(String::len).sum();
        // Keys, 5 arguments, 3 per limit; numbers of at most 20 digits.
        let mut cmd = evalsha(
            keys.len(),
            keys.len() + 8 + 3 * n,
            key_bytes + 20 * (8 + 3 * n),
        );
        cmd.arg(&keys[..]).arg(minute);
        match now_ms {
            Some(ms) => cmd.arg(ms),
            None => cmd.arg(""),
        };
        cmd.arg(MINUTE_HASH_TTL).arg(cost).arg(n);
        for (i, (_, l)) in self.limits().enumerate() {
            cmd.arg(l.rl);
            match &bounds[i] {
                // `"<start ms>:<end ms>"`: the period the caller named the hash for; or a slot.
                Some(b) => cmd.arg(b.as_str()),
                None => cmd.arg(l.w),
            };
            cmd.arg(u8::from(l.shadow));
        }
        // Absent unless asked: the script's straight line is for calls without them.
        if let Some(l) = lease {
            cmd.arg(l.want).arg(l.give).arg(l.given_at_ms);
        }
        cmd
    }
}

/// A call's lease part (`window.lua`'s "want" and give-back arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseArgs {
    /// Extra units wanted beyond the request's cost (granted: at most half of each window's room
    /// after the cost).
    pub want: u64,
    /// Unused units of an earlier lease to subtract first, from the bucket they were counted in:
    /// the one of `given_at_ms` (the script's time when that lease was counted).
    pub give: u64,
    pub given_at_ms: i64,
}

/// What `window.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
// Read once per call and consumed at once: boxing the decision would allocate per request.
#[allow(clippy::large_enum_variant)]
pub enum WindowReply {
    /// Now's minute was not among the keys: ask again with the minute of `redis_now_ms`.
    WrongMinute { redis_now_ms: i64 },
    /// A give-back alone (cost 0) was done.
    GaveBack { redis_now_ms: i64 },
    /// Decided and counted.
    Decided {
        outcome: Outcome,
        /// Units counted beyond the cost as a lease (the quotas' `remaining` counts them as used).
        grant: u64,
        /// The time the script decided at, Unix milliseconds.
        redis_now_ms: i64,
        /// The microseconds of Redis' `TIME`; `None` when the caller gave the time.
        micros: Option<i64>,
        /// For one refused limit: milliseconds until it passes (0 or less: not known).
        retry_ms: i64,
        /// Each limit's reset in milliseconds (what the quotas round up to seconds).
        resets_ms: [i64; MAX_LIMITS],
        /// Each limit's room: its quota's remaining, and for a limit the cost did not fit (told
        /// as 0), the room it has (`None`: the call did not read it).
        rooms: [Option<u64>; MAX_LIMITS],
    },
}

impl WindowReply {
    /// Reads the script's reply for `limits` (as sent): `"-1 now_ms"`, `"2 now_ms"`, or
    /// `"allowed shadow_limited now_ms usec grant"` then `"fits remaining reset_ms retry_ms"` per
    /// limit. `None` for anything else.
    pub fn read(reply: &str, limits: &[Limit]) -> Option<WindowReply> {
        let mut fields = [0i64; 5 + 4 * MAX_LIMITS];
        match integers(reply, &mut fields) {
            [-1, redis_now_ms] => Some(WindowReply::WrongMinute {
                redis_now_ms: *redis_now_ms,
            }),
            [2, redis_now_ms] => Some(WindowReply::GaveBack {
                redis_now_ms: *redis_now_ms,
            }),
            [
                allowed,
                shadow_limited,
                redis_now_ms,
                micros,
                grant,
                per_limit @ ..,
            ] if per_limit.len() == 4 * limits.len() => {
                let nonneg = |v: i64| u64::try_from(v).unwrap_or(0);
                let mut quotas = [Quota::zero_limit(); MAX_LIMITS];
                let mut resets_ms = [0; MAX_LIMITS];
                let mut rooms = [None; MAX_LIMITS];
                for ((r, room), f) in resets_ms
                    .iter_mut()
                    .zip(&mut rooms)
                    .zip(per_limit.chunks(4))
                {
                    *r = f[2].max(0);
                    *room = u64::try_from(f[1]).ok();
                }
                for (q, (l, f)) in quotas
                    .iter_mut()
                    .zip(limits.iter().zip(per_limit.chunks(4)))
                {
                    let [fits, remaining, reset_ms, retry_ms] = [f[0], f[1], f[2], f[3]];
                    *q = Quota {
                        allowed: fits == 1,
                        limit: l.rl,
                        // A limit without room for the cost tells none, whatever it has.
                        remaining: if fits == 1 { nonneg(remaining) } else { 0 },
                        reset: ceil_seconds(nonneg(reset_ms)),
                        retry_after: (retry_ms >= 0).then(|| ceil_seconds(nonneg(retry_ms))),
                    };
                }
                Some(WindowReply::Decided {
                    outcome: Outcome::new(
                        *allowed == 1,
                        *shadow_limited == 1,
                        &quotas[..limits.len()],
                    ),
                    grant: u64::try_from(*grant).unwrap_or(0),
                    redis_now_ms: *redis_now_ms,
                    micros: (*micros >= 0).then_some(*micros),
                    retry_ms: if limits.len() == 1 { per_limit[3] } else { -1 },
                    resets_ms,
                    rooms,
                })
            }
            _ => None,
        }
    }
}

/// The reads of `limits`' windows of `key` at `now_ms`, in the order [`peek_windows`] reads
/// their replies: `HGETALL` of the previous and the current minute's hash for a minute-long limit,
/// of the limit's own hash for the others; for a concurrency limit, its slots held past now (as
/// member and score pairs, the shape of a hash's fields).
pub fn peek_reads(
    prefix: &str,
    key: &CounterKey,
    limits: &[Limit],
    now_ms: u64,
) -> Vec<redis::Cmd> {
    let minute = minute_of(i64::try_from(now_ms).unwrap_or(i64::MAX / 2));
    let mut reads = Vec::with_capacity(limits.len() + 1);
    let hgetall = |hash: String| {
        let mut c = redis::cmd("HGETALL");
        c.arg(hash);
        c
    };
    for l in limits {
        if l.is_concurrent() {
            let mut c = redis::cmd("ZRANGEBYSCORE");
            // Held until a time after now (the script drops a slot whose time is now).
            c.arg(slots_set(prefix, key))
                .arg(format!("({now_ms}"))
                .arg("+inf")
                .arg("WITHSCORES");
            reads.push(c);
        } else if let Some(p) = l.period() {
            let (start, _) = period_bounds(p, l.zone, now_ms);
            reads.push(hgetall(calendar_hash(prefix, key, p, start)));
        } else if l.w == MINUTE {
            reads.push(hgetall(minute_hash(prefix, key, minute - 1)));
            reads.push(hgetall(minute_hash(prefix, key, minute)));
        } else {
            reads.push(hgetall(window_hash(prefix, key, l.w)));
        }
    }
    reads
}

/// A hash's fields and values, as `HGETALL` gives them.
pub type Fields = Vec<(String, String)>;

/// The windows `limits` have at `now_ms`, from the replies of [`peek_reads`] (a missing reply
/// reads as an empty hash).
pub fn peek_windows(limits: &[Limit], now_ms: u64, replies: Vec<Fields>) -> WindowSet {
    let now = now_ms / 1000;
    let minute = u64::try_from(minute_of(i64::try_from(now_ms).unwrap_or(i64::MAX))).unwrap_or(0);
    let number = |v: &str| v.parse::<u64>().ok();
    let mut replies = replies.into_iter();
    let mut windows = Vec::with_capacity(limits.len());
    let mut tallies = Vec::new();
    let mut in_flight = 0;
    for l in limits {
        if l.is_concurrent() {
            in_flight = replies.next().unwrap_or_default().len() as u64;
        } else if let Some(p) = l.period() {
            let fields = replies.next().unwrap_or_default();
            let count = fields
                .iter()
                .find(|(f, _)| f == "n")
                .and_then(|(_, v)| number(v))
                .unwrap_or(0);
            tallies.push(Tally::holding(p, l.zone, now_ms, count));
        } else if l.w == MINUTE {
            let prev = replies.next().unwrap_or_default();
            let cur = replies.next().unwrap_or_default();
            let base = |m: u64| m * WINDOW_SECONDS;
            // Fields that are not a second of the minute are the script's state.
            let counts = [(base(minute.saturating_sub(1)), prev), (base(minute), cur)]
                .into_iter()
                .flat_map(|(base, fields)| {
                    fields.into_iter().filter_map(move |(f, v)| {
                        let second = number(&f).filter(|s| *s < WINDOW_SECONDS)?;
                        Some((base + second, v.parse().ok()?))
                    })
                });
            windows.push(Window::from_counts(MINUTE, now, counts));
        } else {
            let fields = replies.next().unwrap_or_default();
            let n = buckets(l.w);
            // `c`: the latest bucket the script has seen.
            let latest = fields
                .iter()
                .find(|(f, _)| f == "c")
                .and_then(|(_, v)| number(v))
                .unwrap_or(0);
            // Field `i` holds the bucket b <= latest with b mod n = i.
            let counts = fields.iter().filter_map(|(f, v)| {
                let slot = number(f).filter(|i| *i < n)?;
                let b = latest.checked_sub((latest + n - slot) % n)?;
                Some((b, u32::try_from(number(v)?).ok()?))
            });
            let at = bucket_of(l.w, now_ms).max(latest);
            windows.push(Window::from_counts(l.w, at, counts));
        }
    }
    WindowSet::from_windows(windows)
        .with_tallies(tallies)
        .with_in_flight(in_flight)
}

/// What `divvy.lua` decided: allowed, the credit left, and the window's `TTL` (seconds, rounded to
/// the nearest; see [`quotagate_engine::limiter::fixed_outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedAnswer {
    pub allowed: bool,
    pub credit: u64,
    pub ttl: i64,
}

/// Reads `divvy.lua`'s reply, `"allowed credit ttl"`.
pub fn read_divvy_reply(reply: &str) -> Option<FixedAnswer> {
    let mut fields = [0i64; 3];
    match integers(reply, &mut fields) {
        [allowed, credit, ttl] => Some(FixedAnswer {
            allowed: *allowed == 1,
            credit: u64::try_from(*credit).unwrap_or(0),
            ttl: *ttl,
        }),
        _ => None,
    }
}

/// What `divvy.lua` answered to a call with lease arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedReply {
    /// A give-back alone was done.
    GaveBack,
    /// Decided: `grant` credit taken beyond the cost as a lease (`decision.credit` counts it as
    /// used), from the window that expires at Unix ms `expiry_ms`, `pttl_ms` from Redis' now.
    Decided {
        decision: FixedAnswer,
        grant: u64,
        expiry_ms: i64,
        pttl_ms: i64,
    },
}

/// Reads `divvy.lua`'s reply to a call with lease arguments: `"2"`, or `"allowed credit ttl grant
/// expiry_ms pttl_ms"`.
pub fn read_divvy_lease_reply(reply: &str) -> Option<FixedReply> {
    let mut fields = [0i64; 6];
    match integers(reply, &mut fields) {
        [2] => Some(FixedReply::GaveBack),
        [allowed, credit, ttl, grant, expiry_ms, pttl_ms] => Some(FixedReply::Decided {
            decision: FixedAnswer {
                allowed: *allowed == 1,
                credit: u64::try_from(*credit).unwrap_or(0),
                ttl: *ttl,
            },
            grant: u64::try_from(*grant).unwrap_or(0),
            expiry_ms: *expiry_ms,
            pttl_ms: *pttl_ms,
        }),
        _ => None,
    }
}

/// The space-separated integers of a script's reply, in `out`; the slice of `out` they filled.
/// Anything else (too many, not a number) is an empty slice, which no caller accepts.
fn integers<'a>(reply: &str, out: &'a mut [i64]) -> &'a [i64] {
    let mut n = 0;
    // Bytes, not `str::split` and `parse`: that pair cost about 1.8k instructions per decision.
    for word in reply.as_bytes().split(|&b| b == b' ') {
        match (out.get_mut(n), integer(word)) {
            (Some(slot), Some(v)) => *slot = v,
            _ => return &[],
        }
        n += 1;
    }
    &out[..n]
}

/// A decimal integer with an optional `-`, and nothing else; `None` if it does not fit an `i64`.
fn integer(word: &[u8]) -> Option<i64> {
    let (negative, digits) = match word {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, word),
    };
    if digits.is_empty() {
        return None;
    }
    // Summed as a negative number, so that i64::MIN fits too.
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative { Some(v) } else { v.checked_neg() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_replies_are_read_strictly() {
        let mut out = [0i64; 3];
        assert_eq!(integers("1 41 -1", &mut out), [1, 41, -1]);
        assert_eq!(
            integers("-9223372036854775808 0 9223372036854775807", &mut out),
            [i64::MIN, 0, i64::MAX]
        );
        for bad in [
            "",
            "1  2",
            "1 2 3 4",
            "1 x 2",
            "1.5 2 3",
            "+1 2 3",
            "- 2 3",
            "1 2 9223372036854775808",
            "1 2 3 ",
        ] {
            assert_eq!(integers(bad, &mut out), [] as [i64; 0], "{bad:?}");
        }
    }

    #[test]
    fn window_replies_carry_one_quota_per_limit() {
        let limits = [Limit::per_minute(10)];
        assert_eq!(
            WindowReply::read("-1 1700000000123", &limits),
            Some(WindowReply::WrongMinute {
                redis_now_ms: 1_700_000_000_123
            })
        );
        let Some(WindowReply::Decided {
            outcome,
            micros,
            retry_ms,
            ..
        }) = WindowReply::read("0 0 1700000000123 123456 0 0 0 1500 1500", &limits)
        else {
            panic!("not read");
        };
        assert!(!outcome.allowed);
        assert_eq!(outcome.quotas()[0].retry_after, Some(2));
        assert_eq!((micros, retry_ms), (Some(123_456), 1500));
        // A reply for another number of limits is not this call's.
        assert_eq!(
            WindowReply::read("1 0 1700000000123 -1 0 1 9 100 -1", &[limits[0]; 2]),
            None
        );
    }

    #[test]
    fn fixed_lease_replies_name_their_window() {
        assert_eq!(read_divvy_lease_reply("2"), Some(FixedReply::GaveBack));
        assert_eq!(
            read_divvy_lease_reply("1 40 59 50 1700000059400 59400"),
            Some(FixedReply::Decided {
                decision: FixedAnswer {
                    allowed: true,
                    credit: 40,
                    ttl: 59
                },
                grant: 50,
                expiry_ms: 1_700_000_059_400,
                pttl_ms: 59_400,
            })
        );
        // The plain reply is not a lease reply, nor the other way round.
        assert_eq!(read_divvy_lease_reply("1 40 59"), None);
        assert_eq!(read_divvy_reply("1 40 59 50 1700000059400 59400"), None);
    }

    #[test]
    fn peeking_reads_counts_and_skips_the_scripts_fields() {
        let minute_start = 1_700_000_040u64; // a multiple of 60
        let now_ms = (minute_start + 40) * 1000;
        let limits = [Limit::per_minute(10)];
        let fields = |pairs: &[(&str, &str)]| -> Fields {
            pairs
                .iter()
                .map(|(f, v)| (f.to_string(), v.to_string()))
                .collect()
        };
        // 3 units in the previous minute's second 50 (still in the window), 2 in this one's 10th.
        let replies = vec![
            fields(&[
                ("50", "3"),
                ("c", "1700000030"),
                ("w", "3"),
                ("o", "1700000030"),
            ]),
            fields(&[("10", "2"), ("c", "1700000050"), ("w", "5"), ("b", "0")]),
        ];
        let read = peek_windows(&limits, now_ms, replies);
        let mut counted = WindowSet::default();
        counted.hit(&limits, 3, (minute_start - 10) * 1000);
        counted.hit(&limits, 2, (minute_start + 10) * 1000);
        assert_eq!(
            read.peek(&limits, 1, now_ms),
            counted.peek(&limits, 1, now_ms)
        );
        assert_eq!(read.peek(&limits, 1, now_ms).quotas()[0].remaining, 5);
    }
}
