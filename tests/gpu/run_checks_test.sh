#!/usr/bin/env bash
# Checks of tests/gpu/run_checks.sh, the GPU runner, that need no GPU (ctest gpu.runner.*,
# gpu.pack.dry_run):
#   run_checks_test.sh no-device     stub binaries, no device: every step "skipped: no CUDA
#                                    device", exit 3, within seconds
#   run_checks_test.sh fake-gpu      a stub nvidia-smi lists a GPU: every step runs, a failing
#                                    one is FAILED, the figures reach the report, exit 1
#   run_checks_test.sh budget        a step that hangs is cut at the budget (TIMED OUT), the
#                                    later ones are NOT RUN, each still with its report line
#   run_checks_test.sh pack-dry-run  the prebuilt pack (.gpupack, tests/gpu/pack.sh) run here
#                                    without a device: every step skipped, every binary loads;
#                                    exit 77 (skipped) when there is no pack
# The stubs stand for the binaries (found by the names `run_checks.sh --list-binaries` gives)
# and print what the runner parses (gtest's test list, ridge-gpu-kernel-bw's rows,
# ridge-bench's CSV, a "figure:" line).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner="$here/run_checks.sh"
case_name=${1:?usage: run_checks_test.sh no-device|fake-gpu|budget|pack-dry-run}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

# expect_every_step REPORT PATTERN [RUNNER]: each step's label has exactly one report line,
# and that line contains PATTERN (an extended regex; empty: any outcome).
expect_every_step() {
  local report=$1 pattern=$2 list=${3:-$runner} label lines n
  while IFS= read -r label; do
    lines=$(awk -v p="$label: " 'index($0, p) == 1' "$report")
    n=$(grep -c . <<<"$lines")
    [ "$n" -eq 1 ] || fail "'$label' has $n report lines"
    [ -z "$pattern" ] || grep -qE "$pattern" <<<"$lines" || fail "'$lines' (expected /$pattern/)"
  done < <("$list" --list-steps)
}

make_stubs() {
  mkdir -p "$tmp/bin"
  cat >"$tmp/stub" <<'STUB'
#!/usr/bin/env bash
me=$(basename "$0")
if [ "${1:-}" = --gtest_list_tests ]; then
  printf 'Stub.\n  First\n  Second\n'
  exit 0
fi
case " ${STUB_HANG:-} " in *" $me "*) exec sleep 60 ;; esac
case " ${STUB_FAIL:-} " in *" $me "*) echo "$me: failing as told"; exit 1 ;; esac
case $me in
  ridge-gpu-kernel-bw)
    echo "kernel GB/s copy ratio"
    echo "sum/float32 3000.0 3200.0 0.938"
    echo "sum/bfloat16 2950.0 3200.0 0.922" ;;
  ridge-gpu-pcie-premise) echo "figure: PCIe write/read stub 2.00" ;;
  ridge-gdr-write-check) echo "doorbell-to-completion: 12.5 us per slot (stub)" ;;
  ridge-bench)
    case " $* " in
      *" --gdr-mode write "*)
        for r in 0 1; do
          echo "stub:1:r$r RIDGE INFO gdr: rank $r: device buffers: device-side post by the GPU kernel (gdrPostKernel)"
          echo "stub:1:r$r RIDGE INFO gdr: rank $r: closing: slotsWritten=130 doorbells=130 stagedLost=0 remoteReads=0 devicePosts=128"
        done ;;
    esac
    while [ $# -gt 0 ]; do
      if [ "$1" = --csv ]; then
        printf 'collective,nranks,size,busbw,wrong,ip_wrong,nccl_busbw,nccl_wrong,nccl_ip_wrong,ratio\n' >"$2"
        printf 'allreduce,4,1024,1.5,0,0,1.0,0,0,1.50\nallreduce,4,67108864,150,0,0,140,0,0,1.07\n' >>"$2"
      fi
      shift
    done ;;
esac
exit 0
STUB
  chmod +x "$tmp/stub"
  "$runner" --list-binaries | while read -r _ name; do cp "$tmp/stub" "$tmp/bin/$name"; done
  cat >"$tmp/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
case "${1:-}" in
  -L) echo "GPU 0: Stub GPU (UUID: GPU-0)" ;;
  --query-gpu=*) echo "Stub GPU, 0.0, 5, 16" ;;
esac
exit 0
SMI
  chmod +x "$tmp/nvidia-smi"
  : >"$tmp/libnccl.so.2"
}

