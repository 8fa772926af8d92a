"""bench_goals.py SET: issue 32's CPU bounds, judged from one benchmark run. The one home of the
bounds: scripts/bench.sh (SET request-path) and scripts/bench-tls.sh (SET connections) print this
table under theirs.

stdin: `round|name|CPU us per request` lines. For each bound and build (the rows named plainly,
and `... [B]` when the run has them): the row's CPU a request divided by its reference's in the
same round (for "the best peer", the cheapest of the peers' rows that round: never kinder than
the peer with the best median), so the machine's drift between rounds cancels, where the main
table's two medians of ratios to nginx do not; then the median of those ratios, the lowest and
highest round, and in how many rounds it was within the bound. A bound is met when the median is."""
import statistics
import sys

NGINX = "nginx proxy_pass (1 worker)"
PER_KEY_PEERS = ["nginx limit_req, per-key zone (1 worker)", "HAProxy (1 thread), per-key stick table"]
# (what, quotagate's row, the reference rows (the cheapest in each round), bound)
SETS = {
    "request-path": [
        ("limits off <= 0.9x nginx proxy_pass", "quotagate, limits off", [NGINX], 0.9),
        ("memory store <= the best per-key peer (nginx limit_req, HAProxy stick table)",
         "quotagate, memory store, 1000 keys under limit", PER_KEY_PEERS, 1.0),
        # Issue 72: a catalog of digests against the same catalog in plain.
        ("keys as SHA-256 digests <= 1.03x in plain, memory store",
         "quotagate, memory store, 1000 keys under limit, named by SHA-256 digests",
         ["quotagate, memory store, 1000 keys under limit"], 1.03),
        # Issue 73: the embedded store kept on disk against the same store without a directory.
        ("store.path <= 1.05x the memory store, 1000 keys",
         "quotagate, memory store on disk, 1000 keys under limit",
         ["quotagate, memory store, 1000 keys under limit"], 1.05),
        ("store.path <= 1.05x the memory store, one hot key",
         "quotagate, memory store on disk, one hot key under limit",
         ["quotagate, memory store, one hot key under limit"], 1.05),
        # Issue 77: a caller repeating its verified JWT against one sending its key in a header.
        ("verified JWTs (remembered) <= 1.05x a header key, memory store",
         "quotagate, memory store, 1000 keys under limit, as verified JWTs (HS256, remembered)",
         ["quotagate, memory store, 1000 keys under limit"], 1.05),
        ("keys as SHA-256 digests <= 1.03x in plain, Redis store (leases)",
         "quotagate, Redis store, 1000 keys under limit, named by SHA-256 digests",
         ["quotagate, Redis store, 1000 keys under limit"], 1.03),
    ],
    "connections": [
        ("a new TLS 1.3 connection a request <= 1.0x nginx ssl",
         "quotagate TLS, new TLS 1.3 connection per request",
         ["nginx ssl, new TLS 1.3 connection per request"], 1.0),
        ("a new TLS 1.2 connection a request <= 1.0x nginx ssl",
         "quotagate TLS, new TLS 1.2 connection per request",
         ["nginx ssl, new TLS 1.2 connection per request"], 1.0),
        ("a new cleartext connection a request <= 1.0x nginx",
         "quotagate, cleartext new connection per request",
         ["nginx, cleartext new connection per request"], 1.0),
    ],
}


def judge(goals, cpu):
    """Rows of the table: (what, build, median, lowest, highest, rounds within, rounds, met)."""
    builds = [("A", "")] + ([("B", " [B]")] if any(n.endswith(" [B]") for n in cpu) else [])
    out = []
    for what, row, refs, bound in goals:
        for build, suffix in builds:
            mine = cpu.get(row + suffix, {})
            ratios = []
            for rnd, us in mine.items():
                theirs = [cpu[r][rnd] for r in refs if rnd in cpu.get(r, {}) and cpu[r][rnd] > 0]
                if theirs:
                    ratios.append(us / min(theirs))
            if ratios:
                m = statistics.median(ratios)
                within = sum(r <= bound for r in ratios)
                out.append((what, build, m, min(ratios), max(ratios), within, len(ratios), m <= bound))
    return out


def main():
    cpu = {}  # name -> {round: CPU us a request}
    for line in sys.stdin:
        if line.strip():
            rnd, name, us = line.rstrip("\n").split("|")[:3]
            cpu.setdefault(name, {})[rnd] = float(us)
    rows = judge(SETS[sys.argv[1]], cpu)
    print("| bound (CPU a request, paired by round) | build | median | lowest-highest round | rounds within | met |")
    print("|---|---|---:|---:|---:|---|")
    for what, build, m, lo, hi, within, n, met in rows:
        print(f"| {what} | {build} | {m:.2f}x | {lo:.2f}-{hi:.2f} | {within} of {n} | {'yes' if met else 'no'} |")


if __name__ == "__main__":
    main()
