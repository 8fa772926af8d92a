# quotagate container image: a release build, then a small runtime image that runs as a non-root user.
#   docker build -t quotagate .                        (profile-guided: about 25 minutes)
#   docker build --build-arg PGO=0 -t quotagate .      (plain release build: about 10)
#   docker run --rm -p 127.0.0.1:8080:8080 quotagate quickstart --listen 0.0.0.0:8080
#
# Where the binary comes from (build argument BINARY): `build` (default) compiles it in the
# builder image (BUILDER_IMAGE, default rust:1-bookworm); `prebuilt` takes target/release/quotagate
# from the build context, built beforehand with `cargo build --release --locked` on Debian
# bookworm (scripts/check-image.sh does this: no Rust image is reachable where it runs). The
# runtime image is the same either way.
#
# How `build` compiles it (build argument PGO): 1 (default) is the profile-guided build of
# scripts/build-pgo.sh, about 0.8x the CPU a request of the plain one and about 25 minutes on 2
# cores (two release builds and 40 s of training loads, which need the network only to install
# wrk, openssl, python3 and redis-server in the builder and rustup's llvm-tools); 0 is the plain
# `cargo build --release` (about 10 minutes; the compose demo uses it).
ARG BINARY=build
ARG BUILDER_IMAGE=rust:1-bookworm

FROM ${BUILDER_IMAGE} AS build
ARG PGO=1
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
# The quick start's catalog is built into the binary.
COPY catalogs ./catalogs
COPY scripts/build-pgo.sh scripts/bench-lib.sh ./scripts/
# redis-server: the training runs the Redis store too (it is skipped without one).
RUN if [ "$PGO" = 1 ]; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        wrk openssl python3 redis-server \
      && scripts/build-pgo.sh /quotagate; \
    else \
      cargo build --release --locked && cp target/release/quotagate /quotagate; \
    fi

FROM scratch AS prebuilt
COPY target/release/quotagate /quotagate

FROM ${BINARY} AS binary

FROM debian:bookworm-slim
# ca-certificates: the catalog poller and `quotagate health` build their HTTP client with the
# system's roots, and refuse to start without any (https catalog servers need them anyway).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quotagate \
 && install -d -o quotagate -g quotagate -m 0700 /var/lib/quotagate
COPY --from=binary /quotagate /usr/local/bin/quotagate
# Example catalogs, rule files and demo configs; relative paths in configs resolve from here.
WORKDIR /etc/quotagate
COPY catalogs ./catalogs
COPY examples ./examples
USER 10001
# The embedded store's counters when QUOTAGATE_STORE_PATH=/var/lib/quotagate (store.path; empty by
# default: memory only). One volume per instance: a directory serves one process at a time.
VOLUME /var/lib/quotagate
# proxy, admin (/metrics /healthz /readyz), Divvy port
EXPOSE 8080 8081 8321
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["quotagate", "health", "http://127.0.0.1:8081/healthz"]
ENTRYPOINT ["quotagate"]
