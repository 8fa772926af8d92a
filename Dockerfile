# quotagate container image: a release build, then a small runtime image that runs as a non-root user.
#   docker build -t quotagate .
#   docker run --rm -p 127.0.0.1:8080:8080 quotagate quickstart --listen 0.0.0.0:8080
#
# Where the binary comes from (build argument BINARY): `build` (default) compiles it in the
# builder image (BUILDER_IMAGE, default rust:1-bookworm); `prebuilt` takes target/release/quotagate
# from the build context, built beforehand with `cargo build --release --locked` on Debian
# bookworm (scripts/check-image.sh does this: no Rust image is reachable where it runs). The
# runtime image is the same either way.
ARG BINARY=build
ARG BUILDER_IMAGE=rust:1-bookworm

FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
# The quick start's catalog is built into the binary.
COPY catalogs ./catalogs
RUN cargo build --release --locked && cp target/release/quotagate /quotagate

FROM scratch AS prebuilt
COPY target/release/quotagate /quotagate

FROM ${BINARY} AS binary

FROM debian:bookworm-slim
# ca-certificates: the catalog poller and `quotagate health` build their HTTP client with the
# system's roots, and refuse to start without any (https catalog servers need them anyway).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quotagate
COPY --from=binary /quotagate /usr/local/bin/quotagate
# Example catalogs, rule files and demo configs; relative paths in configs resolve from here.
WORKDIR /etc/quotagate
COPY catalogs ./catalogs
COPY examples ./examples
USER 10001
# proxy, admin (/metrics /healthz /readyz), Divvy port
EXPOSE 8080 8081 8321
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["quotagate", "health", "http://127.0.0.1:8081/healthz"]
ENTRYPOINT ["quotagate"]
