"""Memory per held connection and request: quotagate beside nginx, in one run (issue 75).

    python3 scripts/bench-memory.py [--held 1000,10000] [--rows h1,tls,h2] [--bin PATH]
    python3 scripts/bench-memory.py ratchet PID HOST:PORT [CONNECTIONS] [BURSTS]

For each protocol (cleartext HTTP/1.1; HTTP/1.1 over TLS 1.3; HTTP/2 with prior knowledge) and
each number of things held, nginx (1 worker, `nginx` from Debian's nginx-light) and quotagate
(`server.workers = 1`, the memory store) are started fresh, each in front of the same upstream
(a process of this script's: `/users/...` is answered, anything else is read and never
answered), and made to hold:
- idle: connections that had one request answered (`GET /users/1`) and send nothing more;
- waiting: requests waiting for room (nginx: `limit_req` with a burst, delayed; quotagate: a
  key's `"concurrent": 1` with `"wait_ms"`, its one slot taken by a request held upstream);
- in flight: requests forwarded to the upstream, which has not answered.
Over HTTP/2 a connection carries 100 of the waiting or in-flight requests, as streams; an idle
row holds connections. Each figure is the server's resident memory (VmRSS of nginx's worker, of
quotagate's process) with them held, less before, over their number, after a warm-up of the
same kind and a settle of SETTLE_S seconds (default 2). The bound is quotagate <= nginx in each
row. The held count of a row with an upstream connection per request is capped below half the
open-file limit (each server then holds two descriptors a request).

`ratchet` (used by scripts/bench.sh): a running gateway's memory per idle keep-alive connection
and after they close, BURSTS times (default 4; CONNECTIONS default 5000); a ratchet (memory that
never comes back) shows as a growing "after close" column.
"""
import argparse
import asyncio
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTLE_S = float(os.environ.get("SETTLE_S", "2"))
STREAMS = 100
KEY = "k"

UPSTREAM = r"""
import asyncio, sys
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"id\": 1}\n\n"
async def serve(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            if head.split(b" ", 2)[1].startswith(b"/users/"):
                w.write(ANSWER)
                await w.drain()
                continue
            while await r.read(1 << 16):
                pass
            break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    w.close()
async def main():
    s = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await s.serve_forever()
asyncio.run(main())
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, deadline_s=30):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"a server exited at start (status {proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on port {port} after {deadline_s} s")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def lift_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# --- the client: connections and requests held --------------------------------------------------

def request(path):
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\nX-Api-Key: {KEY}\r\n\r\n".encode()


async def read_answer(r):
    head = await r.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await r.readexactly(length)


class H1:
    """HTTP/1.1 connections, over TLS with `tls`; `held` keeps them open."""

    def __init__(self, port, tls):
        self.port, self.held = port, []
        self.tls = None
        if tls:
            self.tls = ssl.create_default_context()
            self.tls.check_hostname, self.tls.verify_mode = False, ssl.CERT_NONE
            self.tls.set_alpn_protocols(["http/1.1"])

    async def open(self):
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls)

    async def idle(self):
        r, w = await self.open()
        w.write(request("/users/1"))
        await read_answer(r)
        self.held.append((r, w))

    async def send(self, path):
        r, w = await self.open()
        w.write(request(path))
        await w.drain()
        self.held.append((r, w))

    def answered(self):
        return sum(1 for r, _ in self.held if len(r._buffer) > 0 or r.at_eof())

    async def close(self):
        for _, w in self.held:
            w.close()
        await asyncio.gather(*(w.wait_closed() for _, w in self.held), return_exceptions=True)
        self.held = []


class H2Conn:
    """One HTTP/2 connection (prior knowledge, python's `h2`)."""

    async def open(self, port):
        import h2.config
        import h2.connection
        import h2.events
        self.events, self.ended = h2.events, 0
        self.r, self.w = await asyncio.open_connection("127.0.0.1", port)
        self.c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.c.initiate_connection()
        self.w.write(self.c.data_to_send())
        self.settled, self.done = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(self.pump())
        await self.settled.wait()
        return self

    def streams(self, path, n):
        self.sent = n
        for _ in range(n):
            sid = self.c.get_next_available_stream_id()
            self.c.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                      (":authority", "bench"), ("x-api-key", KEY)], end_stream=True)
        self.w.write(self.c.data_to_send())

    async def pump(self):
        try:
            while data := await self.r.read(65536):
                for e in self.c.receive_data(data):
                    if isinstance(e, self.events.RemoteSettingsChanged):
                        self.settled.set()
                    elif isinstance(e, self.events.StreamEnded):
                        self.ended += 1
                        self.done.set()
                    elif isinstance(e, self.events.DataReceived):
                        self.c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                self.w.write(self.c.data_to_send())
        except ConnectionError:
            pass


