#!/usr/bin/env bash
# The GPU checks on binaries already built, one command, bounded in time (the prebuilt pack's
# .gpupack/run.sh runs it, see tests/gpu/pack.sh; tests/gpu/run.sh builds on the device first):
#   tests/gpu/run_checks.sh BIN_DIR OUT_DIR [LIB_DIR]
#   tests/gpu/run_checks.sh --list-steps        (the steps' labels, one a line)
#   tests/gpu/run_checks.sh --list-binaries     (KIND NAME of each step's binary, for tests)
# BIN_DIR holds the binaries, directly or under tests/gpu/, tests/gdr/ and bench/ (a CMake
# build tree). LIB_DIR (optional): libraries the binaries load first (LD_LIBRARY_PATH for them
# alone, so that nvidia-smi, python3 and cuobjdump keep the machine's own). nccl-tests, when
# packed, are in BIN_DIR/../nccl-tests or BIN_DIR/nccl-tests.
#
# Writes two files, within what a lent device returns (at most 8 files of 16 MiB, 2 folders
# down): OUT_DIR/report.txt, one line per step appended as soon as the step ends (so a run
# that is cut off still reports) plus "figure:" lines (the figures the issue asks for, with
# their labels), and OUT_DIR/details.txt, every step's output (at most 1 MiB each). stdout
# carries the report lines only.
#
# Bounds: every step runs under `timeout` with its own limit, and all of them under one budget
# (GPU_CHECKS_BUDGET_S, default 290 s: one run and its rerun fit a device lease); a step whose
# turn comes with less than GPU_CHECKS_MIN_STEP_S (default 10) left is reported NOT RUN.
# Without a CUDA device (`nvidia-smi -L` lists none; GPU_CHECKS_NVIDIA_SMI names another
# nvidia-smi, the tests point it at a stub) every step is reported "skipped: no CUDA device",
# after a check that its binary loads (libraries resolve; GoogleTest binaries list their tests).
# GPU_CHECKS_NCCL_LIB: the NCCL to run beside Ridge (default: python3's nvidia.nccl wheel, or
# /opt/torch/.venv, /usr/local/lib, /usr/lib).
# Exit status: 0 all passed, 1 a step failed, timed out or was not run, 3 no CUDA device.
set -uo pipefail

