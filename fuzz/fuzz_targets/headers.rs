//! The header rules: removing hop-by-hop fields (and those `Connection` names) never removes the
//! API key header, and setting the forwarding fields never panics, whatever the client sent.
#![no_main]
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use quotagate::proxy::headers::{set_forwarded, strip_hop_by_hop};

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
    strip_hop_by_hop(&mut headers, Some(&key));
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
    set_forwarded(&mut headers, [127, 0, 0, 1].into(), host);
});
