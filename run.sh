#!/usr/bin/env bash
# Ridge's one entry point for a fresh Debian 12 machine.
#   ./run.sh main   install what is missing, build, run a local allreduce benchmark on
#                   as many ranks as cores, and print this machine's topology summary
#   ./run.sh test   install what is missing, build, run every test
# Both are idempotent: packages already present are not reinstalled, an existing build
# directory (build/, or $RIDGE_BUILD_DIR) is reused.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ pkg-config python3 libhwloc-dev libibverbs-dev
          libopenmpi-dev openmpi-bin libgtest-dev libgloo-dev graphviz gnuplot-nox python3-matplotlib
          python3-torch libtorch-dev python3-dev pybind11-dev)
BUILD_DIR=${RIDGE_BUILD_DIR:-build}
JOBS=$(nproc 2>/dev/null || echo 2)

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "Ridge needs these Debian packages: ${missing[*]}"
    echo "Run as root:  $cmd"
    exit 1
  fi
  echo "+ $cmd"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  # nvcc lives outside PATH in a default CUDA install; RIDGE_WITH_CUDA=AUTO finds it here.
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${RIDGE_CMAKE_ARGS:-}
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

case "${1:-}" in
  main)
    install_missing
    build
    echo
    echo "== Topology of this machine =="
    "$BUILD_DIR/tools/ridge-topo" summary
    echo
    "$BUILD_DIR/tools/ridge-topo" tree
    echo
    "$BUILD_DIR/tools/ridge-topo" matrix
    echo
    echo "== Allreduce on $JOBS local ranks (shared memory) =="
    "$BUILD_DIR/bench/ridge-bench" allreduce -np "$JOBS" -b 8 -e 64M -f 4
    ;;
  test)
    install_missing
    build
    # The same sources must also build without CUDA: when this build has CUDA, compile
    # the library once more with it off. (Without nvcc the main build is the OFF one.)
    if grep -q "RIDGE_CUDA_BUILT:INTERNAL=ON" "$BUILD_DIR/CMakeCache.txt"; then
      alt="$BUILD_DIR-nocuda"
      [ -f "$alt/build.ninja" ] || cmake -S . -B "$alt" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DRIDGE_WITH_CUDA=OFF -DRIDGE_BUILD_TESTS=OFF -DRIDGE_BUILD_EXAMPLES=OFF
      cmake --build "$alt" -j "$JOBS" --target ridge
    fi
    ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900
    ;;
  *)
    echo "usage: $0 main|test" >&2
    exit 2
    ;;
esac
