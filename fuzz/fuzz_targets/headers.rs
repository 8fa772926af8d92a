//! The header rules: removing hop-by-hop fields (and those `Connection` names) never removes the
//! API key header, and setting the forwarding fields never panics and gives the same fields as
//! writing them after the client's (the gateway's own exchange), whatever the client sent.
#![no_main]
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use quotagate::proxy::headers::{Forwarded, strip_hop_by_hop};

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n').take(32) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(&line[colon + 1..]),
        ) {
            headers.append(name, value);
        }
    }
    let key = HeaderName::from_static("x-api-key");
    let keys_before = headers.get_all(&key).iter().count();
    // As `Proxy::forward` does: the client's Host taken out, for `X-Forwarded-Host`.
    let host = headers.remove("host").filter(|v| v.to_str().is_ok());
    strip_hop_by_hop(&mut headers, std::slice::from_ref(&key));
    assert_eq!(headers.get_all(&key).iter().count(), keys_before);
    for hop in [
        "connection",
        "keep-alive",
        "te",
        "transfer-encoding",
        "upgrade",
    ] {
        assert!(!headers.contains_key(hop), "{hop} survived");
    }
    // The two ways the forwarding fields are applied agree: set in the map, or written after
    // the fields they do not replace (the gateway's own exchange).
    let fwd = Forwarded::new([127, 0, 0, 1].into(), host);
    let mut written: Vec<(HeaderName, HeaderValue)> = headers
        .iter()
        .filter(|(n, _)| !Forwarded::replaces(n))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    let replaced = headers.keys().any(Forwarded::replaces);
    fwd.each(&headers, replaced, |n, v| written.push((n.clone(), v.clone())));
    fwd.set(&mut headers);
    let mut set: Vec<_> = headers.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    let key = |(n, v): &(HeaderName, HeaderValue)| (n.to_string(), v.as_bytes().to_vec());
    set.sort_by_key(key);
    written.sort_by_key(key);
    assert_eq!(set, written);
});
