"""Everything that talks MPI: agreement on errors, collectives, halo exchanges.

* :mod:`.world`: the communicator a session runs on by default;
* :mod:`.agree`: the one way ranks agree on errors (and on values, and on live objects);
* :mod:`.blocks`: the block distribution of declarations before partitioning;
* :mod:`.collectives`: all-to-all, fetching and gathering rows;
* :mod:`.inputs`: declaration inputs (global arrays, rank 0 only, ``mc.Block``) to block rows;
* :mod:`.exchange` and :mod:`.packing`: halo exchanges planned once, run many times, with
  persistent requests and compiled packing.
"""
