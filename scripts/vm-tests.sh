#!/usr/bin/env bash
# Runs the tests that need a real rdma-core device inside the Soft-RoCE VM
# (../shared/rxe-vm/run-in-rxe-vm.sh, or $BX_RXE_VM): builds each VM test binary on the host,
# then runs it in the guest, where the repository (target/ included) is mounted at the same path.
# BX_ALLOW_SKIP containing "vm" skips them, loudly; nothing else does.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
vm=${BX_RXE_VM:-$repo/../shared/rxe-vm/run-in-rxe-vm.sh}
if [[ ",${BX_ALLOW_SKIP:-}," == *",vm,"* ]]; then
  echo "vm-tests: SKIPPED (BX_ALLOW_SKIP=vm): the ibverbs provider's tests in the Soft-RoCE VM did not run" >&2
  exit 0
fi
[ -x "$vm" ] || { echo "vm-tests: $vm not found (set BX_RXE_VM, or BX_ALLOW_SKIP=vm to skip)" >&2; exit 1; }
# package:test-target:features
targets=("byteexpress-verbs:conformance:vm-tests" "byteexpress-verbs:ibverbs_vm:vm-tests")
bins=()
for t in "${targets[@]}"; do
  IFS=: read -r pkg test feat <<<"$t"
  bin=$(cargo test -p "$pkg" --features "$feat" --test "$test" --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -n1)
  [ -n "$bin" ] || { echo "vm-tests: could not build $pkg --test $test" >&2; exit 1; }
  bins+=("$bin")
done
script="set -e; export BX_PROVIDER=ibverbs; ibv_devices"
for b in "${bins[@]}"; do script+="; echo '### $(basename "$b")'; '$b' --test-threads=1"; done
echo "vm-tests: running ${#bins[@]} test binaries in the Soft-RoCE VM" >&2
RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-900} "$vm" "$repo" "$script"
