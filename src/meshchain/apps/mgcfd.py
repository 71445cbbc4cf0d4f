"""MG-CFD: Warwick's 3D multigrid finite-volume Euler mini-app, written with meshchain.

This is the solver of MG-CFD's OP2 version (``warwick-hpsc/MG-CFD-app-OP2``, Corrigan et
al.'s AIAA-2009-4001 Euler kernels with Warwick's multigrid): its constants, kernels, the
declaration of its sets, maps and dats per level from its HDF5 input
(:mod:`meshchain.meshes.mgcfd`), and its multigrid cycle. The command-line driver is
``examples/mgcfd.py``. The kernels follow OP2's sources operation for operation, so that
the results agree with OP2's to rounding (see ``tests/test_mgcfd.py``).

Per level ``l`` (vertex-centred: unknowns on the nodes, 5 per node: density, momentum,
density times energy), set-up computes each node's dual volume from its edges
(``calculate_cell_volumes``, which also turns each edge weight into ``area / length`` along
the edge) and damps the edge and boundary weights by ``1e-7`` (``dampen_ewt``), as MG-CFD
does. A *step* on level ``l`` is::

    copy_double_kernel          nodes   variables -> old_variables
    calculate_dt_kernel         nodes   a local time step per node
    get_min_dt_kernel           nodes   its minimum over the ranks (a Global, MIN)
    compute_step_factor_kernel  nodes   min_dt / volume
    3 times (Runge-Kutta stages):
      compute_flux_edge_kernel      edges   central flux + scalar dissipation, into both nodes
      [the synthetic chain]         edges   test_write, test_read per chain; test_negate
      compute_bnd_node_flux_kernel  bnd     wall (pressure) or far-field flux
      time_step_kernel              nodes   variables = old + factor flux; fluxes zeroed
    residual_kernel             nodes   residual = variables - old_variables
    calc_rms_kernel             nodes   on level 0: rms = sqrt(Σ residual² / nodes)

A *cycle* steps on levels ``0, 1, ..., L-1, L-2, ..., 1``, moving up (``up_pre``, ``up``,
``up_post``: the coarse node's variables become the mean of its fine nodes') before each
step on a coarser level and down (``down_kernel``: the fine node's variables corrected by
the difference of residuals, weighted by the distance to its coarse node) before each step
on a finer one, the last down to level 0 ending the cycle; its rms is that of its level-0
step.

**The synthetic chain** (``synthetic_loops=n``, the OP2 CA paper's experiment): inside each
Runge-Kutta stage, ``n / 2`` chains of ``test_write`` (adds 1 to both nodes' copy of the
variables, per edge) and ``test_read`` (reads it, increments dummy fluxes), the first chain
on the variables themselves and the others on copies, all recorded as one loop chain named
``"synthetic"`` (``ca``: communication-avoiding, loop by loop or ``"auto"``); then
``test_negate`` takes the first chain's additions off the variables again. MG-CFD's branch
``feature/icpp2023-commavoid`` runs it with one chain by default (``n = 2``); ``n = 0`` is
MG-CFD's ``master``.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.apps import mgcfd
>>> from meshchain.meshes import channel_bump
>>> problem = mgcfd.declare(channel_bump(2, levels=2))
>>> history = mgcfd.run(problem, 2)
>>> len(history), all(rms > 0 for rms in history)
(2, True)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np

import meshchain as mc
from meshchain.comm.agree import raise_together
from meshchain.meshes.mgcfd import MGCFDMesh, channel_bump, level_blocks, read_input_dat, read_level

from . import _check_chain_mode, _total_size

__all__ = [
    "GAMMA", "RK", "FF_MACH", "SMOOTHING", "FF_VARIABLE", "FF_FLUX", "Level", "MGCFD", "declare", "initialise",
    "level_step", "up", "down", "cycle", "captured_cycle", "run", "read_levels", "CHAIN", "setup", "step", "loops_in_chain", "checksum",
]

GAMMA = 1.4
RK = 3
FF_MACH = 1.2
SMOOTHING = float(np.float32(0.2))  # MG-CFD's ``double(0.2f)``
NVAR = 5


def euler_state(p, mx, my, mz, pe):
    """A node's velocity, speed², pressure and speed of sound from its density, momentum and
    density times energy (MG-CFD's ``compute_velocity``, ``compute_speed_sqd``,
    ``compute_pressure``, ``compute_speed_of_sound``). Kernels pass numbers, not their views,
    so that meshchain inlines them into the loop."""
    vx, vy, vz = mx / p, my / p, mz / p
    speed_sqd = vx * vx + vy * vy + vz * vz
    pressure = (GAMMA - 1.0) * (pe - 0.5 * p * speed_sqd)
    return vx, vy, vz, speed_sqd, pressure, math.sqrt(GAMMA * pressure / p)


def flux_contribution(mx, my, mz, pe, pressure, vx, vy, vz):
    """MG-CFD's ``compute_flux_contribution``: the momentum fluxes along x, y, z (3 each) and
    the energy flux (3)."""
    fx0, fx1, fx2 = vx * mx + pressure, vx * my, vx * mz
    fy1, fy2 = vy * my + pressure, vy * mz
    fz2 = vz * mz + pressure
    de_p = pe + pressure
    return fx0, fx1, fx2, fx1, fy1, fy2, fx2, fy2, fz2, vx * de_p, vy * de_p, vz * de_p


def _free_stream():
    """MG-CFD's far-field state and its flux contributions (``euler3d_cpu_double.cpp``)."""
    density, pressure = 1.4, 1.0
    speed_of_sound = math.sqrt(GAMMA * pressure / density)
    speed = FF_MACH * speed_of_sound
    velocity = (speed * math.cos(0.0), speed * math.sin(0.0), 0.0)
    momentum = tuple(density * v for v in velocity)
    energy = density * (0.5 * (speed * speed)) + (pressure / (GAMMA - 1.0))
    return (density, *momentum, energy), flux_contribution(*momentum, energy, pressure, *velocity)


