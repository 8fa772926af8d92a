#!/bin/bash
# bench-rls-callgrind.sh BIN [rule|catalog]: instructions the rate-limit service of BIN spends per
# ShouldRateLimit, counted by callgrind (repeatable, unlike time on a shared machine): a gateway
# with `rls.config` (memory store, one worker, 1000 keys far under their limits), one HTTP/2
# connection with one stream (h2load, Debian's nghttp2-client), one descriptor: `rule` (default)
# `client=key-0042` in a rule domain, as bench-rls.sh sends; `catalog` `method=GET, path=/users/7,
# api_key=key-0042` in the catalog domain. Runs 500 and 2500 calls (and one more each, by curl, to check the
# answer) and prints
# (Ir(2500) - Ir(500)) / 2000, so start-up and shutdown cancel out. Compare two builds one after
# the other.
set -euo pipefail
BIN=$(realpath "$1"); KIND=${2:-rule}
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ensure_debian_packages h2load:nghttp2-client
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
python3 - "$W" "$KIND" <<'PY'
import json, struct, sys
w, kind = sys.argv[1], sys.argv[2]
keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}]} for i in range(1000)]
json.dump({"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"], "paths": ["/users/{id}"],
           "endpoints": [{"p": 0, "m": 0}], "apilimits": keys}, open(f"{w}/catalog.json", "w"))
open(f"{w}/rules.yaml", "w").write(
    "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 4000000000}\n")
def field(tag, payload):  # a length-delimited protobuf field
    return bytes([tag << 3 | 2, len(payload)]) + payload
def entry(k, v):
    return field(1, field(1, k) + field(2, v))
if kind == "rule":
    msg = field(1, b"bench") + field(2, entry(b"client", b"key-0042"))
elif kind == "catalog":
    msg = field(1, b"quotagate") + field(2, entry(b"method", b"GET") + entry(b"path", b"/users/7")
                                        + entry(b"api_key", b"key-0042"))
else:
    sys.exit(f"unknown descriptor kind {kind!r}: rule or catalog")
open(f"{w}/rls.bin", "wb").write(b"\0" + struct.pack(">I", len(msg)) + msg)
PY

# instructions N: total instructions of a gateway that answered N calls.
instructions() {
  local n=$1 up gw rls gpid upid
  up=$(free_port); gw=$(free_port); rls=$(free_port)
  "$BIN" example-upstream --listen "127.0.0.1:$up" 2>/dev/null & upid=$!
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" "$BIN" --listen "127.0.0.1:$gw" \
    --upstream "http://127.0.0.1:$up" --catalog "$W/catalog.json" --set log.level=warn \
    --set admin.enabled=false --set server.workers=1 --set "rls.config=$W/rules.yaml" \
    --set "rls.listen=127.0.0.1:$rls" 2>"$W/vg.log" & gpid=$!
  wait_port "$rls"
  # h2load counts HTTP statuses, and a gRPC error is a 200 too: the call's grpc-status, once.
  curl -s --http2-prior-knowledge -H "content-type: application/grpc" -H "te: trailers" \
    --data-binary "@$W/rls.bin" -D "$W/head" -o /dev/null \
    "http://127.0.0.1:$rls/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
  grep -q "^grpc-status: 0" "$W/head" || { echo "ShouldRateLimit failed:" >&2; cat "$W/head" >&2; exit 1; }
  local out
  out=$(h2load -n "$n" -c 1 -m 1 -t 1 -d "$W/rls.bin" -H "content-type: application/grpc" \
    -H "te: trailers" "http://127.0.0.1:$rls/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  echo "$out" | grep -q "$n succeeded" || { echo "$out" >&2; exit 1; }
  kill "$gpid"; wait "$gpid" 2>/dev/null || true
  kill "$upid"; wait "$upid" 2>/dev/null || true
  # CG_OUT=FILE keeps the profiles, FILE.few and FILE (scripts/callgrind-report.py FILE N).
  if [ -n "${CG_OUT:-}" ]; then cp "$W/cg.out" "$CG_OUT$([ "$n" -gt 500 ] || echo .few)"; fi
  grep -E "^(summary|totals):" "$W/cg.out" | head -1 | awk '{print $2}'
}

few=$(instructions 500)
many=$(instructions 2500)
echo "instructions per ShouldRateLimit ($KIND): $(( (many - few) / 2000 ))"
