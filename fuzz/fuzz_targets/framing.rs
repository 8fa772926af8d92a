//! Differential: the same bytes, sent on one connection to the gateway's HTTP server (its own
//! HTTP/1.1 server, handing over to hyper's as it does in service) and read by a strict reading
//! written here from RFC 9112 (no code shared with the server), must give the same messages
//! (method, target, body), in the same order, and the same verdict: a framing the reading
//! refuses is answered with the same status and nothing of it, or after it, reaches the
//! handler. Where the reading is unsure (a byte or field the RFC lets a server read either way,
//! or that hands the connection to another protocol), what came before must still agree.
#![no_main]
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use quotagate::server::{HttpSettings, RequestBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A message as the handler got it, or as the strict reading reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Message {
    method: String,
    target: String,
    body: Vec<u8>,
}

/// How the strict reading of a connection's bytes ends, after its messages.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The bytes end within a message (or between two).
    Partial,
    /// The next message's framing is refused with this status.
    Refused(u16),
    /// The next message is one the RFC lets a server read more than one way, or that is not
    /// framed by these rules (an upgrade, `Expect`, trailers): nothing is asserted from it on.
    Unsure,
}

fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// RFC 9112 §2-§7, with the gateway's documented choices where the RFC leaves one
/// (docs/semantics.md, "Framing at the edge").
fn strict(input: &[u8]) -> (Vec<Message>, End) {
    let mut messages = Vec::new();
    let mut at = 0;
    loop {
        let rest = &input[at..];
        if rest.is_empty() {
            return (messages, End::Partial);
        }
        let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
            // A bare CR or LF before the head's end is read either way (§2.2).
            if rest.len() > 4096 || rest.iter().any(|&b| b == b'\n' || b == b'\r') {
                let ok = rest.windows(2).all(|w| (w[0] == b'\r') == (w[1] == b'\n'));
                return (messages, if ok { End::Partial } else { End::Unsure });
            }
            return (messages, End::Partial);
        };
        let head = &rest[..end];
        // Lines end with CRLF only; a bare CR or LF inside one is read either way (§2.2: a
        // recipient MAY take LF alone; a bare CR is refused or replaced).
        let mut lines = Vec::new();
        let mut from = 0;
        while let Some(i) = head[from..].windows(2).position(|w| w == b"\r\n") {
            lines.push(&head[from..from + i]);
            from += i + 2;
        }
        lines.push(&head[from..]);
        if lines
            .iter()
            .any(|l| l.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0))
        {
            return (messages, End::Unsure);
        }
        let mut lines = lines.into_iter();
        let line = lines.next().unwrap_or_default();
        let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let [method, target, b"HTTP/1.1"] = parts.as_slice() else {
            return (messages, End::Unsure);
        };
        if method.is_empty()
            || !method.iter().all(|&b| tchar(b))
            || *method == b"CONNECT"
            || target.first() != Some(&b'/')
            || target.len() > 1024
            || !target
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"-._~/?=&+:@!$'()*,;".contains(&b))
        {
            return (messages, End::Unsure);
        }
        let (mut lengths, mut length, mut codings, mut coded) = (0, None, Vec::new(), false);
        let mut fields = 0;
        for field in lines {
            fields += 1;
            let Some(colon) = field.iter().position(|&b| b == b':') else {
                return (messages, End::Unsure);
            };
            let (name, value) = (&field[..colon], &field[colon + 1..]);
            if name.is_empty()
                || !name.iter().all(|&b| tchar(b))
                || !value.iter().all(|&b| b == b'\t' || (b' '..0x7f).contains(&b))
                || fields > 100
            {
                return (messages, End::Unsure);
            }
            let value = value.trim_ascii();
            match name.to_ascii_lowercase().as_slice() {
                b"content-length" => {
                    lengths += 1;
                    if lengths == 1 {
                        length = (!value.is_empty()
                            && value.len() <= 19
                            && value.iter().all(u8::is_ascii_digit))
                        .then(|| std::str::from_utf8(value).unwrap().parse::<u64>().unwrap());
                    }
                }
                b"transfer-encoding" => {
                    coded = true;
                    codings.extend(
                        value
                            .split(|&b| b == b',')
                            .map(|c| c.trim_ascii().to_ascii_lowercase())
                            .filter(|c| !c.is_empty()),
                    );
                }
                // `100-continue` is answered and the body read as any other (RFC 9110 §10.1.1).
                b"expect" if value.eq_ignore_ascii_case(b"100-continue") => {}
                // Another protocol, or an expectation the RFC lets a server answer either way.
                b"connection" | b"upgrade" | b"expect" | b"te" => {
                    return (messages, End::Unsure);
                }
                _ => {}
            }
        }
        at += end + 4;
        let body = if coded {
            let chunked = codings.iter().filter(|c| c.as_slice() == b"chunked").count();
            let valid = codings.iter().all(|c| coding(c));
            if lengths > 0
                || !valid
                || codings.last().map(Vec::as_slice) != Some(b"chunked")
                || chunked > 1
            {
                return (messages, End::Refused(400));
            }
            if codings.len() > 1 {
                return (messages, End::Refused(501));
            }
            match dechunk(&input[at..]) {
                Dechunked::Whole(data, used) => {
                    at += used;
                    data
                }
                Dechunked::Partial => return (messages, End::Partial),
                Dechunked::Bad => return (messages, End::Refused(400)),
                Dechunked::Unsure => return (messages, End::Unsure),
            }
        } else {
            let n = match (lengths, length) {
                (0, _) => 0,
                (1, Some(n)) => n,
                _ => return (messages, End::Refused(400)),
            };
            if input.len() - at < n as usize {
                return (messages, End::Partial);
            }
            at += n as usize;
            input[at - n as usize..at].to_vec()
        };
        messages.push(Message {
            method: String::from_utf8(method.to_vec()).unwrap(),
            target: String::from_utf8(target.to_vec()).unwrap(),
            body,
        });
    }
}

