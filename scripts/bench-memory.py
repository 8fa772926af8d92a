"""Resident memory of a running gateway per idle keep-alive connection, and after they close.

    python3 scripts/bench-memory.py PID HOST:PORT [CONNECTIONS] [BURSTS]

Opens CONNECTIONS connections (default 5000), sends one request on each (X-Api-Key: key-0001,
GET /users/1) and reads the answer, keeps them open and idle for SETTLE_S seconds (default 2), reads
the gateway's VmRSS from /proc, closes them all, waits SETTLE_S again and reads it again; BURSTS
times (default 4). Prints one Markdown row per
burst. Used by scripts/bench.sh; a ratchet (memory that never comes back) shows as a growing
"after close" column.
"""
import asyncio
import resource
import sys
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def one(host, port, opened):
    r, w = await asyncio.open_connection(host, port)
    w.write(b"GET /users/1 HTTP/1.1\r\nHost: bench\r\nX-Api-Key: key-0001\r\n\r\n")
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await r.readexactly(length)
    opened.append(w)


async def burst(pid, host, port, n):
    opened = []
    sem = asyncio.Semaphore(200)

    async def guarded():
        async with sem:
            await one(host, port, opened)

    await asyncio.gather(*(guarded() for _ in range(n)))
    # Idle for a while first: what the allocator keeps of the burst's short-lived memory (it
    # returns it within a second or so) is not memory the idle connections hold.
    time.sleep(float(__import__("os").environ.get("SETTLE_S", "2")))
    busy = rss_kib(pid)
    for w in opened:
        w.close()
    await asyncio.gather(*(w.wait_closed() for w in opened), return_exceptions=True)
    time.sleep(float(__import__("os").environ.get("SETTLE_S", "2")))
    return busy, rss_kib(pid)


def main():
    pid, addr = int(sys.argv[1]), sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
    bursts = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    host, port = addr.rsplit(":", 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 100)), hard))
    start = rss_kib(pid)
    print(f"| burst | connections | RSS before MiB | RSS with them open MiB | KiB per idle connection | RSS after close MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    before = start
    for i in range(bursts):
        busy, after = asyncio.run(burst(pid, host, int(port), n))
        print(f"| {i + 1} | {n} | {before / 1024:.1f} | {busy / 1024:.1f} | {(busy - before) / n:.1f} | {after / 1024:.1f} |")
        before = after


main()
