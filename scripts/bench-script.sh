#!/usr/bin/env bash
# Cost of the window script inside Redis, measured with redis-benchmark (50 clients, unpipelined)
# against a private redis-server, next to an empty script, INCR and a naive HGETALL-and-sum script.
#   scripts/bench-script.sh [REQUESTS]     (default 300000)
# Prints a table and appends it to docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-300000}
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is needed (apt-get install redis-tools)" >&2; exit 1; }
DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" --daemonize yes --pidfile "$DIR/pid" >/dev/null
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
cli() { redis-cli -p "$PORT" "$@"; }

SHA=$(cli SCRIPT LOAD "$(cat src/store/window.lua)")
EMPTY=$(cli SCRIPT LOAD 'return 1')
# The naive alternative: read both minutes whole and sum the window in Lua.
NAIVE=$(cli SCRIPT LOAD "local t=tonumber(ARGV[1]) local s=t%60 local sum=0
local c=redis.call('HGETALL',KEYS[1]) for i=1,#c,2 do if tonumber(c[i])<=s then sum=sum+tonumber(c[i+1]) end end
local p=redis.call('HGETALL',KEYS[2]) for i=1,#p,2 do if tonumber(p[i])>s then sum=sum+tonumber(p[i+1]) end end
if sum+1>tonumber(ARGV[2]) then return {0,sum} end
redis.call('HINCRBY',KEYS[1],s,1) redis.call('EXPIRE',KEYS[1],180) return {1,sum}")
NOW=1700000070; M=$((NOW / 60)); BIG=1000000000000
# Minutes with all 60 seconds non-empty.
cli EVAL "for i=0,59 do redis.call('HSET',KEYS[1],i,1) redis.call('HSET',KEYS[2],i,1) end" 2 full prevfull >/dev/null

rate() { redis-benchmark -p "$PORT" -n "$N" -c 50 -q "$@" 2>/dev/null | grep -o '[0-9.]* requests per second' | cut -d' ' -f1; }
row() { local name=$1; shift; printf '| %s | %s |\n' "$name" "$(rate "$@" | xargs printf '%.0f')"; }

TABLE=$(
  echo "| call | calls/s |"
  echo "|---|---:|"
  row "empty script (EVALSHA baseline)" EVALSHA "$EMPTY" 0
  row "INCR" INCR x
  row "window.lua, one hot key, allowed" EVALSHA "$SHA" 4 a b hot c "$M" "$NOW" "$BIG" 180
  row "window.lua, one key over its limit, rejected" EVALSHA "$SHA" 4 a b hog c "$M" "$NOW" 10 180
  row "window.lua, a new counter every call, previous minute full (worst case, once per counter-minute)" \
    -r 100000000 EVALSHA "$SHA" 4 a prevfull "cur:__rand_int__" c "$M" "$NOW" "$BIG" 180
  row "naive HGETALL script, both minutes full" EVALSHA "$NAIVE" 2 full prevfull "$NOW" "$BIG"
)
echo "$TABLE"
{
  echo
  echo "## Script cost, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "Command: \`scripts/bench-script.sh $N\` (redis-benchmark -n $N -c 50, unpipelined, redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2), $(nproc) cores)."
  echo
  echo "$TABLE"
} >> docs/benchmarks.md
