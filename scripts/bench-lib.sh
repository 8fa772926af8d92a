# Helpers shared by the benchmark scripts (sourced, not run).
#
# CPU time is read from /proc/PID/stat (utime + stime, every thread of the process, in clock ticks):
# the cost of a request is the CPU a process spent over a load run divided by the requests it served.
# On a shared 2-core machine absolute numbers drift between runs, so tables compare rows of one run.

TICKS_PER_S=$(getconf CLK_TCK)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "port $1 never opened" >&2; return 1
}

# cpu_ticks PID...: utime+stime of the processes and of their children (nginx's workers), in ticks.
cpu_ticks() { proc_ticks '$12 + $13' "$@"; }
# user_ticks PID...: the same, utime only (where quotagate's gap to nginx is: docs/benchmarks/).
user_ticks() { proc_ticks '$12' "$@"; }
# proc_ticks AWK_SUM PID...: a sum of /proc/PID/stat fields (counted after the command name) over
# the processes and their children.
proc_ticks() {
  local sum=$1 total=0 p kids
  shift
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    # The command name may hold spaces: take the fields after the closing parenthesis.
    total=$((total + $(sed 's/.*) //' "/proc/$p/stat" | awk "{print $sum}")))
    kids=$(pgrep -P "$p" || true)
    # shellcheck disable=SC2086
    [ -n "$kids" ] && total=$((total + $(proc_ticks "$sum" $kids)))
  done
  echo "$total"
}

# script_calls PORT: EVALSHA commands the redis-server on PORT has run (the gateways' only command
# per decision; the scripts' own inner commands, listed apart by INFO commandstats, not counted).
script_calls() {
  redis-cli -p "$1" info commandstats | tr -d '\r' |
    awk -F'[:=,]' '$1 == "cmdstat_evalsha" {print $3; found=1} END {if (!found) print 0}'
}

# rss_kib PID: resident memory in KiB.
rss_kib() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }

# us_per DELTA_TICKS REQUESTS: microseconds of CPU per request.
us_per() { python3 -c "import sys; t,n,hz=map(float,sys.argv[1:]); print(f'{t/hz*1e6/max(n,1):.1f}')" "$1" "$2" "$TICKS_PER_S"; }

machine_line() {
  local cpu; cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  echo "$(nproc) cores ($cpu), $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r)"
}

ensure_debian_packages() {
  local missing=()
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} (Debian packages)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# quotagate_builds: the builds a benchmark measures. QUOTAGATE_BIN=PATH measures that build instead
# of building one (cargo build --release); QUOTAGATE_BIN_B=PATH, where a script has "[B]" rows, adds
# a second build's rows to every round: two builds side by side in one run. Sets BIN, BIN_B and
# BUILDS (those variables as a command line's prefix, for a script's record of its command).
quotagate_builds() {
  if [ -z "${QUOTAGATE_BIN:-}" ]; then cargo build --release --quiet; fi
  BIN=${QUOTAGATE_BIN:-target/release/quotagate}
  BIN_B=${QUOTAGATE_BIN_B:-}
  BUILDS="${QUOTAGATE_BIN:+QUOTAGATE_BIN=$QUOTAGATE_BIN }${BIN_B:+QUOTAGATE_BIN_B=$BIN_B }"
}

# nginx's per-key limit, the memory store's peer (scripts/bench.sh, PEER=nginx-limit
# scripts/bench-callgrind.sh): `limit_req` on a zone keyed by the API key at a rate no key reaches,
# for nginx_conf's SERVER_LINES and HTTP_LINES. A burst: without one, a key's second request in the
# same millisecond is refused whatever the rate.
NGINX_LIMIT_SERVER='limit_req zone=keys burst=1000 nodelay;'
NGINX_LIMIT_HTTP='limit_req_zone $http_x_api_key zone=keys:10m rate=1000000000r/s;'

# bench_workdir: a scratch folder, $WORK, and on exit: every process in $PIDS stopped, the folder
# removed.
bench_workdir() {
  WORK=$(mktemp -d)
  PIDS=()
  trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
}

# nginx_conf SERVERS LISTEN [SERVER_LINES] [HTTP_LINES]: writes $WORK/nginx/nginx.conf: one
# worker, no logs, proxy_pass with keep-alive to the upstream block's SERVERS, listening on
# LISTEN (e.g. "127.0.0.1:8080 ssl"), with SERVER_LINES (certificates, limit_req) in the server
# block and HTTP_LINES (limit_req_zone) in the http block.
nginx_conf() {
  mkdir -p "$WORK/nginx"
  cat > "$WORK/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log stderr warn;
events { worker_connections 10240; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body; proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fcgi; uwsgi_temp_path $WORK/nginx/uwsgi; scgi_temp_path $WORK/nginx/scgi;
  ${4:-}
  upstream api { $1 keepalive 128; }
  server {
    listen $2;
    ${3:-}
    location / { proxy_pass http://api; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
}

# divvy_rules FILE: the Divvy benchmarks' rule file. bench=allow never runs out; bench=deny allows
# one hit an hour, so nearly all of those are denied.
divvy_rules() {
  cat > "$1" <<'INI'
[bench=allow]
creditLimit = 1000000000
resetSeconds = 3600

[bench=deny]
creditLimit = 1
resetSeconds = 3600

[default]
creditLimit = 0
INI
}

# The fields an API client or browser usually sends besides its key, none of which a gateway reads
# (bench-callgrind.sh FIELDS=1): "Name: value" lines.
USUAL_FIELDS='User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36
Accept: application/json, text/plain, */*
Accept-Encoding: gzip, deflate, br
Accept-Language: en-US,en;q=0.9
Cache-Control: no-cache
X-Request-Id: 4bf92f35-77b3-4da6-a3ce-929d0e0e4736'
export USUAL_FIELDS

# usual_fields_lua: USUAL_FIELDS as entries of a Lua table of fields (many_keys_lua's HEADERS).
usual_fields_lua() {
  local out=() name value
  while IFS= read -r line; do
    name=${line%%: *} value=${line#*: }
    out+=("[\"$name\"] = \"$value\"")
  done <<<"$USUAL_FIELDS"
  (IFS=,; echo "${out[*]}")
}

# many_keys_lua FILE [METHOD] [HEADERS] [BODY]: a wrk script in FILE that sends every request with
# one of 1000 API keys (key-0000 .. key-0999), round robin per wrk thread, to /users/N. METHOD
# (default GET); HEADERS, more entries of the Lua table of fields (`["Connection"] = "close"`);
# BODY, a Lua expression for the body (default none).
many_keys_lua() {
  local method=${2:-GET} headers=${3:+, $3} body=${4:+, $4}
  cat > "$1" <<LUA
local n = 0
request = function()
  n = n + 1
  return wrk.format("$method", "/users/" .. n, { ["X-Api-Key"] = string.format("key-%04d", n % 1000)$headers }$body)
end
LUA
}
