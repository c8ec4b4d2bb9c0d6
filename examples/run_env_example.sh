#!/usr/bin/env bash
# Starts N ranks of allreduce_env on loopback, as a launcher would; fails if any fails.
set -u
exe=$1; n=${2:-2}; port=$(( 20000 + RANDOM % 20000 ))
pids=()
for ((r = 0; r < n; r++)); do
  RIDGE_RANK=$r RIDGE_WORLD_SIZE=$n RIDGE_ROOT_ADDR=127.0.0.1:$port RIDGE_TIMEOUT=20 timeout 60 "$exe" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
