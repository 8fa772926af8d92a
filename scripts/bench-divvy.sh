#!/usr/bin/env bash
# Benchmark of the Divvy port: hits/s and latency percentiles with `quotagate divvy-load`, against
# `quotagate divvy` on the memory store and on a private redis-server, at pipeline depths 1 and 16.
#   scripts/bench-divvy.sh [SECONDS] [CONNECTIONS]      (defaults: 10 s, 50 connections)
# Prints a table and appends it to docs/benchmarks.md. Load generator, server and Redis share this
# machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-10}
CONNS=${2:-50}
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
cargo build --release --quiet
BIN=target/release/quotagate
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# bench=allow never runs out; bench=deny allows one hit an hour, so nearly all of those are denied.
cat > "$WORK/rules.ini" <<'EOF'
[bench=allow]
creditLimit = 1000000000
resetSeconds = 3600

[bench=deny]
creditLimit = 1
resetSeconds = 3600

[default]
creditLimit = 0
EOF

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
wait_port "$REDIS_PORT"

ROWS=()
for store in memory redis; do
  PORT=$(free_port)
  if [ "$store" = redis ]; then
    PORT=$PORT REDIS_HOST=127.0.0.1 REDIS_PORT=$REDIS_PORT "$BIN" divvy "$WORK/rules.ini" --set log.level=warn >/dev/null 2>&1 & pid=$!
  else
    PORT=$PORT "$BIN" divvy "$WORK/rules.ini" --set log.level=warn >/dev/null 2>&1 & pid=$!
  fi
  wait_port "$PORT"
  for depth in 1 16; do
    out=$("$BIN" divvy-load --addr "127.0.0.1:$PORT" --connections "$CONNS" --depth "$depth" --seconds "$SECONDS_EACH" --deny-percent 30)
    ROWS+=("$(python3 - "$store" "$depth" "$out" <<'EOF'
import sys
store, depth, out = sys.argv[1], sys.argv[2], sys.argv[3]
v = dict(kv.split("=") for kv in out.split())
hits = int(v["hits"])
print(f"| {store} | {depth} | {float(v['hits_per_s']):,.0f} | {v['p50_ms']} | {v['p99_ms']} | {v['p999_ms']} | {int(v['allowed']) / max(hits, 1):.0%} | {v['errors']} |")
EOF
)")
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
done

TABLE=$(
  echo "| store | pipeline depth | hits/s | p50 ms | p99 ms | p99.9 ms | allowed | errors |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${ROWS[@]}"
)
echo "$TABLE"
{
  echo
  echo "## Divvy port, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "Command: \`scripts/bench-divvy.sh $SECONDS_EACH $CONNS\` ($CONNS connections, ${SECONDS_EACH} s per row, 30% of hits on a rule that denies them). Machine: $(nproc) cores, load generator, server and redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2) all on it."
  echo
  echo "$TABLE"
} >> docs/benchmarks.md