case $case_name in
  no-device)
    make_stubs
    t0=$SECONDS
    GPU_CHECKS_NVIDIA_SMI="$tmp/absent-nvidia-smi" "$runner" "$tmp/bin" "$tmp/out" >/dev/null
    rc=$?
    [ "$rc" -eq 3 ] || fail "exit $rc, expected 3"
    [ $((SECONDS - t0)) -le 20 ] || fail "took $((SECONDS - t0)) s"
    expect_every_step "$tmp/out/report.txt" 'skipped: no CUDA device'
    grep -q 'does NOT load' "$tmp/out/report.txt" && fail "a stub was reported as not loading"
    grep -qE 'passed|FAILED|TIMED OUT|NOT RUN' "$tmp/out/report.txt" && fail "something ran without a device"
    ;;
  fake-gpu)
    make_stubs
    STUB_FAIL=test_gpu_ll GPU_CHECKS_NVIDIA_SMI="$tmp/nvidia-smi" GPU_CHECKS_NCCL_LIB="$tmp/libnccl.so.2" \
      "$runner" "$tmp/bin" "$tmp/out" >/dev/null
    rc=$?
    [ "$rc" -eq 1 ] || fail "exit $rc, expected 1 (a step failed)"
    expect_every_step "$tmp/out/report.txt" ''
    r="$tmp/out/report.txt"
    grep -q '^LL protocol and channel tests: FAILED (exit 1' "$r" || fail "the failing step is not FAILED"
    grep -q '^kernel tests (every dtype x op against the host): passed' "$r" || fail "a passing step is not passed"
    grep -q '^figure: PCIe write/read stub 2.00$' "$r" || fail "the binary's own figure line is missing"
    grep -q '^figure: reduce kernel .*worst 0.922, target >= 0.90: met' "$r" || fail "no kernel-bandwidth figure"
    grep -q '^figure: GDR-write, .*doorbell-to-completion: 12.5 us per slot' "$r" || fail "no GDR-write figure"
    grep -q '^figure: GDR-write, device-side post by the GPU kernel .*: allreduce, .*ranks on the GPU kernel 2 of 2, devicePosts 256 of slotsWritten 260, remoteReads 0, stagedLost 0, #wrong 0, .*: ok$' \
      "$r" || fail "no GDR-write device-buffer figure"
    grep -q "^GDR-write: device buffers post through the transport's GPU kernel: passed" "$r" ||
      fail "the GDR-write device-buffer step did not pass on the stub's counters"
    grep -q '^figure: Ridge beside NCCL, .*67108864 B: Ridge busbw 150 GB/s, NCCL 140 GB/s, Ridge/NCCL 1.07; #wrong Ridge 0, NCCL 0' \
      "$r" || fail "no NCCL figure"
    grep -q 'failing as told' "$tmp/out/details.txt" || fail "the step's output is not in details.txt"
    grep -q 'skipped: no CUDA device' "$r" && fail "skipped for no device although one is listed"
    ;;
  budget)
    make_stubs
    t0=$SECONDS
    STUB_HANG=test_gpu_kernels GPU_CHECKS_BUDGET_S=4 GPU_CHECKS_MIN_STEP_S=1 GPU_CHECKS_NVIDIA_SMI="$tmp/nvidia-smi" \
      GPU_CHECKS_NCCL_LIB="$tmp/libnccl.so.2" "$runner" "$tmp/bin" "$tmp/out" >/dev/null
    rc=$?
    took=$((SECONDS - t0))
    [ "$rc" -eq 1 ] || fail "exit $rc, expected 1"
    [ "$took" -le 12 ] || fail "took $took s with a 4 s budget"
    r="$tmp/out/report.txt"
    expect_every_step "$r" ''
    grep -q '^LL line format (host code): passed' "$r" || fail "the first step did not pass"
    grep -qE '^kernel tests \(every dtype x op against the host\): TIMED OUT after [1-4] s' "$r" ||
      fail "the hanging step was not cut within the budget"
    grep -q '^stream-ordered collectives: NOT RUN (the 4 s budget is spent)' "$r" || fail "a later step ran"
    ;;
  pack-dry-run)
    pack=$(cd "$here/../.." && pwd)/.gpupack
    if [ ! -x "$pack/run.sh" ]; then
      echo "skipped: no pack (tests/gpu/pack.sh makes .gpupack)"
      exit 77
    fi
    t0=$SECONDS
    GPU_CHECKS_NVIDIA_SMI="$tmp/absent-nvidia-smi" "$pack/run.sh" "$tmp/out" >/dev/null
    rc=$?
    [ "$rc" -eq 3 ] || fail "exit $rc, expected 3 (no device, everything loads)"
    [ $((SECONDS - t0)) -le 30 ] || fail "took $((SECONDS - t0)) s"
    expect_every_step "$tmp/out/report.txt" 'skipped: no CUDA device' "$pack/run_checks.sh"
    grep 'does NOT load' "$tmp/out/report.txt" && fail "a packed binary does not load"
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
cat "$tmp/out/report.txt"
[ "$fails" -eq 0 ] && echo "PASS: $case_name" && exit 0
echo "$fails failure(s)"
exit 1
