"""``fp_contract=True``: the numba backend's generated loops may fuse a multiply and an add into
one fused multiply-add. Results differ from the reference path in the last bits only, and are
the same for any thread count, and for a chain run loop by loop or communication-avoiding on
several ranks, since every path runs the same compiled loop."""

from __future__ import annotations

import llvmlite.binding
import numpy as np
import pytest

import meshchain as mc
from meshchain.backends.numba_codegen import loop_source
from meshchain.core.errors import ConfigurationError
from meshchain.ir.loop import make_loop
from meshchain.meshes import jittered_delaunay

FLUX = ("def flux(ua, ub, ra, rb):\n"
        "    f = 0.25 * (ub[0] - ua[0]) + 0.125 * ua[0] * ub[0]\n"
        "    ra[0] += 0.5 * f\n"
        "    rb[0] -= 0.5 * f\n")
UPDATE = "def update(r, u):\n    u[0] = u[0] + 0.3 * r[0] + 0.001 * u[0] * u[0]\n"
ZERO = "def zero(r):\n    r[0] = 0.0\n"


def test_the_reference_backend_refuses_fp_contract():
    with pytest.raises(ConfigurationError, match="compiling backend"):
        mc.reset_runtime(backend="reference", fp_contract=True)
    mc.reset_runtime()


def test_fp_contract_from_the_environment_is_a_flag(monkeypatch):
    monkeypatch.setenv("MESHCHAIN_FP_CONTRACT", "1")
    assert mc.reset_runtime().config.fp_contract is True
    monkeypatch.setenv("MESHCHAIN_FP_CONTRACT", "maybe")
    with pytest.raises(ConfigurationError, match="MESHCHAIN_FP_CONTRACT"):
        mc.reset_runtime()
    monkeypatch.delenv("MESHCHAIN_FP_CONTRACT")
    mc.reset_runtime()


def test_the_generated_functions_fuse_only_when_asked():
    cells = mc.Set(4, "cells")
    q = mc.Dat(cells, 1, None, "q")
    kernel = mc.Kernel.from_source("def scale(a):\n    a[0] = 2.0 * a[0] + 1.0\n")
    loop = make_loop(kernel, cells, (q(mc.RW),), None)
    fused, plain = loop_source(loop, boundscheck=False, contract=True), loop_source(loop, boundscheck=False)
    decorators = [line for line in fused.splitlines() if line.startswith("@_mc_njit(cache=True")]
    assert decorators and all("fastmath={'contract'}" in line for line in decorators)
    assert "fastmath" not in plain


def diffusion(comm, *, mode, fp_contract, threads=None, steps=4):
    """Zero, flux over facets, update, ``steps`` times, as a chain run ``mode`` (``ca``), on a
    new session; the field gathered (on rank 0; None elsewhere)."""
    mc.reset_runtime(comm=comm, fp_contract=fp_contract, threads=threads)
    d = jittered_delaunay(300, seed=3).declare()
    u = mc.Dat(d.nodes, 1, np.cos(np.arange(d.nodes.size, dtype=np.float64) * 0.37), "u")
    r = mc.Dat(d.nodes, 1, None, "r")
    if comm is not None:
        mc.partition("kway", seed_set=d.cells)
    zero, flux, update = (mc.Kernel.from_source(source) for source in (ZERO, FLUX, UPDATE))
    for _ in range(steps):
        with mc.loop_chain("diffusion", ca=mode):
            mc.par_loop(zero, d.nodes, r(mc.WRITE))
            mc.par_loop(flux, d.facets, u(mc.READ, d.facet2node[0]), u(mc.READ, d.facet2node[1]),
                        r(mc.INC, d.facet2node[0]), r(mc.INC, d.facet2node[1]))
            mc.par_loop(update, d.nodes, r(mc.READ), u(mc.RW))
    return u.gather()


def test_contracted_loops_give_the_same_bits_on_any_threads_and_are_close_to_the_reference():
    plain = diffusion(None, mode=False, fp_contract=False)
    one, two = (diffusion(None, mode=False, fp_contract=True, threads=t) for t in (1, 2))
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, plain, rtol=1e-12, atol=1e-14)
    if llvmlite.binding.get_host_cpu_features().get("fma"):  # a processor that fuses: the option took effect
        assert not np.array_equal(one, plain)
    mc.reset_runtime()


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_contracted_chains_loop_by_loop_and_communication_avoiding_give_the_same_bits(comm):
    per_loop, ca = (diffusion(comm, mode=mode, fp_contract=True) for mode in (False, True))
    plain = diffusion(comm, mode=True, fp_contract=False)
    if comm.rank == 0:
        np.testing.assert_array_equal(per_loop, ca)
        np.testing.assert_allclose(ca, plain, rtol=1e-12, atol=1e-14)
