#!/usr/bin/env bash
# Build Horovod from PyPI's source distribution into a Python environment, against the
# frameworks installed there (torch; TensorFlow when importable) and the MPI whose `mpicxx`
# comes first on PATH (the environment's own bin/ first: the `mpich` wheel's, on a
# workstation; on a cluster, load the site's MPI module and leave the `mpich` wheel out).
#
#   tools/build-horovod.sh [PYTHON]          (default: .venv/bin/python; `make horovod` runs this)
#
# PyPI has Horovod 0.28.1 only as an sdist, which does not build as is against torch >= 2.1
# (its CMake asks for C++14; torch's headers need C++17) nor TensorFlow 2.21 (its XLA ops
# include headers TF no longer ships; they are GPU-only code). Both are patched here, and
# its MPI controller is made to wait without spinning a core (tools/horovod-nospin.h).
#
# CUDA: set HOROVOD_GPU_OPERATIONS=NCCL (and HOROVOD_NCCL_HOME / HOROVOD_CUDA_HOME where NCCL
# and CUDA are not in the default paths; HOROVOD_BUILD_CUDA_CC_LIST=90 to build the CUDA kernels
# for your GPUs only, here Hopper, instead of every one nvcc knows) before running; they are
# passed through to the build.
# Offline (a compute node): HOROVOD_SDIST=path/to/horovod-0.28.1.tar.gz instead of the download.
set -euo pipefail

PY=${1:-.venv/bin/python}
VERSION=${HOROVOD_VERSION:-0.28.1}
say() { echo "build-horovod: $*" >&2; }
fail() { say "$*"; exit 2; }

[ -x "$PY" ] || fail "no Python at $PY (run 'make venv' first, or pass the interpreter)"
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
export PATH="$(dirname "$PY"):$PATH"
command -v mpicxx >/dev/null || fail "no mpicxx on PATH: install the mpich wheel (pip install mpich) or load your site's MPI"
command -v cmake >/dev/null || fail "no cmake on PATH (Debian: apt-get install cmake; or pip install cmake)"

