#!/usr/bin/env bash
# The embedded store kept on disk (store.path, issue 73) beside the same store without a
# directory, in one run:
#
#   scripts/bench-disk.sh [DURATION_SECONDS] [CONNECTIONS]     (defaults: 10 s, 64 connections)
#
# 1. CPU per request (/proc/PID/stat over a wrk run) of the memory store with and without
#    store.path, per round (BENCH_ROUNDS, default 3), for 1000 keys far under their limits, one
#    hot key, and 1000 keys at 1,000 a minute each (a reservation block of 5 units: a record
#    every 5 admitted requests of a key); the ratio per round, its median, and the bound
#    (<= 1.05x) met or not. With the directory: commits a second (quotagate_store_disk_commits_total
#    over the run; bound: <= 50).
# 2. Bytes on disk per counter: the snapshot after a clean stop, divided by the counters in it
#    (1000 sliding counters; then 1,000,000 Divvy windows).
# 3. Start-up with 1,000,000 stored counters (Divvy windows, one per actor, loaded through the
#    Divvy port, then a clean stop): the time from exec to the port accepting, beside the same
#    start on an empty directory (bound: under 1 s more).
# Prints the tables; BENCH_NO_RECORD=1 skips appending them to docs/benchmarks/YYYY-MM.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

DURATION=${1:-10}
CONNS=${2:-64}
ROUNDS=${BENCH_ROUNDS:-3}
# Actors sent to the Divvy port: the memory store holds at most 1,000,000 Divvy windows (31,250 a
# shard), so a few more than that fill it.
ACTORS=${BENCH_DISK_ACTORS:-1100000}

ensure_debian_packages wrk:wrk
quotagate_builds
bench_workdir

python3 - "$WORK/catalog.json" <<'PY'
import json, sys
keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}, {"ep": 1, "rl": 1000}]}
        for i in range(1000)]
