#!/usr/bin/env bash
# Ridge over TCP between two "hosts" on one machine, against Gloo and a plain socket stream,
# all in the same run:
#   1. two network namespaces joined by a bridge in a third (10.231.2.1 and 10.231.2.2 on
#      interface rdg0; nothing attached to the initial namespace), each rank also in its
#      own IPC namespace (unshare --ipc), so Ridge sees two hosts and uses its socket
#      transport;
#   2. ridge-bench COLL, one rank per namespace, with --peer gloo: per size Ridge, then
#      Gloo, on the same buffers (ratio column);
#   3. ridge-socket-stream between the same namespaces, both directions at once, before
#      the benchmark and after each round: the ceiling for a 2-rank allreduce's busbw, and
#      each round is compared with the streams right before and after it. Twice each time:
#      from and into one cached 1 MiB buffer per thread (as iperf3), and walking through
#      STREAM_WALK bytes per thread (default 32M: the 2 x 2 threads of a side then touch
#      2 x 64 MiB, what a rank of a 64 MiB allreduce touches), so that the kernel copies
#      from and into memory that is not cached, as they must for a large collective;
#   4. with the streams, ridge-minimal-tcp-allreduce (the plainest two-rank ring allreduce
#      on one connection: what any implementation must at least do) at MINIMAL_BYTES
#      (default 64M; MINIMAL=0 skips it), so that Ridge is also compared with an allreduce
#      that pays the same dependencies and memory traffic;
#   5. everything is removed on exit, also after a failure or Ctrl-C; namespaces left by
#      an earlier run that was killed are swept first.
#
#   [COLL=...] [ROUNDS=N] bench/netns_allreduce.sh [build-dir] [ridge-bench options...]
# COLL: one collective (default allreduce), several separated by spaces or commas, or
# "all": every collective Gloo has a counterpart for (allreduce allgather broadcast reduce
# reducescatter alltoall sendrecv). Default options: -b 1K -e 64M -f 4 -n 20 -w 5.
# Environment: RIDGE_* settings pass through (e.g. RIDGE_SOCKET_STREAMS=4); STREAM_SECONDS
# (default 3) for the socket stream, STREAM_WALK (default 32M) for its uncached variant.
# ROUNDS (default 1) repeats the benchmark: each round runs every collective once (so the
# rounds of a collective are spread over the whole run, and a burst of load on the shared
# machine hits one round of several collectives rather than every round of one), with the
# streams after each round. With ROUNDS > 1 the script ends with, per collective and size,
# the medians over the rounds of Ridge's and Gloo's times, their ratio (Ridge / Gloo time:
# at most 1 is at least as fast; in place too where Gloo has it), the ratio of each side's
# fastest iteration when the options include -I 1, the wrong-value counts and a verdict per
# row, then whether every row is at most Gloo's time with no wrong value (issue 21), and for
# allreduce the share of the streams. One command for issue 21's table
# (docs/performance.md):
#   COLL=all ROUNDS=3 MINIMAL=0 STREAM_SECONDS=1 bench/netns_allreduce.sh build -b 64K -e 16M -f 4 -n 10 -w 3 -I 1
# Needs root (CAP_NET_ADMIN) and iproute2.
set -euo pipefail
build=${1:-build}
shift || true
opts=("$@")
[ ${#opts[@]} -eq 0 ] && opts=(-b 1K -e 64M -f 4 -n 20 -w 5)
bench="$build/bench/ridge-bench"
stream="$build/bench/ridge-socket-stream"
minimal="$build/bench/ridge-minimal-tcp-allreduce"
for b in "$bench" "$stream" "$minimal"; do
  [ -x "$b" ] || { echo "netns_allreduce: $b is missing; build ridge-bench and ridge-socket-stream" >&2; exit 2; }
done
if [ "$(id -u)" != 0 ]; then
  echo "netns_allreduce: needs root (CAP_NET_ADMIN) for ip netns" >&2
  exit 2
fi

prefix="rdgb$$_"
hub="${prefix}h"
ns=("${prefix}n0" "${prefix}n1")
addr=(10.231.2.1 10.231.2.2)
store=$(mktemp -d /tmp/ridge-netns-gloo-XXXXXX)
csvdir=$(mktemp -d /tmp/ridge-netns-csv-XXXXXX)

cleanup() {
  set +e
  for n in "${ns[@]}" "$hub"; do
    # Stop whatever still runs in the namespace (bounded: one round of SIGKILL).
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$n" 2>/dev/null
  done
  rm -rf "$store" "$csvdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Sweep namespaces of earlier runs whose script is gone.
for n in $(ip netns list | awk '{print $1}' | grep '^rdgb' || true); do
  pid=${n#rdgb}; pid=${pid%%_*}
  if ! kill -0 "$pid" 2>/dev/null; then
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  fi
done

ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for i in 0 1; do
  ip netns add "${ns[$i]}"
  ip -n "$hub" link add "p$i" type veth peer name rdg0 netns "${ns[$i]}"
  ip -n "$hub" link set "p$i" master br0
  ip -n "$hub" link set "p$i" up
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev rdg0
  ip -n "${ns[$i]}" link set rdg0 up
  ip -n "${ns[$i]}" link set lo up
done

run_in() {  # run_in <namespace index> <command...>: in that netns and a fresh IPC namespace
  local i=$1
  shift
  ip netns exec "${ns[$i]}" unshare --ipc "$@"
}

secs=${STREAM_SECONDS:-3}
minimal_bytes=${MINIMAL_BYTES:-64M}
case "$minimal_bytes" in
  *K) minimal_bytes=$((${minimal_bytes%K} << 10)) ;;
  *M) minimal_bytes=$((${minimal_bytes%M} << 20)) ;;
  *G) minimal_bytes=$((${minimal_bytes%G} << 30)) ;;
esac
walk=${STREAM_WALK:-32M}
case "$walk" in
  *K) walk=$((${walk%K} << 10)) ;;
  *M) walk=$((${walk%M} << 20)) ;;
  *G) walk=$((${walk%G} << 30)) ;;
