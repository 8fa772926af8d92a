//! Request heads from a client (the gateway's own HTTP/1.1 server): any bytes give a head read
//! here, "not whole yet" or hyper's, never a panic; a head read here lies within the bytes; heads
//! read one after another on one connection (whose last names are reused) read exactly as each
//! read on its own; and the fields the proxy hands on as lines, put back in the map, make the map
//! that holds every field (the same values of each name, in order).
#![no_main]
use bytes::Bytes;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use quotagate::server::h1::{Line, Parsed, parse, read_head};

fn read(part: &[u8], lines: &mut Vec<Line>) -> (String, Vec<(String, Vec<u8>)>) {
    let parsed = parse(part, 4096, 100, lines);
    let Parsed::Own(head) = &parsed else {
        return (format!("{parsed:?}"), Vec::new());
    };
    assert!(head.len <= part.len());
    assert!(head.target.end <= head.len);
    let fields = lines
        .iter()
        .map(|l| {
            assert!(l.value.end <= head.len);
            (l.name.as_str().to_owned(), part[l.value.clone()].to_vec())
        })
        .collect();
    (format!("{parsed:?}"), fields)
}

/// Each name's values, in order, by name.
fn by_name(map: &HeaderMap) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut names: Vec<_> = map
        .keys()
        .map(|n| {
            let values = map.get_all(n).iter().map(|v| v.as_bytes().to_vec());
            (n.as_str().to_owned(), values.collect())
        })
        .collect();
    names.sort();
    names
}

fuzz_target!(|data: &[u8]| {
    let mut lines = Vec::new();
    let passes = quotagate::proxy::headers::handed_on([]);
    let mut judged = Vec::new();
    // Heads separated by 0xFF (never in a valid head).
    for part in data.split(|&b| b == 0xff).take(8) {
        let on_its_own = read(part, &mut Vec::new());
        let after_others = read(part, &mut lines);
        assert_eq!(on_its_own, after_others);
        let buf = Bytes::copy_from_slice(part);
        let whole = read_head(&buf, &mut Vec::new(), None);
        let split = read_head(&buf, &mut judged, Some(&passes));
        match (whole, split) {
            (None, None) => {}
            (Some((_, _, whole, _)), Some((_, _, mut map, passed))) => {
                // Lines only: no byte that could end a line or start another inside one.
                for line in passed.as_bytes().split_inclusive(|&b| b == b'\n') {
                    assert!(line.ends_with(b"\r\n"));
                    let line = &line[..line.len() - 2];
                    assert!(!line.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0));
                }
                passed.restore(&mut map);
                assert_eq!(by_name(&whole), by_name(&map));
            }
            (whole, split) => panic!("{:?} against {:?}", whole.is_some(), split.is_some()),
        }
    }
});
