#!/usr/bin/env bash
# Benchmark of the Divvy port, side by side with the original Divvy (1.7.1, node) in one run.
#   scripts/bench-divvy.sh [SECONDS] [SHAPES]      (defaults: 10 s per row, "16x1 16x16 64x4")
# SHAPES are CONNECTIONSxPIPELINE_DEPTH. Load: `quotagate divvy-load`, 30% of hits on a rule that
# denies them. Rows: the original Divvy on a private redis-server (when node and its source in
# ../shared/peers/divvy-1.7.1 are there; its dependencies are installed with npm into a scratch
# folder, bound to loopback by a preloaded listen wrapper), `quotagate divvy` on the same Redis (leases
# auto and off), and on the memory store. For each: hits/s, ratio to the original in the same shape, the server's CPU
# per hit (utime+stime from /proc) and redis-server's. Prints a table and appends it to
# docs/benchmarks/YYYY-MM.md (BENCH_NO_RECORD=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
SECONDS_EACH=${1:-10}
SHAPES=${2:-"16x1 16x16 64x4"}
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
# QUOTAGATE_BIN=PATH measures another build: bench-lib.sh's quotagate_builds.
quotagate_builds
bench_workdir

divvy_rules "$WORK/rules.ini"

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
REDIS_PID=$!
wait_port "$REDIS_PORT"

PEER=../shared/peers/divvy-1.7.1
ORIGINAL=""
if command -v node >/dev/null && [ -d "$PEER" ]; then
  cp -r "$PEER" "$WORK/divvy"
  if (cd "$WORK/divvy" && npm install --omit=dev --legacy-peer-deps --no-audit --no-fund >/dev/null 2>&1); then
    # The original listens on every interface; keep it on loopback.
    cat > "$WORK/loopback.js" <<'JS'
const net = require('net');
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, ...rest) {
  if (typeof port === 'number' || typeof port === 'string') return listen.call(this, port, '127.0.0.1', ...rest);
  return listen.call(this, port, ...rest);
};
JS
    ORIGINAL=yes
  else
    echo "npm install of the original Divvy failed: its rows are skipped" >&2
  fi
else
  echo "node or $PEER missing: the original Divvy's rows are skipped" >&2
fi

# start NAME: starts a server, sets SERVER_PID and SERVER_PORT.
start() {
  SERVER_PORT=$(free_port)
  case $1 in
    original) PORT=$SERVER_PORT REDIS_HOST=127.0.0.1 REDIS_PORT=$REDIS_PORT \
                node --require "$WORK/loopback.js" "$WORK/divvy/index.js" "$WORK/rules.ini" >/dev/null 2>&1 & ;;
    redis) PORT=$SERVER_PORT REDIS_HOST=127.0.0.1 REDIS_PORT=$REDIS_PORT \
             "$BIN" divvy "$WORK/rules.ini" --set log.level=warn >/dev/null 2>&1 & ;;
    redis-off) PORT=$SERVER_PORT REDIS_HOST=127.0.0.1 REDIS_PORT=$REDIS_PORT \
             "$BIN" divvy "$WORK/rules.ini" --set log.level=warn --set store.lease=off >/dev/null 2>&1 & ;;
    memory) PORT=$SERVER_PORT "$BIN" divvy "$WORK/rules.ini" --set log.level=warn >/dev/null 2>&1 & ;;
    # The memory store keeping its counters on disk (store.path, issue 73).
    disk) PORT=$SERVER_PORT "$BIN" divvy "$WORK/rules.ini" --set log.level=warn \
            --set "store.path=$WORK/divvy-counters-$RANDOM" >/dev/null 2>&1 & ;;
  esac
  SERVER_PID=$!
  wait_port "$SERVER_PORT"
}

declare -A BASE
ROWS=()
for server in original redis redis-off memory disk; do
  [ "$server" = original ] && [ -z "$ORIGINAL" ] && continue
  start "$server"
  for shape in $SHAPES; do
    conns=${shape%x*}; depth=${shape#*x}
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    before=$(cpu_ticks "$SERVER_PID"); rbefore=$(cpu_ticks "$REDIS_PID")
    out=$("$BIN" divvy-load --addr "127.0.0.1:$SERVER_PORT" --connections "$conns" --depth "$depth" --seconds "$SECONDS_EACH" --deny-percent 30)
    after=$(cpu_ticks "$SERVER_PID"); rafter=$(cpu_ticks "$REDIS_PID")
    hits=$(tr ' ' '\n' <<<"$out" | awk -F= '$1=="hits"{print $2}')
    rate=$(tr ' ' '\n' <<<"$out" | awk -F= '$1=="hits_per_s"{print $2}')
    [ "$server" = original ] && BASE[$shape]=$rate
    ROWS+=("$(python3 - "$server" "$shape" "$out" "${BASE[$shape]:-}" "$(us_per $((after - before)) "$hits")" "$(us_per $((rafter - rbefore)) "$hits")" <<'PY'
import sys
server, shape, out, base, us, rus = sys.argv[1:7]
v = dict(kv.split("=") for kv in out.split())
hits, rate = int(v["hits"]), float(v["hits_per_s"])
name = {"original": "original Divvy 1.7.1 (node), Redis", "redis": "quotagate divvy, Redis (leases auto)",
        "redis-off": "quotagate divvy, Redis, leases off", "memory": "quotagate divvy, memory",
        "disk": "quotagate divvy, memory on disk (store.path)"}[server]
ratio = f"{rate / float(base):.2f}x" if base else ""
redis_col = rus if server not in ("memory", "disk") else ""
print(f"| {name} | {shape} | {rate:,.0f} | {ratio} | {us} | {redis_col} | {v['p50_ms']} | {v['p99_ms']} | {int(v['allowed']) / max(hits, 1):.0%} | {v['errors']} |")
PY
)")
  done
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
done

TABLE=$(
  echo "| server | connections x depth | hits/s | vs original | server CPU us/hit | Redis CPU us/hit | p50 ms | p99 ms | allowed | errors |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${ROWS[@]}"
)
echo "$TABLE"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "## Divvy port, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "Command: \`scripts/bench-divvy.sh $SECONDS_EACH \"$SHAPES\"\` (${SECONDS_EACH} s per row, 30% of hits on a rule that denies them). Machine: $(machine_line); load generator, servers and redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2) all on it."
    echo
    echo "$TABLE"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
fi