esac
streams=${RIDGE_SOCKET_STREAMS:-2}
run_stream() {  # the ceiling; run before and after the benchmark to bracket its drift
  local w line
  for w in 0 "$walk"; do
    echo "# plain socket stream ($1), both directions at once, $streams streams, ${secs} s, $([ "$w" = 0 ] && echo "cached buffers" || echo "walking $w bytes per thread"):"
    run_in 1 timeout 120 "$stream" server "${addr[1]}:29600" -s "$streams" -t "$secs" -w "$w" >/dev/null &
    local srv=$!
    line=$(run_in 0 timeout 120 "$stream" client "${addr[1]}:29600" -s "$streams" -t "$secs" -w "$w")
    wait "$srv"
    echo "#   $line"
    echo "${line##*= }" | awk -v w="$w" -v i="$2" '{print i, (w == 0 ? "hot" : "cold"), $1}' >>"$csvdir/stream"
  done
  if [ "${MINIMAL:-1}" != 0 ]; then
    run_in 1 timeout 120 "$minimal" client "${addr[0]}:29601" -b "$minimal_bytes" >/dev/null &
    local cli=$!
    line=$(run_in 0 timeout 120 "$minimal" server "${addr[0]}:29601" -b "$minimal_bytes")
    wait "$cli"
    echo "# $line"
    echo "$line" | sed -n 's/.*busbw \([0-9.]*\) GB.*/\1/p' | awk -v i="$2" '{print i, "minimal", $1}' >>"$csvdir/stream"
  fi
}

case "${COLL:-allreduce}" in
  all) colls=(allreduce allgather broadcast reduce reducescatter alltoall sendrecv) ;;
  *) read -r -a colls <<<"${COLL//,/ }" ;;
