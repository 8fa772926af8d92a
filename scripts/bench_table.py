"""Turns result lines (see parse_wrk.py) on stdin into a Markdown table with ratios to the row named
in argv[1] (the reference, nginx proxy_pass)."""
import sys

ref_name = sys.argv[1]
rows = [line.rstrip("\n").split("|") for line in sys.stdin if line.strip()]
ref = next((r for r in rows if r[0] == ref_name), None)
ref_rps, ref_us = (float(ref[1]), float(ref[2])) if ref else (None, None)

print("| row | req/s | req/s vs nginx | CPU us/req | CPU/req vs nginx | p50 ms | p99 ms | non-2xx | Redis CPU us/req |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, rps, us, p50, p99, rejected, redis_us in rows:
    rps, us, redis_us = float(rps), float(us), float(redis_us)
    r_rps = f"{rps / ref_rps:.2f}x" if ref_rps else ""
    r_us = f"{us / ref_us:.2f}x" if ref_us else ""
    redis_col = f"{redis_us:.1f}" if "Redis store" in name else ""
    cpu_col = f"{us:.1f}"
    r_us = "" if name == "upstream directly" else r_us
    print(f"| {name} | {rps:,.0f} | {r_rps} | {cpu_col} | {r_us} | {p50} | {p99} | {float(rejected):.0%} | {redis_col} |")
