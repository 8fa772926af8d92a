#!/bin/bash
# bench-callgrind.sh BIN [GATEWAY ARGS...]: instructions the gateway BIN spends per proxied request,
# counted by callgrind (repeatable, unlike time on a shared machine): one worker, one keep-alive
# connection, one API key far under its limit, the example upstream. Runs 500 and 2500 requests and
# prints (Ir(2500) - Ir(500)) / 2000, so start-up and shutdown cancel out. Compare two builds with
# the same arguments, e.g. `--set limits.enabled=false` or `--store redis --redis-url URL`.
# WINDOWS=3 gives every key three limits (1 s, 60 s, 3600 s) instead of one per-minute limit;
# LIMITS=day one calendar day quota (UTC) instead; LIMITS=pool one per-minute pool over every
# endpoint (`"group": "*"`) instead; LIMITS=concurrent one concurrency limit (`"concurrent": 1000`,
# issue 30) instead; LIMITS=refused one limit of 1 request an hour, so every request but the first
# is refused (429: the path that counts the most limited keys, issue 31); COST_FROM=1 has the endpoint read each response's cost from
# its JSON body (`"cost_from": {"json": "body_bytes"}`: the example upstream's echo reports 0,
# so each request's reservation is given back). PAD=N adds a header of N bytes to each request
# (the echo's body grows by as much: PAD=500 makes it about 1 kB).
# BODY=N sends each request as a POST with a body of N bytes (and a Content-Length).
# DIGESTS=sha256 names the catalog's keys by their SHA-256 (`"key_digest"`, issue 72) instead of in
# plain; DIGESTS=hmac by their HMAC-SHA256 under a secret file the gateway is given.
# FIELDS=1 adds the six fields an API client or browser usually sends and the gateway does not
# read (User-Agent, Accept, Accept-Encoding, Accept-Language, Cache-Control, X-Request-Id: 200
# bytes), which the gateway and its peers hand on to the upstream.
# KEY_FROM=bearer|query|jwt sends the key as `Authorization: Bearer key-0001`, as `?api_key=key-0001`,
# or as the `sub` of an HS256 JWT (verified once, then remembered) under `limits.api_key_from`
# (issue 77's sources), instead of in `X-Api-Key`; one request at a time only.
# CLOSE=1 sends each request on a new connection (`Connection: close`): the cost of a connection.
# TARGETS=2 starts two example upstreams and balances over both (add `--set upstream.balance=...`).
# LOAD=1 counts under load instead of one request at a time: `wrk -t1 -c16` (LOAD_CONNECTIONS),
# 1000 API keys round robin as scripts/bench.sh sends them, for 4 s and then 16 s, and prints
# (Ir(16 s) - Ir(4 s)) / (requests(16 s) - requests(4 s)). One request at a time, the worker
# parks (epoll_wait, the timer wheel, the clock) after every request, which a loaded worker
# seldom does (bench.sh: 0.07 epoll_wait a request), so that count weighs the park path
# ~3,000 instructions a request more than a loaded gateway runs it; a change to that path
# looks far larger one at a time than it is under load (docs/benchmarks/). Repeats within
# ~0.2%. With PEER too; with CLOSE, PAD and BODY as above; not with LIMITS=refused.
set -euo pipefail
BIN=$1; shift
# CG_OUT=FILE keeps the profile of the larger run, for callgrind_annotate, and the smaller one's
# as FILE.few (their difference by function: scripts/callgrind-report.py FILE; with LOAD=1 the two
# runs' request counts go to FILE.requests, which the report divides by).
# CACHE=1 also simulates the caches (L1i and L1d 32 KiB, last level 512 KiB: this CPU's L1 and L2)
# and records each instruction's address: the code a request runs, by function, with
# scripts/callgrind-report.py --lines FILE (docs/benchmarks/, "Rare paths' code kept apart").
# PEER=nginx measures nginx proxy_pass instead (the same client and upstream, keep-alive to it,
# `master_process off`: one process, nginx-light from Debian's packages), PEER=nginx-limit nginx
# with `limit_req` on a per-key zone (scripts/bench.sh's rows): the gateway's peers, side by side in
# instructions. BIN then only runs the example upstream.
. "$(dirname "$0")/bench-lib.sh"
if [ -n "${LOAD:-}" ]; then
  ensure_debian_packages wrk:wrk
