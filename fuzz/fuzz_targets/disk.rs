//! The embedded store's files (`store.path`) as a start reads them: a snapshot and a log, any
//! bytes. Nothing they hold may panic, hang or ask for unbounded memory; what reads is either
//! refused with one line naming `store.path`, or counters (each a window set the engine answers
//! from without panicking).
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate_engine::limiter::Limit;
use quotagate_store::disk::{Collected, read_bytes};

fuzz_target!(|data: &[u8]| {
    // [u16 LE: the snapshot's length][snapshot][log]
    if data.len() < 2 {
        return;
    }
    let n = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
    let (snapshot, log) = data[2..].split_at(n);
    let now_ms = 1_700_000_000_000;
    let mut into = Collected::default();
    match read_bytes(snapshot, &[log], now_ms, &mut into) {
        Ok(_) => {
            for set in into.counters.values() {
                let _ = set.peek(&[Limit::per_minute(10)], 1, now_ms);
            }
        }
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("store.path ") && !e.contains('\n'), "{e}");
        }
    }
});
