"""The engine: the session, the trace, and one pipeline that runs every unit.

* :mod:`.session`: the session (configuration, trace, declarations and storage, layout,
  caches, statistics, model state, backend);
* :mod:`.trace`, :mod:`.chains`: pending loops, dependence analysis, chain options;
* :mod:`.declare`: declarations agreed over ranks;
* :mod:`.units`, :mod:`.strategies`, :mod:`.pipeline`: a unit's strategy, schedule and plan;
* :mod:`.assemble`, :mod:`.tiling`, :mod:`.plans`: executable plans and the pipeline they run;
* :mod:`.accounting`: statistics from the schedule; :mod:`.auto`: the model in the engine.
"""
