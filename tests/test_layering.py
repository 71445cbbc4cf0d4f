"""The package's layers depend one way only, and no imports form a cycle.

Every ``import`` in ``src/meshchain`` (at module level, inside functions, under
``TYPE_CHECKING``) is resolved to the module it names. A module may import its own layer
and the layers below it (DESIGN.md §2); the module graph, with every import, has no
cycle; and only the user-facing entry points reach the session through
:mod:`meshchain.core.context` (everything else gets it handed down).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "meshchain"

# bottom to top: a module may import from its own layer and the ones listed before it
LAYERS = (
    ("core", ("meshchain.core",)),
    ("types", ("meshchain.types",)),
    ("ir", ("meshchain.ir",)),
    ("comm", ("meshchain.comm",)),
    ("partition", ("meshchain.partition",)),
    ("inspector", ("meshchain.inspector",)),
    ("backends", ("meshchain.backends",)),
    ("model", ("meshchain.model",)),
    ("engine", ("meshchain.engine",)),
    ("api", ("meshchain.api", "meshchain", "meshchain.linalg", "meshchain.io")),
    ("applications", ("meshchain.apps", "meshchain.meshes", "meshchain.__main__", "meshchain.testing")),
)

# the user-facing entry points that find the current session through the context
CONTEXT_USERS = {"meshchain.api", "meshchain.core.context", "meshchain.model.calibrate", "meshchain.types.sets",
                 "meshchain.types.maps", "meshchain.types.data", "meshchain.types.mat", "meshchain.types.mixed_mat"}


def modules() -> dict:
    """Module name -> path, for every module of the package."""
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known) -> set:
    """The package modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("meshchain") and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    best, level = -1, None
    for position, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), position
    assert level is not None, f"module {name} belongs to no layer; add it to LAYERS"
    return level


@pytest.fixture(scope="module")
def graph() -> dict:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_every_import_goes_down_the_layers(graph):
    wrong = [f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
             for name, targets in graph.items() for target in sorted(targets)
             if layer_of(target) > layer_of(name)]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_imports_form_a_cycle(graph):
    cycles, state, stack = [], {}, []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_only_user_facing_entry_points_use_the_session_context(graph):
    users = {name for name, targets in graph.items() if "meshchain.core.context" in targets}
    assert users <= CONTEXT_USERS, f"modules reaching for the session context: {sorted(users - CONTEXT_USERS)}"
    below = [name for name, path in modules().items()
             if layer_of(name) < layer_of("meshchain.api") and _names(path) & {"get_runtime", "reset_runtime"}]
    assert not below, f"the global session used below the API layer: {below}"


def _names(path: Path) -> set:
    """Names the code of ``path`` uses (docstrings and their examples aside)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.name.rpartition(".")[2])
    return found


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The resolver sees imports inside functions and relative ones, and the cycle search
    finds a cycle: the checks above cannot pass vacuously."""
    module = tmp_path / "sample.py"
    module.write_text("def f():\n    from ..engine import session\n    import meshchain.core.errors\n")
    known = {"meshchain.types.sample", "meshchain.engine.session", "meshchain.engine", "meshchain.core.errors"}
    found = imports_of("meshchain.types.sample", module, known)
    assert found == {"meshchain.engine.session", "meshchain.engine", "meshchain.core.errors"}
    assert layer_of("meshchain.engine.session") > layer_of("meshchain.types.sample")
    assert layer_of("meshchain") == layer_of("meshchain.api") > layer_of("meshchain.engine.plans")


# MPI calls that move point-to-point data (and the all-to-alls set-up used to make): only
# the communication layer may make them (DESIGN.md §3, "Communication layer")
POINT_TO_POINT = frozenset({
    "Isend", "Irecv", "Issend", "Send", "Recv", "Ssend", "Bsend", "Rsend", "Sendrecv", "Send_init", "Recv_init",
    "Psend_init", "Precv_init", "Put", "Get", "Accumulate", "Probe", "Iprobe", "Mprobe", "Improbe",
    "isend", "irecv", "issend", "sendrecv", "Alltoall", "Alltoallv", "Alltoallw", "alltoall",
    "Ineighbor_alltoallv", "Neighbor_alltoallv", "Neighbor_alltoallv_init", "Ineighbor_alltoall",
    "Neighbor_alltoall", "neighbor_alltoall",
})


def point_to_point_outside_comm() -> dict:
    return {name: sorted(_names(path) & POINT_TO_POINT) for name, path in modules().items()
            if not name.startswith("meshchain.comm") and _names(path) & POINT_TO_POINT}


def test_only_the_communication_layer_sends_messages():
    found = point_to_point_outside_comm()
    assert not found, f"point-to-point MPI calls outside meshchain.comm: {found}"


def test_the_sender_check_sees_a_call_on_any_object(tmp_path):
    module = tmp_path / "sender.py"
    module.write_text('"""comm.Isend(x) in a docstring is no call."""\n\n'
                      "def f(link, data):\n    return link.Irecv(data, source=1)\n")
    assert _names(module) & POINT_TO_POINT == {"Irecv"}


