#!/usr/bin/env bash
# What requests waiting for room cost (issue 30: 10,000 waiting <= 20 MB, no CPU while they wait).
#
#   scripts/bench-wait.sh [WAITING] [SECONDS]     (defaults: 10000 requests, 10 s of waiting)
#
# One gateway (memory store) whose key has one slot (`"concurrent": 1, "wait_ms": 60000`), held
# by a request to an upstream that never answers; then WAITING more requests on as many
# connections, each waiting for that slot. Prints the gateway's resident memory before and while
# they wait (/proc VmRSS), per waiting request, and its CPU time (utime + stime) over SECONDS of
# waiting. QUOTAGATE_BIN=... measures another build. Appends nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

WAITING=${1:-10000}
SECONDS_WAITING=${2:-10}
if [ -z "${QUOTAGATE_BIN:-}" ]; then cargo build --release --quiet; fi
BIN=${QUOTAGATE_BIN:-target/release/quotagate}
bench_workdir
ulimit -n "$(ulimit -Hn)"

cat > "$WORK/catalog.json" <<'JSON'
{"methods": ["GET"], "paths": ["/held"], "endpoints": [{"p": 0, "m": 0}],
 "apilimits": [{"key": "k", "limits": [{"ep": 0, "concurrent": 1, "wait_ms": 60000}]}]}
JSON
UP_PORT=$(free_port)
# An upstream that reads requests and never answers.
python3 - "$UP_PORT" <<'PY' & PIDS+=($!)
import asyncio, sys
async def hold(r, w):
    await r.read(1 << 16)
    await asyncio.sleep(3600)
async def main():
    s = await asyncio.start_server(hold, "127.0.0.1", int(sys.argv[1]))
    await s.serve_forever()
asyncio.run(main())
PY
wait_port "$UP_PORT"
GW_PORT=$(free_port)
"$BIN" --listen "127.0.0.1:$GW_PORT" --upstream "http://127.0.0.1:$UP_PORT" \
  --catalog "$WORK/catalog.json" --set server.workers=1 --set log.level=warn \
  --set admin.enabled=false --set "limits.wait_queue_max=$((WAITING + 10))" \
  --set "server.max_connections=$((WAITING + 100))" --set upstream.response_timeout_ms=600000 \
  2>>"$WORK/gw.log" & GW=$!
PIDS+=("$GW")
wait_port "$GW_PORT"
rss() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }

python3 - "$GW_PORT" "$WAITING" "$SECONDS_WAITING" "$GW" "$TICKS_PER_S" "$(machine_line)" <<'PY'
import asyncio, sys
port, n, secs, gw, hz, machine = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5]), sys.argv[6]
REQ = b"GET /held HTTP/1.1\r\nHost: x\r\nX-Api-Key: k\r\n\r\n"
def rss_kb():
    for line in open(f"/proc/{gw}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
def ticks():
    f = open(f"/proc/{gw}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
async def send():
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(REQ)
    await w.drain()
    return r, w
async def main():
    holder = await send()
    await asyncio.sleep(0.5)
    before = rss_kb()
    conns = []
    for i in range(0, n, 500):
        conns += await asyncio.gather(*(send() for _ in range(min(500, n - i))))
    await asyncio.sleep(1.0)
    # Nobody has been answered: all of them wait.
    answered = sum(1 for r, _ in conns if r.at_eof() or len(r._buffer) > 0)
    t0, during = ticks(), rss_kb()
    await asyncio.sleep(secs)
    cpu = (ticks() - t0) / hz
    print(f"machine: {machine}")
    print("| requests waiting | RSS before | RSS while waiting | per waiting request | CPU over the wait |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {n:,} | {before / 1024:.1f} MB | {during / 1024:.1f} MB | {(during - before) * 1024 / n:,.0f} B | {cpu:.2f} s in {secs:.0f} s |")
    if answered:
        print(f"({answered} were answered before the measure: not all waited)")
asyncio.run(main())
PY
