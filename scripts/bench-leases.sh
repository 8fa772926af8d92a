#!/usr/bin/env bash
# Redis work of a hot key across three gateway instances, with leases on and off, in one run.
#
#   scripts/bench-leases.sh [DURATION_SECONDS] [QPS_PER_INSTANCE]     (defaults: 10 s, 3000/s)
#
# Starts a private redis-server, the example upstream and three quotagate instances (1 worker
# each) on that Redis, then sends each instance QPS requests a second of one API key far under its
# limit (oha at a fixed rate, 16 connections each, all three at once) for DURATION seconds; then the
# same with `store.lease = off`, then a key far over its limit (10,000 a minute, used up within the
# first second; then refusals), with leases on and off, then a hot key under a day quota and one
# under a pool (issue 29), each run on a key of its own. Reports, per run: decisions, the EVALSHA calls Redis ran
# (the gateways' only command per decision; the script's own inner commands, which
# `INFO commandstats` lists apart, are not counted) per 1000 decisions, the gateways' CPU per
# request and Redis' CPU per request. Prints a table and appends it to docs/benchmarks/YYYY-MM.md
# (BENCH_NO_RECORD=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

DURATION=${1:-10}
QPS=${2:-3000}
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
[ -x "$OHA" ] || { echo "installing oha (cargo install oha --locked)" >&2; cargo install oha --locked --quiet; }

quotagate_builds
bench_workdir

python3 - "$WORK/catalog.json" <<'PY'
import json, sys
keys = [{"key": "hot", "limits": [{"ep": 0, "rl": 1_000_000_000}]},
        {"key": "over", "limits": [{"ep": 0, "rl": 10_000}]},
        {"key": "over-off", "limits": [{"ep": 0, "rl": 10_000}]},
        {"key": "day", "limits": [{"ep": 0, "rl": 1_000_000_000, "period": "day"}]},
        {"key": "pool", "limits": [{"group": "*", "rl": 1_000_000_000}]}]
json.dump({"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"], "paths": ["/users/{id}"],
           "endpoints": [{"p": 0, "m": 0}], "apilimits": keys}, open(sys.argv[1], "w"))
PY

UP_PORT=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP_PORT" 2>/dev/null & PIDS+=($!)
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
REDIS_PID=$!
wait_port "$UP_PORT"; wait_port "$REDIS_PORT"

ROWS=()
# run NAME KEY ARGS...: three instances with ARGS, QPS each on KEY for DURATION seconds.
run() {
  local name=$1 key=$2; shift 2
  local gws=() ports=() i
  for i in 1 2 3; do
    local port; port=$(free_port)
    "$BIN" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$UP_PORT" --catalog "$WORK/catalog.json" \
      --store redis --redis-url "redis://127.0.0.1:$REDIS_PORT" --set server.workers=1 \
      --set log.level=warn --set admin.listen=127.0.0.1:0 "$@" 2>>"$WORK/gw.log" & gws+=($!)
    ports+=("$port")
  done
  PIDS+=("${gws[@]}")
  for i in 0 1 2; do wait_port "${ports[$i]}"; done
  # One second at the rate first, not counted: connections open, and every instance's counter
  # has a rate.
  local loads=()
  for i in 0 1 2; do
    "$OHA" --no-tui -q "$QPS" -z 1s -c 16 -H "X-Api-Key: $key" "http://127.0.0.1:${ports[$i]}/users/1" >/dev/null & loads+=($!)
  done
  wait "${loads[@]}" || true
  local before rbefore cbefore after rafter cafter
  # shellcheck disable=SC2086
  before=$(cpu_ticks ${gws[*]}); rbefore=$(cpu_ticks "$REDIS_PID"); cbefore=$(script_calls "$REDIS_PORT")
  loads=()
  for i in 0 1 2; do
    "$OHA" --no-tui -q "$QPS" -z "${DURATION}s" -c 16 --output-format json -H "X-Api-Key: $key" \
      "http://127.0.0.1:${ports[$i]}/users/1" >"$WORK/oha-$i.json" & loads+=($!)
  done
  wait "${loads[@]}" || true
  # shellcheck disable=SC2086
  after=$(cpu_ticks ${gws[*]}); rafter=$(cpu_ticks "$REDIS_PID"); cafter=$(script_calls "$REDIS_PORT")
  for p in "${gws[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
  ROWS+=("$(python3 - "$name" "$((after - before))" "$((rafter - rbefore))" "$((cafter - cbefore))" "$TICKS_PER_S" "$WORK"/oha-*.json <<'PY'
import json, sys
name, ticks, rticks, calls, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
total = ok = 0
for path in sys.argv[6:]:
    d = json.load(open(path))
    codes = d.get("statusCodeDistribution", {})
    total += sum(codes.values())
    ok += codes.get("200", 0)
print(f"| {name} | {total:,} | {ok / max(total, 1):.0%} | {calls:,} | {calls * 1000 / max(total, 1):.1f} "
      f"| {ticks / hz * 1e6 / max(total, 1):.1f} | {rticks / hz * 1e6 / max(total, 1):.2f} |")
PY
)")
}

run "hot key, leases on (auto)" hot
run "hot key, leases off" hot --set store.lease=off
run "a key over its limit (10,000/min), leases on" over
run "a key over its limit (10,000/min), leases off" over-off --set store.lease=off
run "hot key under a day quota, leases on (auto)" day
run "hot key under a pool of every endpoint (no leases)" pool

TABLE=$(
  echo "| three instances, $QPS req/s each, ${DURATION} s | decisions | 2xx | Redis script calls | per 1000 decisions | gateways' CPU us/req | Redis CPU us/req |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${ROWS[@]}"
)
echo "$TABLE"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "## Leases across three instances, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "Command: \`scripts/bench-leases.sh $DURATION $QPS\`. Machine: $(machine_line); oha, the gateways, the example upstream and redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2) all on it."
    echo
    echo "$TABLE"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
  echo "appended to docs/benchmarks/$(date -u +%Y-%m).md"
fi
