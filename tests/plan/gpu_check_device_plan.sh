#!/bin/sh
# GPU check of the device plan (docs/planner.md, "A communicator's plan"), for a machine with
# one or more NVIDIA GPUs; about a minute. Run from the repository root after a CUDA build:
#   sh tests/plan/gpu_check_device_plan.sh [BUILD_DIR]
# 1. ridge-topo plans on the live machine (discovery with NVML).
# 2. ridge-bench's device allreduce on 2 ranks is right; rank 0's INFO log says which plan ran:
#    with one GPU the ranks share it, and the refusal names the GPU by its topology name,
#    which shows that the CUDA bus id was found in the discovered topology ("is not a GPU of
#    topology" would mean it was not). With 2+ GPUs the device plan runs and its dump must
#    equal ridge-topo plan -n 2 --json.
set -u
build=${1:-build}
out=${OUT:-/tmp}/device-plan-check
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== GPUs: $gpus"
"$build/tools/ridge-topo" plan -n "$((gpus < 2 ? 1 : 2))" > "$out/topo-plan.txt" 2>&1; echo "ridge-topo plan rc=$?"
head -8 "$out/topo-plan.txt"
rm -f "$out/dump.json"
RIDGE_DEBUG=INFO RIDGE_PLAN_DUMP="$out/dump.json" timeout 300 \
  "$build/bench/ridge-bench" allreduce -np 2 --ridge-buffers device -b 8 -e 64M -f 16 > "$out/bench.txt" 2>&1
echo "ridge-bench rc=$? (0: every #wrong was 0)"
grep -E "r0 RIDGE INFO comm .*(device plan|host plan runs|ring )" "$out/bench.txt"
grep -E "^ +[0-9]+ " "$out/bench.txt" | tail -3
if [ "$gpus" -ge 2 ]; then
  "$build/tools/ridge-topo" plan -n 2 --json | cmp - "$out/dump.json" && echo "dump equals ridge-topo plan -n 2 --json"
fi
