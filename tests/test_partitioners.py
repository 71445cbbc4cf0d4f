"""Partitioners: block offsets, parallel recursive inertial bisection, METIS k-way.

Serial tests call the partitioners with ``MPI.COMM_SELF``. The MPI tests launch
``mpiexec -n N python <worker>`` themselves (N = 2, 3, 4), once per N; the worker
runs every case on blocks of arrays the test wrote to disk and saves the gathered
results, which are compared with the ``COMM_SELF`` run on the whole arrays.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

MPI = pytest.importorskip("mpi4py.MPI")
pymetis = pytest.importorskip("pymetis")

from meshchain.partition.partitioners import exact as P  # noqa: E402 - the exact reductions
from meshchain.partition.partitioners import _principal_axes, block_offsets, kway, rib  # noqa: E402
from meshchain.core.errors import DeclarationError, MeshchainError  # noqa: E402

SELF = MPI.COMM_SELF
FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------- data sets


def jittered_2d(seed: int = 0) -> np.ndarray:
    """A jittered 41 x 37 grid with some exactly repeated points (ties)."""
    rng = np.random.default_rng(seed)
    gx, gy = np.meshgrid(np.linspace(0.0, 4.0, 41), np.linspace(-1.0, 2.0, 37), indexing="ij")
    pts = np.column_stack([gx.ravel(), gy.ravel()])
    pts += rng.uniform(-0.02, 0.02, pts.shape)
    pts[::17] = pts[5]  # duplicates: equal projections, broken by global id
    return pts


def cloud_3d(seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pts = rng.standard_normal((1500, 3)) * np.array([3.0, 1.0, 0.3]) + np.array([1e3, -5.0, 0.0])
    return pts


def grid_graph(nx: int = 30, ny: int = 31) -> tuple[np.ndarray, np.ndarray]:
    """4-neighbour grid graph in CSR, sorted neighbours, connected."""
    ids = np.arange(nx * ny).reshape(nx, ny)
    rows = []
    for i in range(nx):
        for j in range(ny):
            nb = [ids[a, b] for a, b in ((i - 1, j), (i, j - 1), (i, j + 1), (i + 1, j)) if 0 <= a < nx and 0 <= b < ny]
            rows.append(sorted(nb))
    xadj = np.zeros(nx * ny + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=xadj[1:])
    return xadj, np.concatenate(rows).astype(np.int64)


def metis_reference(xadj, adjncy, nparts, seed=0):
    options = pymetis.Options(seed=seed)
    graph = pymetis.CSRAdjacency(xadj.astype(pymetis.zero_copy_dtype()), adjncy.astype(pymetis.zero_copy_dtype()))
    return np.asarray(pymetis.part_graph(nparts, graph, options=options, recursive=False)[1], dtype=np.int32)


def assert_exact_balance(parts, n, nparts):
    assert parts.dtype == np.int32 and parts.shape == (n,)
    assert parts.min(initial=0) >= 0 and parts.max(initial=0) < max(nparts, 1)
    sizes = np.bincount(parts, minlength=nparts)
    np.testing.assert_array_equal(sizes, np.diff(block_offsets(n, nparts)))


# ----------------------------------------------------------- block_offsets


def test_block_offsets_values():
    np.testing.assert_array_equal(block_offsets(10, 4), [0, 3, 6, 8, 10])
    np.testing.assert_array_equal(block_offsets(0, 3), [0, 0, 0, 0])
    np.testing.assert_array_equal(block_offsets(7, 1), [0, 7])
    assert block_offsets(5, 2).dtype == np.int64


@FAST
@given(st.integers(0, 10_000), st.integers(1, 300))
def test_block_offsets_property(n, nparts):
    off = block_offsets(n, nparts)
    sizes = np.diff(off)
    assert len(off) == nparts + 1 and off[0] == 0 and off[-1] == n
    assert sizes.max() - sizes.min() <= 1
    assert (sizes[: n % nparts] == n // nparts + 1).all() and (sizes[n % nparts :] == n // nparts).all()


@pytest.mark.parametrize("args", [(-1, 2), (3, 0), (3, -2), (2.5, 2), (3, True)])
def test_block_offsets_rejects(args):
    with pytest.raises(DeclarationError):
        block_offsets(*args)


# ---------------------------------------------------------------- rib serial


@pytest.mark.parametrize("nparts", [1, 2, 3, 5, 8, 13, 64])
@pytest.mark.parametrize("make", [jittered_2d, cloud_3d])
def test_rib_serial_exact_balance(make, nparts):
    x = make()
    parts = rib(x, SELF, nparts=nparts)
    assert_exact_balance(parts, len(x), nparts)
    np.testing.assert_array_equal(parts, rib(x.copy(), SELF, nparts=nparts))  # repeatable


def test_rib_default_nparts_is_comm_size():
    x = jittered_2d()
    np.testing.assert_array_equal(rib(x, SELF), np.zeros(len(x), dtype=np.int32))


def test_rib_line_gives_contiguous_slabs():
    x = np.column_stack([np.arange(20.0), np.zeros(20)])
    np.testing.assert_array_equal(rib(x, SELF, nparts=4), np.repeat(np.arange(4), 5))
    # long axis is y here: slabs across y
    rng = np.random.default_rng(5)
    y = np.column_stack([rng.uniform(0, 1, 400), rng.uniform(0, 10, 400)])
    parts = rib(y, SELF, nparts=2)
    assert y[parts == 0, 1].max() <= y[parts == 1, 1].min()


def test_rib_more_parts_than_points_and_empty():
    x = np.random.default_rng(2).random((5, 2))
    assert_exact_balance(rib(x, SELF, nparts=8), 5, 8)
    assert rib(np.empty((0, 3)), SELF, nparts=4).shape == (0,)
    assert_exact_balance(rib(np.arange(7.0), SELF, nparts=3), 7, 3)  # 1-D coords: gdim 1


def test_rib_all_points_equal_breaks_ties_by_global_id():
    x = np.ones((10, 2))
    ids = np.arange(10)[::-1].copy()
    parts = rib(x, SELF, nparts=3, global_ids=ids)
    assert_exact_balance(parts, 10, 3)
    # ordered by id: ids 0..3 -> part 0 (sizes 4, 3, 3)
    np.testing.assert_array_equal(parts[np.argsort(ids)], [0, 0, 0, 0, 1, 1, 1, 2, 2, 2])


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.integers(1, 3), st.integers(0, 120))
def test_rib_is_independent_of_row_order(seed, nparts, gdim, n):
    """Permuting the rows (with their global ids) permutes the result: the sums are exact."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, gdim)) * 10.0 ** rng.integers(-3, 4, gdim)
    if n > 4:
        x[: n // 4] = x[0]  # ties
    parts = rib(x, SELF, nparts=nparts)
    assert_exact_balance(parts, n, nparts)
    perm = rng.permutation(n)
    np.testing.assert_array_equal(rib(x[perm], SELF, nparts=nparts, global_ids=perm), parts[perm])


@pytest.mark.parametrize("chunk", [7, 1 << 14])
def test_exact_group_sums_are_exact(monkeypatch, chunk):
    """Huge, tiny, subnormal, zero and mixed-sign values sum exactly, per group."""
    monkeypatch.setattr(P, "_CHUNK_ROWS", chunk)
    rng = np.random.default_rng(11)
    n = 2000
    v = rng.standard_normal((n, 3)) * np.exp(rng.uniform(-700, 700, (n, 3)))
    v[rng.random((n, 3)) < 0.1] = 0.0
    v[rng.random((n, 3)) < 0.05] = 5e-324 * rng.integers(-5, 5)
    g = rng.integers(0, 4, n)
    limbs, exponent = P._exact_group_sums(v, g, 4, SELF)
    totals = P._limbs_to_int(limbs)
    for group in range(4):
        for j in range(3):
            exact = sum((Fraction(float(x)) for x in v[g == group, j]), Fraction(0))
            assert Fraction(totals[group * 3 + j]) * Fraction(2) ** exponent == exact
    perm = rng.permutation(n)
    np.testing.assert_array_equal(P._exact_group_sums(v[perm], g[perm], 4, SELF)[0], limbs)


def test_principal_axes_match_lapack():
    rng = np.random.default_rng(4)
    for d in (1, 2, 3, 4):
        a = rng.standard_normal((50, d, d))
        cov = a @ a.transpose(0, 2, 1)
        axes = _principal_axes(cov)
        w, v = np.linalg.eigh(cov)
        ref = v[:, :, -1]
        ref *= np.sign(ref[np.arange(50), np.argmax(np.abs(ref), axis=1)])[:, None]
        np.testing.assert_allclose(axes, ref, atol=1e-9)
        np.testing.assert_allclose(np.linalg.norm(axes, axis=1), 1.0, atol=1e-12)
    degenerate = _principal_axes(np.zeros((2, 3, 3)))
    np.testing.assert_array_equal(degenerate, [[1.0, 0.0, 0.0]] * 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(coords=np.array([[np.nan, 1.0]])), "NaN or infinite"),
        (dict(coords=np.zeros((2, 2, 2))), "shape"),
        (dict(coords=np.array(["a", "b"])), "real array"),
        (dict(coords=np.zeros((3, 2)), nparts=0), "at least 1"),
        (dict(coords=np.zeros((3, 2)), nparts=2.0), "integer"),
        (dict(coords=np.zeros((3, 2)), global_ids=np.arange(2)), "global_ids"),
        (dict(coords=np.zeros((3, 2)), global_ids=np.array([0, -1, 2])), "non-negative"),
        (dict(coords=np.zeros((3, 2)), nparts=2, global_ids=np.array([1, 2, 2])), "not unique"),
        (dict(coords=np.array([[1e300, 0.0], [-1e300, 1.0]]), nparts=2), "overflows"),
    ],
)
def test_rib_errors(kwargs, match):
    coords = kwargs.pop("coords")
    with pytest.raises(DeclarationError, match=match) as info:
        rib(coords, SELF, **kwargs)
    assert isinstance(info.value, MeshchainError)


