//! cover: which of a counter's admitted units are already safe on disk, pure.
//!
//! A unit is admitted only once a record that accounts for it is durable: either it is in a
//! record's `spent`, or it comes out of units an earlier durable record reserved (`open +
//! reserve`). Reserving a block ahead ([`block`]) lets most requests pass without waiting for a
//! commit; a renewal is written ahead while the current block still covers, so a busy counter
//! rarely waits. After a crash a counter is charged every record's `spent` and its last record's
//! `open + reserve` ([`super::record::Claim`]): never less than it admitted, and at most its last
//! reservations more.

use super::record::Claim;

/// How long a reservation may be spent from its record's time. A sliding window's units are
/// charged back, after a crash, at the reservation's end: at most this much later than they
/// were spent.
pub const RESERVE_MS: u64 = 5_000;

/// A reservation is at least this share of a limit (at least one unit).
pub const SHARE: u64 = 200;

/// The units one limit lets a counter reserve at a time: [`SHARE`] of it (`rl / 200`), or, in a
/// window of `seconds` (a sliding or a fixed window; `None`: a calendar period), one second's
/// worth of it (`rl / seconds`) if that is more, at least one unit. What a crash can take from a
/// key is at most twice this (the block in use and the one written ahead): 1% of a calendar
/// quota, and in a window at most two seconds' worth of its limit (or 1% of it), for at most
/// the window's length. A counter reserves the least of its limits' blocks.
pub fn block(rl: u64, seconds: Option<u64>) -> u64 {
    let second = seconds.filter(|&s| s > 0).map_or(0, |s| rl / s);
    (rl / SHARE).max(second).max(1)
}

/// One counter's units: spent since its last record, and reserved by durable records or by one
/// still on its way to disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cover {
    spent: u64,
    /// Reserved by durable records and not spent, usable until `until_ms`.
    left: u64,
    until_ms: u64,
    /// The latest record written and not yet known durable (its sequence number; 0: none), the
    /// units of its claim not spent, and until when.
    next: u64,
    next_units: u64,
    next_until: u64,
}

/// What spending units asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Covered by durable records: answer now.
    Covered,
    /// Covered by a record already written: answer once commit `seq` is durable.
    WaitFor(u64),
    /// Write a record with this claim (then call [`Cover::wrote`]); `wait`: the units spent need
    /// it durable before the answer (else it is a renewal written ahead).
    Write { claim: Claim, wait: bool },
}

impl Cover {
    /// `units` more spent at `now_ms` by a counter reserving `block` units at a time; `durable`:
    /// the latest commit known on disk.
    pub fn spend(&mut self, units: u64, now_ms: u64, block: u64, durable: u64) -> Spend {
        if self.next != 0 && durable >= self.next {
            // The record's `open` held the units left: they may be spent until its end too.
            let left = if self.until_ms > now_ms { self.left } else { 0 };
            self.left = left + self.next_units;
            self.until_ms = self.next_until;
            self.next = 0;
            self.next_units = 0;
        }
        if self.until_ms <= now_ms {
            self.left = 0;
        }
        if self.left >= units {
            self.left -= units;
            self.spent += units;
            let running_out = self.left * 2 < block || self.until_ms - now_ms < RESERVE_MS / 2;
            if self.next == 0 && running_out {
                let claim = self.claim(block, now_ms);
                return Spend::Write { claim, wait: false };
            }
            return Spend::Covered;
        }
        if self.next != 0 && self.next_until > now_ms && self.left + self.next_units >= units {
            self.next_units -= units - self.left;
            self.left = 0;
            self.spent += units;
            return Spend::WaitFor(self.next);
        }
        // Neither covers: these units go in the new record's `spent`.
        self.spent += units;
        let claim = self.claim(block.max(units), now_ms);
        Spend::Write { claim, wait: true }
    }

    /// The claim of a record written now reserving `reserve` more.
    fn claim(&self, reserve: u64, now_ms: u64) -> Claim {
        let left = if self.until_ms > now_ms { self.left } else { 0 };
        Claim {
            spent: self.spent,
            open: left + self.next_units,
            reserve,
            at_ms: now_ms,
            until_ms: now_ms + RESERVE_MS,
        }
    }