list_only=0
if [ "${1:-}" = "--list-steps" ] || [ "${1:-}" = "--list-binaries" ]; then
  list_only=1
  list_what=${1#--list-}
elif [ $# -lt 2 ]; then
  echo "usage: $0 BIN_DIR OUT_DIR [LIB_DIR] | --list-steps" >&2
  exit 2
fi

if [ "$list_only" -eq 0 ]; then
  bin_dir=$(cd "$1" && pwd) || exit 2
  mkdir -p "$2" || exit 2
  out_dir=$(cd "$2" && pwd)
  lib_dir=${3:+$(cd "$3" && pwd)}
  report="$out_dir/report.txt"
  details="$out_dir/details.txt"
  : >"$report"
  : >"$details"
fi
step_log=$(mktemp)
work=$(mktemp -d)
trap 'rm -rf "$step_log" "$work"' EXIT
budget=${GPU_CHECKS_BUDGET_S:-290}
min_step=${GPU_CHECKS_MIN_STEP_S:-10}
smi=${GPU_CHECKS_NVIDIA_SMI:-nvidia-smi}
output_cap=$((1 << 20))        # of one step's output in details.txt
details_cap=$((15 << 20))      # of details.txt (a lent device returns files of 16 MiB at most)
start=$SECONDS
status=0
nsteps=0

# Lazy module loading would load a kernel at its first launch, which may wait for the device
# to synchronize: with a stream parked on a release word or an LL receiver spinning, that
# can hang (docs/gpu.md). Ridge preloads its kernels; this covers everything else, and the
# "lazy module loading" steps check Ridge's preload without it.
export CUDA_MODULE_LOADING=EAGER
export RIDGE_TIMEOUT=${RIDGE_TIMEOUT:-30}
export RIDGE_SOCKET_IFNAME=${RIDGE_SOCKET_IFNAME:-lo}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}

# note LINE: a report line (report.txt and stdout).
note() {
  echo "$*" >>"$report"
  echo "$*"
}

# find_bin NAME: the binary's path, or nothing.
find_bin() {
  local d
  for d in "$bin_dir" "$bin_dir/tests/gpu" "$bin_dir/tests/gdr" "$bin_dir/bench"; do
    if [ -x "$d/$1" ] && [ -f "$d/$1" ]; then
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

# load_check PATH KIND: whether the binary would start here (for the runs without a device).
load_check() {
  local missing listed
  missing=$(with_libs ldd "$1" 2>&1 | awk '/not found/ {print $1}' | grep -v '^libcuda\.so' | tr '\n' ' ')
  if [ -n "$missing" ]; then
    echo "does NOT load: ${missing% } not found"
    return 1
  fi
  if [ "$2" = gtest ]; then
    listed=$(with_libs timeout 10 "$1" --gtest_list_tests 2>/dev/null | grep -c '^  ') || true
    [ "${listed:-0}" -gt 0 ] || {
      echo "does NOT load: --gtest_list_tests listed nothing"
      return 1
    }
    echo "loads, $listed tests"
    return 0
  fi
  echo "loads"
}

# step LABEL LIMIT_S KIND TARGET ARGS...: one check. KIND gtest or bench: TARGET is a binary
# found by find_bin; KIND func: TARGET is a shell function of this script, called with the
# step's limit first (it must bound its own commands by it). Runs under `timeout` (LIMIT_S,
# less when the budget is nearly spent), output into details.txt, one report line for the
# outcome. Globals read (and reset) by step: step_env (VAR=VALUE words for the command),
# step_post (a function given the output file, which adds "figure:" lines), skip_when (a
# binary that exits 2 printing this text is recorded as skipped), step_dry (for a func step:
# a function that says, without a device, whether what it would run loads).
step_env=()
step_post=
skip_when=
step_dry=
step() {
  local label=$1 limit=$2 kind=$3 target=$4
  shift 4
  local env=("${step_env[@]}") post=$step_post skip=$skip_when dry=$step_dry
  step_env=()
  step_post=
  skip_when=
  step_dry=
  nsteps=$((nsteps + 1))
  if [ "$list_only" -eq 1 ]; then
    if [ "$list_what" = steps ]; then
      echo "$label"
    elif [ "$kind" != func ]; then
      echo "$kind $target"
    fi
    return
  fi
  local path="" how
  echo "## $label: ${env[*]} $target $*" >>"$details"
  if [ "$kind" != func ]; then
    path=$(find_bin "$target")
    if [ -z "$path" ]; then
      note "$label: FAILED (binary $target not found under $bin_dir)"
      status=1
      return
    fi
  fi
  if [ "$gpus" -eq 0 ]; then
    how="binary loads"
    if [ "$kind" = func ]; then
      how="a script step"
      if [ -n "$dry" ] && ! how=$("$dry"); then
        status=1
      fi
    elif ! how="binary $(load_check "$path" "$kind")"; then
      status=1
    fi
    note "$label: skipped: no CUDA device ($how)"
    return
  fi
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt "$min_step" ]; then
    note "$label: NOT RUN (the ${budget} s budget is spent)"
    status=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS rc
  if [ "$kind" = func ]; then
    (
      [ ${#env[@]} -eq 0 ] || export "${env[@]}"
      "$target" "$limit" "$@"
    ) >"$step_log" 2>&1
    rc=$?
  else
    with_libs env "${env[@]}" timeout -k 3 "$limit" "$path" "$@" >"$step_log" 2>&1
    rc=$?
  fi
  local room=$((details_cap - $(stat -c %s "$details")))
  [ "$room" -lt "$output_cap" ] || room=$output_cap
  [ "$room" -le 0 ] || head -c "$room" "$step_log" >>"$details"
  local took=$((SECONDS - t0))
  case $rc in
    0) note "$label: passed (${took} s)" ;;
    124 | 137) note "$label: TIMED OUT after ${limit} s" && status=1 ;;
    *)
      if [ -n "$skip" ] && [ "$rc" -eq 2 ] && grep -q "$skip" "$step_log"; then
        note "$label: skipped ($(grep -m1 "$skip" "$step_log"))"
      else
        note "$label: FAILED (exit $rc, ${took} s)"
        status=1
      fi
      ;;
  esac
  # The binary's own figure lines, then the step's figure extractor.
  grep '^figure: ' "$step_log" | while read -r line; do note "$line"; done
  [ -z "$post" ] || "$post" "$step_log" | while read -r line; do note "figure: $line"; done
}

