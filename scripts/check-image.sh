#!/usr/bin/env bash
# check-image.sh: builds the container image from the real Dockerfile and runs it, then brings up
# the compose demo and runs the README's demo commands against it, with podman and podman-compose
# (no Docker engine runs here). One line per step; the first failure stops it, named, with the
# end of its output. Needs root, podman, podman-compose, runc, debootstrap and curl (.ci/run
# installs them).
#
# No registry of base images is reachable here, so stand-ins are made when missing, from Debian's
# packages: debian:bookworm-slim (debootstrap --variant=minbase), redis:7-alpine (Debian's
# redis-server on it) and prom/prometheus:v2.53.0 (Debian's prometheus). Grafana is not packaged by
# Debian: it stays in docker-compose.yml but out of this check. The image is built with
# BINARY=prebuilt (the Dockerfile's stage for a binary built outside: no Rust image here either);
# its runtime stage is the one Docker users build. BUILD_IN_IMAGE=1 builds it as Docker users do
# instead (BINARY=build, profile-guided), in a stand-in rust:1-bookworm.
#
# Ports: the compose file's own (127.0.0.1:8080, 8081, 8090, 8091, 8321, 9000, 9090, 9100) and one
# free port for the single container; everything is published on loopback only.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=$(mktemp -d)
PROJECT=qgcheck
SINGLE=qgcheck-quickstart

# podman as this machine needs it (crun refuses its cgroups; runc needs explicit limits), without
# touching the system's configuration.
nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=65536; [ "$nofile" -gt 65536 ] && nofile=65536
cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
export CONTAINERS_CONF="$WORK/containers.conf"

cleanup() {
  (cd "$WORK/demo" 2>/dev/null && podman-compose -p "$PROJECT" down >/dev/null 2>&1)
  podman rm -f "$SINGLE" >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

# step NAME COMMAND...: runs COMMAND; on failure names the step, shows its output's end, exits 1.
step() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    echo "ok: $name"
  else
    echo "FAILED: $name"
    echo "$out" | tail -25 | sed 's/^/  /'
    exit 1
  fi
}

# until_ok SECONDS COMMAND...: retries COMMAND every half second until it succeeds.
until_ok() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -ge "$deadline" ] && { "$@"; return 1; }
    sleep 0.5
  done
}

# ---- stand-in base images ----

base_image() {
  podman image exists debian:bookworm-slim && return 0
  debootstrap --variant=minbase bookworm "$WORK/root" http://deb.debian.org/debian >/dev/null \
    && tar -C "$WORK/root" -c . | podman import - debian:bookworm-slim >/dev/null \
    && rm -rf "$WORK/root"
}

# standin IMAGE PACKAGE INSTRUCTIONS: IMAGE from debian:bookworm-slim plus Debian's PACKAGE.
standin() {
  podman image exists "$1" && return 0
  printf 'FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y --no-install-recommends %s && rm -rf /var/lib/apt/lists/*\n%s\n' \
    "$2" "$3" | podman build --format docker -t "$1" -f - "$WORK" >/dev/null
}

step "stand-in image debian:bookworm-slim (debootstrap)" base_image
step "stand-in image redis:7-alpine (Debian's redis-server)" \
  standin redis:7-alpine redis-server 'CMD ["redis-server"]'
step "stand-in image prom/prometheus:v2.53.0 (Debian's prometheus)" \
  standin prom/prometheus:v2.53.0 prometheus \
  'RUN mkdir -p /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'

# ---- the image ----

