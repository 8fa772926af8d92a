//! What a response reports (an upstream's bytes): never a panic, whatever the body and however
//! it is split into chunks, the same answer for every split, and for a JSON body what serde_json
//! finds at the path wherever serde_json reads the body as JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate_engine::report::{BodyReport, CostFrom, json, reported};

fuzz_target!(|data: &[u8]| {
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    let Ok(CostFrom::Json(path)) = CostFrom::json_path("usage.total_tokens") else {
        return;
    };
    for kind in ["application/json", "text/event-stream"] {
        let whole = {
            let mut r = BodyReport::new(kind.as_bytes(), &path, 4096).unwrap();
            r.feed(body);
            r.end()
        };
        let mut r = BodyReport::new(kind.as_bytes(), &path, 4096).unwrap();
        for chunk in body.chunks(usize::from(split).max(1)) {
            r.feed(chunk);
        }
        assert_eq!(r.end(), whole, "{kind}: the split changed the answer");
        if kind == "application/json"
            && body.len() <= 4096
            && let Some(want) = json::reference(body, &path).map(reported)
        {
            assert_eq!(whole, want, "serde_json reads it otherwise");
        }
    }
});
