"""The bottom layer: what every other layer may use.

* :mod:`.errors`: the one exception hierarchy; :mod:`.access`: access modes;
* :mod:`.config`: options and ``MESHCHAIN_*`` variables;
* :mod:`.stats`: statistics records and the recorder;
* :mod:`.cache`: the one bounded cache utility, with invalidation events;
* :mod:`.storage`: the storage records of dats and globals, owned by the engine;
* :mod:`.context`: how user-facing objects find the current session.
"""
