"""Krylov solvers: meshchain's CG variants against PETSc's and SciPy's, on one assembled matrix.

The matrix is the P1 Poisson problem of :mod:`meshchain.apps.poisson` on GeoFEM's cube
(``structured_tets(n, n, n)``, Dirichlet nodes decoupled, unit diagonal), sized to about
``--per-rank`` unknowns per rank, assembled once by meshchain and handed to PETSc with
``A.to_petsc()`` (the same values, rows numbered rank after rank). Every solver starts from
``x = 0`` with the same right-hand side and the same preconditioner (Jacobi).

Per job (``mpiexec -n R``, ``--network shm|tcp``; ranks beyond the 2 cores oversubscribe):

* iterations to ``--rtol`` (1e-8) and the true final relative residual ``|b - Ax| / |b|`` of
  every meshchain method (``cg cg1 pipecg groppcg pipecr``) and of PETSc's KSPCG,
  ``-ksp_cg_single_reduction``, KSPPIPECG, KSPGROPPCG, KSPPIPECR, KSPPIPECGRR, each with its
  default norm; SciPy's ``cg`` on one rank;
* time per iteration (median of ``--repeats`` solves, slowest rank), and its ratio to PETSc's
  same method in the same job, the two solving in turns (the floor: PETSc's compiled C iteration). meshchain's
  ``SolveInfo.time_per_iteration`` times the iterations alone; PETSc's figure is the whole
  ``KSPSolve`` call over its iterations, so the table also gives the whole ``mc.solve`` call
  over its iterations (its checks, set-up and the true residual at exit included: "call
  ms/it") and that ratio, like with like;
* the time each method waited for reductions per iteration, and the fraction hidden by the
  pipelined methods: ``1 - wait(pipelined) / wait(blocking counterpart)``, where the
  counterpart of pipecg and pipecr is cg1 (one blocking reduction) and of groppcg is cg;
* attainable accuracy: cg, pipecg (with and without residual replacement) and pipecr run to
  ``1e-14`` relative (at most 4x the iterations cg needed for 1e-8), and PETSc's KSPCG,
  KSPPIPECG and KSPPIPECGRR the same: the true residual where each stops;
* the floor: one SpMV, meshchain's ``A.mult`` against PETSc's ``MatMult``;
* nonsymmetric (issue 33): the upwinded advection-diffusion operator of
  :mod:`meshchain.apps.advection_diffusion` (``structured_tris``, cell Péclet number 1, about
  ``--per-rank`` unknowns per rank): ``gmres pipegmres bicgstab pipebicgstab`` with Jacobi and
  ``gmres bicgstab`` with ``bjacobi-ilu``, against PETSc's KSPGMRES (CGS refined if needed, as
  meshchain's), KSPPGMRES, KSPBCGS, KSPPIPEBCGS (right-preconditioned, as meshchain's) with
  PCJACOBI and PCBJACOBI/PCILU: iterations and time per iteration, and the ratio.

Usage::

    .venv/bin/python benchmarks/krylov.py                       # shm and tcp, 1 2 4 ranks
    .venv/bin/python benchmarks/krylov.py --environment user pinned   # and rows with threads pinned to 1
    .venv/bin/python benchmarks/krylov.py --quick               # seconds
    .venv/bin/python benchmarks/krylov.py --only sstep --network tcp --ranks 2 4 --per-rank 2000 20000
    .venv/bin/python benchmarks/krylov.py --only cagmres --network tcp shm --ranks 2 4 --per-rank 2000 20000

Jobs run in the environment a user has: no thread variables set. ``--environment pinned``
adds rows, labelled "threads pinned", with every library's threads set to one.

Writes ``benchmarks/results/krylov.json`` and prints the tables for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import (THREAD_VARIABLES, cube_for, interleaved, launch, machine, petsc_ksp,  # noqa: E402
                  petsc_nonsymmetric, serve, slowest, user_environment, write_run)

METHODS = ("cg", "cg1", "pipecg", "groppcg", "pipecr")
# meshchain method -> (PETSc KSP type, options); pipecg with residual replacement as KSPPIPECGRR
PETSC = {"cg": ("cg", {}), "cg1": ("cg", {"ksp_cg_single_reduction": None}), "pipecg": ("pipecg", {}),
         "groppcg": ("groppcg", {}), "pipecr": ("pipecr", {}), "pipecgrr": ("pipecgrr", {})}
BLOCKING = {"pipecg": "cg1", "pipecr": "cg1", "groppcg": "cg"}
FULL = dict(per_rank=[700, 2000, 20000], repeats=5, rtol=1e-8)
# nonsymmetric: (meshchain method, meshchain pc) -> (PETSc KSP type, PC type, options)
NONSYMMETRIC = {case: petsc_nonsymmetric(*case) for case in (
    ("gmres", "jacobi"), ("pipegmres", "jacobi"), ("bicgstab", "jacobi"), ("pipebicgstab", "jacobi"),
    ("gmres", "bjacobi-ilu"), ("bicgstab", "bjacobi-ilu"))}
PECLET = 1.0
#: Thread variables a user does not set: only the labelled ``--environment pinned`` rows set them.
PINNED = dict.fromkeys(THREAD_VARIABLES, "1")
QUICK = dict(per_rank=[500], repeats=2, rtol=1e-8)


# --- the worker ----------------------------------------------------------------------------------


def meshchain_solver(problem, method: str, config: dict, *, pc: str = "jacobi", **options) -> tuple:
    """``(solve, result)``: ``solve()`` solves once from ``x = 0``; ``result()`` then gives the
    medians over the solves after the first (which compiles and loads)."""
    import meshchain as mc

    x = getattr(problem, "u", None) or problem.x
    runs, calls = [], []

    def solve() -> None:
        x.data[...] = 0.0
        start = time.perf_counter()
        info = mc.solve(problem.A, x, problem.b, method=method, pc=pc, rtol=config["rtol"], **options)
        calls.append((time.perf_counter() - start) / max(info.iterations, 1))
        runs.append(info)

    def result() -> dict:
        comm = mc.get_runtime().comm
        per_iteration = [slowest(comm, info.time_per_iteration) for info in runs[1:]]
        per_call = [slowest(comm, seconds) for seconds in calls[1:]]
        wait = [slowest(comm, info.time_reduction_wait / max(info.iterations, 1)) for info in runs[1:]]
        last = runs[-1]
        return {"iterations": last.iterations, "converged": bool(last.converged), "reason": last.reason,
                "true_residual": last.true_residual, "time_per_iteration": statistics.median(per_iteration),
                "call_per_iteration": statistics.median(per_call), "wait_per_iteration": statistics.median(wait)}

    return solve, result


def petsc_solver(problem, ksp_type: str, options: dict, config: dict, *, rtol=None, maxiter=None,
                 pc: str = "jacobi") -> tuple:
    """``(solve, result)`` of PETSc's ``ksp_type`` on the same matrix, as :func:`meshchain_solver`'s
    (the first solve sets up: not counted); its time is the whole ``KSPSolve`` call."""
    ksp, A, b = petsc_ksp(problem, ksp_type, options, rtol=rtol or config["rtol"], maxiter=maxiter, pc=pc)
    x, r = b.duplicate(), b.duplicate()
    times = []

    def solve() -> None:
        x.set(0.0)
        start = time.perf_counter()
        ksp.solve(b, x)
        seconds = time.perf_counter() - start
        times.append(slowest(A.getComm().tompi4py(), seconds) / max(ksp.getIterationNumber(), 1))

    def result() -> dict:
        A.mult(x, r)
        r.aypx(-1.0, b)
        return {"iterations": ksp.getIterationNumber(), "converged": ksp.getConvergedReason() > 0,
                "reason": int(ksp.getConvergedReason()), "true_residual": r.norm() / b.norm(),
                "norm_type": int(ksp.getNormType()), "time_per_iteration": statistics.median(times[1:])}

    return solve, result


def in_turns(config: dict, *solvers) -> list:
    """The results of ``solvers`` (``(solve, result)`` pairs) solving in turns, ``repeats + 1``
    solves each: a shared VM's drift in speed then touches meshchain's solves and PETSc's alike
    (run one after the other, the ratio of one cell moved by up to 0.4 between two runs); each
    turn in the other order than the last, so that none always runs first."""
    for turn in range(config["repeats"] + 1):
        for solve, _ in (solvers if turn % 2 == 0 else solvers[::-1]):
            solve()
    return [result() for _, result in solvers]


def petsc_runs(problem, ksp_type: str, options: dict, config: dict, *, rtol=None, maxiter=None,
               pc: str = "jacobi") -> dict:
    return in_turns(config, petsc_solver(problem, ksp_type, options, config, rtol=rtol, maxiter=maxiter, pc=pc))[0]


def scipy_iterations(problem, rtol: float) -> dict:
    import scipy.sparse.linalg as sla

    A = problem.A.to_scipy()
    b = problem.b.gather().ravel()
    diagonal = A.diagonal()
    count = [0]
    x, info = sla.cg(A, b, rtol=rtol, atol=0.0, M=sla.LinearOperator(A.shape, matvec=lambda v: v / diagonal),
                     callback=lambda _: count.__setitem__(0, count[0] + 1), maxiter=100000)
    return {"iterations": count[0], "converged": info == 0,
            "true_residual": float(np.linalg.norm(b - A @ x) / np.linalg.norm(b))}


def accuracy(problem, method: str, cg_iterations: int, replacement: bool) -> dict:
    """Run ``method`` to 1e-14 (at most 4x cg's iterations to 1e-8): where it stops."""
    import meshchain as mc

    problem.u.data[...] = 0.0
    info = mc.solve(problem.A, problem.u, problem.b, method=method, pc="jacobi", rtol=1e-14,
                    maxiter=4 * cg_iterations, residual_replacement=replacement)
    return {"true_residual": info.true_residual, "iterations": info.iterations, "reason": info.reason,
            "replacements": info.replacements}


def spmv_floor(problem, repeats: int) -> dict:
    """Seconds per ``y = A x``: meshchain's overlapped SpMV and PETSc's MatMult (the floor)."""
    import meshchain as mc

    comm = mc.get_runtime().comm
    y = mc.Dat(problem.mesh.nodes, 1, None, "spmv y")
    A, x = problem.A.to_petsc(), problem.A.petsc_vec(problem.exact)
    petsc_y = x.duplicate()
    times = {"meshchain": [], "petsc": []}
    for _ in range(repeats):
        for name, call in (("meshchain", lambda: problem.A.mult(problem.exact, y)),
                           ("petsc", lambda: A.mult(x, petsc_y))):
            problem.exact.data[...] += 0.0  # its halo is stale again: each product exchanges
            start = time.perf_counter()
            for _ in range(20):
                call()
            times[name].append(slowest(comm, (time.perf_counter() - start) / 20))
    return {name: statistics.median(values) for name, values in times.items()}


def worker(config: dict) -> dict:
    import meshchain as mc
    from meshchain.apps import poisson
    from meshchain.meshes import structured_tets

    comm = mc.get_runtime().comm
    ranks = 1 if comm is None else comm.size
    out = []
    if comm is not None and comm.size == 1:
        comm = None
    for per_rank in config["per_rank"]:
        if config.get("only") == "nonsymmetric":
            out.append({"per_rank": per_rank, "nonsymmetric": nonsymmetric_row(per_rank, ranks, config)})
            continue
        if config.get("only") in ("sstep", "cagmres"):
            row = (sstep_row if config["only"] == "sstep" else cagmres_row)(per_rank, ranks, config)
            out.append({"per_rank": per_rank, config["only"]: row})
            continue
        n = cube_for(per_rank, ranks)
        mc.reset_runtime()  # a new mesh: on several ranks it is declared and partitioned afresh
        problem = poisson.declare(structured_tets(n, n, n))
        local = float((problem.b.data_ro ** 2).sum())
        norm_b = float(np.sqrt(local if comm is None else comm.allreduce(local)))
        row = {"per_rank": per_rank, "n": n, "unknowns": problem.mesh.nodes.size, "meshchain": {}, "petsc": {}}
        for method in METHODS:  # each with PETSc's counterpart, solving in turns
            result, row["petsc"][method] = in_turns(config, meshchain_solver(problem, method, config),
                                                    petsc_solver(problem, *PETSC[method], config))
            result["true_residual"] /= norm_b
            row["meshchain"][method] = result
        for name, (ksp_type, options) in PETSC.items():
            if name not in row["petsc"]:
                row["petsc"][name] = petsc_runs(problem, ksp_type, options, config)
        if ranks == 1:
            row["scipy"] = scipy_iterations(problem, config["rtol"])
        cg_iterations = row["meshchain"]["cg"]["iterations"]
        row["accuracy"] = {name: accuracy(problem, method, cg_iterations, rr)
                           for name, method, rr in (("cg", "cg", False), ("pipecg", "pipecg", False),
                                                    ("pipecg+rr", "pipecg", True), ("pipecr", "pipecr", False))}
        for found in row["accuracy"].values():
            found["true_residual"] /= norm_b
        row["petsc_accuracy"] = {name: petsc_runs(problem, *PETSC[name], dict(config, repeats=1), rtol=1e-14,
                                                  maxiter=4 * cg_iterations) for name in ("cg", "pipecg", "pipecgrr")}
        row["spmv"] = spmv_floor(problem, config["repeats"])
        row["nonsymmetric"] = nonsymmetric_row(per_rank, ranks, config)
        out.append(row)
    return {"rows": out}


SSTEP = (("cg", {}), ("pipecg", {}), ("sstep-cg", {"s": 2}), ("sstep-cg", {"s": 4}), ("sstep-cg", {"s": 8}),
         ("ca-cg", {"s": 4}))
"""The methods of the time-to-solution table (``--only sstep``), with Jacobi."""


def solve_seconds(problem, method: str, config: dict, **options) -> dict:
    """Seconds of a whole ``mc.solve`` to ``--rtol`` (median of ``--repeats``, slowest rank)."""
    import meshchain as mc

    comm = mc.get_runtime().comm
    times, info = [], None
    x = problem.u if hasattr(problem, "u") else problem.x
    for repeat in range(config["repeats"] + 1):  # the first compiles, builds halo layers: not counted
        x.data[...] = 0.0
        if comm is not None:
            comm.Barrier()
        began = time.perf_counter()
        info = mc.solve(problem.A, x, problem.b, method=method, pc="jacobi", rtol=config["rtol"], **options)
        if repeat:
            times.append(slowest(comm, time.perf_counter() - began))
    return {"iterations": info.iterations, "converged": bool(info.converged), "reductions": info.reductions,
            "seconds": statistics.median(times), "steps": info.steps, "predicted": info.predicted}


def sstep_row(per_rank: int, ranks: int, config: dict) -> dict:
    """Time to solution of cg, pipecg and the s-step CGs against PETSc's cg and pipecg (Poisson
    P1), the methods taking turns: every round solves once with each, so that the machine's
    drift (a shared VM's speed wanders by tens of percent within a minute) touches all alike;
    the first round (compiling, halo layers, the Newton shifts, PETSc's set-up) is not counted."""
    import meshchain as mc
    from meshchain.apps import poisson
    from meshchain.meshes import structured_tets

    n = cube_for(per_rank, ranks)
    mc.reset_runtime()
    problem = poisson.declare(structured_tets(n, n, n))
    comm = mc.get_runtime().comm
    solvers = {method + "".join(f" s={v}" for v in options.values()): _meshchain_solver(problem, method, config, options)
               for method, options in (*SSTEP, ("sstep-cg", {"s": "auto"}))}
    solvers.update({f"PETSc {name}": _petsc_solver(problem, *PETSC[name], config) for name in ("cg", "pipecg")})
    found, times = interleaved(comm, solvers, config["repeats"])
    row = {"unknowns": problem.mesh.nodes.size, "meshchain": {}, "petsc": {}}
    for name, result in found.items():
        result = dict(result, seconds=statistics.median(times[name]))
        if name.startswith("PETSc "):
            row["petsc"][name[len("PETSc "):]] = result
        else:
            row["meshchain"][name] = result
    return row


def _meshchain_solver(problem, method: str, config: dict, options: dict):
    """One ``mc.solve`` to ``--rtol`` from ``x = 0``, as a call returning what the table shows."""
    import meshchain as mc

    x = problem.u if hasattr(problem, "u") else problem.x

    def solve() -> dict:
        x.data[...] = 0.0
        info = mc.solve(problem.A, x, problem.b, method=method, pc="jacobi", rtol=config["rtol"], **options)
        return {"iterations": info.iterations, "converged": bool(info.converged), "reductions": info.reductions,
                "steps": info.steps, "predicted": info.predicted}

    return solve


def _petsc_solver(problem, ksp_type: str, options: dict, config: dict):
    """One PETSc KSP solve (Jacobi, ``--rtol``) from ``x = 0``, its set-up done at the first call."""
    ksp, _, b = petsc_ksp(problem, ksp_type, options, rtol=config["rtol"])
    x = b.duplicate()

    def solve() -> dict:
        x.set(0.0)
        ksp.solve(b, x)
        return {"iterations": ksp.getIterationNumber(), "converged": ksp.getConvergedReason() > 0}

    return solve


CAGMRES = (("gmres", {}), ("pipegmres", {}), ("ca-gmres", {"s": 2}), ("ca-gmres", {"s": 4}), ("ca-gmres", {"s": 8}))
"""The methods of the CA-GMRES time-to-solution table (``--only cagmres``), with Jacobi."""


MODEL_NOTE = ("'model ms': the Krylov model's predicted time per iteration (meshchain.model.krylov, from the costs "
              "s='auto' measured on the matrix) times the iterations measured; 's=auto (k)': the s it chose.")


def part_method(part: str) -> str:
    """The s-step method of a table part."""
    return {"sstep": "sstep-cg", "cagmres": "ca-gmres"}[part]


def cagmres_row(per_rank: int, ranks: int, config: dict) -> dict:
    """Time to solution of gmres, pipegmres and CA-GMRES against PETSc's gmres and pgmres
    (the advection-diffusion operator)."""
    import meshchain as mc
    from meshchain.apps import advection_diffusion
    from meshchain.meshes import structured_tris

    side = max(2, round((per_rank * ranks) ** 0.5) - 1)
    mc.reset_runtime()
    problem = advection_diffusion.declare(structured_tris(side, side), peclet=PECLET)
    found = {"unknowns": problem.mesh.nodes.size, "meshchain": {}, "petsc": {}}
    for method, options in CAGMRES:
        found["meshchain"][method + "".join(f" s={v}" for v in options.values())] = solve_seconds(
            problem, method, config, **options)
    found["meshchain"]["ca-gmres s=auto"] = solve_seconds(problem, "ca-gmres", config, s="auto")
    for name, key in (("gmres", ("gmres", "jacobi")), ("pgmres", ("pipegmres", "jacobi"))):
        ksp_type, pc, options = NONSYMMETRIC[key]
        theirs = petsc_runs(problem, ksp_type, options, config, pc=pc)
        found["petsc"][name] = dict(theirs, seconds=theirs["time_per_iteration"] * max(theirs["iterations"], 1))
    return found


def sstep_table(results: list, *, part: str = "sstep", reference: str = "pipecg") -> str:
    lines = [f"| network | ranks | unknowns | method | its | reductions | ms to solution | model ms | x {reference} | "
             f"x PETSc's best |", "|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for row in result["rows"]:
            found = row.get(part)
            if not found:
                continue
            best = min(p["seconds"] for p in found["petsc"].values())
            pipecg = found["meshchain"][reference]["seconds"]
            over = " (over)" if result["ranks"] > result["cores"] else ""
            auto = found["meshchain"].get(f"{part_method(part)} s=auto", {})
            model = auto.get("predicted") or {}
            for name, m in found["meshchain"].items():
                shown = name if not name.endswith("auto") else f"{name} ({m.get('steps')})"
                modelled = model.get(name if not name.endswith("auto") else f"{part_method(part)} s={m.get('steps')}")
                predicted = f"{modelled * m['iterations'] * 1e3:.2f}" if modelled else ""
                lines.append(f"| {label(result)} | {result['ranks']}{over} | {found['unknowns']} | {shown} | "
                             f"{m['iterations']}{'' if m['converged'] else '*'} | {m['reductions']} | "
                             f"{m['seconds'] * 1e3:.2f} | {predicted} | {m['seconds'] / pipecg:.2f} | "
                             f"{m['seconds'] / best:.2f} |")
            for name, p in found["petsc"].items():
                lines.append(f"| {label(result)} | {result['ranks']}{over} | {found['unknowns']} | PETSc {name} | "
                             f"{p['iterations']} | | {p['seconds'] * 1e3:.2f} | | {p['seconds'] / pipecg:.2f} | "
                             f"{p['seconds'] / best:.2f} |")
    return "\n".join(lines)


def nonsymmetric_row(per_rank: int, ranks: int, config: dict) -> dict:
    """The nonsymmetric methods and PETSc's on the advection-diffusion operator."""
    import meshchain as mc
    from meshchain.apps import advection_diffusion
    from meshchain.meshes import structured_tris

    side = max(2, round((per_rank * ranks) ** 0.5) - 1)
    mc.reset_runtime()
    problem = advection_diffusion.declare(structured_tris(side, side), peclet=PECLET)
    found = {"unknowns": problem.mesh.nodes.size}
    for (method, pc), (ksp_type, petsc_pc, options) in NONSYMMETRIC.items():
        mine, theirs = in_turns(config, meshchain_solver(problem, method, config, pc=pc),
                                petsc_solver(problem, ksp_type, options, config, pc=petsc_pc))
        found[f"{method} {pc}"] = {"meshchain": mine, "petsc": theirs}
    return found


# --- the driver ----------------------------------------------------------------------------------


def run_job(network: str, ranks: int, config: dict, cache_dir: str, timeout: float, *, pinned: bool = False) -> dict:
    """One ``mpiexec`` job in the user's environment (no thread variables set), or with the
    threads of every library pinned to one (``pinned``: a labelled extra row)."""
    env = user_environment(MESHCHAIN_CACHE_DIR=cache_dir, **(PINNED if pinned else {}))
    return launch(__file__, [], ranks, network, env, config, timeout, "krylov job")


def label(result: dict) -> str:
    return result["network"] + (", threads pinned" if result.get("pinned") else "")


def table(results: list) -> str:
    head = ("| network | ranks | unknowns | method | its (PETSc) | true res. (PETSc) | ms/it | x PETSc | "
            "call ms/it | call x PETSc | wait ms/it | hidden |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for result in results:
        for row in result["rows"]:
            mine, theirs = row["meshchain"], row["petsc"]
            for method in METHODS:
                m, p = mine[method], theirs[method]
                counterpart = BLOCKING.get(method)
                hidden = ""
                if counterpart and result["ranks"] > 1 and mine[counterpart]["wait_per_iteration"] > 0:
                    hidden = f"{100 * (1 - m['wait_per_iteration'] / mine[counterpart]['wait_per_iteration']):.0f} %"
                lines.append(
                    f"| {label(result)} | {result['ranks']}{' (over)' if result['ranks'] > 2 else ''} | "
                    f"{row['unknowns']} | {method} | {m['iterations']} ({p['iterations']}) | "
                    f"{m['true_residual']:.1e} ({p['true_residual']:.1e}) | {1e3 * m['time_per_iteration']:.3f} | "
                    f"{m['time_per_iteration'] / p['time_per_iteration']:.2f}x | "
                    f"{1e3 * m['call_per_iteration']:.3f} | {m['call_per_iteration'] / p['time_per_iteration']:.2f}x | "
                    f"{1e3 * m['wait_per_iteration']:.3f} | {hidden} |")
    return "\n".join(lines)


def accuracy_table(results: list) -> str:
    names = ("cg", "pipecg", "pipecg+rr", "pipecr")
    lines = ["| network | ranks | unknowns | " + " | ".join(names) + " | PETSc cg | PETSc pipecg | PETSc pipecgrr |",
             "|---|---|---|" + "---|" * (len(names) + 3)]
    for result in results:
        for row in result["rows"]:
            a, p = row["accuracy"], row["petsc_accuracy"]
            cells = [f"{a[n]['true_residual']:.1e} ({a[n]['iterations']})" for n in names]
            cells += [f"{p[n]['true_residual']:.1e} ({p[n]['iterations']})" for n in ("cg", "pipecg", "pipecgrr")]
            lines.append(f"| {label(result)} | {result['ranks']} | {row['unknowns']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def nonsymmetric_table(results: list) -> str:
    lines = ["| network | ranks | unknowns | method | pc | its (PETSc) | ms/it | PETSc ms/it | x PETSc |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for row in result["rows"]:
            found = row["nonsymmetric"]
            for method, pc in NONSYMMETRIC:
                m, p = found[f"{method} {pc}"]["meshchain"], found[f"{method} {pc}"]["petsc"]
                mark = "" if m["converged"] else " (diverged)"
                mark_p = "" if p["converged"] else " (diverged)"
                lines.append(f"| {label(result)} | {result['ranks']}{' (over)' if result['ranks'] > 2 else ''} | "
                             f"{found['unknowns']} | {method} | {pc} | {m['iterations']}{mark} "
                             f"({p['iterations']}{mark_p}) | {1e3 * m['time_per_iteration']:.3f} | "
                             f"{1e3 * p['time_per_iteration']:.3f} | "
                             f"{m['time_per_iteration'] / p['time_per_iteration']:.2f}x |")
    return "\n".join(lines)


def spmv_table(results: list) -> str:
    lines = ["| network | ranks | unknowns | meshchain SpMV ms | PETSc MatMult ms | ratio |", "|---|---|---|---|---|---|"]
    for result in results:
        for row in result["rows"]:
            m, p = row["spmv"]["meshchain"], row["spmv"]["petsc"]
            lines.append(f"| {label(result)} | {result['ranks']} | {row['unknowns']} | {1e3 * m:.3f} | "
                         f"{1e3 * p:.3f} | {m / p:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run: smaller defaults")
    parser.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--per-rank", nargs="+", type=int, help="unknowns per rank (default 700 2000 20000)")
    parser.add_argument("--environment", nargs="+", choices=("user", "pinned"), default=["user"],
                        help="user: no thread variables set (default); pinned: also rows with every library's "
                             "threads set to 1 (MESHCHAIN_THREADS, NUMBA_NUM_THREADS, OMP_NUM_THREADS, "
                             "OPENBLAS_NUM_THREADS), labelled 'threads pinned'")
    parser.add_argument("--repeats", type=int, help="solves per method; the median counts (default 5)")
    parser.add_argument("--rtol", type=float, help="relative tolerance (default 1e-8)")
    parser.add_argument("--only", choices=("nonsymmetric", "sstep", "cagmres"), help="run only that part (its table)")
    parser.add_argument("--out", default=str(HERE / "results" / "krylov.json"))
    parser.add_argument("--cache-dir", default=str(HERE / "build" / "krylov-cache"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve(worker, json.loads(args.config))
    defaults = QUICK if args.quick else FULL
    config = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    config["only"] = args.only
    info = machine()
    results = []
    began = time.perf_counter()
    for environment in args.environment:
        for network in args.network:
            for ranks in args.ranks:
                if ranks == 1 and network == "tcp":
                    continue  # one rank sends nothing
                start = time.perf_counter()
                print(f"[krylov] {ranks} ranks, {network}, {environment} ...", end="", file=sys.stderr, flush=True)
                result = run_job(network, ranks, config, args.cache_dir, args.timeout, pinned=environment == "pinned")
                print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
                results.append(dict(result, network=network, ranks=ranks, cores=info["cores"],
                                    pinned=environment == "pinned"))
    total = time.perf_counter() - began
    print(f"{info['cpu']}, {info['cores']} cores; {info['mpi']}; Python {info['python']}, numba {info['numba']}. "
          f"{'' if args.only else 'Poisson P1 on structured_tets, Jacobi, '}rtol {config['rtol']}, "
          f"median of {config['repeats']} solves "
          f"(slowest rank); whole run {total:.0f} s. '(over)': more ranks than cores. No thread variables set, "
          f"except in rows labelled 'threads pinned' ({', '.join(f'{k}={v}' for k, v in PINNED.items())}).\n")
    if args.only == "sstep":
        print("Time to solution (rtol, Jacobi) of cg, pipecg, the block s-step CG (sstep-cg) and CA-CG against "
              "PETSc's KSPCG and KSPPIPECG (their whole solves), the methods taking turns (each round solves once "
              "with each; the first round not counted); '*': not converged. " + MODEL_NOTE + "\n")
        print(sstep_table(results))
        return _write(args, info, config, total, results)
    if args.only == "cagmres":
        print(f"Time to solution (rtol, Jacobi) of gmres, pipegmres and CA-GMRES against PETSc's KSPGMRES and "
              f"KSPPGMRES (their time per iteration times their iterations) on the upwinded advection-diffusion "
              f"operator (structured_tris, cell Péclet number {PECLET:g}); restart 30. gmres and PETSc test "
              f"||D^-1 r|| (left Jacobi), CA-GMRES ||D^-1/2 r|| (symmetric scaling); '*': not converged. " + MODEL_NOTE + "\n")
        print(sstep_table(results, part="cagmres", reference="pipegmres"))
        return _write(args, info, config, total, results)
    if args.only != "nonsymmetric":
        print_symmetric(results)
    print(f"\nNonsymmetric: upwinded advection-diffusion (structured_tris, cell Péclet number {PECLET:g}), "
          f"rtol {config['rtol']}, time per iteration against PETSc's same method and preconditioner:\n")
    print(nonsymmetric_table(results))
    return _write(args, info, config, total, results)


def _write(args, info, config, total, results) -> int:
    write_run(args.out, info, config, total, results)
    return 0


def print_symmetric(results: list) -> None:
    """The CG family's tables."""
    print(table(results))
    print("\nAttainable accuracy: true relative residual (iterations) when asked for 1e-14, at most 4x cg's "
          "iterations:\n")
    print(accuracy_table(results))
    print("\nThe floor: one SpMV (median of 20, halo exchanged each time), meshchain vs PETSc:\n")
    print(spmv_table(results))


if __name__ == "__main__":
    sys.exit(main())
