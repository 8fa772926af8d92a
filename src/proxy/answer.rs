//! answer: the HTTP answers quotagate gives itself: a refusal as a problem+json response with its
//! rate-limit fields, and an upstream failure as the refusal it becomes. (What to answer is
//! `admission`'s; how it looks on the wire is here.)

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

use super::admission::{Decision, Rejection};
use super::headers;
use super::upstream::UpstreamError;
use crate::config::HeaderSet;
use crate::server::problem::{QUOTA_EXCEEDED, problem};

impl Rejection<'_> {
    /// The response, with the rate-limit fields of `fields` on a 429.
    pub fn response(&self, fields: HeaderSet) -> Response<Full<Bytes>> {
        let Some(rate) = &self.limit else {
            return problem(self.status, None, &self.detail, None);
        };
        let mut resp = problem(
            self.status,
            Some(QUOTA_EXCEEDED),
            &self.detail,
            Some(rate.name),
        );
        headers::set_rate_limit(resp.headers_mut(), fields, rate);
        resp
    }
}

/// gRPC status codes of the answers quotagate gives itself.
mod grpc {
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;
    pub const UNKNOWN: u32 = 2;
}

/// Is this request gRPC (`content-type: application/grpc...`)? Its refusals then take gRPC's form.
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    super::headers::find(headers, &http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl Rejection<'_> {
    /// The gRPC status this refusal is, by the HTTP status it would have been (an unknown API
    /// key, a 403 over HTTP, is UNAUTHENTICATED).
    pub fn grpc_status(&self) -> u32 {
        match self.status.as_u16() {
            _ if self.unknown_key => grpc::UNAUTHENTICATED,
            400 => grpc::INVALID_ARGUMENT,
            401 => grpc::UNAUTHENTICATED,
            403 => grpc::PERMISSION_DENIED,
            404 => grpc::UNIMPLEMENTED,
            413 | 429 => grpc::RESOURCE_EXHAUSTED,
            502 | 503 => grpc::UNAVAILABLE,
            504 => grpc::DEADLINE_EXCEEDED,
            _ => grpc::UNKNOWN,
        }
    }

    /// The refusal as gRPC clients read it: a trailers-only response (HTTP 200, `grpc-status`,
    /// `grpc-message` percent-encoded, no body), with the rate-limit fields on a refusal over the
    /// limit.
    pub fn grpc_response(&self, fields: HeaderSet) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::new()));
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-status", http::HeaderValue::from(self.grpc_status()));
        if let Ok(v) = http::HeaderValue::try_from(grpc_message(&self.detail)) {
            h.insert("grpc-message", v);
        }
        if let Some(rate) = &self.limit {
            headers::set_rate_limit(h, fields, rate);
        }
        resp
    }
}

/// `grpc-message`: percent-encoded, as the gRPC HTTP/2 protocol asks (space to `~` stay, but `%`).
fn grpc_message(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for b in text.bytes() {
        if (b' '..=b'~').contains(&b) && b != b'%' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// The answer when forwarding failed, and the decision it is counted as.
pub fn upstream_failure(e: UpstreamError) -> (Decision, Rejection<'static>) {
    let (decision, status, detail) = match e {
        UpstreamError::Unreachable { target, reason } => {
            return (
                Decision::UpstreamError,
                Rejection::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the upstream {target} cannot be reached: {reason}"),
                ),
            );
        }
        UpstreamError::Broken => (
            Decision::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "the upstream connection failed",
        ),
        UpstreamError::Timeout => (
            Decision::UpstreamError,
            StatusCode::GATEWAY_TIMEOUT,
            "the upstream did not answer in time",
        ),
        UpstreamError::BodyTooLarge => (
            Decision::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is too large",
        ),
        // The client's fault: not an upstream failure.
        UpstreamError::BadRequestBody => (
            Decision::BadRequest,
            StatusCode::BAD_REQUEST,
            "the request body could not be read (malformed or cut short)",
        ),
    };
    (decision, Rejection::new(status, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_the_grpc_statuses_clients_expect() {
        let code =
            |status: u16| Rejection::new(StatusCode::from_u16(status).unwrap(), "x").grpc_status();
        let got: Vec<u32> = [429, 401, 403, 404, 400, 413, 502, 503, 504, 500]
            .into_iter()
            .map(code)
            .collect();
        assert_eq!(got, [8, 16, 7, 12, 3, 8, 14, 14, 4, 2]);
        let mut unknown = Rejection::new(StatusCode::FORBIDDEN, "x");
        unknown.unknown_key = true;
        assert_eq!(unknown.grpc_status(), 16);
        let (_, timeout) = upstream_failure(UpstreamError::Timeout);
        assert_eq!(timeout.grpc_status(), 4, "DEADLINE_EXCEEDED");
        let (_, down) = upstream_failure(UpstreamError::Unreachable {
            target: "https://a.test".into(),
            reason: "TLS handshake failed: invalid peer certificate: Expired".into(),
        });
        assert_eq!(down.grpc_status(), 14, "UNAVAILABLE");
        assert_eq!(
            down.detail,
            "the upstream https://a.test cannot be reached: TLS handshake failed: invalid peer certificate: Expired"
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(
            grpc_message("retry after 5 s; 100% é"),
            "retry after 5 s; 100%25 %C3%A9"
        );
    }
}
