#!/usr/bin/env bash
# The test suite under load (docs/testing.md): the README's test run (ctest over a build)
# N times with load beside it, and `ctest --repeat until-fail:N` over the suites that use
# threads, processes, timeouts or streams. Builds nothing: give it a build directory.
#
#   tests/stress.sh [options] BUILD_DIR
#
# Options (defaults in brackets):
#   --passes N        full-suite passes, the README's ctest run [3]; 0 skips them
#   --repeat N        until-fail count for the concurrency suites [50]
#   --group-repeat N  until-fail count for the LL group tests [150]
#   --suites LIST     comma list of concurrency suites, from: ll, stream, p2p, bootstrap,
#                     coll, socket, net [ll,stream,p2p,bootstrap]; "none" skips them
#   --load LIST       comma list of load shapes, from: yes (two `yes > /dev/null` writers),
#                     mem (a memory-bandwidth hog), fork (a fork/exec loop) [yes]; "none": none
#   --scale F         RIDGE_TEST_TIME_SCALE for the tests [4]
#   --jobs N          ctest -j for the concurrency suites (tests that wait on timeouts leave
#                     the CPU idle; more load, not less) [1]; full passes run serially
#   --budget SEC      bound on the whole run; what is left is stopped and counted [10800]
#   --log FILE        where the summary goes [BUILD_DIR/stress-summary.txt]
#
# Exit 0 when every step passed, 1 when one failed or ran out of budget, 2 on bad usage.
# Every load process is killed on exit, whatever ends the script (trap).
set -uo pipefail

usage() {
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

passes=3
repeat=50
group_repeat=150
suites=ll,stream,p2p,bootstrap
load=yes
scale=4
jobs=1
budget=10800
log=
build=

while [ $# -gt 0 ]; do
  case "$1" in
    --passes) passes=${2:?}; shift 2 ;;
    --repeat) repeat=${2:?}; shift 2 ;;
    --group-repeat) group_repeat=${2:?}; shift 2 ;;
    --suites) suites=${2:?}; shift 2 ;;
    --load) load=${2:?}; shift 2 ;;
    --scale) scale=${2:?}; shift 2 ;;
    --jobs) jobs=${2:?}; shift 2 ;;
    --budget) budget=${2:?}; shift 2 ;;
    --log) log=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "stress.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$build" ] || usage; build=$1; shift ;;
  esac
done
[ -n "$build" ] || usage
for n in "$passes" "$repeat" "$group_repeat" "$budget" "$jobs"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "stress.sh: not a count: $n" >&2; exit 2; }
done
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "stress.sh: $build is not a configured and built CMake build directory (no CTestTestfile.cmake)" >&2
  exit 2
fi
log=${log:-$build/stress-summary.txt}

# The concurrency suites, as ctest regular expressions over the test names.
suite_regex() {
  case "$1" in
    ll) echo '^device\.ll\.' ;;
    # The stream-ordered device tests (device.<Suite>.*, the staged run), not LL/P2P/GDR.
    stream) echo '^device\.[A-Z]|^device-staged\.' ;;
    p2p) echo '^p2p\.|^device\.(gdr|dataops)\.' ;;
    bootstrap) echo '^Bootstrap' ;;
    coll) echo '^coll\.(group|fault)\.' ;;
    socket) echo '^socket\.' ;;
    net) echo '^(net|gdr|softnic)\.netns\.' ;;
    *) return 1 ;;
  esac
}
if [ "$suites" != none ]; then
  for s in ${suites//,/ }; do
    suite_regex "$s" >/dev/null || { echo "stress.sh: unknown suite $s" >&2; exit 2; }
  done
fi

# ---- load ------------------------------------------------------------------------------
load_pids=()
stop_load() {
  local pid
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${load_pids[@]}"; do wait "$pid" 2>/dev/null; done
  load_pids=()
}
trap stop_load EXIT
trap 'stop_load; exit 130' INT
trap 'stop_load; exit 143' TERM

start_load() {
  local shape
  [ "$load" = none ] && return 0
  for shape in ${load//,/ }; do
    case "$shape" in
      yes)  # two CPU-bound writers, each a syscall per 8 KiB: the shape that exposed issue 23
        yes > /dev/null & load_pids+=($!)
        yes > /dev/null & load_pids+=($!) ;;
      mem)  # 64 MiB blocks out of /dev/zero: the kernel clears a buffer far larger than the caches
        dd if=/dev/zero of=/dev/null bs=64M status=none & load_pids+=($!) ;;
      fork)  # a process that forks and execs without pause: scheduler and page-table churn
        bash -c 'while :; do /bin/true; done' & load_pids+=($!) ;;
      *) echo "stress.sh: unknown load shape $shape" >&2; exit 2 ;;
    esac
  done
}

# ---- steps -----------------------------------------------------------------------------
export RIDGE_TEST_TIME_SCALE=$scale
start=$(date +%s)
deadline=$((start + budget))
failed=0
summary=()

# run_step NAME ctest-args...: one ctest call, bounded by what is left of the budget.
run_step() {
  local name=$1
  shift
  local left=$((deadline - $(date +%s)))
  if [ "$left" -le 10 ]; then
    summary+=("$name: NOT RUN (budget spent)")
    failed=1
    return
  fi
  local t0 rc
  t0=$(date +%s)
  echo "== $name: ctest $* (budget left ${left}s)"
  timeout --kill-after=30 "$left" ctest --test-dir "$build" --output-on-failure "$@"
  rc=$?
  local took=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then
    summary+=("$name: passed (${took}s)")
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    summary+=("$name: STOPPED at the budget (${took}s)")
    failed=1
  else
    summary+=("$name: FAILED, ctest exit $rc (${took}s)")
    failed=1
  fi
}

start_load
echo "stress.sh: load [$load] (pids ${load_pids[*]:-none}), RIDGE_TEST_TIME_SCALE=$scale, budget ${budget}s"

if [ "$suites" != none ]; then
  for s in ${suites//,/ }; do
    run_step "suite $s x$repeat" -j "$jobs" -R "$(suite_regex "$s")" --repeat "until-fail:$repeat"
    if [ "$s" = ll ] && [ "$group_repeat" -gt "$repeat" ]; then
      run_step "LL group tests x$group_repeat" -j "$jobs" -R '^device\.ll\.LLCollectives\.Group' \
        --repeat "until-fail:$group_repeat"
    fi
  done
fi

for ((p = 1; p <= passes; ++p)); do
  # The README's test run (run.sh test): every test, 900 s per test at most.
  run_step "full suite pass $p/$passes" --timeout 900
done

stop_load
{
  echo "stress.sh $(date -u '+%Y-%m-%d %H:%M UTC'): build $build, load [$load], RIDGE_TEST_TIME_SCALE=$scale"
  echo "  passes $passes, repeat $repeat (ctest -j $jobs), LL group repeat $group_repeat, suites [$suites]"
  printf '  %s\n' "${summary[@]}"
  echo "  total $(($(date +%s) - start))s: $([ "$failed" -eq 0 ] && echo "all passed" || echo "FAILURES")"
} | tee "$log"
exit "$failed"