fi
if [ -n "${PEER:-}" ]; then
  ensure_debian_packages nginx:nginx-light
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
printf 'bench secret\n' >"$W/key-secret"
printf 'a bench secret of at least thirty-two bytes' >"$W/jwt-secret"
WINDOWS=${WINDOWS:-1} LIMITS=${LIMITS:-} COST_FROM=${COST_FROM:-} BODY=${BODY:-0} DIGESTS=${DIGESTS:-} python3 - "$W/catalog.json" <<'PY'
import hashlib, hmac, json, os, sys
ws = [60] if os.environ["WINDOWS"] == "1" else [1, 60, 3600]
many = 1_000_000_000
limits = {
    "": [{"ep": 0, "rl": many, "w": w} for w in ws],
    "day": [{"ep": 0, "rl": many, "period": "day"}],
    "pool": [{"group": "*", "rl": many}],
    "concurrent": [{"ep": 0, "concurrent": 1000}],
    "refused": [{"ep": 0, "rl": 1, "w": 3600}],
}[os.environ["LIMITS"]]
def named(key):
    if os.environ["DIGESTS"] == "sha256":
        return {"key_digest": "sha256:" + hashlib.sha256(key.encode()).hexdigest()}
    if os.environ["DIGESTS"] == "hmac":
        mac = hmac.new(b"bench secret", key.encode(), hashlib.sha256).hexdigest()
        return {"key_digest": "hmac-sha256:" + mac}
    return {"key": key}
keys = [dict(named(f"key-{i:04d}"), limits=limits) for i in range(1000)]
endpoint = {"p": 0, "m": 1 if int(os.environ["BODY"]) else 0}
if os.environ["COST_FROM"]:
    endpoint["cost_from"] = {"json": "body_bytes"}
json.dump({"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET", "POST"], "paths": ["/users/{id}"],
           "endpoints": [endpoint], "apilimits": keys}, open(sys.argv[1], "w"))
PY
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# instructions N: total instructions of a gateway that served N requests.
instructions() {
  local n=$1 up gw upid gpid up2 up2pid="" url
  shift
  up=$(free_port); gw=$(free_port)
  "$BIN" example-upstream --listen "127.0.0.1:$up" 2>/dev/null & upid=$!
  url="http://127.0.0.1:$up"
  if [ "${TARGETS:-1}" = 2 ]; then
    up2=$(free_port)
    "$BIN" example-upstream --listen "127.0.0.1:$up2" 2>/dev/null & up2pid=$!
    url="$url,http://127.0.0.1:$up2"
  fi
  local sim=() secret=()
  [ "${DIGESTS:-}" = hmac ] && secret=(--set "catalog.key_secret_file=$W/key-secret")
  case "${KEY_FROM:-}" in
    bearer) secret+=(--set limits.api_key_from=bearer) ;;
    query) secret+=(--set limits.api_key_from=query:api_key) ;;
    jwt) secret+=(--set limits.api_key_from=jwt:sub --set "limits.jwt_secret_file=$W/jwt-secret") ;;
  esac
  [ -n "${CACHE:-}" ] && sim=(--cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=524288,8,64 --dump-instr=yes)
  if [ -n "${PEER:-}" ]; then
    local servers="server 127.0.0.1:$up;" limit=()
    [ -n "$up2pid" ] && servers="$servers server 127.0.0.1:$up2;"
    [ "$PEER" = nginx-limit ] && limit=("$NGINX_LIMIT_SERVER" "$NGINX_LIMIT_HTTP")
    WORK=$W nginx_conf "$servers" "127.0.0.1:$gw" "${limit[@]}"
    # Its one process serves (no master and worker): what callgrind follows.
    sed -i '1i master_process off;' "$W/nginx/nginx.conf"
    valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$W/cg.out" "$NGINX" -e stderr -p "$W/nginx" \
      -c "$W/nginx/nginx.conf" 2>"$W/vg.log" & gpid=$!
  else
    valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$W/cg.out" "$BIN" --listen "127.0.0.1:$gw" \
      --upstream "$url" --catalog "$W/catalog.json" --set log.level=warn \
      --set admin.enabled=false --set server.workers=1 "${secret[@]}" "$@" 2>"$W/vg.log" & gpid=$!
  fi
  for _ in $(seq 1 600); do (echo >"/dev/tcp/127.0.0.1/$gw") 2>/dev/null && break; sleep 0.1; done
  local served=$n
  if [ -n "${LOAD:-}" ]; then
    # n is seconds here; what was served is wrk's count.
    served=$(wrk -t1 -c"${LOAD_CONNECTIONS:-16}" -d"${n}s" -s "$W/load.lua" "http://127.0.0.1:$gw/" |
      awk '/ requests in /{print $1}')
  else
  KEY_FROM=${KEY_FROM:-} JWT_SECRET="$W/jwt-secret" CLOSE=${CLOSE:-} PAD=${PAD:-0} BODY=${BODY:-0} FIELDS=${FIELDS:-} EXPECT=$([ "${LIMITS:-}" = refused ] && echo 429 || echo 200) python3 - "$gw" "$n" <<'PY'