# --------------------------------------------------------------- kway serial


@pytest.mark.parametrize("nparts", [2, 3, 4, 7])
def test_kway_serial_matches_pymetis(nparts):
    xadj, adjncy = grid_graph()
    parts = kway(xadj, adjncy, SELF, nparts=nparts)
    np.testing.assert_array_equal(parts, metis_reference(xadj, adjncy, nparts))
    assert parts.dtype == np.int32
    sizes = np.bincount(parts, minlength=nparts)
    assert sizes.min() > 0
    assert sizes.max() <= 1.03 * len(parts) / nparts + 1


def test_kway_seed_and_one_part():
    xadj, adjncy = grid_graph(12, 13)
    np.testing.assert_array_equal(kway(xadj, adjncy, SELF, nparts=1), np.zeros(156, dtype=np.int32))
    a = kway(xadj, adjncy, SELF, nparts=5, seed=3)
    np.testing.assert_array_equal(a, kway(xadj, adjncy, SELF, nparts=5, seed=3))
    np.testing.assert_array_equal(a, metis_reference(xadj, adjncy, 5, seed=3))


def test_kway_cleans_self_loops_duplicates_and_asymmetry():
    xadj, adjncy = grid_graph(10, 11)
    n = len(xadj) - 1
    clean = kway(xadj, adjncy, SELF, nparts=4)
    # keep only edges u < v (asymmetric), add a self-loop and a duplicate on each row
    rows = []
    for u in range(n):
        nb = [v for v in adjncy[xadj[u] : xadj[u + 1]] if v > u]
        rows.append([u] + nb + nb[:1])
    dirty_xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=dirty_xadj[1:])
    dirty = kway(dirty_xadj, np.concatenate(rows), SELF, nparts=4)
    np.testing.assert_array_equal(dirty, clean)


