#!/usr/bin/env bash
# build-pgo.sh: the release binary laid out by profile-guided optimisation (PGO): the same code as
# `cargo build --release`, its hot paths placed and inlined by what a training load ran.
#
#   scripts/build-pgo.sh [OUT]      (default: target/pgo/quotagate)
#
# 1. An instrumented release build (`-Cprofile-generate`, in target/pgo-gen).
# 2. Training, about 40 s: the instrumented gateway serves wrk loads (1000 API keys round robin) on
#    the memory store, the Redis store (when redis-server is there), with limits off and with one key
#    over its limit, keep-alive and a new connection per request, cleartext and TLS; and its Divvy
#    port serves `quotagate divvy-load`. Each gateway is stopped with SIGTERM, so that it exits
#    through `main` and writes its profile. The upstream's and the load generator's own profiles
#    are kept apart and not used.
# 3. The profiles merged by `llvm-profdata` of rustc's own LLVM major version (rustup's llvm-tools
#    component, added when missing where rustup is; else Debian's llvm-N, installed when missing
#    and run as root).
# 4. The release build with `-Cprofile-use` (in target/pgo-use), copied to OUT.
#
# About 25 minutes on 2 cores (two release builds). Paths the training does not run (HTTP/2,
# WebSocket, the rate-limit service) are laid out as cold code: docs/benchmarks/ has what was
# measured both ways. Needs wrk, openssl and python3 (installed from Debian's packages when
# missing). The Dockerfile's default build runs this script.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROOT=$(pwd)
OUT=${1:-target/pgo/quotagate}
SECS=${PGO_TRAIN_SECONDS:-4}

ensure_debian_packages wrk:wrk openssl:openssl python3:python3
host=$(rustc -vV | sed -n 's/^host: //p')
major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
# rustup's component is rustc's own LLVM whatever the distribution packages (Debian bookworm has no
# llvm-N as new as a current rustc's).
if [ ! -x "$PROFDATA" ] && command -v rustup >/dev/null; then
  rustup component add llvm-tools >&2 || true
fi
if [ ! -x "$PROFDATA" ]; then
  ensure_debian_packages "llvm-profdata-$major:llvm-$major"
  PROFDATA=$(command -v "llvm-profdata-$major") || {
    echo "no llvm-profdata for LLVM $major: rustup component add llvm-tools, or apt-get install llvm-$major" >&2
    exit 1
  }
fi

bench_workdir
RAW=$WORK/raw
mkdir -p "$RAW" "$WORK/other"

echo "1/4 instrumented build (target/pgo-gen)" >&2
RUSTFLAGS="-Cprofile-generate=$RAW" cargo build --release --locked --quiet --target-dir target/pgo-gen
BIN=$ROOT/target/pgo-gen/release/quotagate

echo "2/4 training" >&2
# Everything but the gateways under training writes its profile elsewhere.
export LLVM_PROFILE_FILE="$WORK/other/%p-%m.profraw"
python3 - "$WORK/catalog.json" <<'PY'
import json, sys
keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}]} for i in range(1000)]
keys.append({"key": "hog", "limits": [{"ep": 0, "rl": 10}]})
json.dump({"version": {"semver": "pgo", "hash": "pgo"}, "methods": ["GET", "POST"],
           "paths": ["/users/{id}", "/users/{id}/prefs"],
           "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 1}], "apilimits": keys}, open(sys.argv[1], "w"))
PY
many_keys_lua "$WORK/many-keys.lua"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=pgo \
  -addext subjectAltName=DNS:localhost -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
divvy_rules "$WORK/rules.ini"

UP=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP" 2>/dev/null & PIDS+=($!)
wait_port "$UP"
REDIS_ARGS=()
if command -v redis-server >/dev/null; then
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
  wait_port "$REDIS_PORT"
  REDIS_ARGS=(--store redis --redis-url "redis://127.0.0.1:$REDIS_PORT")
fi

# train SCHEME WRK_ARGS -- GATEWAY_ARGS...: one instrumented gateway under one wrk load.
train() {
  local scheme=$1 wrkargs=() gwargs=() port pid
  shift
  while [ "$1" != -- ]; do wrkargs+=("$1"); shift; done
  shift
  gwargs=("$@")
  port=$(free_port)
  LLVM_PROFILE_FILE="$RAW/gw-%p-%m.profraw" "$BIN" --listen "127.0.0.1:$port" \
    --upstream "http://127.0.0.1:$UP" --catalog "$WORK/catalog.json" --set log.level=error \
    --set admin.listen=127.0.0.1:0 "${gwargs[@]}" 2>>"$WORK/gw.log" & pid=$!
  wait_port "$port"
  wrk -t2 -c32 -d"${SECS}s" "${wrkargs[@]}" "$scheme://127.0.0.1:$port/users/1" >/dev/null
  kill -TERM "$pid"; wait "$pid" || true
}
MANY=(-s "$WORK/many-keys.lua")
TLS=(--set "server.tls_cert_file=$WORK/cert.pem" --set "server.tls_key_file=$WORK/key.pem")
train http "${MANY[@]}" -- 
train http "${MANY[@]}" -H 'Connection: close' --
train http "${MANY[@]}" -- --set limits.enabled=false
train http "${MANY[@]}" -H 'Connection: close' -- --set limits.enabled=false
train http -H 'X-Api-Key: hog' --
train https "${MANY[@]}" -- "${TLS[@]}"
train https "${MANY[@]}" -H 'Connection: close' -- "${TLS[@]}"
if [ "${#REDIS_ARGS[@]}" -gt 0 ]; then
  train http "${MANY[@]}" -- "${REDIS_ARGS[@]}"
  train http "${MANY[@]}" -- "${REDIS_ARGS[@]}" --set store.lease=off
fi
DPORT=$(free_port)
PORT=$DPORT LLVM_PROFILE_FILE="$RAW/divvy-%p-%m.profraw" "$BIN" divvy "$WORK/rules.ini" \
  --set log.level=error >/dev/null 2>&1 & DPID=$!
wait_port "$DPORT"
"$BIN" divvy-load --addr "127.0.0.1:$DPORT" --connections 16 --depth 4 --seconds "$SECS" --deny-percent 30 >/dev/null
kill -TERM "$DPID"; wait "$DPID" || true
ls "$RAW"/*.profraw >/dev/null 2>&1 || { echo "training wrote no profile (see $WORK/gw.log)" >&2; cat "$WORK/gw.log" >&2; exit 1; }

echo "3/4 merging $(ls "$RAW"/*.profraw | wc -l) profiles with $PROFDATA" >&2
"$PROFDATA" merge -o "$WORK/quotagate.profdata" "$RAW"/*.profraw

echo "4/4 optimised build (target/pgo-use)" >&2
unset LLVM_PROFILE_FILE
RUSTFLAGS="-Cprofile-use=$WORK/quotagate.profdata" cargo build --release --locked --quiet --target-dir target/pgo-use
mkdir -p "$(dirname "$OUT")"
cp target/pgo-use/release/quotagate "$OUT"
cp "$WORK/quotagate.profdata" "$(dirname "$OUT")/quotagate.profdata"
echo "$OUT (profile: $(dirname "$OUT")/quotagate.profdata)" >&2
