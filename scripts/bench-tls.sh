#!/usr/bin/env bash
# New connections and TLS on the listener, side by side with nginx in one run.
#   scripts/bench-tls.sh [SECONDS] [CONNECTIONS]      (defaults: 10 s, 64 connections)
# Both with one ECDSA P-256 certificate, in front of the example upstream, one worker each
# (nginx: worker_processes 1, `ssl_protocols TLSv1.2 TLSv1.3` as nginx has by default since 1.23.4;
# Debian's 1.22 would otherwise speak TLS 1.2 only; quotagate: server.workers=1, its memory store,
# one key far under its limit). Rows: keep-alive (wrk over HTTPS, CPU per request) and a new TLS
# connection per request (`Connection: close`: handshakes per second; wrk resumes each session), in
# TLS 1.3 (what wrk and both servers agree on) and in TLS 1.2 (wrk's OpenSSL capped by an
# OPENSSL_CONF), each server's against the other's in the same protocol (checked before the runs:
# a TLS 1.3 resumption costs a key exchange, a TLS 1.2 one none), and a new cleartext connection per
# request (a second listener of the same nginx, a second quotagate without TLS). For each: requests/s and the server's CPU per
# request (utime+stime from /proc), and both as ratios to nginx in the same run. Every row runs
# once per round (BENCH_ROUNDS, default 3), each round's ratios to that round's nginx; the table gives
# medians and, for ratios, the lowest and highest round. Prints it and appends it to
# docs/benchmarks/YYYY-MM.md (BENCH_NO_RECORD=1 skips that).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
DURATION=${1:-10}
CONNS=${2:-64}
ensure_debian_packages wrk:wrk nginx:nginx-light openssl:openssl
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
ROUNDS=${BENCH_ROUNDS:-3}
# QUOTAGATE_BIN, QUOTAGATE_BIN_B (a "[B]" row beside each quotagate row): bench-lib.sh.
quotagate_builds
bench_workdir

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench \
  -addext subjectAltName=DNS:localhost -addext basicConstraints=critical,CA:FALSE \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
python3 - "$WORK/catalog.json" <<'PY'
import json, sys
json.dump({"version": {"semver": "bench", "hash": "bench"}, "methods": ["GET"], "paths": ["/users/{id}"],
           "endpoints": [{"p": 0, "m": 0}],
           "apilimits": [{"key": "bench", "limits": [{"ep": 0, "rl": 1_000_000_000}]}]}, open(sys.argv[1], "w"))
PY

UP=$(free_port)
"$BIN" example-upstream --listen "127.0.0.1:$UP" 2>/dev/null & PIDS+=($!)
wait_port "$UP"

NG=$(free_port)
NG_PLAIN=$(free_port)
nginx_conf "server 127.0.0.1:$UP;" "127.0.0.1:$NG ssl" \
  "listen 127.0.0.1:$NG_PLAIN; ssl_protocols TLSv1.2 TLSv1.3; ssl_certificate $WORK/cert.pem; ssl_certificate_key $WORK/key.pem;"
# The TLS 1.2 rows' client: wrk's OpenSSL (and s_client's, below) capped at TLS 1.2.
cat > "$WORK/tls12.cnf" <<'CNF'
openssl_conf = conf
[conf]
ssl_conf = ssl
[ssl]
system_default = sys
[sys]
MaxProtocol = TLSv1.2
CNF
"$NGINX" -e stderr -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" 2>"$WORK/nginx.log" & NGPID=$!; PIDS+=($NGPID)
# gateways BIN: one with TLS and one without, one worker each; sets GW, GWPID, GW_PLAIN, GWPLPID.
gateways() {
  GW=$(free_port)
  "$1" --listen "127.0.0.1:$GW" --upstream "http://127.0.0.1:$UP" --catalog "$WORK/catalog.json" \
    --set log.level=warn --set admin.enabled=false --set server.workers=1 \
    --set "server.tls_cert_file=$WORK/cert.pem" --set "server.tls_key_file=$WORK/key.pem" & GWPID=$!; PIDS+=($GWPID)
  GW_PLAIN=$(free_port)
  "$1" --listen "127.0.0.1:$GW_PLAIN" --upstream "http://127.0.0.1:$UP" --catalog "$WORK/catalog.json" \
    --set log.level=warn --set admin.enabled=false --set server.workers=1 & GWPLPID=$!; PIDS+=($GWPLPID)
  wait_port "$GW"; wait_port "$GW_PLAIN"
}
if [ -n "$BIN_B" ]; then
  gateways "$BIN_B"
  B=("$GW" "$GWPID" "$GW_PLAIN" "$GWPLPID")
