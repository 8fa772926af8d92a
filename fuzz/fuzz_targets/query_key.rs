//! The `query:` key source (a credential in the URL): any target a client can send gives a
//! target that parses, from which every parameter of the name is gone (a second take finds none),
//! whose other parameters are the client's bytes in their order, and the path untouched; and
//! what it finds is what splitting the whole query finds (it skips queries without the name).
#![no_main]
use libfuzzer_sys::fuzz_target;
use quotagate::proxy::caller::QueryKey;

fuzz_target!(|data: &[u8]| {
    let Ok(mut head) = http::Request::get(data).body(()).map(|r| r.into_parts().0) else {
        return;
    };
    let before = head.uri.clone();
    let found = QueryKey::take(&mut head, "api_key");
    // `take` does not split a query without the name or an escape: held to the plain split.
    let split = before.query().and_then(|q| QueryKey::in_query(q, "api_key"));
    assert_eq!(found, split, "the shortcut and the split agree");
    assert_eq!(head.uri.path(), before.path());
    assert_eq!(head.uri.authority(), before.authority());
    let Some(found) = found else {
        assert_eq!(head.uri, before, "untouched when not there");
        return;
    };
    let reparsed: http::Uri = head.uri.to_string().parse().expect("what is left parses");
    assert_eq!(reparsed, head.uri);
    assert_eq!(QueryKey::take(&mut head, "api_key"), None, "every one taken");
    if let QueryKey::Key(key) = &found {
        assert!(!key.is_empty());
    }
    // What is left is the client's own parameters, in order (empty ones dropped).
    let kept: Vec<&str> = before
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && QueryKey::in_query(p, "api_key").is_none())
        .collect();
    assert_eq!(head.uri.query().unwrap_or(""), kept.join("&"));
});
