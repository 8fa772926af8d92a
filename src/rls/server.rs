//! server: the gRPC port. `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
//! `grpc.health.v1.Health` (SERVING for `""` and `ratelimit`; a rule file that does not load
//! changes nothing here), on the gateway's HTTP server ([`crate::server::serve`]: HTTP/2 by
//! prior knowledge, the same connection limits and drain). The generated service code
//! (`build.rs`) decodes and encodes; [`Rls`] decides.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::server::RequestBody;
use http::{Request, Response};
use tokio::net::TcpListener;
use tonic::codegen::Service;
use tonic_health::ServingStatus;

use super::service::Rls;
use crate::server::{Executor, HttpSettings};

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    include!(concat!(
        env!("OUT_DIR"),
        "/envoy.service.ratelimit.v3.RateLimitService.rs"
    ));
}

pub use generated::rate_limit_service_client::RateLimitServiceClient;
use generated::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};

/// The service name `grpc.health.v1.Health` answers for, besides `""`.
pub const HEALTH_NAME: &str = "ratelimit";

/// [`Rls`] as the generated server wants it.
struct Door(Arc<Rls>);

#[tonic::async_trait]
impl RateLimitService for Door {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<super::proto::RateLimitRequest>,
    ) -> Result<tonic::Response<super::proto::RateLimitResponse>, tonic::Status> {
        match self.0.should_rate_limit(request.get_ref()).await {
            Ok(r) => Ok(tonic::Response::new(r)),
            Err(invalid) => Err(tonic::Status::invalid_argument(invalid.0)),
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Response<tonic::body::Body>> + Send>>;

/// Serves the service on `listener` until `shutdown` completes, then drains. `false` if the
/// drain timed out with calls in flight.
pub async fn serve(
    listener: TcpListener,
    rls: Arc<Rls>,
    settings: HttpSettings,
    executor: Executor,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(HEALTH_NAME, ServingStatus::Serving)
        .await;
    let door = RateLimitServiceServer::new(Door(rls));
    let route = move |_peer, req: Request<RequestBody>| -> Answer {
        if req.uri().path().starts_with("/grpc.health.v1.Health/") {
            let mut health = health.clone();
            Box::pin(async move { health.call(req).await.unwrap_or_else(|e| match e {}) })
        } else {
            let mut door = door.clone();
            Box::pin(async move { door.call(req).await.unwrap_or_else(|e| match e {}) })
        }
    };
    let drained = crate::server::serve(listener, settings, executor, route, shutdown).await;
    drop(reporter);
    drained
}
