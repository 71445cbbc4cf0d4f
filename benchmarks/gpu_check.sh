#!/usr/bin/env bash
# The GPU check of issue 40, as one script for a machine with an NVIDIA GPU, CuPy, Numba,
# mpi4py, h5py, SciPy, pytest and hypothesis (what the lent GPU machines have); meshchain's
# other dependencies come as wheels in .whl/ (see benchmarks/README.md, "GPU check").
#
#   bash benchmarks/gpu_check.sh            # writes its logs and JSON under $OUT
#
# 1. the GPU tests: every test parametrised over the device backends (tests/devices.py)
#    that runs on the cupy backend (captured steps, dat arithmetic, MIN/MAX, extruded sets,
#    unsigned data, mixed spaces and subsets included), on 1 to 3 ranks sharing the GPU (pytest -k cupy);
#    meanwhile every example on cupy against numba (benchmarks/gpu_examples.py, Airfoil's
#    rms to 1e-10);
# 2. then, with the GPU to themselves, benchmarks/gpu.py (Airfoil, 720 000 cells),
#    benchmarks/gpu_kernels.py (its kernels alone, and their floors) and
#    benchmarks/gpu_halos.py (2 ranks sharing the GPU).
# Each step has a time limit; the script goes on after a failing step and exits non-zero
# if any failed. Variables: OUT (default benchmarks/results/gpu), PYTHON (python3),
# TESTS_TIMEOUT, EXAMPLES_TIMEOUT, BENCH_TIMEOUT (seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1
failed=()
step() { echo; echo "=== $(date +%T) $*"; }

step "the machine"
nvidia-smi | tee "$OUT/nvidia-smi.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nproc; command -v g++ nvcc || true

step "meshchain's dependencies from .whl/, then meshchain itself"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade .whl/*.whl || failed+=(wheels)
fi
"$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e . || {
    echo "editable install failed: meshchain from src/ through a .pth file (no pytest entry point; conftest loads the plugin)"
    echo "$PWD/src" > "$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')/meshchain-src.pth"
}
"$PYTHON" - <<'EOF' || failed+=(imports)
import cupy, mpi4py, numba, numpy
from mpi4py import MPI
import meshchain
print("python", __import__("sys").version.split()[0], "numpy", numpy.__version__, "numba", numba.__version__,
      "cupy", cupy.__version__, "mpi4py", mpi4py.__version__)
print("MPI:", MPI.Get_library_version().splitlines()[0])
print("GPU:", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion())
from meshchain.backends.cuda.halo import mpi_is_cuda_aware
print("CUDA-aware MPI:", mpi_is_cuda_aware())
EOF

step "1. GPU tests (background) and the examples on cupy against numba"
timeout "${TESTS_TIMEOUT:-280}" "$PYTHON" -m pytest -p no:cacheprovider -q -rfEs --timeout 250 -k cupy \
    tests/test_cuda.py tests/test_cuda_halo.py tests/test_cuda_mpi.py tests/test_grids.py tests/test_capture.py \
    tests/test_dat_arithmetic.py tests/test_dat_minmax.py tests/test_extruded.py tests/test_inputs.py \
    tests/test_mixed.py tests/test_subsets.py > "$OUT/pytest.log" 2>&1 &
tests=$!
timeout "${EXAMPLES_TIMEOUT:-260}" "$PYTHON" benchmarks/gpu_examples.py --timeout 120 --out "$OUT/gpu_examples.json" \
    || failed+=(examples)
wait $tests || failed+=(tests)
tail -n 40 "$OUT/pytest.log"

step "2. benchmarks/gpu.py: Airfoil, 720 000 cells"
timeout "${BENCH_TIMEOUT:-100}" "$PYTHON" benchmarks/gpu.py --size 400 600 --iters 100 --out "$OUT/gpu.json" \
    || failed+=(gpu.py)

step "2. benchmarks/gpu_kernels.py: Airfoil's kernels alone, launched back to back, and their floors"
timeout "${BENCH_TIMEOUT:-100}" "$PYTHON" benchmarks/gpu_kernels.py --size 400 600 --out "$OUT/gpu_kernels.json" \
    || failed+=(gpu_kernels.py)

step "2. benchmarks/gpu_halos.py: 2 ranks sharing the GPU, 720 000 cells"
timeout "${BENCH_TIMEOUT:-100}" "$PYTHON" benchmarks/gpu_halos.py --size 400 600 --iters 50 --out "$OUT/gpu_halos.json" \
    || failed+=(gpu_halos.py)

step "done; failed: ${failed[*]:-nothing}"
[ ${#failed[@]} -eq 0 ]
