#!/usr/bin/env bash
# The before/after runs of docs/performance.md ("End-of-session runs"): this checkout against
# BASELINE_CHECKOUT (another checkout with its own build/, e.g. `git worktree add ../base REV`
# and a Release build there), one after the other on a quiet machine: gdr-write against the
# plain net path, issue 2's allreduce and issue 5's netns TCP run (baseline, this, twice),
# and issue 21's acceptance table. Outputs: gdr.txt issue2.txt issue5.txt issue21.txt in OUT.
set -u
BASE=${1:?usage: bench/before_after.sh BASELINE_CHECKOUT [OUT]}; OUT=${2:-before-after-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); BASE=$(cd "$BASE" && pwd); HERE=$(cd "$(dirname "$0")/.." && pwd)
export RIDGE_SOCKET_IFNAME=lo OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_tcp_if_include=lo
stamp() { echo "### $* $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; }
cd "$HERE"
{ for round in 1 2 3; do for coll in sendrecv allreduce; do
  stamp "gdr write $coll round $round"; timeout 120 build/bench/ridge-bench $coll -np 2 -b 64M -e 64M -n 8 -w 2 -c 0 --gdr-mode write 2>&1 | grep -E "^ +67108864|wrong"
  stamp "plain net $coll round $round"; RIDGE_NET=softnic RIDGE_SHM=0 timeout 120 build/bench/ridge-bench $coll -np 2 -b 64M -e 64M -n 8 -w 2 -c 0 2>&1 | grep -E "^ +67108864|wrong"
done; done; } > "$OUT"/gdr.txt 2>&1
cd /
{ for i in 1 2; do for b in "$BASE" "$HERE"; do stamp "issue2 $b round $i"; timeout 300 "$b"/build/bench/ridge-bench allreduce -np 2 -b 1K -e 64M -f 4 --peer mpi 2>&1 | grep -v "row .*/"; done; done; } > "$OUT"/issue2.txt 2>&1
{ for b in "$BASE" "$HERE"; do stamp "issue5 $b"; (cd "$b" && ROUNDS=1 STREAM_SECONDS=1 timeout 400 bench/netns_allreduce.sh build -b 64K -e 64M -f 4 -n 10 -w 3 2>&1 | grep -v "row .*/"); done; } > "$OUT"/issue5.txt 2>&1
cd "$HERE"
{ stamp "issue21"; ROUNDS=3 timeout 900 bench/micro/host_vs_mpi.sh build 2>&1; } > "$OUT"/issue21.txt 2>&1
echo "outputs in $OUT"
