#!/usr/bin/env python3
"""Soak and edge run (issue 9): not a CI test. Starts the release gateway (memory store, a Divvy
port) in front of the example upstream, and for SECONDS (default 180) runs at once:

- load: 8 threads of keep-alive clients, 80% of requests from 1000 known keys, 20% from ever-new
  unknown keys (which must never create state);
- slowloris: 200 connections sending one header byte a second;
- idle: 2000 keep-alive connections that sent one request each and stay open;
- Divvy: one connection flooding HIT lines, and one client writing lines and never reading.

Every 10 s it prints the gateway's resident memory, open descriptors, requests answered and the
interval's latency percentiles, so a leak or a stall shows as a number. Run:

    cargo build --release && python3 scripts/soak.py [SECONDS]
"""
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 180
BIN = "target/release/quotagate"
stop = threading.Event()
lock = threading.Lock()
latencies, statuses = [], {}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def proc_numbers(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def load(port, seed):
    rnd = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    n = 0
    while not stop.is_set():
        key = f"key-{rnd.randrange(1000):04d}" if rnd.random() < 0.8 else f"unknown-{seed}-{n}"
        n += 1
        started = time.perf_counter()
        try:
            conn.request("GET", f"/users/{n}", headers={"X-Api-Key": key})
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            status = "error"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with lock:
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1


def slowloris(port, n=200):
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            pass
    while not stop.is_set():
        for s in list(socks):
            try:
                s.sendall(b"X")
            except OSError:
                socks.remove(s)  # closed by the header timeout, as it should be
        time.sleep(1)
    return len(socks)


def idle(port, n=2000):
    conns = []
    for _ in range(n):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            c.request("GET", "/users/1", headers={"X-Api-Key": "key-0001"})
            c.getresponse().read()
            conns.append(c)
        except (OSError, http.client.HTTPException):
            pass
    stop.wait()
    for c in conns:
        c.close()


def divvy_flood(port):
    s = socket.create_connection(("127.0.0.1", port))
    f = s.makefile("rb")
    while not stop.is_set():
        s.sendall(b"HIT method=GET path=/status\n" * 64)
        for _ in range(64):
            f.readline()


def divvy_never_reads(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(1)
    while not stop.is_set():
        try:
            s.sendall(b"HIT method=GET path=/status\n" * 1000)
        except (socket.timeout, OSError):
            time.sleep(0.5)


def main():
    work = tempfile.mkdtemp()
    catalog = os.path.join(work, "catalog.json")
    keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}]} for i in range(1000)]
    json.dump({"version": {"semver": "soak", "hash": "soak"}, "methods": ["GET"], "paths": ["/users/{id}"],
               "endpoints": [{"p": 0, "m": 0}], "apilimits": keys}, open(catalog, "w"))
    up, gw, dv = free_port(), free_port(), free_port()
    upstream = subprocess.Popen([BIN, "example-upstream", "--listen", f"127.0.0.1:{up}"],
                                stderr=subprocess.DEVNULL)
    gateway = subprocess.Popen(
        [BIN, "--listen", f"127.0.0.1:{gw}", "--upstream", f"http://127.0.0.1:{up}", "--catalog", catalog,
         "--set", "log.level=warn", "--set", "admin.enabled=false",
         "--set", "server.header_read_timeout_ms=5000",
         "--set", "divvy.rules=examples/divvy-example.ini", "--set", f"divvy.listen=127.0.0.1:{dv}"],
        stderr=open(os.path.join(work, "gateway.log"), "w"))
    try:
        wait_port(up), wait_port(gw), wait_port(dv)
        rss0, fds0 = proc_numbers(gateway.pid)
        print(f"gateway pid {gateway.pid}: start RSS {rss0:.1f} MiB, {fds0} descriptors; {SECONDS} s")
        threads = [threading.Thread(target=load, args=(gw, i), daemon=True) for i in range(8)]
        threads += [threading.Thread(target=t, args=(p,), daemon=True) for t, p in
                    [(slowloris, gw), (idle, gw), (divvy_flood, dv), (divvy_never_reads, dv)]]
        for t in threads:
            t.start()
        print("| s | RSS MiB | descriptors | answered | p50 ms | p99 ms | statuses |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        started = time.time()
        while time.time() - started < SECONDS:
            time.sleep(10)
            with lock:
                window = sorted(latencies)
                latencies.clear()
                seen = dict(statuses)
            rss, fds = proc_numbers(gateway.pid)
            pct = lambda q: window[int(q * (len(window) - 1))] * 1000 if window else float("nan")
            print(f"| {time.time() - started:.0f} | {rss:.1f} | {fds} | {len(window)} | {pct(0.5):.2f} | "
                  f"{pct(0.99):.2f} | {seen} |", flush=True)
        stop.set()
        time.sleep(6)  # connections close; memory is given back
        rss, fds = proc_numbers(gateway.pid)
        print(f"after stopping the load: RSS {rss:.1f} MiB, {fds} descriptors; gateway alive: "
              f"{gateway.poll() is None}")
    finally:
        stop.set()
        gateway.terminate()
        upstream.terminate()


if __name__ == "__main__":
    main()
