"""The Krylov methods, each an iteration over a :class:`~meshchain.linalg.solve.SolveRun`: its
vectors (``run.v``: this rank's owned values), ``run.A(src, dst)`` (SpMV or the matrix-free
loops), ``run.B(src, dst)`` (the preconditioner, skipped when it is pointwise and already
fused), ``run.start(values)``/``run.wait(handle)`` (one non-blocking reduction of all the
values), ``run.reduce(values)`` (a blocking one) and ``run.check(i, norm)`` (the convergence
test: a reason to stop, or None).

Every method returns ``(iterations, reason, replacements)``; the norm tested is the
preconditioned residual norm ``||B r||``, as in PETSc's default for these methods.
"""

from __future__ import annotations

import math

import numpy as np

from .compiled import (BOUNDS, BREAKDOWN, COMMUNICATION, CURVATURE, NORM, REPLACE, STALL_ITERATIONS, STALLED,
                       cg1_iterations, cg1_iterations_on_ranks, cg_iterations, cg_iterations_on_ranks,
                       groppcg_iterations, pipecg_iterations, pipecr_iterations, stalled)
from .fused import (aypx, cg1_update, cg_update, dot, dot_pairs, gropp_direction, gropp_update, pipecg_start,
                    pipecg_update, pipecr_update, residual)
from .recovery import ROUNDING_LEVEL
from .starts import cg_begin, cg1_begin, groppcg_begin, pipecg_begin, pipecr_begin

__all__ = ["METHODS", "VECTORS", "cg", "cg1", "pipecg", "groppcg", "pipecr"]

VECTORS = {
    "cg": ("r", "z", "p", "w"),
    "cg1": ("r", "z", "p", "w", "s"),
    "pipecg": ("r", "u", "w", "m", "n", "z", "q", "p", "s"),
    "groppcg": ("r", "z", "p", "s", "q", "w"),
    "pipecr": ("r", "u", "w", "m", "n", "z", "q", "p"),
}


def _indefinite(what: str, value: float) -> str | None:
    if not math.isfinite(value):
        return f"diverged: {what} is not finite"
    if value <= 0.0:
        return f"indefinite: {what} = {value:.3e} <= 0 (the matrix or the preconditioner is not positive definite)"
    return None


def _step_lengths(i: int, gamma: float, delta: float, gamma_old: float, alpha: float, names) -> tuple:
    """``(alpha, beta, reason)`` of the single-reduction recurrence (Chronopoulos/Gear, shared
    by cg1, pipecg and pipecr): ``beta = gamma / gamma_old``, ``alpha = gamma / (delta -
    beta / alpha_old * gamma)``; ``reason`` says why not when the denominator or ``gamma``
    (named by ``names``) is not positive."""
    beta = 0.0 if i == 0 else gamma / gamma_old
    denominator = delta if i == 0 else delta - beta / alpha * gamma
    reason = _indefinite(names[0], denominator) or _indefinite(names[1], gamma)
    return (alpha if reason else gamma / denominator), beta, reason


def _start_residual(run, r: str, into: str) -> None:
    """``r = b - A x`` (``into`` is a spare vector for ``A x``)."""
    run.A("x", into)
    residual(run.v["b"], run.v[into], run.v[r])


