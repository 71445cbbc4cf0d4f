"""Bad input gets a specific MeshchainError that names the object and says how to fix it.

One test per bad input. Each asserts the exception class and, through ``match``, that
the message names the offending object and contains a hint of the fix. Errors that
come from executing a loop are checked on both backends (the ``backend`` fixture).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import meshchain as mc
from meshchain.core.config import Config

# --------------------------------------------------------------------------- #
# A small mesh shared by the tests (4 edges over 3 nodes, 2 cells)
# --------------------------------------------------------------------------- #
EDGE_NODES = np.array([[0, 1], [1, 2], [2, 0], [0, 2]])


@pytest.fixture
def mesh():
    nodes, edges, cells = mc.Set(3, "nodes"), mc.Set(4, "edges"), mc.Set(2, "cells")
    e2n = mc.Map(edges, nodes, 2, EDGE_NODES, "e2n")
    c2n = mc.Map(cells, nodes, 3, [[0, 1, 2], [2, 1, 0]], "c2n")
    return dict(nodes=nodes, edges=edges, cells=cells, e2n=e2n, c2n=c2n)


@mc.kernel
def copy1(a, b):
    b[0] = a[0]


@mc.kernel
def set_first(a):
    a[0] = 5.0


# --------------------------------------------------------------------------- #
# Declarations: maps
# --------------------------------------------------------------------------- #
def test_map_value_out_of_range(mesh):
    values = EDGE_NODES.copy()
    values[2, 1] = 3
    with pytest.raises(mc.MapError, match=r"Map 'bad'.*value 3 at row 2.*'nodes' of size 3.*\[0, 3\)"):
        mc.Map(mesh["edges"], mesh["nodes"], 2, values, "bad")


def test_map_negative_value(mesh):
    values = EDGE_NODES.copy()
    values[1, 0] = -1
    with pytest.raises(mc.MapError, match=r"Map 'bad'.*-1 is negative \(row 1\).*0-based.*values - 1"):
        mc.Map(mesh["edges"], mesh["nodes"], 2, values, "bad")


def test_map_values_wrong_shape(mesh):  # flat values are taken (as OP2's C API does), but all of them
    with pytest.raises(mc.MapError, match=r"Map 'bad'.*shape \(7,\), expected \(4, 2\) \(or 8 values flat\); pass one row of 2"):
        mc.Map(mesh["edges"], mesh["nodes"], 2, EDGE_NODES.ravel()[:7], "bad")


def test_map_values_wrong_arity(mesh):
    values = np.zeros((4, 3), dtype=np.int64)
    with pytest.raises(mc.MapError, match=r"Map 'bad'.*arity 2.*shape \(4, 3\), expected \(4, 2\).*'edges'"):
        mc.Map(mesh["edges"], mesh["nodes"], 2, values, "bad")


def test_map_values_missing(mesh):
    with pytest.raises(mc.MapError, match=r"Map 'bad': values are missing; pass an integer array of shape \(4, 2\)"):
        mc.Map(mesh["edges"], mesh["nodes"], 2, None, "bad")


@pytest.mark.parametrize("values", [EDGE_NODES + 0.5, EDGE_NODES.astype(bool)], ids=["float", "bool"])
def test_map_values_not_integers(mesh, values):
    with pytest.raises(mc.MapError, match=r"Map 'bad': values must be integers.*astype\(np\.int64\)"):
        mc.Map(mesh["edges"], mesh["nodes"], 2, values, "bad")


@pytest.mark.parametrize("index", [2, -1])
def test_map_index_out_of_range(mesh, index):
    with pytest.raises(mc.MapError, match=rf"Map 'e2n' has arity 2: index {index} is out of range; use e2n\[0\] \.\.\. e2n\[1\]"):
        mesh["e2n"][index]


def test_map_index_not_an_int(mesh):
    with pytest.raises(mc.MapError, match=r"Map 'e2n': index must be an int in \[0, 2\)"):
        mesh["e2n"]["0"]


# --------------------------------------------------------------------------- #
# Declarations: dats and globals
# --------------------------------------------------------------------------- #
def test_dat_data_wrong_shape(mesh):
    with pytest.raises(mc.DataShapeError, match=r"Dat 'x' on 'nodes'.*shape \(3, 3\), expected \(3, 2\); pass one row of 2 values"):
        mc.Dat(mesh["nodes"], 2, np.zeros((3, 3)), "x")


def test_global_value_wrong_shape():
    with pytest.raises(mc.DataShapeError, match=r"Global 'g'.*shape \(3,\), expected \(2,\); pass a scalar or 2 values"):
        mc.Global(2, [1.0, 2.0, 3.0], "g")


def test_dat_bool_data(mesh):
    with pytest.raises(mc.DataShapeError, match=r"Dat 'flags' on 'nodes': boolean data is not supported; pass dtype=np\.int32"):
        mc.Dat(mesh["nodes"], 1, np.zeros(3, dtype=bool), "flags")


@pytest.mark.parametrize(
    ("data", "dtype", "shown"),
    [(None, bool, "bool"), (None, np.int16, "int16"), (np.zeros(3, dtype=complex), None, "complex128")],
    ids=["bool", "int16", "complex"],
)
def test_dat_unsupported_dtype(mesh, data, dtype, shown):
    with pytest.raises(mc.DataShapeError, match=rf"Dat 'x' on 'nodes': dtype {shown} is not supported; use one of float64, float32, int32, int64, uint32, uint64"):
        mc.Dat(mesh["nodes"], 1, data, "x", dtype=dtype)


def test_dat_dtype_not_a_dtype(mesh):
    with pytest.raises(mc.DataShapeError, match=r"Dat 'x' on 'nodes': dtype='banana' is not a NumPy dtype; use one of"):
        mc.Dat(mesh["nodes"], 1, None, "x", dtype="banana")


def test_dat_lossy_cast(mesh):
    with pytest.raises(mc.DataShapeError, match=r"Dat 'x' on 'nodes': cannot store float64 data as int32 .*pass dtype=float64"):
        mc.Dat(mesh["nodes"], 1, np.array([0.5, 1.0, 2.0]), "x", dtype=np.int32)


def test_dat_integer_overflow(mesh):
    with pytest.raises(mc.DataShapeError, match=r"Dat 'x' on 'nodes': values do not fit in int32; pass dtype=np\.int64"):
        mc.Dat(mesh["nodes"], 1, np.array([2**40, 0, 0]), "x", dtype=np.int32)


def test_dat_unsigned_overflow(mesh):
    data = np.array([2**32 - 1, 0, 0], dtype=np.uint32)
    with pytest.raises(mc.DataShapeError, match=r"Dat 'x' on 'nodes': values do not fit in int32"):
        mc.Dat(mesh["nodes"], 1, data, "x", dtype=np.int32)


def test_set_negative_size():
    with pytest.raises(mc.DeclarationError, match=r"Set cells size must be >= 0, got -1"):
        mc.Set(-1, "cells")


def test_dat_dim_zero(mesh):
    with pytest.raises(mc.DataShapeError, match=r"Dat 'x' dim must be >= 1, got 0"):
        mc.Dat(mesh["nodes"], 0, None, "x")


# --------------------------------------------------------------------------- #
# par_loop arguments
# --------------------------------------------------------------------------- #
def test_map_source_is_not_the_loop_set(mesh):
    x, y = mc.Dat(mesh["nodes"], 1, None, "x"), mc.Dat(mesh["nodes"], 1, None, "y")
    with pytest.raises(mc.SetMismatchError, match=r"par_loop 'copy1' over 'edges'.*map 'c2n'.*source set is 'cells'; use a map from 'edges'"):
        mc.par_loop(copy1, mesh["edges"], x(mc.READ, mesh["c2n"][0]), y(mc.WRITE, mesh["e2n"][0]))


def test_direct_dat_on_another_set(mesh):
    x, w = mc.Dat(mesh["nodes"], 1, None, "x"), mc.Dat(mesh["edges"], 1, None, "w")
    with pytest.raises(mc.SetMismatchError, match=r"par_loop 'copy1' over 'edges'.*Dat 'x'.*lives on 'nodes'; reach it through a map from 'edges'"):
        mc.par_loop(copy1, mesh["edges"], x(mc.READ), w(mc.WRITE))


def test_map_target_is_not_the_dat_set(mesh):
    q = mc.Dat(mesh["cells"], 1, None, "q")
    with pytest.raises(mc.SetMismatchError, match=r"Dat 'q' lives on 'cells' but map 'e2n' points to 'nodes'; use a map whose target is 'cells'"):
        q(mc.READ, mesh["e2n"][0])


def test_dat_path_not_a_map(mesh):
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    with pytest.raises(mc.SetMismatchError, match=r"Dat 'x': the path must be a Map, map\[i\] or a Stencil, got int"):
        x(mc.READ, 0)


def test_global_through_a_map(mesh):
    g = mc.Global(1, 0.0, "g")
    with pytest.raises(mc.SetMismatchError, match=r"Global 'g': globals are not reached through maps; call g\(mode\) without a map"):
        g(mc.READ, mesh["e2n"][0])


def test_kernel_argument_count_mismatch(mesh):
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    with pytest.raises(mc.ArgumentCountError, match=r"par_loop 'copy1': kernel 'copy1' takes 2 argument\(s\) \(a, b\) but the loop passes 1; pass one loop argument per kernel parameter"):
        mc.par_loop(copy1, mesh["nodes"], x(mc.RW))


@pytest.mark.parametrize("mode", [mc.WRITE, mc.RW])
def test_global_write_modes(mode):
    g = mc.Global(1, 0.0, "total")
    with pytest.raises(mc.AccessModeError, match=rf"Global 'total': access {mode.value} is not allowed;.*READ.*INC, MIN, MAX.*set \.value"):
        g(mode)


@pytest.mark.parametrize("mode", [mc.MIN, mc.MAX])
def test_dat_min_max_modes(mesh, mode):  # taken, directly and through maps (PyOP2's dat(op2.MAX, map))
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    assert x(mode).access is mode and x(mode, mesh["e2n"][0]).access is mode and x(mode, mesh["e2n"]).map is mesh["e2n"]
    with pytest.raises(mc.AccessModeError, match=r"Dat 'x': access must be one of mc.READ, .*mc.MAX, got 'up'"):
        x("up")


@pytest.mark.parametrize("owner", ["dat", "global"])
def test_access_mode_not_an_access(mesh, owner):
    obj = mc.Dat(mesh["nodes"], 1, None, "x") if owner == "dat" else mc.Global(1, 0.0, "x")
    with pytest.raises(mc.AccessModeError, match=r"(Dat|Global) 'x': access must be one of mc\.READ, .*got 'READ'"):
        obj("READ")


def test_dat_passed_without_access_mode(mesh):
    x = mc.Dat(mesh["nodes"], 1, None, "pressure")
    with pytest.raises(mc.LoopError, match=r"par_loop 'set_first': argument 0 is Dat 'pressure' without an access mode; pass pressure\(mc.READ\)"):
        mc.par_loop(set_first, mesh["nodes"], x)


def test_par_loop_kernel_not_a_kernel(mesh):
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    with pytest.raises(mc.LoopError, match=r"par_loop: the first argument must be a kernel \(decorate it with @mc\.kernel\), got int"):
        mc.par_loop(3, mesh["nodes"], x(mc.READ))


@pytest.mark.parametrize("second", [mc.READ, mc.WRITE])
def test_dat_written_and_read_in_one_loop(mesh, second):
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    with pytest.raises(mc.AccessModeError, match=rf"par_loop 'copy1': 'x' is passed 2 times with modes RW, {second.value}.*only if every use is INC.*split the loop"):
        mc.par_loop(copy1, mesh["edges"], x(mc.RW, mesh["e2n"][0]), x(second, mesh["e2n"][1]))


def test_global_reduced_and_read_in_one_loop(mesh):
    g = mc.Global(1, 0.0, "g")
    with pytest.raises(mc.AccessModeError, match=r"par_loop 'copy1': 'g' is passed 2 times with modes READ, INC"):
        mc.par_loop(copy1, mesh["nodes"], g(mc.READ), g(mc.INC))


# --------------------------------------------------------------------------- #
# Kernels: static checks
# --------------------------------------------------------------------------- #
UNSUPPORTED = {
    "nested def": ("def k(a):\n    def g(v):\n        return v\n    a[0] = g(1.0)\n", 2, "a nested function definition"),
    "lambda": ("def k(a):\n    a[0] = 1.0\n    g = lambda v: v\n", 3, "a lambda"),
    "try": ("def k(a):\n    try:\n        a[0] = 1.0\n    except Exception:\n        pass\n", 2, "a try statement"),
    "import": ("def k(a):\n    import math\n    a[0] = math.pi\n", 2, "an import"),
    "with": ("def k(a):\n    with a:\n        a[0] = 1.0\n", 2, "a with statement"),
    "global": ("def k(a):\n    global Z\n    a[0] = 1.0\n", 2, "a 'global' statement"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_kernel_unsupported_construct(case):
    source, line, what = UNSUPPORTED[case]
    with pytest.raises(mc.KernelError, match=rf"kernel 'k' at <meshchain kernel source>:{line}: {re.escape(what)} is not supported in kernels"):
        mc.Kernel.from_source(source)


def test_kernel_unsupported_construct_in_decorated_function():
    with pytest.raises(mc.KernelError) as info:
        @mc.kernel
        def with_lambda(a):
            a[0] = (lambda v: v)(1.0)
    line = sys._getframe().f_lineno - 1  # the line of the lambda, just above
    assert f"kernel 'with_lambda' at {__file__}:{line}: a lambda is not supported in kernels" in str(info.value)


def test_kernel_with_varargs():
    with pytest.raises(mc.KernelError, match=r"kernel 'k': parameters must be plain positional names .*without defaults, \*args or \*\*kwargs"):
        mc.Kernel.from_source("def k(*a):\n    pass\n")


def test_kernel_source_with_two_functions():
    with pytest.raises(mc.KernelError, match=r"Kernel\.from_source: the source must define exactly one function, found \['f', 'g'\]"):
        mc.Kernel.from_source("def f(a):\n    pass\ndef g(a):\n    pass\n")


def test_kernel_source_with_syntax_error():
    with pytest.raises(mc.KernelError, match=r"kernel .*cannot parse"):
        mc.Kernel.from_source("def k(a):\n    a[0] =\n")


def test_kernel_not_a_function():
    with pytest.raises(mc.KernelError, match=r"mc\.kernel expects a Python function, got int"):
        mc.kernel(3)


SOME_DICT = {"scale": 2.0}


@mc.kernel
def uses_undefined(a):
    a[0] = NOT_DEFINED_ANYWHERE  # noqa: F821 - on purpose


@mc.kernel
def uses_sum(a):
    a[0] = sum((1.0, 2.0))


@mc.kernel
def uses_dict(a):
    a[0] = SOME_DICT["scale"]


BAD_GLOBALS = {
    "undefined": (uses_undefined, r"kernel 'uses_undefined' uses 'NOT_DEFINED_ANYWHERE', which is not defined; define it at module level"),
    "builtin": (uses_sum, r"kernel 'uses_sum' uses the builtin 'sum', which kernels do not support; allowed builtins: abs"),
    "dict": (uses_dict, r"kernel 'uses_dict': global 'SOME_DICT' of type dict cannot be used inside a kernel;.*pass other data as a Dat or Global"),
}


@pytest.mark.parametrize("case", sorted(BAD_GLOBALS))
def test_kernel_bad_global(backend, case, mesh):
    kernel, message = BAD_GLOBALS[case]
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    with pytest.raises(mc.KernelError, match=message):
        mc.par_loop(kernel, mesh["nodes"], x(mc.WRITE))


@mc.kernel
def constant_out_of_bounds(a):
    a[0] = 1.0
    a[5] = 2.0


def test_kernel_constant_index_out_of_bounds(backend, mesh):
    x = mc.Dat(mesh["nodes"], 2, None, "x")
    line = constant_out_of_bounds.first_line + 3
    with pytest.raises(mc.KernelError, match=(
        rf"kernel 'constant_out_of_bounds' at {re.escape(__file__)}:{line}: index 5 of a .*view of shape \(2,\);"
        r" check the argument's dim/arity")):
        mc.par_loop(constant_out_of_bounds, mesh["nodes"], x(mc.WRITE))


@pytest.mark.parametrize("kind", ["direct", "indirect", "global"])
def test_kernel_writes_a_read_argument(backend, kind, mesh):
    q = mc.Dat(mesh["edges"], 1, np.arange(4.0), "q")
    x = mc.Dat(mesh["nodes"], 1, np.arange(3.0), "x")
    g = mc.Global(1, 1.0, "g")
    arg = {"direct": q(mc.READ), "indirect": x(mc.READ, mesh["e2n"][0]), "global": g(mc.READ)}[kind]
    with pytest.raises(mc.AccessModeError, match=r"kernel 'set_first' in loop 'set_first' wr.* an argument declared READ.*declare it WRITE, RW or INC"):
        mc.par_loop(set_first, mesh["edges"], arg)
    np.testing.assert_array_equal(q.data[:, 0], np.arange(4.0))
    np.testing.assert_array_equal(x.data[:, 0], np.arange(3.0))
    assert g.value[0] == 1.0


@mc.kernel
def write_whole_map(a):
    a[1, 0] = 5.0


def test_kernel_writes_a_read_whole_map_argument(backend, mesh):
    x = mc.Dat(mesh["nodes"], 1, np.arange(3.0), "x")
    with pytest.raises(mc.AccessModeError, match=r"kernel 'write_whole_map'.*declared READ"):
        mc.par_loop(write_whole_map, mesh["cells"], x(mc.READ, mesh["c2n"]))


# --------------------------------------------------------------------------- #
# Kernels: numba compilation failures
# --------------------------------------------------------------------------- #
@mc.kernel
def string_kernel(a):
    s = "1.5"
    a[0] = float(s.upper())


@mc.kernel
def unsupported_numpy_kernel(a):
    a[0] = np.savetxt("out.txt", a)


@pytest.mark.parametrize(
    ("kernel", "numba_says"),
    [(string_kernel, r"float\(unicode_type\)"), (unsupported_numpy_kernel, r"unsupported NumPy function 'numpy\.savetxt'")],
    ids=["string", "numpy"],
)
def test_numba_compilation_error(kernel, numba_says, mesh):
    mc.configure(backend="numba")
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    mc.par_loop(kernel, mesh["nodes"], x(mc.RW))  # recorded: evaluation is lazy
    with pytest.raises(mc.CompilationError) as info:
        mc.flush()
    message = str(info.value)
    assert f"could not compile kernel '{kernel.name}'" in message
    assert f"{__file__}:{kernel.first_line}" in message
    found = re.search(r"Generated source: (\S+\.py)", message)
    assert found, message
    generated = Path(found.group(1))
    assert generated.is_file() and "def _mc_loop(" in generated.read_text()
    assert "Numba said:" in message and re.search(numba_says, message), message


def test_compilation_error_is_not_cached(mesh):
    """A failed compile must fail again (not run stale code) the next time the loop is called."""
    mc.configure(backend="numba")
    x = mc.Dat(mesh["nodes"], 1, None, "x")
    for _ in range(2):
        with pytest.raises(mc.CompilationError, match="string_kernel"):
            mc.par_loop(string_kernel, mesh["nodes"], x(mc.RW))
            x.data_ro  # noqa: B018 - forces the loop


# --------------------------------------------------------------------------- #
# Kernels: run-time out-of-bounds index (in a subprocess: a segfault must not kill pytest)
# --------------------------------------------------------------------------- #
OOB_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import meshchain as mc

    mc.configure(backend=sys.argv[1])
    cells = mc.Set(64, "cells")
    index = mc.Dat(cells, 1, np.arange(64), "index", dtype=np.int64)
    q = mc.Dat(cells, 2, None, "q")

    @mc.kernel
    def poke(i, a):
        a[i[0]] = 1.0

    mc.par_loop(poke, cells, index(mc.READ), q(mc.WRITE))
    try:
        q.data_ro
    except mc.MeshchainError as exc:
        print("RAISED", type(exc).__name__, exc)
    else:
        print("NO ERROR")
    """
)
_oob_results: dict = {}


