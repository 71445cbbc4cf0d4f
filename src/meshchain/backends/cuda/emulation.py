"""Run the generated CUDA source on the CPU: the host emulation used by tests without a GPU.

The source is compiled as C++ with ``-DMC_EMULATION`` and :data:`HEADER` included first.
The header stands in for the CUDA built-ins: ``threadIdx``/``blockIdx``/``blockDim``/
``gridDim``, ``__global__``/``__device__``/``__shared__``/``__constant__``, ``atomicAdd``
and ``__syncthreads``. A launch runs the blocks one after another; the threads of a
block are cooperative fibers (``ucontext``) on one OS thread, switched round-robin:
``__syncthreads`` yields to the next thread, so every thread of the block reaches a
barrier before any goes past it, exactly as on the GPU. ``__shared__`` variables become
function statics, shared by the fibers of the running block. Nothing runs
concurrently, so ``atomicAdd`` is a plain add (the emulation cannot show a race; the
colouring and atomics are exercised for their results).

Each generated module is compiled once into ``<cache_dir>/cuda-emulation/<hash>.so``
and called through :mod:`ctypes` (``mc_launch``, defined by the generated source); the
source is kept beside it as ``<hash>.cu``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import llvmlite.binding

from ...core.errors import BackendUnavailableError, CompilationError
from ..generated import save_source

__all__ = ["HEADER", "compile_emulated", "compiler"]

HEADER = r"""
// meshchain CUDA host emulation: stands in for the CUDA built-ins (see meshchain.backends.cuda.emulation).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <ucontext.h>
using std::fabs; using std::floor; using std::fmod; using std::sqrt; using std::pow;
struct mc_dim3 { unsigned x = 1, y = 1, z = 1; };
static mc_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __constant__
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, sizeof d); return d; }
template <typename T, typename U> static inline T atomicAdd(T* address, U value) {
    T old = *address; *address = old + (T)value; return old; }

namespace mc_emulation {
static ucontext_t scheduler;
static std::vector<ucontext_t> fibers;
static std::vector<char> stacks;
static std::vector<char> finished;
static const std::function<void()>* body = nullptr;
static unsigned current = 0;
static const size_t stack_size = 256 * 1024;
static void trampoline() { (*body)(); finished[current] = 1; }
}  // namespace mc_emulation

static inline void __syncthreads() {
    using namespace mc_emulation;
    swapcontext(&fibers[current], &scheduler);
}

static void mc_emulate(unsigned grid, unsigned block, const std::function<void()>& kernel) {
    using namespace mc_emulation;
    gridDim.x = grid; blockDim.x = block;
    fibers.resize(block); finished.assign(block, 0); stacks.resize((size_t)block * stack_size);
    body = &kernel;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        for (unsigned t = 0; t < block; ++t) {
            getcontext(&fibers[t]);
            fibers[t].uc_stack.ss_sp = &stacks[(size_t)t * stack_size];
            fibers[t].uc_stack.ss_size = stack_size;
            fibers[t].uc_link = &scheduler;
            makecontext(&fibers[t], trampoline, 0);
            finished[t] = 0;
        }
        for (bool running = true; running;) {
            running = false;
            for (unsigned t = 0; t < block; ++t) {
                if (finished[t]) continue;
                current = t; threadIdx.x = t;
                swapcontext(&scheduler, &fibers[t]);
                running = running || !finished[t];
            }
        }
    }
}
"""


def compiler() -> str:
    """The C++ compiler the emulation uses (``$CXX`` or ``g++``); raises when there is none."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise BackendUnavailableError(
            f"the CUDA host emulation needs a C++ compiler; {name!r} was not found (set CXX or install g++)."
        )
    return path


def compile_emulated(source: str, directory: Path, *, what: str, contract: bool = False):
    """Compile ``source`` (a generated module) for the emulation; return its ``mc_launch``.

    ``contract``: multiplies and adds are fused as a GPU fuses them (:func:`contraction_flags`);
    without it, never. The library goes to ``directory/<hash>.so`` (written atomically, reused
    by later runs).
    """
    header = save_source(directory, f"mc_emulation_{_digest(HEADER)}", ".h", HEADER)
    contraction = contraction_flags(contract)
    digest = _digest(HEADER + " ".join(contraction) + source)
    library = directory / f"{digest}.so"
    if not library.exists():
        cu = save_source(directory, digest, ".cu", source)
        temporary = directory / f".{digest}.{os.getpid()}.so"
        command = [compiler(), "-std=c++17", "-O1", *contraction, "-shared", "-fPIC", "-DMC_EMULATION",
                   "-include", str(header), "-x", "c++", str(cu), "-o", str(temporary)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise CompilationError(f"the CUDA emulation could not compile {what}; source: {cu}\n"
                                   + "\n".join(done.stderr.splitlines()[:20]))
        os.replace(temporary, library)
    return ctypes.CDLL(str(library)).mc_launch


def contraction_flags(contract: bool) -> list[str]:
    """The C++ compiler's flags for ``fp_contract``: ``-ffp-contract=off`` without it (GCC fuses
    by default where the processor can, on AArch64 say); with it ``-ffp-contract=fast``, and
    ``-mfma`` on an x86-64 processor that has fused multiply-adds (without it GCC has no
    instruction to fuse with) with ``-fexpensive-optimizations`` (the pass that forms them, off
    at the emulation's ``-O1``), so that the emulation fuses as the GPU's ``--fmad=true`` does."""
    if not contract:
        return ["-ffp-contract=off"]
    return ["-ffp-contract=fast", *(["-mfma", "-fexpensive-optimizations"] if host_fuses() else [])]


@functools.lru_cache(maxsize=None)
def host_fuses() -> bool:
    """Whether this is an x86-64 processor with fused multiply-add instructions."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return bool(llvmlite.binding.get_host_cpu_features().get("fma"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]
