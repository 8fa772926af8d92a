//! room: when room comes for a request waiting for it, alone or behind others in line.

use super::{Kind, Limit, Tally, WindowSet, hit_parts};

/// Milliseconds from `now_ms` until every enforced rate limit of `parts` (each a counter's
/// windows and the limits that count there) has room for `units` more, if nothing else is
/// counted meanwhile: what a request waiting for room, behind others in line, waits for. 0 when
/// they fit now; `None` when they never can (above a limit). Concurrency limits are not rates:
/// they say nothing of when a slot frees, and are left out.
pub fn room_in_ms(parts: &[(&WindowSet, &[Limit])], units: u64, now_ms: u64) -> Option<u64> {
    let mut wait = 0;
    for (set, limits) in parts {
        for l in limits.iter().filter(|l| !l.shadow && !l.is_concurrent()) {
            let ms = match l.kind {
                Kind::Calendar(p) => {
                    Tally::room_in_ms(set.get_tally(p, l.zone), (p, l.zone, l.rl), units, now_ms)?
                }
                _ => match set.get(l.w) {
                    Some(w) => w.room_in_ms(now_ms, l.rl, units)?,
                    None if units <= l.rl => 0,
                    None => return None,
                },
            };
            wait = wait.max(ms);
        }
    }
    Some(wait)
}

/// Milliseconds from `now_ms` until the last of `requests` requests of `cost` each, in line for
/// the enforced rate limits of `parts`, has room, each admitted as soon as it fits and counted
/// there (a line of requests waiting for room, this one last): 0 when all fit now; `None` when
/// one never can. Concurrency and shadow limits are left out, as in [`room_in_ms`].
pub fn line_room_in_ms(
    parts: &[(&WindowSet, &[Limit])],
    requests: u64,
    cost: u64,
    now_ms: u64,
) -> Option<u64> {
    let rates: Vec<Vec<Limit>> = parts
        .iter()
        .map(|(_, limits)| {
            limits
                .iter()
                .filter(|l| !l.shadow && !l.is_concurrent())
                .copied()
                .collect()
        })
        .collect();
    let mut sets: Vec<WindowSet> = parts.iter().map(|(s, _)| (*s).clone()).collect();
    let mut at = now_ms;
    for _ in 0..requests {
        let wait = {
            let views: Vec<(&WindowSet, &[Limit])> =
                sets.iter().zip(&rates).map(|(s, l)| (s, &l[..])).collect();
            room_in_ms(&views, cost, at)?
        };
        at += wait;
        let mut counted: Vec<(&mut WindowSet, &[Limit])> = sets
            .iter_mut()
            .zip(&rates)
            .map(|(s, l)| (s, &l[..]))
            .collect();
        if !hit_parts(&mut counted, cost, at).allowed {
            // Room by the windows but not by the decision: the two disagree only on input no
            // catalog gives (a limit of 0): say never rather than loop.
            return None;
        }
    }
    Some(at - now_ms)
}
