//! The path normaliser (a security rule): never a panic, and its normal form is a fixed point, so
//! no second spelling of a normalised path reaches another counter.
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate_engine::path::{EscapedSlashes, normalize};

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    for mode in [EscapedSlashes::Reject, EscapedSlashes::Keep] {
        if let Ok(p) = normalize(raw, mode) {
            let normal = p.to_path();
            let again = normalize(&normal, mode).expect("a normal form normalises");
            assert_eq!(
                again.to_path(),
                p.to_path(),
                "normalising twice changes nothing"
            );
            assert_eq!(again.match_key(), p.match_key());
        }
    }
});
