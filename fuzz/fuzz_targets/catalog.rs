//! The catalog loader and validator: any bytes are a snapshot or a list of problems, never a panic;
//! a snapshot routes any path and answers any key. The same bytes as a diff to a small catalog
//! (read as it arrives, `Snapshot::apply_read`): a new version, problems, or "not from this
//! version", never a panic.
#![no_main]
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use quotagate::catalog::{LimitLookup, Snapshot};
use quotagate_engine::path::{EscapedSlashes, normalize};

static BASE: LazyLock<Snapshot> = LazyLock::new(|| {
    Snapshot::from_json(
        "base",
        br#"{"version": {"hash": "h"}, "methods": ["GET"], "paths": ["/a", "/b"],
            "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 0, "default_rl": 3}],
            "groups": {"ab": [0, 1]},
            "apilimits": [{"key": "k", "limits": [{"ep": 0, "rl": 5}]},
                          {"key": "j", "limits": [{"group": "ab", "rl": 9}]}]}"#,
    )
    .expect("the base catalog is valid")
});

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Snapshot::from_json("fuzz", data) {
        for path in ["/", "/a", "/users/1", "/a/b/c/"] {
            let p = normalize(path, EscapedSlashes::Reject).unwrap();
            for method in ["GET", "post", "DELETE"] {
                if let Ok(m) = s.route(method, p.clone()) {
                    assert!(m.endpoint < s.endpoints().len());
                    let _ = s.limit(b"k", m.endpoint);
                }
            }
        }
    }
    if let Ok(Some(s)) = BASE.apply_read("fuzz", data) {
        assert_eq!(s.endpoints().len(), 2, "a diff changes keys only");
        for key in [&b"k"[..], b"j", b"new"] {
            for ep in 0..2 {
                if let LimitLookup::Limits(a) = s.limit(key, ep) {
                    let _ = s.waits(ep, &a);
                }
            }
        }
    }
});
