#!/bin/bash
# bench-divvy-callgrind.sh BIN [DIVVY ENV...]: instructions the Divvy port of BIN spends per HIT,
# counted by callgrind (repeatable, unlike time on a shared machine): `quotagate divvy` on the
# memory store (or on Redis with REDIS_PORT=...), one connection, one HIT at a time, 70% on a
# rule that allows and 30% on one that denies (as bench-divvy.sh). Runs 1000 and 5000 hits and
# prints (Ir(5000) - Ir(1000)) / 4000, so start-up and shutdown cancel out. Compare two builds
# one after the other, e.g. `scripts/bench-divvy-callgrind.sh /tmp/a; ... /tmp/b`.
set -euo pipefail
BIN=$(realpath "$1"); shift
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
divvy_rules "$W/rules.ini"

# instructions N: total instructions of a Divvy port that answered N hits.
instructions() {
  local n=$1 port pid
  shift
  port=$(free_port)
  env PORT="$port" "$@" valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" "$BIN" divvy \
    "$W/rules.ini" --set log.level=warn --set server.workers=1 >/dev/null 2>"$W/vg.log" & pid=$!
  for _ in $(seq 1 600); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  python3 - "$port" "$n" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rb")
for i in range(int(sys.argv[2])):
    rule = "deny" if i % 10 < 3 else "allow"
    s.sendall(f"HIT bench={rule} actor=a{i % 100}\n".encode())
    line = f.readline()
    assert line.startswith(b"OK "), line
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
  grep -E "^(summary|totals):" "$W/cg.out" | head -1 | awk '{print $2}'
}

few=$(instructions 1000 "$@")
many=$(instructions 5000 "$@")
echo "instructions per hit: $(( (many - few) / 4000 ))"