# MPI collectives (issue 32): the partitioners use meshchain.comm's (agree, reductions,
# collectives) instead of calling them on the communicator themselves
COLLECTIVES = frozenset({
    "Allreduce", "allreduce", "Reduce", "reduce", "Allgather", "Allgatherv", "allgather", "Gather", "Gatherv",
    "gather", "Scatter", "Scatterv", "scatter", "Bcast", "bcast", "Barrier", "barrier", "Scan", "scan", "Exscan",
    "exscan", "Iallreduce", "Ibarrier", "Ibcast",
})


def test_the_partitioners_call_no_mpi_collective_of_their_own():
    found = {name: sorted(_names(path) & (COLLECTIVES | POINT_TO_POINT)) for name, path in modules().items()
             if name.startswith("meshchain.partition") and _names(path) & (COLLECTIVES | POINT_TO_POINT)}
    assert not found, f"MPI calls in meshchain.partition (use meshchain.comm's collectives): {found}"


# NumPy calls that go to the BLAS library: its threads compete with Numba's for the cores
# (issue 32: a CG iteration 40x slower), so the packages that run loops and solvers compute
# their dot products in compiled passes instead (``meshchain.linalg.fused``)
BLAS_CALLS = frozenset({"dot", "vdot", "inner", "matmul", "tensordot", "einsum", "linalg"})
HOT_PACKAGES = ("meshchain.linalg", "meshchain.engine", "meshchain.backends", "meshchain.comm", "meshchain.inspector")


BLAS_MODULES = ("numpy", "numpy.linalg", "scipy.linalg")


def blas_calls(path: Path) -> list:
    """``x.dot``, ``np.linalg`` and the like, ``a @ b``, and BLAS functions or modules
    imported by name (``from numpy import dot``, ``import scipy.linalg``), in the code of ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in BLAS_CALLS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            found.append(f"line {node.lineno}: @")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(BLAS_MODULES):
            names = [a.name for a in node.names if a.name in BLAS_CALLS or a.name == "*"
                     or (node.module or "").endswith("linalg")]
            found += [f"line {node.lineno}: from {node.module} import {name}" for name in names]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.endswith(".linalg")]
    return found


def test_the_packages_that_run_loops_and_solvers_call_no_blas():
    found = {name: blas_calls(path) for name, path in modules().items()
             if name.startswith(HOT_PACKAGES) and blas_calls(path)}
    assert not found, f"BLAS calls in the packages that run loops and solvers: {found}"


def test_the_blas_check_sees_methods_functions_and_operators(tmp_path):
    module = tmp_path / "blas.py"
    module.write_text('"""np.dot(a, b) in a docstring is no call."""\n\n'
                      "from numpy import dot, zeros\nfrom scipy.linalg import norm\nimport numpy.linalg\n\n"
                      "def f(np, a, b):\n    return a.dot(b) + np.linalg.norm(a) + (a @ b) + dot(a, b)\n")
    assert sorted(entry.split(": ")[1] for entry in blas_calls(module)) == [
        ".dot", ".linalg", "@", "from numpy import dot", "from scipy.linalg import norm", "import numpy.linalg"]


ABOVE_THE_API = ("meshchain.linalg", "meshchain.io")


def session_reaches(tree) -> list:
    """Where ``tree`` reaches into a session other than through its surface: an attribute of
    a name or attribute called ``session`` (``session.x``, ``self.session.x``), or
    ``get_runtime`` (the session itself)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "session") or (isinstance(base, ast.Attribute)
                                                                          and base.attr == "session"):
                found.append(f"line {node.lineno}: session.{node.attr}")
        elif isinstance(node, ast.Name) and node.id == "get_runtime":
            found.append(f"line {node.lineno}: get_runtime")
        elif isinstance(node, ast.alias) and node.name == "get_runtime":
            found.append("import of get_runtime")
    return found


def test_session_reaches_are_found():
    tree = ast.parse("from meshchain.api import get_runtime\nsession.storage(x).valid_depth = 0\nself.session.flush()\n")
    assert sorted(session_reaches(tree)) == ["import of get_runtime", "line 2: session.storage", "line 3: session.flush"]


def test_linalg_and_io_use_the_engine_surface_only():
    """Solvers and I/O sit above the API: they use :class:`meshchain.engine.surface.Surface`
    (``meshchain.api.engine_surface()``), never the session's attributes."""
    offences = [f"{name}: {where}" for name, path in modules().items() if name.startswith(ABOVE_THE_API)
                for where in session_reaches(ast.parse(path.read_text(), str(path)))]
    assert not offences, "\n".join(offences)


# built-in exceptions library code must not raise (a MeshchainError subclass says what went wrong);
# NotImplementedError marks abstract methods, and the pytest plugin in meshchain.testing answers pytest
FOREIGN_ERRORS = {"Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "AssertionError",
                  "AttributeError", "LookupError", "ArithmeticError", "OSError"}