@pytest.mark.parametrize(
    "xadj, adjncy, kwargs, match",
    [
        ([0, 1, 2], [1, 5], {}, "outside"),
        ([0, 2, 1], [1, 0], {}, "decreases"),
        ([0, 1, 2], [1], {}, "adjncy has"),
        ([[0, 1]], [1], {}, "row pointers"),
        ([0.0, 1.0], [0], {}, "row pointers"),
        ([0, 1, 2], [1, 0], {"nparts": 0}, "at least 1"),
    ],
)
def test_kway_errors(xadj, adjncy, kwargs, match):
    with pytest.raises(DeclarationError, match=match):
        kway(np.asarray(xadj), np.asarray(adjncy), SELF, **kwargs)


# ------------------------------------------------------------------ MPI runs

WORKER = textwrap.dedent(
    """
    import sys, traceback
    import numpy as np
    from mpi4py import MPI
    from meshchain.partition.partitioners import block_offsets, kway, rib
    from meshchain.core.errors import DeclarationError

    comm = MPI.COMM_WORLD
    size, rank = comm.size, comm.rank
    data = sys.argv[1]
    out = {}

    def block(a, counts=None):
        off = block_offsets(len(a), size) if counts is None else np.concatenate([[0], np.cumsum(counts)])
        return a[off[rank]:off[rank + 1]]

    for name in ("xy", "xyz"):
        x = np.load(f"{data}/{name}.npy")
        for nparts in (None, 5, 7):
            out[f"rib_{name}_{nparts}"] = comm.gather(rib(block(x), comm, nparts=nparts), root=0)
    # uneven distribution with an empty rank, default global ids (rank-order concatenation)
    x = np.load(f"{data}/xy.npy")
    counts = np.full(size, len(x) // (size - 1))
    counts[1] = 0
    counts[-1] = len(x) - counts.sum() + counts[-1]
    out["rib_uneven"] = comm.gather(rib(block(x, counts), comm, nparts=6), root=0)

    xadj = np.load(f"{data}/xadj.npy")
    adjncy = np.load(f"{data}/adjncy.npy")
    off = block_offsets(len(xadj) - 1, size)
    lx = xadj[off[rank]:off[rank + 1] + 1]
    la = adjncy[lx[0]:lx[-1]]
    for nparts in (None, 5):
        out[f"kway_{nparts}"] = comm.gather(kway(lx, la, comm, nparts=nparts), root=0)
    weights = 1.0 + np.arange(len(xadj) - 1) % 4  # the weights' quantisation is agreed over ranks
    out["kway_weighted"] = comm.gather(kway(lx, la, comm, nparts=3, weights=block(weights)), root=0)
    x = np.load(f"{data}/xy.npy")
    out["rib_weighted"] = comm.gather(rib(block(x), comm, nparts=3, weights=block(1.0 + np.arange(len(x)) % 3)), root=0)

    # errors on one rank only must raise on every rank (no rank left in a collective)
    def caught(fn):
        try:
            fn()
        except DeclarationError as err:
            return str(err)
        return None

    bad = np.load(f"{data}/xy.npy")[:4].copy()
    if rank == size - 1:
        bad[0, 0] = np.nan
    out["err_rib_nan"] = comm.gather(caught(lambda: rib(bad, comm)), root=0)
    out["err_rib_nparts"] = comm.gather(caught(lambda: rib(bad[1:], comm, nparts=2 + (rank == 1))), root=0)
    la_bad = la.copy()
    if rank == 1 and len(la_bad):
        la_bad[0] = 10**9
    out["err_kway_ids"] = comm.gather(caught(lambda: kway(lx, la_bad, comm)), root=0)
    ids = np.zeros(3, dtype=np.int64)  # duplicated ids on every rank, all points equal
    out["err_rib_dup"] = comm.gather(caught(lambda: rib(np.ones((3, 2)), comm, nparts=2, global_ids=ids)), root=0)

    if rank == 0:
        np.save(f"{data}/out_{size}.npy", np.array(out, dtype=object), allow_pickle=True)
    """
)


