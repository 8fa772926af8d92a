"""Reads `wrk --latency` output on stdin; prints one Markdown table row for the scenario in argv[1]."""
import re
import sys

out = sys.stdin.read()


def pct(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
total = int(re.search(r"(\d+) requests in", out).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
rejected = int(non2xx.group(1)) if non2xx else 0
errors = re.search(r"Socket errors: (.*)", out)
note = f" (socket errors: {errors.group(1)})" if errors else ""
print(f"| {sys.argv[1]}{note} | {rps:,.0f} | {pct(50):.2f} | {pct(99):.2f} | {rejected / max(total, 1):.1%} |")