def foreign_raises(tree) -> list:
    """Lines of ``tree`` that raise a built-in exception class (or an instance made from one)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in FOREIGN_ERRORS:
                found.append(f"line {node.lineno}: raise {target.id}")
    return found


def test_foreign_raises_are_found():
    tree = ast.parse("raise ValueError('x')\nraise mc.LoopError('y')\nraise\nraise RuntimeError\n")
    assert foreign_raises(tree) == ["line 1: raise ValueError", "line 4: raise RuntimeError"]


def test_library_code_raises_meshchain_errors_only():
    offences = [f"{name}: {where}" for name, path in modules().items() if not name.startswith("meshchain.testing")
                for where in foreign_raises(ast.parse(path.read_text(), str(path)))]
    assert not offences, "\n".join(offences)


STATISTICS_WRITERS = ("meshchain.engine.accounting", "meshchain.core.stats")


def record_writes(tree) -> list:
    """Where ``tree`` takes a statistics record to write it: ``recorder.loop(...)`` or
    ``recorder.chain(...)`` on a name or attribute called ``recorder``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("loop", "chain"):
            base = node.func.value
            if (isinstance(base, ast.Name) and base.id == "recorder") or (isinstance(base, ast.Attribute)
                                                                           and base.attr == "recorder"):
                found.append(f"line {node.lineno}: recorder.{node.func.attr}(...)")
    return found


def test_record_writes_are_found():
    tree = ast.parse("self.session.recorder.loop(n).time_plan += 1\nrecorder.chain(c).decision = 'x'\nm.chain(1)\n")
    assert record_writes(tree) == ["line 1: recorder.loop(...)", "line 2: recorder.chain(...)"]


def test_statistics_are_written_by_the_accounting_module_alone():
    """Execution and planning code report what they did through :mod:`meshchain.engine.accounting`."""
    offences = [f"{name}: {where}" for name, path in modules().items() if not name.startswith(STATISTICS_WRITERS)
                for where in record_writes(ast.parse(path.read_text(), str(path)))]
    assert not offences, "\n".join(offences)


def module_level_caches(tree) -> list:
    """Private module-level names bound to an empty dict or list, or to a weak dictionary:
    caches kept outside :mod:`meshchain.core.cache` (whose ``memo`` registers them by name;
    public tables such as a registry of strategies are not caches)."""
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        private = any(isinstance(t, ast.Name) and t.id.startswith("_") and not t.id.startswith("__") for t in targets)
        if private and isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            empty = isinstance(value, (ast.Dict, ast.List)) and not (value.keys if isinstance(value, ast.Dict)
                                                                      else value.elts)
            weak = (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                    and value.func.attr in ("WeakKeyDictionary", "WeakValueDictionary"))
            if empty or weak:
                found.append(f"line {node.lineno}")
    return found


def test_module_level_caches_are_found():
    tree = ast.parse("_a = {}\n_b: list = []\n_c = weakref.WeakKeyDictionary()\nFIXED = {'x': 1}\n_d = memo('d')\n"
                     "TABLE = {}\n__all__ = []\n")
    assert module_level_caches(tree) == ["line 1", "line 2", "line 3"]


def test_every_cache_is_registered():
    """Caches live in a session's registry or, process-wide, in a named memo (``core.cache.memo``)."""
    offences = [f"{name}: {where}" for name, path in modules().items()
                if name not in ("meshchain.core.cache", "meshchain.api") and not name.startswith("meshchain.testing")
                for where in module_level_caches(ast.parse(path.read_text(), str(path)))]
    assert not offences, "\n".join(offences)


def test_importing_meshchain_does_not_start_mpi():
    """``from mpi4py import MPI`` initialises MPI; the session chooses the thread level and the
    progress mode first (``comm/world.py``), so the package, its solvers and the compiled
    replay and iterations import mpi4py's MPI only when they run, never when imported."""
    code = ("import sys\nimport meshchain, meshchain.linalg, meshchain.linalg.compiled, meshchain.engine.replay\n"
            "import meshchain.backends.numba_replay, meshchain.comm.by_address\n"
            "print('mpi4py.MPI' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def class_names(tree) -> list:
    """The names of the classes ``tree`` defines (at any depth)."""
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def test_class_names_are_found():
    tree = ast.parse("class A:\n    class B:\n        pass\ndef f():\n    class C(A):\n        pass\n")
    assert class_names(tree) == ["A", "B", "C"]


def test_no_two_classes_share_a_name():
    """One class per name in the library (a reader, a traceback or ``stats`` output never has to
    ask which ``Plan`` or ``Run`` it is)."""
    where: dict = {}
    for name, path in modules().items():
        for cls in class_names(ast.parse(path.read_text(), str(path))):
            where.setdefault(cls, []).append(name)
    shared = {cls: found for cls, found in where.items() if len(found) > 1}
    assert not shared, shared