keys.append({"key": "hot", "limits": [{"ep": 0, "rl": 1_000_000_000}]})
doc = {"methods": ["GET"], "paths": ["/users/{id}", "/tight/{id}"],
       "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 0}], "apilimits": keys}
json.dump(doc, open(sys.argv[1], "w"))
PY
cat > "$WORK/rules.ini" <<'INI'
[method=GET ip=*]
creditLimit = 100
resetSeconds = 3600
actorField = 'ip'

[default]
creditLimit = 0
INI
many_keys_lua "$WORK/many-keys.lua"
# The same keys on the endpoint where each has 1,000 a minute.
sed 's|"/users/"|"/tight/"|' "$WORK/many-keys.lua" > "$WORK/tight.lua"

UP_PORT=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP_PORT" 2>/dev/null & PIDS+=($!)
wait_port "$UP_PORT"

# start_gateway DIR ARGS...: quotagate in front of the upstream, its counters in DIR (empty: none);
# sets GW_PID, GW_PORT, ADMIN_PORT, DIVVY_PORT.
start_gateway() {
  local dir=$1; shift
  GW_PORT=$(free_port); ADMIN_PORT=$(free_port); DIVVY_PORT=$(free_port)
  "$BIN" --listen "127.0.0.1:$GW_PORT" --upstream "http://127.0.0.1:$UP_PORT" --catalog "$WORK/catalog.json" \
    --set log.level=warn --set "admin.listen=127.0.0.1:$ADMIN_PORT" --set "store.path=$dir" \
    --set "divvy.listen=127.0.0.1:$DIVVY_PORT" --set "divvy.rules=$WORK/rules.ini" "$@" 2>>"$WORK/gw.log" &
  GW_PID=$!
  wait_port "$GW_PORT"
}
stop_gateway() { kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true; }
commits() {
  curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
    awk '$1 == "quotagate_store_disk_commits_total" {print $2; found=1} END {if (!found) print 0}'
}

# Lines: round|row|store|us_per_request|commits_per_s
RESULTS=()
# row NAME PATH_IN_URL WRK_ARGS...: the row with and without a directory.
row() {
  local name=$1 path=$2; shift 2
  local store dir before after c0 c1 out n
  for store in memory disk; do
    dir=""; [ "$store" = disk ] && dir="$WORK/counters-$ROUND-${name// /-}"
    start_gateway "$dir"
    c0=$(commits); before=$(cpu_ticks "$GW_PID")
    out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" "$@" "http://127.0.0.1:$GW_PORT$path")
    after=$(cpu_ticks "$GW_PID"); c1=$(commits)
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    RESULTS+=("$ROUND|$name|$store|$(us_per "$((after - before))" "$n")|$(python3 -c "print(round(($c1 - $c0) / $DURATION, 1))")")
    stop_gateway
  done
}

for ROUND in $(seq "$ROUNDS"); do
  echo "round $ROUND of $ROUNDS: CPU a request, with and without store.path" >&2
  row "1000 keys far under their limits" /users/1 -s "$WORK/many-keys.lua"
  row "one hot key" /users/1 -H "X-Api-Key: hot"
  row "1000 keys at 1,000 a minute each" /tight/1 -s "$WORK/tight.lua"
done

CPU_TABLE=$(printf '%s\n' "${RESULTS[@]}" | python3 -c '
import statistics, sys
rows = {}
for line in sys.stdin:
    rnd, name, store, us, cps = line.strip().split("|")
    rows.setdefault(name, {}).setdefault(rnd, {})[store] = (float(us), float(cps))
print("| load | memory store, us CPU a request | store.path, us CPU a request | ratio (median, lowest-highest round) | commits a second (store.path) | bound <= 1.05x | bound <= 50 commits/s |")
print("|---|---|---|---|---|---|---|")
for name, rounds in rows.items():
    both = [r for r in rounds.values() if "memory" in r and "disk" in r]
    ratios = [r["disk"][0] / r["memory"][0] for r in both if r["memory"][0] > 0]
    mem = statistics.median(r["memory"][0] for r in both)
    disk = statistics.median(r["disk"][0] for r in both)
    cps = max(r["disk"][1] for r in both)
    m = statistics.median(ratios)
    met = lambda ok: "met" if ok else "NOT met"
    print(f"| {name} | {mem:.1f} | {disk:.1f} | {m:.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) | {cps:.1f} (highest round) | {met(m <= 1.05)} | {met(cps <= 50)} |")
')

# Bytes a counter: 1000 sliding counters, stopped cleanly.
SIZES=$WORK/sizes
start_gateway "$SIZES"
wrk -t2 -c16 -d2s -s "$WORK/tight.lua" "http://127.0.0.1:$GW_PORT/tight/1" >/dev/null
stop_gateway
SLIDING_BYTES=$(stat -c %s "$SIZES/snapshot")

# 1,000,000 Divvy windows through the Divvy port (8 connections, pipelined), then a clean stop.
echo "loading $ACTORS Divvy windows" >&2
BIG=$WORK/big
start_gateway "$BIG"
LOAD_S=$(python3 - "$DIVVY_PORT" "$ACTORS" <<'PY'
import socket, sys, threading, time
port, actors = int(sys.argv[1]), int(sys.argv[2])
conns = 8
def run(c):
    s = socket.create_connection(("127.0.0.1", port))
    mine = range(c, actors, conns)
    def read():
        want, got, buf = len(mine), 0, b""
        while got < want:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise SystemExit("the Divvy port closed the connection")
            got += chunk.count(b"\n")
    reader = threading.Thread(target=read); reader.start()
    batch = []
    for i in mine:
        batch.append(b"HIT method=GET ip=10.%d.%d.%d\n" % (i >> 16 & 255, i >> 8 & 255, i & 255))
        if len(batch) == 512:
            s.sendall(b"".join(batch)); batch = []
    if batch:
        s.sendall(b"".join(batch))
    reader.join()
    s.close()
t = time.time()
threads = [threading.Thread(target=run, args=(c,)) for c in range(conns)]
for th in threads: th.start()
for th in threads: th.join()
print(f"{time.time() - t:.1f}")
PY
)
stop_gateway
BIG_BYTES=$(stat -c %s "$BIG/snapshot")
# The entries the snapshot holds: its last record, End ([tag][next log][entries][fixed][clean]).
STORED=$(python3 -c 'import struct, sys; b = open(sys.argv[1], "rb").read(); print(struct.unpack("<Q", b[-17:-9])[0])' "$BIG/snapshot")

# Start-up: exec to the proxy port accepting, 3 times each, with the million counters and empty.
start_time() {
  local dir=$1 t0 t1
  t0=$(date +%s.%N)
  start_gateway "$dir"
  t1=$(date +%s.%N)
  stop_gateway
  python3 -c "print(round($t1 - $t0, 3))"
}
EMPTY_TIMES=(); BIG_TIMES=()
for _ in 1 2 3; do
  EMPTY_TIMES+=("$(start_time "$WORK/empty-$RANDOM")")
  BIG_TIMES+=("$(start_time "$BIG")")
done
med() { printf '%s\n' "$@" | python3 -c 'import statistics, sys; print(statistics.median(float(l) for l in sys.stdin))'; }
EMPTY_S=$(med "${EMPTY_TIMES[@]}"); BIG_S=$(med "${BIG_TIMES[@]}")
START_TABLE=$(python3 - "$SLIDING_BYTES" "$BIG_BYTES" "$STORED" "$EMPTY_S" "$BIG_S" "$LOAD_S" <<'PY'
import sys
sliding, big, actors, empty_s, big_s, load_s = sys.argv[1:]
sliding, big, actors = int(sliding), int(big), int(actors)
extra = float(big_s) - float(empty_s)
print("| measure | value | bound |")
print("|---|---|---|")
print(f"| snapshot bytes a sliding counter (1000 keys' minute windows, clean stop) | {sliding / 1000:.0f} | |")
print(f"| snapshot bytes a Divvy window ({actors:,} windows, clean stop) | {big / actors:.0f} ({big / 2**20:.0f} MiB) | |")
print(f"| loading them through the Divvy port (8 connections; a record, and a wait for its commit, each) | {load_s} s | |")
print(f"| start-up, empty directory (exec to the port accepting, median of 3) | {float(empty_s):.3f} s | |")
print(f"| start-up with {actors:,} stored counters (median of 3) | {float(big_s):.3f} s | {'met' if extra < 1 else 'NOT met'}: {extra:.3f} s more, bound under 1 s |")
PY
)
echo "$CPU_TABLE"; echo; echo "$START_TABLE"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "## The embedded store on disk, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "Command: \`${BUILDS}scripts/bench-disk.sh $DURATION $CONNS\` (wrk -t2 -c$CONNS -d${DURATION}s, $ROUNDS rounds; medians). Machine: $(machine_line); disk: $(df -h "$WORK" | awk 'NR==2 {print $1}')."
    echo
    echo "$CPU_TABLE"
    echo
    echo "$START_TABLE"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
fi
