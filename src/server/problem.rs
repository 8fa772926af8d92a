//! problem: the small JSON bodies (RFC 9457 `application/problem+json`) of the answers quotagate
//! gives itself instead of the upstream.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// Problem type of a 429, as registered for the IETF RateLimit draft.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Builds a problem response. `kind` is `None` for `about:blank` (the status says it all).
pub fn problem(
    status: StatusCode,
    kind: Option<&str>,
    detail: &str,
    violated: Option<&str>,
) -> Response<Full<Bytes>> {
    let mut body = serde_json::json!({
        "type": kind.unwrap_or("about:blank"),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(policy) = violated {
        body["violated-policies"] = serde_json::json!([policy]);
    }
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn body_is_problem_json() {
        let r = problem(
            StatusCode::TOO_MANY_REQUESTS,
            Some(QUOTA_EXCEEDED),
            "slow down",
            Some("GET /a"),
        );
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 429);
        assert_eq!(v["title"], "Too Many Requests");
        assert_eq!(v["violated-policies"][0], "GET /a");
    }
}