def run_out_of_bounds_script(backend, cache_dir, tmp_path_factory) -> subprocess.CompletedProcess:
    if backend not in _oob_results:
        script = tmp_path_factory.mktemp("oob") / "oob.py"
        script.write_text(OOB_SCRIPT)
        env = dict(os.environ, MESHCHAIN_CACHE_DIR=str(cache_dir))
        _oob_results[backend] = subprocess.run(
            [sys.executable, str(script), backend], capture_output=True, text=True, env=env, timeout=120
        )
    return _oob_results[backend]


@pytest.mark.parametrize("backend_name", ["reference", "numba"])
def test_runtime_out_of_bounds_never_crashes(backend_name, meshchain_cache_dir, tmp_path_factory):
    result = run_out_of_bounds_script(backend_name, meshchain_cache_dir, tmp_path_factory)
    assert result.returncode >= 0, f"killed by signal {-result.returncode}:\n{result.stderr[-2000:]}"
    assert "NO ERROR" not in result.stdout


@pytest.mark.parametrize(
    "backend_name",
    ["reference", "numba"],
)
def test_runtime_out_of_bounds_is_kernel_runtime_error(backend_name, meshchain_cache_dir, tmp_path_factory):
    result = run_out_of_bounds_script(backend_name, meshchain_cache_dir, tmp_path_factory)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"RAISED KernelRuntimeError kernel 'poke' in loop 'poke'.*index", result.stdout), result.stdout


# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(backend="fortran"), r"backend 'fortran' is unknown; choose one of numba, reference"),
        (dict(threads=0), r"threads must be a positive integer or None, got 0"),
        (dict(threads=True), r"threads must be a positive integer or None, got True"),
        (dict(block_size=0), r"block_size must be an integer >= 1, got 0"),
        (dict(trace_length=1.5), r"trace_length must be an integer >= 1, got 1\.5"),
        (dict(debug="yes"), r"debug must be True or False"),
        (dict(colour=True), r"unknown option\(s\) colour; valid: backend, threads"),
    ],
    ids=["backend", "threads0", "threads-bool", "block_size", "trace_length", "debug", "unknown"],
)
def test_configure_bad_option(options, message):
    with pytest.raises(mc.ConfigurationError, match=message):
        mc.configure(**options)


def test_configure_threads_above_numba_pool():
    import numba

    too_many = numba.config.NUMBA_NUM_THREADS + 1
    with pytest.raises(mc.ConfigurationError, match=rf"threads={too_many} but Numba's pool has {too_many - 1} threads; set NUMBA_NUM_THREADS={too_many}"):
        mc.configure(backend="numba", threads=too_many)


def test_configure_unavailable_backend():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
        pytest.skip("CuPy and a GPU are present")
    except ImportError:
        expected = r"backend 'cupy' needs CuPy .*use backend='numba'"
    except Exception:  # noqa: BLE001 - CuPy without a usable GPU
        expected = r"backend 'cupy': no usable CUDA GPU .*use backend='numba'"
    with pytest.raises(mc.BackendUnavailableError, match=expected):
        mc.configure(backend="cupy")