class H2:
    def __init__(self, port):
        self.port, self.held = port, []

    async def idle(self):
        c = await H2Conn().open(self.port)
        c.streams("/users/1", 1)
        await c.done.wait()
        self.held.append(c)

    async def send_many(self, path, n):
        c = await H2Conn().open(self.port)
        c.streams(path, n)
        await c.w.drain()
        self.held.append(c)

    async def close(self):
        for c in self.held:
            c.task.cancel()
            c.w.close()
        await asyncio.gather(*(c.w.wait_closed() for c in self.held), return_exceptions=True)
        self.held = []


async def gather_bounded(coros, at_once=200):
    """Runs `coros`, `at_once` at a time; returns how many failed (a connection refused or reset:
    the row counts what was held)."""
    sem = asyncio.Semaphore(at_once)

    async def one(c):
        async with sem:
            await c

    done = await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)
    return sum(1 for d in done if isinstance(d, BaseException))


async def hold(proto, what, port, n):
    """Opens what a row holds, `n` of them; returns (client, early answers, how many held)."""
    if proto == "h2":
        client = H2(port)
        if what == "idle":
            await gather_bounded(client.idle() for _ in range(n))
        else:
            path = "/wait" if what == "waiting" else "/held"
            counts = [STREAMS] * (n // STREAMS) + ([n % STREAMS] if n % STREAMS else [])
            await gather_bounded((client.send_many(path, k) for k in counts), 50)
        await asyncio.sleep(SETTLE_S)
        held = len(client.held) if what == "idle" else sum(c.sent for c in client.held)
        early = sum(c.ended for c in client.held) - (held if what == "idle" else 0)
        return client, early, held
    client = H1(port, proto == "tls")
    if what == "idle":
        await gather_bounded(client.idle() for _ in range(n))
    else:
        path = "/wait" if what == "waiting" else "/held"
        await gather_bounded(client.send(path) for _ in range(n))
    await asyncio.sleep(SETTLE_S)
    early = 0 if what == "idle" else client.answered()
    return client, early, len(client.held)


async def measure(pid, proto, what, port, n):
    """Warm-up of the same kind, then `n` held: KiB per thing held."""
    warm, _, _ = await hold(proto, what, port, min(n, 200))
    await warm.close()
    await asyncio.sleep(SETTLE_S)
    before = rss_kib(pid)
    client, early, held = await hold(proto, what, port, n)
    during = rss_kib(pid)
    await client.close()
    return (during - before) / max(held, 1), early, n - held


async def holder(proto, port):
    """Takes the waiting rows' one slot (nginx: the burst's first, passed at once) with a request
    the upstream holds."""
    c = H1(port, proto == "tls")
    await c.send("/wait")
    await asyncio.sleep(0.3)
    return c


# --- the servers ----------------------------------------------------------------------------------

def nginx_conf(work, up, ports, cert, key, nofile):
    proxied = "proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_read_timeout 600s;"
    conf = f"""worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log stderr error;
worker_rlimit_nofile {nofile};
events {{ worker_connections {nofile - 100}; }}
http {{
  access_log off;
  client_body_temp_path {work}/body; proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fcgi; uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
  upstream up {{ server 127.0.0.1:{up}; keepalive 64; }}
  limit_req_zone $http_x_api_key zone=w:10m rate=1r/m;
  server {{
    listen 127.0.0.1:{ports['h1']};
    listen 127.0.0.1:{ports['tls']} ssl;
    listen 127.0.0.1:{ports['h2']} http2;
    ssl_certificate {cert}; ssl_certificate_key {key};
    location /users/ {{ {proxied} }}
    location /held {{ {proxied} }}
    location /wait {{ limit_req zone=w burst=100000; {proxied} }}
  }}
}}
"""
    path = os.path.join(work, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    return path


def start_nginx(nginx, conf, ports, proto):
    p = subprocess.Popen([nginx, "-e", "stderr", "-p", os.path.dirname(conf), "-c", conf],
                         stderr=subprocess.DEVNULL, preexec_fn=lift_nofile)
    wait_port(ports[proto], p)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        if kids:
            return p, int(kids[0])
        time.sleep(0.05)
    sys.exit("nginx started no worker")


def start_quotagate(binary, work, up, port, proto, cert, key, n):
    catalog = os.path.join(work, "catalog.json")
    with open(catalog, "w") as f:
        f.write('{"methods": ["GET"], "paths": ["/users/{id}", "/held", "/wait"],'
                ' "endpoints": [{"p": 0, "m": 0}, {"p": 1, "m": 0}, {"p": 2, "m": 0}],'
                f' "apilimits": [{{"key": "{KEY}", "limits": [{{"ep": 0, "concurrent": 1000000}},'
                ' {"ep": 1, "concurrent": 1000000}, {"ep": 2, "concurrent": 1, "wait_ms": 60000}]}]}')
    args = [binary, "--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{up}",
            "--catalog", catalog, "--set", "server.workers=1", "--set", "log.level=warn",
            "--set", "admin.enabled=false", "--set", f"limits.wait_queue_max={n + 10}",
            "--set", f"server.max_connections={n + 100}",
            "--set", "upstream.response_timeout_ms=600000"]
    if proto == "tls":
        args += ["--set", f"server.tls_cert_file={cert}", "--set", f"server.tls_key_file={key}"]
    p = subprocess.Popen(args, stderr=open(os.path.join(work, "quotagate.log"), "a"),
                         preexec_fn=lift_nofile)
    wait_port(port, p)
    return p, p.pid


def stop(p):
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


LABELS = {
    ("h1", "idle"): "idle keep-alive connection (after one answered request)",
    ("h1", "waiting"): "request waiting for room",
    ("h1", "flight"): "request in flight to an upstream that has not answered",
    ("tls", "idle"): "TLS: idle keep-alive connection",
    ("tls", "waiting"): "TLS: request waiting for room",
    ("tls", "flight"): "TLS: request in flight",
    ("h2", "idle"): "HTTP/2: idle connection (after one answered stream)",
    ("h2", "waiting"): f"HTTP/2: stream waiting for room ({STREAMS} a connection)",
    ("h2", "flight"): f"HTTP/2: stream in flight ({STREAMS} a connection)",
}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "ratchet":
        return ratchet(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held", default="1000,10000")
    ap.add_argument("--rows", default="h1,tls,h2")
    ap.add_argument("--bin", default=os.environ.get("QUOTAGATE_BIN", os.path.join(ROOT, "target/release/quotagate")))
    a = ap.parse_args()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    for tool, pkg in ((nginx, "nginx-light"), (a.bin, "cargo build --release")):
        if not os.path.exists(tool):
            sys.exit(f"{tool} is missing ({pkg})")
    try:
        import h2  # noqa: F401
    except ImportError:
        sys.exit("python's h2 is missing (pip install h2)")
    nofile = lift_nofile()
    work = tempfile.mkdtemp(prefix="bench-memory-")
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=bench",
                    "-addext", "subjectAltName=DNS:bench"], check=True, capture_output=True)
    up = free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up)], preexec_fn=lift_nofile)
    wait_port(up, upstream)
    ports = {"h1": free_port(), "tls": free_port(), "h2": free_port()}
    conf = nginx_conf(work, up, ports, cert, key, nofile)
    helds = [int(x) for x in a.held.split(",")]
    # Two descriptors a request in flight, and room for the listeners, the warm-up's last and
    # nginx's own (at 9,900 of 20,000 nginx answered ~500 requests early: out of connections).
    cap = (nofile - 1000) // 2
    print(f"machine: {os.cpu_count()} cores, {os.uname().release}; quotagate {a.bin}; "
          f"{subprocess.run([nginx, '-v'], capture_output=True, text=True).stderr.strip()}")
    print("| held | number | nginx KiB each | quotagate KiB each | ratio | bound: <= nginx |")
    print("|---|---:|---:|---:|---:|---|")
    met = total = 0
    try:
        for proto in a.rows.split(","):
            for what in ("idle", "waiting", "flight"):
                for wanted in helds:
                    n = min(wanted, cap) if what == "flight" else wanted
                    figures = []
                    for server in ("nginx", "quotagate"):
                        if server == "nginx":
                            p, pid = start_nginx(nginx, conf, ports, proto)
                            port = ports[proto]
                        else:
                            port = free_port()
                            p, pid = start_quotagate(a.bin, work, up, port, proto, cert, key, n)
                        try:
                            async def run():
                                slot = await holder(proto, port) if what == "waiting" else None
                                got = await measure(pid, proto, what, port, n)
                                if slot:
                                    await slot.close()
                                return got
                            figures.append(asyncio.run(run()))
                        finally:
                            stop(p)
                    (ng, ng_early, ng_lost), (qg, qg_early, qg_lost) = figures
                    ratio = qg / ng if ng > 0 else float("inf")
                    ok = qg <= ng
                    met, total = met + ok, total + 1
                    note = ""
                    if ng_early or qg_early:
                        note = f" (answered early: nginx {ng_early}, quotagate {qg_early})"
                    if ng_lost or qg_lost:
                        note += f" (not opened: nginx {ng_lost}, quotagate {qg_lost})"
                    capped = f" (capped from {wanted:,})" if n != wanted else ""
                    print(f"| {LABELS[(proto, what)]}{note} | {n:,}{capped} | {ng:.1f} | {qg:.1f} | "
                          f"{ratio:.2f}x | {'met' if ok else 'not met'} |", flush=True)
    finally:
        stop(upstream)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbounds met: {met} of {total}")


# --- ratchet (scripts/bench.sh) -------------------------------------------------------------------

async def ratchet_burst(pid, host, port, n):
    client = H1(port, False)
    await gather_bounded(client.idle() for _ in range(n))
    # Idle for a while first: what the allocator keeps of the burst's short-lived memory (it
    # returns it within a second or so) is not memory the idle connections hold.
    time.sleep(SETTLE_S)
    busy = rss_kib(pid)
    await client.close()
    time.sleep(SETTLE_S)
    return busy, rss_kib(pid)


def ratchet(argv):
    pid, addr = int(argv[0]), argv[1]
    n = int(argv[2]) if len(argv) > 2 else 5000
    bursts = int(argv[3]) if len(argv) > 3 else 4
    host, port = addr.rsplit(":", 1)
    lift_nofile()
    print("| burst | connections | RSS before MiB | RSS with them open MiB | KiB per idle connection | RSS after close MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    before = rss_kib(pid)
    for i in range(bursts):
        busy, after = asyncio.run(ratchet_burst(pid, host, int(port), n))
        print(f"| {i + 1} | {n} | {before / 1024:.1f} | {busy / 1024:.1f} | {(busy - before) / n:.1f} | {after / 1024:.1f} |")
        before = after


main()
