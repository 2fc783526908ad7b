#!/usr/bin/env bash
# Installs the Debian packages ByteExpress needs beyond the Rust toolchain, gcc, make and python3:
#   cmake         rdma-mummy-sys builds its C shim with it;
#   libclang-dev  bindgen (inside rdma-mummy-sys) loads libclang.so and needs clang's headers;
#   python3-venv  the gRPC interop test installs Python grpcio into a venv.
# What is missing is decided by package state (dpkg-query), never by a file glob: LLVM's
# libclang-cpp<N> (which new machines ship) is no libclang for bindgen. Any libclang-<N>-dev
# counts as libclang-dev, since each brings libclang.so.
# As root it apt-gets what is missing and says what; otherwise it names what to install and fails.
# Without dpkg-query (not Debian) it looks for exactly the files the tools use instead.
set -euo pipefail

# installed PKG: dpkg's database has PKG in state "installed" (a removed package's leftover
# configuration, "deinstall ok config-files", does not count).
installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

# any_installed GLOB: some package whose name matches GLOB is installed.
any_installed() {
  dpkg-query -W -f='${db:Status-Status} ${Package}\n' "$1" 2>/dev/null | grep -q '^installed '
}

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  installed cmake || missing+=(cmake)
  installed libclang-dev || any_installed 'libclang-[0-9]*-dev' || missing+=(libclang-dev)
  installed python3-venv || missing+=(python3-venv)
else
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  # The names clang-sys (bindgen's loader) tries: libclang.so and libclang-<N>.so, never libclang-cpp.
  found=
  for d in /usr/lib/llvm-*/lib /usr/lib64 /usr/lib /usr/local/lib /usr/lib/x86_64-linux-gnu; do
    for f in "$d"/libclang.so "$d"/libclang-[0-9]*.so; do
      [ -e "$f" ] && found=$f
    done
  done
  [ -n "$found" ] || missing+=(libclang-dev)
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: build packages present (cmake, libclang-dev, python3-venv)" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup: missing build packages: ${missing[*]} (as root: apt-get install -y ${missing[*]})" >&2
  exit 1
fi
echo "setup: installing ${missing[*]} with apt-get (about a minute)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${missing[*]}" >&2
