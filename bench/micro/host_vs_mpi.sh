#!/usr/bin/env bash
# Every host collective against Open MPI on 2 ranks of this machine (issue 21): one
# ridge-bench run per collective, `--peer mpi` (Ridge and MPI interleaved per size on the
# same buffers), ROUNDS sweeps of the sizes in that run (-N), then per size the medians over
# the rounds of Ridge's and MPI's out-of-place time, their ratio (Ridge / MPI time: <= 1 is
# at least as fast), Ridge's bound% and the wrong-value counts. With -I 1 each row also has
# the fastest single iteration of each side: on a shared, loaded machine a call that lost
# its core counts in the mean time of a row but not in its minimum, so the ratio of the
# minima (and bound% at the minimum) says what the algorithms cost when they run.
#
#   bench/micro/host_vs_mpi.sh [build-dir] [collective...]
# Environment: ROUNDS (default 3), SIZES (ridge-bench -b/-e/-f, default "-b 64K -e 16M -f 4"),
# ITERS (default "-n 20 -w 5").
set -euo pipefail
build=${1:-build}
shift || true
colls=("$@")
[ ${#colls[@]} -gt 0 ] || colls=(allreduce allgather broadcast reduce reducescatter alltoall sendrecv)
rounds=${ROUNDS:-3}
sizes=${SIZES:--b 64K -e 16M -f 4}
iters=${ITERS:--n 20 -w 5 -I 1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for c in "${colls[@]}"; do
  # shellcheck disable=SC2086
  "$build/bench/ridge-bench" "$c" -np 2 $sizes $iters -N "$rounds" --peer mpi --csv "$dir/$c.csv" >"$dir/$c.out" 2>&1 ||
    { echo "ridge-bench $c failed:"; tail -5 "$dir/$c.out"; }
done
echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$dir" "${colls[@]}" <<'PY'
import csv, statistics, sys
d, colls = sys.argv[1], sys.argv[2:]
print("| collective | size | Ridge/MPI time, median of rounds | per round | Ridge/MPI fastest iteration, median of rounds | Ridge bound% (mean; fastest) | #wrong Ridge, MPI |")
print("|---|---:|---:|---|---:|---:|---|")
for c in colls:
    try:
        rows = list(csv.DictReader(open(f"{d}/{c}.csv")))
    except OSError:
        continue
    for size in sorted({int(r["size"]) for r in rows}):
        rs = [r for r in rows if int(r["size"]) == size]
        f = lambda k: [float(r[k]) for r in rs if r.get(k) not in (None, "", "n/a")]
        t, m, b = f("time_us"), f("mpi_time_us"), f("bound_pct")
        tmin, mmin = f("i_min_us"), f("mpi_i_min_us")
        if not t or not m:
            continue
        med = statistics.median
        per = ", ".join(f"{x / y:.2f}" for x, y in zip(t, m))
        fast = f"{med([x / y for x, y in zip(tmin, mmin)]):.2f}" if tmin and mmin else "-"
        bound = f"{med(b):.0f}; {med([x * y / z for x, y, z in zip(b, t, tmin)]):.0f}" if b and tmin else "-"
        wrong = f"{sum(f('wrong')):.0f}, {sum(f('mpi_wrong')):.0f}"
        print(f"| {c} | {size} | {med(t) / med(m):.2f} | {per} | {fast} | {bound} | {wrong} |")
PY
