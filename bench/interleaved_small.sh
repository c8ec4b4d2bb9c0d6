#!/usr/bin/env bash
# Issue 2's allreduce at 1-64 KiB over several builds, in interleaved rounds (each build once
# per round, in the given order), for figures that compare builds in the same minutes
# (docs/performance.md, "Operation signatures at 1-64 KiB"). Each DIR is a checkout with a
# Release build in DIR/build. SPIN: RIDGE_SPIN_US for every run (unset: Ridge's default,
# which stops spinning on an oversubscribed machine). Rows: ridge-bench's (-I 1: i_min etc.).
# usage: bench/interleaved_small.sh ROUNDS OUTFILE DIR...
# summary: python3 bench/interleaved_summary.py OUTFILE
set -u
ROUNDS=${1:?usage: bench/interleaved_small.sh ROUNDS OUTFILE DIR...}; OUT=${2:?}; shift 2
: > "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for d in "$@"; do
    echo "### $d round $round $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
    (cd / && ${SPIN:+env RIDGE_SPIN_US=$SPIN} timeout 120 "$d"/build/bench/ridge-bench allreduce -np 2 -b 1K -e 64K -f 4 \
       -n 2000 -w 200 -c 1 -I 1 2>&1 | grep -E "^ +[0-9]+ " >> "$OUT")
  done
done
echo "### done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT"
