#!/usr/bin/env python3
"""callgrind-diff.py FILE [N]: instructions per request by function, from the two profiles that
`CG_OUT=FILE scripts/bench-callgrind.sh` keeps (FILE: 2,500 requests, FILE.few: 500), as
(self Ir in FILE - self Ir in FILE.few) / 2000; the N largest (default 40)."""
import re, subprocess, sys

def by_function(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", path],
                         capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)$", line)
        if m and "PROGRAM TOTALS" not in line and not m.group(2).startswith("=>"):
            name = re.sub(r" \[[^\]]*\]$", "", m.group(2))
            counts[name] = counts.get(name, 0) + int(m.group(1).replace(",", ""))
    return counts

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
many, few = by_function(path), by_function(path + ".few")
diff = {k: (many.get(k, 0) - few.get(k, 0)) / 2000 for k in set(many) | set(few)}
print(f"{sum(diff.values()):10.0f}  total per request")
for name, n in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top]:
    short = re.sub(r"/root/\.cargo/registry/src/[^/]+/", "", name)
    short = re.sub(r"/rustc/[0-9a-f]+/library/", "std:", short)
    print(f"{n:10.0f}  {short[:150]}")
