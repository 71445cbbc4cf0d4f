"""The owned elements' levels (distance from the halo, ``partition/layout.py: _levels``), found
breadth first from the halo, against the definition computed level by level over every row of
every map: the same levels on every rank, for meshes with several maps and deep halos."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import meshchain as mc
from meshchain.apps import airfoil, mgcfd, poisson
from meshchain.meshes import channel_bump, jittered_delaunay, naca0012, structured_tets

layout = importlib.import_module("meshchain.partition.layout")


def levels_by_definition(sets, maps, provisional, local_maps, depth):
    """Halo elements at level 0, the exec halo's owned targets at 1; then for each level ``k``:
    every interior element with a row reaching level ``k - 1`` gets ``k``, and the targets of
    the rows at ``k`` that are interior get ``k`` too, until none does; up to
    :data:`~meshchain.partition.layout.MAX_LEVEL` or a level with no element."""
    interior = layout.INTERIOR
    level = {}
    for s in sets:
        level[s] = np.full(len(provisional[s][0]), interior, dtype=np.int64)
        level[s][provisional[s][4]:] = 0
    for m in maps:
        rows = local_maps[m]
        runs = (level[m.source] == 0) & (provisional[m.source][2] <= depth)
        targets = np.unique(rows[runs])
        level[m.target][targets[level[m.target][targets] == interior]] = 1
    for k in range(1, layout.MAX_LEVEL + 1):
        for m in maps:
            rows = local_maps[m]
            if rows.size:
                hit = (level[m.target][rows].min(axis=1) <= k - 1) & (level[m.source] == interior)
                level[m.source][hit] = k
        grew = True
        while grew:
            grew = False
            for m in maps:
                targets = np.unique(local_maps[m][level[m.source] == k])
                hit = targets[level[m.target][targets] == interior]
                if hit.size:
                    level[m.target][hit], grew = k, True
        if not any(np.any(level[s] == k) for s in sets):
            break
    return {s: level[s][: provisional[s][4]].astype(np.int32) for s in sets}


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=600)
@pytest.mark.parametrize("case", ["poisson tets", "poisson triangles", "airfoil", "mgcfd"])
def test_the_levels_found_breadth_first_are_those_of_the_definition(comm, monkeypatch, case):
    built = []
    fast = layout._levels

    def compared(sets, maps, provisional, local_maps, depth):
        found = fast(sets, maps, provisional, local_maps, depth)
        want = levels_by_definition(sets, maps, provisional, local_maps, depth)
        built.append(all(np.array_equal(found[s], want[s]) for s in sets) and set(found) == set(want))
        return found

    monkeypatch.setattr(layout, "_levels", compared)
    mc.reset_runtime(comm=comm)
    if case.startswith("poisson"):
        mesh = structured_tets(6, 6, 6) if case.endswith("tets") else jittered_delaunay(300, seed=3)
        p = poisson.declare(mesh, method="kway")
        mc.api.engine_surface().matrices.prepare_products(p.A, 6)  # five halo layers
    elif case == "airfoil":
        airfoil.declare(naca0012(20, 30), method="rib")
        mc.get_runtime().ensure_depth(4)
    else:
        mgcfd.declare(channel_bump(4, levels=3, shuffle=True), synthetic_loops=2, ca=True, method="kway")
    assert built and all(built), built
