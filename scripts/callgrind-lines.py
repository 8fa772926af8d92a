#!/usr/bin/env python3
"""callgrind-lines.py FILE [N]: how much code a request runs, from the two profiles that
`CACHE=1 CG_OUT=FILE scripts/bench-callgrind.sh` keeps (FILE: 2,500 requests, FILE.few: 500;
CACHE=1 records each instruction's address and simulates the caches).

An instruction is hot when it runs at least once a request on average ((count in FILE - count in
FILE.few) / 2000 >= 0.9); a hot line is a 64-byte line of code holding one. Prints the hot lines
in all (what a request's code needs of the instruction cache), then the N functions (default 30)
with the most: instructions a request, L1i misses a request, hot instructions, hot lines, and hot
instructions a line (a line holds ~14 of x86-64's: fewer means cold code among the hot)."""
import collections, re, sys

POS = re.compile(r"^(0x[0-9a-f]+|[+-]\d+|\*)$")


def step(token, last):
    if token.startswith("0x"):
        return int(token, 16)
    if token[0] in "+-":
        return last + int(token)
    return last


def parse(path):
    """Cost by instruction address (Ir, I1mr when simulated) and the function of each address."""
    names, cost, owner = {}, collections.defaultdict(lambda: [0, 0]), {}
    fn, events, addr, line, after_call = None, [], 0, 0, False
    for raw in open(path, errors="replace"):
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
            after_call = True  # the next cost line is the call's inclusive cost
            continue
        tok = raw.split()
        if len(tok) < 3 or not POS.match(tok[0]):
            continue
        addr, line = step(tok[0], addr), step(tok[1], line)
        if after_call:
            after_call = False
            continue
        c = cost[addr]
        c[0] += int(tok[2])
        if "I1mr" in events and len(tok) > 2 + events.index("I1mr"):
            c[1] += int(tok[2 + events.index("I1mr")])
        owner[addr] = fn
    return cost, owner


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    many, owner = parse(path)
    few, _ = parse(path + ".few")
    per = collections.defaultdict(lambda: [0.0, 0.0, 0, set()])
    hot_lines = set()
    for addr, (ir, miss) in many.items():
        f = per[owner[addr]]
        d_ir = (ir - few.get(addr, [0, 0])[0]) / 2000
        f[0] += d_ir
        f[1] += (miss - few.get(addr, [0, 0])[1]) / 2000
        if d_ir >= 0.9:
            f[2] += 1
            f[3].add(addr >> 6)
            hot_lines.add(addr >> 6)
    print(f"hot lines in all: {len(hot_lines)} ({len(hot_lines) * 64 / 1024:.0f} KiB)")
    print(f"{'Ir':>8} {'I1mr':>6} {'hot':>6} {'lines':>5} {'a line':>6}  function")
    for name, (ir, miss, hot, lines) in sorted(per.items(), key=lambda kv: -len(kv[1][3]))[:top]:
        short = re.sub(r"/root/\.cargo/registry/src/[^/]+/", "", name or "?")
        print(f"{ir:8.0f} {miss:6.0f} {hot:6d} {len(lines):5d} {hot / max(len(lines), 1):6.1f}  {short[:110]}")


main()