FF_VARIABLE, FF_FLUX = _free_stream()
"""The far field's variables, and its flux contributions (momentum x, y, z, energy; 3 each)."""


# --- kernels (MG-CFD's, operation for operation) ------------------------------------------------------------


@mc.kernel
def initialize_variables_kernel(variables):
    for j in range(5):
        variables[j] = FF_VARIABLE[j]


@mc.kernel
def zero_5d_array_kernel(array):
    for j in range(5):
        array[j] = 0.0


@mc.kernel
def zero_1d_array_kernel(array):
    array[0] = 0.0


@mc.kernel
def calculate_cell_volumes(coords1, coords2, ewt, vol1, vol2):
    d0 = coords2[0] - coords1[0]
    d1 = coords2[1] - coords1[1]
    d2 = coords2[2] - coords1[2]
    dist = 0.0
    dist += d0 * d0
    dist += d1 * d1
    dist += d2 * d2
    dist = math.sqrt(dist)
    area = 0.0
    area += ewt[0] * ewt[0]
    area += ewt[1] * ewt[1]
    area += ewt[2] * ewt[2]
    area = math.sqrt(area)
    tetra_volume = (1.0 / 3.0) * 0.5 * dist * area
    vol1[0] += tetra_volume
    vol2[0] += tetra_volume
    ewt[0] = (d0 / dist) * area
    ewt[1] = (d1 / dist) * area
    ewt[2] = (d2 / dist) * area
    ewt[0] /= dist
    ewt[1] /= dist
    ewt[2] /= dist


@mc.kernel
def dampen_ewt(ewt):
    ewt[0] *= 1e-7
    ewt[1] *= 1e-7
    ewt[2] *= 1e-7


@mc.kernel
def copy_double_kernel(variables, old_variables):
    for i in range(5):
        old_variables[i] = variables[i]


@mc.kernel
def calculate_dt_kernel(variable, volume, dt):
    _, _, _, speed_sqd, _, speed_of_sound = euler_state(variable[0], variable[1], variable[2], variable[3], variable[4])
    dt[0] = 0.5 * (np.cbrt(volume[0]) / (math.sqrt(speed_sqd) + speed_of_sound))


@mc.kernel
def get_min_dt_kernel(dt, min_dt):
    if dt[0] < min_dt[0]:
        min_dt[0] = dt[0]


@mc.kernel
def compute_step_factor_kernel(variable, volume, min_dt, step_factor):
    step_factor[0] = min_dt[0] / volume[0]