def test_refused_configure_leaves_runtime_usable():
    import numba

    nodes = mc.Set(2, "nodes")
    x = mc.Dat(nodes, 1, None, "x")
    with pytest.raises(mc.ConfigurationError):
        mc.configure(threads=numba.config.NUMBA_NUM_THREADS + 1)
    mc.par_loop(set_first, nodes, x(mc.WRITE))
    assert x.data[:, 0].tolist() == [5.0, 5.0]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"MESHCHAIN_THREADS": "abc"}, r"MESHCHAIN_THREADS='abc' is not an integer"),
        ({"MESHCHAIN_BLOCK_SIZE": "1e3"}, r"MESHCHAIN_BLOCK_SIZE='1e3' is not an integer"),
        ({"MESHCHAIN_DEBUG": "maybe"}, r"MESHCHAIN_DEBUG='maybe': use 1 or 0"),
        ({"MESHCHAIN_BACKEND": "fortran"}, r"backend 'fortran' is unknown; choose one of"),
        ({"MESHCHAIN_THREADS": "0"}, r"threads must be a positive integer"),
        ({"MESHCHAIN_TRACE_LENGTH": "-2"}, r"trace_length must be an integer >= 1, got -2"),
    ],
    ids=["threads", "block_size", "debug", "backend", "threads0", "trace_length"],
)
def test_bad_environment_variable(environ, message):
    with pytest.raises(mc.ConfigurationError, match=message):
        Config.from_env(environ)


