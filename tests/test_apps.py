"""The example applications in ``meshchain.apps`` and their workload interface (serial)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import meshchain as mc
from meshchain import apps
from meshchain.apps import airfoil, mgcfd, synthetic

ROOT = Path(__file__).resolve().parents[1]
CA_MODES = (True, False, "auto")


def checksums_per_mode(app, cache_dir, *, steps: int, **sizes) -> dict:
    """The checksum after ``steps`` steps of a fresh problem, for every chain mode."""
    totals = {}
    for ca in CA_MODES:
        mc.reset_runtime(cache_dir=cache_dir)
        problem = app.setup(**sizes)
        for _ in range(steps):
            app.step(problem, ca=ca)
        assert mc.stats().chains[app.CHAIN].executions > 0, "the step must run the named chain"
        totals[ca] = app.checksum(problem)
    return totals


def test_synthetic_workload_gives_the_same_checksum_in_every_mode(meshchain_cache_dir):
    totals = checksums_per_mode(synthetic, meshchain_cache_dir, steps=2, per_rank=200, loops=4)
    assert totals[True] > 0
    assert totals[True] == totals[False] == totals["auto"]


def test_synthetic_setup_sizes_the_mesh_and_the_chain():
    problem = synthetic.setup(per_rank=200, loops=6)
    assert isinstance(problem, synthetic.SyntheticChain)
    assert problem.nchains == 3 and synthetic.loops_in_chain(6) == 6
    assert problem.edges.size == 176  # structured_tris(8, 8): about 3 * 8^2 interior edges
    assert apps._mesh_size(1) == 4 and apps._mesh_size(30000) == 100


@pytest.mark.parametrize("loops", [3, 1, 0, -2, 2.0, True])
def test_synthetic_refuses_a_loop_count_that_is_not_even(loops):
    with pytest.raises(mc.ConfigurationError, match="even integer >= 2"):
        synthetic.setup(per_rank=200, loops=loops)
    with pytest.raises(mc.ConfigurationError, match="even integer >= 2"):
        synthetic.loops_in_chain(loops)


def test_airfoil_workload_gives_the_same_checksum_in_every_mode(meshchain_cache_dir):
    totals = checksums_per_mode(airfoil, meshchain_cache_dir, steps=3, per_rank=300, loops=4)
    free_stream = 288 * sum(abs(v) for v in airfoil.qinf)  # naca0012(8, 12) before any step
    assert totals[True] != pytest.approx(free_stream, rel=1e-9), "the flow must have changed"
    for ca in (False, "auto"):
        assert totals[ca] == pytest.approx(totals[True], rel=1e-12, abs=0)


def test_airfoil_setup_sizes_the_mesh_and_ignores_loops():
    problem = airfoil.setup(per_rank=300, loops=10)
    assert problem.cells.size == 3 * 8 * 12
    assert airfoil.loops_in_chain(10) == airfoil.loops_in_chain(2) == 4
    assert airfoil._mesh_size(720000) == (400, 600) and airfoil._mesh_size(1) == (8, 12)


def test_mgcfd_workload_gives_the_same_checksum_in_every_mode(meshchain_cache_dir):
    totals = checksums_per_mode(mgcfd, meshchain_cache_dir, steps=2, per_rank=300, loops=4)
    assert totals[True] == pytest.approx(totals[False], rel=1e-14, abs=0)
    assert totals["auto"] == pytest.approx(totals[False], rel=1e-14, abs=0)
    with pytest.raises(mc.ConfigurationError, match="even"):
        mgcfd.loops_in_chain(3)


@pytest.mark.parametrize("app", [airfoil, synthetic, mgcfd])
def test_workload_refuses_bad_sizes_and_a_step_without_chain(app):
    for per_rank in (0, -5, 2.5, True):
        with pytest.raises(mc.ConfigurationError, match="per_rank"):
            app.setup(per_rank=per_rank, loops=4)
    problem = app.setup(per_rank=100, loops=2)
    with pytest.raises(mc.ConfigurationError, match="not None"):
        app.step(problem, ca=None)
    with pytest.raises(mc.ConfigurationError, match="ca must be"):
        app.step(problem, ca="yes")


@pytest.mark.parametrize("script, app", [("airfoil.py", airfoil), ("synthetic_chain.py", synthetic)])
def test_example_scripts_re_export_the_app(script, app):
    """Tests and benchmarks load the example files and use the solver through them."""
    spec = importlib.util.spec_from_file_location(f"example_{app.__name__.rsplit('.', 1)[1]}",
                                                  ROOT / "examples" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in app.__all__:
        assert getattr(module, name) is getattr(app, name), name
    assert callable(module.main) and callable(module.parse_args)