@mc.kernel
def compute_flux_edge_kernel(variables_a, variables_b, edge_weight, fluxes_a, fluxes_b):
    ewt = math.sqrt(edge_weight[0] * edge_weight[0] + edge_weight[1] * edge_weight[1]
                    + edge_weight[2] * edge_weight[2])
    p_b, mbx, mby, mbz, pe_b = variables_b[0], variables_b[1], variables_b[2], variables_b[3], variables_b[4]
    vbx, vby, vbz, speed_sqd_b, pressure_b, speed_of_sound_b = euler_state(p_b, mbx, mby, mbz, pe_b)
    fb = flux_contribution(mbx, mby, mbz, pe_b, pressure_b, vbx, vby, vbz)
    speed_b = math.sqrt(speed_sqd_b)
    p_a, max_, may, maz, pe_a = variables_a[0], variables_a[1], variables_a[2], variables_a[3], variables_a[4]
    vax, vay, vaz, speed_sqd_a, pressure_a, speed_of_sound_a = euler_state(p_a, max_, may, maz, pe_a)
    fa = flux_contribution(max_, may, maz, pe_a, pressure_a, vax, vay, vaz)
    speed_a = math.sqrt(speed_sqd_a)

    factor_a = -ewt * SMOOTHING * 0.5 * (speed_a + math.sqrt(speed_sqd_b) + speed_of_sound_a + speed_of_sound_b)
    factor_b = -ewt * SMOOTHING * 0.5 * (speed_b + math.sqrt(speed_sqd_a) + speed_of_sound_b + speed_of_sound_a)
    factor_x, factor_y, factor_z = -0.5 * edge_weight[0], -0.5 * edge_weight[1], -0.5 * edge_weight[2]

    # each sum in MG-CFD's order, for its bits: (((own + x) + y) + z)
    x, y, z = factor_x * (max_ + mbx), factor_y * (may + mby), factor_z * (maz + mbz)
    fluxes_a[0] += factor_a * (p_a - p_b) + x + y + z
    fluxes_b[0] += factor_b * (p_b - p_a) - x - y - z
    x, y, z = factor_x * (fa[9] + fb[9]), factor_y * (fa[10] + fb[10]), factor_z * (fa[11] + fb[11])
    fluxes_a[4] += factor_a * (pe_a - pe_b) + x + y + z
    fluxes_b[4] += factor_b * (pe_b - pe_a) - x - y - z
    x, y, z = factor_x * (fa[0] + fb[0]), factor_y * (fa[1] + fb[1]), factor_z * (fa[2] + fb[2])
    fluxes_a[1] += factor_a * (max_ - mbx) + x + y + z
    fluxes_b[1] += factor_b * (mbx - max_) - x - y - z
    x, y, z = factor_x * (fa[3] + fb[3]), factor_y * (fa[4] + fb[4]), factor_z * (fa[5] + fb[5])
    fluxes_a[2] += factor_a * (may - mby) + x + y + z
    fluxes_b[2] += factor_b * (mby - may) - x - y - z
    x, y, z = factor_x * (fa[6] + fb[6]), factor_y * (fa[7] + fb[7]), factor_z * (fa[8] + fb[8])
    fluxes_a[3] += factor_a * (maz - mbz) + x + y + z
    fluxes_b[3] += factor_b * (mbz - maz) - x - y - z


@mc.kernel
def compute_bnd_node_flux_kernel(g, edge_weight, variables_b, fluxes_b):
    group = g[0]
    p_b, mbx, mby, mbz, pe_b = variables_b[0], variables_b[1], variables_b[2], variables_b[3], variables_b[4]
    if group <= 2:  # a wall: only the pressure acts
        pressure_b = euler_state(p_b, mbx, mby, mbz, pe_b)[4]
        fluxes_b[0] += 0
        fluxes_b[1] += edge_weight[0] * pressure_b
        fluxes_b[2] += edge_weight[1] * pressure_b
        fluxes_b[3] += edge_weight[2] * pressure_b
        fluxes_b[4] += 0
    elif 3 <= group <= 7:  # far field
        vbx, vby, vbz, _, pressure_b, _ = euler_state(p_b, mbx, mby, mbz, pe_b)
        fb = flux_contribution(mbx, mby, mbz, pe_b, pressure_b, vbx, vby, vbz)
        factor_x, factor_y, factor_z = 0.5 * edge_weight[0], 0.5 * edge_weight[1], 0.5 * edge_weight[2]
        fluxes_b[0] += (factor_x * (FF_VARIABLE[1] + mbx) + factor_y * (FF_VARIABLE[2] + mby)
                        + factor_z * (FF_VARIABLE[3] + mbz))
        fluxes_b[4] += factor_x * (FF_FLUX[9] + fb[9]) + factor_y * (FF_FLUX[10] + fb[10]) + factor_z * (FF_FLUX[11] + fb[11])
        fluxes_b[1] += factor_x * (FF_FLUX[0] + fb[0]) + factor_y * (FF_FLUX[1] + fb[1]) + factor_z * (FF_FLUX[2] + fb[2])
        fluxes_b[2] += factor_x * (FF_FLUX[3] + fb[3]) + factor_y * (FF_FLUX[4] + fb[4]) + factor_z * (FF_FLUX[5] + fb[5])
        fluxes_b[3] += factor_x * (FF_FLUX[6] + fb[6]) + factor_y * (FF_FLUX[7] + fb[7]) + factor_z * (FF_FLUX[8] + fb[8])


