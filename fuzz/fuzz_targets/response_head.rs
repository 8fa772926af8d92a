//! Response heads from an upstream (the gateway's own HTTP/1.1 exchange): any bytes give a head,
//! "not whole yet" or a refusal, never a panic; and heads read one after another on one
//! connection (whose last names are reused) read exactly as each read on its own; a client is
//! sent the same fields whether they are passed on in a map or as lines.
#![no_main]
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quotagate::proxy::upstream::h1::{Lines, both_ways, parse_response};

fuzz_target!(|data: &[u8]| {
    let mut lines = Lines::new();
    // Heads separated by 0xFF (never in a valid head), a HEAD request's if the part starts so.
    for part in data.split(|&b| b == 0xff).take(8) {
        let head_request = part.first() == Some(&b'H') && part.get(1) == Some(&b'H');
        let read = |lines: &mut Lines| {
            let mut buf = BytesMut::from(part);
            let head = parse_response(&mut buf, head_request, 4096, lines, None);
            let head = head.map(|h| {
                h.map(|h| (h.status, h.version, h.headers, h.framing, h.reusable))
            });
            (head, buf)
        };
        let on_its_own = read(&mut Lines::new());
        let after_others = read(&mut lines);
        assert_eq!(on_its_own, after_others);
        if let Some((map, lines)) = both_ways(part, head_request) {
            assert_eq!(map, lines);
        }
    }
});
