#!/usr/bin/env bash
# Measures where one allreduce algorithm overtakes another on this machine: runs
# ridge-bench with each algorithm forced (RIDGE_ALGO through --algo) over the same sizes,
# several rounds interleaved so that drift hits every algorithm alike, and prints the
# median out-of-place and in-place time per size and algorithm.
#   bench/crossover.sh [build-dir] [nranks] [rounds] [collective]
set -euo pipefail
build=${1:-build}; np=${2:-2}; rounds=${3:-3}; coll=${4:-allreduce}
algos=(allpairs ring direct)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# Ranks pinned one per core, as in the acceptance run (--peer mpi binds to cores), when
# mpiexec is there and the cores suffice: forked ranks are not pinned, and on the AMD host
# of docs/performance.md that alone made the ring 4x slower at 16 MiB and changed the
# winner. CROSSOVER_PIN=0 forks unpinned ranks as before.
launch=("$build/bench/ridge-bench" "$coll" -np "$np")
if [[ ${CROSSOVER_PIN:-1} != 0 ]] && command -v mpiexec >/dev/null && ((np <= $(nproc))); then
  launch=(mpiexec --bind-to core -np "$np" "$build/bench/ridge-bench" "$coll")
  if [[ $(id -u) == 0 ]]; then launch=(mpiexec --allow-run-as-root "${launch[@]:1}"); fi
fi
echo "# ranks launched with: ${launch[*]}"
for ((i = 0; i < rounds; i++)); do
  for a in "${algos[@]}"; do
    "${launch[@]}" -b 4K -e 64M -f 4 -n 30 -w 5 --algo "$coll:0-:$a" --csv "$tmp/$a.$i.csv" >/dev/null
  done
done
python3 - "$tmp" "$rounds" "${algos[@]}" <<'PY'
import csv, statistics, sys
tmp, rounds, algos = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
t = {}
for a in algos:
    for i in range(rounds):
        with open(f"{tmp}/{a}.{i}.csv") as f:
            for row in csv.DictReader(f):
                size = int(row["size"])
                t.setdefault((a, size), ([], []))
                t[(a, size)][0].append(float(row["time_us"]))
                t[(a, size)][1].append(float(row["ip_time_us"]))
sizes = sorted({s for (_, s) in t})
print("# median time (us) over %d rounds; best per placement marked *" % rounds)
print("%10s " % "bytes" + " ".join("%16s" % (a + " oop/ip") for a in algos))
for s in sizes:
    oop = {a: statistics.median(t[(a, s)][0]) for a in algos if (a, s) in t}
    ip = {a: statistics.median(t[(a, s)][1]) for a in algos if (a, s) in t}
    bo, bi = min(oop, key=oop.get), min(ip, key=ip.get)
    cells = ["%7.1f%s/%7.1f%s" % (oop[a], "*" if a == bo else " ", ip[a], "*" if a == bi else " ") for a in algos]
    print("%10d " % s + " ".join(cells))
PY