@mc.kernel
def time_step_kernel(rk_cycle, step_factor, flux, old_variable, variable):
    factor = step_factor[0] / float(RK + 1 - rk_cycle[0])
    for v in range(5):
        variable[v] = old_variable[v] + factor * flux[v]
    for v in range(5):
        flux[v] = 0.0


@mc.kernel
def residual_kernel(old_variable, variable, residual):
    for v in range(5):
        residual[v] = variable[v] - old_variable[v]


@mc.kernel
def calc_rms_kernel(residual, rms):
    for i in range(5):
        rms[0] += residual[i] * residual[i]


@mc.kernel
def up_pre_kernel(variable, up_scratch):
    for v in range(5):
        variable[v] = 0.0
    up_scratch[0] = 0


@mc.kernel
def up_kernel(variable, variable_above, up_scratch):
    for v in range(5):
        variable_above[v] += variable[v]
    up_scratch[0] += 1


@mc.kernel
def up_post_kernel(variable, up_scratch):
    avg = 1.0 if up_scratch[0] == 0 else 1.0 / float(up_scratch[0])
    for v in range(5):
        variable[v] *= avg


@mc.kernel
def down_kernel(variable, residual, coord, residual_above, coord_above):
    dx = abs(coord[0] - coord_above[0])
    dy = abs(coord[1] - coord_above[1])
    dz = abs(coord[2] - coord_above[2])
    dm = math.sqrt(dx * dx + dy * dy + dz * dz)
    variable[0] -= dm * (residual_above[0] - residual[0])
    variable[1] -= dx * (residual_above[1] - residual[1])
    variable[2] -= dy * (residual_above[2] - residual[2])
    variable[3] -= dz * (residual_above[3] - residual[3])
    variable[4] -= dm * (residual_above[4] - residual[4])


@mc.kernel
def ca_test_write_kernel(variables_a, variables_b):
    variables_a[0] += 1
    variables_a[4] += 1
    variables_a[1] += 1
    variables_a[2] += 1
    variables_a[3] += 1
    variables_b[0] += 1
    variables_b[4] += 1
    variables_b[1] += 1
    variables_b[2] += 1
    variables_b[3] += 1


@mc.kernel
def ca_test_read_kernel(variables_a, variables_b, edge_weight, fluxes_a, fluxes_b):
    fluxes_a[0] += variables_b[0] + edge_weight[0]
    fluxes_a[1] += variables_b[1] + edge_weight[2]
    fluxes_a[2] += variables_b[2]
    fluxes_a[3] += variables_b[3]
    fluxes_a[4] += variables_b[4] + edge_weight[1]
    fluxes_b[0] += variables_a[0]
    fluxes_b[1] += variables_a[1]
    fluxes_b[2] += variables_a[2]
    fluxes_b[3] += variables_a[3]
    fluxes_b[4] += variables_a[4]


@mc.kernel
def ca_test_negate_kernel(variables_a, variables_b, diff_val):
    diff = diff_val[0]
    variables_a[0] -= diff
    variables_a[4] -= diff
    variables_a[1] -= diff
    variables_a[2] -= diff
    variables_a[3] -= diff
    variables_b[0] -= diff
    variables_b[4] -= diff
    variables_b[1] -= diff
    variables_b[2] -= diff
    variables_b[3] -= diff


# --- declaration --------------------------------------------------------------------------------------------