import base64, hashlib, hmac, http.client, json, os, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
headers = {"X-Api-Key": "key-0001"}
target = "/users/42"
if os.environ["KEY_FROM"]:
    del headers["X-Api-Key"]
if os.environ["KEY_FROM"] == "bearer":
    headers["Authorization"] = "Bearer key-0001"
if os.environ["KEY_FROM"] == "query":
    target += "?api_key=key-0001"
if os.environ["KEY_FROM"] == "jwt":
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    part = lambda v: b64(json.dumps(v, separators=(",", ":")).encode())
    msg = part({"alg": "HS256", "typ": "JWT"}) + "." + part({"sub": "key-0001", "exp": int(time.time()) + 86400})
    mac = hmac.new(open(os.environ["JWT_SECRET"], "rb").read(), msg.encode(), hashlib.sha256).digest()
    headers["Authorization"] = "Bearer " + msg + "." + b64(mac)
if int(os.environ["PAD"]):
    headers["X-Pad"] = "p" * int(os.environ["PAD"])
if os.environ["CLOSE"]:
    headers["Connection"] = "close"
if os.environ["FIELDS"]:
    headers.update(l.split(": ", 1) for l in os.environ["USUAL_FIELDS"].splitlines())
for i in range(int(sys.argv[2])):
    if os.environ["CLOSE"]:
        c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
    if int(os.environ["BODY"]):
        c.request("POST", target, body=b"b" * int(os.environ["BODY"]), headers=headers)
    else:
        c.request("GET", target, headers=headers)
    r = c.getresponse(); r.read()
    assert r.status == (200 if i == 0 else int(os.environ["EXPECT"])), r.status
PY
  fi
  kill "$gpid"; wait "$gpid" 2>/dev/null || true
  kill "$upid" $up2pid; wait "$upid" $up2pid 2>/dev/null || true
  echo "$(grep -E "^(summary|totals):" "$W/cg.out" | head -1 | awk '{print $2}') $served"
}

if [ -n "${LOAD:-}" ]; then
  [ "${LIMITS:-}" = refused ] && { echo "LOAD=1 does not check answers: not with LIMITS=refused" >&2; exit 2; }
  # bench.sh's requests (many_keys_lua), with CLOSE, PAD and BODY as the one-at-a-time client's.
  fields=() method=GET body=""
  [ -n "${CLOSE:-}" ] && fields+=('["Connection"] = "close"')
  [ "${PAD:-0}" -gt 0 ] && fields+=("[\"X-Pad\"] = string.rep(\"p\", $PAD)")
  [ "${BODY:-0}" -gt 0 ] && { method=POST; body="string.rep(\"b\", $BODY)"; }
  [ -n "${FIELDS:-}" ] && fields+=("$(usual_fields_lua)")
  many_keys_lua "$W/load.lua" "$method" "$(IFS=,; echo "${fields[*]}")" "$body"
  read -r few few_n <<<"$(instructions 4 "$@")"
  if [ -n "${CG_OUT:-}" ]; then cp "$W/cg.out" "$CG_OUT.few"; fi
  read -r many many_n <<<"$(instructions 16 "$@")"
  if [ -n "${CG_OUT:-}" ]; then cp "$W/cg.out" "$CG_OUT"; echo "$few_n $many_n" >"$CG_OUT.requests"; fi
  echo "requests: $few_n, $many_n"
  echo "instructions per request under load: $(( (many - few) / (many_n - few_n) ))"
  exit 0
fi
read -r few _ <<<"$(instructions 500 "$@")"
if [ -n "${CG_OUT:-}" ]; then cp "$W/cg.out" "$CG_OUT.few"; fi
read -r many _ <<<"$(instructions 2500 "$@")"
if [ -n "${CG_OUT:-}" ]; then cp "$W/cg.out" "$CG_OUT"; fi
echo "instructions per request: $(( (many - few) / 2000 ))"
