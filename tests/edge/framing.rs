//! Framing at the edge (docs/semantics.md): raw requests over real sockets, through the gateway
//! with limits off and on, to an upstream that records the exact bytes it receives. Each case
//! names the RFC line it comes from and says what the upstream must receive: the request with
//! its framing as a strict reader reads it, or nothing at all (the gateway refused it first).
//! The upstream reads requests by its own strict reading, written here from RFC 9112 and sharing
//! no code with the gateway's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quotagate::config::Config;
use quotagate_engine::clock::FakeClock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::TestGateway;

const CATALOG: &str = r#"{
  "version": {"semver": "1.0.0", "hash": "f1"},
  "methods": ["GET", "HEAD", "POST", "OPTIONS"],
  "paths": ["/r"],
  "endpoints": [{"p": 0, "m": 0}, {"p": 0, "m": 1}, {"p": 0, "m": 2}, {"p": 0, "m": 3}],
  "apilimits": [{"key": "K", "limits": [{"ep": 0, "rl": 1000000}, {"ep": 1, "rl": 1000000},
                                         {"ep": 2, "rl": 1000000}, {"ep": 3, "rl": 1000000}]}]
}"#;

/// How long any one read may wait: a gateway that neither answers nor closes fails the case.
const PATIENCE: Duration = Duration::from_secs(10);

/// What the recording upstream answers each request with, unless told otherwise.
const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Each request as it came, and the number of the connection it came on.
type Seen = Arc<Mutex<Vec<(usize, Vec<u8>)>>>;

/// An upstream that reads requests strictly and records each one's bytes, head and body as they
/// came; it answers each with the next of its answers (the last one again once they run out).
struct Recorder {
    addr: std::net::SocketAddr,
    seen: Seen,
    answers: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(vec![OK.to_vec()]));
        let (s, a) = (seen.clone(), answers.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((conn, _)) = listener.accept().await {
                n += 1;
                tokio::spawn(record(n, conn, s.clone(), a.clone()));
            }
        });
        Recorder {
            addr,
            seen,
            answers,
        }
    }

    /// The requests received since the last call, as they came.
    fn take(&self) -> Vec<Vec<u8>> {
        self.take_with_connections()
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    fn take_with_connections(&self) -> Vec<(usize, Vec<u8>)> {
        std::mem::take(&mut self.seen.lock().unwrap())
    }

    /// Answers the coming requests with these, in turn.
    fn answer_with(&self, answers: &[&[u8]]) {
        *self.answers.lock().unwrap() = answers.iter().map(|a| a.to_vec()).collect();
    }
}