@dataclass
class Level:
    """The sets, maps and dats of one multigrid level (``to_coarse``: to the next level's
    nodes, None on the coarsest; ``copies``: the synthetic chain's variables, beyond the first)."""

    nodes: mc.Set
    edges: mc.Set
    bnd_nodes: mc.Set
    edge_to_nodes: mc.Map
    bnd_to_node: mc.Map
    to_coarse: mc.Map | None
    coords: mc.Dat
    edge_weights: mc.Dat
    bnd_weights: mc.Dat
    bnd_groups: mc.Dat
    variables: mc.Dat
    old_variables: mc.Dat
    residuals: mc.Dat
    volumes: mc.Dat
    step_factors: mc.Dat
    fluxes: mc.Dat
    dummy_fluxes: mc.Dat
    up_scratch: mc.Dat
    copies: list = field(default_factory=list)


@dataclass
class MGCFD:
    """One MG-CFD problem: its levels (finest first) and its options."""

    levels: list
    synthetic_loops: int = 0
    ca: object = False
    cycles_done: int = 0
    captured: dict = field(default_factory=dict, repr=False)  # ca -> the cycle captured (:func:`captured_cycle`)


def read_levels(source) -> tuple[list, list]:
    """``(sizes, rows)`` per level from an MG-CFD ``input.dat`` path (this rank's blocks of
    rows) or an :class:`~meshchain.meshes.MGCFDMesh` (whole arrays): ``sizes`` maps ``"nodes"``,
    ``"edges"``, ``"bnd_nodes"`` to set sizes, ``rows`` each dataset to its rows."""
    comm = mc.get_runtime().comm
    comm = comm if comm is not None and comm.size > 1 else None
    if isinstance(source, MGCFDMesh):
        levels = [level_blocks(level, comm) for level in source.levels]
    else:
        levels, error = None, None
        try:  # a file one rank cannot read fails every rank, with that rank's reason
            levels = [read_level(path, comm) for path in read_input_dat(source)]
        except mc.MeshchainError as exc:
            error = exc
        raise_together(comm, error)
    return [s for s, _ in levels], [r for _, r in levels]


