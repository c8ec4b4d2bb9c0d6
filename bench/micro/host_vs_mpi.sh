#!/usr/bin/env bash
# Every host collective against Open MPI on 2 ranks of this machine (issue 21): one
# ridge-bench run per collective, `--peer mpi` (Ridge and MPI interleaved per size on the
# same buffers), ROUNDS sweeps of the sizes in that run (-N), then per size the medians over
# the rounds of Ridge's and MPI's out-of-place time, their ratio (Ridge / MPI time: <= 1 is
# at least as fast), Ridge's bound% and the wrong-value counts. With -I 1 each row also has
# the fastest single iteration of each side: on a shared, loaded machine a call that lost
# its core counts in the mean time of a row but not in its minimum, so the ratio of the
# minima (and bound% at the minimum) says what the algorithms cost when they run.
# Each row ends with the verdict of issue 21's acceptance (at most Open MPI's median time, or
# at most 1.05x where both sit at the memory-copy bound, and no wrong value), and the last
# lines say whether every row met it. The integrator's command (docs/performance.md):
#   ROUNDS=3 bench/micro/host_vs_mpi.sh build
#
#   bench/micro/host_vs_mpi.sh [build-dir] [collective...]
# Environment: ROUNDS (default 3), SIZES (ridge-bench -b/-e/-f, default "-b 64K -e 16M -f 4"),
# ITERS (default "-n 20 -w 5 -I 1"), REGISTER (ridge-bench -R, default 0). REGISTER=2 (-R 2,
# symmetric, as nccl-tests' -R 2 allocates with ncclMemAlloc) allocates the buffers with
# ridgeMemAlloc, whose host memory a peer of this host maps once and copies with plain loads
# and stores instead of a cross-memory-attach call per access (issue 21), and registers them;
# Open MPI's variant runs on the same buffers. REGISTER=1 only registers them.
set -euo pipefail
build=${1:-build}
shift || true
colls=("$@")
[ ${#colls[@]} -gt 0 ] || colls=(allreduce allgather broadcast reduce reducescatter alltoall sendrecv)
rounds=${ROUNDS:-3}
sizes=${SIZES:--b 64K -e 16M -f 4}
iters=${ITERS:--n 20 -w 5 -I 1}
register=${REGISTER:-0}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg); Ridge $(git -C "$(dirname "$0")" describe --always --dirty 2>/dev/null || echo '?'), $(nproc) cores"
echo "# ridge-bench COLL -np 2 $sizes $iters -R $register -N $rounds --peer mpi"
for c in "${colls[@]}"; do
  # shellcheck disable=SC2086
  "$build/bench/ridge-bench" "$c" -np 2 $sizes $iters -R "$register" -N "$rounds" --peer mpi --csv "$dir/$c.csv" >"$dir/$c.out" 2>&1 ||
    { echo "ridge-bench $c failed:"; tail -5 "$dir/$c.out"; }
  # The load each collective ran under: on a shared machine a row is only as quiet as this.
  echo "# $c done $(date -u +%TZ), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$dir" "${colls[@]}" <<'PY'
import csv, statistics, sys
d, colls = sys.argv[1], sys.argv[2:]
med = statistics.median
# The acceptance of issue 21: every row at most Open MPI's time (median over the rounds of
# each side's mean time), or at most 1.05x where both sides sit at the memory-copy bound
# (bound% of both at least 90 at the median time; MPI's bound% is Ridge's scaled by the time
# ratio, as both move the same bytes against the same bound), and no wrong value anywhere.
print("| collective | size | Ridge/MPI time, median of rounds | per round | Ridge/MPI fastest iteration, median of rounds | bound% Ridge; MPI (median time) | Ridge bound% at its fastest | #wrong Ridge, MPI | verdict |")
print("|---|---:|---:|---|---:|---:|---:|---|---|")
rows_total, behind, wrong_total = 0, [], 0
for c in colls:
    try:
        rows = list(csv.DictReader(open(f"{d}/{c}.csv")))
    except OSError:
        print(f"| {c} | - | - | - | - | - | - | - | no result |")
        behind.append(f"{c} (no result)")
        continue
    for size in sorted({int(r["size"]) for r in rows}):
        rs = [r for r in rows if int(r["size"]) == size]
        f = lambda k: [float(r[k]) for r in rs if r.get(k) not in (None, "", "n/a")]
        t, m, b = f("time_us"), f("mpi_time_us"), f("bound_pct")
        tmin, mmin = f("i_min_us"), f("mpi_i_min_us")
        if not t or not m:
            continue
        rows_total += 1
        ratio = med(t) / med(m)
        per = ", ".join(f"{x / y:.2f}" for x, y in zip(t, m))
        fast = f"{med([x / y for x, y in zip(tmin, mmin)]):.2f}" if tmin and mmin else "-"
        # bound% is proportional to 1 / time: at the median time, and at the fastest iteration.
        bmed = med([x * y for x, y in zip(b, t)]) / med(t) if b else None
        bmpi = bmed * med(t) / med(m) if bmed is not None else None
        bounds = f"{bmed:.0f}; {bmpi:.0f}" if bmed is not None else "-"
        bfast = f"{med([x * y / z for x, y, z in zip(b, t, tmin)]):.0f}" if b and tmin else "-"
        nwrong = sum(f("wrong")) + sum(f("mpi_wrong"))
        wrong_total += nwrong
        # At the memory-copy bound: both within 10 % of it (sizes in cache run far above it
        # and are held to MPI's time).
        at_bound = bmed is not None and 90 <= bmed <= 110 and 90 <= bmpi <= 110
        ok = nwrong == 0 and (ratio <= 1.0 or (at_bound and ratio <= 1.05))
        verdict = "ok" if ok else "BEHIND"
        if ratio > 1.0 and ok:
            verdict = "ok (both at the bound)"
        if not ok:
            behind.append(f"{c} {size} ({ratio:.2f}x" + (", wrong values" if nwrong else "") + ")")
        wrong = f"{sum(f('wrong')):.0f}, {sum(f('mpi_wrong')):.0f}"
        print(f"| {c} | {size} | {ratio:.2f} | {per} | {fast} | {bounds} | {bfast} | {wrong} | {verdict} |")
print()
print(f"# rows: {rows_total}; at most Open MPI's time (or 1.05x at the bound): {rows_total - len(behind)}; "
      f"#wrong in all: {wrong_total:.0f}")
print("# acceptance (issue 21): " + ("MET" if not behind and rows_total else "NOT MET: " + "; ".join(behind)))
PY
