#!/bin/sh
# ridge-bench on emulated devices placed by a topology file: the device allreduce is right
# (ridge-bench exits non-zero on any #wrong element) and RIDGE_PLAN_DUMP equals, byte for
# byte, what ridge-topo plan --json prints for the same file and rank count.
# Usage: bench_device_plan.sh RIDGE_BENCH RIDGE_TOPO TOPOLOGY_FILE RANKS SCRATCH_DIR
set -eu
bench=$1 topo=$2 file=$3 ranks=$4 dir=$5
mkdir -p "$dir"
dump="$dir/bench-device-plan-dump.json"
expected="$dir/bench-device-plan-expected.json"
rm -f "$dump" "$expected"
RIDGE_DEVICE=emulated RIDGE_TOPO_FILE="$file" RIDGE_PLAN_DUMP="$dump" RIDGE_SOCKET_IFNAME=lo \
  "$bench" allreduce -np "$ranks" --ridge-buffers device -b 8 -e 1M -f 32 -n 2 -w 1
"$topo" --input "$file" plan -n "$ranks" --json > "$expected"
if ! cmp "$dump" "$expected"; then
  diff "$dump" "$expected" | head -20
  echo "RIDGE_PLAN_DUMP differs from ridge-topo plan --json" >&2
  exit 1
fi
echo "RIDGE_PLAN_DUMP equals ridge-topo plan --json ($(wc -c < "$dump") bytes)"
