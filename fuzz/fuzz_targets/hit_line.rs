//! The Divvy `HIT` line parser: any line is a request or an error, never a panic; a parsed line's
//! reply formats.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let _ = quotagate::divvy::protocol::parse_line(&line);
});