esac
[ ${#colls[@]} -gt 0 ] || { echo "netns_allreduce: COLL names no collective" >&2; exit 2; }
rounds=${ROUNDS:-1}
echo "# netns_allreduce: 2 ranks in namespaces ${ns[0]} (${addr[0]}) and ${ns[1]} (${addr[1]}), $(nproc) cores"
echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg); Ridge $(git -C "$(dirname "$0")" describe --always --dirty 2>/dev/null || echo '?')"
run_stream before 0
echo "# command: RIDGE_SOCKET_IFNAME==rdg0 $bench COLL ${opts[*]} --peer gloo (one rank per namespace), COLL: ${colls[*]}, $rounds round(s)"
export RIDGE_SOCKET_IFNAME==rdg0 RIDGE_WORLD_SIZE=2 RIDGE_ROOT_ADDR="${addr[0]}:29500"
export RIDGE_BENCH_GLOO_IFACE=rdg0
failed=0
for ((round = 0; round < rounds; round++)); do
  for c in "${colls[@]}"; do
    # Gloo's file store must start empty every time.
    export RIDGE_BENCH_GLOO_STORE="$store/$round-$c"
    mkdir -p "$RIDGE_BENCH_GLOO_STORE"
    out="$csvdir/$round-$c.out"
    RIDGE_RANK=1 run_in 1 timeout 900 "$bench" "$c" "${opts[@]}" --peer gloo >/dev/null 2>&1 &
    peer=$!
    rc=0
    RIDGE_RANK=0 run_in 0 timeout 900 "$bench" "$c" "${opts[@]}" --peer gloo --csv "$csvdir/$round-$c.csv" >"$out" 2>&1 || rc=$?
    wait "$peer" || { r=$?; [ "$rc" != 0 ] || rc=$r; }
    if [ "$rc" != 0 ]; then
      failed=1
      echo "# round $((round + 1)) $c: ridge-bench failed ($rc):"
      tail -5 "$out" | sed 's/^/#   /'
    elif [ "$round" = 0 ] && [ ${#colls[@]} = 1 ]; then
      cat "$out"
    else
      echo "# round $((round + 1)) $c: $(grep -h 'Avg ratio' "$out" | sed 's/^# *//')"
    fi
  done
  # Between rounds too, so that each round's share is taken against the streams measured
  # right before and after it (the load of a shared machine drifts within a run).
  run_stream "after round $((round + 1))" $((round + 1)) | { if [ "$round" = $((rounds - 1)) ]; then cat; else cat >/dev/null; fi; }
done
echo "# $(date -u +%FT%TZ) load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$rounds" -gt 1 ]; then
  # Medians over the rounds; each round already interleaves Ridge and Gloo per size.
  python3 - "$csvdir" "$rounds" "${colls[@]}" <<'PY'
import csv, os, statistics, sys
d, n, colls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
streams = {}  # (kind, index) -> GB/s; stream i ran before round i, i + 1 after it
with open(f"{d}/stream") as f:
    for idx, kind, rate in (l.split() for l in f if l.strip()):
        streams[(kind, int(idx))] = float(rate)
bracket = lambda kind, i: (streams[(kind, i)] + streams[(kind, i + 1)]) / 2
def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return str(b)
def num(r, k):
    v = r.get(k)
    return float(v) if v not in (None, "", "n/a") else None
# Issue 21's acceptance: per row, Ridge's median time at most Gloo's (out of place, and in
# place where Gloo has an in-place form), and no wrong value on either side.
print(f"# medians over {n} rounds; times in us (out of place); ratios are Ridge / Gloo time (at most 1: Ridge at least as fast);")
print("# 'per round' and 'fastest iteration' out of place, or in place where Gloo has only that form")
print("| collective | size | Ridge us | Gloo us | Ridge/Gloo | per round | in place Ridge/Gloo | fastest iteration Ridge/Gloo | #wrong Ridge, Gloo | verdict |")
print("|---|---:|---:|---:|---:|---|---:|---:|---|---|")
total, behind, wrong_total, allreduce_rows = 0, [], 0, {}
for c in colls:
    rows = {}
    for i in range(n):
        path = f"{d}/{i}-{c}.csv"
        if not os.path.exists(path):
            continue
        for r in csv.DictReader(open(path)):
            rows.setdefault((int(r["size"]), r["type"], r["redop"]), []).append(r)
    if not rows:
        print(f"| {c} | - | - | - | - | - | - | - | - | no result |")
        behind.append(f"{c} (no result)")
        continue
    if not any(num(r, k) is not None for rs in rows.values() for r in rs for k in ("gloo_time_us", "gloo_ip_time_us")):
        print(f"| {c} | - | - | - | - | - | - | - | - | Gloo has no counterpart |")
        continue
    several = len({(k[1], k[2]) for k in rows}) > 1
    for key in sorted(rows):
        rs = rows[key]
        col = lambda k: [x for x in (num(r, k) for r in rs) if x is not None]
        t, g, ti, gi = col("time_us"), col("gloo_time_us"), col("ip_time_us"), col("gloo_ip_time_us")
        ratio = med(t) / med(g) if t and g else None
        ipratio = med(ti) / med(gi) if ti and gi else None
        if ratio is None and ipratio is None:
            continue
        total += 1
        if c == "allreduce":
            allreduce_rows[key[0]] = [num(r, "busbw") for r in rs]
        # Per round and at the fastest iteration: out of place, or in place where Gloo has
        # only that form (reduce-scatter).
        pre = "" if ratio is not None else "ip_"
        a, b = col(pre + "time_us"), col(f"gloo_{pre}time_us")
        per = ", ".join(f"{x / y:.2f}" for x, y in zip(a, b))
        tmin, gmin = col(pre + "i_min_us"), col(f"gloo_{pre}i_min_us")
        fast = f"{med([x / y for x, y in zip(tmin, gmin)]):.2f}" if tmin and gmin else "-"
        wr = sum(col("wrong")) + sum(col("ip_wrong"))
        wg = sum(col("gloo_wrong")) + sum(col("gloo_ip_wrong"))
        wrong_total += wr + wg
        ok = wr + wg == 0 and all(x is None or x <= 1.0 for x in (ratio, ipratio))
        name = f"{c} ({key[1]}, {key[2]})" if several else c
        fmt = lambda x: "n/a" if x is None else f"{x:.2f}"
        if not ok:
            why = ", ".join(f"{w} {x:.2f}x" for w, x in (("out of place", ratio), ("in place", ipratio)) if x is not None)
            behind.append(f"{name} {human(key[0])} ({why}" + (", wrong values" if wr + wg else "") + ")")
        us = lambda v: f"{med(v):.0f}" if v else "n/a"
        times = f"{us(t)} | {us(g)}" if ratio is not None else f"{us(ti)} (in place) | {us(gi)} (in place)"
        print(f"| {name} | {human(key[0])} | {times} | {fmt(ratio)} | {per} | {fmt(ipratio)} | {fast} | "
              f"{wr:.0f}, {wg:.0f} | {'ok' if ok else 'BEHIND'} |")
print()
print(f"# rows: {total}; Ridge at most Gloo's time: {total - len(behind)}; #wrong in all: {wrong_total:.0f}")
print("# acceptance (issue 21, TCP): " + ("MET" if not behind and total else "NOT MET: " + "; ".join(behind)))
print("# streams per round (mean of the ones before and after it), GB/s, cached / uncached: " +
      "  ".join("%.2f/%.2f" % (bracket("hot", i), bracket("cold", i)) for i in range(n)))
big = sorted(s for s in allreduce_rows if s >= 16 << 20)
if big:
    print("# allreduce: Ridge out-of-place busbw per round from 16 MiB up, as % of that round's cached / uncached stream:")
    for size in big:
        print("%10d  " % size + "  ".join("%3.0f/%3.0f %%" % (x / bracket("hot", i) * 100, x / bracket("cold", i) * 100)
                                         for i, x in enumerate(allreduce_rows[size])))
    if all(("minimal", i) in streams for i in range(n + 1)):
        print("# minimal ring allreduce per round (mean of the ones before and after it), GB/s: " +
              "  ".join("%.2f" % bracket("minimal", i) for i in range(n)))
        print("# allreduce: Ridge out-of-place busbw per round from 16 MiB up, as % of that round's minimal ring allreduce:")
        for size in big:
            print("%10d  " % size + "  ".join("%4.0f %%" % (x / bracket("minimal", i) * 100)
                                             for i, x in enumerate(allreduce_rows[size])))
PY
fi
exit "$failed"
