#!/usr/bin/env bash
# `make test`: every test of the workspace on the host, a smoke run of every fuzz target, then the
# ibverbs tests in the Soft-RoCE VM.
# Steps, each announced on a line of its own before it starts:
#   1 set-up      scripts/setup.sh (build packages) and a check that the VM helper is there
#   2 host build  cargo test --workspace --no-run (debug build of every test binary)
#   3 host tests  cargo test --workspace
#   4 fuzz smoke  scripts/fuzz.sh --smoke: each cargo-fuzz target 5 s (they keep building, the
#                 seeds and the regression inputs still pass; nightly toolchain, cargo-fuzz
#                 installed when missing)
#   5 VM boot     scripts/vm-tests.sh builds the VM test binaries and boots the VM
#   6 VM tests    the same script runs them in the VM
# The last line sums the "test result:" lines of steps 3 and 5: `N passed, M failed`. A step that
# fails stops the later ones, except that a host test or fuzz failure still lets the VM tests run.
# The exit status is 0 only when every step passed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
started=$SECONDS

step() {
  printf '\n==> make test [%s, %ds]: %s\n' "$1" $((SECONDS - started)) "$2"
}

# summary LOG...: prints `N passed, M failed` over the cargo test result lines of the logs.
summary() {
  cat "$@" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | awk '
    /^test result: / {
      for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed;?$/) p += $(i - 1)
        if ($(i) ~ /^failed;?$/) f += $(i - 1)
      }
    }
    END { printf "%d passed, %d failed\n", p, f }'
}

finish() {
  local rc=$1 why=$2
  printf '\n==> make test: %s (%ds)\n' "$why" $((SECONDS - started))
  summary "$logs"/host.log "$logs"/vm.log
  exit "$rc"
}

step "1/6 set-up" "build packages (scripts/setup.sh), VM helper (scripts/vm-tests.sh --check)"
scripts/setup.sh || finish 1 "set-up failed"
scripts/vm-tests.sh --check || finish 1 "the VM helper is missing"

step "2/6 host build" "cargo test --workspace --no-run (debug build; 5 to 10 minutes on a new 2-core machine)"
cargo test --workspace --no-run || finish 1 "the host build failed"

step "3/6 host tests" "cargo test --workspace"
cargo test --workspace 2>&1 | tee "$logs"/host.log
host_rc=${PIPESTATUS[0]}

step "4/6 fuzz smoke" "scripts/fuzz.sh --smoke (every cargo-fuzz target for 5 s; the first run builds them, a few minutes)"
scripts/fuzz.sh --smoke
fuzz_rc=$?
if [ "$fuzz_rc" != 0 ]; then
  host_rc=1
  fuzz_failed=" (fuzz smoke failed)"
fi

step "5/6 VM boot" "scripts/vm-tests.sh: build the ibverbs test binaries, boot the Soft-RoCE VM (step 6 runs in it)"
scripts/vm-tests.sh 2>&1 | tee "$logs"/vm.log
vm_rc=${PIPESTATUS[0]}

if [ "$host_rc" != 0 ] && [ "$vm_rc" != 0 ]; then
  finish 1 "FAILED: host tests${fuzz_failed:-} and VM tests"
elif [ "$host_rc" != 0 ]; then
  finish 1 "FAILED: host tests (cargo test --workspace)${fuzz_failed:-}"
elif [ "$vm_rc" != 0 ]; then
  finish 1 "FAILED: VM tests (scripts/vm-tests.sh)"
fi
finish 0 "all steps passed"
