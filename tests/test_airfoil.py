"""OP2's Airfoil: numba vs reference, and meshchain vs the C transcription of OP2."""

from __future__ import annotations

import importlib.util
import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import meshchain as mc
from meshchain.meshes import naca0012, write_op2_ascii

ROOT = Path(__file__).resolve().parents[1]


def load_airfoil():
    spec = importlib.util.spec_from_file_location("airfoil_example", ROOT / "examples" / "airfoil.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


airfoil = load_airfoil()


def final_state(backend, mesh, iters):
    mc.configure(backend=backend)
    problem = airfoil.declare(mesh)
    history = airfoil.run(problem, iters, report_every=1, out=None)
    return np.array([rms for _, rms in history]), problem.p_q.data.copy()


def test_numba_matches_reference_over_20_iterations():
    mesh = naca0012(8, 12)
    rms_ref, q_ref = final_state("reference", mesh, 20)
    rms_nb, q_nb = final_state("numba", mesh, 20)
    np.testing.assert_allclose(rms_nb, rms_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(q_nb, q_ref, rtol=1e-12, atol=0)
    assert not np.allclose(q_nb, np.array(airfoil.qinf)), "the flow must have changed"


def test_constants_are_single_precision_literals_as_in_op2():
    assert airfoil.gam == float(np.float32(1.4)) != 1.4
    assert airfoil.cfl == float(np.float32(0.9))
    assert airfoil.eps == float(np.float32(0.05))
    assert airfoil.gm1 == float(np.float32(1.4)) - 1.0


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the C reference")
def test_rms_history_matches_op2_c_transcription(tmp_path):
    """The digits printed by the example equal those of the plain C Airfoil on the same mesh."""
    binary = tmp_path / "airfoil_c"
    subprocess.run(["gcc", "-O3", "-o", str(binary), str(ROOT / "benchmarks" / "airfoil.c"), "-lm"], check=True)
    mesh_path = tmp_path / "grid.dat"
    write_op2_ascii(naca0012(20, 30), mesh_path)
    c_out = subprocess.run([str(binary), str(mesh_path), "300"], check=True, capture_output=True, text=True).stdout
    c_lines = [line for line in c_out.splitlines() if not line.startswith(("TIME", "KERNEL"))]

    out = io.StringIO()
    mc.configure(backend="numba")
    from meshchain.meshes import read_op2_ascii

    airfoil.run(airfoil.declare(read_op2_ascii(mesh_path)), 300, out=out)
    ours = out.getvalue().splitlines()
    assert [line.split()[0] for line in ours] == ["100", "200", "300"] == [line.split()[0] for line in c_lines]
    for mine, theirs in zip(ours, c_lines):
        a, b = float(mine.split()[1]), float(theirs.split()[1])
        assert abs(a - b) <= 1e-12 * abs(b), (mine, theirs)
        assert mine.split()[1][:12] == theirs.split()[1][:12]  # 11 significant digits printed alike


def test_example_prints_one_line_per_hundred_iterations():
    command = [sys.executable, str(ROOT / "examples" / "airfoil.py"), "--size", "6", "9", "--iters", "200"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout.splitlines()
    assert [line.split()[0] for line in out] == ["100", "200"]
    for line in out:
        value = line.split()[1]
        assert value == "%.15e" % float(value)


def test_airfoil_bits_do_not_depend_on_thread_count():
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")
    mesh = naca0012(10, 15)
    results = []
    for threads in (1, 2):
        mc.configure(backend="numba", threads=threads, block_size=64)  # several blocks and colours
        problem = airfoil.declare(mesh)
        history = airfoil.run(problem, 5, report_every=1, out=None)
        results.append((history, problem.p_q.data.copy(), problem.p_res.data.copy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][2], results[1][2])
    assert mc.stats().loops["res_calc"].colours > 1
