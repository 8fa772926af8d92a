"""Turns result lines (`round|` + parse_wrk.py's line) on stdin into a Markdown table with ratios to
the row named in argv[1] (the reference, nginx proxy_pass).

Each round's ratios are to that round's reference; a cell is the median over the rounds, and a ratio
also shows the lowest and highest round when there is more than one."""
import statistics
import sys

ref_name = sys.argv[1]
rows = {}  # name -> {round: (rps, us, p50, p99, rejected, redis_us, script calls per 1000[, user us])}
for line in sys.stdin:
    if not line.strip():
        continue
    rnd, name, *values = line.rstrip("\n").split("|")
    rows.setdefault(name, {})[rnd] = tuple(float(v) for v in values)
ref = rows.get(ref_name, {})


def med(xs):
    return statistics.median(xs) if xs else None


def ratio(name, index):
    """The median ratio of a row's value `index` to the reference's in the same round, with the range."""
    rs = [v[index] / ref[r][index] for r, v in rows[name].items() if r in ref and ref[r][index]]
    if not rs:
        return ""
    m = f"{med(rs):.2f}x"
    return m if len(rs) == 1 else f"{m} ({min(rs):.2f}-{max(rs):.2f})"


rounds = max((len(v) for v in rows.values()), default=0)
# User CPU apart, where the lines have it: the part of a request's CPU the gateway's own code
# spends (the kernel's part, most of it, is alike for every proxy and noisier).
users = all(len(v) > 7 for by_round in rows.values() for v in by_round.values())
user_head, user_rule = (" user us/req | user/req vs nginx |", "---:|---:|") if users else ("", "")
print(f"| row | req/s | req/s vs nginx | CPU us/req | CPU/req vs nginx |{user_head} p50 ms | p99 ms | non-2xx | Redis CPU us/req | Redis calls /1000 req |")
print(f"|---|---:|---:|---:|---:|{user_rule}---:|---:|---:|---:|---:|")
for name, by_round in rows.items():
    col = lambda i: med([v[i] for v in by_round.values()])  # noqa: E731
    rps, us, p50, p99, rejected, redis_us = (col(i) for i in range(6))
    calls = col(6) if all(len(v) > 6 for v in by_round.values()) else None
    r_us = "" if name == "upstream directly" else ratio(name, 1)
    user = ""
    if users:
        r_user = "" if name == "upstream directly" else ratio(name, 7)
        user = f" {col(7):.1f} | {r_user} |"
    redis_col = f"{redis_us:.1f}" if "Redis store" in name else ""
    calls_col = f"{calls:.1f}" if "Redis store" in name and calls is not None else ""
    print(f"| {name} | {rps:,.0f} | {ratio(name, 0)} | {us:.1f} | {r_us} |{user} {p50:.2f} | {p99:.2f} | {rejected:.0%} | {redis_col} | {calls_col} |")
if rounds > 1:
    print()
    print(f"Medians of {rounds} rounds; a ratio's range is its lowest and highest round.")