/// RFC 9112 §7: `transfer-coding = token *( OWS ";" OWS transfer-parameter )`, a parameter
/// being `token BWS "=" BWS ( token / quoted-string )` (a `;` inside a quoted string is taken as
/// a separator here, as the gateway documents).
fn coding(c: &[u8]) -> bool {
    let token = |t: &[u8]| !t.is_empty() && t.iter().all(|&b| tchar(b));
    let mut parts = c.splitn(2, |&b| b == b';');
    if !token(parts.next().unwrap_or_default().trim_ascii()) {
        return false;
    }
    let Some(params) = parts.next() else {
        return true;
    };
    params.split(|&b| b == b';').all(|p| {
        let mut kv = p.splitn(2, |&b| b == b'=');
        let key = kv.next().unwrap_or_default().trim_ascii();
        let Some(value) = kv.next().map(<[u8]>::trim_ascii) else {
            return false;
        };
        token(key) && (token(value) || quoted(value))
    })
}

/// RFC 9110 §5.6.4: `DQUOTE *( qdtext / quoted-pair ) DQUOTE`, over the bytes this reading
/// lets into a value (no obs-text).
fn quoted(v: &[u8]) -> bool {
    if v.len() < 2 || v[0] != b'"' || v[v.len() - 1] != b'"' {
        return false;
    }
    let mut escaped = false;
    for &b in &v[1..v.len() - 1] {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => escaped = true,
            (false, b'"') => return false,
            _ => {}
        }
    }
    !escaped
}

enum Dechunked {
    Whole(Vec<u8>, usize),
    Partial,
    Bad,
    Unsure,
}

