"""Data in and out of a run: checkpoint and restart (:mod:`.checkpoint`)."""
