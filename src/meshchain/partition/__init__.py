"""Partitioners, halo layers and local numbering: a :class:`~.layout.MeshLayout` per rank.

* :mod:`.partitioners`: ``rib`` (parallel recursive inertial bisection) and ``kway`` (METIS);
* :mod:`.layout`: halo layers to any depth, local numbering, the layout objects;
* :mod:`.distribute`: the steps of ``mc.partition`` and of building deeper halos.
"""