def cg(run):
    """Classical preconditioned CG (Hestenes-Stiefel; PETSc's KSPCG): two reductions per
    iteration, each waited for at once."""
    v, dinv, out = run.v, run.pc.dinv, np.zeros(3)
    if run.inside is not None:  # the start below and its sum in one compiled call
        rz, zz = run.products_and_sums(cg_begin, ("x",), ("w",), v["b"], v["r"], v["z"], v["p"], v["w"], sums=2)
    else:
        _start_residual(run, "r", "w")
        run.B("r", "z", fused_done=False)
        dot_pairs(v["r"], v["z"], v["z"], v["z"], v["z"], v["z"], out)
        v["p"][:] = v["z"]
        rz, zz = run.reduce(out[:2].copy())
    i = 0
    reason = run.check(i, math.sqrt(max(zz, 0.0)))
    if reason is None and run.inside is not None:
        return _inside(run, cg_iterations, cg_iterations_on_ranks, ("x", "r", "z", "p", "w"), ("p", "w"),
                       np.array([rz]), 0, "(p, A p)", pc=run.pc.compiled)
    while reason is None:
        run.A("p", "w")
        pw = run.reduce(np.array([dot(v["p"], v["w"])]))[0]
        reason = _indefinite("(p, A p)", pw)
        if reason is not None:
            break
        alpha = rz / pw
        cg_update(alpha, v["p"], v["w"], v["x"], v["r"], dinv, v["z"], out)
        if not run.pc.pointwise:
            run.B("r", "z", fused_done=False)
            dot_pairs(v["r"], v["z"], v["z"], v["z"], v["z"], v["z"], out)
        rz_new, zz = run.reduce(out[:2].copy())
        i += 1
        reason = run.check(i, math.sqrt(max(zz, 0.0)))
        if reason is None:
            reason = _indefinite("(r, B r)", rz_new)
        if reason is None:
            aypx(rz_new / rz, v["z"], v["p"])
            rz = rz_new
    return i, reason, 0


INSIDE_ITERATIONS = 1024
"""The most iterations one compiled call of :func:`_inside` runs before Python sees them."""


def _inside(run, one, on_ranks, vectors, operator, state, i: int, curvature: str, *, pc=None):
    """A method's loop from iteration ``i`` as calls of its compiled iterations (:mod:`.compiled`:
    ``one`` on one process, ``on_ranks`` on several) over ``vectors`` (names) from ``state``;
    ``operator``: the names of the operator's input and output; ``pc``: what they take for the
    preconditioner (None: its pointwise ``dinv``). The same bits, norms, counts and reasons as
    the Python loop (``curvature``: what a non-positive curvature is called)."""
    v, reason = run.v, None
    pc = run.pc.dinv if pc is None else pc
    history = np.empty(max(1, min(run.maxiter, INSIDE_ITERATIONS)))
    source, target = operator
    extra = run.inside_extra(source)
    iterate = on_ranks if extra else one
    while reason is None:
        i, why, value, reductions, written = iterate(*run.inside, *[v[name] for name in vectors], pc, state,
                                                     run.target, i, run.maxiter, history, *extra)
        if why == COMMUNICATION:
            run.communication_failed(int(value))
        run.reductions += reductions
        decided = why == NORM  # its norm is recorded by run.check below
        run.history.extend(history[:written - decided].tolist())  # norms that decided nothing, as Python floats
        if decided:
            reason = run.check(i, value)
        elif why == CURVATURE:
            reason = _indefinite(curvature, value)
        elif why == BREAKDOWN:
            reason = _indefinite("(r, B r)", value)
    run.inside_done(source, target)
    return i, reason, 0


def cg1(run):
    """Chronopoulos/Gear CG (PETSc's ``-ksp_cg_single_reduction``): ``(r, z)``, ``(z, A z)``
    and the norm in one blocking reduction per iteration."""
    v, dinv, out = run.v, run.pc.dinv, np.zeros(3)
    if run.inside is not None:  # the start and iteration 0's product and sum in one compiled call
        sums = run.products_and_sums(cg1_begin, ("x", "z"), ("w", "s"), v["b"], v["r"], v["s"], v["w"], sums=3)
    else:
        _start_residual(run, "r", "w")
        run.B("r", "z", fused_done=False)
        sums = None
    i, alpha, gamma_old = 0, 0.0, 0.0
    while True:
        if i > 0 and run.inside is not None:
            return _inside(run, cg1_iterations, cg1_iterations_on_ranks, ("x", "r", "z", "s", "p", "w"),
                           ("z", "s"), np.array([alpha, gamma_old]), i, "the step's (p, A p)")
        if sums is None:
            run.A("z", "s")
            dot_pairs(v["r"], v["z"], v["z"], v["s"], v["z"], v["z"], out)
            sums = run.reduce(out.copy())
        (gamma, delta, zz), sums = sums, None
        reason = run.check(i, math.sqrt(max(zz, 0.0)))
        if reason is not None:
            break
        alpha, beta, reason = _step_lengths(i, gamma, delta, gamma_old, alpha, ("the step's (p, A p)", "(r, B r)"))
        if reason is not None:
            break
        gamma_old = gamma
        cg1_update(alpha, beta, v["z"], v["s"], v["p"], v["w"], v["x"], v["r"], dinv)
        run.B("r", "z")
        i += 1
    return i, reason, 0


