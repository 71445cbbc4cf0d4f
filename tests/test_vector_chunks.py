"""Loops run in chunks of gathers, vectorised computing and scatters (``backends/vector_chunks.py``)
against the reference backend, bit for bit, on random meshes and kernels with divisions and
square roots; and where the chunked form is made and where it is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends.vector_chunks import CHUNK, chunked_lines

FLOAT = {0: "float64", 1: "float64", 2: "float64"}
INDEX = ["_mc_u = _mc_np.uint64(_mc_e)", "_mc_i0_0 = _mc_m0[_mc_u, 0]", "_mc_i0_1 = _mc_m0[_mc_u, 1]"]
LOADS = ["_mc_v0_0 = _mc_d0[_mc_i0_0, 0]", "_mc_v1_0 = _mc_d0[_mc_i0_1, 0]"]


def chunked(body, dtypes=None):
    return chunked_lines(INDEX + LOADS + body, "lo", "hi", FLOAT if dtypes is None else dtypes)


def test_a_body_that_divides_and_adds_to_rows_is_chunked():
    lines = chunked(["t = _mc_v0_0 / _mc_v1_0", "_mc_d1[_mc_i0_0, 0] += t", "_mc_d1[_mc_i0_1, 0] += -t"])
    text = "\n".join(lines)
    assert f"range(lo, hi, {CHUNK})" in text
    assert f"_mc_vo[{CHUNK} + _mc_k] = -t" in text  # the second store's value, in the buffer's second row
    scatter = text.split("for _mc_k in range(_mc_n):")[-1]
    assert scatter.index("_mc_d1[_mc_i0_0, 0] +=") < scatter.index("_mc_d1[_mc_i0_1, 0] +=")  # the body's order


def test_the_elements_own_rows_are_kept_in_locals_and_stored_once():
    """A direct row set, added to and read (Airfoil's ``adt_calc``), and one read and added to
    (its old value gathered): each row stored once, from its local, after the body."""
    lines = chunked(["_mc_d1[_mc_u, 0] = 1.0 / _mc_v0_0", "_mc_d1[_mc_u, 0] -= _mc_v1_0",
                     "_mc_d1[_mc_u, 0] = _mc_d1[_mc_u, 0] / 3.0", "_mc_d2[_mc_u, 1] += _mc_d1[_mc_u, 0] * 2.0"])
    text = "\n".join(lines)
    gathers = text.split("for _mc_k in range(_mc_n):")[1]
    assert "_mc_d2[_mc_u, 1]" in gathers and "_mc_d1[_mc_u, 0]" not in gathers  # only the row read first
    assert "_mc_h1_0 = _mc_h1_0 - _mc_v1_0" in text and "_mc_h1_0 = _mc_np.float64(_mc_h1_0 / 3.0)" in text
    scatter = text.split("for _mc_k in range(_mc_n):")[-1]
    assert scatter.count("_mc_d1[_mc_u, 0] =") == 1 and scatter.count("_mc_d2[_mc_u, 1] =") == 1


def test_a_row_only_read_is_gathered_and_not_stored():
    text = "\n".join(chunked(["_mc_d1[_mc_i0_0, 0] += _mc_d2[_mc_u, 0] / _mc_v1_0"]))
    assert "_mc_d2[_mc_u, 0]" in text.split("for _mc_k in range(_mc_n):")[1]
    assert "_mc_d2[_mc_u, 0] =" not in text


@pytest.mark.parametrize("body, dtypes, why", [
    (["_mc_d1[_mc_i0_0, 0] += _mc_v0_0 * _mc_v1_0"], None, "adds and multiplies only"),
    (["_mc_d0[_mc_i0_0, 0] += _mc_v0_0 / _mc_v1_0"], None, "a dat read and written"),
    (["_mc_d1[_mc_i0_0, 0] += _mc_v0_0 / _mc_v1_0"], {0: "float64", 1: "float32"}, "a float32 dat"),
    (["_mc_d1[_mc_i0_0, 0] += _mc_v0_0 / _mc_v1_0"], {0: "int32", 1: "float64"}, "an integer dat read"),
    (["if _mc_v0_0 > 0:", "    _mc_d1[_mc_i0_0, 0] += 1.0 / _mc_v0_0"], None, "a store made only sometimes"),
    (["_mc_d1[_mc_u, 0] = 1.0 / _mc_v0_0", "if _mc_v0_0 > 0:", "    _mc_d1[_mc_u, 0] = 2.0"], None,
     "an own row stored only sometimes"),
    (["_mc_r2_0 += _mc_v0_0 / _mc_v1_0", "_mc_d1[_mc_i0_0, 0] += 1.0"], None, "a reduction into a global"),
    (["for j in range(2):", "    _mc_d1[_mc_i0_0, j] += _mc_v0_0 / _mc_v1_0"], None, "a store in a loop"),
    (["_mc_d1[_mc_i0_0, 0] *= _mc_v0_0 / _mc_v1_0"], None, "a store other than +=, -= or ="),
    (["_mc_d1[_mc_i0_0, 0] += math.exp(_mc_v0_0) / _mc_v1_0"], None, "a function with no vector form"),
    (["_mc_d1[_mc_i0_0, 0] += _mc_v0_0 ** 0.5 / _mc_v1_0"], None, "a power calling pow"),
    (["t = _mc_d1[_mc_i0_0, 0] / _mc_v1_0", "_mc_d1[_mc_i0_0, 0] = t"], None, "a row through a map read"),
    (["_mc_d1[_mc_u, 0] = _mc_v0_0 / _mc_v1_0", "_mc_d1[_mc_i0_0, 0] += 1.0"], None,
     "a dat written directly and through a map"),
    (["_mc_d2[_mc_u, 0] = _mc_d1[_mc_i0_1, 0] / _mc_v1_0", "_mc_d1[_mc_i0_0, 0] += 1.0"], None,
     "a dat added to through a map, read through another row"),
])
def test_the_one_loop_form_stays_where_chunks_would_not_be_exact_or_faster(body, dtypes, why):
    assert chunked(body, dtypes) is None, why


@st.composite
def edge_loops(draw):
    """An edge set over nodes (maps with repeated and equal columns), float data, and a kernel
    dividing and taking square roots that reads nodes through both columns and an edge value,
    adds to a node dat through both columns and writes an edge dat."""
    n_edges = draw(st.integers(0, 3 * CHUNK + 5))
    n_nodes = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31))
    dims = draw(st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3)))
    write_edges = draw(st.booleans())
    return n_edges, n_nodes, seed, dims, write_edges


def kernel_for(dims, write_edges) -> str:
    """Reads through both columns and of the edge (``w``, read and added to: RW), adds to
    (``fa``) and subtracts from (``fb``) the nodes, and sets, adds to and reads an edge value
    (``out``, WRITE)."""
    node_dim, edge_dim, out_dim = dims
    lines = ["def flux(a, b, w, fa, fb" + (", out):" if write_edges else "):"), "    s = 1.0"]
    lines += [f"    s += a[{k}] / (1.0 + b[{k}] * b[{k}]) - math.sqrt(abs(a[{k}]) + 0.5)" for k in range(node_dim)]
    lines += [f"    s = s * w[{k}] + w[{k}] / (2.0 + abs(s))" for k in range(edge_dim)]
    lines += ["    if s > 0.5:", "        s = s / 3.0", "    else:", "        s = math.sqrt(abs(s)) - 1.0"]
    lines += [f"    w[{k}] += s / 7.0" for k in range(edge_dim)]
    lines += [f"    fa[{k}] += s / {k + 1}.0 + a[0]" for k in range(out_dim)]
    lines += [f"    fb[{k}] -= {k}.5 - s" for k in range(out_dim)]
    if write_edges:
        lines += ["    out[0] = math.sqrt(abs(s)) / 3.0", "    out[0] += w[0]", "    out[0] = out[0] * out[0] / 5.0"]
    return "\n".join(lines) + "\n"


def run_edges(backend, example, *, block_size, comm=None, **options):
    """``(res before, res after, out after, w after)`` of two runs of the loop (on ``comm``'s
    ranks when given, partitioned in blocks: gathered, None off rank 0)."""
    n_edges, n_nodes, seed, (node_dim, edge_dim, out_dim), write_edges = example
    mc.reset_runtime(cache_dir=mc.get_runtime().config.cache_dir, **({} if comm is None else {"comm": comm}))
    mc.configure(backend=backend, block_size=block_size, **options)
    rng = np.random.default_rng(seed)
    nodes, edges = mc.Set(n_nodes, "nodes"), mc.Set(n_edges, "edges")
    e2n = mc.Map(edges, nodes, 2, rng.integers(0, n_nodes, (n_edges, 2)), "e2n")
    q = mc.Dat(nodes, node_dim, rng.normal(size=(n_nodes, node_dim)), "q")
    w = mc.Dat(edges, edge_dim, rng.normal(size=(n_edges, edge_dim)), "w")
    res = mc.Dat(nodes, out_dim, rng.normal(size=(n_nodes, out_dim)), "res")
    out = mc.Dat(edges, 1, None, "out")
    if comm is not None:
        mc.partition("block")
    before = res.gather()
    args = [q(mc.READ, e2n[0]), q(mc.READ, e2n[1]), w(mc.RW), res(mc.INC, e2n[0]), res(mc.INC, e2n[1])]
    kernel = mc.Kernel.from_source("import math\n" + kernel_for(example[3], write_edges))
    for _ in range(2):
        mc.par_loop(kernel, edges, *(args + [out(mc.WRITE)] if write_edges else args))
    return before, res.gather(), out.gather(), w.gather()


def generated_sources(kernel_name: str) -> list[str]:
    backend = mc.get_runtime().backend
    return [Path(e.path).read_text() for e in backend._executors.values() if kernel_name in e.module_name]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(example=edge_loops(), block_size=st.sampled_from([1, 7, CHUNK, 4096, 4096]))
def test_chunked_loops_match_the_one_loop_form_and_the_reference_backend_bit_for_bit(example, block_size):
    """Against the one-loop form (``debug``: indices checked) in the same block and colour
    order, and against the reference backend where one block runs the elements in order (with
    several blocks the two backends add the increments in other orders)."""
    one_loop = run_edges("numba", example, block_size=block_size, debug=True)
    got = run_edges("numba", example, block_size=block_size)
    assert not example[0] or any("_mc_vg" in source for source in generated_sources("flux")), "chunks made"
    wanted = [one_loop]
    if block_size > example[0]:
        wanted.append(run_edges("reference", example, block_size=block_size))
    for want in wanted:
        for a, b in zip(want, got):
            np.testing.assert_array_equal(b, a)


def test_chunked_and_one_loop_forms_give_the_same_bits_and_data_change():
    """The same loops with index checks on (``debug``: the one-loop form) and off (chunked)."""
    example = (3 * CHUNK + 1, 17, 3, (3, 2, 2), True)
    results = []
    for debug in (True, False):
        results.append(run_edges("numba", example, block_size=7, debug=debug))
        assert any("_mc_vg" in source for source in generated_sources("flux")) is not debug
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    before, after, out, _ = results[1]
    assert not np.array_equal(before, after) and np.all(out > 0)  # the loop changed both dats


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_chunked_loops_on_ranks_give_the_bits_of_the_one_loop_form(comm):
    """On several ranks (owned and halo elements in separate ranges, their starts anywhere in a
    chunk), the chunked form against the one-loop form on the same partition."""
    example = (3 * CHUNK + 5, 40, 11, (3, 2, 2), True)
    results = [run_edges("numba", example, block_size=block_size, comm=comm, debug=debug)
               for block_size in (7, 4096) for debug in (True, False)]
    assert any("_mc_vg" in source for source in generated_sources("flux"))
    if comm.rank == 0:
        for one_loop, chunked in (results[0:2], results[2:4]):
            for a, b in zip(one_loop, chunked):
                np.testing.assert_array_equal(b, a)
        assert not np.array_equal(results[1][0], results[1][1])  # the loop changed res
