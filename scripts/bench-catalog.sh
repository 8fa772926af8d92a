#!/usr/bin/env bash
# What a large catalog costs (issue 32: a million keys).
#
#   scripts/bench-catalog.sh [KEYS...]        (default: 100000 1000000)
#
# Per size, a generated catalog of KEYS API keys with 3 limits each (16-character keys, compact
# JSON: about 91 bytes per key) and, one at a time:
# - `quotagate validate`: its peak resident memory (ru_maxrss);
# - a gateway started from the file: seconds until it serves a key, its resident memory once ready
#   (VmRSS) beside a gateway with a one-key catalog, per key, and its peak during start-up (VmHWM);
# - `quotagate catalog-server`: seconds until it serves the file; a gateway started from it:
#   seconds until it serves a key; then the server gets a new file with one more key (seconds
#   until it serves it), a request carrying the refresh header is sent, and the new key is asked
#   for every 10 ms without the header: seconds from the refresh request until the new key is
#   served, and the gateway's peak memory during the change over its steady memory; the server's
#   peak memory.
# Goals (issue 32): <= 250 bytes per key; validate <= 2x the gateway's peak; the change seen
# <= 1 s after the refresh request with peak <= 1.5x steady and p99 <= 3x before; start-up <= 6 s:
# printed last, measured against this run's figures. QUOTAGATE_BIN=... measures another build.
# DIGESTS=sha256 names every key by its SHA-256 (`"key_digest": "sha256:<hex>"`, issue 72; about
# 158 bytes a key) instead of in plain.
# Appends nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

SIZES=("$@")
[ "${#SIZES[@]}" -gt 0 ] || SIZES=(100000 1000000)
quotagate_builds
bench_workdir

echo "machine: $(machine_line)"
echo "build: $("$BIN" --version 2>/dev/null || echo "$BIN")"
python3 - "$BIN" "$WORK" "${SIZES[@]}" <<'PY'
import hashlib, json, os, resource, socket, subprocess, sys, threading, time, urllib.request
DIGESTS = os.environ.get("DIGESTS", "")

BIN, WORK, SIZES = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3:]]
MAX_BYTES = 256 << 20
SECRET = "refresh-secret"

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def key(i):
    return "%016x" % ((i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1))

def named(k):
    if DIGESTS == "sha256":
        return '"key_digest":"sha256:%s"' % hashlib.sha256(k.encode()).hexdigest()
    return '"key":"%s"' % k

def write_catalog(path, n, extra=None, bump=0):
    with open(path, "w") as f:
        f.write('{"version":{"semver":"v1","released":"2026-01-01T00:00:00Z"},'
                '"methods":["GET"],"paths":["/a/{id}","/b"],'
                '"endpoints":[{"p":0,"m":0},{"p":1,"m":0}],"apilimits":[')
        for i in range(n):
            if i:
                f.write(",")
            f.write('{%s,"limits":[{"ep":0,"rl":%d,"w":1},{"ep":0,"rl":5000},'
                    '{"ep":1,"rl":1000,"w":3600}]}' % (named(key(i)), 100 + i % 50 + bump))
        if extra:
            f.write(',{%s,"limits":[{"ep":0,"rl":7}]}' % named(extra))
        f.write("]}")

def status_field(pid, name):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024
    return 0