# skip_step LABEL REASON: a step that cannot run here, reported as skipped (one report line,
# as every step).
skip_step() {
  nsteps=$((nsteps + 1))
  if [ "$list_only" -eq 1 ]; then
    [ "$list_what" = binaries ] || echo "$1"
  elif [ "$gpus" -eq 0 ]; then
    note "$1: skipped: no CUDA device ($2)"
  else
    note "$1: skipped ($2)"
  fi
}

# ---- Figures from the benchmarks' own output formats ---------------------------------------
# ridge-gpu-kernel-bw: "sum/TYPE GB/s copyGB/s ratio" lines.
figures_kernel_bw() {
  awk '$1 ~ /^sum\// {
         types = types sprintf("%s%s %.0f GB/s = %.3f", n++ ? ", " : "", substr($1, 5), $2, $4)
         if (n == 1 || $4 < worst) worst = $4
         copy = $3 }
       END { if (n) printf "reduce kernel (2 sources, 256 MiB) vs device-to-device copy (%.0f GB/s), bytes read + " \
                           "written: %s; worst %.3f, target >= 0.90: %s\n", copy, types, worst,
                           (worst >= 0.9 ? "met" : "NOT met") }' "$1"
}
# ridge-gpu-ll-lat: "bytes LL(us) bulk(us) bulk/LL ..." rows.
figures_ll_lat() {
  awk '$1 ~ /^[0-9]+$/ && NF >= 4 {printf "%s%s B %.2f us (bulk %.2f)", n++ ? ", " : "LL one hop on one GPU: ", $1, $2, $3}
       END {if (n) print ""}' "$1"
}
# ridge-gpu-coll-lat: "bytes LL(us) proxy(us) proxy/LL" rows.
figures_coll_lat() {
  awk '$1 ~ /^[0-9]+$/ && NF >= 4 {printf "%s%s B %.1f us (proxy %.1f)", n++ ? ", " : "small allreduce, 2 ranks, LL path: ", $1, $2, $3}
       END {if (n) print ""}' "$1"
}
# ridge-gdr-write-check: its doorbell-to-completion and posted-write lines.
figures_gdr_write() {
  sed -n 's/^\(doorbell-to-completion: .*\)/GDR-write, device producer and software NIC, 64 slots of 64 KiB: \1/p
          s/^\(posted-write bandwidth .*\)/GDR-write check: \1/p' "$1"
}
# ridge-bench --csv: the largest size's bus bandwidth, Ridge's and the peer's, and #wrong.
bench_csv=
figures_bench() {
  [ -s "$bench_csv" ] || {
    echo "$bench_label: no CSV written"
    return
  }
  awk -F, -v label="$bench_label" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { last = $0; split($0, f, ",")
      wrong += f[col["wrong"]] + f[col["ip_wrong"]]
      if ("nccl_wrong" in col) nwrong += f[col["nccl_wrong"]] + f[col["nccl_ip_wrong"]] }
    END {
      if (last == "") { print label ": no rows"; exit }
      split(last, f, ",")
      line = sprintf("%s: %s ranks, %s B: Ridge busbw %s GB/s", label, f[col["nranks"]], f[col["size"]], f[col["busbw"]])
      if ("nccl_busbw" in col)
        line = line sprintf(", NCCL %s GB/s, Ridge/NCCL %s", f[col["nccl_busbw"]], f[col["ratio"]])
      line = line sprintf("; #wrong Ridge %d", wrong)
      if ("nccl_wrong" in col) line = line sprintf(", NCCL %d", nwrong)
      print line
    }' "$bench_csv"
}

