#!/usr/bin/env bash
# Installs the packages ByteExpress needs beyond the Rust toolchain: cmake and libclang-dev
# (for rdma-mummy-sys, which builds a C shim and runs bindgen) and python3-venv (the gRPC interop
# test installs Python grpcio into a venv).
# As root it apt-gets what is missing; otherwise it names what to install and fails.
set -euo pipefail
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "setup: missing build packages: ${missing[*]} (as root: apt-get install -y ${missing[*]})" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
