#!/usr/bin/env bash
# Runs the cargo-fuzz targets of the pure decoders (fuzz/, its own workspace).
#
#   scripts/fuzz.sh [--smoke] [target...]
#
# Each target runs for a stated number of executions (libFuzzer -runs=N): 10^7 for the pure
# decoders, 10^6 for the stateful targets (tcp_frames, reassembly,
# stream_order); BX_FUZZ_RUNS overrides both.
# --smoke runs each for 5 seconds instead (-max_total_time=5; CI: they keep building and the
# seeds still pass). No target named: all of them. Prints, per target, the executions done and
# whether it crashed; exits non-zero if any crashed (the input is in fuzz/artifacts/<target>/).
# Needs the nightly toolchain; installs cargo-fuzz when missing, into target/tools/ (the
# toolchain's own bin directory may be read-only: a new machine mounts it so).
set -euo pipefail

cd "$(dirname "$0")/../fuzz"

STATEFUL="tcp_frames reassembly stream_order"
PURE="header message hello qp_endpoint meta grpc_timeout soft_msg soft_comp_slot"

smoke=0
targets=()
for a in "$@"; do
    case "$a" in
        --smoke) smoke=1 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) targets+=("$a") ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<<"$PURE $STATEFUL"

tools="${CARGO_TARGET_DIR:-$PWD/../target}/tools"
export PATH="$tools/bin:$PATH"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz into $tools" >&2
    cargo install --locked --root "$tools" cargo-fuzz
fi

cargo +nightly fuzz build

failed=0
printf '%-16s %14s  %s\n' target executions result
for t in "${targets[@]}"; do
    if [ "$smoke" = 1 ]; then
        limit=(-max_total_time=5)
    elif [[ " $STATEFUL " == *" $t "* ]]; then
        limit=(-runs="${BX_FUZZ_RUNS:-1000000}")
    else
        limit=(-runs="${BX_FUZZ_RUNS:-10000000}")
    fi
    mkdir -p "corpus/$t" "artifacts/$t"
    log="artifacts/$t/last-run.log"
    start=$(date +%s)
    if cargo +nightly fuzz run "$t" "corpus/$t" -- "${limit[@]}" >"$log" 2>&1; then
        result=ok
    else
        result="CRASHED (see fuzz/$log, input in fuzz/artifacts/$t/)"
        failed=1
    fi
    # libFuzzer's last status line: "#N DONE ..." or the line before a crash.
    execs=$({ grep -oE '^#[0-9]+' "$log" || true; } | tail -1 | tr -d '#')
    done_runs=$({ grep -oE 'Done [0-9]+ runs' "$log" || true; } | grep -oE '[0-9]+' | tail -1 || true)
    printf '%-16s %14s  %s (%ss)\n' "$t" "${done_runs:-${execs:-0}}" "$result" "$(( $(date +%s) - start ))"
done
exit "$failed"