# rust_standin: rust:1-bookworm as the official image has it where it matters here (rustup's
# toolchain in /usr/local/cargo, gcc), from debian:bookworm-slim and rustup of this machine's rustc
# version (static.rust-lang.org is reachable where Docker Hub is not). It trusts this machine's own
# added CAs (/usr/local/share/ca-certificates: our machines reach the internet through a
# TLS-inspecting proxy), so that rustup, cargo and the build's downloads work in it as here.
rust_standin() {
  podman image exists rust:1-bookworm && return 0
  mkdir -p "$WORK/cas"
  cp /usr/local/share/ca-certificates/*.crt "$WORK/cas/" 2>/dev/null || true
  printf '%s\n' 'FROM debian:bookworm-slim' \
    'ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH' \
    'COPY cas/ /usr/local/share/ca-certificates/' \
    'RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev make pkg-config && rm -rf /var/lib/apt/lists/* && update-ca-certificates' \
    "RUN curl -sSf -o /tmp/rustup-init https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init && chmod +x /tmp/rustup-init && /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain $(rustc -V | awk '{print $2}') && rm /tmp/rustup-init" |
    podman build --format docker -t rust:1-bookworm -f - "$WORK" >/dev/null
}

if [ "${BUILD_IN_IMAGE:-0}" = 1 ]; then
  # What Docker users build: the Dockerfile's default, the profile-guided build in the Rust image
  # (about 25 minutes on 2 cores; run by hand, not by CI).
  step "stand-in image rust:1-bookworm (debian:bookworm-slim + rustup)" rust_standin
  # Its stage `build` first, tagged: podman 4.3 does not see that `FROM ${BINARY}` makes that
  # stage used (Docker's BuildKit does), so the image is then built from the tagged stage.
  step "the Dockerfile's stage build (PGO=1: its default), tagged quotagate:builder" \
    podman build --format docker --target build -t quotagate:builder .
  step "image quotagate:demo from the Dockerfile, its binary from that stage" \
    podman build --format docker --build-arg BINARY=quotagate:builder -t quotagate:demo .
else
  # What is checked here is the image and the demo, not the optimiser: the binary is built
  # without the release profile's whole-program optimisation (fat LTO, one codegen unit: about 10
  # minutes on 2 cores, most of this check's time) and at opt-level 1. Its code is the same.
  step "release binary (cargo build --release --locked, LTO off, opt-level 1)" \
    env CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo build --release --locked --quiet
  # --format docker: OCI images have no HEALTHCHECK.
  step "image quotagate:demo from the Dockerfile (BINARY=prebuilt)" \
    podman build --format docker --build-arg BINARY=prebuilt -t quotagate:demo .
fi

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
step "container runs quickstart, published on 127.0.0.1:$PORT" \
  podman run -d --name "$SINGLE" -p "127.0.0.1:$PORT:8080" quotagate:demo quickstart --listen 0.0.0.0:8080

# code URL [CURL ARGS...]: the HTTP status of a GET.
code() { local url=$1; shift; curl -s -o /dev/null -w '%{http_code}' "$@" "$url"; }
expect_code() { local want=$1 got; shift; got=$(code "$@"); [ "$got" = "$want" ] || { echo "$* answered $got, not $want"; return 1; }; }

step "quickstart answers through the published port (200, 200, 429, 401)" bash -c "
  $(declare -f code expect_code until_ok)
  until_ok 30 expect_code 200 http://127.0.0.1:$PORT/users/42 -H 'X-Api-Key: demo-key' &&
  expect_code 200 http://127.0.0.1:$PORT/reports/7 -H 'X-Api-Key: demo-key' &&
  expect_code 429 http://127.0.0.1:$PORT/reports/7 -H 'X-Api-Key: demo-key' &&
  expect_code 401 http://127.0.0.1:$PORT/users/42"
step "the container runs as uid 10001" bash -c "
  uid=\$(podman exec $SINGLE id -u); [ \"\$uid\" = 10001 ] || { echo \"uid \$uid\"; exit 1; }"
healthy() {
  podman healthcheck run "$SINGLE" >/dev/null 2>&1
  local s; s=$(podman inspect --format '{{.State.Health.Status}}' "$SINGLE")
  [ "$s" = healthy ] || { echo "health: $s"; podman inspect --format '{{json .State.Health.Log}}' "$SINGLE"; return 1; }
}
step "HEALTHCHECK turns healthy" until_ok 20 healthy
podman rm -f "$SINGLE" >/dev/null 2>&1

# ---- the compose demo ----

# A copy: the README's demo edits a catalog file, which must not be the repository's.
mkdir -p "$WORK/demo"
cp -r docker-compose.yml examples catalogs "$WORK/demo/"
cd "$WORK/demo"
SERVICES=(redis upstream catalog gateway-a gateway-b prometheus)
step "podman-compose up (${SERVICES[*]}; grafana left out: not packaged by Debian)" \
  podman-compose -p "$PROJECT" up -d --no-build "${SERVICES[@]}"
ready() { expect_code 200 "http://127.0.0.1:$1/readyz"; }
step "both gateways ready (catalog loaded from the catalog server)" \
  until_ok 60 bash -c "$(declare -f code expect_code ready); ready 8081 && ready 8091"

demo_limit() {
  local codes="" port
  for _ in $(seq 6); do for port in 8080 8090; do
    codes+="$(code "http://127.0.0.1:$port/items/1" -H 'X-Api-Key: demo-key') "
  done; done
  [ "$codes" = "200 200 200 200 200 200 200 200 200 200 429 429 " ] || { echo "codes: $codes"; return 1; }
  local head; head=$(curl -s -i -H 'X-Api-Key: demo-key' http://127.0.0.1:8090/items/1)
  echo "$head" | grep -qi '^retry-after:' && echo "$head" | grep -qi '^ratelimit-remaining: 0' \
    || { echo "$head"; return 1; }
}
step "demo: 10 x 200 then 429 across both gateways, with Retry-After" demo_limit

limit_on() { # PORT [REFRESH]: gold-key's RateLimit-Limit on a gateway
  local extra=()
  [ -n "${2:-}" ] && extra=(-H 'X-Quotagate-Refresh: demo-refresh-secret')
  curl -s -i -H 'X-Api-Key: gold-key' "${extra[@]}" "http://127.0.0.1:$1/items/1" \
    | awk 'tolower($1)=="ratelimit-limit:"{print $2}' | tr -d '\r'
}
lowered() { [ "$(limit_on 8090)" = 3 ]; }
refresh() {
  sed -i 's/"rl": 100/"rl": 3/' examples/demo/catalogs/v0001.json
  local a; a=$(limit_on 8080 refresh)
  [ "$a" = 3 ] || { echo "gateway A says RateLimit-Limit: $a after the forced refresh"; return 1; }
  until_ok 5 lowered || { echo "gateway B says RateLimit-Limit: $(limit_on 8090)"; return 1; }
}
step "demo: forced refresh on A applies the new limit, B follows within seconds" refresh

divvy() {
  local line
  line=$(bash -c 'exec 3<>/dev/tcp/127.0.0.1/8321; printf "HIT method=GET path=/status\n" >&3; head -1 <&3')
  [ "$line" = "OK true 999 60" ] || { echo "Divvy answered: $line"; return 1; }
}
step "demo: the Divvy port answers OK true 999 60" divvy
step "demo: /metrics counts requests" bash -c \
  "curl -s http://127.0.0.1:8081/metrics | grep -q '^quotagate_requests_total{'"
scraped() {
  local t; t=$(curl -s http://127.0.0.1:9090/api/v1/targets)
  [ "$(echo "$t" | grep -o '"health":"up"' | wc -l)" -ge 2 ] || { echo "$t"; return 1; }
}
step "Prometheus scrapes both gateways" until_ok 60 scraped
step "podman-compose down" podman-compose -p "$PROJECT" down
echo "image and compose demo: all checks passed"
