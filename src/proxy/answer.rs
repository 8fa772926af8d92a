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
use crate::problem::{QUOTA_EXCEEDED, problem};

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

/// The answer when forwarding failed, and the decision it is counted as.
pub fn upstream_failure(e: UpstreamError) -> (Decision, Rejection<'static>) {
    let (decision, status, detail) = match e {
        UpstreamError::Unreachable => (
            Decision::UpstreamError,
            StatusCode::BAD_GATEWAY,
            "the upstream cannot be reached",
        ),
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