async fn record(id: usize, mut conn: TcpStream, seen: Seen, answers: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut buf = Vec::new();
    loop {
        let len = loop {
            if let Some(len) = strict_request(&buf) {
                break len;
            }
            let mut more = [0u8; 4096];
            match conn.read(&mut more).await {
                Ok(0) | Err(_) => {
                    // A request cut short is recorded as it came: the gateway began one it did
                    // not finish.
                    if !buf.is_empty() {
                        seen.lock().unwrap().push((id, std::mem::take(&mut buf)));
                    }
                    return;
                }
                Ok(n) => buf.extend_from_slice(&more[..n]),
            }
        };
        let request: Vec<u8> = buf.drain(..len).collect();
        let head_request = request.starts_with(b"HEAD ");
        seen.lock().unwrap().push((id, request));
        let mut answer = {
            let mut a = answers.lock().unwrap();
            if a.len() > 1 {
                a.remove(0)
            } else {
                a[0].clone()
            }
        };
        if head_request && answer == OK {
            answer.truncate(OK.len() - 2);
        }
        if conn.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// The length of the whole request at the front of `buf`, read as RFC 9112 §6.3 says (the
/// gateway must only ever send requests framed one way): `None` while it is not whole. Panics on
/// a request a strict reader refuses (that is the gateway's fault).
fn strict_request(buf: &[u8]) -> Option<usize> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).expect("a head in UTF-8");
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap();
    assert_eq!(request_line.split(' ').count(), 3, "{head:?}");
    let (mut length, mut chunked) = (None, false);
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("a field line");
        assert!(!name.contains([' ', '\t']), "{head:?}");
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                assert!(length.is_none(), "two lengths sent upstream: {head:?}");
                length = Some(value.trim().parse::<usize>().expect("a plain length"));
            }
            "transfer-encoding" => {
                assert!(!chunked, "two codings sent upstream: {head:?}");
                assert_eq!(value.trim(), "chunked", "{head:?}");
                chunked = true;
            }
            _ => {}
        }
    }
    assert!(
        !(chunked && length.is_some()),
        "both sent upstream: {head:?}"
    );
    if !chunked {
        let len = end + length.unwrap_or(0);
        return (buf.len() >= len).then_some(len);
    }
    // RFC 9112 §7.1: chunk-size [ext] CRLF data CRLF ... last-chunk trailers CRLF.
    let mut at = end;
    loop {
        let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&buf[at..line_end]).unwrap();
        let size = line.split(';').next().unwrap();
        let size = usize::from_str_radix(size, 16).expect("a chunk size");
        at = line_end + 2;
        if size == 0 {
            loop {
                let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
                let empty = line_end == at;
                at = line_end + 2;
                if empty {
                    return Some(at);
                }
            }
        }
        if buf.len() < at + size + 2 {
            return None;
        }
        assert_eq!(&buf[at + size..at + size + 2], b"\r\n", "chunk data ends");
        at += size + 2;
    }
}

/// One answer the gateway gave: its status, head and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads more of `s` into `buf`: how many bytes (0: closed).
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> usize {
    let mut more = [0u8; 4096];
    let n = tokio::time::timeout(PATIENCE, s.read(&mut more))
        .await
        .expect("the gateway answers or closes in time")
        .unwrap_or(0);
    buf.extend_from_slice(&more[..n]);
    n
}

/// Reads one answer from `s` (`buf` holds what was read after the last); `None` when the
/// connection closes first.
async fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>, head_request: bool) -> Option<Answer> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if fill(s, buf).await == 0 {
            return None;
        }
    };
    let head = String::from_utf8(buf.drain(..end).collect()).unwrap();
    let status = head[9..12].parse().unwrap();
    if (100..200).contains(&status) {
        // Interim: the answer follows.
        return Box::pin(read_answer(s, buf, head_request)).await;
    }
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|n| n.trim().parse::<usize>().unwrap());
    let mut body = Vec::new();
    if head_request || status == 204 || status == 304 {
    } else if lower.contains("transfer-encoding: chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(fill(s, buf).await > 0, "a chunked answer cut short");
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                assert!(fill(s, buf).await > 0, "a chunked answer cut short");
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        let n = length.expect("an answer framed by its length");
        while buf.len() < n {
            assert!(fill(s, buf).await > 0, "an answer cut short");
        }
        body = buf.drain(..n).collect();
    }
    Some(Answer { status, head, body })
}

/// Whether the gateway closes `s` now that its answers are read (read until the close, within
/// [`PATIENCE`]; anything more it sends is a failure).
async fn closes(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut more = [0u8; 64];
    match tokio::time::timeout(PATIENCE, s.read(&mut more)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {
            assert!(buf.is_empty(), "bytes after the last answer: {buf:?}");
            true
        }
        Ok(Ok(n)) => panic!(
            "more than asked for: {:?}",
            String::from_utf8_lossy(&more[..n])
        ),
        Err(_) => false,
    }
}

/// A gateway in front of `up`, limits on or off.
async fn gateway(up: &Recorder, limits: bool) -> TestGateway {
    let mut c = Config::default();
    c.upstream.url = format!("http://{}", up.addr);
    c.limits.enabled = limits;
    TestGateway::start(c, CATALOG, FakeClock::new(1_700_000_040)).await
}

