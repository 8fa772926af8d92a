//! What a response reports (an upstream's bytes): never a panic, whatever the body and however
//! it is split into chunks, and the same answer for every split.
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate_engine::report::{BodyReport, CostFrom};

fuzz_target!(|data: &[u8]| {
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    let Ok(CostFrom::Json(path)) = CostFrom::json_path("usage.total_tokens") else {
        return;
    };
    for kind in ["application/json", "text/event-stream"] {
        let whole = {
            let mut r = BodyReport::new(kind, &path, 4096).unwrap();
            r.feed(body);
            r.end()
        };
        let mut r = BodyReport::new(kind, &path, 4096).unwrap();
        for chunk in body.chunks(usize::from(split).max(1)) {
            r.feed(chunk);
        }
        assert_eq!(r.end(), whole, "{kind}: the split changed the answer");
    }
});