def declare(source, *, synthetic_loops: int = 0, ca=False, method: str = "rib", partition: bool = True) -> MGCFD:
    """Declare MG-CFD's levels from ``source`` (an ``input.dat`` path, read in rank blocks,
    or an :class:`~meshchain.meshes.MGCFDMesh`), set them up (:func:`initialise`) and
    partition them over the MPI ranks by level 0's nodes (``method``: ``"rib"`` on the
    coordinates or ``"kway"``; nothing to do on one process).

    ``synthetic_loops``: the loops of the synthetic chain in every Runge-Kutta stage (even;
    0: none); ``ca``: how that chain runs (True, False or ``"auto"``).
    """
    if not (synthetic_loops == 0 and type(synthetic_loops) is int):
        loops_in_chain(synthetic_loops)  # 0 (none), else an even number >= 2
    session = mc.get_runtime()
    wrap = mc.Block if session.comm is not None and session.comm.size > 1 else (lambda rows: rows)
    sizes, rows = read_levels(source)
    levels = []
    for index, (size, row) in enumerate(zip(sizes, rows)):
        levels.append(_declare_level(index, size, row, wrap, max(synthetic_loops // 2 - 1, 0)))
    for index, (fine, coarse) in enumerate(zip(levels, levels[1:])):
        fine.to_coarse = mc.Map(fine.nodes, coarse.nodes, 1, wrap(rows[index]["node-->mg_node"]),
                                f"node-->mg_node_L{index}")
    if partition:
        mc.partition(method, coords=levels[0].coords if method == "rib" else None, seed_set=levels[0].nodes)
    problem = MGCFD(levels, synthetic_loops=synthetic_loops, ca=ca)
    initialise(problem)
    return problem


def _declare_level(index: int, size: dict, row: dict, wrap, copies: int) -> Level:
    name = f"_L{index}"
    nodes, edges = mc.Set(size["nodes"], "nodes" + name), mc.Set(size["edges"], "edges" + name)
    bnd_nodes = mc.Set(size["bnd_nodes"], "bnd_nodes" + name)

    def dat(where, dim, name_, dtype=np.float64, values=None):
        return mc.Dat(where, dim, None if values is None else wrap(values), name_ + name, dtype=dtype)

    return Level(
        nodes=nodes, edges=edges, bnd_nodes=bnd_nodes,
        edge_to_nodes=mc.Map(edges, nodes, 2, wrap(np.asarray(row["edge-->node"], dtype=np.int32)), "edge-->node" + name),
        bnd_to_node=mc.Map(bnd_nodes, nodes, 1, wrap(np.asarray(row["bnd_node-->node"], dtype=np.int32)),
                           "bnd_node-->node" + name),
        to_coarse=None,
        coords=dat(nodes, 3, "node_coordinates", values=row["node_coordinates"]),
        edge_weights=dat(edges, 3, "edge_weights", values=row["edge_weights"]),
        bnd_weights=dat(bnd_nodes, 3, "bnd_node_weights", values=row["bnd_node_weights"]),
        bnd_groups=dat(bnd_nodes, 1, "bnd_node-->group", np.int32, np.asarray(row["bnd_node-->group"], np.int32)),
        variables=dat(nodes, NVAR, "p_variables"), old_variables=dat(nodes, NVAR, "p_old_variables"),
        residuals=dat(nodes, NVAR, "p_residuals"), volumes=dat(nodes, 1, "p_volumes"),
        step_factors=dat(nodes, 1, "p_step_factors"), fluxes=dat(nodes, NVAR, "p_fluxes"),
        dummy_fluxes=dat(nodes, NVAR, "p_dummy_fluxes"), up_scratch=dat(nodes, 1, "p_up_scratch", np.int32),
        copies=[dat(nodes, NVAR, f"p_variables_C{c + 1}") for c in range(copies)],
    )


def initialise(problem: MGCFD) -> None:
    """MG-CFD's set-up: free-stream variables, zero fluxes, the dual volumes (and the edge
    weights made ``area / length`` along each edge), the weights damped by ``1e-7``."""
    for lv in problem.levels:
        for variables in (lv.variables, *lv.copies):
            mc.par_loop(initialize_variables_kernel, lv.nodes, variables(mc.WRITE))
        mc.par_loop(zero_5d_array_kernel, lv.nodes, lv.fluxes(mc.WRITE))
        mc.par_loop(zero_5d_array_kernel, lv.nodes, lv.dummy_fluxes(mc.WRITE))
        mc.par_loop(zero_1d_array_kernel, lv.nodes, lv.volumes(mc.WRITE))
        e2n = lv.edge_to_nodes
        mc.par_loop(calculate_cell_volumes, lv.edges, lv.coords(mc.READ, e2n[0]), lv.coords(mc.READ, e2n[1]),
                    lv.edge_weights(mc.RW), lv.volumes(mc.INC, e2n[0]), lv.volumes(mc.INC, e2n[1]))
    for lv in problem.levels:
        mc.par_loop(dampen_ewt, lv.edges, lv.edge_weights(mc.RW))
        mc.par_loop(dampen_ewt, lv.bnd_nodes, lv.bnd_weights(mc.RW))


def level_step(problem: MGCFD, level: int) -> float | None:
    """One step on ``level`` (see the module docstring); on level 0 returns the rms of its
    residual (collective), else None."""
    summed = _level_loops(problem, level, chain=True)
    return None if summed is None else _rms(problem, summed)


def _rms(problem: MGCFD, summed) -> float:
    """Level 0's rms from ``summed``, the Global its squared residuals were summed into."""
    value = math.sqrt(float(summed.value[0]) / float(problem.levels[0].nodes.size))
    if not math.isfinite(value):
        raise mc.MeshchainError(f"mgcfd: the residual is not finite ({value}) after cycle {problem.cycles_done + 1}: "
                                f"bad variable values (MG-CFD's count_bad_vals).")
    return value


def _level_loops(problem: MGCFD, level: int, *, chain: bool):
    """The loops of one step on ``level``; on level 0 the Global its squared residuals are
    summed into (not read), else None. ``chain``: the synthetic loops in their loop chain (not
    inside a captured cycle, which is one chain itself)."""
    lv = problem.levels[level]
    e2n = lv.edge_to_nodes
    mc.par_loop(copy_double_kernel, lv.nodes, lv.variables(mc.READ), lv.old_variables(mc.WRITE))
    mc.par_loop(calculate_dt_kernel, lv.nodes, lv.variables(mc.READ), lv.volumes(mc.READ), lv.step_factors(mc.WRITE))
    min_dt = mc.Global(1, np.finfo(np.float64).max, "min_dt")
    mc.par_loop(get_min_dt_kernel, lv.nodes, lv.step_factors(mc.READ), min_dt(mc.MIN))
    mc.par_loop(compute_step_factor_kernel, lv.nodes, lv.variables(mc.READ), lv.volumes(mc.READ), min_dt(mc.READ),
                lv.step_factors(mc.WRITE))
    for rk_cycle in range(RK):
        mc.par_loop(compute_flux_edge_kernel, lv.edges, lv.variables(mc.READ, e2n[0]), lv.variables(mc.READ, e2n[1]),
                    lv.edge_weights(mc.READ), lv.fluxes(mc.INC, e2n[0]), lv.fluxes(mc.INC, e2n[1]))
        if problem.synthetic_loops:
            _synthetic(problem, lv, chain=chain)
        mc.par_loop(compute_bnd_node_flux_kernel, lv.bnd_nodes, lv.bnd_groups(mc.READ), lv.bnd_weights(mc.READ),
                    lv.variables(mc.READ, lv.bnd_to_node[0]), lv.fluxes(mc.INC, lv.bnd_to_node[0]))
        rk = mc.Global(1, rk_cycle, "rkCycle", dtype=np.int32)
        mc.par_loop(time_step_kernel, lv.nodes, rk(mc.READ), lv.step_factors(mc.READ), lv.fluxes(mc.RW),
                    lv.old_variables(mc.READ), lv.variables(mc.WRITE))
    mc.par_loop(residual_kernel, lv.nodes, lv.old_variables(mc.READ), lv.variables(mc.READ), lv.residuals(mc.WRITE))
    if level:
        return None
    rms = mc.Global(1, 0.0, "rms")
    mc.par_loop(calc_rms_kernel, lv.nodes, lv.residuals(mc.READ), rms(mc.INC))
    return rms


def _synthetic(problem: MGCFD, lv: Level, *, chain: bool) -> None:
    """The synthetic chain (one loop chain ``"synthetic"``; with ``chain`` False its loops
    alone) and ``test_negate``."""
    e2n = lv.edge_to_nodes
    with (mc.loop_chain("synthetic", ca=problem.ca) if chain else contextlib.nullcontext()):
        for variables in (lv.variables, *lv.copies):
            mc.par_loop(ca_test_write_kernel, lv.edges, variables(mc.INC, e2n[0]), variables(mc.INC, e2n[1]))
            mc.par_loop(ca_test_read_kernel, lv.edges, variables(mc.READ, e2n[0]), variables(mc.READ, e2n[1]),
                        lv.edge_weights(mc.READ), lv.dummy_fluxes(mc.INC, e2n[0]), lv.dummy_fluxes(mc.INC, e2n[1]))
    diff = mc.Global(1, 1, "diff", dtype=np.int32)
    mc.par_loop(ca_test_negate_kernel, lv.edges, lv.variables(mc.INC, e2n[0]), lv.variables(mc.INC, e2n[1]),
                diff(mc.READ))


def up(problem: MGCFD, level: int) -> None:
    """Restrict level ``level - 1``'s variables to level ``level`` (the mean over each
    coarse node's fine nodes)."""
    fine, coarse = problem.levels[level - 1], problem.levels[level]
    to = fine.to_coarse
    mc.par_loop(up_pre_kernel, fine.nodes, coarse.variables(mc.WRITE, to[0]), coarse.up_scratch(mc.WRITE, to[0]))
    mc.par_loop(up_kernel, fine.nodes, fine.variables(mc.READ), coarse.variables(mc.INC, to[0]),
                coarse.up_scratch(mc.INC, to[0]))
    mc.par_loop(up_post_kernel, coarse.nodes, coarse.variables(mc.RW), coarse.up_scratch(mc.READ))


def down(problem: MGCFD, level: int) -> None:
    """Correct level ``level``'s variables from level ``level + 1``'s residuals."""
    fine, coarse = problem.levels[level], problem.levels[level + 1]
    to = fine.to_coarse
    mc.par_loop(down_kernel, fine.nodes, fine.variables(mc.RW), fine.residuals(mc.READ), fine.coords(mc.READ),
                coarse.residuals(mc.READ, to[0]), coarse.coords(mc.READ, to[0]))


def cycle(problem: MGCFD, *, after_level0=None) -> float:
    """One multigrid cycle (see the module docstring); the rms of its level-0 step
    (``after_level0(problem)`` is called right after that step, where OP2's MG-CFD writes
    its ``-I`` snapshots)."""
    rms = level_step(problem, 0)
    if after_level0 is not None:
        after_level0(problem)
    _coarse_levels(problem, chain=True)
    problem.cycles_done += 1
    return rms


def _coarse_levels(problem: MGCFD, *, chain: bool) -> None:
    """A cycle after its level-0 step: up and a step on each coarser level, then down, with a
    step on each level but 0."""
    top = len(problem.levels) - 1
    for level in range(1, top + 1):
        up(problem, level)
        _level_loops(problem, level, chain=chain)
    for level in range(top - 1, -1, -1):
        down(problem, level)
        if level:
            _level_loops(problem, level, chain=chain)


def captured_cycle(problem: MGCFD):
    """A multigrid cycle as a step captured with ``mc.capture`` (see
    :mod:`meshchain.engine.capture`): its loops (133 on 4 levels with the synthetic chain)
    replayed with no Python between them, the whole cycle one chain run as ``problem.ca``
    says (False: loop by loop; True: communication-avoiding, the chain split at each step's
    ``min_dt``; uncaptured, ``ca`` applies to the synthetic chain alone), its statistics under
    the chain name ``"cycle"``. On several ranks the replays run step by step in Python: a step
    reads ``min_dt``, reduced earlier in the same cycle, so its plan is not one that
    :mod:`meshchain.engine.replay` compiles. ``step()`` returns the Global level 0's squared
    residuals were summed into (made inside the step; :func:`run` takes the rms from it)."""

    @mc.capture(name="cycle", ca=problem.ca)
    def step():
        summed = _level_loops(problem, 0, chain=False)
        _coarse_levels(problem, chain=False)
        return summed

    return step


def run(problem: MGCFD, cycles: int, *, out=None, on_cycle=None, after_level0=None, captured: bool = False) -> list[float]:
    """Run ``cycles`` multigrid cycles; the rms of each (printed to ``out`` as ``cycle rms``
    when given; ``on_cycle(problem)`` after each, ``after_level0(problem)`` after each
    level-0 step). ``captured``: each cycle replays :func:`captured_cycle`'s step (the same
    rms; not with ``after_level0``, which runs between its loops)."""
    if captured and after_level0 is not None:
        raise mc.ConfigurationError("mgcfd.run: after_level0 runs between a cycle's loops, so a captured cycle "
                                    "cannot call it: pass captured=False.")
    step = None
    if captured:  # captured once per problem and chain mode: later runs replay it
        if problem.ca not in problem.captured:
            problem.captured[problem.ca] = captured_cycle(problem)
        step = problem.captured[problem.ca]
    history = []
    for _ in range(cycles):
        if step is None:
            history.append(cycle(problem, after_level0=after_level0))
        else:
            history.append(_rms(problem, step()))
            problem.cycles_done += 1
        if out is not None:
            print("%d %.15e" % (problem.cycles_done, history[-1]), file=out, flush=True)
        if on_cycle is not None:
            on_cycle(problem)
    return history


# --- the workload interface (see meshchain.apps): the OP2 CA paper's experiment inside MG-CFD ----------------

CHAIN = "synthetic"
"""The synthetic chain's name."""


def setup(*, per_rank: int, loops: int, method: str = "kway") -> MGCFD:
    """MG-CFD on a one-level channel with about ``per_rank`` nodes per MPI rank and a
    synthetic chain of ``loops`` loops in each Runge-Kutta stage, partitioned with
    ``method`` (one level, so that every execution of the chain is on the same mesh: its
    time and its profile describe one size).

    >>> from meshchain.apps import mgcfd
    >>> problem = mgcfd.setup(per_rank=400, loops=4)
    >>> problem.levels[0].nodes.size, problem.synthetic_loops
    (325, 4)
    """
    n = max(1, round((_total_size(per_rank) / 3.0) ** (1.0 / 3.0)) - 1)
    return declare(channel_bump(n, levels=1), synthetic_loops=loops_in_chain(loops), method=method)


def step(problem: MGCFD, *, ca) -> None:
    """One multigrid cycle with the synthetic chain run ``ca`` (True, False or ``"auto"``)."""
    _check_chain_mode(ca)
    problem.ca = ca
    cycle(problem)


def loops_in_chain(loops: int) -> int:
    """``loops``, which must be even and at least 2 (test_write and test_read per chain).

    >>> from meshchain.apps import mgcfd
    >>> mgcfd.loops_in_chain(8)
    8
    """
    if isinstance(loops, bool) or not isinstance(loops, int) or loops < 2 or loops % 2:
        raise mc.ConfigurationError(f"mgcfd: the synthetic chain has test_write and test_read per chain: loops must "
                                    f"be even and at least 2, got {loops!r}.")
    return loops


def checksum(problem: MGCFD) -> float | None:
    """The sum of level 0's variables (rank 0; None elsewhere)."""
    values = problem.levels[0].variables.gather()
    return None if values is None else float(np.sum(values))