@pytest.mark.parametrize(("name", "closest"), [("MESHCHAIN_TRANSPRT", "MESHCHAIN_TRANSPORT"),
                                               ("MESHCHAIN_THREDS", "MESHCHAIN_THREADS"),
                                               ("MESHCHAIN_BLOCKSIZE", "MESHCHAIN_BLOCK_SIZE")])
def test_unknown_environment_variable_is_named_with_the_closest_option(name, closest):
    with pytest.warns(mc.MeshchainWarning, match=rf"\[unknown-option\] environment variable {name} is not a meshchain "
                                                 rf"option") as caught:
        config = Config.from_env({name: "4"})
    assert config == Config.from_env({}), "an unknown variable changes nothing"
    message = str(caught[0].message)
    assert "did you mean MESHCHAIN_" in message
    if closest is not None:
        assert f"did you mean {closest}?" in message


def test_the_transport_is_read_from_the_environment_and_checked():
    assert Config.from_env({"MESHCHAIN_TRANSPORT": "neighbour"}).transport == "neighbour"
    assert Config.from_env({}).transport == "auto"
    with pytest.raises(mc.ConfigurationError, match="transport 'pigeon' is unknown"):
        Config.from_env({"MESHCHAIN_TRANSPORT": "pigeon"})


def test_the_test_harness_variables_are_not_reported(recwarn):
    Config.from_env({"MESHCHAIN_MPI_CHILD": "1", "MESHCHAIN_TEST_CACHE_DIR": "/tmp/x", "MESHCHAIN_THREADS": "1"})
    assert not [w for w in recwarn if issubclass(w.category, mc.MeshchainWarning)]


