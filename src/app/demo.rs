//! demo: the example upstream API used by the quick start, the demo and the benchmark.
//!
//! It answers every request with 200 and a JSON echo of what it received (method, path, query,
//! headers, body size), which makes it easy to see what quotagate forwards.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::server::RequestBody;
use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};

/// Largest body the example upstream reads. Default: 1 MiB.
const MAX_BODY: usize = 1024 * 1024;

/// Handles one request to the example upstream.
pub async fn echo(_peer: SocketAddr, req: Request<RequestBody>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body_bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => serde_json::json!(b.to_bytes().len()),
        Err(_) => serde_json::json!("too large"),
    };
    let headers: BTreeMap<&str, &str> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.to_str().unwrap_or("<binary>")))
        .collect();
    let doc = serde_json::json!({
        "upstream": "quotagate example upstream",
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "headers": headers,
        "body_bytes": body_bytes,
    });
    let mut resp = Response::new(Full::new(Bytes::from(doc.to_string())));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The catalog of the quick start (`catalogs/quickstart.json`), built into the binary so
/// `quotagate quickstart` works from any directory.
pub const QUICKSTART_CATALOG: &[u8] = include_bytes!("../../catalogs/quickstart.json");