_PIPECG_NORMS = ("dw", "dx", "ds", "dz", "dpp", "dq", "dm")


def _pipecg_restart(run, out):
    """Replace the recursive vectors by computed ones (``r = b - A x``, ``u = B r``,
    ``w = A u``, ``s = A p``, ``q = B s``, ``z = A q``), then the next dots."""
    v, mm = run.v, out[9]
    _start_residual(run, "r", "n")
    run.B("r", "u", fused_done=False)
    run.A("u", "w")
    run.A("p", "s")
    run.B("s", "q", fused_done=False)
    run.A("q", "z")
    pipecg_start(v["r"], v["u"], v["w"], v["x"], run.pc.dinv, v["m"], out)
    out[5:] = [dot(v[k], v[k]) for k in ("s", "z", "p", "q")] + [mm]


def pipecg(run):
    """Ghysels-Vanroose pipelined CG (PETSc's KSPPIPECG, KSPPIPECGRR with residual
    replacement): one ``Iallreduce`` per iteration, in flight while ``m = B w`` and
    ``n = A m`` are computed."""
    v, dinv, out = run.v, run.pc.dinv, np.zeros(10)
    for name in ("z", "q", "p", "s"):
        v[name][:] = 0.0
    make_bounds = run.replacement_bounds_of()
    # (b, b) for the replacement bounds rides on iteration 0's reduction: no reduction of its own
    with_b = make_bounds is not None
    if run.inside is not None:  # the start and iteration 0's top in one compiled call
        sums = run.products_and_sums(pipecg_begin, ("x", "u", "m"), ("n", "w"), v["b"], v["r"], v["w"], v["n"], out,
                                     sums=len(out) + with_b)
    else:
        _start_residual(run, "r", "n")
        run.B("r", "u", fused_done=False)
        run.A("u", "w")
        pipecg_start(v["r"], v["u"], v["w"], v["x"], dinv, v["m"], out)
        sums = None
    i, alpha, beta, gamma_old, replacements, before, bounds = 0, 0.0, 0.0, 0.0, 0, None, None
    while True:
        if i > 0 and run.inside is not None:
            return _pipecg_inside(run, out, bounds, before, i, np.array([alpha, beta, gamma_old]), replacements)
        if sums is None:
            handle = run.start(np.append(out, dot(v["b"], v["b"])) if i == 0 and with_b else out.copy())
            run.B("w", "m")
            run.A("m", "n")
            sums = run.wait(handle)
        gamma, delta = sums[0], sums[1]
        norm = math.sqrt(max(sums[2], 0.0))
        reason = run.check(i, norm)
        if reason is not None:
            break
        if i == 0 and with_b:  # the bounds, with ||b|| summed in iteration 0's reduction
            bounds = make_bounds(math.sqrt(sums[-1]))
            bounds.aim(run.target)
            sums = sums[:-1]
        alpha_old, beta_old = alpha, beta
        alpha, beta, reason = _step_lengths(i, gamma, delta, gamma_old, alpha, ("the step's (p, A p)", "(r, B r)"))
        if reason is not None:
            break
        gamma_old = gamma
        pipecg_update(alpha, beta, v["n"], v["m"], v["u"], v["w"], v["z"], v["q"], v["p"], v["s"], v["x"],
                            v["r"], dinv, out)
        if bounds is not None:
            now = dict(zip(("dp", "du", *_PIPECG_NORMS), np.sqrt(np.maximum([sums[2], sums[2], *sums[3:]], 0.0))))
            if i > 0 and bounds.after_update(i, now, before, alpha=alpha_old, beta=beta_old):
                _pipecg_restart(run, out)
                replacements += 1
            before = now
        i, sums = i + 1, None
    return i, reason, replacements