def test_every_error_is_a_meshchain_error():
    errors = [getattr(mc, name) for name in mc.errors.__all__ if not issubclass(getattr(mc, name), Warning)]
    assert len(errors) >= 15
    for cls in errors:
        assert issubclass(cls, mc.MeshchainError), cls
    assert issubclass(mc.MeshchainWarning, UserWarning)


@mc.kernel
def reads_its_increment(a, r):
    r[0] += a[0]
    r[1] = r[1] * 2.0


@mc.kernel
def increments_only(a, r):
    r[0] += a[0]
    r[1] -= a[0]


def test_inc_argument_may_only_be_incremented(backend, mesh):
    """Reading an INC argument would give backend-dependent results (running value, zeroed
    buffer, atomics), so it is refused before any backend runs."""
    x = mc.Dat(mesh["nodes"], 1, np.arange(3.0), "x")
    acc = mc.Dat(mesh["nodes"], 2, None, "acc")
    with pytest.raises(mc.AccessModeError, match=r"kernel 'reads_its_increment'.*'r' is passed as INC.*declare it RW"):
        mc.par_loop(reads_its_increment, mesh["nodes"], x(mc.READ), acc(mc.INC))
    mc.par_loop(increments_only, mesh["nodes"], x(mc.READ), acc(mc.INC))
    np.testing.assert_array_equal(acc.data, np.stack([np.arange(3.0), -np.arange(3.0)], axis=1))