# ---- Steps that are not one binary ---------------------------------------------------------
# GDR-write on device buffers (issue 17): two ranks (processes, one GPU) over the software NIC,
# sendrecv and allreduce, -np 2 --ridge-buffers device --gdr-mode write. Passes when every rank's
# transport says the GPU kernel posts ("device-side post by the GPU kernel"), the closing
# counters show device posts, no producer read of NIC-side memory, nothing staged lost, and
# #wrong is 0. One "gdr-device-summary:" line per collective. P2P (CUDA IPC) and the LL path
# are off: on one GPU they would take the device collectives before the network connectors.
gdr_device_runs=(sendrecv allreduce)
gdr_device_producer() {
  local limit=$1 bench coll out csv brc rc=0 each
  bench=$(find_bin ridge-bench)
  [ -n "$bench" ] || {
    echo "ridge-bench not found under $bin_dir"
    return 1
  }
  each=$((limit / ${#gdr_device_runs[@]}))
  for coll in "${gdr_device_runs[@]}"; do
    out="$work/gdr_device_$coll.out"
    csv="$work/gdr_device_$coll.csv"
    rm -f "$csv"
    with_libs env RIDGE_DEBUG=INFO RIDGE_P2P=off RIDGE_LL=off timeout -k 3 "$each" "$bench" "$coll" -np 2 \
      --ridge-buffers device --gdr-mode write -b 4K -e 16M -f 4 -n 5 -w 2 --csv "$csv" >"$out" 2>&1
    brc=$?
    grep -v ' INFO setting ' "$out" | tail -n 80
    awk -v coll="$coll" -v brc="$brc" -v csv="$csv" '
      / gdr: rank [0-9]+: device buffers: device-side post by the GPU kernel/ { kernel++ }
      / gdr: rank [0-9]+: closing: / {
        closing++
        for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[2] != "") sum[kv[1]] += kv[2] } }
      END {
        wrong = "?"; bw = "?"
        while ((getline line < csv) > 0) {
          n = split(line, f, ",")
          if (!hdr) { for (i = 1; i <= n; i++) col[f[i]] = i; hdr = 1; wrong = 0; continue }
          wrong += f[col["wrong"]] + f[col["ip_wrong"]]; bw = f[col["busbw"]]; size = f[col["size"]] }
        ok = brc == 0 && kernel >= 2 && closing >= 2 && sum["devicePosts"] > 0 && sum["remoteReads"] == 0 &&
             sum["stagedLost"] == 0 && wrong == "0"
        printf "gdr-device-summary: %s, 2 ranks, device buffers: exit %d, ranks on the GPU kernel %d of 2, " \
               "devicePosts %d of slotsWritten %d, remoteReads %d, stagedLost %d, #wrong %s, busbw %s GB/s at %s B: %s\n",
               coll, brc, kernel, sum["devicePosts"], sum["slotsWritten"], sum["remoteReads"], sum["stagedLost"],
               wrong, bw, size, ok ? "ok" : "FAILED"
        exit ok ? 0 : 1 }' "$out" || rc=1
    grep -m3 ' RIDGE WARN ' "$out"
  done
  return $rc
}
gdr_device_load() {
  local how
  how=$(load_check "$(find_bin ridge-bench)" bench) || {
    echo "ridge-bench $how"
    return 1
  }
  echo "ridge-bench $how"
}
figures_gdr_device() {
  sed -n 's/^gdr-device-summary: /GDR-write, device-side post by the GPU kernel over the software NIC: /p' "$1"
}

# The NCCL a device offers (the pip wheel's on these machines), or nothing.
find_nccl() {
  local n=${GPU_CHECKS_NCCL_LIB:-}
  if [ -z "$n" ]; then
    n=$(timeout 30 python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' \
      2>/dev/null || true)
    [ -n "$n" ] && [ ! -f "$n" ] && n=
  fi
  [ -n "$n" ] || n=$(find /opt/torch/.venv /usr/local/lib /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
  echo "$n"
}

nccl_tests_dir() {
  local d
  for d in "$bin_dir/../nccl-tests" "$bin_dir/nccl-tests"; do
    if [ -d "$d" ] && ls "$d"/*_perf >/dev/null 2>&1; then
      (cd "$d" && pwd)
      return
    fi
  done
}

# run_nccl_tests LIMIT LIBDIR WHO: nccl-tests' collectives at small sizes on one GPU with the
# libnccl.so.2 of LIBDIR first on the path; one line per binary with #wrong. Fails when a
# binary fails or reports wrong values.
nccl_tests_list=(all_reduce all_gather broadcast reduce_scatter alltoall sendrecv)
run_nccl_tests() {
  local limit=$1 libdir=$2 who=$3 dir t0 each rc=0 b out
  dir=$(nccl_tests_dir)
  t0=$SECONDS
  each=$((limit / ${#nccl_tests_list[@]}))
  for b in "${nccl_tests_list[@]}"; do
    out="$work/$b.out"
    if [ ! -x "$dir/${b}_perf" ]; then
      echo "nccl-tests $who: ${b}_perf: not packed"
      rc=1
      continue
    fi
    LD_LIBRARY_PATH="$libdir${lib_dir:+:$lib_dir}" timeout -k 2 "$each" "$dir/${b}_perf" -b 8 -e 1M -f 8 -g 1 -c 1 \
      -n 5 -w 2 >"$out" 2>&1
    local brc=$?
    cat "$out"
    local oob busbw
    oob=$(awk -F: '/Out of bounds values/ {gsub(/^ +| +$/, "", $2); print $2}' "$out")
    busbw=$(awk -F: '/Avg bus bandwidth/ {gsub(/^ +| +$/, "", $2); print $2}' "$out")
    echo "nccl-tests-summary: ${b}_perf on $who: exit $brc, #wrong ${oob:-unknown}, avg busbw ${busbw:-?} GB/s"
    [ "$brc" -eq 0 ] && [[ ${oob:-x} == "0 OK" ]] || rc=1
  done
  echo "nccl-tests: $((SECONDS - t0)) s"
  return $rc
}
# Without a device: whether every packed nccl-tests binary loads.
nccl_tests_load() {
  local dir b how n=0
  dir=$(nccl_tests_dir)
  for b in "${nccl_tests_list[@]}"; do
    if [ ! -x "$dir/${b}_perf" ]; then
      echo "${b}_perf is not packed"
      return 1
    fi
    how=$(load_check "$dir/${b}_perf" bench) || {
      echo "${b}_perf $how"
      return 1
    }
    n=$((n + 1))
  done
  echo "$n nccl-tests binaries load"
}
figures_nccl_tests() {
  sed -n 's/^nccl-tests-summary: //p' "$1"
}
nccl_tests_ridge() {
  [ -f "$lib_dir/libnccl.so.2" ] || {
    echo "Ridge's libnccl.so.2 is not in $lib_dir"
    return 1
  }
  run_nccl_tests "$1" "$lib_dir" "Ridge's libnccl.so.2"
}
nccl_tests_nccl() {
  run_nccl_tests "$1" "$(dirname "$nccl")" "NCCL ($nccl)"
}

# Registers, stack and local memory (spills) of every kernel, sm_90 SASS, from the library
# or binary that holds them.
registers() {
  local limit=$1 cuobjdump holder
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  for holder in "$lib_dir/libridge_gpu.so" "$bin_dir/kernels/libridge_gpu.so" "$(find_bin test_gpu_ll)"; do
    [ -f "$holder" ] && break
  done
  [ -x "$cuobjdump" ] && [ -f "$holder" ] || {
    echo "no cuobjdump, or no library holding the kernels"
    return 1
  }
  echo "kernels of $holder"
  timeout "$limit" "$cuobjdump" --dump-resource-usage -arch sm_90 "$holder" 2>&1 | grep -E "Function|REG|STACK|LOCAL"
}
figures_registers() {
  awk '/STACK:[1-9]|LOCAL:[1-9]/ {n++} /REG:/ {k++}
       END {if (k) printf "registers: %d kernels, %d with a stack frame or local memory (spills: details.txt)\n", k, n}' "$1"
}

# ---- The run --------------------------------------------------------------------------------
all_steps() {
  step "LL line format (host code)" 10 gtest test_ll_line --gtest_brief=1
  step "kernel tests (every dtype x op against the host)" 45 gtest test_gpu_kernels --gtest_brief=1
  step "PCIe premise: GPU writes vs reads, doorbell loop" 40 bench ridge-gpu-pcie-premise 16777216 5
  step_post=figures_kernel_bw
  step "kernel bandwidth: reduce vs device-to-device copy" 25 bench ridge-gpu-kernel-bw 256 20
  step "LL protocol and channel tests" 40 gtest test_gpu_ll --gtest_brief=1
  step_post=figures_ll_lat
  step "LL vs bulk, one hop at small sizes" 20 bench ridge-gpu-ll-lat 2000
  step "stream-ordered collectives" 40 gtest test_gpu_stream --gtest_brief=1
  step "LL collectives (ranks as threads on one GPU)" 40 gtest test_gpu_ll_collective --gtest_brief=1
  step "P2P transport (two processes, CUDA IPC)" 45 gtest test_gpu_p2p --gtest_brief=1
  step_env=(RIDGE_DEBUG=INFO) # the registrar says which dma-buf path it took
  step "dma-buf export" 15 gtest test_gpu_dmabuf --gtest_brief=1
  step_post=figures_gdr_write
  step "GDR-write: device producer rings the software NIC's doorbell" 30 bench ridge-gdr-write-check
  step_post=figures_gdr_device step_dry=gdr_device_load
  step "GDR-write: device buffers post through the transport's GPU kernel" 40 func gdr_device_producer
  step_post=figures_coll_lat
  step "small allreduce: LL path vs proxy path" 20 bench ridge-gpu-coll-lat 2 300 5
  rm -f "$work"/*.csv
  bench_csv="$work/ranks4.csv" bench_label="4 ranks on one GPU, allreduce, device buffers"
  step_post=figures_bench
  step "4 ranks on one GPU, device buffers" 40 bench ridge-bench allreduce -np 4 --ridge-buffers device \
    -b 1K -e 64M -f 8 -n 10 -w 3 --csv "$bench_csv"
  # NCCL runs one rank per GPU, so as many ranks as GPUs. ridge-bench exits 2 with "cannot run
  # here" when NCCL cannot load or see the device: NCCL's absence, not a Ridge failure.
  nccl=$([ "$list_only" -eq 1 ] || find_nccl)
  local no_nccl="libnccl.so.2 not found: python3's nvidia.nccl, /opt/torch/.venv, /usr/local/lib, /usr/lib"
  if [ "$list_only" -eq 0 ] && [ -z "$nccl" ] && [ "$gpus" -gt 0 ]; then
    skip_step "NCCL beside Ridge (ridge-bench --peer nccl)" "$no_nccl"
  else
    bench_csv="$work/nccl.csv" bench_label="Ridge beside NCCL, allreduce, device buffers"
    step_post=figures_bench skip_when="cannot run here"
    step "NCCL beside Ridge (ridge-bench --peer nccl)" 40 bench ridge-bench allreduce -np "$((gpus > 0 ? gpus : 1))" \
      --peer nccl --ridge-buffers device --nccl-lib "${nccl:-libnccl.so.2}" -b 1K -e 64M -f 8 -n 10 -w 3 \
      --csv "$bench_csv"
  fi
  # nccl-tests linked against Ridge's NCCL-compatible library (packed only when that library
  # existed at packing time), then the same binaries on the device's NCCL for comparison.
  local not_packed="not packed: Ridge's NCCL-compatible library or nccl-tests was absent when the pack was made"
  if [ "$list_only" -eq 0 ] && [ -z "$(nccl_tests_dir)" ]; then
    skip_step "nccl-tests on Ridge's libnccl.so.2" "$not_packed"
    skip_step "nccl-tests on the device's NCCL" "$not_packed"
  else
    step_post=figures_nccl_tests step_dry=nccl_tests_load
    step "nccl-tests on Ridge's libnccl.so.2" 60 func nccl_tests_ridge
    if [ "$list_only" -eq 0 ] && [ -z "$nccl" ] && [ "$gpus" -gt 0 ]; then
      skip_step "nccl-tests on the device's NCCL" "$no_nccl"
    else
      step_post=figures_nccl_tests step_dry=nccl_tests_load
      step "nccl-tests on the device's NCCL" 60 func nccl_tests_nccl
    fi
  fi
  # With lazy module loading, CUDA's default, which applications get unless they ask
  # otherwise: Ridge's own kernel preload must be enough. Last, so that a hang here costs none
  # of the checks above.
  step_env=(CUDA_MODULE_LOADING=LAZY)
  step "kernel preload, lazy module loading" 15 gtest test_gpu_kernels --gtest_brief=1 \
    --gtest_filter='GpuKernels.Preload*'
  step_env=(CUDA_MODULE_LOADING=LAZY)
  step "stream-ordered collectives, lazy module loading" 25 gtest test_gpu_stream --gtest_brief=1
  step_env=(CUDA_MODULE_LOADING=LAZY)
  step "LL send/recv and ring steps, lazy module loading" 25 gtest test_gpu_ll --gtest_brief=1 \
    --gtest_filter='GpuLL.SendRecv*:GpuLL.FusedRing*'
  step_post=figures_registers
  step "registers and spills per kernel (sm_90)" 10 func registers
}

if [ "$list_only" -eq 1 ]; then
  gpus=0
  all_steps | awk '!seen[$0]++'
  exit 0
fi

gpus=$(timeout 20 "$smi" -L 2>/dev/null | grep -c '^GPU ') || gpus=0
{
  echo "# Ridge GPU report, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "binaries: $bin_dir${lib_dir:+ (libraries: $lib_dir)}"
  [ -f "$bin_dir/../MANIFEST" ] && sed -n '1s/^/pack: /p' "$bin_dir/../MANIFEST"
  echo "machine: $(uname -r) ($(uname -m)), $(grep -m1 '^PRETTY_NAME=' /etc/os-release 2>/dev/null | cut -d= -f2-)," \
    "$(ldd --version 2>/dev/null | head -1)"
  if [ "$gpus" -gt 0 ]; then
    echo "GPUs: $gpus; $(timeout 20 "$smi" --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
      --format=csv,noheader 2>&1 | head -1) (name, driver, PCIe gen, width)"
  fi
  echo "budget ${budget} s; CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING RIDGE_TIMEOUT=$RIDGE_TIMEOUT" \
    "CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS"
} | while read -r line; do note "$line"; done
{
  echo "## environment"
  if [ "$gpus" -gt 0 ]; then
    timeout 20 "$smi" 2>&1
    timeout 20 "$smi" topo -m 2>&1
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -2
  df -h /dev/shm 2>&1
} >>"$details" 2>&1

if [ "$gpus" -gt 0 ]; then
  # A GPU is present: a GPU test that finds no usable device fails instead of skipping.
  export RIDGE_TEST_REQUIRE_GPU=1
fi
all_steps
[ "$gpus" -ge 2 ] || [ "$gpus" -eq 0 ] || note "P2P between two GPUs: skipped (one GPU)"
# Without a device: 3, unless a binary does not load (1).
[ "$gpus" -gt 0 ] || [ "$status" -ne 0 ] || status=3
note "total: $((SECONDS - start)) s, $nsteps steps, exit $status"
exit $status