def _mpiexec() -> str | None:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else shutil.which("mpiexec")


def _run_mpi(nprocs: int, script: Path, data: Path, timeout: float = 60.0) -> None:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("PMI_SIZE", "PMI_RANK", "PMI_FD", "PMI_PORT", "HYDI_CONTROL_FD", "MPI_LOCALNRANKS"):
        env.pop(var, None)
    cmd = [_mpiexec(), "-n", str(nprocs), sys.executable, str(script), str(data)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"mpiexec -n {nprocs} timed out after {timeout} s (a rank hung?):\n{output.decode()[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"mpiexec -n {nprocs} failed ({proc.returncode}):\n{output.decode()[-4000:]}")


@pytest.fixture(scope="module")
def mpi_data(tmp_path_factory):
    if _mpiexec() is None:
        pytest.skip("mpiexec not found")
    data = tmp_path_factory.mktemp("partitioners-mpi")
    np.save(data / "xy.npy", jittered_2d())
    np.save(data / "xyz.npy", cloud_3d())
    xadj, adjncy = grid_graph()
    np.save(data / "xadj.npy", xadj)
    np.save(data / "adjncy.npy", adjncy)
    (data / "worker.py").write_text(WORKER)
    return data


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"np{n}")
def mpi_result(request, mpi_data):
    nprocs = request.param
    _run_mpi(nprocs, mpi_data / "worker.py", mpi_data)
    return nprocs, np.load(mpi_data / f"out_{nprocs}.npy", allow_pickle=True).item()


