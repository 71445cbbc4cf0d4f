"""NACA0012 C-type mesh with the structure of OP2's Airfoil mesh generator.

This reproduces, in vectorised NumPy, the geometry, numbering and boundary
codes of ``apps/mesh_generators/naca0012.m`` in OP2-Common (the MATLAB
script that writes OP2's ``new_grid.dat``; OP2's 720000-cell validation mesh
is ``I=400, J=600``).

Construction (all of it follows the MATLAB script)
--------------------------------------------------
1. Upper surface: 100 points ``x = sin(linspace(0, pi/2, 100))**2`` (clustered
   at both ends) and OP2's closed-trailing-edge NACA0012 thickness::

       y = 0.594689181 * (0.298222773 sqrt(x) - 0.127125232 x
                          - 0.357907906 x^2 + 0.291984971 x^3 - 0.105174696 x^4)

   with ``y = 0`` at the trailing edge.
2. Complex square-root transform ``w = sqrt(z - x0)``, ``x0 = 0.0077`` (just
   behind the leading-edge radius), which opens the airfoil into a nearly
   flat curve; the lower surface is the mirror image ``-conj(w)``.
3. In the ``w`` plane a uniform ``(3I+1) x (J+1)`` node grid: ``Re w`` on
   ``linspace(-3, 3, 3I+1)``; for each column ``Im w`` is uniform from the
   airfoil curve (a not-a-knot cubic spline through the transformed surface,
   MATLAB's ``spline``) or from 0 (off the airfoil) up to 3.
4. Map back with ``z = w**2`` (conformal, so quadrilaterals keep their
   counter-clockwise orientation). The airfoil is *not* shifted back by
   ``x0``: its leading edge is at ``x = -0.0077`` and its trailing edge at
   ``x = 0.9923``. The wall ends at the grid columns ``Re w = -1, 1``, where
   ``Im w`` is set to 0, so the last wall edge on each side runs along
   ``y = 0`` to ``x = 1`` (from ``x ~ 0.990`` for ``I = 400``), slightly past the trailing edge
   (exactly as in OP2's script).

So the mesh is a C-mesh: index ``i`` runs around the airfoil (``3I`` cells:
``I`` along the lower side of the wake cut from the downstream far field to
the trailing edge, ``I`` around the airfoil from the trailing edge under the
lower surface to the leading edge and back over the upper surface, ``I``
along the upper side of the wake cut), index ``j`` runs outwards (``J``
cells) from the airfoil/cut to the far field. The outer boundary is the image
of the rectangle ``|Re w| = 3, Im w = 3``: it reaches ``x = -9`` upstream,
``x = 9`` downstream and ``|y| = 18`` at the two corners, i.e. about 9 to 18
chords. The nodes on the two sides of the wake cut are duplicated (``i`` and
``3I - i`` on ``j = 0``); the cut is closed by the ``I`` interior edges that
join cell ``(i, 0)`` to cell ``(3I-1-i, 0)``.

Numbering (0-based, ``i`` fastest)
----------------------------------
* node ``(i, j)`` = ``i + j (3I+1)``, ``0 <= i <= 3I``, ``0 <= j <= J``;
* cell ``(i, j)`` = ``i + j 3I`` with nodes ``(i,j), (i+1,j), (i+1,j+1), (i,j+1)``
  (counter-clockwise);
* interior edges, looping ``j`` then ``i``: for each cell ``(i, j)`` first the
  wake-cut edge below it if ``j = 0, i < I`` (nodes ``(i,0),(i+1,0)``, cells
  ``(3I-1-i, 0), (i, 0)``), then the edge above it if ``j < J-1`` (nodes
  ``(i,j+1),(i+1,j+1)``, cells ``(i,j),(i,j+1)``), then the edge to its right
  if ``i < 3I-1`` (nodes ``(i+1,j),(i+1,j+1)``, cells ``(i+1,j),(i,j)``);
* boundary edges: the ``I`` wall edges (``bound = 1``) for ``i = I .. 2I-1``
  (nodes ``(i+1,0),(i,0)``), then the far field (``bound = 2``): ``J`` edges on
  the ``i = 3I`` side going up, ``3I`` edges on the top going from ``i = 3I``
  back to 0, ``J`` edges on the ``i = 0`` side going down.

Counts: ``nnode = (3I+1)(J+1)``, ``ncell = 3IJ``,
``nedge = (3I-1)J + 3I(J-1) + I``, ``nbedge = I + 3I + 2J``; ``I=400, J=600``
gives OP2's 721801 nodes, 720000 cells, 1438600 edges, 2800 boundary edges.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import DeclarationError
from .op2 import AirfoilMesh

__all__ = ["naca0012"]

# OP2's modified (closed trailing edge) NACA0012 thickness coefficients
_SCALE = 0.594689181
_COEF = (0.298222773, -0.127125232, -0.357907906, 0.291984971, -0.105174696)
_X0 = 0.0077  # origin of the square-root transform
_NSURF = 100  # surface points of the upper surface
_WMAX = 3.0  # half-width / height of the computational rectangle in the w plane


def naca0012_thickness(x: np.ndarray) -> np.ndarray:
    """OP2's NACA0012 half-thickness ``y(x)`` for chord positions ``0 <= x <= 1``.

    ``0.594689181 * (0.298222773 sqrt(x) - 0.127125232 x - 0.357907906 x^2
    + 0.291984971 x^3 - 0.105174696 x^4)``: the NACA0012 polynomial with
    coefficients modified so that the trailing edge is (almost) closed,
    ``y(1) = -5.4e-8``; the maximum thickness is 11.9 % of the chord at
    ``x = 0.297``. (The mesh generator sets the last surface point to
    ``y = 0`` exactly.)

    Examples
    --------
    >>> from meshchain.meshes.naca import naca0012_thickness
    >>> round(float(2 * naca0012_thickness(0.297)), 4)
    0.119
    """
    x = np.asarray(x, dtype=np.float64)
    a0, a1, a2, a3, a4 = _COEF
    return _SCALE * (a0 * np.sqrt(x) + a1 * x + a2 * (x * x) + a3 * (x * x * x)
                     + a4 * (x * x * x * x))


def _matlab_linspace(d1, d2, n: int) -> np.ndarray:
    """MATLAB's ``linspace`` arithmetic: ``d1 + (k*(d2-d1))/(n-1)``, last = d2.

    ``d1``, ``d2`` may be arrays (broadcast against a trailing axis of length n).
    """
    d1 = np.asarray(d1, dtype=np.float64)[..., None]
    d2 = np.asarray(d2, dtype=np.float64)[..., None]
    k = np.arange(n, dtype=np.float64)
    out = d1 + (k * (d2 - d1)) / (n - 1)
    out[..., -1] = d2[..., 0]
    return out


def _round_like_printf(a: np.ndarray, decimals: int) -> np.ndarray:
    """Round to ``decimals`` decimals exactly as C's ``printf("%.{decimals}f")``
    followed by ``strtod`` would (correct rounding of the binary value)."""
    scale = 10.0 ** decimals
    s = a * scale
    out = np.rint(s) / scale  # integer/10^d: correctly rounded when rint(s) is right
    # a*scale may itself round across a half-way point: redo those with printf
    frac = np.abs(s - np.floor(s) - 0.5)
    near = np.flatnonzero(frac.reshape(-1) < 1e-6)
    if near.size:
        flat_in = a.reshape(-1)
        flat_out = out.reshape(-1)
        fmt = f"%.{decimals}f"
        for k in near.tolist():
            flat_out[k] = float(fmt % flat_in[k])
    return out


def _surface_spline(xq: np.ndarray) -> np.ndarray:
    """Airfoil curve in the square-root plane, evaluated at ``Re w = xq``."""
    from scipy.interpolate import CubicSpline

    t = _matlab_linspace(0.0, np.pi / 2, _NSURF)
    xs = np.sin(t) ** 2
    ys = naca0012_thickness(xs)
    ys[-1] = 0.0
    w = np.sqrt(xs - _X0 + 1j * ys)
    w = np.concatenate([-np.conj(w[::-1]), w[1:]])
    # MATLAB's spline(x, y, xq) with 2 fewer values than sites: not-a-knot
    spline = CubicSpline(w.real, w.imag, bc_type="not-a-knot", extrapolate=True)
    return spline(xq)


def naca0012(I: int = 400, J: int = 600, *, decimals: int | None = 6) -> AirfoilMesh:
    """NACA0012 C-mesh with the structure and geometry of OP2's generator.

    A reimplementation of OP2-Common's ``apps/mesh_generators/naca0012.m``
    (see the module docstring for the construction and the numbering).
    ``naca0012(400, 600)`` is OP2's 720000-cell Airfoil validation mesh.

    Parameters
    ----------
    I : int, default 400
        One third of the number of cells around the airfoil: there are ``3I``
        cells in the around direction (``I`` on each side of the wake cut and
        ``I`` along the airfoil surface, i.e. ``I`` wall edges).
    J : int, default 600
        Number of cells from the airfoil/wake cut out to the far field.
    decimals : int or None, default 6
        Round node coordinates to this many decimals, as OP2's script does
        when it writes ``new_grid.dat`` with ``%f`` (6 decimals); the default
        reproduces the coordinates OP2's Airfoil actually reads and hence its
        published residual history. ``None`` keeps full double precision.

    Returns
    -------
    AirfoilMesh
        ``nnode = (3I+1)(J+1)``, ``ncell = 3IJ``,
        ``nedge = (3I-1)J + 3I(J-1) + I``, ``nbedge = 4I + 2J``; ``bound`` is
        1 on the ``I`` wall edges and 2 on the far-field edges.

    Raises
    ------
    DeclarationError
        ``I < 2`` or ``J < 2`` (OP2's construction needs at least one interior
        point along the airfoil and one interior row), or ``decimals < 0``.

    Examples
    --------
    >>> from meshchain.meshes.naca import naca0012
    >>> m = naca0012(4, 6)
    >>> (m.nnode, m.ncell, m.nedge, m.nbedge)
    (91, 72, 130, 28)
    >>> int((m.bound == 1).sum())  # wall edges
    4
    >>> m = naca0012(400, 600)  # OP2's validation mesh
    >>> (m.nnode, m.ncell, m.nedge, m.nbedge)
    (721801, 720000, 1438600, 2800)
    """
    for name, v in (("I", I), ("J", J)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 2:
            raise DeclarationError(
                f"naca0012: {name}={v!r} is invalid; pass an integer >= 2 "
                "(OP2's validation mesh is I=400, J=600)."
            )
    if decimals is not None and (
        isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer))
        or decimals < 0
    ):
        raise DeclarationError(
            f"naca0012: decimals={decimals!r} is invalid; pass a non-negative "
            "integer (6, like OP2's new_grid.dat) or None for full precision."
        )
    I = int(I)
    J = int(J)
    ni = 3 * I + 1  # nodes around
    nci = 3 * I  # cells around
    ncell = nci * J
    if (ni * (J + 1)) > np.iinfo(np.int32).max:
        raise DeclarationError(
            f"naca0012: I={I}, J={J} gives more nodes than int32 ids can number; "
            "pass smaller I and J."
        )

    # ---------------------------------------------------------------- geometry
    xb = _matlab_linspace(-_WMAX, _WMAX, ni)
    yb = np.zeros(ni)
    yb[I + 1:2 * I] = _surface_spline(xb[I + 1:2 * I])
    yg = _matlab_linspace(yb, _WMAX, J + 1)  # (ni, J+1)
    xw = xb[:, None]
    xr = xw * xw - yg * yg  # Re (w^2)
    yr = (xw * yg) + (yg * xw)  # Im (w^2)
    x = np.empty((J + 1, ni, 2))
    x[..., 0] = xr.T
    x[..., 1] = yr.T
    x = x.reshape(-1, 2)
    if decimals is not None:
        # (tiny negative values become -0.0, as strtod("-0.000000") does)
        x = _round_like_printf(x, int(decimals))

    # ---------------------------------------------------------------- cells
    ii = np.arange(nci, dtype=np.int32)
    jj = np.arange(J, dtype=np.int32)
    n00 = ii[None, :] + jj[:, None] * ni  # node (i, j), shape (J, 3I)
    cell = np.stack([n00, n00 + 1, n00 + 1 + ni, n00 + ni], axis=-1).reshape(ncell, 4)
    cid = ii[None, :] + jj[:, None] * nci  # cell (i, j)

    # ---------------------------------------------------------------- edges
    # per cell (j, i): slot 0 = wake-cut edge below, 1 = edge above, 2 = right edge
    rec = np.zeros((J, nci, 3, 4), dtype=np.int32)
    mask = np.zeros((J, nci, 3), dtype=bool)
    # wake cut (j == 0, i < I)
    ic = np.arange(I, dtype=np.int32)
    rec[0, :I, 0, 0] = ic
    rec[0, :I, 0, 1] = ic + 1
    rec[0, :I, 0, 2] = nci - 1 - ic
    rec[0, :I, 0, 3] = ic
    mask[0, :I, 0] = True
    # up (j < J-1)
    rec[:, :, 1, 0] = n00 + ni
    rec[:, :, 1, 1] = n00 + ni + 1
    rec[:, :, 1, 2] = cid
    rec[:, :, 1, 3] = cid + nci
    mask[: J - 1, :, 1] = True
    # right (i < 3I-1)
    rec[:, :, 2, 0] = n00 + 1
    rec[:, :, 2, 1] = n00 + 1 + ni
    rec[:, :, 2, 2] = cid + 1
    rec[:, :, 2, 3] = cid
    mask[:, : nci - 1, 2] = True
    erec = rec[mask]

    # ---------------------------------------------------------- boundary edges
    iw = np.arange(I, 2 * I, dtype=np.int32)  # wall
    wall = np.stack([iw + 1, iw, iw, np.ones_like(iw)], axis=1)
    jr = np.arange(J, dtype=np.int32)  # i = 3I side, going up
    right = np.stack(
        [nci + (jr + 1) * ni, nci + jr * ni, (nci - 1) + jr * nci, np.full_like(jr, 2)],
        axis=1,
    )
    it = np.arange(nci - 1, -1, -1, dtype=np.int32)  # top, i = 3I-1 .. 0
    top = np.stack(
        [it + J * ni, it + 1 + J * ni, it + (J - 1) * nci, np.full_like(it, 2)], axis=1
    )
    jl = np.arange(J - 1, -1, -1, dtype=np.int32)  # i = 0 side, going down
    left = np.stack([jl * ni, (jl + 1) * ni, jl * nci, np.full_like(jl, 2)], axis=1)
    brec = np.concatenate([wall, right, top, left], axis=0)

    return AirfoilMesh.from_records(x, cell, erec, brec)
