//! Generates the gRPC service code of the Envoy rate-limit service (`src/rls`) from a Rust
//! description: no `.proto` files and no `protoc` (the messages are in `src/rls/proto.rs`).

fn main() {
    let method = tonic_build::manual::Method::builder()
        .name("should_rate_limit")
        .route_name("ShouldRateLimit")
        .input_type("crate::rls::proto::RateLimitRequest")
        .output_type("crate::rls::proto::RateLimitResponse")
        .codec_path("tonic_prost::ProstCodec")
        .build();
    let service = tonic_build::manual::Service::builder()
        .name("RateLimitService")
        .package("envoy.service.ratelimit.v3")
        .method(method)
        .build();
    tonic_build::manual::Builder::new()
        .build_transport(false)
        .compile(&[service]);
}
