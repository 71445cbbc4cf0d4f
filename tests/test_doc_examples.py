"""Every Python example of the README and of the documentation site runs, as written.

A block runs on its own (after ``import numpy as np`` and ``import meshchain as mc``, which every
page takes as done) unless an HTML comment ``<!-- example: NAME -->`` (invisible on GitHub and on
the site) names it just above its fence: ``EXAMPLES[NAME]`` then gives the objects the block uses
from its page's text (a prelude, run first in the same module), the rank counts it runs on
(``mpiexec -n 2`` where the page says the code runs on several processes) and what it must print or
leave behind. Every named block must be in the table and every entry of the table on a page. Each
block runs as a file (kernels are read from their source) in a directory shared by the ranks, from a
fresh session. Command lines in the pages are checked too: every ``examples/<name>.py`` flag parses.
"""

from __future__ import annotations

import re
import runpy
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import meshchain as mc
from devices import GPU
from helpers import example_module

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guide").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>\w+)[^\n]*\n(?P<code>.*?)^(?P=indent)```", re.M | re.S)
NAME = re.compile(r"<!-- example: ([\w-]+) -->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    name: str | None

    @property
    def id(self) -> str:
        return self.name or f"{self.page}:{self.line}"


def blocks(language: str) -> list[Block]:
    """Every fenced block of ``language`` in the pages, with the name its comment gives it."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match["language"] != language:
                continue
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            named = NAME.search(before)
            found.append(Block(str(page.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1, language,
                               textwrap.dedent(match["code"]), named.group(1) if named else None))
    return found


def named(name: str) -> str:
    """The code of the block called ``name``."""
    return next(b.code for b in blocks("python") if b.name == name)


#: what every page's snippets take as done (the tour starts with it)
ASSUMED = "import numpy as np\nimport meshchain as mc\n"


def diffusion_declarations() -> str:
    """The README's diffusion program up to its time loop: the mesh, the dats and the kernels."""
    return named("readme-diffusion").split("for step in")[0]


TOUR_OBJECTS = named("readme-tour").split("mc.par_loop(")[0]
AIRFOIL = """
import numpy as np, meshchain as mc
from meshchain.apps import airfoil
from meshchain.meshes import naca0012
problem = airfoil.declare(naca0012(24, 36))
p_x, pcell, q, qold, res, rms = problem.p_x, problem.pcell, problem.p_q, problem.p_qold, problem.p_res, problem.rms
p, t = mc.Dat(problem.cells, 1, np.full(problem.cells.size, 1.2), "pressure"), 0.0
"""


@dataclass(frozen=True)
class Example:
    """What a named block needs (``prelude``), where it runs (``ranks``) and what it must do
    (``check(namespace, printed, rank)``: ``printed`` is what this rank's run printed)."""

    prelude: str = ""
    ranks: tuple = (1,)
    check: Callable | None = None
    files: tuple = field(default=())  # files the block leaves in its directory
    raises: tuple | None = None  # (exception, message pattern) the block must raise instead


def printed_lines(*lines):
    def check(namespace, printed, rank):
        assert printed.splitlines() == (list(lines) if rank == 0 else []), printed
    return check


def check_diffusion(namespace, printed, rank):
    comm = mc.get_runtime().comm
    total = "total 4096.000000000000, spread 0.962424"
    messages = "messages 0 (loop by loop: 0)" if comm.size == 1 else "messages 40 (loop by loop: 118)"
    printed_lines(total, messages)(namespace, printed, rank)


def check_captured(namespace, printed, rank):
    step, i = namespace["step"], namespace["i"]
    assert 0 < i < 999 and (step.captures, step.replays) == (1, i)  # stopped by its test on rms, replayed
    assert printed.split() == ["1", str(i)]
    np.testing.assert_allclose(namespace["q"].data_ro[:, 0], 0.5 ** (i + 1))


def check_repeat(namespace, printed, rank):
    """Ten blocks of 200 sweeps, a maximum printed after each: NumPy's sweeps give the same bits."""
    step, start = namespace["two_sweeps"], namespace["start"]
    u = start.copy()
    maxima = []
    for _ in range(10):
        for _ in range(200):
            new = u.copy()
            new[1:-1, 1:-1] = (0.2 * u[1:-1, 1:-1] + 0.2 * u[:-2, 1:-1] + 0.2 * u[2:, 1:-1]
                               + 0.2 * u[1:-1, :-2] + 0.2 * u[1:-1, 2:])
            u = new
        maxima.append(u.max())
    np.testing.assert_array_equal(namespace["u"].data_ro.reshape(u.shape), u)
    assert [float(line) for line in printed.split()] == maxima
    assert (step.captures, step.replays) == (1, 999)


def check_calibration(namespace, printed, rank):
    assert "measured" in printed and "rank(s)" in printed and re.search(r"(?m)^diffuse +1 +6 ", printed), printed


def check_tiled(namespace, printed, rank):
    assert int(printed) > 1 and mc.stats().chains["diffuse"].tile_size == 1024


def check_chain_is_ca(name, mode):
    def check(namespace, printed, rank):
        chain = mc.stats().chains[name]
        assert chain.mode == (mode if mc.get_runtime().comm.size > 1 else chain.mode) and chain.executions >= 1
    return check


def check_grid(namespace, printed, rank):
    """The mean after 50 double sweeps, as NumPy's slicing computes it (the same sums in the same order)."""
    a = np.random.default_rng(0).random((200, 200))
    b = a.copy()
    for _ in range(50):
        for source, target in ((a, b), (b, a)):
            target[1:-1, 1:-1] = 0.2 * (source[1:-1, 1:-1] + source[:-2, 1:-1] + source[2:, 1:-1]
                                        + source[1:-1, :-2] + source[1:-1, 2:])
    if rank == 0:
        assert float(printed) == pytest.approx(float(a.mean()), rel=1e-13)
    else:
        assert printed == ""


def check_solve(namespace, printed, rank):
    if rank == 0:
        iterations, converged, residual = printed.split()
        assert converged == "True" and int(iterations) > 5 and float(residual) < 1e-8
    else:
        assert namespace["info"].converged


def check_restored(namespace, printed, rank):
    restored = namespace["q"].gather()
    if rank == 0:
        assert np.isfinite(restored).all() and Path("run.h5").exists()


def check_mixed(namespace, printed, rank):
    """The stand-in element is a lumped mass: each unknown is its right-hand side over its node's mass."""
    raw = namespace["raw"]
    corners = raw.coords[raw.cells]
    edges = corners[:, 1:] - corners[:, :1]
    area = 0.5 * np.abs(edges[:, 0, 0] * edges[:, 1, 1] - edges[:, 1, 0] * edges[:, 0, 1])
    lumped = np.bincount(raw.cells.ravel(), np.repeat(area / 3.0, 3), raw.nnode)
    velocity, pressure = (component.data_ro for component in namespace["up"].split)
    np.testing.assert_allclose(velocity, 1.0 / lumped[:, None].repeat(2, axis=1), rtol=1e-4)
    np.testing.assert_allclose(pressure[:, 0], 2.0 / lumped, rtol=1e-4)


def assert_summary(printed, rank):
    """``mc.stats(summary=True)`` is collective and gives every rank the summary of all ranks."""
    assert printed.startswith("meshchain summary") and "res_calc" in printed and "update" in printed, printed


EXAMPLES = {
    "readme-tour": Example(check=printed_lines("[1. 3. 2.] [2.]")),
    "tour": Example(check=printed_lines("[1. 3. 2.] [2.]")),
    "readme-diffusion": Example(ranks=(1, 2), check=check_diffusion),
    "tour-diffusion": Example(ranks=(1, 2), check=check_diffusion),
    "plans-by-structure": Example(
        prelude='import numpy as np, meshchain as mc\ncells = mc.Set(1000, "cells")\n'
                'q = mc.Dat(cells, 1, np.arange(1000.0), "q")\n'
                '@mc.kernel\ndef norm(q, total):\n    total[0] += q[0] * q[0]\n',
        check=printed_lines("1 99")),
    "subsets": Example(
        prelude=TOUR_OBJECTS + 'on_wall = np.array([True, False, True])\nu = mc.Dat(nodes, 1, None, "u")\n'
                '@mc.kernel\ndef dirichlet(u):\n    u[0] = 1.0\n'
                '@mc.kernel\ndef flux(x, g):\n    g[0, 0] += x[1, 0] - x[0, 0]\n    g[1, 0] += x[1, 0] - x[0, 0]\n',
        check=lambda ns, printed, rank: (np.testing.assert_array_equal(ns["u"].data_ro[:, 0], [1, 0, 1]),
                                         np.testing.assert_array_equal(ns["grad"].data_ro[:, 0], [0, 2, 2]))),
    "extruded": Example(
        prelude='import numpy as np, meshchain as mc\nfrom meshchain.meshes import structured_tris\n'
                'base = structured_tris(4, 3)\ntri, nlayers = base.cells, 5\n'
                'triangles, vertices = mc.Set(base.ncell, "triangles"), mc.Set(base.nnode, "vertices")\n'
                '@mc.kernel\ndef k(u):\n    for i in range(6):\n        u[i, 0] += 1.0\n'
                '@mc.kernel\ndef top_bc(u):\n    u[0] = 100.0\n'
                '@mc.kernel\ndef jump(u, f):\n    for i in range(6):\n        f[i + 6, 0] += u[i + 6, 0] - u[i, 0]\n',
        check=lambda ns, printed, rank: np.testing.assert_array_equal(  # the top level of each triangle's vertex 0
            ns["u"].data_ro.reshape(-1, 6)[np.unique(ns["tri"][:, 0]), -1], 100.0)),
    "mixed": Example(
        prelude='import numpy as np, meshchain as mc\nfrom meshchain.meshes import structured_tris\n'
                'raw = structured_tris(4, 4)\nmesh = raw.declare()\n'
                'nodes, cells, cell2node, coords = mesh.nodes, mesh.cells, mesh.cell2node, mesh.coords\n'
                '@mc.kernel\ndef stokes_element(a, x):   # a stand-in of the same shape: lumped masses\n'
                '    area = 0.5 * abs((x[1, 0] - x[0, 0]) * (x[2, 1] - x[0, 1]) - (x[2, 0] - x[0, 0]) * (x[1, 1] - x[0, 1]))\n'
                '    for i in range(9):\n        a[i, i] += area / 3.0\n'
                'rhs = mc.MixedDat(mc.MixedSet([nodes, nodes]), (2, 1), None, "rhs")\n'
                'rhs.split[0].data[:] = 1.0\nrhs.split[1].data[:] = 2.0\n',
        check=check_mixed),
    "diffusion-chain": Example(prelude=diffusion_declarations(), ranks=(1, 2), check=check_chain_is_ca("diffuse", "ca")),
    "captured-step": Example(
        prelude='import numpy as np, meshchain as mc\ncells = mc.Set(5, "cells")\n'
                'q, adt = mc.Dat(cells, 1, np.ones((5, 1)), "q"), mc.Dat(cells, 1, None, "adt")\n'
                'adt_calc = mc.Kernel.from_source("def adt_calc(q, adt):\\n    adt[0] = 0.5 * q[0]\\n")\n'
                'update = mc.Kernel.from_source("def update(q, adt, rms):\\n    q[0] -= adt[0]\\n    rms[0] += q[0] * q[0]\\n")\n',
        check=check_captured),
    "step-repeat": Example(
        prelude='import numpy as np, meshchain as mc\ng = mc.Grid((9, 11), "g")\n'
                'start = np.random.default_rng(1).random((9, 11))\n'
                'u, v = mc.Dat(g, 1, start, "u"), mc.Dat(g, 1, start, "v")\n'
                'star = mc.Stencil([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], "star")\n'
                'sweep = mc.Kernel.from_source("def sweep(s, out):\\n    out[0] = 0.2 * s[0, 0] + 0.2 * s[1, 0] + '
                '0.2 * s[2, 0] + 0.2 * s[3, 0] + 0.2 * s[4, 0]\\n")\n',
        check=check_repeat),
    "calibrate": Example(prelude=diffusion_declarations() + named("diffusion-chain"), check=check_calibration),
    "tiled-chain": Example(prelude=diffusion_declarations(), check=check_tiled),
    "partition": Example(
        prelude='import meshchain as mc\nfrom meshchain.meshes import structured_tris\n'
                'mesh = structured_tris(8, 8).declare()\nx = mesh.coords\n',
        ranks=(1, 2), check=lambda ns, printed, rank: None),
    # on a machine with a GPU and CuPy the block runs; without, it must say what is missing
    "gpu-configure": Example(raises=None if GPU else (mc.BackendUnavailableError, "CuPy|GPU|CUDA")),
    "grid-jacobi": Example(ranks=(1, 2), check=check_grid),
    "grid-chain": Example(prelude=named("grid-jacobi").replace("range(50)", "range(2)"), ranks=(1, 2),
                          check=check_chain_is_ca("jacobi", "ca")),
    "solve": Example(ranks=(1, 2), check=check_solve),
    "op2-hdf5": Example(
        prelude=AIRFOIL + 'from meshchain.meshes import write_op2_ascii\nwrite_op2_ascii(naca0012(24, 36), "new_grid.dat")\n',
        check=lambda ns, printed, rank: None, files=("new_grid.h5", "out.h5")),
    "output": Example(prelude=AIRFOIL, ranks=(1, 2), check=lambda ns, printed, rank: None,
                      files=("flow/airfoil.xdmf", "flow/airfoil_mesh.h5")),
    "checkpoint": Example(prelude=AIRFOIL, ranks=(1, 2), check=check_restored, files=("run.h5",)),
    "profile": Example(prelude=AIRFOIL, ranks=(1, 2),
                       check=lambda ns, printed, rank: assert_summary(printed, rank), files=("trace.json",)),
}


def test_every_named_block_is_in_the_table_and_every_entry_on_a_page():
    names = [b.name for b in blocks("python") if b.name]
    assert len(names) == len(set(names)), f"names used twice: {sorted(n for n in names if names.count(n) > 1)}"
    assert sorted(set(names)) == sorted(EXAMPLES), (set(names) ^ set(EXAMPLES))


def run_block(block: Block, comm, directory: Path, capsys) -> tuple[dict, str]:
    """Run ``block`` (after its prelude) from a fresh session on ``comm``: its namespace and output."""
    example = EXAMPLES.get(block.name, Example())
    script = directory / f"{(block.name or 'block').replace('-', '_')}_{comm.rank}.py"
    script.write_text(ASSUMED + example.prelude + "\n" + block.code)
    mc.reset_runtime(comm=comm)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        if example.raises is not None:
            with pytest.raises(example.raises[0], match=example.raises[1]):
                runpy.run_path(str(script), run_name="__doc_example__")
            return {}, ""
        namespace = runpy.run_path(str(script), run_name="__doc_example__")
        printed = capsys.readouterr().out
        if example.check is not None:
            example.check(namespace, printed, comm.rank)
        comm.Barrier()
        for name in example.files:
            assert (directory / name).exists(), f"{block.id} left no {name}"
    return namespace, printed


def shared_directory(comm, tmp_path) -> Path:
    return Path(comm.bcast(str(tmp_path), root=0))


PYTHON_BLOCKS = blocks("python")


@pytest.mark.parametrize("block", [b for b in PYTHON_BLOCKS if 1 in EXAMPLES.get(b.name, Example()).ranks],
                         ids=lambda b: b.id)
def test_the_example_runs_on_one_process(block, comm, tmp_path, capsys):
    try:
        run_block(block, comm, tmp_path, capsys)
    finally:
        mc.reset_runtime()


@pytest.mark.mpi(nprocs=2, timeout=300)
def test_the_examples_that_say_so_run_on_two_ranks(comm, tmp_path, capsys):
    """One test for all of them: each starts a fresh session on the two ranks."""
    directory = shared_directory(comm, tmp_path)
    ran = []
    try:
        for block in PYTHON_BLOCKS:
            if 2 in EXAMPLES.get(block.name, Example()).ranks:
                (directory / block.id).mkdir(exist_ok=True)
                comm.Barrier()
                run_block(block, comm, directory / block.id, capsys)
                ran.append(block.id)
    finally:
        mc.reset_runtime(comm=comm)
    assert {"readme-diffusion", "grid-jacobi", "solve", "checkpoint"} <= set(ran)


def example_flags() -> list[tuple[str, str, list[str]]]:
    """``(where, example, arguments)`` of every ``examples/<name>.py`` command line in the pages."""
    found = []
    for block in blocks("bash"):
        for line in block.code.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split("#")[0])
            for i, word in enumerate(words):
                if re.fullmatch(r"examples/\w+\.py", word) and not word.startswith("examples/test_"):
                    arguments = [w for w in words[i + 1:] if w != "..."]
                    found.append((f"{block.page}:{block.line}", word, arguments))
    return found


def test_every_example_command_line_in_the_pages_parses():
    lines = example_flags()
    assert len(lines) >= 8, lines
    for where, script, arguments in lines:
        module = example_module(Path(script).stem)
        try:
            module.parse_args(arguments)
        except SystemExit:
            pytest.fail(f"{where}: {script} {' '.join(arguments)}: its flags do not parse")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
