#!/usr/bin/env bash
# What requests waiting for room cost (issue 30: 10,000 waiting <= 20 MB, no CPU while they wait).
#
#   scripts/bench-wait.sh [REQUESTS] [SECONDS]     (defaults: 10000 requests, 10 s)
#
# One gateway (memory store, 1 worker) in front of an upstream that reads requests and never
# answers. Two rows, a fresh gateway each:
# - waiting: the key has one slot (`"concurrent": 1, "wait_ms": 60000`), taken by one request;
#   REQUESTS more, on as many connections, each wait for it;
# - in flight upstream, for comparison: the key has a slot for each (`"concurrent": 1000000`):
#   REQUESTS requests forwarded, each waiting for the upstream's answer;
# - both again over HTTP/2 (prior knowledge, 100 streams a connection, python's `h2`, installed
#   if missing): the connections' own memory shared by 100 requests, so what a wait costs shows.
# Prints the gateway's resident memory (/proc VmRSS) before and while they are held, per request,
# and its CPU time (utime + stime) over SECONDS of holding them. QUOTAGATE_BIN=... measures
# another build. Appends nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

REQUESTS=${1:-10000}
HOLD_SECONDS=${2:-10}
quotagate_builds
bench_workdir
ulimit -n "$(ulimit -Hn)"

python3 -c "import h2" 2>/dev/null || pip install --quiet h2 >/dev/null 2>&1
UP_PORT=$(free_port)
python3 - "$UP_PORT" <<'PY' & PIDS+=($!)
import asyncio, sys
async def hold(r, w):
    # Never answers; lets go when the gateway does (the next row starts a new one).
    while await r.read(1 << 16):
        pass
    w.close()
async def main():
    s = await asyncio.start_server(hold, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await s.serve_forever()
asyncio.run(main())
PY
wait_port "$UP_PORT"

echo "machine: $(machine_line)"
echo "| requests held | RSS before | RSS while held | per request | CPU while held |"
echo "|---|---:|---:|---:|---:|"
# row LABEL LIMIT HOLDER [h2]: one gateway whose key has LIMIT; HOLDER=1 takes the one slot
# first; h2: the requests are HTTP/2 streams, 100 a connection.
row() {
  local label=$1 limit=$2 holder=$3 proto=${4:-h1} port gw
  printf '{"methods": ["GET"], "paths": ["/held"], "endpoints": [{"p": 0, "m": 0}],
    "apilimits": [{"key": "k", "limits": [%s]}]}' "$limit" > "$WORK/catalog.json"
  port=$(free_port)
  "$BIN" --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$UP_PORT" \
    --catalog "$WORK/catalog.json" --set server.workers=1 --set log.level=warn \
    --set admin.enabled=false --set "limits.wait_queue_max=$((REQUESTS + 10))" \
    --set "server.max_connections=$((REQUESTS + 100))" --set upstream.response_timeout_ms=600000 \
    2>>"$WORK/gw.log" & gw=$!
  wait_port "$port"
  python3 - "$port" "$REQUESTS" "$HOLD_SECONDS" "$gw" "$TICKS_PER_S" "$label" "$holder" "$proto" <<'PY'
import asyncio, sys
port, n, secs, gw, hz, label, holder = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5]), sys.argv[6], sys.argv[7] == "1"
H2, STREAMS = sys.argv[8] == "h2", 100
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
class H2Conn:
    """One HTTP/2 connection with `streams` requests open on it; counts the answers begun."""
    async def open(self, streams):
        import h2.config, h2.connection, h2.events
        self.events, self.answered = h2.events, 0
        self.r, self.w = await asyncio.open_connection("127.0.0.1", port)
        self.c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.c.initiate_connection()
        self.w.write(self.c.data_to_send())
        self.settled = asyncio.Event()
        self.task = asyncio.create_task(self.pump())
        await self.settled.wait()
        for _ in range(streams):
            sid = self.c.get_next_available_stream_id()
            self.c.send_headers(sid, [(":method", "GET"), (":path", "/held"), (":scheme", "http"),
                                      (":authority", "x"), ("x-api-key", "k")], end_stream=True)
        self.w.write(self.c.data_to_send())
        await self.w.drain()
        return self
    async def pump(self):
        while data := await self.r.read(65536):
            for e in self.c.receive_data(data):
                if isinstance(e, self.events.RemoteSettingsChanged):
                    self.settled.set()
                elif isinstance(e, self.events.ResponseReceived):
                    self.answered += 1
            self.w.write(self.c.data_to_send())
async def main():
    if holder:
        await send()
    await asyncio.sleep(0.5)
    before = rss_kb()
    conns = []
    if H2:
        for i in range(0, n, STREAMS * 50):
            conns += await asyncio.gather(*(H2Conn().open(min(STREAMS, n - j))
                                            for j in range(i, min(n, i + STREAMS * 50), STREAMS)))
    else:
        for i in range(0, n, 500):
            conns += await asyncio.gather(*(send() for _ in range(min(500, n - i))))
    await asyncio.sleep(2.0)
    if H2:
        answered = sum(c.answered for c in conns)
    else:
        answered = sum(1 for r, _ in conns if len(r._buffer) > 0 or r.at_eof())
    t0, during = ticks(), rss_kb()
    await asyncio.sleep(secs)
    cpu = (ticks() - t0) / hz
    note = f" ({answered} answered early)" if answered else ""
    print(f"| {n:,} {label}{note} | {before / 1024:.1f} MB | {during / 1024:.1f} MB | {(during - before) * 1024 / n:,.0f} B | {cpu:.2f} s in {secs:.0f} s |")
asyncio.run(main())
PY
  kill "$gw"; wait "$gw" 2>/dev/null || true
}
row "waiting for a slot" '{"ep": 0, "concurrent": 1, "wait_ms": 60000}' 1
row "in flight upstream" '{"ep": 0, "concurrent": 1000000}' 0
row "waiting for a slot, HTTP/2" '{"ep": 0, "concurrent": 1, "wait_ms": 60000}' 1 h2
row "in flight upstream, HTTP/2" '{"ep": 0, "concurrent": 1000000}' 0 h2
