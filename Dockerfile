# quotagate container image: a release build, then a small runtime image that runs as a non-root user.
#   docker build -t quotagate .
#   docker run --rm -p 8080:8080 quotagate quickstart --listen 0.0.0.0:8080
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
# The quick start's catalog is built into the binary.
COPY catalogs ./catalogs
RUN cargo build --release --locked

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quotagate
COPY --from=build /src/target/release/quotagate /usr/local/bin/quotagate
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