/// Sends `raw` on a new connection and reads `answers` answers.
async fn exchange(gw: &TestGateway, raw: &[u8], answers: usize) -> (TcpStream, Vec<Answer>) {
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut buf = Vec::new();
    let head_request = raw.starts_with(b"HEAD ");
    let mut got = Vec::new();
    for _ in 0..answers {
        got.push(
            read_answer(&mut s, &mut buf, head_request)
                .await
                .unwrap_or_else(|| panic!("closed before answer {}: {raw:?}", got.len() + 1)),
        );
    }
    assert!(buf.is_empty(), "more than {answers} answers: {buf:?}");
    (s, got)
}

/// The request the upstream must receive for a client's `method` to `/r` with `X-Api-Key: K`
/// and `fields` (as the gateway writes them) and `body`, the client's host being `host`.
fn forwarded(up: &Recorder, method: &str, host: &str, fields: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} /r HTTP/1.1\r\nhost: {}\r\nx-api-key: K\r\n{fields}x-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: http\r\nx-forwarded-host: {host}\r\n\r\n{body}",
        up.addr
    )
    .into_bytes()
}

/// A request to `/r` from a client whose host is `h`, with its key, `fields` (each line ending
/// in CRLF) and `body`.
fn request(method: &str, fields: &str, body: &str) -> String {
    format!("{method} /r HTTP/1.1\r\nHost: h\r\nX-Api-Key: K\r\n{fields}\r\n{body}")
}

/// One case: where in the RFCs it comes from, what the client sends, the statuses of the answers
/// it gets, whether the gateway then closes the connection, and the requests the upstream
/// receives, byte for byte.
struct Case {
    rfc: &'static str,
    sent: String,
    statuses: &'static [u16],
    closes: bool,
    upstream: Vec<Vec<u8>>,
}

fn refused(rfc: &'static str, sent: String, status: &'static [u16]) -> Case {
    Case {
        rfc,
        sent,
        statuses: status,
        closes: true,
        upstream: Vec::new(),
    }
}

