#!/usr/bin/env bash
# Runs the tests that need a real rdma-core device inside the Soft-RoCE VM
# (../shared/rxe-vm/run-in-rxe-vm.sh, or $BX_RXE_VM): builds each VM test binary on the host,
# then runs it in the guest, where the repository and cargo's target directory are mounted at the
# same paths (the VM mounts one folder: their nearest common parent). Every binary runs even when
# an earlier one fails; the script fails if any did.
# Needs root, qemu and Debian's apt (the first run builds the guest image, about 80 MB).
# BX_ALLOW_SKIP containing "vm" skips them, loudly; nothing else does. With --check it only
# checks that the VM helper is there (or skipped) and exits.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
vm=${BX_RXE_VM:-$repo/../shared/rxe-vm/run-in-rxe-vm.sh}
if [[ ",${BX_ALLOW_SKIP:-}," == *",vm,"* ]]; then
  echo "vm-tests: SKIPPED (BX_ALLOW_SKIP=vm): the ibverbs provider's tests in the Soft-RoCE VM did not run" >&2
  exit 0
fi
[ -x "$vm" ] || { echo "vm-tests: $vm not found (set BX_RXE_VM, or BX_ALLOW_SKIP=vm to skip)" >&2; exit 1; }
# --check: only the above (make test runs it first, so a missing VM helper shows up at once).
[ "${1:-}" = --check ] && exit 0
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import sys,json; print(json.load(sys.stdin)["target_directory"])')
mount=$repo
while [[ "$target/" != "$mount/"* ]]; do mount=$(dirname "$mount"); done
if [ "$mount" = / ]; then
  echo "vm-tests: the repository ($repo) and cargo's target directory ($target) share no folder but /;" \
       "the VM mounts one folder: put CARGO_TARGET_DIR under a common parent with the repository" >&2
  exit 1
fi
# package:test-target:features[:environment[:test arguments]]
# - the conformance suite on rxe0 (BX_PROVIDER=ibverbs), and the rdma-core specifics;
# - end to end: byteexpress-rpc echo calls with the soft device hidden (BX_SOFT=0), so the
#   RDMA link can only be rxe0; every native and facade stream test (issue 21), the same way;
#   rendezvous (issue 23) up to 64 MiB: loans are per-message MRs there (rxe bounds a memory
#   window by its MR only), READs into registered memory, every size intact;
# - selective signaling and inline SENDs on rxe0 (issue 25): a burst completes with fewer send
#   CQEs than SENDs; a QP error amid unsignaled SENDs answers every call once. rxe completes
#   SENDs asynchronously, so flushed SENDs carry undelivered messages (the soft provider
#   delivers at post): a flush that confirmed its message fails a call here (seen failing so);
# - memory the pool did not allocate, through byteexpress-mem's MR cache on rxe0 (MAP_FIXED:
#   a region unmapped and mapped again at the same address is registered anew);
# - least access on rxe0 (issue 22): an RDMA WRITE into a link's receive buffer with its
#   address and leaked rkey fails IBV_WC_REM_ACCESS_ERR, as does a READ of a send buffer; a
#   message lent for READ (Pool::lend_for_read) is readable for that message only;
# - rendezvous loans on rxe0 (issue 23): a message lent as the engine lends it there (an MR of
#   its own: rxe bounds a window by its MR only) READs whole; a READ one byte before it, one
#   running one byte past it, and one after the release fail IBV_WC_REM_ACCESS_ERR at the peer;
#   another link of the lender READs and SENDs after them;
# - `bx pingpong` against rdma-core's `ibv_rc_pingpong` both ways, and `bx devices` on rxe0;
# - device choice with soft0 visible: BX_TRANSPORT=rdma links on rxe0, never moved to soft0; an
#   invalid BX_GID_INDEX is an error naming the index, rxe0 and its valid entries.
# - the RDMA→TCP fallback across a veth pair (issue 20, scripts/vm-fallback-net.sh): RoCE's UDP
#   port dropped under load, calls go on over TCP (tcp(fallback)), the rule removed, back on
#   RDMA. It needs `nft` in the guest (RXE_VM_EXTRA_PKGS gets nftables) and the netfilter
#   modules of the guest's kernel (`vm-fallback-net.sh host-prep`, below, before the boot).
targets=(
  "byteexpress-verbs:conformance:vm-tests"
  "byteexpress-verbs:ibverbs_vm:vm-tests"
  "integration-tests:transport_core::BX_SOFT=0:echo_over_rdma_with_64_in_flight_and_grant_8 --exact"
  "integration-tests:native_streams::BX_SOFT=0:"
  "integration-tests:rendezvous::BX_SOFT=0:"
  "integration-tests:selective_signaling::BX_SOFT=0:"
  "integration-tests:facade_streams::BX_SOFT=0:"
  "bx:pingpong_vm:vm-tests"
  "byteexpress-mem:user_memory_vm:"
  "byteexpress-mem:least_access:"
  "byteexpress-mem:rendezvous_loans:"
  "integration-tests:device_choice_vm:vm-tests"
  "integration-tests:fallback_vm:vm-tests:BX_SOFT=0 RUST_LOG=info:--exact calls_move_to_tcp_when_roce_is_dropped_and_back_to_rdma_when_it_returns --nocapture"
)
bins=()
runs=()
for t in "${targets[@]}"; do
  IFS=: read -r pkg test feat env args <<<"$t"
  # BX_VM_TESTS_ONLY=test[,test...]: run only these test targets (for a developer; make test
  # never sets it).
  if [ -n "${BX_VM_TESTS_ONLY:-}" ] && [[ ",$BX_VM_TESTS_ONLY," != *",$test,"* ]]; then continue; fi
  feats=()
  [ -n "$feat" ] && feats=(--features "$feat")
  echo "vm-tests: building $pkg --test $test ${feat:+(features $feat)}" >&2
  log=$(mktemp)
  bin=$(cargo test -p "$pkg" "${feats[@]}" --test "$test" --no-run --message-format=json 2>"$log" \
        | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -n1) || true
  if [ -z "$bin" ]; then
    tail -n 30 "$log" >&2
    rm -f "$log"
    echo "vm-tests: could not build $pkg --test $test" >&2
    exit 1
  fi
  rm -f "$log"
  bins+=("$bin")
  runs+=("echo '### $(basename "$bin") $env $args'; env $env '$bin' --test-threads=1 $args || { rc=1; failed+=' $pkg:$test'; }")
done
script="cd '$repo'; rc=0; failed=; export BX_PROVIDER=ibverbs; printf '\\n==> VM tests: the VM is up; running ${#bins[@]} test binaries on its rdma-core device\\n'; echo 'vm-tests: RDMA devices in the VM (ibv_devices):'; ibv_devices || rc=1"
for r in "${runs[@]}"; do script+="; $r"; done
script+="; if [ \$rc = 0 ]; then echo \"vm-tests: all ${#bins[@]} test binaries passed in the VM\"; else echo \"vm-tests: FAILED in the VM:\$failed\"; fi; exit \$rc"
bash "$repo/scripts/vm-fallback-net.sh" host-prep >&2
case " ${RXE_VM_EXTRA_PKGS:-} " in *" nftables "*) ;; *) export RXE_VM_EXTRA_PKGS="${RXE_VM_EXTRA_PKGS:+$RXE_VM_EXTRA_PKGS }nftables" ;; esac
echo "vm-tests: booting the Soft-RoCE VM (mounting $mount; the first run builds its image) to run ${#bins[@]} test binaries" >&2
cd "$mount"
RXE_VM_TIMEOUT=${RXE_VM_TIMEOUT:-900} "$vm" "$mount" "$script"
