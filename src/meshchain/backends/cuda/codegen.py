"""CUDA C source of one loop: the translated kernel plus a ``__global__`` wrapper.

The wrapper ``mc_loop`` gives each thread one iteration: iteration ``mc_start + t``,
or ``mc_list[t]`` when ``mc_listed`` is set (the iterations of one colour, or of one
sparse tile). Per argument kind:

- direct: a pointer to the element's row; or, for a row of a few values that no other
  argument touches, a local copy loaded before the kernel and stored after it (all of a
  row's accesses together, which doubles Airfoil's ``update`` bandwidth on a GPU);
- per-index through a map: a pointer to row ``map[e, i]``; ``INC`` accumulates in a
  zeroed local row that is added with ``atomicAdd`` after the kernel (or with a plain
  ``+=`` when the launch runs one colour of a colouring, ``increments="colour"``);
- whole map: rows gathered into a local ``(arity, dim)`` array, scattered back after
  (``INC`` starts from zeros and adds, like per-index ``INC``);
- through an extruded map in a loop over every layer (:attr:`~meshchain.ir.loop.ArgSpec.layers`):
  the map holds the bottom layer's rows only; iteration ``e`` is layer ``e % layers`` of column
  ``e / layers``, and its target is the column's bottom-layer value plus the layer times the
  map column's offset;
- global ``READ``: the device copy; ``INC``/``MIN``/``MAX``: a thread-local row, then a
  tree reduction in shared memory (``__syncthreads`` between levels) whose result
  thread 0 writes to one partial row per block; the host combines the partials in
  block order, so results do not depend on timing.

The same text builds with NVRTC (``cupy.RawModule``), with ``nvcc``, and as C++ for the
host emulation (:mod:`.emulation`), which also compiles the ``MC_EMULATION`` launcher at
the end.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.ir.loop import make_loop
>>> from meshchain.backends.cuda.codegen import loop_source
>>> cells = mc.Set(4, "cells")
>>> q, total = mc.Dat(cells, 1, None, "q"), mc.Global(1, 0.0, "total")
>>> k = mc.Kernel.from_source("def f(a, s):\\n    s[0] += a[0]\\n")
>>> source = loop_source(make_loop(k, cells, (q(mc.READ), total(mc.INC))), threads=128, colour=False).text
>>> "__global__ void mc_loop(" in source and "__syncthreads();" in source
True
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.access import Access
from ...types.args import DIRECT, GLOBAL, INDIRECT, WHOLE_MAP
from .translate import translate
from .types import View, c_type

__all__ = ["loop_source", "LoopSource", "PRELUDE"]

PRELUDE = r"""
#ifndef MC_EMULATION
#define MC_DEVICE_INLINE __device__ __forceinline__
#else
#define MC_DEVICE_INLINE static inline
#endif
MC_DEVICE_INLINE long long mc_wrap(long long i, long long n) { return i < 0 ? i + n : i; }
template <typename T> MC_DEVICE_INLINE T mc_min(T a, T b) { return b < a ? b : a; }
template <typename T> MC_DEVICE_INLINE T mc_max(T a, T b) { return b > a ? b : a; }
MC_DEVICE_INLINE double mc_abs(double a) { return fabs(a); }
MC_DEVICE_INLINE float mc_abs(float a) { return fabsf(a); }
MC_DEVICE_INLINE long long mc_abs(long long a) { return a < 0 ? -a : a; }
MC_DEVICE_INLINE int mc_abs(int a) { return a < 0 ? -a : a; }
MC_DEVICE_INLINE long long mc_floordiv(long long a, long long b) {
    long long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
MC_DEVICE_INLINE int mc_floordiv(int a, int b) {
    int q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
MC_DEVICE_INLINE double mc_floordiv(double a, double b) { return floor(a / b); }
MC_DEVICE_INLINE float mc_floordiv(float a, float b) { return floorf(a / b); }
MC_DEVICE_INLINE long long mc_mod(long long a, long long b) {
    long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
MC_DEVICE_INLINE int mc_mod(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
MC_DEVICE_INLINE double mc_mod(double a, double b) {
    double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
MC_DEVICE_INLINE float mc_mod(float a, float b) {
    float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
MC_DEVICE_INLINE long long mc_ipow(long long b, long long e) {
    long long r = 1; if (e < 0) return 0; while (e) { if (e & 1) r *= b; b *= b; e >>= 1; } return r; }
MC_DEVICE_INLINE double mc_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
MC_DEVICE_INLINE double mc_nan() { return __longlong_as_double(0x7ff8000000000000LL); }
MC_DEVICE_INLINE void mc_atomic_add(double* a, double v) { atomicAdd(a, v); }
MC_DEVICE_INLINE void mc_atomic_add(float* a, float v) { atomicAdd(a, v); }
MC_DEVICE_INLINE void mc_atomic_add(int* a, int v) { atomicAdd(a, v); }
MC_DEVICE_INLINE void mc_atomic_add(long long* a, long long v) {
    atomicAdd((unsigned long long*)a, (unsigned long long)v); }
MC_DEVICE_INLINE void mc_atomic_add(unsigned int* a, unsigned int v) { atomicAdd(a, v); }
MC_DEVICE_INLINE void mc_atomic_add(unsigned long long* a, unsigned long long v) { atomicAdd(a, v); }
"""


@dataclass(frozen=True)
class LoopSource:
    """Generated source and what the launcher must pass: ``params`` lists ``(kind, number)``
    after ``(mc_start, mc_n, mc_list, mc_listed)``: ``("data", slot)``, ``("map", map slot)``
    or ``("partial", reduction argument position)``."""

    text: str
    params: tuple
    reductions: tuple


def loop_source(loop, *, threads: int, colour: bool, stage_rows: bool = True) -> LoopSource:
    """The CUDA source of ``loop``: blocks of ``threads`` threads (a power of two); with
    ``colour`` the indirect increments are plain adds (each launch runs one colour);
    ``stage_rows=False`` passes direct rows as pointers instead of staging them (see
    :func:`_staged_rows`; for ``benchmarks/gpu_kernels.py``, which measures the difference)."""
    specs = loop.specs
    views = [_kernel_view(s) for s in specs]
    unit = translate(loop.kernel, views, name="mc_kernel")
    params, arguments = _parameters(loop)
    reductions = tuple(i for i, s in enumerate(specs) if s.kind == GLOBAL and s.access is not Access.READ)
    staged = _staged_rows(specs) if stage_rows else set()
    body = ["    const long long mc_t = (long long)blockIdx.x * blockDim.x + threadIdx.x;"]
    body += [line for i, s in enumerate(specs) for line in _reduction_local(i, s)]
    body += ["    if (mc_t < mc_n) {",
             "        const long long mc_e = mc_listed ? mc_list[mc_t] : mc_start + mc_t;"]
    body += ["        " + line for line in _layer_lines(specs)]
    body += ["        " + line for i, s in enumerate(specs) for line in _before(i, s, i in staged)]
    body.append(f"        mc_kernel({', '.join(_argument(i, s, i in staged) for i, s in enumerate(specs))});")
    body += ["        " + line for i, s in enumerate(specs) for line in _after(i, s, colour, i in staged)]
    body.append("    }")
    body += [line for i in reductions for line in _block_reduction(i, specs[i])]
    signature = ("long long mc_start, long long mc_n, const long long* mc_list, int mc_listed"
                 + "".join(f", {a}" for a in arguments))
    header = [f"// Generated by meshchain for loop {loop.name!r} (kernel {loop.kernel.name!r}). Do not edit.",
              f"#define MC_THREADS {threads}", PRELUDE]
    launcher = [
        "#ifdef MC_EMULATION",
        f'extern "C" void mc_launch(unsigned mc_grid, {signature}) {{',
        "    mc_emulate(mc_grid, MC_THREADS, [&]() { mc_loop(mc_start, mc_n, mc_list, mc_listed"
        + "".join(f", {_NAMES[kind]}{number}" for kind, number in params) + "); });",
        "}",
        "#endif",
    ]
    text = "\n".join([*header, unit.source, "", f'extern "C" __global__ void mc_loop({signature})', "{", *body,
                      "}", *launcher, ""])
    return LoopSource(text, tuple(params), reductions)


_NAMES = {"data": "d", "map": "m", "partial": "p"}


def _ctype(spec) -> str:
    return c_type(spec.dtype)


def _kernel_view(spec) -> View:
    shape = (spec.arity, spec.dim) if spec.kind == WHOLE_MAP else (spec.dim,)
    const = spec.access is Access.READ
    return View(_ctype(spec), shape, const)


def _parameters(loop):
    """``[(kind, number)]`` and their C declarations: data slots, maps, partials."""
    specs = loop.specs
    params, declarations = [], []
    slots = {}
    for s in specs:
        slots.setdefault(s.slot, []).append(s)
    for slot in sorted(slots):
        first = slots[slot][0]
        read_only = all(s.access is Access.READ or s.kind == GLOBAL for s in slots[slot])
        params.append(("data", slot))
        declarations.append(f"const {_ctype(first)}* __restrict__ d{slot}" if read_only else f"{_ctype(first)}* d{slot}")
    for m in sorted({s.map_slot for s in specs if s.map_slot >= 0}):
        params.append(("map", m))
        declarations.append(f"const int* __restrict__ m{m}")
    for i, s in enumerate(specs):
        if s.kind == GLOBAL and s.access is not Access.READ:
            params.append(("partial", i))
            declarations.append(f"{_ctype(s)}* p{i}")
    return params, declarations


def _row(s) -> str:
    return "mc_e" if s.kind == DIRECT else _target(s, s.index)


def _target(s, column) -> str:
    """The row that map column ``column`` (a number, or ``a`` in a loop over a whole map) of
    argument ``s`` reaches from iteration ``mc_e``: read from the map, or for an extruded map
    found per layer (:attr:`~meshchain.ir.loop.ArgSpec.layers`: the loop gets the bottom layer's
    rows) the column's bottom-layer value plus the layer times the map column's offset."""
    if not s.layers:
        return f"(long long)m{s.map_slot}[mc_e * {s.arity} + {column}]"
    offsets = s.layers[1:]
    offset = offsets[0] if len(set(offsets)) == 1 else f"mc_o{s.map_slot}[{column}]"
    return f"((long long)m{s.map_slot}[mc_col * {s.arity} + {column}] + mc_lay * {offset})"


def _layer_lines(specs) -> list:
    """``mc_col`` and ``mc_lay`` (column and layer of iteration ``mc_e``) and the offsets of whole
    extruded maps whose map columns move by different offsets, for loops that find targets per layer."""
    layered = [s for s in specs if s.layers]
    if not layered:
        return []
    layers = layered[0].layers[0]
    lines = [f"const long long mc_col = mc_e / {layers}, mc_lay = mc_e - mc_col * {layers};"]
    uneven = {s.map_slot: s.layers[1:] for s in layered if len(set(s.layers[1:])) > 1}  # whole maps only
    lines += [f"const long long mc_o{slot}[{len(offsets)}] = {{{', '.join(map(str, offsets))}}};"
              for slot, offsets in uneven.items()]
    return lines


def _reduction_local(i, s) -> list:
    if not (s.kind == GLOBAL and s.access is not Access.READ):
        return []
    t = _ctype(s)
    if s.access is Access.INC:
        return [f"    {t} mc_r{i}[{s.dim}];", f"    for (int k = 0; k < {s.dim}; ++k) mc_r{i}[k] = ({t})0;"]
    return [f"    {t} mc_r{i}[{s.dim}];", f"    for (int k = 0; k < {s.dim}; ++k) mc_r{i}[k] = d{s.slot}[k];"]


#: Direct rows of at most this many values are staged in registers (see :func:`_staged_rows`).
STAGED_ROW_LIMIT = 16


def _staged_rows(specs) -> set:
    """The direct arguments whose row is copied into a local array before the kernel and
    (unless read-only) back after it: all the row's loads, then all its stores, issued
    together, so that a warp's strided accesses to rows of several values meet in the
    cache instead of being fetched again between the kernel's statements (Airfoil's
    ``update`` on an H200: 69.0 -> 36.0 us at 720 000 cells, ``benchmarks/gpu_kernels.py``).
    Not for ``WRITE`` (its stores go straight to memory: a kernel may write only part of the
    row, and loading the rest would cost a read), nor for a dat that another argument of the
    loop uses (two copies of one row would not see each other's writes), nor rows too long
    for registers."""
    uses = {}
    for s in specs:
        uses[s.slot] = uses.get(s.slot, 0) + 1
    return {i for i, s in enumerate(specs)
            if s.kind == DIRECT and s.access is not Access.WRITE and uses[s.slot] == 1 and s.dim <= STAGED_ROW_LIMIT}


def _before(i, s, staged: bool = False) -> list:
    t = _ctype(s)
    if staged:
        return [f"{t} mc_v{i}[{s.dim}];",
                f"for (int k = 0; k < {s.dim}; ++k) mc_v{i}[k] = d{s.slot}[mc_e * {s.dim} + k];"]
    if s.kind == INDIRECT and s.access is Access.INC:
        return [f"{t} mc_l{i}[{s.dim}];", f"for (int k = 0; k < {s.dim}; ++k) mc_l{i}[k] = ({t})0;"]
    if s.kind != WHOLE_MAP:
        return []
    size = s.arity * s.dim
    if s.access is Access.INC:
        return [f"{t} mc_w{i}[{size}];", f"for (int k = 0; k < {size}; ++k) mc_w{i}[k] = ({t})0;"]
    return [f"{t} mc_w{i}[{size}];",
            f"for (int a = 0; a < {s.arity}; ++a) {{",
            f"    const long long row = {_target(s, 'a')};",
            f"    for (int k = 0; k < {s.dim}; ++k) mc_w{i}[a * {s.dim} + k] = d{s.slot}[row * {s.dim} + k];",
            "}"]


def _argument(i, s, staged: bool = False) -> str:
    if staged:
        return f"mc_v{i}"
    if s.kind == GLOBAL:
        return f"d{s.slot}" if s.access is Access.READ else f"mc_r{i}"
    if s.kind == WHOLE_MAP:
        return f"mc_w{i}"
    if s.kind == INDIRECT and s.access is Access.INC:
        return f"mc_l{i}"
    return f"d{s.slot} + {_row(s)} * {s.dim}"


def _after(i, s, colour: bool, staged: bool = False) -> list:
    def add(target, value):
        return f"{target} += {value};" if colour else f"mc_atomic_add(&{target}, {value});"

    if staged:
        if s.access is Access.READ:
            return []
        return [f"for (int k = 0; k < {s.dim}; ++k) d{s.slot}[mc_e * {s.dim} + k] = mc_v{i}[k];"]

    if s.kind == INDIRECT and s.access is Access.INC:
        return [f"{{ const long long row = {_row(s)};",
                f"  for (int k = 0; k < {s.dim}; ++k) {add(f'd{s.slot}[row * {s.dim} + k]', f'mc_l{i}[k]')} }}"]
    if s.kind != WHOLE_MAP or s.access is Access.READ:
        return []
    target, value = f"d{s.slot}[row * {s.dim} + k]", f"mc_w{i}[a * {s.dim} + k]"
    if s.access is Access.INC:
        store = add(target, value)
    elif s.access in (Access.MIN, Access.MAX):  # a target the map row reaches twice keeps the extreme of both
        store = f"{target} = mc_{s.access.name.lower()}({target}, {value});"
    else:
        store = f"{target} = {value};"
    return [f"for (int a = 0; a < {s.arity}; ++a) {{",
            f"    const long long row = {_target(s, 'a')};",
            f"    for (int k = 0; k < {s.dim}; ++k) {store}",
            "}"]


def _block_reduction(i, s) -> list:
    t = _ctype(s)
    combine = {Access.INC: "a + b", Access.MIN: "mc_min(a, b)", Access.MAX: "mc_max(a, b)"}[s.access]
    return [
        "    {",
        f"        __shared__ {t} mc_s{i}[MC_THREADS];",
        f"        for (int k = 0; k < {s.dim}; ++k) {{",
        f"            mc_s{i}[threadIdx.x] = mc_r{i}[k];",
        "            __syncthreads();",
        "            for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {",
        "                if (threadIdx.x < h) {",
        f"                    const {t} a = mc_s{i}[threadIdx.x], b = mc_s{i}[threadIdx.x + h];",
        f"                    mc_s{i}[threadIdx.x] = {combine};",
        "                }",
        "                __syncthreads();",
        "            }",
        f"            if (threadIdx.x == 0) p{i}[blockIdx.x * {s.dim} + k] = mc_s{i}[0];",
        "            __syncthreads();",
        "        }",
        "    }",
    ]