def ask(port, k, headers=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/a/1", headers={"X-Api-Key": k, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None

def latest(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/latest", timeout=5) as r:
            return json.load(r).get("hash")
    except OSError:
        return None

def until_server_serves(port, not_hash=None, deadline_s=120):
    """Seconds until the catalog server serves a version (other than not_hash)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        h = latest(port)
        if h and h != not_hash:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise SystemExit("the catalog server never served the catalog")

def limit_of(port, k):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/a/1", headers={"X-Api-Key": k})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers.get("ratelimit-limit")
    except urllib.error.HTTPError as e:
        return e.headers.get("ratelimit-limit")
    except OSError:
        return None

class Sampler:
    """Requests of one key, one after another, each one's latency kept with its start."""
    def __init__(self, port):
        self.port, self.samples, self.running = port, [], True
        self.thread = threading.Thread(target=self.run); self.thread.start()
    def run(self):
        while self.running:
            t = time.monotonic(); ask(self.port, key(1), timeout=10)
            self.samples.append((t, time.monotonic() - t))
    def stop(self):
        self.running = False; self.thread.join()
    def p99_max(self, start, end):
        """Seconds: the p99 and the slowest of the requests started in [start, end); None if none."""
        lat = sorted(l for t, l in self.samples if start <= t < end)
        return (lat[int(0.99 * (len(lat) - 1))], lat[-1]) if lat else None

def p99_max_text(pm):
    return "-" if pm is None else f"{pm[0] * 1e3:.1f} / {pm[1] * 1e3:.0f} ms"

def change(port, cport, ready):
    """Triggers a fetch with the refresh header; seconds until ready() holds; p99/max before
    (the second before the trigger) and during (trigger to 0.5 s after ready)."""
    sampler = Sampler(port)
    time.sleep(1.0)
    with open(f"/proc/{p.pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    t0 = time.monotonic()
    threading.Thread(target=ask, args=(port, key(2), {"X-Quotagate-Refresh": SECRET}, 30)).start()
    seen = None
    while time.monotonic() - t0 < 60:
        if ready():
            seen = time.monotonic() - t0
            break
        time.sleep(0.01)
    time.sleep(0.5)
    sampler.stop()
    end = t0 + (seen or 60) + 0.5
    return seen, sampler.p99_max(t0 - 1.0, t0), sampler.p99_max(t0, end), status_field(p.pid, "VmHWM")

def until_served(port, k, deadline_s=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if ask(port, k, timeout=2) == 200:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise SystemExit(f"key never served on {port}")

# An upstream that answers 200 to everything.
up_port = free_port()
upstream = subprocess.Popen([BIN, "example-upstream", "--listen", f"127.0.0.1:{up_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(0.5)

def gateway(*args):
    port = free_port()
    p = subprocess.Popen([BIN, "--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{up_port}",
                          "--set", "log.level=warn", "--set", "admin.enabled=false",
                          "--set", f"catalog.max_bytes={MAX_BYTES}", *args],
                         stdout=subprocess.DEVNULL, stderr=open(f"{WORK}/gw.log", "a"))
    return p, port

def stop(p):
    p.terminate(); p.wait()

def mb(b):
    return f"{b / 1e6:.0f} MB"

# Baseline: a gateway with a one-key catalog.
write_catalog(f"{WORK}/one.json", 1)
p, port = gateway("--catalog", f"{WORK}/one.json")
until_served(port, key(0))
time.sleep(0.3)
base_rss = status_field(p.pid, "VmRSS")
stop(p)

rows = []
for n in SIZES:
    d = f"{WORK}/cat{n}"; os.makedirs(d)
    path = f"{d}/v1.json"
    write_catalog(path, n)
    size = os.path.getsize(path)
    # validate, in a child of its own so that ru_maxrss is its own.
    peak_validate = int(subprocess.check_output([sys.executable, "-c",
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
        BIN, "validate", "--max-bytes", str(MAX_BYTES), path])) * 1024
    # From the file.
    t0 = time.monotonic()
    p, port = gateway("--catalog", path)
    until_served(port, key(n - 1))
    start_file = time.monotonic() - t0
    time.sleep(0.5)
    rss = status_field(p.pid, "VmRSS")
    peak_start = status_field(p.pid, "VmHWM")
    stop(p)
    # From a catalog server, then one key more.
    cport = free_port()
    server = subprocess.Popen([BIN, "catalog-server", "--catalog", d, "--listen", f"127.0.0.1:{cport}",
                               "--set", f"catalog.max_bytes={MAX_BYTES}", "--set", "log.level=warn"],
                              stdout=subprocess.DEVNULL, stderr=open(f"{WORK}/server.log", "a"))
    server_load = until_server_serves(cport)
    t0 = time.monotonic()
    p, port = gateway("--set", f"catalog.server_url=http://127.0.0.1:{cport}",
                      "--set", "catalog.poll_interval_ms=3600000",
                      "--set", f"catalog.refresh_secret={SECRET}",
                      "--set", "catalog.request_timeout_ms=60000")
    until_served(port, key(n - 1))
    start_server = time.monotonic() - t0
    time.sleep(1.5)  # past catalog.refresh_min_interval_ms since the first fetch
    steady = status_field(p.pid, "VmRSS")
    v1 = latest(cport)
    write_catalog(f"{d}/v2.json", n, extra="newkey-000000001")
    server_change = until_server_serves(cport, not_hash=v1)
    one = change(port, cport, lambda: ask(port, "newkey-000000001", timeout=5) == 200)
    # Every key changed.
    v2 = latest(cport)
    write_catalog(f"{d}/v3.json", n, extra="newkey-000000001", bump=1000)
    until_server_serves(cport, not_hash=v2)
    time.sleep(1.0)  # past catalog.refresh_min_interval_ms
    every = change(port, cport, lambda: limit_of(port, key(0)) not in (None, "100"))
    stop(p)
    server_rss = status_field(server.pid, "VmHWM")
    stop(server)
    rows.append((n, size, peak_validate, start_file, rss, peak_start, start_server, one, every, steady,
                 server_load, server_change, server_rss))
    for f in os.listdir(d):
        os.remove(f"{d}/{f}")

stop(upstream)
print(f"baseline gateway (one key): {mb(base_rss)} resident")
print("| keys | catalog | validate peak | start-up (file) | resident | per key | start-up peak | start-up (server) | catalog-server: loads / a change / peak |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (n, size, pv, sf, rss, ps, ss, one, every, steady, sl, sc, srss) in rows:
    print(f"| {n:,} | {mb(size)} | {mb(pv)} ({pv / max(ps, 1):.2f}x gateway peak) | {sf:.2f} s | {mb(rss)} "
          f"| {(rss - base_rss) / n:.0f} B | {mb(ps)} | {ss:.2f} s | {sl:.2f} s / {sc:.2f} s / {mb(srss)} |")
print()
print("Changes through the catalog server, after the refresh request (p99 / slowest of one client's requests, one after another):")
print("| keys | change | seen after | p99 / max before | p99 / max during | peak during / steady |")
print("|---:|---|---:|---:|---:|---:|")
for (n, size, pv, sf, rss, ps, ss, one, every, steady, sl, sc, srss) in rows:
    for name, (seen, before, during, peak) in (("one key added", one), ("every key changed", every)):
        seen_s = f"{seen:.2f} s" if seen is not None else "never"
        print(f"| {n:,} | {name} | {seen_s} | {p99_max_text(before)} | {p99_max_text(during)} "
              f"| {mb(peak)} / {mb(steady)} = {peak / max(steady, 1):.2f}x |")

# Issue 32's bounds, as this run measured them.
def p99_ratio(before, during):
    return during[0] / before[0] if before and during and before[0] > 0 else None
print()
print("| keys | bound | measured | met |")
print("|---:|---|---:|---|")
for (n, size, pv, sf, rss, ps, ss, one, every, steady, sl, sc, srss) in rows:
    goals = [
        ("resident <= 250 B a key (3 limits)", (rss - base_rss) / n, 250, "{:.0f} B"),
        ("`quotagate validate` peak <= 2x the gateway's", pv / max(ps, 1), 2.0, "{:.2f}x"),
        ("start-up from the file <= 6 s", sf, 6.0, "{:.2f} s"),
        ("start-up from the catalog server <= 6 s", ss, 6.0, "{:.2f} s"),
        ("one key added: seen <= 1 s after the refresh request", one[0], 1.0, "{:.2f} s"),
    ]
    for name, (seen, before, during, peak) in (("one key added", one), ("every key changed", every)):
        goals.append((f"{name}: peak memory <= 1.5x steady", peak / max(steady, 1), 1.5, "{:.2f}x"))
        goals.append((f"{name}: p99 during <= 3x before", p99_ratio(before, during), 3.0, "{:.2f}x"))
    # Below 100,000 keys the gateway's fixed costs and the allocator's page-sized steps are most
    # of the resident difference: that bound is the issue's for a million keys.
    if n < 100_000:
        goals = goals[1:]
    for what, value, bound, fmt in goals:
        # None: never seen, or no request sampled: not met.
        shown = "-" if value is None else fmt.format(value)
        met = "yes" if value is not None and value <= bound else "no"
        print(f"| {n:,} | {what} | {shown} | {met} |")
PY