fn cases(up: &Recorder) -> Vec<Case> {
    let fwd = |method: &str, fields: &str, body: &str| forwarded(up, method, "h", fields, body);
    let chunked = "Transfer-Encoding: chunked\r\n";
    let mut cases = vec![
        Case {
            rfc: "RFC 9112 §6.3 (6): a body framed by its length",
            sent: request("POST", "Content-Length: 5\r\n", "hello"),
            statuses: &[200],
            closes: false,
            upstream: vec![fwd("POST", "content-length: 5\r\n", "hello")],
        },
        Case {
            rfc: "RFC 9110 §9.3.1: a GET's body has no defined meaning, but is not dropped",
            sent: request("GET", chunked, "5\r\nhello\r\n0\r\n\r\n"),
            statuses: &[200],
            closes: false,
            upstream: vec![fwd("GET", "content-length: 5\r\n", "hello")],
        },
        Case {
            rfc: "RFC 9110 §9.3.2: nor a HEAD's",
            sent: request("HEAD", chunked, "5\r\nhello\r\n0\r\n\r\n"),
            statuses: &[200],
            closes: false,
            upstream: vec![fwd("HEAD", "content-length: 5\r\n", "hello")],
        },
        Case {
            rfc: "RFC 9112 §7.1.1: chunk extensions are skipped; §5.1: OWS around a value",
            sent: request(
                "POST",
                "Transfer-Encoding:\tChunked \r\n",
                "2;a=b;c=\"d;\\\"\"\r\nhe\r\n3 ; e\r\nllo\r\n000\r\n\r\n",
            ),
            statuses: &[200],
            closes: false,
            upstream: vec![fwd("POST", "content-length: 5\r\n", "hello")],
        },
        Case {
            rfc: "RFC 9112 §9.3: pipelined requests, each its own, in order",
            sent: request("POST", "Content-Length: 2\r\n", "ab") + &request("GET", "", ""),
            statuses: &[200, 200],
            closes: false,
            upstream: vec![fwd("POST", "content-length: 2\r\n", "ab"), fwd("GET", "", "")],
        },
        Case {
            rfc: "CL.0: a body that looks like a request is the body",
            sent: request("GET", "Content-Length: 34\r\n", "GET /admin HTTP/1.1\r\nHost: h\r\n\r\n\r\n"),
            statuses: &[200],
            closes: false,
            upstream: vec![fwd(
                "GET",
                "content-length: 34\r\n",
                "GET /admin HTTP/1.1\r\nHost: h\r\n\r\n\r\n",
            )],
        },
        Case {
            rfc: "RFC 9112 §7.1: what follows the last chunk is the next request",
            sent: request("POST", chunked, "2\r\nab\r\n0\r\n\r\n") + &request("GET", "", ""),
            statuses: &[200, 200],
            closes: false,
            upstream: vec![fwd("POST", "content-length: 2\r\n", "ab"), fwd("GET", "", "")],
        },
        Case {
            rfc: "RFC 9112 §3.2.2: an absolute-form target's authority, not Host, is the host",
            sent: "GET http://a.test/r HTTP/1.1\r\nHost: h\r\nX-Api-Key: K\r\n\r\n".into(),
            statuses: &[200],
            closes: false,
            upstream: vec![forwarded(up, "GET", "a.test", "", "")],
        },
        // CL.TE and TE.CL: RFC 9112 §6.1 "ought to be handled as an error".
        refused(
            "RFC 9112 §6.1: CL.TE",
            request("POST", "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\nX"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.1: TE.CL",
            request("POST", "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", "5c\r\nGPOST / HTTP/1.1\r\n\r\n0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.1: TE.CL with the coding obfuscated",
            request("POST", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n", "0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9110 §8.6: two equal lengths",
            request("POST", "Content-Length: 5\r\nContent-Length: 5\r\n", "hello"),
            &[400],
        ),
        refused(
            "RFC 9110 §8.6: two lengths",
            request("POST", "Content-Length: 5\r\nContent-Length: 0\r\n", "hello"),
            &[400],
        ),
        refused(
            "RFC 9110 §8.6: a list of lengths",
            request("POST", "Content-Length: 5, 5\r\n", "hello"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.3 (5): an invalid length",
            request("POST", "Content-Length: +5\r\n", "hello"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.3 (5): a length in hex",
            request("POST", "Content-Length: 0x5\r\n", "hello"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.1: a coding not understood (501)",
            request("POST", "Transfer-Encoding: deflate, chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            &[501],
        ),
        refused(
            "RFC 9112 §6.1: an unknown coding, then chunked, in two lines",
            request("POST", "Transfer-Encoding: x\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"),
            &[501],
        ),
        refused(
            "RFC 9112 §7: chunked applied twice",
            request("POST", "Transfer-Encoding: chunked, chunked\r\n", "0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.3 (4): chunked not the last coding",
            request("POST", "Transfer-Encoding: chunked, gzip\r\n", "0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.3 (4): TE.TE, a coding that is not one",
            request("POST", "Transfer-Encoding: xchunked\r\n", "0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §5.1: TE.TE, whitespace before the colon",
            request("POST", "Transfer-Encoding : chunked\r\n", "0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §5.2: TE.TE, a folded line",
            request("POST", "Transfer-Encoding:\r\n chunked\r\n", "0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §6.1: a coding in HTTP/1.0",
            "POST /r HTTP/1.0\r\nHost: h\r\nX-Api-Key: K\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into(),
            &[400],
        ),
        refused(
            "RFC 9112 §7.1: data longer than its chunk size",
            request("GET", chunked, "3\r\nhello\r\n0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §7.1: no CRLF after a chunk's data",
            request("GET", chunked, "5\r\nABCDE0"),
            &[400],
        ),
        refused(
            "RFC 9112 §7.1: a bare LF ends no chunk line",
            request("POST", chunked, "5\nhello\n0\n\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §7.1.1: a control byte in an extension",
            request("POST", chunked, "5;a\x01\r\nhello\r\n0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §7.1: a chunk size past 64 bits",
            request("POST", chunked, "10000000000000005\r\nhello\r\n0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §7.1: a negative chunk size",
            request("POST", chunked, "-5\r\nhello\r\n0\r\n\r\n"),
            &[400],
        ),
        refused(
            "RFC 9112 §3: two spaces in the request line (read strictly here)",
            "GET  /r HTTP/1.1\r\nHost: h\r\nX-Api-Key: K\r\n\r\n".into(),
            &[400],
        ),
        refused(
            "RFC 9112 §2.2: a bare CR",
            "GET /r HTTP/1.1\r\nHost: h\rX: y\r\nX-Api-Key: K\r\n\r\n".into(),
            &[400],
        ),
        Case {
            rfc: "RFC 9112 §2.2: a bare LF may end a line; it goes on as CRLF",
            sent: "GET /r HTTP/1.1\nHost: h\nX-Api-Key: K\n\n".into(),
            statuses: &[200],
            closes: false,
            upstream: vec![fwd("GET", "", "")],
        },
    ];
    // RFC 9112 §3.2: a Host missing, twice, or invalid is 400; the framing is sound, so the
    // connection stays.
    for (rfc, sent) in [
        (
            "RFC 9112 §3.2: no Host",
            "GET /r HTTP/1.1\r\nX-Api-Key: K\r\n\r\n".to_owned(),
        ),
        (
            "RFC 9112 §3.2: two Hosts",
            request("GET", "Host: i\r\n", ""),
        ),
        (
            "RFC 9112 §3.2: an invalid Host",
            "GET /r HTTP/1.1\r\nHost: a b\r\nX-Api-Key: K\r\n\r\n".into(),
        ),
        (
            "RFC 9112 §3.2: a Host with a path",
            "GET /r HTTP/1.1\r\nHost: a/b\r\nX-Api-Key: K\r\n\r\n".into(),
        ),
        (
            "RFC 9112 §3.2: a Host with userinfo",
            "GET /r HTTP/1.1\r\nHost: u@a\r\nX-Api-Key: K\r\n\r\n".into(),
        ),
    ] {
        cases.push(Case {
            rfc,
            sent,
            statuses: &[400],
            closes: false,
            upstream: Vec::new(),
        });
    }
    cases
}

fn readable(requests: &[Vec<u8>]) -> Vec<String> {
    requests
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_the_upstream_framed_as_a_strict_reader_reads_them_or_not_at_all() {
    let up = Recorder::start().await;
    for limits in [false, true] {
        let gw = gateway(&up, limits).await;
        for case in cases(&up) {
            let what = format!("{} (limits {limits}): {:?}", case.rfc, case.sent);
            let (mut s, got) = exchange(&gw, case.sent.as_bytes(), case.statuses.len()).await;
            let statuses: Vec<u16> = got.iter().map(|a| a.status).collect();
            assert_eq!(statuses, case.statuses, "{what}\n{got:?}");
            if case.closes {
                assert!(closes(&mut s, &mut Vec::new()).await, "{what}: left open");
                assert!(
                    got.iter().all(|a| a.head.contains("connection: close\r\n")),
                    "{what}: {got:?}"
                );
            }
            drop(s);
            assert_eq!(
                readable(&up.take()),
                readable(&case.upstream),
                "{what}\n{got:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_chunked_bodies_and_trailers_stream_to_the_upstream_chunked() {
    let up = Recorder::start().await;
    let gw = gateway(&up, false).await;
    // Over 64 KiB of data: not read whole, but streamed, a GET's as a POST's.
    let data = "x".repeat(100 * 1024);
    for method in ["GET", "POST"] {
        let body = format!("{:x}\r\n{data}\r\n0\r\n\r\n", data.len());
        let (_, got) = exchange(
            &gw,
            request(method, "Transfer-Encoding: chunked\r\n", &body).as_bytes(),
            1,
        )
        .await;
        assert_eq!(got[0].status, 200, "{method}");
        let seen = readable(&up.take());
        assert_eq!(seen.len(), 1, "{method}");
        let head_end = seen[0].find("\r\n\r\n").unwrap();
        let head = seen[0][..head_end].to_ascii_lowercase();
        assert!(
            head.starts_with(&format!("{} /r", method.to_ascii_lowercase())),
            "{head}"
        );
        assert!(
            head.contains("transfer-encoding: chunked") && !head.contains("content-length"),
            "{head}"
        );
        let sent: String = seen[0][head_end + 4..]
            .split("\r\n")
            .filter(|l| l.starts_with('x'))
            .collect();
        assert_eq!(sent, data, "{method}");
    }
    // Trailer fields: hyper's server reads the body and its client sends it on, chunked.
    let (_, got) = exchange(
        &gw,
        request(
            "POST",
            "Transfer-Encoding: chunked\r\n",
            "5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n",
        )
        .as_bytes(),
        1,
    )
    .await;
    assert_eq!(got[0].status, 200);
    let seen = readable(&up.take());
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].contains("transfer-encoding: chunked\r\n"),
        "{seen:?}"
    );
    assert!(seen[0].contains("\r\n\r\n5\r\nhello\r\n0\r\n"), "{seen:?}");
}

/// More header lines than `server.max_headers` get 431; the bound is a setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_line_bound_is_a_setting() {
    let up = Recorder::start().await;
    let many: String = (0..150).map(|i| format!("X-F{i}: v\r\n")).collect();
    let sent = request("GET", &many, "");
    let gw = gateway(&up, true).await;
    let (_, got) = exchange(&gw, sent.as_bytes(), 1).await;
    assert_eq!(got[0].status, 431);
    assert!(up.take().is_empty());
    let mut c = Config::default();
    c.upstream.url = format!("http://{}", up.addr);
    c.server.max_headers = 200;
    let gw = TestGateway::start(c, CATALOG, FakeClock::new(1_700_000_040)).await;
    let (_, got) = exchange(&gw, sent.as_bytes(), 1).await;
    assert_eq!(got[0].status, 200);
    assert_eq!(up.take().len(), 1);
}

/// Reads what the gateway sends on `s` until it closes.
async fn read_to_close(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    while fill(s, &mut all).await > 0 {}
    String::from_utf8_lossy(&all).into_owned()
}

/// A hostile upstream's answers are read by RFC 9112 §6.3 too: what reaches the client is framed
/// one way, and nothing the upstream sends past an answer's end is read as the next answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_answers_are_framed_by_the_same_rules() {
    let up = Recorder::start().await;
    let gw = gateway(&up, false).await;
    let get = request("GET", "", "");
    // Each hostile answer, then a plain one for a second request on the same client connection:
    // the second must come on a new upstream connection.
    let hostile: &[(&str, &[u8], u16, &str)] = &[
        (
            "RFC 9112 §6.3 (3): Transfer-Encoding wins over Content-Length, which is not passed on",
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            200,
            "hello",
        ),
        (
            "RFC 9112 §6.3 (1): no body on a 204, whatever its length says",
            b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
            204,
            "",
        ),
        (
            "RFC 9112 §6.3 (1): nor on a 304",
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\nhello",
            304,
            "",
        ),
        (
            "RFC 9112 §6.3: bytes after the end are not the next answer",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil",
            200,
            "ok",
        ),
        (
            "RFC 9110 §8.6: two different lengths are a bad answer (502)",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nokk",
            502,
            "",
        ),
    ];
    for (rfc, answer, status, body) in hostile {
        up.answer_with(&[answer, OK]);
        let (_, got) = exchange(&gw, (get.clone() + &get).as_bytes(), 2).await;
        assert_eq!(got[0].status, *status, "{rfc}: {got:?}");
        if *status != 502 {
            assert_eq!(String::from_utf8_lossy(&got[0].body), *body, "{rfc}");
        }
        assert!(!got[0].head.contains("content-length: 3"), "{rfc}: {got:?}");
        assert_eq!(
            (got[1].status, got[1].body.as_slice()),
            (200, &b"ok"[..]),
            "{rfc}"
        );
        let seen = up.take_with_connections();
        assert_eq!(seen.len(), 2, "{rfc}");
        assert_ne!(seen[0].0, seen[1].0, "{rfc}: the connection was used again");
    }
    // A chunk out of grammar: the client's answer is cut short (no last chunk), and closed.
    up.answer_with(&[
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",
        OK,
    ]);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(get.as_bytes()).await.unwrap();
    let all = read_to_close(&mut s).await;
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all:?}");
    assert!(!all.ends_with("0\r\n\r\n"), "{all:?}");
    up.take();
}

/// `Expect: 100-continue` (RFC 9110 §10.1.1): the client that waits is sent `100 Continue`, then
/// its body is read and the request forwarded with it; one that does not wait is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_waits_for_100_continue_is_sent_it() {
    let up = Recorder::start().await;
    let gw = gateway(&up, true).await;
    let head = request("POST", "Expect: 100-continue\r\nContent-Length: 5\r\n", "");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    while !buf.ends_with(b"\r\n\r\n") {
        assert!(fill(&mut s, &mut buf).await > 0, "closed: {buf:?}");
    }
    assert_eq!(buf, b"HTTP/1.1 100 Continue\r\n\r\n");
    buf.clear();
    s.write_all(b"hello").await.unwrap();
    let answer = read_answer(&mut s, &mut buf, false).await.unwrap();
    assert_eq!(answer.status, 200);
    let want = forwarded(
        &up,
        "POST",
        "h",
        "expect: 100-continue\r\ncontent-length: 5\r\n",
        "hello",
    );
    assert_eq!(readable(&up.take()), readable(std::slice::from_ref(&want)));
    // Sent with its body: no interim answer.
    let sent = request(
        "POST",
        "Expect: 100-continue\r\nContent-Length: 5\r\n",
        "hello",
    );
    let (_, got) = exchange(&gw, sent.as_bytes(), 1).await;
    assert_eq!(got[0].status, 200);
    assert_eq!(readable(&up.take()), readable(&[want]));
}

/// After a hand-off to hyper's server (here by an upgrade the upstream declines), its later
/// requests are read by hyper:
/// a coding but chunked is still refused (by admission), and a request with both a length and a
/// coding is read chunked, sent on without the length, and the connection closed after it
/// (docs/semantics.md: the same boundaries, forwarded rather than refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_hand_off_hyper_reads_the_same_boundaries() {
    let up = Recorder::start().await;
    let gw = gateway(&up, true).await;
    let first = request("GET", "Connection: Upgrade\r\nUpgrade: websocket\r\n", "");
    let coded = request(
        "POST",
        "Transfer-Encoding: deflate, chunked\r\n",
        "2\r\nab\r\n0\r\n\r\n",
    );
    let (_, got) = exchange(&gw, (first.clone() + &coded).as_bytes(), 2).await;
    assert_eq!((got[0].status, got[1].status), (200, 501), "{got:?}");
    assert_eq!(up.take().len(), 1);
    let both = request(
        "POST",
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "2\r\nab\r\n0\r\n\r\n",
    );
    let (mut s, got) = exchange(&gw, (first + &both).as_bytes(), 2).await;
    assert_eq!((got[0].status, got[1].status), (200, 200), "{got:?}");
    assert!(closes(&mut s, &mut Vec::new()).await);
    let seen = readable(&up.take());
    assert_eq!(seen.len(), 2);
    assert!(
        seen[1].contains("transfer-encoding: chunked\r\n") && !seen[1].contains("content-length"),
        "{seen:?}"
    );
}