    /// The record of `claim` ([`Spend::Write`], `wait` as it said) was appended as commit `seq`.
    pub fn wrote(&mut self, seq: u64, claim: &Claim, wait: bool) {
        self.spent = 0;
        self.next = seq;
        self.next_until = claim.until_ms;
        if wait {
            // It carries every unit reserved before it: all usable once it is durable.
            self.left = 0;
            self.until_ms = 0;
            self.next_units = claim.open + claim.reserve;
        } else {
            // A renewal: the durable units left stay usable meanwhile, and join it after.
            self.next_units = claim.reserve;
        }
    }

    /// Units reserved and not known spent, and until when they may be: what a snapshot taken
    /// now keeps beside the counter's exact counts.
    pub fn outstanding(&self, now_ms: u64) -> (u64, u64) {
        let left = if self.until_ms > now_ms { self.left } else { 0 };
        (left + self.next_units, self.until_ms.max(self.next_until))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter's cover driven by random spending, with commits that become durable late, and
    /// the log it writes: after any prefix of durable commits, the claims' total is at least
    /// every unit answered, and at most two blocks more than every unit spent.
    #[test]
    fn what_the_durable_log_claims_covers_every_answered_unit() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let block = 1 + rand(20);
            let mut cover = Cover::default();
            let mut log: Vec<(u64, Claim)> = Vec::new();
            let (mut seq, mut durable) = (0u64, 0u64);
            // Units answered so far, each with the commit it waited for.
            let mut answered: Vec<(u64, u64)> = Vec::new();
            let mut now = 1_000_000u64;
            let mut spent = 0u64;
            for _ in 0..400 {
                now += rand(2 * RESERVE_MS / 3);
                if rand(3) == 0 {
                    durable = seq;
                }
                let units = 1 + rand(3 * block);
                spent += units;
                let wait = match cover.spend(units, now, block, durable) {
                    Spend::Covered => 0,
                    Spend::WaitFor(s) => s,
                    Spend::Write { claim, wait } => {
                        seq += 1;
                        log.push((seq, claim));
                        cover.wrote(seq, &claim, wait);
                        if wait { seq } else { 0 }
                    }
                };
                answered.push((units, wait));
                // The log as a crash now would find it: the durable commits only.
                let on_disk: Vec<&Claim> = log
                    .iter()
                    .filter(|(s, _)| *s <= durable)
                    .map(|(_, c)| c)
                    .collect();
                let claimed: u64 = on_disk.iter().map(|c| c.spent).sum::<u64>()
                    + on_disk.last().map_or(0, |c| c.open + c.reserve);
                let safe: u64 = answered
                    .iter()
                    .filter(|(_, w)| *w <= durable)
                    .map(|(u, _)| u)
                    .sum();
                assert!(claimed >= safe, "round {round}: {claimed} < {safe}");
                assert!(
                    claimed <= spent + 2 * (block + 3 * block),
                    "round {round}: {claimed} far above {spent}"
                );
            }
        }
    }

    #[test]
    fn a_busy_counter_rarely_waits() {
        // A request every millisecond; a commit is durable 20 ms after it is written.
        let block = 50;
        let mut cover = Cover::default();
        let mut written: Vec<u64> = Vec::new();
        let mut waits = 0;
        for now in 1_000_000..1_010_000u64 {
            let durable = written.iter().filter(|&&at| at + 20 <= now).count() as u64;
            match cover.spend(1, now, block, durable) {
                Spend::Covered => {}
                Spend::WaitFor(_) => waits += 1,
                Spend::Write { claim, wait } => {
                    written.push(now);
                    cover.wrote(written.len() as u64, &claim, wait);
                    waits += usize::from(wait);
                }
            }
        }
        // The first requests wait for the first commit; then renewals come ahead of need.
        assert!(waits <= 20, "{waits} waits");
    }
}