fi
gateways "$BIN"
wait_port "$NG"; wait_port "$NG_PLAIN"
for url in "https://127.0.0.1:$NG" "https://127.0.0.1:$GW" "http://127.0.0.1:$NG_PLAIN" "http://127.0.0.1:$GW_PLAIN" \
  ${BIN_B:+"https://127.0.0.1:${B[0]}" "http://127.0.0.1:${B[2]}"}; do
  code=$(curl -s -k -o /dev/null -w '%{http_code}' -H 'X-Api-Key: bench' "$url/users/1")
  [ "$code" = 200 ] || { echo "$url answered $code" >&2; exit 1; }
done
# protocol PORT [OPENSSL_CONF]: the TLS version a client (that configuration's) and the server on
# PORT agree on.
protocol() {
  env ${2:+OPENSSL_CONF=$2} openssl s_client -connect "127.0.0.1:$1" </dev/null 2>/dev/null |
    sed -n 's/^New, \(TLSv1\.[0-9]\).*/\1/p' | head -n 1
}
for port in "$NG" "$GW" ${BIN_B:+"${B[0]}"}; do
  for want in "TLSv1.3 " "TLSv1.2 $WORK/tls12.cnf"; do
    got=$(protocol "$port" ${want#* })
    [ "$got" = "${want%% *}" ] || { echo "port $port spoke ${got:-nothing} where ${want%% *} was meant" >&2; exit 1; }
  done
done

ROWS=()
# row NAME PID URL WRK_ARGS...: one wrk run (its OpenSSL configured by $CLIENT_CONF, when set);
# "round|name|requests|seconds|cpu_ticks|errors".
row() {
  local name=$1 pid=$2 url=$3; shift 3
  local t0 t1 out
  t0=$(cpu_ticks "$pid")
  out=$(env ${CLIENT_CONF:+OPENSSL_CONF=$CLIENT_CONF} wrk -t2 -c"$CONNS" -d"${DURATION}s" -H 'X-Api-Key: bench' "$@" "$url/users/1")
  t1=$(cpu_ticks "$pid")
  local n; n=$(echo "$out" | awk '/requests in/{print $1}')
  local errs; errs=$(echo "$out" | awk -F': ' '/Socket errors/{print $2}')
  ROWS+=("$ROUND|$name|$n|$DURATION|$((t1 - t0))|${errs:-none}")
}
for ROUND in $(seq "$ROUNDS"); do
  echo "round $ROUND of $ROUNDS" >&2
  row "nginx ssl, keep-alive" "$NGPID" "https://127.0.0.1:$NG"
  row "quotagate TLS, keep-alive" "$GWPID" "https://127.0.0.1:$GW"
  if [ -n "$BIN_B" ]; then row "quotagate TLS, keep-alive [B]" "${B[1]}" "https://127.0.0.1:${B[0]}"; fi
  row "nginx ssl, new TLS 1.3 connection per request" "$NGPID" "https://127.0.0.1:$NG" -H 'Connection: close'
  row "quotagate TLS, new TLS 1.3 connection per request" "$GWPID" "https://127.0.0.1:$GW" -H 'Connection: close'
  if [ -n "$BIN_B" ]; then row "quotagate TLS, new TLS 1.3 connection per request [B]" "${B[1]}" "https://127.0.0.1:${B[0]}" -H 'Connection: close'; fi
  CLIENT_CONF=$WORK/tls12.cnf
  row "nginx ssl, new TLS 1.2 connection per request" "$NGPID" "https://127.0.0.1:$NG" -H 'Connection: close'
  row "quotagate TLS, new TLS 1.2 connection per request" "$GWPID" "https://127.0.0.1:$GW" -H 'Connection: close'
  if [ -n "$BIN_B" ]; then row "quotagate TLS, new TLS 1.2 connection per request [B]" "${B[1]}" "https://127.0.0.1:${B[0]}" -H 'Connection: close'; fi
  CLIENT_CONF=
  row "nginx, cleartext new connection per request" "$NGPID" "http://127.0.0.1:$NG_PLAIN" -H 'Connection: close'
  row "quotagate, cleartext new connection per request" "$GWPLPID" "http://127.0.0.1:$GW_PLAIN" -H 'Connection: close'
  if [ -n "$BIN_B" ]; then row "quotagate, cleartext new connection per request [B]" "${B[3]}" "http://127.0.0.1:${B[2]}" -H 'Connection: close'; fi
done

TABLE=$(python3 - "$TICKS_PER_S" "$WORK/cpu-lines" "${ROWS[@]}" <<'PY'
import statistics, sys
hz = float(sys.argv[1])
# Each row's CPU a request by round, for scripts/bench_goals.py.
cpu_lines = open(sys.argv[2], "w")
runs = {}  # name -> [(rps, cpu, rps ratio, cpu ratio, errors)], a round each
base = {}
for rnd, name, n, secs, ticks, errs in (r.split("|") for r in sys.argv[3:]):
    rps = int(n) / float(secs)
    cpu = int(ticks) / hz * 1e6 / max(int(n), 1)
    print(f"{rnd}|{name}|{cpu}", file=cpu_lines)
    # A row's nginx is the same kind's ("keep-alive", "new connection per request") of its round.
    kind = (rnd, name.split(", ", 1)[1].removesuffix(" [B]"))
    if name.startswith("nginx"):
        base[kind] = (rps, cpu)
    b = base[kind]
    runs.setdefault(name, []).append((rps, cpu, rps / b[0], cpu / b[1], errs))
med = statistics.median
span = lambda xs: f"{med(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"
print("| server (1 worker) | requests/s | CPU us/request | req/s vs nginx | CPU vs nginx | socket errors |")
print("|---|---:|---:|---:|---:|---|")
for name, rs in runs.items():
    errs = ", ".join(sorted({r[4] for r in rs}))
    print(f"| {name} | {med(r[0] for r in rs):,.0f} | {med(r[1] for r in rs):.1f} | "
          f"{span([r[2] for r in rs])} | {span([r[3] for r in rs])} | {errs} |")
PY
)
# Issue 32's bounds for new connections, each judged on ratios paired by round.
GOALS=$(python3 scripts/bench_goals.py connections <"$WORK/cpu-lines")
echo "$TABLE"
echo
echo "$GOALS"
if [ -z "${BENCH_NO_RECORD:-}" ]; then
  {
    echo
    echo "### scripts/bench-tls.sh $DURATION $CONNS, $(date -u +%Y-%m-%d\ %H:%M) UTC, $(git rev-parse --short HEAD)"
    echo
    echo "Command: \`${BUILDS}scripts/bench-tls.sh $DURATION $CONNS\` ($ROUNDS rounds: medians, and for ratios the lowest and highest round). Machine: $(machine_line)."
    echo
    echo "$TABLE"
    echo
    echo "$GOALS"
  } >> "docs/benchmarks/$(date -u +%Y-%m).md"
fi
