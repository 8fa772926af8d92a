//! Request heads from a client (the gateway's own HTTP/1.1 server): any bytes give a head read
//! here, "not whole yet" or hyper's, never a panic; a head read here lies within the bytes; and
//! heads read one after another on one connection (whose last names are reused) read exactly as
//! each read on its own.
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate::server::h1::{Line, Parsed, parse};

fn read(part: &[u8], lines: &mut Vec<Line>) -> (String, Vec<(String, Vec<u8>)>) {
    let parsed = parse(part, 4096, lines);
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

fuzz_target!(|data: &[u8]| {
    let mut lines = Vec::new();
    // Heads separated by 0xFF (never in a valid head).
    for part in data.split(|&b| b == 0xff).take(8) {
        let on_its_own = read(part, &mut Vec::new());
        let after_others = read(part, &mut lines);
        assert_eq!(on_its_own, after_others);
    }
});
