#!/usr/bin/env bash
# Benchmark: requests/s and latency of the example upstream alone and through quotagate.
#
#   scripts/bench.sh [DURATION_SECONDS] [CONNECTIONS]      (defaults: 10 s, 64 connections)
#
# Builds release binaries, starts the example upstream, a private redis-server (TCP on a free loopback
# port) and quotagate in each configuration, loads each with wrk (installed from Debian's packages if
# missing), prints one table and appends it, with the date, machine and command, to
# docs/benchmarks.md. Everything runs on this machine, so the load generator, the gateway, the
# upstream and Redis share its cores: compare rows with each other, not with other machines.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${1:-10}
CONNS=${2:-64}
THREADS=2

if ! command -v wrk >/dev/null 2>&1; then
  echo "installing wrk (Debian package)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }

cargo build --release --quiet
BIN=target/release/quotagate
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# A catalog with 1000 keys far under their limits, and one key ("hog") with a limit of 10 per minute.
python3 - "$WORK/catalog.json" <<'EOF'
import json, sys
keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}]} for i in range(1000)]
keys.append({"key": "hog", "limits": [{"ep": 0, "rl": 10}]})
json.dump({"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"], "paths": ["/users/{id}"],
           "endpoints": [{"p": 0, "m": 0}], "apilimits": keys}, open(sys.argv[1], "w"))
EOF
# wrk script: every request uses one of the 1000 keys, round robin per thread.
cat > "$WORK/many-keys.lua" <<'EOF'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/users/" .. n, { ["X-Api-Key"] = string.format("key-%04d", n % 1000) })
end
EOF

UP_PORT=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP_PORT" 2>/dev/null & PIDS+=($!)
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
wait_port "$UP_PORT"; wait_port "$REDIS_PORT"

ROWS=()
# run_wrk NAME PORT [wrk args...]: appends a table row.
run_wrk() {
  local name=$1 port=$2; shift 2
  local out
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "$@" "http://127.0.0.1:$port/users/1")
  ROWS+=("$(python3 scripts/parse_wrk.py "$name" <<<"$out")")
}

# gateway NAME ARGS...: starts quotagate with ARGS, runs wrk against it, stops it.
gateway() {
  local name=$1; shift
  local port; port=$(free_port)
  "$BIN" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$UP_PORT" --catalog "$WORK/catalog.json" \
    --set log.level=warn "$@" 2>"$WORK/gw.log" & local pid=$!
  wait_port "$port"
  run_wrk "$name" "$port" "${WRK_ARGS[@]}"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

REDIS="--store redis --redis-url redis://127.0.0.1:$REDIS_PORT"
WRK_ARGS=(-H "X-Api-Key: key-0001")
run_wrk "upstream directly" "$UP_PORT"
gateway "quotagate, limits disabled" --set limits.enabled=false
WRK_ARGS=(-s "$WORK/many-keys.lua")
gateway "quotagate, memory store, 1000 keys under their limits"
# shellcheck disable=SC2086
gateway "quotagate, Redis store, 1000 keys under their limits" $REDIS
WRK_ARGS=(-H "X-Api-Key: hog")
gateway "quotagate, memory store, one key far over its limit"
# shellcheck disable=SC2086
gateway "quotagate, Redis store, one key far over its limit" $REDIS

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
TABLE=$(
  echo "| scenario | requests/s | p50 ms | p99 ms | answered 429 |"
  echo "|---|---:|---:|---:|---:|"
  printf '%s\n' "${ROWS[@]}"
)
echo "$TABLE"
{
  echo
  echo "## $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "Command: \`scripts/bench.sh $DURATION $CONNS\` (wrk -t$THREADS -c$CONNS -d${DURATION}s). Machine: $(nproc) cores ($CPU), $(free -g | awk '/Mem:/{print $2}') GiB; wrk, quotagate, the example upstream and redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2) all on it."
  echo
  echo "$TABLE"
} >> docs/benchmarks.md
echo "appended to docs/benchmarks.md"
