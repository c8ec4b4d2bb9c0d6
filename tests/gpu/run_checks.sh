#!/usr/bin/env bash
# The GPU checks themselves, on binaries already built (shared by tests/gpu/run.sh, which
# builds them first, and by the prebuilt pack's .gpupack/run.sh, see tests/gpu/pack.sh):
#   tests/gpu/run_checks.sh BIN_DIR REPORT_DIR [LIB_DIR]
# BIN_DIR holds the binaries, directly or under tests/gpu/ and bench/ (a CMake build tree).
# LIB_DIR (optional): libraries the binaries load first (LD_LIBRARY_PATH for them alone, so
# that nvidia-smi, python3 and cuobjdump keep the machine's own).
# Writes REPORT_DIR/gpu-report.txt: the machine's facts, then one section per step with its
# output, and a summary line per step. Every step is bounded by `timeout` and by an overall
# budget (GPU_CHECKS_BUDGET_S, default 540 s, inside the 600 s a device command may run), and
# every step's failure is recorded; no step stops the others. GPU_CHECKS_NCCL_LIB: the
# libnccl.so.2 to run beside Ridge (default: found through python3's nvidia.nccl or under
# /opt/torch/.venv, /usr/local/lib, /usr/lib).
# Exit status: 0 all passed, 1 a step failed or timed out, 3 no CUDA device (nothing checked).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BIN_DIR REPORT_DIR [LIB_DIR]" >&2
  exit 2
fi
bin_dir=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
report_dir=$(cd "$2" && pwd)
lib_dir=${3:+$(cd "$3" && pwd)}
report="$report_dir/gpu-report.txt"
step_log=$(mktemp)
trap 'rm -f "$step_log"' EXIT
budget=${GPU_CHECKS_BUDGET_S:-540}
start=$SECONDS
status=0

# Lazy module loading would load a kernel at its first launch, which may wait for the device
# to synchronize: with a stream parked on a release word or an LL receiver spinning, that
# can hang (docs/gpu.md). Ridge preloads its kernels; this covers everything else.
export CUDA_MODULE_LOADING=EAGER
export RIDGE_TIMEOUT=${RIDGE_TIMEOUT:-30}
export RIDGE_SOCKET_IFNAME=${RIDGE_SOCKET_IFNAME:-lo}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}

say() { echo "$*" | tee -a "$report"; }

# find_bin NAME: the binary's path, or nothing.
find_bin() {
  local d
  for d in "$bin_dir" "$bin_dir/tests/gpu" "$bin_dir/bench"; do
    if [ -x "$d/$1" ]; then
      echo "$d/$1"
      return
    fi
  done
}

# with_libs CMD...: CMD with LIB_DIR first on its library path.
with_libs() {
  if [ -n "$lib_dir" ]; then
    LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
  else
    "$@"
  fi
}

# step LABEL LIMIT_S NAME ARGS...: runs binary NAME under timeout (LIMIT_S, or less when the
# budget is nearly spent), its output into the report and on stdout; records the outcome.
# skip_when (a variable): see below. Sets step_rc to the binary's exit status (124 or 137: timed out); its output stays in
# $step_log until the next step.
step() {
  local label=$1 limit=$2 name=$3
  shift 3
  local path left
  path=$(find_bin "$name")
  left=$((budget - (SECONDS - start) - 10))
  echo "## $label: $name $*" >>"$report"
  : >"$step_log"
  step_rc=0
  if [ -z "$path" ]; then
    say "$label: FAILED (binary $name not found under $bin_dir)"
    status=1
    step_rc=127
    return
  fi
  if [ "$left" -lt 15 ]; then
    say "$label: NOT RUN (the ${budget} s budget is spent)"
    status=1
    step_rc=125
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  with_libs timeout -k 5 "$limit" "$path" "$@" 2>&1 | tee -a "$report" >"$step_log"
  step_rc=${PIPESTATUS[0]}
  cat "$step_log"
  local took=$((SECONDS - t0))
  case $step_rc in
    0) say "$label: passed (${took} s)" ;;
    124 | 137)
      say "$label: TIMED OUT after ${limit} s"
      status=1
      ;;
    *)
      if [ -n "$skip_when" ] && [ "$step_rc" -eq 2 ] && grep -q "$skip_when" "$step_log"; then
        say "$label: skipped ($(grep -m1 "$skip_when" "$step_log"))"
      else
        say "$label: FAILED (exit $step_rc, ${took} s)"
        status=1
      fi
      ;;
  esac
}
# A step whose binary exits 2 printing this text is recorded as skipped, not failed.
skip_when=

{
  echo "# Ridge GPU report, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "binaries: $bin_dir${lib_dir:+ (libraries: $lib_dir)}"
  [ -f "$bin_dir/../MANIFEST" ] && sed -n '1s/^/pack: /p' "$bin_dir/../MANIFEST"
  echo "## environment"
  echo "kernel: $(uname -r) ($(uname -m))"
  echo "os: $(grep -m1 '^PRETTY_NAME=' /etc/os-release 2>/dev/null | cut -d= -f2-)"
  echo "glibc: $(ldd --version 2>/dev/null | head -1)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi 2>&1
  else
    echo "nvidia-smi: not on PATH"
  fi
  if command -v nvcc >/dev/null 2>&1; then
    nvcc --version | tail -2
  elif [ -x /usr/local/cuda/bin/nvcc ]; then
    /usr/local/cuda/bin/nvcc --version | tail -2
  else
    echo "nvcc: not present"
  fi
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  gtest_dirs=$(for d in /usr/include/gtest /usr/local/include/gtest; do [ -d "$d" ] && echo -n "$d "; done)
  echo "GoogleTest headers: ${gtest_dirs:-none}"
  df -h /dev/shm 2>&1
  echo "CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING RIDGE_TIMEOUT=$RIDGE_TIMEOUT" \
    "CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS budget=${budget}s"
  probe=$(find_bin test_gpu_stream)
  if [ -n "$probe" ]; then
    echo "ldd $probe:"
    with_libs ldd "$probe" 2>&1
  fi
} >"$report" 2>&1

