#!/usr/bin/env bash
# Cost of the window script inside Redis: redis-server's CPU per call (utime+stime from /proc over the
# run, divided by the calls, so with the network work of each call) and the time inside the command
# alone (INFO commandstats usec_per_call), with calls/s from redis-benchmark (50 clients,
# unpipelined), next to INCR and an empty script measured in the same run.
#   scripts/bench-script.sh [REQUESTS]     (default 300000)
# BENCH_BASE=REV also runs window.lua as it was at git revision REV, each row right after the
# current script's, so that a change is measured before and after in one run (absolute numbers
# on a shared machine move 50% between runs).
# Prints a table and appends it to docs/benchmarks/YYYY-MM.md (BENCH_NO_RECORD=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
N=${1:-300000}
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is needed (apt-get install redis-tools)" >&2; exit 1; }
DIR=$(mktemp -d)
PORT=$(free_port)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" --daemonize yes --pidfile "$DIR/pid" >/dev/null
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
PID=$(cat "$DIR/pid")
cli() { redis-cli -p "$PORT" "$@"; }

SHA=$(cli SCRIPT LOAD "$(cat crates/store/src/window.lua)")
EMPTY=$(cli SCRIPT LOAD 'return 1')
NOW=1700000040; M=$((NOW / 60)); BASE=$((M * 60)); BIG=1000000000000
NOW_MS=$((NOW * 1000 + 7))
# window.lua's arguments after the keys: minute, now (ms), TTL, cost, number of limits, then
# rl, w, shadow per limit.
ONE=("$M" "$NOW_MS" 180 1 1)
# The previous minute of a key hit in every one of its seconds, with the script's state fields as the
# script leaves them after its last second.
cli EVAL "for i=0,59 do redis.call('HSET',KEYS[1],i,1) end
redis.call('HSET',KEYS[1],'c',ARGV[1]+59,'w',60,'o',ARGV[1])" 1 prevfull $((BASE - 60)) >/dev/null

ROWS=()
INCR_US=""
INCR_IN=""
# inside CMD: microseconds per call inside the command (INFO commandstats), since the last reset.
inside() { cli INFO commandstats | grep "^cmdstat_$1:" | grep -o 'usec_per_call=[0-9.]*' | cut -d= -f2 || true; }
# row NAME REDIS-BENCHMARK-ARGS...: calls/s, redis-server CPU per call, time inside the command.
row() {
  local name=$1; shift
  local before after rate us in cmd
  cmd=$(printf '%s\n' "$@" | grep -m1 -E '^(INCR|EVALSHA)$' | tr '[:upper:]' '[:lower:]')
  cli CONFIG RESETSTAT >/dev/null
  before=$(cpu_ticks "$PID")
  rate=$(redis-benchmark -p "$PORT" -n "$N" -c 50 -q "$@" 2>/dev/null | grep -o '[0-9.]* requests per second' | cut -d' ' -f1)
  after=$(cpu_ticks "$PID")
  us=$(us_per $((after - before)) "$N")
  in=$(inside "$cmd")
  [ -z "$INCR_US" ] && INCR_US=$us && INCR_IN=$in
  ROWS+=("| $name | $(printf '%.0f' "$rate") | $us | $(python3 -c "print(f'{$us/$INCR_US:.2f}x')") | $in |")
}

row "INCR" INCR x
row "empty script (EVALSHA baseline)" EVALSHA "$EMPTY" 0
# The scripts measured: the current one, and the one at BENCH_BASE.
SCRIPTS=("$SHA|")
if [ -n "${BENCH_BASE:-}" ]; then
  # (The script moved into the store crate with the workspace; older revisions have it in src/.)
  git show "$BENCH_BASE:crates/store/src/window.lua" > "$DIR/base.lua" 2>/dev/null ||
    git show "$BENCH_BASE:src/store/window.lua" > "$DIR/base.lua"
  SCRIPTS+=("$(cli SCRIPT LOAD "$(cat "$DIR/base.lua")")| (at $BENCH_BASE)")
