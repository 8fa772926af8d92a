#!/usr/bin/env python3
"""callgrind-report.py [--lines | --atomics] FILE [N]: what a request costs, by function, from the two
profiles that `CG_OUT=FILE scripts/bench-callgrind.sh` keeps (FILE: 2,500 requests, FILE.few:
500). Every figure is a request's: (count in FILE - count in FILE.few) / 2000, so start-up and
shutdown cancel out; with FILE.requests (`LOAD=1`: the two runs' request counts), divided by their
difference instead.

Without --lines: the instructions a request runs in each function itself (callees apart), the N
largest differences (default 40), after their total.

--lines (a profile of `CACHE=1`, which records each instruction's address and simulates the
caches): how much code a request runs. An instruction is hot when it runs at least once a request
on average (>= 0.9); a hot line is a 64-byte line of code holding one. Prints the hot lines in all
(what a request's code needs of the instruction cache), then the N functions (default 30) with the
most: instructions a request, L1i misses a request, hot instructions, hot lines, and hot
instructions a line (a line holds ~14 of x86-64's: fewer means cold code among the hot).

--atomics (a profile of `CACHE=1` too): the atomic read-modify-write instructions (`lock`-prefixed,
and `xchg` with memory, which locks without the prefix) a request runs in the gateway's own binary
(the profile's `cmd:`), by function, found by `objdump -d` at the profile's addresses. Each costs a
few nanoseconds where nginx's one-threaded worker has none, and far more when the line it writes is
the other worker's (docs/benchmarks/, "Atomic operations a request")."""
import collections, re, signal, subprocess, sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly

POS = re.compile(r"^(0x[0-9a-f]+|[+-]\d+|\*)$")


def step(token, last):
    if token.startswith("0x"):
        return int(token, 16)
    if token[0] in "+-":
        return last + int(token)
    if token == "*":
        return last
    return int(token)


def parse(path):
    """Self cost (Ir, I1mr when simulated) by position: the instruction's address where the
    profile has them, else the function and source line; and the function of each position."""
    names, cost, owner = {}, collections.defaultdict(lambda: [0, 0]), {}
    positions, events = ["line"], []
    fn, last, after_call = None, [], False
    for raw in open(path, errors="replace"):
        if raw.startswith("positions:"):
            positions = raw.split()[1:]
            continue
        if raw.startswith("events:"):
            events = raw.split()[1:]
            continue
        if raw.startswith(("fn=", "cfn=")):
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", raw.strip())
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            if raw.startswith("fn=") and m:
                fn = names.get(m.group(1), m.group(1))
            continue
        if raw.startswith("calls="):
            after_call = True  # the next cost line is the call's inclusive cost, not fn's own
            continue
        tok = raw.split()
        n = len(positions)
        if len(tok) <= n or not all(POS.match(t) or t.isdigit() for t in tok[:n]):
            continue
        if len(last) != n:
            last = [0] * n
        last = [step(t, p) for t, p in zip(tok[:n], last)]
        if after_call:
            after_call = False
            continue
        where = last[0] if positions[0] == "instr" else (fn, last[0])
        counts = tok[n:]
        c = cost[where]
        c[0] += int(counts[0])
        if "I1mr" in events and len(counts) > events.index("I1mr"):
            c[1] += int(counts[events.index("I1mr")])
        owner[where] = fn
    return cost, owner, positions[0] == "instr"


def shorten(name, width):
    name = re.sub(r"/root/\.cargo/registry/src/[^/]+/", "", name or "?")
    return re.sub(r"/rustc/[0-9a-f]+/library/", "std:", name)[:width]


def locked_instructions(binary):
    """Addresses (as linked) of the binary's atomic read-modify-write instructions."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary],
                         capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m and (m.group(2) == "lock" or m.group(2).startswith("xchg") and "(" in m.group(3)):
            found.add(int(m.group(1), 16))
    return found


def atomics(path, per_instr, owner, top):
    binary = next(l.split()[1] for l in open(path, errors="replace") if l.startswith("cmd:"))
    locked = locked_instructions(binary)
    # Where the binary was loaded (valgrind maps a PIE binary at its linked addresses or at
    # 0x108000): the offset at which its atomic instructions are the ones the profile ran.
    base = max((0, 0x108000), key=lambda b: sum(1 for a in locked if b + a in per_instr))
    by_fn = collections.Counter()
    for a in locked:
        by_fn[owner.get(base + a)] += per_instr.get(base + a, 0.0)
    print(f"{sum(by_fn.values()):10.1f}  atomic read-modify-writes a request ({binary})")
    for name, n in by_fn.most_common(top):
        if n >= 0.05:
            print(f"{n:10.2f}  {shorten(name, 150)}")


def main():
    args = [a for a in sys.argv[1:] if a not in ("--lines", "--atomics")]
    lines = "--lines" in sys.argv[1:]
    atomic = "--atomics" in sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    path = args[0]
    top = int(args[1]) if len(args) > 1 else (30 if lines else 40)
    many, owner, by_instr = parse(path)
    few, owner_few, _ = parse(path + ".few")
    try:
        n_few, n_many = map(int, open(path + ".requests").read().split())
        served = n_many - n_few
    except FileNotFoundError:
        served = 2000
    owner = {**owner_few, **owner}
    if (lines or atomic) and not by_instr:
        sys.exit(f"{path} has no instruction addresses: make it with CACHE=1 scripts/bench-callgrind.sh")
    if atomic:
        per_instr = {w: (many.get(w, [0, 0])[0] - few.get(w, [0, 0])[0]) / served
                     for w in set(many) | set(few)}
        return atomics(path, per_instr, owner, top)
    per = collections.defaultdict(lambda: [0.0, 0.0, 0, set()])
    hot_lines = set()
    for where in set(many) | set(few):
        ir, miss = many.get(where, [0, 0])
        f = per[owner.get(where)]
        d_ir = (ir - few.get(where, [0, 0])[0]) / served
        f[0] += d_ir
        f[1] += (miss - few.get(where, [0, 0])[1]) / served
        if by_instr and d_ir >= 0.9:
            f[2] += 1
            f[3].add(where >> 6)
            hot_lines.add(where >> 6)
    if not lines:
        print(f"{sum(f[0] for f in per.values()):10.0f}  total per request")
        for name, f in sorted(per.items(), key=lambda kv: -abs(kv[1][0]))[:top]:
            print(f"{f[0]:10.0f}  {shorten(name, 150)}")
        return
    print(f"hot lines in all: {len(hot_lines)} ({len(hot_lines) * 64 / 1024:.0f} KiB)")
    print(f"{'Ir':>8} {'I1mr':>6} {'hot':>6} {'lines':>5} {'a line':>6}  function")
    for name, (ir, miss, hot, fl) in sorted(per.items(), key=lambda kv: (-len(kv[1][3]), -kv[1][0]))[:top]:
        print(f"{ir:8.0f} {miss:6.0f} {hot:6d} {len(fl):5d} {hot / max(len(fl), 1):6.1f}  {shorten(name, 110)}")


main()