if ! nvidia-smi -L >/dev/null 2>&1; then
  say "skipped: no CUDA device"
  echo "report: $report"
  exit 3
fi
# A GPU is present: a GPU test that finds no usable device fails instead of skipping.
export RIDGE_TEST_REQUIRE_GPU=1
gpus=$(nvidia-smi -L | wc -l)

step "LL line format (host code)" 30 test_ll_line --gtest_brief=1
step "kernel tests" 150 test_gpu_kernels --gtest_brief=1
step "LL protocol and channel tests" 120 test_gpu_ll --gtest_brief=1
export RIDGE_DEBUG=INFO  # the registrar says which dma-buf path it took
step "dma-buf export" 60 test_gpu_dmabuf --gtest_brief=1
unset RIDGE_DEBUG
step "stream-ordered collectives" 120 test_gpu_stream --gtest_brief=1
step "LL collectives (ranks as threads on one GPU)" 120 test_gpu_ll_collective --gtest_brief=1
step "P2P transport (two processes, CUDA IPC)" 120 test_gpu_p2p --gtest_brief=1
# The two-GPU case skips itself with fewer GPUs; say so rather than let "passed" cover it.
[ "$gpus" -ge 2 ] || say "P2P between two GPUs: skipped (one GPU)"
step "kernel bandwidth" 60 ridge-gpu-kernel-bw 256 20
step "LL vs bulk, one hop at small sizes" 60 ridge-gpu-ll-lat 2000
step "small allreduce: LL path vs proxy path (ranks as threads)" 60 ridge-gpu-coll-lat 2 300 5
# The issue's figure: a 4-rank allreduce on the one GPU (Ridge on device buffers, P2P between
# the ranks' processes).
step "4 ranks on one GPU, device buffers" 180 ridge-bench allreduce -np 4 --ridge-buffers device \
  -b 1K -e 256M -f 4

# NCCL beside Ridge, as many ranks as GPUs (NCCL runs one rank per GPU). On these machines
# NCCL is the pip wheel's library, not on the loader's path.
nccl=${GPU_CHECKS_NCCL_LIB:-}
if [ -z "$nccl" ]; then
  nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' \
    2>/dev/null || true)
  [ -n "$nccl" ] && [ ! -f "$nccl" ] && nccl=
fi
if [ -z "$nccl" ]; then
  nccl=$(find /opt/torch/.venv /usr/local/lib /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
fi
if [ -z "$nccl" ]; then
  say "NCCL: skipped (libnccl.so.2 not found: not in python3's nvidia.nccl, /opt/torch/.venv, /usr/local/lib, /usr/lib)"
else
  echo "NCCL library: $nccl" >>"$report"
  # ridge-bench exits 2 with "cannot run here" when NCCL cannot load or see the device: that
  # is NCCL's absence, not a Ridge failure.
  skip_when="cannot run here"
  step "NCCL" 120 ridge-bench allreduce -np "$gpus" --peer nccl --ridge-buffers device --nccl-lib "$nccl" \
    -b 1K -e 256M -f 4
  skip_when=
fi

# The same device collectives and LL tests with lazy module loading, CUDA's default, which
# applications get unless they ask otherwise: Ridge's own kernel preload (in the proxy's setup
# and before the LL tests' spinning receivers) must be enough without EAGER. Last, so that a
# hang here (bounded by timeout) costs none of the checks above.
export CUDA_MODULE_LOADING=LAZY
step "stream-ordered collectives, lazy module loading" 90 test_gpu_stream --gtest_brief=1
step "LL collectives, lazy module loading" 90 test_gpu_ll_collective --gtest_brief=1
step "P2P transport, lazy module loading" 90 test_gpu_p2p --gtest_brief=1 \
  --gtest_filter=GpuP2p.EveryCollectiveTwoProcessesOneGpu
step "LL send/recv and ring steps, lazy module loading" 90 test_gpu_ll --gtest_brief=1 \
  --gtest_filter='GpuLL.SendRecv*:GpuLL.FusedRing*'
export CUDA_MODULE_LOADING=EAGER

# Registers, stack and local memory (spills) of every kernel, sm_90 SASS only, from a binary
# that links all of them.
echo "## registers and spills per kernel (sm_90)" >>"$report"
cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
kernels_bin=$(find_bin test_gpu_ll)
if [ -x "$cuobjdump" ] && [ -n "$kernels_bin" ]; then
  # The pack holds sm_90 code only; a build-gpu tree may hold more (hence -arch), and should
  # this cuobjdump not take -arch, the whole dump is better than none.
  timeout 60 "$cuobjdump" --dump-resource-usage -arch sm_90 "$kernels_bin" 2>&1 |
    grep -E "Function|REG|STACK|LOCAL" >>"$report" ||
    timeout 60 "$cuobjdump" --dump-resource-usage "$kernels_bin" 2>&1 |
    grep -E "arch|Function|REG|STACK|LOCAL" >>"$report" ||
    say "register dump: cuobjdump printed nothing for $kernels_bin"
else
  say "register dump: skipped (no cuobjdump, or no test_gpu_ll)"
fi

echo "total: $((SECONDS - start)) s, exit $status" >>"$report"
echo "report: $report"
exit $status
