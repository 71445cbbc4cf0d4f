"""The numba backend against the reference backend on random meshes and loops.

Hypothesis draws sets, maps (random arity and values), and loops whose arguments
take every kind (direct, per-index, whole map, global), access mode, dim and dtype.
All data are small integers, so every dtype computes exactly and the two backends
must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc

DTYPES = (np.float64, np.float32, np.int32, np.int64)
DAT_MODES = (mc.READ, mc.WRITE, mc.RW, mc.INC)
GLOBAL_MODES = (mc.READ, mc.INC, mc.MIN, mc.MAX)


@st.composite
def loop_specs(draw):
    """A mesh (iteration set, 1-2 target sets, maps) and a list of argument descriptions."""
    n_iter = draw(st.integers(0, 40))
    targets = draw(st.lists(st.integers(1, 25), min_size=1, max_size=2))
    maps = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.integers(0, len(targets) - 1))
        arity = draw(st.integers(1, 3))
        seed = draw(st.integers(0, 2**31))
        values = np.random.default_rng(seed).integers(0, targets[target], size=(n_iter, arity))
        maps.append((target, arity, values))
    args = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(("direct", "indirect", "whole_map", "global", "paired_inc")))
        dim = draw(st.integers(1, 3))
        dtype = draw(st.sampled_from(DTYPES))
        seed = draw(st.integers(0, 2**31))
        mode = draw(st.sampled_from(GLOBAL_MODES if kind == "global" else DAT_MODES))
        map_id = draw(st.integers(0, len(maps) - 1))
        index = draw(st.integers(0, maps[map_id][1] - 1))
        own_map = None
        if kind in ("indirect", "whole_map") and mode in (mc.WRITE, mc.RW):
            # order-independent results need each target element written by one iteration only
            arity = maps[map_id][1]
            size = n_iter * arity + draw(st.integers(0, 5))
            own_map = np.random.default_rng(seed).permutation(size)[: n_iter * arity].reshape(n_iter, arity)
        args.append(dict(kind=kind, dim=dim, dtype=dtype, seed=seed, mode=mode, map=map_id, index=index,
                         own_map=own_map))
    return n_iter, targets, maps, args


def _values(rng, shape, dtype):
    return rng.integers(-5, 6, size=shape).astype(dtype)


def build(spec):
    """Declare the mesh and the loop arguments; return (iterset, args, objects to compare)."""
    n_iter, target_sizes, map_specs, arg_specs = spec
    iterset = mc.Set(n_iter, "it")
    targets = [mc.Set(n, f"t{i}") for i, n in enumerate(target_sizes)]
    maps = [mc.Map(iterset, targets[t], a, v, f"m{i}") for i, (t, a, v) in enumerate(map_specs)]
    loop_args, objects = [], []
    for a in arg_specs:
        rng = np.random.default_rng(a["seed"])
        m = maps[a["map"]]
        if a.get("own_map") is not None:
            own = a["own_map"]
            size = max(int(own.max()) + 1, 1) if own.size else 1
            m = mc.Map(iterset, mc.Set(size, "own"), own.shape[1], own, "own_map")
        if a["kind"] == "global":
            obj = mc.Global(a["dim"], _values(rng, a["dim"], a["dtype"]), "g", dtype=a["dtype"])
            loop_args.append(obj(a["mode"]))
        elif a["kind"] == "direct":
            obj = mc.Dat(iterset, a["dim"], _values(rng, (n_iter, a["dim"]), a["dtype"]), "d", dtype=a["dtype"])
            loop_args.append(obj(a["mode"]))
        else:
            obj = mc.Dat(m.target, a["dim"], _values(rng, (m.target.size, a["dim"]), a["dtype"]), "d", dtype=a["dtype"])
            if a["kind"] == "indirect":
                loop_args.append(obj(a["mode"], m[a["index"]]))
            elif a["kind"] == "whole_map":
                loop_args.append(obj(a["mode"], m))
            else:  # the same dat incremented through two columns of one map (res1/res2 pattern)
                loop_args += [obj(mc.INC, m[a["index"]]), obj(mc.INC, m[m.arity - 1 - a["index"]])]
        objects.append(obj)
    return iterset, loop_args, objects


INTEGER_UPDATES = {
    "read": "s += {value}",
    mc.WRITE: "{target} = {cast}(s) + {k + j}",
    mc.RW: "{target} = {target} * 2 + {cast}(s)",
    mc.INC: "{target} += {cast}(s) + {j + 1}",
    mc.MIN: "{target} = min({target}, {cast}(s) - {j})",
    mc.MAX: "{target} = max({target}, {cast}(s) + {j})",
}


def kernel_source(loop_args, updates=None, *, name="generated", start="0") -> str:
    """A kernel that reads every readable value into ``s`` and writes every writable one.

    ``updates`` maps ``"read"`` and each writing access to a line template (fields: ``value``
    read, ``target`` written, ``k`` argument position, ``j`` value index, ``cast`` int or
    float by the dat's dtype, with ``k + j`` and ``j + 1`` precomputed); default
    ``INTEGER_UPDATES``, exact on integer data."""
    updates = INTEGER_UPDATES if updates is None else updates
    params = [f"a{i}" for i in range(len(loop_args))]
    lines = [f"def {name}({', '.join(params)}):", f"    s = {start}"]
    for p, arg in zip(params, loop_args):
        if arg.access in (mc.READ, mc.RW):
            lines += ["    " + updates["read"].format(value=f"{p}[{ix}]") for ix in _indices(arg)]
    for k, (p, arg) in enumerate(zip(params, loop_args)):
        cast = "int" if np.dtype(arg.data.dtype).kind in "iu" else "float"
        for j, ix in enumerate(_indices(arg)):
            template = updates.get(arg.access)
            if template is not None:
                fields = {"target": f"{p}[{ix}]", "cast": cast, "k": k, "j": j, "k + j": k + j, "j + 1": j + 1}
                lines.append("    " + template.format_map(fields))
    return "\n".join(lines) + "\n"


def _indices(arg):
    shape = arg.view_shape
    if len(shape) == 1:
        return [str(j) for j in range(shape[0])]
    return [f"{r}, {c}" for r in range(shape[0]) for c in range(shape[1])]


def run_on(backend, spec, *, repeat=2):
    mc.configure(backend=backend)
    iterset, loop_args, objects = build(spec)
    kernel = mc.Kernel.from_source(kernel_source(loop_args))
    for _ in range(repeat):
        mc.par_loop(kernel, iterset, *loop_args)
    return [obj.value if obj.is_global else obj.data.copy() for obj in objects]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=loop_specs(), block_size=st.sampled_from([1, 3, 7, 512]))
def test_numba_matches_reference_bit_for_bit(spec, block_size):
    mc.configure(block_size=block_size)
    expected = run_on("reference", spec)
    actual = run_on("numba", spec)
    for want, got in zip(expected, actual):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_generated_kernel_touches_every_written_value(backend):
    """Guard against a vacuous property test: the generated kernels do change the data."""
    values = np.array([[0, 1], [1, 2]])
    spec = (2, [3], [(0, 2, values)],
            [dict(kind="indirect", dim=1, dtype=np.int32, seed=0, mode=mc.INC, map=0, index=0),
             dict(kind="global", dim=1, dtype=np.int64, seed=1, mode=mc.INC, map=0, index=0)])
    before = [o.value if o.is_global else o.data.copy() for o in build(spec)[2]]
    after = run_on(backend, spec, repeat=1)
    assert all(not np.array_equal(b, a) for b, a in zip(before, after))


def _compiled_entries(kernel_name: str) -> dict:
    """How many signatures of ``kernel_name``'s loop entry points the numba backend holds compiled
    (the generated modules outlive a runtime: these counts only grow)."""
    executors = [e for e in mc.get_runtime().backend._executors.values() if kernel_name in e.module_name]
    return {"parallel": sum(len(e.dispatcher.overloads) for e in executors),
            "serial": sum(len(e.serial.overloads) for e in executors)}


def test_a_loop_compiles_its_parallel_region_only_when_a_colour_can_run_on_two_threads():
    """Where no colour holds two blocks (a small mesh) or one thread runs, a loop runs its serial
    entry point, which runs the same blocks in the same order as the parallel one would on one
    thread: the same bits, and no parallel region to compile (about half a second a loop)."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")
    values = np.random.default_rng(5).integers(0, 25, (40, 2))
    spec = (40, [25], [(0, 2, values)],
            [{"kind": "paired_inc", "dim": 2, "dtype": np.float64, "seed": 1, "map": 0, "index": 0, "mode": mc.INC},
             {"kind": "global", "dim": 1, "dtype": np.int64, "seed": 2, "map": 0, "mode": mc.INC}])
    results = []
    for threads, block_size, parallel_compiled in ((2, 4096, False), (1, 1, False), (2, 1, True)):
        mc.reset_runtime(cache_dir=mc.get_runtime().config.cache_dir)
        mc.configure(backend="numba", threads=threads, block_size=block_size)
        iterset, loop_args, objects = build(spec)
        kernel = mc.Kernel.from_source(kernel_source(loop_args, name="entry_point_choice"))
        mc.par_loop(kernel, iterset, *loop_args)
        results.append([obj.value if obj.is_global else obj.data.copy() for obj in objects])
        assert mc.stats().loops["entry_point_choice"].colours > (block_size == 1)  # block_size 1: colours of many blocks
        compiled = _compiled_entries("entry_point_choice")
        assert compiled["serial"] > 0 and (compiled["parallel"] > 0) == parallel_compiled, (threads, block_size, compiled)
    for other in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results[0], other))
