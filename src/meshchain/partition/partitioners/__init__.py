"""Partitioners over block-distributed arrays.

Before partitioning, every set of global size ``N`` is held in a block
distribution: rank ``r`` holds global ids ``[offsets[r], offsets[r + 1])`` with
``offsets = block_offsets(N, comm.size)``. The partitioners here are pure
functions of those distributed arrays: each rank passes its own rows and gets back
the part of each of them. Every function is collective over ``comm``; invalid
input found on any rank raises the same :class:`~meshchain.core.errors.DeclarationError`
on every rank (the ranks agree on errors before raising, so none is left waiting in
a collective).

* :func:`block_offsets` -- the block distribution itself (:mod:`meshchain.comm.blocks`).
* :func:`rib` -- recursive inertial bisection (Hydra's default), computed in
  parallel, exactly balanced, and bitwise independent of the number of ranks
  (:mod:`.rib`, its exact reductions and eigen solver in :mod:`.exact`).
* :func:`kway` -- METIS k-way (through pymetis) on the graph gathered to rank 0
  (:mod:`.kway`).

Errors are agreed with :func:`meshchain.comm.agree.raise_together`.

Determinism of :func:`rib`
--------------------------
The result of :func:`rib` is a function of the *global* coordinate array, the
global ids and ``nparts`` only: computing it on 1, 2, 3 or 4 ranks holding blocks of
the same array gives the same parts, bit for bit. Floating-point sums over ranks
would break this (addition is not associative), so:

* every reduction over elements (centroid, inertia tensor) is an **exact** sum: each
  float64 is split, from its IEEE bits, into integer chunks of a fixed-point
  super-accumulator (32-bit limbs spanning the exponent range actually present,
  agreed by an ``Allreduce(MAX)``), the chunks are summed in int64 (order
  independent; carries are normalised every few thousand rows so nothing
  overflows), summed over ranks with an integer ``Allreduce``, and brought to a
  canonical limb form. Converting that to float64 is a fixed sequence of IEEE
  operations on identical integers. The centroid and the inertia tensor therefore
  do not depend on how the elements are spread over the ranks, nor on their order;
* every per-element quantity (centred coordinates, products, projections) is
  computed with elementwise IEEE operations (``+``, ``-``, ``*``) whose results do
  not depend on the array they sit in (no BLAS, no fused multiply-add);
* the principal axis comes from a vectorised cyclic Jacobi eigen-solver built from
  elementwise ``+ - * / sqrt`` only (no LAPACK, whose kernels may differ between
  CPUs), run on the same matrices on every rank; its sign is fixed by making the
  largest-magnitude component positive;
* the split is a parallel radix selection on the exact total order
  ``(projection, global id)``: histogram counts are integers, so the lower half gets
  exactly the prescribed number of elements.

Examples
--------
>>> from mpi4py import MPI
>>> import numpy as np
>>> block_offsets(10, 4)
array([ 0,  3,  6,  8, 10])
>>> xy = np.array([[0.0, 0.0], [3.0, 0.1], [1.0, 0.0], [2.0, 0.1]])
>>> rib(xy, MPI.COMM_SELF, nparts=2)
array([0, 1, 0, 1], dtype=int32)
"""

from __future__ import annotations

from ...comm.blocks import block_offsets
from .exact import _principal_axes
from .kway import kway
from .rib import rib

__all__ = ["block_offsets", "rib", "kway", "_principal_axes"]
