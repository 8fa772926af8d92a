"""Reads `wrk --latency` output on stdin; prints one result line for scripts/bench_table.py.

argv: NAME CPU_TICKS_OF_THE_PROCESS REDIS_CPU_TICKS TICKS_PER_SECOND [REDIS_SCRIPT_CALLS [USER_TICKS]]
Output: name|requests/s|CPU us per request|p50 ms|p99 ms|share answered non-2xx|Redis CPU us per request|
script calls per 1000 requests[|user CPU us per request]
"""
import re
import sys

out = sys.stdin.read()
name, ticks, redis_ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
calls = int(sys.argv[5]) if len(sys.argv) > 5 else 0
user_ticks = int(sys.argv[6]) if len(sys.argv) > 6 else None


def pct(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
total = int(re.search(r"(\d+) requests in", out).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
rejected = int(non2xx.group(1)) if non2xx else 0
errors = re.search(r"Socket errors: (.*)", out)
if errors:
    name += f" (socket errors: {errors.group(1)})"
us = ticks / hz * 1e6 / max(total, 1)
redis_us = redis_ticks / hz * 1e6 / max(total, 1)
per_1000 = calls * 1000 / max(total, 1)
user = "" if user_ticks is None else f"|{user_ticks / hz * 1e6 / max(total, 1):.2f}"
print(f"{name}|{rps:.0f}|{us:.2f}|{pct(50):.2f}|{pct(99):.2f}|{rejected / max(total, 1):.4f}|{redis_us:.2f}|{per_1000:.2f}{user}")
