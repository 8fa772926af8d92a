//! The catalog loader and validator: any bytes are a snapshot or a list of problems, never a panic;
//! a snapshot routes any path and answers any key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate::catalog::Snapshot;
use quotagate_engine::path::{EscapedSlashes, normalize};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Snapshot::from_json("fuzz", data) {
        for path in ["/", "/a", "/users/1", "/a/b/c/"] {
            let p = normalize(path, EscapedSlashes::Reject).unwrap();
            for method in ["GET", "post", "DELETE"] {
                if let Some(m) = s.route(method, &p) {
                    assert!(m.endpoint < s.endpoints().len());
                    let _ = s.limit(b"k", m.endpoint);
                }
            }
        }
    }
});