/// RFC 9112 §7.1: `*chunk last-chunk trailer-section CRLF`.
fn dechunk(input: &[u8]) -> Dechunked {
    let (mut data, mut at) = (Vec::new(), 0);
    loop {
        let Some(cr) = input[at..].iter().position(|&b| b == b'\r' || b == b'\n') else {
            return if input.len() - at > 1000 {
                Dechunked::Unsure
            } else if input[at..].iter().any(|&b| b < b' ' && b != b'\t') {
                Dechunked::Bad
            } else {
                Dechunked::Partial
            };
        };
        let line = &input[at..at + cr];
        if input[at + cr] == b'\n' {
            return Dechunked::Bad;
        }
        match input.get(at + cr + 1) {
            None => return Dechunked::Partial,
            Some(b'\n') => {}
            Some(_) => return Dechunked::Bad,
        }
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        let (size, ext) = line.split_at(digits);
        // BWS then `;` then the extension; no whitespace alone (RFC 9112 §7.1.1).
        let ext_ok = match ext.iter().position(|&b| b != b' ' && b != b'\t') {
            None => ext.is_empty(),
            Some(i) => {
                ext[i] == b';' && ext[i..].iter().all(|&b| b == b'\t' || b >= b' ' && b != 0x7f)
            }
        };
        if size.is_empty() || size.len() > 16 || !ext_ok {
            return Dechunked::Bad;
        }
        if ext.len() > 1000 {
            return Dechunked::Unsure;
        }
        let size = u64::from_str_radix(std::str::from_utf8(size).unwrap(), 16).unwrap();
        at += cr + 2;
        if size == 0 {
            // Only an empty trailer section is read whole; trailers are another reading's.
            return match input.get(at..at + 2) {
                Some(b"\r\n") => Dechunked::Whole(data, at + 2),
                Some(_) => Dechunked::Unsure,
                None if input.len() > at && input[at] != b'\r' => Dechunked::Unsure,
                None => Dechunked::Partial,
            };
        }
        let size = size as usize;
        if data.len() + size > 64 * 1024 {
            return Dechunked::Unsure;
        }
        if input.len() - at < size {
            return Dechunked::Partial;
        }
        data.extend_from_slice(&input[at..at + size]);
        at += size;
        match input.get(at..at + 2) {
            Some(b"\r\n") => at += 2,
            Some(_) => return Dechunked::Bad,
            None if input.get(at).is_some_and(|&b| b != b'\r') => return Dechunked::Bad,
            None => return Dechunked::Partial,
        }
    }
}

/// Each connection's messages, by the client's port.
type Log = Arc<Mutex<std::collections::HashMap<u16, Vec<Message>>>>;

/// The server under test, started once: its address and each connection's messages, by the
/// client's port.
struct Server {
    addr: SocketAddr,
    seen: Log,
    runtime: tokio::runtime::Runtime,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let seen: Log = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = HttpSettings {
            header_read_timeout: Duration::from_millis(500),
            keep_alive_timeout: Duration::from_millis(500),
            ..Default::default()
        };
        let log = seen.clone();
        runtime.spawn(quotagate::server::serve(
            listener,
            settings,
            Default::default(),
            move |peer: SocketAddr, req: Request<RequestBody>| {
                let log = log.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let status = match body.collect().await {
                        Ok(body) => {
                            log.lock().unwrap().entry(peer.port()).or_default().push(Message {
                                method: parts.method.to_string(),
                                target: parts.uri.to_string(),
                                body: body.to_bytes().to_vec(),
                            });
                            200
                        }
                        Err(_) => 400,
                    };
                    let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                    resp
                }
            },
            std::future::pending(),
        ));
        Server { addr, seen, runtime }
    })
}

/// The statuses of the answers in `bytes` (each framed by its `content-length`).
fn statuses(mut bytes: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    while bytes.starts_with(b"HTTP/1.1 ") {
        let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
        let status: u16 = head[9..12].parse().unwrap();
        if (100..200).contains(&status) {
            // Interim (`100 Continue`): no body, the answer follows.
            bytes = &bytes[end + 4..];
            continue;
        }
        out.push(status);
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |n| n.trim().parse::<usize>().unwrap());
        bytes = &bytes[(end + 4 + len).min(bytes.len())..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let s = server();
    let (want, end) = strict(data);
    let (port, answers) = s.runtime.block_on(async {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let port = c.local_addr().unwrap().port();
        let _ = c.write_all(data).await;
        // The client has sent all it will: the server answers what it read, then closes (or its
        // header timeout closes a head cut short).
        let _ = c.shutdown().await;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got)).await;
        (port, got)
    });
    let got = s.seen.lock().unwrap().remove(&port).unwrap_or_default();
    let answers = statuses(&answers);
    let agreed = want.len().min(got.len());
    assert_eq!(got[..agreed], want[..agreed], "{end:?}");
    match end {
        End::Unsure => {}
        End::Partial => {
            assert_eq!(got, want);
            assert!(answers.iter().take(want.len()).all(|&s| s == 200), "{answers:?}");
        }
        End::Refused(status) => {
            assert_eq!(got, want, "a message refused, or one after it, was handled");
            let mut expected = vec![200; want.len()];
            expected.push(status);
            assert_eq!(answers, expected);
        }
    }
});