def _pipecg_inside(run, out, bounds, before, i: int, state, replacements: int):
    """:func:`pipecg`'s loop from the top of iteration ``i >= 1`` (``state = [alpha, beta,
    gamma_old]``, ``before``: the norms of the last top, or None without ``bounds``) as calls of
    :func:`.compiled.pipecg_iterations`, the residual replacements done here between them: the
    same bits, norms, counts and reasons as the Python loop."""
    kept = np.full(BOUNDS, -1.0) if bounds is None else bounds.state()
    norms = np.zeros(9) if before is None else np.array([before[name] for name in ("dp", "du", *_PIPECG_NORMS)])
    vectors = ("x", "r", "u", "w", "m", "n", "z", "q", "p", "s")
    return _pipelined_inside(run, pipecg_iterations, vectors, (state, out, kept, norms), i, replacements,
                             ("the step's (p, A p)", "(r, B r)"), lambda: _pipecg_restart(run, out))


def _pipelined_inside(run, iterate, vectors, arguments, i: int, replacements: int, names, replace=None,
                      operands=("m", "n")):
    """A single-reduction or pipelined method's loop from the top of iteration ``i`` as calls of
    its compiled ``iterate`` over ``vectors`` (names) and ``arguments`` (its state), the
    operator's input (``operands``: its input and output) exchanged inside; ``names``: what a
    non-positive step denominator and ``gamma`` are called; ``replace()`` makes a residual
    replacement the compiled iterations ask for. ``(iterations, reason, replacements)``."""
    v, reason = run.v, None
    history = np.empty(max(1, min(run.maxiter, INSIDE_ITERATIONS)))
    distributed, (m_all,), exchange, functions, handles = run.inside_halos(operands[:1])
    try:
        while reason is None:
            i, why, value, reductions, written = iterate(
                *run.inside, *[v[name] for name in vectors], run.pc.compiled, *arguments, run.target, i, run.maxiter,
                history, distributed, m_all, exchange, functions, handles)
            if why == COMMUNICATION:
                run.communication_failed(int(value))
            run.reductions += reductions
            decided = why == NORM  # its norm is recorded by run.check below
            run.history.extend(history[:written - decided].tolist())
            if decided:
                reason = run.check(i, value)
            elif why == CURVATURE:
                reason = _indefinite(names[0], value)
            elif why == BREAKDOWN:
                reason = _indefinite(names[1], value)
            elif why == REPLACE:
                replace()
                replacements += 1
            elif why == STALLED:
                reason = _stall_reason(value)
    finally:
        run.inside_done(*operands)
    return i, reason, replacements


