#!/usr/bin/env bash
# Runs examples/pytorch_ddp.py on 2 ranks with plain env:// on loopback, as a user would,
# and passes when both exit 0 and rank 0 reports identical replicas. Skips (77) without
# torch_ridge. Usage: run_ddp_example.sh PYTHON EXAMPLE
set -u
python=$1; example=$2
"$python" -c 'import torch_ridge' 2>/dev/null || { echo "SKIP: torch_ridge cannot be imported"; exit 77; }
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(mktemp -d)
pids=()
for r in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=$r timeout 150 "$python" "$example" --steps 10 \
    >"$out/rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$out/rank0.log" "$out/rank1.log"
grep -q "replicas identical: True" "$out/rank0.log" || rc=1
rm -rf "$out"
[ $rc = 0 ] && echo PASS || echo FAIL
exit $rc
