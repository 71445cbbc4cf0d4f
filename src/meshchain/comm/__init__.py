"""Everything that talks MPI: agreement on errors, collectives, halo exchanges.

* :mod:`.world`: the communicator a session runs on by default;
* :mod:`.agree`: the one way ranks agree on errors (and on values, and on live objects);
* :mod:`.blocks`: the block distribution of declarations before partitioning;
* :mod:`.collectives`: all-to-all, fetching and gathering rows;
* :mod:`.reductions`: sums, maxima, prefix sums, gathering to and scattering from rank 0
  (the partitioners' collectives);
* :mod:`.inputs`: declaration inputs (global arrays, rank 0 only, ``mc.Block``) to block rows;
* :mod:`.exchange` and :mod:`.packing`: halo exchanges planned once, run many times, with
  compiled packing, forward and reverse, rows of fixed or variable size, moved by a
  selectable transport (:mod:`.transports`);
* :mod:`.sparse` and :mod:`.termination`: the dynamic sparse exchange (messages packed into
  reusable buffers for destinations known only at run time; NBX, neighbourhood or allreduce
  termination), used for set-up and migration, and :mod:`.neighbourhood`, a neighbourhood
  that grows as ranks discover each other;
* :mod:`.pairwise`: short sums over ranks by recursive doubling (a solver's block reductions);
* :mod:`.pingpong`: ping-pong timing for the model's calibration;
* :mod:`.progress`: what moves messages while a rank computes (``progress="none"``,
  ``"poll"``: a communication thread testing the requests in flight, ``"thread"``: MPICH's
  asynchronous progress thread), and its measurement.

Nothing outside this package sends a point-to-point message, and the partitioners call no
MPI collective of their own (tests check both).
"""