def test_mpi_rib_matches_comm_self(mpi_result):
    nprocs, out = mpi_result
    for name, make in (("xy", jittered_2d), ("xyz", cloud_3d)):
        x = make()
        for nparts in (None, 5, 7):
            pieces = out[f"rib_{name}_{nparts}"]
            off = block_offsets(len(x), nprocs)
            assert [len(p) for p in pieces] == list(np.diff(off))
            parts = np.concatenate(pieces)
            expected_parts = nprocs if nparts is None else nparts
            assert_exact_balance(parts, len(x), expected_parts)
            np.testing.assert_array_equal(parts, rib(x, SELF, nparts=expected_parts), err_msg=f"{name} nparts={nparts}")
    x = jittered_2d()
    pieces = out["rib_uneven"]
    assert len(pieces[1]) == 0
    np.testing.assert_array_equal(np.concatenate(pieces), rib(x, SELF, nparts=6))


def test_mpi_kway_matches_serial_metis(mpi_result):
    nprocs, out = mpi_result
    xadj, adjncy = grid_graph()
    for nparts in (None, 5):
        k = nprocs if nparts is None else nparts
        parts = np.concatenate(out[f"kway_{nparts}"])
        np.testing.assert_array_equal(parts, metis_reference(xadj, adjncy, k))
        assert (np.bincount(parts, minlength=k) > 0).all()


def test_mpi_weighted_partitions_match_one_process(mpi_result):
    _, out = mpi_result
    xadj, adjncy = grid_graph()
    weights = 1.0 + np.arange(len(xadj) - 1) % 4
    np.testing.assert_array_equal(np.concatenate(out["kway_weighted"]),
                                  kway(xadj, adjncy, SELF, nparts=3, weights=weights))
    x = jittered_2d()
    np.testing.assert_array_equal(np.concatenate(out["rib_weighted"]),
                                  rib(x, SELF, nparts=3, weights=1.0 + np.arange(len(x)) % 3))


def test_mpi_errors_raise_on_every_rank(mpi_result):
    nprocs, out = mpi_result
    for key, match in (
        ("err_rib_nan", "NaN"),
        ("err_rib_nparts", "different nparts"),
        ("err_kway_ids", "outside"),
        ("err_rib_dup", "not unique"),
    ):
        messages = out[key]
        assert len(messages) == nprocs
        assert all(m is not None and match in m for m in messages), (key, messages)
