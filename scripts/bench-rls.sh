#!/usr/bin/env bash
# The Envoy rate-limit service's decision cost, beside the gateway's proxied request, in one run.
#   scripts/bench-rls.sh [SECONDS] [CONNECTIONS] [STREAMS]     (defaults: 10 s, 8 connections, 16 streams each)
# One gateway with `rls.config` (release build, 1000 API keys far under their limits, a rule of
# 4e9 per minute per client), on the memory store and then on a private redis-server. Load:
# h2load (Debian's nghttp2-client) over HTTP/2 for both rows of a store: `GET /users/N` with
# X-Api-Key proxied to the example upstream, and unary gRPC `ShouldRateLimit` with one
# descriptor (client=<one of 1000>). For each row: requests/s, the gateway's CPU per request
# (utime+stime from /proc), redis-server's, and the RLS row's CPU as a share of the proxy row's.
# Prints a table and appends it to docs/benchmarks/YYYY-MM.md (BENCH_NO_RECORD=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
SECONDS_EACH=${1:-10}
CONNS=${2:-8}
STREAMS=${3:-16}
ensure_debian_packages h2load:nghttp2-client
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
# QUOTAGATE_BIN=PATH measures another build: bench-lib.sh's quotagate_builds.
quotagate_builds
bench_workdir

python3 - "$WORK" <<'PY'
import json, struct, sys
w = sys.argv[1]
keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}]} for i in range(1000)]
json.dump({"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"], "paths": ["/users/{id}"],
           "endpoints": [{"p": 0, "m": 0}], "apilimits": keys}, open(f"{w}/catalog.json", "w"))
open(f"{w}/rules.yaml", "w").write(
    "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 4000000000}\n")
def field(tag, payload):  # a length-delimited protobuf field
    return bytes([tag << 3 | 2, len(payload)]) + payload
# One body per key would need one h2load run per key; one body with client=key-0042 is one
# counter, as the proxy row's h2load uses one key (h2load sends the same request every time).
entry = field(1, b"client") + field(2, b"key-0042")
msg = field(1, b"bench") + field(2, field(1, entry))
open(f"{w}/rls.bin", "wb").write(b"\0" + struct.pack(">I", len(msg)) + msg)
PY

UP=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP" >/dev/null 2>&1 & PIDS+=($!)
wait_port "$UP"
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no >/dev/null & RPID=$!; PIDS+=($RPID)
wait_port "$RPORT"

# run_h2load ARGS...: prints "requests elapsed_s" of a run of SECONDS_EACH.
run_h2load() {
  local out; out=$(h2load -D "$SECONDS_EACH" -c "$CONNS" -m "$STREAMS" -t 1 "$@" 2>&1)
  local ok; ok=$(echo "$out" | awk '/^requests:/{for(i=1;i<=NF;i++) if($(i+1)=="succeeded,") print $i}')
  local status2xx; status2xx=$(echo "$out" | awk '/^status codes:/{print $3}')
  [ "${status2xx:-0}" -gt 0 ] || { echo "$out" >&2; exit 1; }
  echo "$ok $SECONDS_EACH"
}

ROWS=()
for store in memory redis; do
  GW=$(free_port); ADMIN=$(free_port); RLS=$(free_port)
  args=(--listen "127.0.0.1:$GW" --upstream "http://127.0.0.1:$UP" --catalog "$WORK/catalog.json"
        --set log.level=warn --set "admin.listen=127.0.0.1:$ADMIN" --set "rls.config=$WORK/rules.yaml"
        --set "rls.listen=127.0.0.1:$RLS")
  [ "$store" = redis ] && args+=(--store redis --redis-url "redis://127.0.0.1:$RPORT")
  "$BIN" "${args[@]}" & GPID=$!; PIDS+=($GPID)
  wait_port "$GW"; wait_port "$RLS"
  # h2load counts HTTP statuses, and a gRPC error is a 200 too: check the call's grpc-status once.
  curl -s --http2-prior-knowledge -H "content-type: application/grpc" -H "te: trailers" \
    --data-binary "@$WORK/rls.bin" -D "$WORK/head" -o /dev/null \
    "http://127.0.0.1:$RLS/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
  grep -q "^grpc-status: 0" "$WORK/head" || { echo "ShouldRateLimit failed:" >&2; cat "$WORK/head" >&2; exit 1; }
  for row in proxy rls; do
    if [ "$row" = proxy ]; then
      cmd=(-H "x-api-key: key-0042" "http://127.0.0.1:$GW/users/1")
    else
      cmd=(-d "$WORK/rls.bin" -H "content-type: application/grpc" -H "te: trailers"
           "http://127.0.0.1:$RLS/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
    fi
    g0=$(cpu_ticks "$GPID"); r0=$(cpu_ticks "$RPID")
    read -r n secs < <(run_h2load "${cmd[@]}")
    g1=$(cpu_ticks "$GPID"); r1=$(cpu_ticks "$RPID")
    ROWS+=("$store $row $n $secs $(us_per $((g1 - g0)) "$n") $(us_per $((r1 - r0)) "$n")")
  done
  kill "$GPID"; wait "$GPID" 2>/dev/null || true
done

TABLE=$(python3 - "${ROWS[@]}" <<'PY'
import sys
rows = [r.split() for r in sys.argv[1:]]
print("| store | request | req/s | gateway CPU us/req | redis CPU us/req | RLS CPU / proxy CPU |")
print("|---|---|---:|---:|---:|---:|")
proxy = {}
for store, row, n, secs, gw, rd in rows:
    rps = float(n) / float(secs)
    if row == "proxy":
        proxy[store] = float(gw)
        share = ""
    else:
        share = f"{float(gw) / proxy[store]:.2f}"
    redis = rd if store == "redis" else "-"
    name = "proxied GET (HTTP/2)" if row == "proxy" else "ShouldRateLimit, 1 descriptor"
    print(f"| {store} | {name} | {rps:,.0f} | {gw} | {redis} | {share} |")
PY
)
echo "$TABLE"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "### scripts/bench-rls.sh $SECONDS_EACH $CONNS $STREAMS, $(date -u +%Y-%m-%d\ %H:%M) UTC, $(git rev-parse --short HEAD)"
    echo
    echo "Machine: $(machine_line)."
    echo
    echo "$TABLE"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
fi
