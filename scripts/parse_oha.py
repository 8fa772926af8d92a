"""Reads `oha --output-format json` on stdin; prints `p50_ms|p99_ms|answers` for scripts/bench.sh."""
import json
import sys

d = json.load(sys.stdin)
p = d["latencyPercentiles"]
answers = sum(d["statusCodeDistribution"].values())
print(f"{(p['p50'] or 0) * 1000:.3f}|{(p['p99'] or 0) * 1000:.3f}|{answers}")
