#!/usr/bin/env python3
"""The fleet benchmark: `bx ps bench --servers 2 --replicas 3` with each fault
(none, kill, stall, slow) and each attempt policy (none, retries, hedging), in interleaved
rounds, printing the median over the rounds of calls failed, p99 and calls/s as a Markdown table.

Usage: scripts/fleet-bench.py [--rounds 5] [--duration 6] [--transport rdma] [--bx PATH]
           [--hedging-delay-ms MS]

The hedging delay is the healthy p95 (the issue's setting): the median p95 of the no-fault,
no-policy runs of a calibration round run first, unless --hedging-delay-ms gives it. Needs a
release build of bx (`cargo build --release -p bx`). Each run is one `bx ps bench` process with
its own six servers; nothing outlives it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

FAULTS = ["none", "kill", "stall", "slow"]
POLICIES = ["none", "retries", "hedging"]


def run(bx, transport, duration, fault, policy, delay_ms):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [bx, "ps", "bench", "--servers", "2", "--replicas", "3",
               "--duration", str(duration), "--warmup", "1", "--transports", transport,
               "--json", out.name, "--policy", policy]
        if fault != "none":
            cmd += ["--fault", fault]
        if policy == "hedging":
            cmd += ["--hedging-delay-ms", str(delay_ms)]
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=duration * 10 + 120)
        if p.returncode != 0:
            sys.exit(f"fleet-bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
        return json.load(open(out.name))["rows"][0]


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds; the table shows their medians")
    ap.add_argument("--duration", type=float, default=6,
                    help="measured seconds per run (the fault strikes at a third; a stall "
                         "lasts 2 s, so keep this >= 4)")
    ap.add_argument("--transport", default="rdma",
                    help="the one bx transport each run benches: rdma or tcp")
    ap.add_argument("--hedging-delay-ms", type=int,
                    help="hedging delay; default: the healthy p95 of 3 calibration runs")
    ap.add_argument("--bx", help="the bx binary", default=os.path.join(os.path.dirname(__file__), "..", "target",
                                                  "release", "bx"))
    a = ap.parse_args()
    delay = a.hedging_delay_ms
    if delay is None:
        p95 = [run(a.bx, a.transport, a.duration, "none", "none", 0)["p95_us"] for _ in range(3)]
        delay = max(1, round(statistics.median(p95) / 1000))
        print(f"hedging delay: {delay} ms (median healthy p95 of 3 calibration runs: {p95} µs)",
              file=sys.stderr)
    results = {}
    for r in range(a.rounds):
        for fault in FAULTS:
            for policy in POLICIES:
                row = run(a.bx, a.transport, a.duration, fault, policy, delay)
                results.setdefault((fault, policy), []).append(row)
                print(f"round {r + 1}: {fault:5} {policy:7} failed {row['failed']:4} "
                      f"p99 {row['p99_us']:7} µs  {row['calls_per_sec']:8.0f} calls/s  "
                      f"retried {row['retried']} hedged {row['hedged']} "
                      f"ejections {row['ejections']}", file=sys.stderr)
    med = lambda xs: statistics.median(xs)
    print(f"`bx ps bench --servers 2 --replicas 3 --transports {a.transport} --duration "
          f"{a.duration}`, median of {a.rounds} interleaved rounds; hedging delay {delay} ms\n")
    print("| fault | policy | calls failed | p99 µs | calls/s | retried | hedged | ejections |")
    print("|---|---|---|---|---|---|---|---|")
    for fault in FAULTS:
        for policy in POLICIES:
            rows = results[(fault, policy)]
            print(f"| {fault} | {policy} | {med([x['failed'] for x in rows]):g} "
                  f"| {med([x['p99_us'] for x in rows]):g} "
                  f"| {med([x['calls_per_sec'] for x in rows]):.0f} "
                  f"| {med([x['retried'] for x in rows]):g} "
                  f"| {med([x['hedged'] for x in rows]):g} "
                  f"| {med([x['ejections'] for x in rows]):g} |")


if __name__ == "__main__":
    main()
