"""Turns latency lines (`round|name|qps|p50_ms|p99_ms|answers`, in the order measured) on stdin into
a Markdown table. p99 added = a proxy's p99 minus the p99 of the upstream measured directly, at the
same rate, in the same round (the "upstream directly" line before it). Cells are medians over the
rounds; p99 added also shows the lowest and highest round. argv[1]: the number of connections."""
import statistics
import sys

conns = sys.argv[1]
rows = {}  # (name, qps) -> list of (p50, p99, answers, added)
direct = {}  # (round, qps) -> p99 of the upstream directly
for line in sys.stdin:
    if not line.strip():
        continue
    rnd, name, qps, p50, p99, n = line.rstrip("\n").split("|")
    p50, p99 = float(p50), float(p99)
    if name == "upstream directly":
        direct[(rnd, qps)] = p99
    added = p99 - direct.get((rnd, qps), p99)
    rows.setdefault((name, qps), []).append((p50, p99, int(n), added))

print(f"| target, at half of the path's maximum rate above, {conns} connections | req/s | p50 ms | p99 ms | p99 added over the upstream directly at that rate, ms | answers |")
print("|---|---:|---:|---:|---:|---:|")
for (name, qps), runs in rows.items():
    med = lambda i: statistics.median(r[i] for r in runs)  # noqa: E731
    added = [r[3] for r in runs]
    rng = f" ({min(added):.3f} to {max(added):.3f})" if len(runs) > 1 and name != "upstream directly" else ""
    print(f"| {name} | {qps} | {med(0):.3f} | {med(1):.3f} | {med(3):.3f}{rng} | {int(med(2))} |")