def groppcg(run):
    """Gropp's asynchronous CG (PETSc's KSPGROPPCG): two ``Iallreduce`` per iteration,
    ``(p, s)`` in flight while ``q = B s`` is applied, ``(r, z)`` while ``w = A z`` is."""
    v, out = run.v, np.zeros(3)
    if run.inside is not None:  # the start, its sum and q = B s in one compiled call
        gamma, zz, delta = run.products_and_sums(groppcg_begin, ("x", "p"), ("w", "s"), v["b"], v["r"], v["z"],
                                                 v["s"], v["q"], v["w"], sums=3)
    else:
        _start_residual(run, "r", "w")
        run.B("r", "z", fused_done=False)
        v["p"][:] = v["z"]
        run.A("p", "s")
        dot_pairs(v["r"], v["z"], v["z"], v["z"], v["p"], v["s"], out)
        gamma, zz, delta = run.reduce(out.copy())
    i, norm = 0, math.sqrt(max(zz, 0.0))
    reason = run.check(i, norm)
    stall = np.array([norm, 0.0, ROUNDING_LEVEL * run.history[0]])  # (see .compiled.stalled)
    if run.inside is None:
        run.B("s", "q", fused_done=False)
    if reason is None and run.inside is not None:
        return _pipelined_inside(run, groppcg_iterations, ("x", "r", "z", "p", "s", "q", "w"),
                                 (np.array([gamma, delta]), stall, out), i, 0, ("(p, A p)", "(r, B r)"),
                                 operands=("z", "w"))
    while reason is None:
        reason = _indefinite("(p, A p)", delta)
        if reason is not None:
            break
        gropp_update(gamma / delta, v["p"], v["s"], v["q"], v["x"], v["r"], v["z"], out)
        handle = run.start(out[:2].copy())
        run.A("z", "w")
        gamma_new, zz = run.wait(handle)
        i, norm = i + 1, math.sqrt(max(zz, 0.0))
        reason = run.check(i, norm) or _indefinite("(r, B r)", gamma_new)
        if reason is None and stalled(stall, i, norm):
            reason = _stall_reason(norm)
        if reason is not None:
            break
        gropp_direction(gamma_new / gamma, v["z"], v["w"], v["p"], v["s"], out)
        gamma = gamma_new
        handle = run.start(out[:1].copy())
        run.B("s", "q", fused_done=False)
        delta = run.wait(handle)[0]
    return i, reason, 0


def _stall_reason(norm: float) -> str:
    """Why a run whose recursive norm stalled below the rounding level ends (:data:`.compiled.STALLED`):
    a breakdown, from which :mod:`.recovery` restarts, then calls the solve stagnated."""
    return (f"breakdown: the residual norm {norm:.3e} made no new low in {STALL_ITERATIONS} iterations below the "
            f"rounding level")


def pipecr(run):
    """Pipelined conjugate residuals (Ghysels-Vanroose; PETSc's KSPPIPECR): one
    ``Iallreduce`` per iteration, in flight while ``n = A m`` is computed."""
    v, dinv, out = run.v, run.pc.dinv, np.zeros(3)
    for name in ("z", "q", "p"):
        v[name][:] = 0.0
    if run.inside is not None:  # the start and iteration 0's top in one compiled call
        sums = run.products_and_sums(pipecr_begin, ("x", "u", "m"), ("n", "w"), v["b"], v["r"], v["w"], v["n"], out,
                                     sums=3)
    else:
        _start_residual(run, "r", "n")
        run.B("r", "u", fused_done=False)
        run.A("u", "w")
        run.B("w", "m", fused_done=False)
        dot_pairs(v["w"], v["u"], v["m"], v["w"], v["u"], v["u"], out)
        sums = None
    i, alpha, gamma_old = 0, 0.0, 0.0
    while True:
        if i > 0 and run.inside is not None:
            return _pipelined_inside(run, pipecr_iterations, ("x", "u", "w", "m", "n", "z", "q", "p"),
                                     (np.array([alpha, gamma_old]), out), i, 0, ("the step's (A p, B A p)", "(A u, u)"))
        if sums is None:
            handle = run.start(out.copy())
            run.A("m", "n")
            sums = run.wait(handle)
        (gamma, delta, uu), sums = sums, None
        reason = run.check(i, math.sqrt(max(uu, 0.0)))
        if reason is not None:
            break
        alpha, beta, reason = _step_lengths(i, gamma, delta, gamma_old, alpha,
                                            ("the step's (A p, B A p)", "(A u, u)"))
        if reason is not None:
            break
        gamma_old = gamma
        pipecr_update(alpha, beta, v["n"], v["m"], v["u"], v["w"], v["z"], v["q"], v["p"], v["x"], dinv, out)
        if not run.pc.pointwise:
            run.B("w", "m", fused_done=False)
            dot_pairs(v["w"], v["u"], v["m"], v["w"], v["u"], v["u"], out)
        i += 1
    return i, reason, 0


METHODS = {"cg": cg, "cg1": cg1, "pipecg": pipecg, "groppcg": groppcg, "pipecr": pipecr}