has() { "$PY" -c "import $1" 2>/dev/null; }
frameworks=()
if has torch; then export HOROVOD_WITH_PYTORCH=1; frameworks+=(torch); else export HOROVOD_WITHOUT_PYTORCH=1; fi
if has tensorflow; then export HOROVOD_WITH_TENSORFLOW=1; frameworks+=(tensorflow); else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
[ ${#frameworks[@]} -gt 0 ] || fail "neither torch nor tensorflow imports in $PY: install a framework first"
export HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
# GCC 13 no longer includes these headers through others, and 0.28.1's sources rely on it
export CXXFLAGS="-include cstdint -include string -include stdexcept ${CXXFLAGS:-}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${HOROVOD_SDIST:-}" ]; then  # a copy of the sdist, for machines that cannot reach PyPI
    [ -f "$HOROVOD_SDIST" ] || fail "HOROVOD_SDIST: no file $HOROVOD_SDIST"
    cp "$HOROVOD_SDIST" "$work/horovod-$VERSION.tar.gz"
else
    say "downloading horovod==$VERSION (sdist)"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
fi
tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
src=$work/horovod-$VERSION

patch_line() {  # FILE OLD NEW: replace text that must be there (OLD literal; NEW sed's replacement: \n, \&)
    grep -qF "$2" "$1" || fail "$1 has no '$2': not the sdist this script knows (HOROVOD_VERSION=$VERSION)"
    local old
    old=$(printf '%s' "$2" | sed 's/[][\.*^$|]/\\&/g')
    sed -i "s|$old|$3|" "$1"
}
patch_line "$src/CMakeLists.txt" "set(CMAKE_CXX_STANDARD 14)" "set(CMAKE_CXX_STANDARD 17)"
patch_line "$src/horovod/torch/CMakeLists.txt" "set(CMAKE_CXX_STANDARD 14)" "set(CMAKE_CXX_STANDARD 17)"
# The MPI controller's negotiation and the CPU tensor operations wait without spinning (tools/horovod-nospin.h)
here=$(cd "$(dirname "$0")" && pwd)
cp "$here/horovod-nospin.h" "$src/horovod/common/mpi/fleet_nospin.h"
patch_line "$src/horovod/common/mpi/mpi_controller.cc" '#include "../logging.h"' '#include "../logging.h"\n#include "fleet_nospin.h"'
patch_line "$src/horovod/common/ops/mpi_operations.cc" '#include "mpi_operations.h"' '#include "mpi_operations.h"\n#include "../mpi/fleet_nospin.h"'
# Its background thread wakes when an operation is enqueued, instead of sleeping out its cycle (tools/horovod-wake.h)
cp "$here/horovod-wake.h" "$src/horovod/common/fleet_wake.h"
patch_line "$src/horovod/common/operations.cc" '#include "operations.h"' '#include "operations.h"\n#include "fleet_wake.h"'
patch_line "$src/horovod/common/operations.cc" 'std::this_thread::sleep_for(sleep_duration);' 'fleet_wake::sleep_cycle(state, sleep_duration);'
patch_line "$src/horovod/common/operations.cc" 'void BackgroundThreadLoop(HorovodGlobalState& state) {' 'void BackgroundThreadLoop(HorovodGlobalState\& state) {\n  fleet_wake::fine_sleeps();'
patch_line "$src/horovod/common/tensor_queue.h" '  void RemoveJoinTensor();' '  void RemoveJoinTensor();\n  bool FleetPending() const { std::lock_guard<std::mutex> guard(mutex_); return !tensor_table_.empty(); }'
patch_line "$src/horovod/common/tensor_queue.cc" '#include "logging.h"' '#include "logging.h"\n#include "fleet_wake.h"'
patch_line "$src/horovod/common/tensor_queue.cc" 'tensor_table_.emplace(e.tensor_name, std::move(e));' 'tensor_table_.emplace(e.tensor_name, std::move(e));\n  fleet_wake::enqueued();'
patch_line "$src/horovod/common/tensor_queue.cc" 'tensor_table_.emplace(entries[i].tensor_name, std::move(entries[i]));' 'tensor_table_.emplace(entries[i].tensor_name, std::move(entries[i]));\n    fleet_wake::enqueued();'
if [ -n "${HOROVOD_WITH_TENSORFLOW:-}" ]; then
    sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
fi

say "building with ${frameworks[*]} against $(command -v mpicxx) ($MAKEFLAGS); a few minutes"
"$PY" -m pip install --quiet --no-build-isolation --no-deps --no-cache-dir "$src" >"$work/build.log" 2>&1 || {
    kept=${TMPDIR:-/tmp}/build-horovod-$$.log
    cp "$work/build.log" "$kept"
    grep -B2 -A12 -e "CMake Error" -e "error:" "$kept" | grep -v "^ *File \"" | head -60 >&2
    fail "the build failed: its errors are above, its whole log in $kept"
}
# what Horovod's Python side imports (cffi, also in its requirements, is for MXNet): only the
# missing ones, so that a machine without PyPI that has them goes on
missing=()
for pair in cloudpickle:cloudpickle psutil:psutil yaml:pyyaml packaging:packaging; do
    has "${pair%%:*}" || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] || "$PY" -m pip install --quiet "${missing[@]}" || fail "could not install ${missing[*]}, which Horovod imports"

for framework in "${frameworks[@]}"; do
    "$PY" - "$framework" <<'EOF' || fail "the build imports, but not as expected (see above)"
import importlib, sys
hvd = importlib.import_module(f"horovod.{sys.argv[1]}")
assert hvd.mpi_built(), "built without MPI"
print(f"build-horovod: horovod.{sys.argv[1]} OK (MPI controller: yes; NCCL: {'yes' if hvd.nccl_built() else 'no'})")
EOF
done
