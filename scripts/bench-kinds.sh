#!/usr/bin/env bash
# CPU per request of the kinds of limit, side by side in one run (issue 29's bounds: a day quota,
# a pool and `cost_from` on a 1 kB JSON response each <= 5% over a 60 s window on the same key;
# issue 30's: a concurrency limit <= 5% over a 60 s window).
#
#   scripts/bench-kinds.sh [ROUNDS] [SECONDS]     (defaults: 5 rounds of 5 s)
#
# One gateway (1 worker, memory store, on the second core) per row in front of the example upstream, `wrk -t1 -c16`
# on one API key far under its limit, each request with a 500-byte header so the upstream's JSON
# echo is about 1 kB. Rows: one 60 s window; one day quota (UTC); one 60 s pool over every
# endpoint; one 60 s window on an endpoint with `"cost_from": {"json": "body_bytes"}` (every
# response read; the echo reports 0, so each reservation is given back); one concurrency limit of
# 1000 requests in flight (a slot taken and freed per request). The rows take turns, each round
# starting one row later, so drift on a shared machine falls on all of them; the table has each row's
# median CPU (utime + stime of the gateway, /proc) per request, the user and system parts apart
# (instruction counts, callgrind's, see only the user part), and the median over rounds of its
# ratio to the same round's first row (a pair of rows one after the other shares the machine's
# state better than two medians do). KINDS="window cost_from" runs only those rows (the first is
# the base). QUOTAGATE_BIN=... measures another build. Prints the table; appends nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

ROUNDS=${1:-5}
SECONDS_PER_RUN=${2:-5}
ensure_debian_packages wrk:wrk
quotagate_builds
bench_workdir

python3 - "$WORK" <<'PY'
import json, os, sys
many = 1_000_000_000
kinds = {
    "window": ([{"ep": 0, "rl": many, "w": 60}], None),
    "day": ([{"ep": 0, "rl": many, "period": "day"}], None),
    "pool": ([{"group": "*", "rl": many}], None),
    "cost_from": ([{"ep": 0, "rl": many, "w": 60}], {"json": "body_bytes"}),
    "concurrent": ([{"ep": 0, "concurrent": 1000}], None),
}
for name, (limits, cost_from) in kinds.items():
    endpoint = {"p": 0, "m": 0}
    if cost_from:
        endpoint["cost_from"] = cost_from
    doc = {"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"],
           "paths": ["/users/{id}"], "endpoints": [endpoint],
           "apilimits": [{"key": "bench-key", "limits": limits}]}
    json.dump(doc, open(os.path.join(sys.argv[1], f"{name}.json"), "w"))
PY
cat > "$WORK/pad.lua" <<'LUA'
wrk.headers["X-Api-Key"] = "bench-key"
wrk.headers["X-Pad"] = string.rep("p", 500)
LUA

# The gateway on one core, the load and the upstream on the other: their work does not land in
# the gateway's core's caches and run queue, which makes rows of one run comparable.
PIN_GW="taskset -c 1"; PIN_LOAD="taskset -c 0"
[ "$(nproc)" -ge 2 ] || { PIN_GW=""; PIN_LOAD=""; }
# user_system_ticks PID: "utime stime" of the process, in ticks.
user_system_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; }

UP_PORT=$(free_port)
$PIN_LOAD "$BIN" example-upstream --listen "127.0.0.1:$UP_PORT" 2>/dev/null & PIDS+=($!)
wait_port "$UP_PORT"

read -r -a KINDS <<<"${KINDS:-window day pool cost_from concurrent}"
RESULTS=()
for round in $(seq "$ROUNDS"); do
  # Each round starts one row later: a row's place in a round moves what it measures (the first
  # of a round read 4-10% above the others on the same code), so every row takes every place.
  first=$(( (round - 1) % ${#KINDS[@]} ))
  for kind in "${KINDS[@]:first}" "${KINDS[@]:0:first}"; do
    port=$(free_port)
    $PIN_GW "$BIN" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$UP_PORT" \
      --catalog "$WORK/$kind.json" --set server.workers=1 --set log.level=warn \
      --set admin.enabled=false 2>>"$WORK/gw.log" & gw=$!
    wait_port "$port"
    $PIN_LOAD wrk -t1 -c16 -d1s -s "$WORK/pad.lua" "http://127.0.0.1:$port/users/1" >/dev/null
    before=$(user_system_ticks "$gw")
    out=$($PIN_LOAD wrk -t1 -c16 -d"${SECONDS_PER_RUN}s" -s "$WORK/pad.lua" "http://127.0.0.1:$port/users/1")
    after=$(user_system_ticks "$gw")
    kill "$gw"; wait "$gw" 2>/dev/null || true
    requests=$(awk '/requests in/{print $1}' <<<"$out")
    non2xx=$(awk '/Non-2xx/{print $NF}' <<<"$out")
    [ -z "$non2xx" ] || { echo "$kind: $non2xx answers were not 2xx" >&2; exit 1; }
    user=$((${after% *} - ${before% *})) system=$((${after#* } - ${before#* }))
    RESULTS+=("$round $kind $requests $user $system")
    echo "round $round $kind: $requests requests, $user + $system ticks" >&2
  done
done

python3 - "$TICKS_PER_S" "$SECONDS_PER_RUN" "$(machine_line)" "${RESULTS[@]}" <<'PY'
import statistics, sys
hz, secs, machine = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
rows, rounds = {}, {}
for r in sys.argv[4:]:
    rnd, kind, n, user, system = r.split()
    us = lambda ticks: int(ticks) / hz * 1e6 / int(n)
    run = (int(n) / secs, us(user), us(system))
    rows.setdefault(kind, []).append(run)
    rounds.setdefault(rnd, {})[kind] = run[1] + run[2]
base_kind = next(iter(rows))
print(f"machine: {machine}; median of {len(rows[base_kind])} rounds")
print("| limit of the key | req/s | CPU us/request | user | system | vs the first row (median of rounds' ratios) |")
print("|---|---:|---:|---:|---:|---:|")
names = {"window": "one 60 s window", "day": "one day quota (UTC)", "pool": "one 60 s pool (every endpoint)",
         "cost_from": "one 60 s window, `cost_from` a 1 kB JSON body",
         "concurrent": "one concurrency limit (1000 in flight)"}
for kind, runs in rows.items():
    med = lambda i: statistics.median(r[i] for r in runs)
    ratio = statistics.median(k[kind] / k[base_kind] for k in rounds.values())
    cpu = statistics.median(r[1] + r[2] for r in runs)
    print(f"| {names[kind]} | {med(0):,.0f} | {cpu:.2f} | {med(1):.2f} | {med(2):.2f} | {ratio:.3f} |")
PY
