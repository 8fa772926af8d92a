#!/usr/bin/env bash
# bench-script-callgrind.sh [REV]: instructions redis-server spends per call of window.lua, counted
# by callgrind (repeatable, unlike CPU time on a shared machine, where bench-script.sh's rows for the
# same script move by several percent with their position in the run). For each case, a fresh
# redis-server under callgrind serves 500 and then 2500 calls from one unpipelined client, and
# (Ir(2500) - Ir(500)) / 2000 is printed, so start-up and loading cancel out. With REV, window.lua as
# it was at git revision REV is measured too, case by case.
#   hot   one key with room, the same second every call (the straight line)
#   hog   one key over its limit, refused until a known second (the straight line)
#   three three limits (w = 1, 60, 3600) on one key with room (the general path)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cp crates/store/src/window.lua "$W/current.lua"
SCRIPTS=(current)
if [ -n "${1:-}" ]; then
  git show "$1:crates/store/src/window.lua" > "$W/base.lua" 2>/dev/null ||
    git show "$1:src/store/window.lua" > "$W/base.lua"
  SCRIPTS+=(base)
fi
NOW=1700000040; M=$((NOW / 60)); NOW_MS=$((NOW * 1000 + 7)); BIG=1000000000000

# instructions SCRIPT CASE N: total instructions of a redis-server that served N calls of CASE.
instructions() {
  local script=$1 case=$2 n=$3 port pid sha
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" redis-server --port "$port" \
    --bind 127.0.0.1 --save "" --appendonly no --dir "$W" >"$W/redis.log" 2>&1 & pid=$!
  for _ in $(seq 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$W/$script.lua")")
  local args
  case $case in
    hot) args=(4 a b hot c "$M" "$NOW_MS" 180 1 1 "$BIG" 60 0) ;;
    hog) args=(4 a b hog c "$M" "$NOW_MS" 180 1 1 10 60 0) ;;
    three) args=(6 a b hot3 c hot3:s1 hot3:s3600 "$M" "$NOW_MS" 180 1 3 "$BIG" 1 0 "$BIG" 60 0 "$BIG" 3600 0) ;;
  esac
  redis-benchmark -p "$port" -n "$n" -c 1 -q EVALSHA "$sha" "${args[@]}" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  grep -E "^(summary|totals):" "$W/cg.out" | head -1 | awk '{print $2}'
}

echo "| case | script | instructions per call |"
echo "|---|---|---:|"
for case in hot hog three; do
  for script in "${SCRIPTS[@]}"; do
    few=$(instructions "$script" "$case" 500)
    many=$(instructions "$script" "$case" 2500)
    label=$script; [ "$script" = base ] && label="at $1"
    echo "| $case | $label | $(( (many - few) / 2000 )) |"
  done
done
