#!/usr/bin/env bash
# The docker-compose demo, natively: Redis, the example upstream API, the catalog server, two
# quotagate instances sharing Redis (A on 8080, B on 8090), and the Divvy port on A (8321).
# Same config files as docker-compose.yml (examples/demo/).
#
#   examples/demo.sh          Ctrl-C stops everything
#
# QUOTAGATE_BIN: the binary to run (default: build target/release/quotagate).
# DEMO_DIR: where the served catalogs and the logs go (default: a new temporary directory). Edit
#           $DEMO_DIR/catalogs/v0001.json (or add v0002.json) to change limits live.
# DEMO_REDIS=cluster: a 3-master Redis Cluster on 6390-6392 (bus ports 16390-16392) instead of one
#           Redis on 6390; the gateways use store.redis_mode = "cluster" with all three as seeds.
# DEMO_REDIS_PORT: the first Redis port (default 6390), for when another Redis holds 6390.
# Every port the demo needs is checked first; a taken one is named, and nothing is started.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "the demo needs redis-server (apt-get install redis-server)" >&2; exit 1; }
RP=${DEMO_REDIS_PORT:-6390}
case "$RP" in ''|*[!0-9]*) echo "DEMO_REDIS_PORT must be a port number, not '$RP'" >&2; exit 1 ;; esac
if [ "${DEMO_REDIS:-single}" = cluster ]; then
  REDIS_PORTS=("$RP" $((RP + 1)) $((RP + 2)))
  NEEDED=("$RP:Redis" $((RP + 1)):Redis $((RP + 2)):Redis $((RP + 10000)):"Redis cluster bus" \
    $((RP + 10001)):"Redis cluster bus" $((RP + 10002)):"Redis cluster bus")
else
  REDIS_PORTS=("$RP")
  NEEDED=("$RP:Redis")
fi
NEEDED+=("9000:example upstream" "9100:catalog server" "8080:gateway A" "8081:gateway A admin"
  "8321:gateway A Divvy port" "8090:gateway B" "8091:gateway B admin")
for need in "${NEEDED[@]}"; do
  port=${need%%:*}
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    case "${need#*:}" in
      Redis*) hint="; choose other Redis ports with DEMO_REDIS_PORT=..." ;;
      *) hint="; stop what listens there (the README's commands use this port)" ;;
    esac
    echo "port $port (${need#*:}) is taken by another process$hint" >&2
    exit 1
  fi
done
BIN=${QUOTAGATE_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --quiet
  BIN=target/release/quotagate
fi
DEMO_DIR=${DEMO_DIR:-$(mktemp -d -t quotagate-demo.XXXXXX)}
mkdir -p "$DEMO_DIR/catalogs" "$DEMO_DIR/redis"
cp examples/demo/catalogs/*.json "$DEMO_DIR/catalogs/"

PIDS=()
stop() {
  trap - EXIT INT TERM
  kill "${PIDS[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on port $1; see the logs in $DEMO_DIR" >&2
  exit 1
}
wait_ready() {
  for _ in $(seq 200); do
        status=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3 && head -n 1 <&3) 2>/dev/null || true)
    case "$status" in *" 200 "*) return 0 ;; esac
    sleep 0.05
  done
  echo "the gateway with admin port $1 never became ready; see the logs in $DEMO_DIR" >&2
  exit 1
}

if [ "${DEMO_REDIS:-single}" = cluster ]; then
  for port in "${REDIS_PORTS[@]}"; do
    mkdir -p "$DEMO_DIR/redis/$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --cluster-enabled yes \
      --dir "$DEMO_DIR/redis/$port" >"$DEMO_DIR/redis-$port.log" 2>&1 &
    PIDS+=($!)
  done
  for port in "${REDIS_PORTS[@]}"; do wait_port "$port"; done
  redis-cli --cluster create "${REDIS_PORTS[@]/#/127.0.0.1:}" --cluster-yes >"$DEMO_DIR/cluster-create.log" 2>&1
  for _ in $(seq 200); do
    redis-cli -p $((RP + 2)) cluster info 2>/dev/null | grep -q cluster_state:ok && break
    sleep 0.05
  done
  export QUOTAGATE_STORE_REDIS_MODE=cluster
  export QUOTAGATE_STORE_REDIS_URL=redis://127.0.0.1:$RP,redis://127.0.0.1:$((RP + 1)),redis://127.0.0.1:$((RP + 2))
  REDIS_SAID="Redis Cluster 127.0.0.1:$RP-$((RP + 2))"
else
  redis-server --port "$RP" --bind 127.0.0.1 --save "" --appendonly no --dir "$DEMO_DIR/redis" >"$DEMO_DIR/redis.log" 2>&1 &
  PIDS+=($!)
  # The gateways' config files name 6390; this follows DEMO_REDIS_PORT.
  export QUOTAGATE_STORE_REDIS_URL=redis://127.0.0.1:$RP
  REDIS_SAID="Redis 127.0.0.1:$RP"
fi
"$BIN" example-upstream --listen 127.0.0.1:9000 2>"$DEMO_DIR/upstream.log" &
PIDS+=($!)
"$BIN" catalog-server --catalog "$DEMO_DIR/catalogs" --listen 127.0.0.1:9100 --config examples/demo/catalog-server.toml 2>"$DEMO_DIR/catalog-server.log" &
PIDS+=($!)
wait_port "$RP"
wait_port 9000
wait_port 9100
"$BIN" --config examples/demo/gateway-a.toml 2>"$DEMO_DIR/gateway-a.log" &
PIDS+=($!)
"$BIN" --config examples/demo/gateway-b.toml 2>"$DEMO_DIR/gateway-b.log" &
PIDS+=($!)
wait_ready 8081
wait_ready 8091

cat <<EOF
quotagate demo is running (logs and served catalogs in $DEMO_DIR):
  gateway A  http://127.0.0.1:8080   admin http://127.0.0.1:8081   Divvy port 127.0.0.1:8321
  gateway B  http://127.0.0.1:8090   admin http://127.0.0.1:8091
  upstream   http://127.0.0.1:9000   catalog server http://127.0.0.1:9100   $REDIS_SAID

Try (the README's "Demo" section explains each):
  for i in \$(seq 6); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-Api-Key: demo-key' http://127.0.0.1:8080/items/1; \\
                          curl -s -o /dev/null -w '%{http_code} ' -H 'X-Api-Key: demo-key' http://127.0.0.1:8090/items/1; done
  curl -i -H 'X-Api-Key: demo-key' http://127.0.0.1:8090/items/1
  sed -i 's/"rl": 100/"rl": 3/' $DEMO_DIR/catalogs/v0001.json
  curl -i -H 'X-Api-Key: gold-key' -H 'X-Quotagate-Refresh: demo-refresh-secret' http://127.0.0.1:8080/items/1
  sleep 1; curl -i -H 'X-Api-Key: gold-key' http://127.0.0.1:8090/items/1   # B within a second
  bash -c 'exec 3<>/dev/tcp/127.0.0.1/8321; printf "HIT method=GET path=/status\\n" >&3; head -1 <&3'
  curl -s http://127.0.0.1:8081/metrics | grep quotagate_requests_total
Ctrl-C stops everything.
EOF
wait