fi
# each CASE: runs the function CASE for every script measured ($sha and $at set), one right after
# the other.
each() {
  local s
  for s in "${SCRIPTS[@]}"; do
    sha=${s%%|*}; at=${s#*|}
    "$1"
  done
}
hot() { row "window.lua$at, one hot key, allowed (same second)" EVALSHA "$sha" 4 a b "hot$at" c "${ONE[@]}" "$BIG" 60 0; }
hog() { row "window.lua$at, one key over its limit, rejected (cached in the hash)" EVALSHA "$sha" 4 a b "hog$at" c "${ONE[@]}" 10 60 0; }
first_of_minute() {
  row "window.lua$at, worst case: first call of a minute, previous minute full (every second hit)" \
    -r 100000000 EVALSHA "$sha" 4 a prevfull "cur$at:__rand_int__" c "${ONE[@]}" "$BIG" 60 0
}
three() {
  row "window.lua$at, three limits (w = 1, 60, 3600), one hot key, allowed" \
    EVALSHA "$sha" 6 a b "hot3$at" c "hot3$at:s1" "hot3$at:s3600" "$M" "$NOW_MS" 180 1 3 "$BIG" 1 0 "$BIG" 60 0 "$BIG" 3600 0
}
each hot; each hog; each first_of_minute; each three

# Steady state of full windows, pipelined (redis-cli --pipe): 1000 keys, each hit once in every
# second of a minute whose previous minute is full. 59 of 60 calls per key are a new second, 1 a
# new minute. Compared with the same number of pipelined INCRs.
# pipe_row NAME FILE CALLS: redis-server CPU per call of piping FILE.
pipe_row() {
  local name=$1 file=$2 calls=$3 before after us in cmd
  cmd=$(head -c 200 "$file" | sed -n 3p | tr -d '\r' | tr '[:upper:]' '[:lower:]')
  cli CONFIG RESETSTAT >/dev/null
  before=$(cpu_ticks "$PID")
  local started; started=$(date +%s.%N)
  redis-cli -p "$PORT" --pipe < "$file" >/dev/null
  after=$(cpu_ticks "$PID")
  local rate; rate=$(python3 -c "import time; print(f'{$calls/(time.time()-$started):.0f}')")
  us=$(us_per $((after - before)) "$calls")
  in=$(inside "$cmd")
  [ -z "$PIPE_INCR_US" ] && PIPE_INCR_US=$us
  ROWS+=("| $name | $rate | $us | $(python3 -c "print(f'{$us/$PIPE_INCR_US:.2f}x')") | $in |")
}
# The pipelined steady state: setup.resp (every key's previous minute full), incr.resp, and
# window-SHA.resp for each script measured.
python3 - "$DIR" "$BASE" "$M" "${SCRIPTS[@]%%|*}" <<'PY'
import sys
d, base, m, shas = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def resp(*args):
    out = [f"*{len(args)}\r\n"]
    for a in args:
        a = str(a)
        out.append(f"${len(a.encode())}\r\n{a}\r\n")
    return "".join(out)
keys = 1000
with open(f"{d}/setup.resp", "w") as f:
    for i in range(keys):
        prev = f"s{i}:{m-1}"
        args = ["HSET", prev] + [x for s in range(60) for x in (s, 1)] + ["c", base - 1, "w", 60, "o", base - 60]
        f.write(resp(*args))
with open(f"{d}/incr.resp", "w") as g:
    for sec in range(60):
        for i in range(keys):
            g.write(resp("INCR", f"i{i}"))
for sha in shas:
    with open(f"{d}/window-{sha}.resp", "w") as f:
        for sec in range(60):
            for i in range(keys):
                f.write(resp("EVALSHA", sha, 4, f"s{i}:{m-2}", f"s{i}:{m-1}", f"s{i}:{m}", f"s{i}:{m+1}", m, (base + sec) * 1000 + 7, 180, 1, 1, 10**12, 60, 0))
PY
PIPE_INCR_US=""
pipe_row "INCR, pipelined" "$DIR/incr.resp" 60000
pipelined() {
  # Every script starts from the same state: the previous minute full, this minute empty.
  redis-cli -p "$PORT" --pipe < "$DIR/setup.resp" >/dev/null
  redis-cli -p "$PORT" --pipe < <(for i in $(seq 0 999); do printf 'DEL s%d:%d\r\n' "$i" "$M"; done) >/dev/null
  pipe_row "window.lua$at, pipelined, 1000 keys each hit every second of a minute, previous minute full" "$DIR/window-$sha.resp" 60000
}
each pipelined

TABLE=$(
  echo "| call | calls/s | redis-server CPU us/call | CPU vs INCR (of the same mode) | us inside the command |"
  echo "|---|---:|---:|---:|---:|"
  printf '%s\n' "${ROWS[@]}"
)
echo "$TABLE"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "## Script cost, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "Command: \`${BENCH_BASE:+BENCH_BASE=$BENCH_BASE }scripts/bench-script.sh $N\` (redis-benchmark -n $N -c 50, unpipelined, redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2)). Machine: $(machine_line)."
    echo
    echo "$TABLE"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
fi
